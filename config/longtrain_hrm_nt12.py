# LongTrain: HRM d=4096, N x T = 12, 20k steps, paper val CE 3.901
# Table "LongTrain" row NT=12; its caption: lr 5e-5, warmup 1000, and its 10k value is EqualFLOPs' 4.233:
# the EqualFLOPs run (config/equalflops_hrm_d4096_nt12.py) continued to 20k steps.
# torchrun --standalone --nproc_per_node=6 train.py config/longtrain_hrm_nt12.py
# config/equalflops_hrm_d4096_nt12.py (lr 5e-5, warmup 1000) first, then what this run changes
include("equalflops_hrm_d4096_nt12.py")
out_dir = "out-longtrain_hrm_nt12"
max_iters = 20000
