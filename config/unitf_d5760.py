# UniTF M=12, d=5760, 820M, paper val CE 7.624 (run v2)
# Table "unitf_full": v2 lr 5e-5, warmup 2000
# torchrun --standalone --nproc_per_node=6 train.py config/unitf_d5760.py
out_dir = "out-unitf_d5760"
dataset = "openwebtext"
block_size = 1024
batch_size = 12                   # per GPU, as in the paper
gradient_accumulation_steps = 6   # global micro-batches: 6 GPUs x 1 (use 6 on one GPU too)
eval_interval = 500
eval_iters = 200
log_interval = 10
n_embd = 5760
n_head = 16
arch = "unitf"
M = 12
K = 2
unitf_init_c = 2.0              # init std 0.02/sqrt(c*M*d/4096)
learning_rate = 5e-05
min_lr = 5e-06            # lr / 10
warmup_iters = 2000
max_iters = 10000
lr_decay_iters = 10000
grad_clip = 1.0                   # recurrent archs clip at grad_clip * K / M
