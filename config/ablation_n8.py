# Ablation N=8 (M=24, K=4), paper val CE 4.263
# Table "Ablation" N row; everything else is the base (N=4, T=3, S=1, K=2, d=4096, lr 1.5e-4,
# warmup 1000, 10k steps), which is train.py's defaults.
# Warmup stays 1000 as in the table caption, though max(1000, N*T*100) would give 2400.
# torchrun --standalone --nproc_per_node=6 train.py config/ablation_n8.py
out_dir = "out-ablation_n8"
N = 8
K = 4                             # K scaled with N: K/M = 4/24
