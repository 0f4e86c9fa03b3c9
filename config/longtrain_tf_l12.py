# LongTrain: Transformer L=12, 20k steps, paper val CE 4.929
# Table "TF-Baseline" row "T-L12, lr 5e-5 (LongTrain)": section LongTrain's "improves from 5.396 (EqualFLOPs,
# 10k) to 4.929 (20k)", the EqualFLOPs run (lr 5e-5, warmup 1000, max_norm 0.3) continued to 20k steps.
# torchrun --standalone --nproc_per_node=6 train.py config/longtrain_tf_l12.py
# config/equalflops_tf_l12.py (lr 5e-5, max_norm 0.3) first, then what this run changes
include("equalflops_tf_l12.py")
out_dir = "out-longtrain_tf_l12"
max_iters = 20000
