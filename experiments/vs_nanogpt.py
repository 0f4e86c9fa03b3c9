"""
Our Transformer against nanoGPT's GPT at one shape: a training step each (forward, backward, AdamW), timed
interleaved in one process, eager and compiled (docs/BENCHMARKS.md, "CPU training beside nanoGPT"). nanoGPT's GPT is
written here at its published shape (LayerNorm without bias, learned positions, a GELU MLP of 4d, the tied head), not
imported; ours is model.py's Transformer (post-norm RMSNorm, RoPE, SwiGLU: 1.06x nanoGPT's FLOPs at this shape).

    python experiments/vs_nanogpt.py                         # d=256, L=4, batch 8 x 256, vocab 50304, float32; 3 rounds
    python experiments/vs_nanogpt.py --no-compile --profile  # eager only, and each step's top ops
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repo root: model.py
from model import ModelConfig, build_model  # noqa: E402


class NanoBlock(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.n_head, self.ln_1, self.ln_2 = n_head, nn.LayerNorm(d, bias=False), nn.LayerNorm(d, bias=False)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in self.c_attn(self.ln_1(x)).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    def __init__(self, vocab, block_size, d, n_layer, n_head):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block_size, d)
        self.blocks = nn.ModuleList(NanoBlock(d, n_head) for _ in range(n_layer))
        self.ln_f, self.lm_head = nn.LayerNorm(d, bias=False), nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.lm_head.weight   # tied, as nanoGPT ties them

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def step_of(model, x, y, compiled):
    """One training step of the model, as train.py takes it (AdamW, unfused on a CPU as nanoGPT's is)."""
    opt, run = torch.optim.AdamW(model.parameters(), lr=1e-4), torch.compile(model) if compiled else model

    def step():
        run(x, y)[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def median_ms(step, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the ratio is their median")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per model per round (after 2 warm-ups)")
    ap.add_argument("--no-compile", action="store_true", help="eager only")
    ap.add_argument("--profile", action="store_true", help="each model's top ops in one eager step")
    a = ap.parse_args()
    V, heads = 50304, max(1, a.d // 64)
    torch.manual_seed(0)
    x, y = (torch.randint(0, V, (a.batch, a.seq)) for _ in range(2))
    models = {"ours": build_model(ModelConfig(arch="transformer", vocab_size=V, block_size=a.seq, n_embd=a.d,
                                              n_head=heads, n_layer=a.layers)),
              "nanoGPT": NanoGPT(V, a.seq, a.d, a.layers, heads)}
    print(f"d={a.d}, L={a.layers}, {heads} heads, batch {a.batch} x {a.seq}, vocab {V}, float32, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    for compiled in [False] + [True] * (not a.no_compile):
        how, steps = "compiled" if compiled else "eager", {n: step_of(m, x, y, compiled) for n, m in models.items()}
        for name, step in steps.items():   # warm-up (compiled: the compile itself, timed)
            print(f"{how} {name}: warm-up {median_ms(lambda: (step(), step()), 1) / 1000:.1f} s", flush=True)
        ratios = []
        for r in range(a.rounds):   # interleaved: each round times both, in alternating order
            ms = {n: median_ms(steps[n], a.steps) for n in (["ours", "nanoGPT"] if r % 2 == 0 else ["nanoGPT", "ours"])}
            ratios.append(ms["ours"] / ms["nanoGPT"])
            print(f"  round {r + 1}: ours {ms['ours']:.1f} ms, nanoGPT {ms['nanoGPT']:.1f} ms, ratio {ratios[-1]:.3f}")
        print(f"{how}: ours / nanoGPT time per step, median of {a.rounds} rounds: {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f})", flush=True)
    for name, m in models.items() if a.profile else ():
        step = step_of(m, x, y, False)
        step()
        with torch.profiler.profile() as prof:
            step()
        print(f"\n{name}: one eager step's top ops (self CPU time)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
