# UniTF M=12, d=4096, 474M, paper val CE 6.403
# Table "UniTF" row d=4096. Inferred: lr 5e-5 / warmup 2000 (the paper gives none; the d=5760 v2 setting).
# torchrun --standalone --nproc_per_node=6 train.py config/unitf_d4096.py
include("unitf_d5760.py")         # UniTF M=12 (K=2), lr 5e-5, warmup 2000
out_dir = "out-unitf_d4096"
n_embd = 4096
