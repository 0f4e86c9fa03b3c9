"""
Reproduction v3 (docs/RESULTS.md sections 1-5): HPSearch in miniature, with the controls that tell architecture from
trainability. The runs still missing, then every table and plot from the committed logs:

    python prepare.py --dataset=shakespeare_char && python prepare.py
    python experiments/sweep.py                 # all runs, then tables and plots (about 3 hours on 2 cores)
    python experiments/sweep.py --tables        # tables and plots only, from experiments/logs/sweep/ alone

Phases: 1. the character testbed's variants (arms.CHAR) at 4 learning rates, seed 1337, each best lr at an edge grown
a half-decade step that way until bracketed; 2. each best with 2 more seeds, and the K ablation (K = 1, 4 of M = 4)
for post-norm HRM; 3. the BPE testbed's (arms.BPE) from their best character-level lr and one step each side, grown
until bracketed, then 3 seeds. Checkpoint readings: report.analysis (analysis.json beside the logs).
"""

import math
import os
import sys

import arms
import report
import runner
from arms import CHAR, GRID, LRS, SEEDS, VARIANTS, best_lr, best_runs, command, lr_text, run_dir, settled, tried
from hrmlm import signals
from hrmlm.common import UserError
from report import heading, mean_sd


def edge_runs(testbed):
    """A variant whose best lr is the highest (lowest) it tried gets the next grid point up (down), so
    every reported best is bracketed by a worse lr on each side where the grid allows."""
    jobs = []
    for v in VARIANTS[testbed]:
        lrs, lr = tried(testbed, v), best_lr(testbed, v)
        if lr is not None:
            i = GRID.index(lr)
            jobs += [command(testbed, v, GRID[j], SEEDS[0]) for j, edge in ((i + 1, lrs[-1]), (i - 1, lrs[0]))
                     if lr == edge and 0 <= j < len(GRID)]
    return jobs


def run_everything(workers, testbeds):
    """Phases 1-3 (the module's docstring), testbed by testbed, the grid grown until every best is bracketed."""
    for tb in [t for t in ("char", "bpe") if t in testbeds]:
        if tb == "char":
            first = [command("char", v, lr, SEEDS[0]) for v in CHAR for lr in LRS]
        else:   # each variant at its best character-level lr and one grid step each side
            lrs = {v: best_lr("char", arms.CHAR_LR_OF.get(v, v)) for v in arms.BPE}
            first = [command("bpe", v, g, SEEDS[0]) for v, lr in lrs.items() if lr is not None
                     for g in GRID[max(GRID.index(lr) - 1, 0):GRID.index(lr) + 2]]
        runner.run_all(first, workers)
        while jobs := edge_runs(tb):
            runner.run_all(jobs, workers)
        seeds = [command(tb, v, best_lr(tb, v), s) for v in VARIANTS[tb] if best_lr(tb, v) is not None
                 for s in SEEDS[1:]]
        lr = best_lr("char", "hrm-post") if tb == "char" else None   # the K ablation, 3 seeds
        runner.run_all(seeds + ([] if lr is None else [command("char", v, lr, s, args, extra)
                                                       for v, args, extra in arms.K_ABLATION for s in SEEDS]), workers)


# --- tables and plots, from the committed logs alone ----------------------------------------------

def lr_table(testbed, title):
    vs = VARIANTS[testbed]
    cols = [lr for lr in GRID if any(lr in tried(testbed, v) for v in vs)]
    heading(title, "variant", "params", "MFLOPs/token", *[f"lr {lr_text(lr)}" for lr in cols], "best lr")
    for v in vs:
        best = best_lr(testbed, v)
        cells = [("**" + report.cell(d) + "**" if lr == best else report.cell(d)) if lr in tried(testbed, v) else "-"
                 for lr, d in ((lr, run_dir(testbed, v, lr, SEEDS[0])) for lr in cols)]
        print("| " + " | ".join([v, arms.size_cells(testbed, v)] + cells + [lr_text(best) if best else "-"]) + " |")
    print()


def seeds_table(testbed, title, uni):
    """Each variant at its best lr over the 3 seeds."""
    heading(title, "variant", "MFLOPs/token", "lr", *[f"seed {s}" for s in SEEDS], "mean ± sd", "below unigram")
    for v in VARIANTS[testbed]:
        lr = best_lr(testbed, v)
        if lr is None:
            continue
        dirs = [run_dir(testbed, v, lr, s) for s in SEEDS]
        m, sd, n = mean_sd([runner.final_val(d) for d in dirs if runner.finished(d)])
        print(f"| {v} | {arms.size_cells(testbed, v).split(' | ')[1]} | {lr_text(lr)} | " +
              " | ".join(map(report.cell, dirs)) + f" | {m:.3f} ± {sd:.3f} (n={n}) | {uni - m:.3f} |")
    print()


