"""
Learning curves (val CE against iteration) from train.py's out_dir/log.jsonl files, one line per run,
in the style of the paper's figures.

    python tools/plot.py out-hrm out-tf out-unitf [--out=curves.png] [--title=...] [--labels=HRM,T-L4,UniTF]

The chart goes beside the runs (out-hrm/curves.png) unless --out says otherwise. The y axis is
logarithmic, so iteration 0 (about ln V) stays on it, and a dotted line marks the unigram CE of each
dataset the runs trained on, labelled with its name: what a model that knows only token frequencies scores.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repo root: model.py, hrmlm/
from hrmlm import signals  # noqa: E402

if __name__ == "__main__":   # first of all (matplotlib and torch take seconds to import): a signal is one line
    signals.guard("plot.py")

import argparse  # noqa: E402
import math  # noqa: E402

import matplotlib.ticker  # noqa: E402
from matplotlib.backend_bases import FigureCanvasBase  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402   (no pyplot: no GUI backend, nothing global)

from hrmlm.checkpoint import CKPT_BEST, LOG, read_info, read_log, resume_path  # noqa: E402
from hrmlm.common import HelpFormatter, UserError, check_output_path, unigram_ce, write_result  # noqa: E402


def load_log(out_dir):
    """A run's log (checkpoint.read_log), with a note for the lines it skipped; a UserError if there is none."""
    rows, skipped = read_log(out_dir)
    if skipped:
        print(f"note: skipped {skipped} malformed line(s) in {os.path.join(out_dir, LOG)}", file=sys.stderr)
    return rows


def finite(v):
    """A number to plot: not None, a string, or the NaN/inf of a diverged run."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def unigram_of(out_dir):
    """(dataset name, unigram CE) of the dataset a run trained on (from its checkpoint's config), or None."""
    try:
        best = os.path.join(out_dir, CKPT_BEST)
        cfg = read_info(best if os.path.exists(best) else resume_path(out_dir))["config"]
        if os.path.getsize(os.path.join(cfg["data_dir"], cfg["dataset"], "train.bin")) > 1 << 30:
            raise ValueError("too large to count here")  # OpenWebText: 18 GB to read for one line
        return cfg["dataset"], unigram_ce(cfg["data_dir"], cfg["dataset"])
    except Exception:  # no checkpoint or no data here: the curves alone
        print(f"note: no unigram line (no checkpoint or dataset found for {out_dir})", file=sys.stderr)
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("runs", nargs="+", help="train.py out_dir folders")
    ap.add_argument("--out", default=None, help="PNG to write (default: curves.png in the first run's folder)")
    ap.add_argument("--title", default=None, help="chart title (default: the metric and the runs' names)")
    ap.add_argument("--unigram", default=True, action=argparse.BooleanOptionalAction,
                    help="draw the unigram CE of each run's dataset: what token frequencies alone score")
    ap.add_argument("--labels", default=None, help="comma-separated legend labels (default: folder names)")
    ap.add_argument("--metric", default="val_loss", choices=["val_loss", "train_loss"],
                    help="which logged loss to draw")
    args = ap.parse_args(argv)
    labels = args.labels.split(",") if args.labels else [os.path.basename(os.path.normpath(r)) for r in args.runs]
    out = args.out or os.path.join(args.runs[0], "curves.png")   # beside the runs, not in the repository
    if len(labels) != len(args.runs):
        raise UserError(f"{len(labels)} labels for {len(args.runs)} runs")
    check_output_path(out, "--out")   # before the work, not after it
    kinds, ext = FigureCanvasBase.get_supported_filetypes(), os.path.splitext(out)[1].lower().lstrip(".")
    if ext not in kinds:
        raise UserError(f"--out {out!r}: matplotlib cannot write {'.' + ext if ext else 'a file without an extension'}"
                        f"; use one of {', '.join('.' + k for k in sorted(kinds))}")
    curves = [[(r["iter"], r[args.metric]) for r in load_log(run) if finite(r.get(args.metric))] for run in args.runs]
    for run, points in zip(args.runs, curves):
        if not points:
            raise UserError(f"{os.path.join(run, LOG)} has no finite {args.metric} (a run that diverged from the "
                            f"start?); nothing to draw")
    fig = Figure(figsize=(6.4, 4.0), dpi=150)
    ax = fig.subplots()
    for label, points in zip(labels, curves):
        x, y = zip(*points)
        ax.plot(x, y, marker="o", markersize=2.5, linewidth=1.4, label=f"{label} ({y[-1]:.3f})")
    kind = "validation" if args.metric == "val_loss" else "train"
    ax.set(xlabel="iteration", ylabel=f"{kind} CE")
    ax.grid(True, linestyle=":", color="0.8")
    unigrams = dict(u for u in map(unigram_of, args.runs if args.unigram else []) if u)   # one line per dataset
    for (name, uni), style in zip(unigrams.items(), (":", "-.", "--", (0, (1, 3)))):
        ax.axhline(uni, color="0.4", linewidth=1, linestyle=style, label=f"unigram ({name}) {uni:.3f}")
    # log scale: iteration 0 (about ln V) stays on the chart without flattening the later differences
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.2f"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%.1f"))
    ax.grid(True, which="minor", linestyle=":", color="0.9")
    ax.set_title(args.title or f"{kind} CE: " + ", ".join(labels), fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    write_result(out, lambda f: fig.savefig(f, format=ext), "wb")   # whole or not at all: the old chart stays
    print(f"wrote {out}")


if __name__ == "__main__":
    signals.main(main)
