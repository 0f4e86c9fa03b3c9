# TF-Baseline: Transformer L=12 with the best-found LR, 60k steps, paper val CE 4.250
# Table "TF-Baseline": lr 3e-5, warmup 1000, max_norm 0.3
# torchrun --standalone --nproc_per_node=6 train.py config/tfbaseline_tf_l12.py
out_dir = "out-tfbaseline_tf_l12"
arch = "transformer"
n_layer = 12
learning_rate = 3e-05
min_lr = 3e-06
max_iters = 60000
grad_clip = 0.3
