# EqualParam: Transformer L=2, 743M, paper val CE 4.509
# Table "EqualParam" row T-L2. Inferred (the paper gives no lr for it): the schedule of the other EqualParam
# Transformer, T-L4, whose curve is HPSearch's lr 2e-4 / warmup 500 (see config/equalparam_tf_l4.py).
# torchrun --standalone --nproc_per_node=6 train.py config/equalparam_tf_l2.py
out_dir = "out-equalparam_tf_l2"
arch = "transformer"
n_layer = 2
learning_rate = 0.0002
min_lr = 2e-05
warmup_iters = 500
