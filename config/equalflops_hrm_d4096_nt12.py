# EqualFLOPs: HRM d=4096, N x T = 12 (N=4, T=3), 1229M, paper val CE 4.233
# Table "EqualFLOPs" row d=4096; lr 5e-5 / warmup 1000 from the LongTrain caption ("the EqualFLOPs/3 LR schedule").
# torchrun --standalone --nproc_per_node=6 train.py config/equalflops_hrm_d4096_nt12.py
out_dir = "out-equalflops_hrm_d4096_nt12"
learning_rate = 5e-05
min_lr = 5e-06
