# A Transformer (L=4) on the character-level Shakespeare testbed, sized so the blocks, not the embedding, hold the
# parameters (1.05M of 1.06M): L=4 matches HRM's stored parameters, the paper's EqualParam pairing (docs/RESULTS.md, docs/sweep.py).
# python prepare.py --dataset=shakespeare_char && python train.py config/char_transformer.py
# config/char_testbed.py (the character-level testbed) first, then what this run changes
import builtins
from inspect import currentframe
from pathlib import Path
_base = Path(currentframe().f_code.co_filename).with_name("char_testbed.py")
exec(builtins.compile(_base.read_text(), _base, "exec"))  # builtins.: here `compile` is a train.py setting
out_dir = "out-char-transformer"
arch = "transformer"     # n_layer = 4 (the default)
