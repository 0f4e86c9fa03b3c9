# EqualParam: HRM N x T = 4 (N=2, T=2), 1229M, paper val CE 4.450
# Table "EqualParam"; warmup max(1000, N*T*100), clip 1.0*K/M = 0.5
# torchrun --standalone --nproc_per_node=6 train.py config/equalparam_nt4.py
out_dir = "out-equalparam_nt4"
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
N = 2
T = 2
K = 2                             # gradient window: K/M = 2/4
S = 1
learning_rate = 7.07e-05  # assumed: the paper gives 1e-4*sqrt(K/M) for EqualParam HRM (section MultiSeed), no number for this row
min_lr = 7.07e-06            # lr / 10
warmup_iters = 1000
max_iters = 10000
lr_decay_iters = 10000
grad_clip = 1.0                   # recurrent archs clip at grad_clip * K / M
