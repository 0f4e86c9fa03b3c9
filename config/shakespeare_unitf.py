# A small UniTF (one block applied M=4 times, the HRM config's N*T) on the bundled Shakespeare corpus, for a 2-core CPU.
# K = 2 (the default): UniTF clips at grad_clip * K / M = 0.5.
# python prepare.py && python train.py config/shakespeare_unitf.py
# config/shakespeare_testbed.py (the BPE testbed) first, then what this run changes
include("shakespeare_testbed.py")
out_dir = "out-shakespeare-unitf"
arch = "unitf"
M = 4