# (row, column, what the row changes, what it claims to measure); each pair differs in the one thing named
COMPARISONS = [
    ("hrm-post", "transformer-post", "HRM vs Transformer L=4 at equal stored parameters (the paper's Finding 1)"),
    ("hrm-pre", "transformer-pre", "the same, pre-norm"),
    ("hrm-post", "unitf-post", "HRM vs UniTF d=256 at equal stored parameters (Finding 3)"),
    ("hrm-pre", "unitf-pre", "the same, pre-norm"),
    ("hrm-post", "hrm_fast_only-post", "the Slow module, added to the Fast module alone (+0.34M parameters)"),
    ("hrm-post", "hrm_fast_only_wide-post", "the Slow module against the same parameters spent on width (d=160)"),
    ("hrm_fast_only-post", "unitf_d128-post", "HRM's step (input block, re-injection, gates, fusion) vs a plain shared block, both d=128"),
    ("unitf_d128-post", "transformer-post", "weight sharing: one block applied 4 times vs 4 blocks, both d=128"),
    ("unitf-post", "unitf_d128-post", "UniTF's width, d=256 vs d=128 (4x the parameters)"),
    ("unitf-post", "transformer-post", "UniTF d=256 vs Transformer at equal stored parameters"),
    ("unitf_full-post", "unitf-post", "UniTF full backprop K=M=4 vs K=2 (gradient reaches the embedding)"),
    ("hrm_clip1-post", "hrm-post", "HRM clipped at 1.0 (the Transformer's) vs at grad_clip * K / M = 0.5"),
    ("unitf_clip1-post", "unitf-post", "UniTF clipped at 1.0 vs at 0.5"),
    ("hrm-pre", "transformer_l1-pre", "pre-norm HRM vs its input block alone, a Transformer L=1 (what HRM is when the fusion reads only x~)"),
    ("hrm_rdepth-post", "hrm-post", "HRM trained at random depth, N' uniform on 1..3, vs at N = 2 (both evaluated at N = 2)"),
    ("unitf_rdepth-post", "unitf-post", "UniTF trained at random depth, M' uniform on 1..7, vs at M = 4 (both evaluated at M = 4)"),
    ("transformer-pre", "transformer-post", "Transformer: pre- vs post-norm"),
    ("unitf-pre", "unitf-post", "UniTF: pre- vs post-norm"),
    ("hrm-pre", "hrm-post", "HRM: pre- vs post-norm"),
]


def seed_values(testbed, v):
    """{seed: final val} of a variant's finished runs at its best lr."""
    lr = best_lr(testbed, v)
    return {} if lr is None else arms.by_seed([run_dir(testbed, v, lr, s) for s in SEEDS])


def differences_table():
    heading("Character testbed: differences of the best-lr seed means (row minus column; negative = row better)",
            "row", "column", "what differs", "Δ CE", "Welch: 95% interval, p", "paired: 95% interval, p", "verdict",
            "FLOPs/token, row / column", note="Every variant ran seeds 1337, 42 and 2024, so each difference is paired "
            "by seed (95% interval and p of the paired t); Welch's, which ignores the pairing, beside it. The verdict "
            "follows the paired interval: a sign where it excludes 0, else \"the data cannot tell\".\n")
    for a, b, what in COMPARISONS:
        va, vb = seed_values("char", a), seed_values("char", b)
        w, pr = report.welch(list(va.values()), list(vb.values())), report.paired(va, vb)
        fa, fb = arms.size_of("char", a)[1], arms.size_of("char", b)[1]
        ratio = f"{fa / fb:.2f}x" if fa and fb else "-"
        d = pr or w   # None: too few runs
        cells = [f"{d.diff:+.3f}" if d else "-"]
        cells += [f"[{x.lo:+.3f}, {x.hi:+.3f}], p = {report.p_text(x.p)}" if x else "-" for x in (w, pr)]
        cells += ["-" if not d else "row better" if d.hi < 0 else "row worse" if d.lo > 0 else "the data cannot tell"]
        print(f"| {a} | {b} | {what} | " + " | ".join(cells) + f" | {ratio} |")
    print()
    chain = ["hrm-post", "hrm_fast_only-post", "unitf_d128-post", "transformer-post"]
    ds = [report.paired(seed_values("char", a), seed_values("char", b)) for a, b in zip(chain, chain[1:])]
    if all(ds):
        total = report.paired(seed_values("char", chain[0]), seed_values("char", chain[-1]))
        parts = " ".join(f"{d.diff:+.3f} [{d.lo:+.3f}, {d.hi:+.3f}] ({what})" for d, what in
                         zip(ds, ("the Slow module", "HRM's step vs a plain shared block", "weight sharing")))
        print(f"Decomposition, post-norm, d=128 throughout, paired by seed (95% intervals): HRM - Transformer = "
              f"{total.diff:+.3f} = {parts}\n")


