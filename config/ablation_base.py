# Ablation base (the K=2, S=1, N=4, T=3 rows), paper val CE 4.226 / 4.220 / 4.177 / 4.202
# Table "Ablation" base: N=4, T=3, S=1, K=2, d=4096, lr 1.5e-4, warmup 1000, 10k steps. That is
# train.py's defaults (the paper's setup), so this file only names the run's directory.
# torchrun --standalone --nproc_per_node=6 train.py config/ablation_base.py
out_dir = "out-ablation_base"
