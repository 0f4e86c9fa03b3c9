# Ablation S=2, paper val CE 4.294 (lr not divided by S, as in the paper)
# Table "Ablation" S row; everything else is the base (N=4, T=3, S=1, K=2, d=4096, lr 1.5e-4,
# warmup 1000, 10k steps), which is train.py's defaults.
# torchrun --standalone --nproc_per_node=6 train.py config/ablation_s2.py
out_dir = "out-ablation_s2"
S = 2
