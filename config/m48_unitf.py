# M=48: UniTF flat, K/M = 33%, paper val CE 6.101 (init overflow; --unitf_init_c=4 is the paper's v4 fix)
# Table "M=48 results"
# torchrun --standalone --nproc_per_node=6 train.py config/m48_unitf.py
out_dir = "out-m48_unitf"
dataset = "openwebtext"
block_size = 1024
batch_size = 12                   # per GPU, as in the paper
gradient_accumulation_steps = 6   # global micro-batches: 6 GPUs x 1 (use 6 on one GPU too)
eval_interval = 500
eval_iters = 200
log_interval = 10
n_embd = 4096
n_head = 16
arch = "unitf"
M = 48
K = 16
unitf_init_c = 2.0              # init std 0.02/sqrt(c*M*d/4096)
learning_rate = 0.00015  # assumed: the paper gives no lr for M=48
min_lr = 1.5e-05            # lr / 10
warmup_iters = 4800
max_iters = 10000
lr_decay_iters = 10000
grad_clip = 1.0                   # recurrent archs clip at grad_clip * K / M
