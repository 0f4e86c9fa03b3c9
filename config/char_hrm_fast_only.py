# Control: HRM's Fast module alone on the character-level testbed. The Slow module is removed and
# z_H stays at its prototype z_H0, so the model keeps HRM's input re-injection (x~ at every step),
# gating and output fusion, but has no hierarchy. Set beside config/char_hrm.py it measures what
# the Slow module adds; beside config/char_unitf.py, what re-injection and gating add.
# python prepare.py --dataset=shakespeare_char && python train.py config/char_hrm_fast_only.py
# config/char_hrm.py (N=2, T=2, K=2: the last 2 of M = 4 steps carry gradient) first, then what this run changes
include("char_hrm.py")
out_dir = "out-char-hrm-fast-only"
fast_only = True         # 0.67M parameters: HRM minus H_net's 0.34M
