"""
FLOPs of a training iteration and the device's peak, for MFU (train.py's progress line, bench.py).
counted_train_flops counts what really runs (every matmul of the no-grad steps, the gates, the Slow module, the
fusion, the tied head, attention as full n x n) with torch's FLOP counter on the `meta` device: nothing is
allocated, and a d=4096 model counts in seconds. train_flops is the paper's simpler model, kept for comparison.
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
    """FLOPs of one training forward + backward of a (batch, n) micro-batch of build_model(cfg). For the
    Transformer it equals 6 N + 12 L n d per token (tests/test_bench.py)."""
    from torch.utils.flop_counter import FlopCounterMode
    with torch.device("meta"):
        model = build_model(cfg)
        x = torch.zeros(batch, n, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        _, loss = model(x, x)
        loss.backward()
    return counter.get_total_flops()


def train_flops(cfg, batch, n):
    """The paper's model, S (M + 2K) C (UniTF: S = 1), from M steps forward and K of them backward (2 C each), where
    C = B n (32 d^2 + 4 n d) is one block's forward (matmuls + attention). The options of docs/MODEL.md section 8
    add: a Fast step that skips attention costs B n 24 d^2 (no W_qkv, W_o, scores); grad_ckpt runs every step with
    gradient once more; K_slow's firings outside the window cost their backward (the paper's model leaves Slow
    firings out; so does this one otherwise)."""
    C = batch * n * (32 * cfg.n_embd ** 2 + 4 * n * cfg.n_embd)
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


def measure_peak_tflops(device, dtype):
    """The machine's matmul peak, measured now: the median of several n x n matmuls, at the best n. A GPU peaks
    on large ones (8192); a CPU core on ones that fit its cache (256 ran 2x faster than 1024 here), so on a CPU
    the best of 256, 512 and 1024 is the peak: against the largest alone, a small model's MFU exceeded 100%."""
    cuda = device.startswith("cuda")

    def tflops(n):
        a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        return 2 * n ** 3 / timed(lambda: a @ b, device, 10 if cuda else 5) / 1e12
    return max(map(tflops, [8192] if cuda else [256, 512, 1024]))


def datasheet_tflops(device):
    """The datasheet bf16 (= fp16) dense peak of a known GPU, else None."""
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else ""
    return next((v for k, v in DATASHEET_BF16_TFLOPS.items() if k in name), None)


def device_peak_tflops(device, dtype):
    """The peak MFU is measured against: the datasheet dense peak of a known GPU in bf16 or fp16 (the same
    figure), else a matmul peak measured now (float32, an unknown GPU; a CPU has no useful datasheet figure)."""
    sheet = datasheet_tflops(device) if dtype in (torch.bfloat16, torch.float16) else None
    return sheet or measure_peak_tflops(device, dtype)  # CPU: ~0.1 s
