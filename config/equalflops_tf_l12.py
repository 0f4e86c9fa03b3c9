# EqualFLOPs: Transformer L=12, 3427M, paper val CE 5.396 (partial convergence)
# Table "EqualFLOPs" row T-L12; section EqualFLOPs: lr 5e-5, warmup 1000, max_norm 0.3.
# torchrun --standalone --nproc_per_node=6 train.py config/equalflops_tf_l12.py
out_dir = "out-equalflops_tf_l12"
arch = "transformer"
n_layer = 12
learning_rate = 5e-05
min_lr = 5e-06
grad_clip = 0.3
