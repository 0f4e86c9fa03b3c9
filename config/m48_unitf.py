# M=48: UniTF flat, K/M = 33%, paper val CE 6.101 (init overflow; --unitf_init_c=4 is the paper's v4 fix)
# Table "M=48 results" row UniTF. Inferred: lr 1.5e-4 and warmup 4800 as the HRM rows of the table.
# torchrun --standalone --nproc_per_node=6 train.py config/m48_unitf.py
out_dir = "out-m48_unitf"
arch = "unitf"
M = 48
K = 16                            # gradient window: K/M = 16/48
warmup_iters = 4800
