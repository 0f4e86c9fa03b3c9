# LongTrain: Universal Transformer M=12, d=4096, 474M, 20k steps, paper val CE 6.614
# Table "LongTrain" row UniTF; K=2 from section LongTrain ("K-window TBPTT fix (K=2, M=12)").
# Inferred: lr 5e-5 / warmup 1000 (the paper gives none for this run; the LongTrain HRM schedule).
# torchrun --standalone --nproc_per_node=6 train.py config/longtrain_unitf_m12.py
out_dir = "out-longtrain_unitf_m12"
arch = "unitf"
M = 12                            # gradient window: K/M = 2/12
learning_rate = 5e-05
min_lr = 5e-06
max_iters = 20000
