# Control: UniTF with full backprop (K = M = 4) on the character-level testbed. With K < M the
# embedding is read at step 1, outside the gradient window, so it learns only through the tied
# output head, while HRM re-feeds x~ to every step; K = M removes that difference.
# python prepare.py --dataset=shakespeare_char && python train.py config/char_unitf_full.py
# config/char_unitf.py (d=256, M=4) first, then what this run changes
include("char_unitf.py")
out_dir = "out-char-unitf-full"
K = 4                    # = M: every step carries gradient (clipping at grad_clip * K / M = 1.0)
