# EqualFLOPs: HRM d=2048, N x T = 36, 359M, paper val CE 4.364
# Table "EqualFLOPs"; HRM lr 5e-5 / warmup 1000 per the LongTrain caption; K/M = 2/36 as in section LongTrain
# torchrun --standalone --nproc_per_node=6 train.py config/equalflops_hrm_d2048_nt36.py
out_dir = "out-equalflops_hrm_d2048_nt36"
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
learning_rate = 5e-05
min_lr = 5e-06            # lr / 10
warmup_iters = 1000
max_iters = 10000
lr_decay_iters = 10000
grad_clip = 1.0                   # recurrent archs clip at grad_clip * K / M
# N=12, T=3 assumed (the paper gives only N x T = 36; T=3 is its base)
