# Control: UniTF with full backprop (K = M = 4) on the character-level testbed. With K < M the
# embedding is read at step 1, outside the gradient window, so it learns only through the tied
# output head, while HRM re-feeds x~ to every step; K = M removes that difference.
# python prepare.py --dataset=shakespeare_char && python train.py config/char_unitf_full.py
out_dir = "out-char-unitf-full"
dataset = "shakespeare_char"  # vocab_size comes from its meta.json (80 characters)
arch = "unitf"
M = 4
n_embd = 256
n_head = 8                # head_dim 32, as in the HRM and Transformer configs
K = 4                    # = M: every step carries gradient (clipping at grad_clip * K / M = 1.0)
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
