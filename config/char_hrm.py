# HRM on the character-level Shakespeare testbed, sized so the blocks, not the embedding, hold the
# parameters (1.00M of 1.01M). The reproduction's HRM row (docs/RESULTS.md, experiments/sweep.py).
# python prepare.py --dataset=shakespeare_char && python train.py config/char_hrm.py
# config/char_testbed.py (the character-level testbed) first, then what this run changes
include("char_testbed.py")
out_dir = "out-char-hrm"
N = 2
T = 2                    # M = 4: the last K = 2 steps carry gradient; step 4 fires the Slow module
