# The character-level Shakespeare testbed that the char_* configs start from (each runs this file first):
# a 2-core CPU run of 400 iterations of 8 x 128 characters, at d=128 so that the blocks, not the embedding,
# hold the parameters. Everything else (AdamW, clip 1.0, cosine to lr/10, HRM N=4, T=3, K=2) is the paper's,
# from train.py's defaults; alone, this file trains that default HRM at d=128.
# python prepare.py --dataset=shakespeare_char && python train.py config/char_testbed.py
out_dir = "out-char-testbed"
dataset = "shakespeare_char"  # vocab_size comes from its meta.json (80 characters)
gradient_accumulation_steps = 1
batch_size = 8
block_size = 128
n_embd = 128
n_head = 4
learning_rate = 3e-3
min_lr = 3e-4            # learning_rate / 10, as in every config here
max_iters = 400
warmup_iters = 40
eval_interval = 100
eval_iters = 20
log_interval = 50
device = "cpu"
dtype = "float32"
