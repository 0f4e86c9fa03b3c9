# UniTF M=12, d=5760, 820M, paper val CE 7.624 (run v2)
# Table "unitf_full" row v2: lr 5e-5, warmup 2000
# torchrun --standalone --nproc_per_node=6 train.py config/unitf_d5760.py
out_dir = "out-unitf_d5760"
arch = "unitf"
n_embd = 5760
M = 12                            # gradient window: K/M = 2/12
learning_rate = 5e-05
min_lr = 5e-06
warmup_iters = 2000
