# EqualParam: HRM N x T = 8 (N=2, T=4), 1229M, paper val CE 4.239 (best)
# Table "EqualParam" row NT=8. Inferred (no number for this row): lr 1e-4*sqrt(K/M) = 5e-5 (section MultiSeed's
# EqualParam HRM rule), warmup max(1000, N*T*100) = 1000. That is the EqualFLOPs NT=12 schedule (5e-5 / 1000),
# whose curve (6.264 at 500, 4.233 at 10k) this row's matches (5.966, 4.239; rms 0.11 over the 20 points).
# torchrun --standalone --nproc_per_node=6 train.py config/equalparam_nt8.py
out_dir = "out-equalparam_nt8"
N = 2
T = 4                             # gradient window: K/M = 2/8
learning_rate = 5e-05             # 1e-4 * sqrt(2/8)
min_lr = 5e-06
