# A UniTF (one block, M = 4 steps, HRM's N*T) on the character-level Shakespeare testbed, sized so the blocks, not the embedding, hold the
# parameters (1.05M of 1.07M): widened to d=256 to match HRM's stored parameters, as the paper widens its UniTF (docs/RESULTS.md, experiments/sweep.py).
# K = 2 (the default): the same gradient window as HRM, the last 2 of M = 4 steps.
# python prepare.py --dataset=shakespeare_char && python train.py config/char_unitf.py
# config/char_testbed.py (the character-level testbed) first, then what this run changes
include("char_testbed.py")
out_dir = "out-char-unitf"
arch = "unitf"
n_embd = 256
n_head = 8               # head_dim 32, as in the HRM and Transformer configs
M = 4
