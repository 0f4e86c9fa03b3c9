# EqualParam: HRM N x T = 4 (N=2, T=2), 1229M, paper val CE 4.450
# Table "EqualParam" row NT=4. Its stability paragraph fixes warmup max(1000, N*T*100) = 1000 ("instead of
# 500", so not NT=12's schedule) and an LR below the 1.5e-4 that exploded; the lr is the 1e-4*sqrt(K/M)
# = 7.07e-5 that section MultiSeed gives for EqualParam HRM (inferred: no number for this row). Clip 1.0*K/M = 0.5.
# torchrun --standalone --nproc_per_node=6 train.py config/equalparam_nt4.py
out_dir = "out-equalparam_nt4"
N = 2
T = 2                             # gradient window: K/M = 2/4
learning_rate = 7.07e-05          # 1e-4 * sqrt(2/4)
min_lr = 7.07e-06
