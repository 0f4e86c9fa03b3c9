# Control: UniTF at HRM's width, d=128 (0.27M parameters: one block, where config/char_unitf.py widens
# to d=256 to match HRM's stored parameters). Beside config/char_hrm_fast_only.py (also d=128, M=4, K=2)
# it measures HRM's step (input block, re-injection of x~, gates, output fusion) against a plain shared
# block; beside config/char_transformer.py (d=128, L=4 blocks), weight sharing at equal width and depth.
# python prepare.py --dataset=shakespeare_char && python train.py config/char_unitf_d128.py
# config/char_unitf.py (M=4, K=2) first, then what this run changes
include("char_unitf.py")
out_dir = "out-char-unitf-d128"
n_embd = 128
n_head = 4               # head_dim 32, as in every char_* config
