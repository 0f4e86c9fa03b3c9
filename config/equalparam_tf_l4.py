# EqualParam: Transformer L=4, 1280M, paper val CE 4.562
# Table "EqualParam" row T-L4; lr / warmup settled from the paper's curves: this row's curve (6.145 at iter 500,
# 4.562 at 10k) is HPSearch's T-L4 lr 2e-4 / warmup 500 run (6.116, 4.545; rms 0.027 over the 20 points), not
# lr 1e-4 / 1000 (6.651, 4.687; rms 0.18) nor MultiSeed's lr 1e-4 (4.697 +- 0.004 over 3 seeds).
# torchrun --standalone --nproc_per_node=6 train.py config/equalparam_tf_l4.py
out_dir = "out-equalparam_tf_l4"
arch = "transformer"              # n_layer = 4 (the default)
learning_rate = 0.0002
min_lr = 2e-05
warmup_iters = 500
