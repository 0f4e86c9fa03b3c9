# UniTF M=12, d=4096, 474M, paper val CE 6.403
# Table "UniTF" row d=4096. Inferred: lr 5e-5 / warmup 2000 (the paper gives none; the d=5760 v2 setting).
# torchrun --standalone --nproc_per_node=6 train.py config/unitf_d4096.py
out_dir = "out-unitf_d4096"
arch = "unitf"
M = 12                            # gradient window: K/M = 2/12
learning_rate = 5e-05
min_lr = 5e-06
warmup_iters = 2000
