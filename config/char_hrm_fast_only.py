# Control: HRM's Fast module alone on the character-level testbed. The Slow module is removed and
# z_H stays at its prototype z_H0, so the model keeps HRM's input re-injection (x~ at every step),
# gating and output fusion, but has no hierarchy. Set beside config/char_hrm.py it measures what
# the Slow module adds; beside config/char_unitf.py, what re-injection and gating add.
# python prepare.py --dataset=shakespeare_char && python train.py config/char_hrm_fast_only.py
out_dir = "out-char-hrm-fast-only"
dataset = "shakespeare_char"  # vocab_size comes from its meta.json (80 characters)
arch = "hrm"
fast_only = True         # 0.67M parameters: HRM minus H_net's 0.34M
n_embd = 128
n_head = 4
N = 2
T = 2
K = 2                    # the last 2 of M = 4 steps carry gradient, as in config/char_hrm.py
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
