# Ablation N=1 (M=3, K=1), paper val CE 4.191
# Table "Ablation" N row; everything else is the base (N=4, T=3, S=1, K=2, d=4096, lr 1.5e-4,
# warmup 1000, 10k steps), which is train.py's defaults.
# torchrun --standalone --nproc_per_node=6 train.py config/ablation_n1.py
out_dir = "out-ablation_n1"
N = 1
K = 1                             # K scaled with N: K/M = 1/3
