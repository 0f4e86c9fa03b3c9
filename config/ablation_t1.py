# Ablation T=1 (M=4), paper val CE 4.081
# Table "Ablation" T row; everything else is the base (N=4, T=3, S=1, K=2, d=4096, lr 1.5e-4,
# warmup 1000, 10k steps), which is train.py's defaults.
# torchrun --standalone --nproc_per_node=6 train.py config/ablation_t1.py
out_dir = "out-ablation_t1"
T = 1                             # gradient window: K/M = 2/4