DEPTH_VARIANTS = ["hrm-post", "hrm-pre", "hrm_rdepth-post", "unitf-post", "unitf-pre", "unitf_full-post",
                  "unitf_d128-post", "unitf_rdepth-post"]


def k_table():
    """The K ablation, 3 seeds: each K's CE, and its difference from K = 2 (the paper's) paired by seed."""
    lr = best_lr("char", "hrm-post")
    if not lr:
        return
    heading(f"K ablation: post-norm HRM, M = 4, lr {lr_text(lr)}, 3 seeds (clipping at grad_clip * K / M; difference "
            "from K = 2 paired by seed, 95% interval)", "K", "MFLOPs/token", *[f"seed {s}" for s in SEEDS],
            "mean ± sd", "minus K = 2")
    dirs = {k: [run_dir("char", "hrm-post", lr, s, extra) for s in SEEDS] for k, extra in ((1, "-K1"), (2, ""), (4, "-K4"))}
    for k, ds in dirs.items():
        fl = next((f"{runner.facts(d)['train_flops_per_token'] / 1e6:.1f}" for d in ds if runner.finished(d)), "-")
        m, sd, n = mean_sd(list(arms.by_seed(ds).values()))
        diff = "-" if k == 2 else (report.paired(arms.by_seed(ds), arms.by_seed(dirs[2])) or "-")
        print(f"| {k}{' (= M, full backprop)' if k == 4 else ''} | {fl} | " + " | ".join(map(report.cell, ds)) +
              f" | {report.fmt(m)} ± {sd:.3f} (n={n}) | {diff} |")
    # the paper's claim is a trend in K: the two ends of it, paired by seed
    print(f"\nK = 4 minus K = 1, paired by seed: {report.paired(arms.by_seed(dirs[4]), arms.by_seed(dirs[1])) or '-'}\n")


def tables():
    uni = report.unigrams()
    print(f"Unigram reference (token frequencies from train.bin, add-one smoothed, scored on val.bin): "
          f"character testbed {uni['char']:.3f}, BPE testbed {uni['bpe']:.3f} nats/token\n")
    lr_table("char", "Character testbed: validation CE after 400 iterations, by learning rate (seed 1337)")
    seeds_table("char", "Character testbed: each variant at its best learning rate, 3 seeds", uni["char"])
    differences_table()
    lr_table("bpe", "BPE testbed (GPT-2 BPE, d=128, 400 iterations): validation CE by learning rate (seed 1337)")
    seeds_table("bpe", "BPE testbed: each variant at its best learning rate, 3 seeds", uni["bpe"])
    k_table()
    report.slow_table("The Slow-module reading: each HRM variant at its best lr, 3 seeds (mean ± sd; 64 validation "
                      "sequences of 128 characters)", "variant",
                      ((v, best_runs("char", v)) for v in ("hrm-post", "hrm-pre", "hrm_fast_only-post")))
    report.slow_seed_table("The Slow-module reading, seed by seed: post-norm HRM at its best lr",
                           best_runs("char", "hrm-post"))
    report.depth_table("Depth at inference: val CE with the trained weights run at other depths, best lr, 3 seeds "
                       "(mean ± sd; HRM: N' Slow firings with T kept, or T' Fast steps per firing with N kept; UniTF: "
                       "M' steps)", ("variant",), ((v, best_runs("char", v)) for v in DEPTH_VARIANTS))
    draw(uni)


