# UniTF M=12, d=7296, 1218M (parameter-matched to HRM), paper val CE 7.578
# appendix "UniTF d=7296 run log": lr 4e-5, warmup 2000
# torchrun --standalone --nproc_per_node=6 train.py config/unitf_d7296.py
include("unitf_d5760.py")         # UniTF M=12 (K=2), warmup 2000
out_dir = "out-unitf_d7296"
n_embd = 7296
learning_rate = 4e-05
min_lr = 4e-06
