# A Transformer (L=4) on the character-level Shakespeare testbed, sized so the blocks, not the embedding, hold the
# parameters (1.05M of 1.06M): L=4 matches HRM's stored parameters, the paper's EqualParam pairing (docs/RESULTS.md, experiments/sweep.py).
# python prepare.py --dataset=shakespeare_char && python train.py config/char_transformer.py
# config/char_testbed.py (the character-level testbed) first, then what this run changes
include("char_testbed.py")
out_dir = "out-char-transformer"
arch = "transformer"     # n_layer = 4 (the default)
