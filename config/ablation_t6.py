# Ablation T=6 (M=24), paper val CE 4.132
# Table "Ablation": base N=4, T=3, S=1, K=2, lr 1.5e-4, warmup 1000, 10k steps
# torchrun --standalone --nproc_per_node=6 train.py config/ablation_t6.py
out_dir = "out-ablation_t6"
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
T = 6
K = 2                             # gradient window: K/M = 2/24
S = 1
learning_rate = 0.00015
min_lr = 1.5e-05            # lr / 10
warmup_iters = 1000
max_iters = 10000
lr_decay_iters = 10000
grad_clip = 1.0                   # recurrent archs clip at grad_clip * K / M
