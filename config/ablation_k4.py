# Ablation K=4, paper val CE 4.098
# Table "Ablation" K row; everything else is the base (N=4, T=3, S=1, K=2, d=4096, lr 1.5e-4,
# warmup 1000, 10k steps), which is train.py's defaults.
# torchrun --standalone --nproc_per_node=6 train.py config/ablation_k4.py
out_dir = "out-ablation_k4"
K = 4                             # gradient window: K/M = 4/12
