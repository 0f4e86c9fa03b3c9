# M=48: HRM N=12, T=4, K/M = 25%, paper val CE 4.519
# Table "M=48 results" row N=12, T=4; warmup max(1000, N*T*100) = 4800 (docs/MODEL.md section 6).
# Inferred: the Ablation base lr 1.5e-4 (the default; the paper gives no lr for M=48).
# torchrun --standalone --nproc_per_node=6 train.py config/m48_hrm_n12_t4.py
out_dir = "out-m48_hrm_n12_t4"
N = 12
T = 4
K = 12                            # gradient window: K/M = 12/48
warmup_iters = 4800
