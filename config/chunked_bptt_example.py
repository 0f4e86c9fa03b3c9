# Chunked BPTT (the paper's section "Path to Large-Scale Validation", direction 1), at M = 48 beside
# config/m48_hrm_n12_t4.py: the 48 steps of N=12, T=4 cut into chunks of C = 12 steps, each backpropagated
# on its own with its own loss. That is S = M/C = 4 supervision passes of N = C/T = 3 firings with K = C
# (tests/test_equations.py::test_chunked_bptt_is_S_passes_of_C_steps): the same 48 steps forward, the same
# logits, every step with gradient. Differences from the M-step model that the config makes visible: init
# std 0.02/sqrt(12) for L_net/H_net (the pass's M), and clipping at grad_clip * K/M = grad_clip
# (m48_hrm_n12_t4: * 12/48). Chunks must hold whole Slow periods: C % T == 0.
# Memory: train.py calls backward once on the mean of the S losses, so every chunk's activations are alive
# at the peak -- as much as full BPTT (measured at M = 48: 196 MB vs 194 MB for K = M, 12 MB for K = 2).
# The "without the memory cost of full BPTT" the paper expects comes from grad_ckpt (14 MB), which gives
# full BPTT at the same memory too: what chunking then changes is the objective (a loss every C steps,
# no gradient across chunks), not the memory.
# lr 1.5e-4 (the default) as config/m48_hrm_n12_t4.py (assumed there; the paper suggests lr / S for S > 1).
# torchrun --standalone --nproc_per_node=6 train.py config/chunked_bptt_example.py
out_dir = "out-chunked_bptt_m48_c12"
N = 3                             # Slow firings per chunk
T = 4
K = 12                            # = C: every step of a chunk carries gradient
S = 4                             # = M / C chunks, detached from each other, a loss each
grad_ckpt = True                  # steps recomputed in backward: only the states between steps are kept
warmup_iters = 4800               # max(1000, M*100) for the M = 48 steps of a sequence (docs/MODEL.md section 6)
