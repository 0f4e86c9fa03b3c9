# LongTrain: HRM d=2048, N x T = 36, 20k steps, paper val CE 6.113 (the failed run)
# section LongTrain: warmup 2000, peak lr 2.36e-5 (from its "LR at iter 500" arithmetic)
# torchrun --standalone --nproc_per_node=6 train.py config/longtrain_hrm_d2048_nt36.py
out_dir = "out-longtrain_hrm_d2048_nt36"
dataset = "openwebtext"
block_size = 1024
batch_size = 12                   # per GPU, as in the paper
gradient_accumulation_steps = 6   # global micro-batches: 6 GPUs x 1 (use 6 on one GPU too)
eval_interval = 500
eval_iters = 200
log_interval = 10
n_embd = 2048
n_head = 16
arch = "hrm"
N = 12
T = 3
K = 2                             # gradient window: K/M = 2/36
S = 1
learning_rate = 2.36e-05
min_lr = 2.36e-06            # lr / 10
warmup_iters = 2000
max_iters = 20000
lr_decay_iters = 20000
grad_clip = 1.0                   # recurrent archs clip at grad_clip * K / M
# the paper blames warmup=2000 for the failure; --warmup_iters=1000 is its suggested re-run
