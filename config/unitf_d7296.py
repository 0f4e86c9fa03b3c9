# UniTF M=12, d=7296, 1218M (parameter-matched to HRM), paper val CE 7.578
# appendix "UniTF d=7296 run log": lr 4e-5, warmup 2000
# torchrun --standalone --nproc_per_node=6 train.py config/unitf_d7296.py
out_dir = "out-unitf_d7296"
arch = "unitf"
n_embd = 7296
M = 12                            # gradient window: K/M = 2/12
learning_rate = 4e-05
min_lr = 4e-06
warmup_iters = 2000
