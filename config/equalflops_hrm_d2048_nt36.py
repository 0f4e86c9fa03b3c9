# EqualFLOPs: HRM d=2048, N x T = 36, 359M, paper val CE 4.364
# Table "EqualFLOPs" row d=2048. Section LongTrain: the LongTrain run is this one but for warmup (2000 there,
# 1000 here), and its peak lr is 2.36e-5 (= 1e-4*sqrt(K/M), "2.36e-5 x (500/2000)"); so lr 2.36e-5, not the
# 5e-5 the LongTrain caption gives for NT=12. K/M = 2/36 as in section LongTrain.
# Inferred: N=12, T=3 (the paper gives only N x T = 36; T=3 is its base).
# torchrun --standalone --nproc_per_node=6 train.py config/equalflops_hrm_d2048_nt36.py
out_dir = "out-equalflops_hrm_d2048_nt36"
n_embd = 2048
N = 12                            # T = 3 (the default): gradient window K/M = 2/36
learning_rate = 2.36e-05
min_lr = 2.36e-06
