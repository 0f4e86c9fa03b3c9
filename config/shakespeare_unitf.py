# A small UniTF (one block applied M=4 times, the HRM config's N*T) on the bundled Shakespeare corpus, for a 2-core CPU.
# python prepare.py && python train.py config/shakespeare_unitf.py
out_dir = "out-shakespeare-unitf"
dataset = "shakespeare"
arch = "unitf"
n_embd = 128
n_head = 4
M = 4
K = 2
block_size = 64
batch_size = 8
gradient_accumulation_steps = 1
max_iters = 400
eval_interval = 100
eval_iters = 20
log_interval = 20
learning_rate = 2e-3     # small models take a large step
min_lr = 2e-4
warmup_iters = 40
lr_decay_iters = 400
grad_clip = 1.0          # UniTF clips at grad_clip * K / M = 0.5
device = "cpu"
dtype = "float32"
compile = False
