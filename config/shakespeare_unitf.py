# A small UniTF (one block applied M=4 times, the HRM config's N*T) on the bundled Shakespeare corpus, for a 2-core CPU.
# K = 2 (the default): UniTF clips at grad_clip * K / M = 0.5.
# python prepare.py && python train.py config/shakespeare_unitf.py
# config/shakespeare_testbed.py (the BPE testbed) first, then what this run changes
import builtins
from inspect import currentframe
from pathlib import Path
_base = Path(currentframe().f_code.co_filename).with_name("shakespeare_testbed.py")
exec(builtins.compile(_base.read_text(), _base, "exec"))  # builtins.: here `compile` is a train.py setting
out_dir = "out-shakespeare-unitf"
arch = "unitf"
M = 4
