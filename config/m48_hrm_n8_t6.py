# M=48: HRM N=8, T=6, K/M = 33%, paper val CE 4.172
# Table "M=48 results" row N=8, T=6; warmup max(1000, N*T*100) = 4800 (docs/MODEL.md section 6).
# Inferred: the Ablation base lr 1.5e-4 (the default; the paper gives no lr for M=48).
# torchrun --standalone --nproc_per_node=6 train.py config/m48_hrm_n8_t6.py
out_dir = "out-m48_hrm_n8_t6"
N = 8
T = 6
K = 16                            # gradient window: K/M = 16/48
warmup_iters = 4800
