# HRM on the character-level Shakespeare testbed, sized so the blocks, not the embedding, hold the
# parameters (1.00M of 1.01M). The reproduction's HRM row (docs/RESULTS.md, docs/sweep.py).
# python prepare.py --dataset=shakespeare_char && python train.py config/char_hrm.py
out_dir = "out-char-hrm"
dataset = "shakespeare_char"  # vocab_size comes from its meta.json (80 characters)
arch = "hrm"
n_embd = 128
n_head = 4
N = 2
T = 2
K = 2                    # the last 2 of M = 4 steps carry gradient; step 4 fires the Slow module
block_size = 128
batch_size = 8
max_iters = 400
eval_interval = 100
eval_iters = 20
log_interval = 50
learning_rate = 3e-3
min_lr = 3e-4            # learning_rate / 10, as in every config here
warmup_iters = 40
lr_decay_iters = 400
device = "cpu"
dtype = "float32"
