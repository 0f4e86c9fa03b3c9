# M=48: HRM N=12, T=4, K/M = 25%, paper val CE 4.519
# Table "M=48 results"; lr of the Ablation base, warmup max(1000, N*T*100) = 4800 (SPEC section 6)
# torchrun --standalone --nproc_per_node=6 train.py config/m48_hrm_n12_t4.py
out_dir = "out-m48_hrm_n12_t4"
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
N = 12
T = 4
K = 12                             # gradient window: K/M = 12/48
S = 1
learning_rate = 0.00015  # assumed: the paper gives no lr for M=48
min_lr = 1.5e-05            # lr / 10
warmup_iters = 4800
max_iters = 10000
lr_decay_iters = 10000
grad_clip = 1.0                   # recurrent archs clip at grad_clip * K / M
