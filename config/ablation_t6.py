# Ablation T=6 (M=24), paper val CE 4.132
# Table "Ablation" T row; everything else is the base (N=4, T=3, S=1, K=2, d=4096, lr 1.5e-4,
# warmup 1000, 10k steps), which is train.py's defaults.
# Warmup stays 1000 as in the table caption, though max(1000, N*T*100) would give 2400.
# torchrun --standalone --nproc_per_node=6 train.py config/ablation_t6.py
out_dir = "out-ablation_t6"
T = 6                             # gradient window: K/M = 2/24
