# Control: HRM's Fast module alone (config/char_hrm_fast_only.py) widened to HRM's stored parameters,
# 1.04M against HRM's 1.01M. Beside config/char_hrm.py it measures what the Slow module adds at equal
# parameters: the same count spent on width instead of on a second, slower module.
# python prepare.py --dataset=shakespeare_char && python train.py config/char_hrm_fast_only_wide.py
# config/char_hrm_fast_only.py (N=2, T=2, K=2, no Slow module) first, then what this run changes
include("char_hrm_fast_only.py")
out_dir = "out-char-hrm-fast-only-wide"
n_embd = 160
n_head = 5               # head_dim 32, as in every char_* config
