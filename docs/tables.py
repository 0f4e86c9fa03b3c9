"""Print the tables of docs/RESULTS.md from the runs of docs/reproduce_shakespeare.sh.

    python docs/tables.py out-repro
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import ModelConfig, build_model  # noqa: E402
from plot import read_log  # noqa: E402


def final(run):
    """(final val loss, params) of a run: the last line of its log.jsonl and its checkpoint's model args."""
    rows = read_log(run)
    args = torch.load(os.path.join(run, "ckpt_last.pt"), map_location="cpu", weights_only=True)["model_args"]
    with torch.device("meta"):
        params = build_model(ModelConfig(**args)).num_params()
    return rows[-1]["val_loss"], params, rows[-1]["iter"]


def main(root):
    print("Matched stored parameters (val CE at the last iteration)\n")
    print("| model | params | seed 1337 | seed 42 | mean | lr 5e-4 (seed 1337) |\n|---|---|---|---|---|---|")
    for name, label in (("hrm", "HRM N=2, T=2, K=2"), ("transformer", "Transformer L=4"),
                        ("unitf-d144", "UniTF M=4, K=2, d=144")):
        (a, p, _), (b, _, _) = final(f"{root}/{name}-s1337"), final(f"{root}/{name}-s42")
        lr = final(f"{root}/{name}-lr5e-4")[0] if os.path.exists(f"{root}/{name}-lr5e-4/log.jsonl") else None
        print(f"| {label} | {p / 1e6:.2f}M | {a:.3f} | {b:.3f} | {(a + b) / 2:.3f} | "
              f"{'-' if lr is None else f'{lr:.3f}'} |")
    print("\nK ablation, HRM N=4, T=2 (M=8), seed 1337\n")
    print("| K | K/M | val CE |\n|---|---|---|")
    for K in (1, 2, 4, 8):
        v, _, _ = final(f"{root}/hrm-m8-k{K}")
        print(f"| {K}{' (= M, full backprop)' if K == 8 else ''} | {K / 8:.0%} | {v:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "out-repro")
