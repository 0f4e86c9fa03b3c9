# A small Transformer on the bundled Shakespeare corpus, for a 2-core CPU.
# L=4 (the default) at d=128 stores about as many parameters as config/shakespeare_hrm.py (7.48M vs 7.44M),
# the paper's EqualParam pairing of HRM with T-L4.
# python prepare.py && python train.py config/shakespeare_transformer.py
# config/shakespeare_testbed.py (the BPE testbed) first, then what this run changes
include("shakespeare_testbed.py")
out_dir = "out-shakespeare-transformer"
arch = "transformer"
