# EqualFLOPs: HRM d=5120, N x T = 9 (N=3, T=3), 1857M, paper val CE 4.165
# Table "EqualFLOPs" row d=5120. Inferred: lr 5e-5 / warmup 1000 as the d=4096 row (LongTrain caption);
# N=3, T=3 (the paper gives only N x T = 9).
# torchrun --standalone --nproc_per_node=6 train.py config/equalflops_hrm_d5120_nt9.py
out_dir = "out-equalflops_hrm_d5120_nt9"
n_embd = 5120
N = 3                             # T = 3 (the default): gradient window K/M = 2/9
learning_rate = 5e-05
min_lr = 5e-06
