# LongTrain: HRM d=2048, N x T = 36, 20k steps, paper val CE 6.113 (the failed run)
# Table "LongTrain" row d=2048 (footnote: "LongTrain run uses different config (warmup=2000)"); section LongTrain:
# peak lr 2.36e-5 (its "LR at iter 500" arithmetic), warmup 2000: the EqualFLOPs run but for warmup, to 20k.
# the paper blames warmup=2000 for the failure; --warmup_iters=1000 is its suggested re-run
# torchrun --standalone --nproc_per_node=6 train.py config/longtrain_hrm_d2048_nt36.py
# config/equalflops_hrm_d2048_nt36.py (d=2048, N=12, T=3, lr 2.36e-5) first, then what this run changes
include("equalflops_hrm_d2048_nt36.py")
out_dir = "out-longtrain_hrm_d2048_nt36"
warmup_iters = 2000
max_iters = 20000
