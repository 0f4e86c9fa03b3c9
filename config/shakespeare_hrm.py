# A small HRM on the bundled Shakespeare corpus, for a 2-core CPU (255 s of training on 2 cores; README quick start).
# K = 2 (the default): HRM clips at grad_clip * K / M = 0.5.
# python prepare.py && python train.py config/shakespeare_hrm.py
# config/shakespeare_testbed.py (the BPE testbed) first, then what this run changes
include("shakespeare_testbed.py")
out_dir = "out-shakespeare-hrm"
N = 2
T = 2
