# LongTrain: HRM d=4096, N x T = 12, 20k steps, paper val CE 3.901
# Table "LongTrain" caption: lr 5e-5, warmup 1000
# torchrun --standalone --nproc_per_node=6 train.py config/longtrain_hrm_nt12.py
out_dir = "out-longtrain_hrm_nt12"
dataset = "openwebtext"
block_size = 1024
batch_size = 12                   # per GPU, as in the paper
gradient_accumulation_steps = 6   # global micro-batches: 6 GPUs x 1 (use 6 on one GPU too)
eval_interval = 500
eval_iters = 200
log_interval = 10
n_embd = 4096
n_head = 16
arch = "hrm"
N = 4
T = 3
K = 2                             # gradient window: K/M = 2/12
S = 1
learning_rate = 5e-05
min_lr = 5e-06            # lr / 10
warmup_iters = 1000
max_iters = 20000
lr_decay_iters = 20000
grad_clip = 1.0                   # recurrent archs clip at grad_clip * K / M
