# LongTrain: Universal Transformer M=12, d=4096, 474M, 20k steps, paper val CE 6.614
# Table "LongTrain" row UniTF; K=2 from section LongTrain ("K-window TBPTT fix (K=2, M=12)").
# Inferred: lr 5e-5 / warmup 1000 (the paper gives none for this run; the LongTrain HRM schedule).
# torchrun --standalone --nproc_per_node=6 train.py config/longtrain_unitf_m12.py
include("unitf_d4096.py")         # UniTF M=12 (K=2), d=4096, lr 5e-5
out_dir = "out-longtrain_unitf_m12"
warmup_iters = 1000
max_iters = 20000