def draw(uni):
    """Each plot whose runs are all committed; one line names the others, whose committed files are kept."""
    kept = []
    for name, testbed, fn in (("sweep_lr.png", "char", draw_lr), ("bpe_lr.png", "bpe", draw_lr),
                              ("sweep_curves.png", "char", draw_curves), ("depth.png", "char", draw_depth)):
        missing = [v for v in VARIANTS[testbed] if not settled(testbed, v)]
        if missing:   # never overwrite a committed plot with an empty or partial one
            kept.append(f"docs/{name} ({len(missing)} {testbed} variant(s) unsettled: {', '.join(missing[:3])}"
                        f"{', ...' if len(missing) > 3 else ''})")
            continue
        fn(name, testbed, uni)
        print(f"wrote docs/{name}")
    if kept:
        print(f"sweep.py: not drawing {'; '.join(kept)}: no committed runs for them; the committed plots are kept",
              file=sys.stderr)


COLORS = {"hrm": "C0", "transformer": "C1", "unitf": "C2", "hrm_fast_only": "C4", "unitf_full": "C3",
          "hrm_fast_only_wide": "C5", "unitf_d128": "C6", "hrm_clip1": "C7", "unitf_clip1": "C8",
          "transformer_l1": "C9", "hrm_rdepth": "navy", "unitf_rdepth": "darkgreen", "transformer_proj": "saddlebrown"}


def style(v):
    arch, norm = v.rsplit("-", 1)
    return dict(color=COLORS[arch], linestyle="-" if norm == "post" else "--")


def draw_lr(name, testbed, uni):
    fig, ax = report.figure()
    for v in VARIANTS[testbed]:
        pts = [(lr, runner.final_val(run_dir(testbed, v, lr, SEEDS[0]))) for lr in tried(testbed, v)]
        pts = [(lr, y) for lr, y in pts if math.isfinite(y)]
        if pts:
            ax.plot(*zip(*pts), marker="o", markersize=3, label=v, **style(v))
    report.unigram_line(ax, uni[testbed])
    ax.set_xscale("log")
    report.dress(ax, "peak learning rate", "final validation CE", f"{'Character' if testbed == 'char' else 'BPE'} "
                 f"testbed, {arms.SWEEP_ITERS[testbed]} iterations: CE vs learning rate (seed 1337)", 5.5)
    report.save(fig, name)


def draw_curves(name, testbed, uni):
    fig, ax = report.figure()
    for v in VARIANTS[testbed]:
        logs = [runner.run_log(d) for d in best_runs(testbed, v)]
        if logs:
            report.band(ax, *report.seed_curve(logs), marker="o", markersize=2.5,
                        label=f"{v} (lr {lr_text(best_lr(testbed, v))}, {len(logs)} seeds)", **style(v))
    report.unigram_line(ax, uni[testbed])
    ax.set_yscale("log")  # keeps iteration 0 (ln 80 = 4.38) on the chart beside the final values
    report.dress(ax, "iteration", "validation CE (log scale)",
                 "Character testbed: learning curves at each variant's best lr (band: seed min-max)", 5, "both")
    report.save(fig, name)


def draw_depth(name, testbed, uni):
    fig, axes = report.figure(2, sharey=True)
    for ax, varied in zip(axes, ("N", "T")):
        for v in DEPTH_VARIANTS:
            rows = report.depth_rows(best_runs("char", v))
            what = varied if v.startswith("hrm") else "M"
            pts = [(f, mean_sd(rows[(what, f)])[0]) for f in map(float, report.DEPTHS) if (what, f) in rows]
            pts = [(f, y) for f, y in pts if math.isfinite(y)]
            if pts:
                ax.plot(*zip(*pts), marker="o", markersize=3, label=f"{v} ({what}')", **style(v))
        report.unigram_line(ax, uni[testbed])
        ax.axvline(1, color="0.6", linewidth=0.8)
        ax.set_xscale("log", base=2)
        report.dress(ax, "inference depth / trained depth", "validation CE (3-seed mean)",
                     f"Depth at inference: HRM varies {varied}', UniTF varies M'", 6)
    report.save(fig, name)


def main():
    ap = runner.runner_parser(__doc__, "print the tables and draw the plots only", dry_run=False)
    ap.add_argument("--testbeds", default="char,bpe", help="run these testbeds' phases only (char: phases 1, 2 "
                    "and the K ablation; bpe: needs char's learning rates)")
    args = ap.parse_args()
    args.testbeds = args.testbeds.split(",")
    if not args.tables and not set(args.testbeds) <= {"char", "bpe"}:
        raise UserError(f"--testbeds={','.join(args.testbeds)}: choose from char, bpe")
    os.chdir(runner.ROOT)
    if not args.tables:
        runner.require_data([("shakespeare_char", "--dataset=shakespeare_char"), ("shakespeare", "")])
        run_everything(args.workers, args.testbeds)
    tables()


if __name__ == "__main__":
    signals.main(main)
