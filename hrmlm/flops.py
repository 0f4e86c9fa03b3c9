"""
FLOPs of a training iteration and the device's peak, for MFU (train.py's progress line, bench.py).

counted_train_flops runs the real model's forward and backward on the `meta` device under torch's own FLOP
counter: nothing is allocated, a d=4096 model counts in seconds, and it counts what really runs (every
matmul of the no-grad steps, the gates, the Slow module, the fusion, the tied head, attention as full n x n).
train_flops is the paper's simpler model, S (M + 2K) C, kept beside it for comparison.
"""

import torch

from hrmlm.common import timed
from model import build_model, fast_attn_schedule

# datasheet dense bf16 peaks, TFLOP/s, the same for fp16 on these parts (MFU is measured against the device's own
# peak). Matched against torch.cuda.get_device_name in this order, the most specific first: an "H100 PCIe" is
# not the SXM part ("NVIDIA H100 80GB HBM3").
DATASHEET_BF16_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.0, "H200": 989.0, "H800 PCIe": 756.0,
                         "H800": 989.0, "B200": 2250.0, "A100": 312.0,
                         "L40S": 362.0, "RTX 6000 Ada": 364.0, "A6000": 155.0, "4090": 165.0}


def counted_train_flops(cfg, batch, n):
    """FLOPs of one training forward + backward of a (batch, n) micro-batch of build_model(cfg), counted by
    torch.utils.flop_counter on the meta device. For the Transformer it equals 6 N + 12 L n d per token
    (tests/test_bench.py)."""
    from torch.utils.flop_counter import FlopCounterMode
    with torch.device("meta"):
        model = build_model(cfg)
        x = torch.zeros(batch, n, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        _, loss = model(x, x)
        loss.backward()
    return counter.get_total_flops()


def block_flops(cfg, batch, n):
    """C: forward FLOPs of one CausalAttnBlock application over the batch (matmuls + attention)."""
    d = cfg.n_embd
    return batch * n * (2 * 16 * d * d + 4 * n * d)


def train_flops(cfg, batch, n):
    """The paper's model, S (M + 2K) C (UniTF: S = 1), from M steps forward and K of them backward (2 C
    each). The options of docs/MODEL.md section 8 add: a Fast step that skips attention costs B n 24 d^2 (no
    W_qkv, W_o, scores); grad_ckpt runs every step with gradient once more; K_slow's firings outside the
    window cost their backward (the paper's model leaves Slow firings out; so does this one otherwise)."""
    C = block_flops(cfg, batch, n)
    if cfg.arch == "transformer":
        return 3 * cfg.n_layer * C
    M, K = cfg.M, min(cfg.K, cfg.M)
    back = 2 + cfg.grad_ckpt          # backward (+ recompute) FLOPs per forward FLOP of a step with gradient
    attend = set(fast_attn_schedule(M, cfg.fast_attn_steps if cfg.arch == "hrm" else None))
    pw = batch * n * 24 * cfg.n_embd ** 2
    total = sum((C if i in attend else pw) * (1 + back * (i > M - K)) for i in range(1, M + 1))
    if cfg.arch == "unitf":
        return total
    extra_firings = max(0, min(cfg.K_slow, cfg.N) - min(cfg.N, -(-K // cfg.T)))  # beyond the window's own
    return cfg.S * (total + back * extra_firings * C)


def measure_peak_tflops(device, dtype, n=None):
    """The machine's matmul peak, measured now: the median of several n x n matmuls, at the best n. A GPU peaks
    on large ones (8192); a CPU core on ones that fit its cache (256 ran 2x faster than 1024 here), so on a CPU
    the best of 256, 512 and 1024 is the peak: against the largest alone, a small model's MFU exceeded 100%."""
    sizes = [n] if n else [8192] if device.startswith("cuda") else [256, 512, 1024]
    best = 0.0
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        dt = timed(lambda: a @ b, device, 10 if device.startswith("cuda") else 5)
        best = max(best, 2 * n ** 3 / dt / 1e12)
    return best


def datasheet_tflops(device):
    """The datasheet bf16 (= fp16) dense peak of a known GPU, else None."""
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in DATASHEET_BF16_TFLOPS.items() if k in name), None)


def device_peak_tflops(device, dtype):
    """The peak MFU is measured against: the datasheet dense peak of a known GPU in bf16 or fp16 (the same
    figure), else a matmul peak measured now (float32, an unknown GPU; a CPU has no useful datasheet figure)."""
    sheet = datasheet_tflops(device) if dtype in (torch.bfloat16, torch.float16) else None
    return sheet or measure_peak_tflops(device, dtype)  # CPU: ~0.1 s
