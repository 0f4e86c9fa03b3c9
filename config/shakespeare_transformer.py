# A small Transformer on the bundled Shakespeare corpus, for a 2-core CPU.
# L=4 at d=128 stores about as many parameters as config/shakespeare_hrm.py (7.48M vs 7.44M),
# the paper's EqualParam pairing of HRM with T-L4.
# python prepare.py && python train.py config/shakespeare_transformer.py
out_dir = "out-shakespeare-transformer"
dataset = "shakespeare"
arch = "transformer"
n_layer = 4
n_embd = 128
n_head = 4
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
grad_clip = 1.0
device = "cpu"
dtype = "float32"
compile = False
