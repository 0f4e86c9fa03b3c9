# Ablation N=2 (M=6, K=1), paper val CE 4.257
# Table "Ablation" N row; everything else is the base (N=4, T=3, S=1, K=2, d=4096, lr 1.5e-4,
# warmup 1000, 10k steps), which is train.py's defaults.
# torchrun --standalone --nproc_per_node=6 train.py config/ablation_n2.py
out_dir = "out-ablation_n2"
N = 2
K = 1                             # K scaled with N: K/M = 1/6
