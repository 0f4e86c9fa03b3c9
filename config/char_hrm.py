# HRM on the character-level Shakespeare testbed, sized so the blocks, not the embedding, hold the
# parameters (1.00M of 1.01M). The reproduction's HRM row (docs/RESULTS.md, docs/sweep.py).
# python prepare.py --dataset=shakespeare_char && python train.py config/char_hrm.py
# config/char_testbed.py (the character-level testbed) first, then what this run changes
import builtins
from inspect import currentframe
from pathlib import Path
_base = Path(currentframe().f_code.co_filename).with_name("char_testbed.py")
exec(builtins.compile(_base.read_text(), _base, "exec"))  # builtins.: here `compile` is a train.py setting
out_dir = "out-char-hrm"
N = 2
T = 2                    # M = 4: the last K = 2 steps carry gradient; step 4 fires the Slow module
