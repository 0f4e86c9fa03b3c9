"""
Learning curves (val CE against iteration) from train.py's out_dir/log.jsonl files, one line per run,
in the style of the paper's figures.

    python plot.py out-hrm out-tf out-unitf --out=curves.png [--title=...] [--labels=HRM,T-L4,UniTF]
"""

import argparse
import json
import os
import sys


def read_log(out_dir):
    path = os.path.join(out_dir, "log.jsonl")
    if not os.path.exists(path):
        sys.exit(f"plot.py: error: {path} not found (is {out_dir!r} a train.py out_dir?)")
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    by_iter = {r["iter"]: r for r in rows}  # a resumed run may log an iteration again: keep the last
    return [by_iter[i] for i in sorted(by_iter)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="train.py out_dir folders")
    ap.add_argument("--out", default="curves.png", help="PNG to write")
    ap.add_argument("--title", default=None)
    ap.add_argument("--labels", default=None, help="comma-separated legend labels (default: folder names)")
    ap.add_argument("--metric", default="val_loss", choices=["val_loss", "train_loss"])
    args = ap.parse_args(argv)
    labels = args.labels.split(",") if args.labels else [os.path.basename(os.path.normpath(r)) for r in args.runs]
    if len(labels) != len(args.runs):
        sys.exit(f"plot.py: error: {len(labels)} labels for {len(args.runs)} runs")
    logs = [read_log(r) for r in args.runs]

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=150)
    for label, log in zip(labels, logs):
        x = [r["iter"] for r in log if r.get(args.metric) is not None]
        y = [r[args.metric] for r in log if r.get(args.metric) is not None]
        ax.plot(x, y, marker="o", markersize=2.5, linewidth=1.4, label=f"{label} ({y[-1]:.3f})" if y else label)
    ax.set_xlabel("iteration")
    ax.set_ylabel("validation CE" if args.metric == "val_loss" else "train CE")
    ax.grid(True, linestyle=":", color="0.8")
    finals = [r[args.metric] for log in logs for r in log[1:] if r.get(args.metric) is not None]
    if finals:  # like the paper, leave the iteration-0 values (about ln V) off the chart
        lo, hi = min(finals), max(finals)
        ax.set_ylim(lo - 0.05 * (hi - lo + 1e-9), hi + 0.15 * (hi - lo + 1e-9))
    if args.title:
        ax.set_title(args.title, fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
