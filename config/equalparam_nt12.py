# EqualParam: HRM N x T = 12 (N=4, T=3), 1229M, paper val CE 4.284
# Table "EqualParam" caption: lr 4e-4, warmup 500 for this row. Not MultiSeed's 1e-4*sqrt(K/M) = 4.08e-5: that
# is MultiSeed's own HRM lr, which the paper contrasts with EqualParam's and which ends at 4.896 (4.92 in
# HPSearch at 4e-5), not 4.284; the LongTrain caption also calls EqualParam's LR higher than 5e-5.
# torchrun --standalone --nproc_per_node=6 train.py config/equalparam_nt12.py
out_dir = "out-equalparam_nt12"
learning_rate = 0.0004
min_lr = 4e-05
warmup_iters = 500
