# The BPE Shakespeare testbed that the shakespeare_* configs start from (each runs this file first): the
# bundled corpus (GPT-2 tokens) on a 2-core CPU, 400 iterations of 8 x 64 tokens at d=128, a larger step
# than the paper's (small models take one). Everything else (AdamW, clip 1.0, cosine to lr/10, HRM N=4, T=3,
# K=2) is the paper's, from train.py's defaults; alone, this file trains that default HRM at d=128.
# python prepare.py && python train.py config/shakespeare_testbed.py
out_dir = "out-shakespeare-testbed"
dataset = "shakespeare"
gradient_accumulation_steps = 1
batch_size = 8
block_size = 64
n_embd = 128
n_head = 4
learning_rate = 2e-3     # small models take a large step
min_lr = 2e-4
max_iters = 400
warmup_iters = 40
eval_interval = 100
eval_iters = 20
log_interval = 20
device = "cpu"
dtype = "float32"
