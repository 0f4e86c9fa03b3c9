"""
The long run (docs/RESULTS.md): does the character testbed's ordering hold with 10x the training? Every run
of experiments/sweep.py stops at 400 iterations (410k characters) with its curve still falling; these run 4000
iterations of the same 8 x 128 batches (4.1M characters) for the six main variants: HRM post- and pre-norm,
the Transformer post- and pre-norm, UniTF post-norm and UniTF with full backprop.

    python experiments/sweep.py                 # first: the 400-iteration learning rates this starts from
    python experiments/long_run.py              # the runs still missing (two at a time, one thread each), the
                                         # checkpoint readings still missing, then the tables
    python experiments/long_run.py --dry-run    # list the train.py commands still to run; run nothing
    python experiments/long_run.py --tables     # tables and plot only, from the committed logs (experiments/logs/long/)

Phase A: each variant at its best 400-iteration learning rate and one grid step lower (a longer run often
prefers a lower one), seed 1337. Phase B: the better of the two with seeds 42 and 2024. Everything else is
sweep.py's schedule scaled to 4000 iterations: 400 warmup iterations, cosine decay to lr/10, an evaluation
every 200. A run cut off resumes from its last checkpoint; a finished run's log is copied to experiments/logs/long/.
Readings: post-norm HRM and UniTF's chosen runs are read like section 5's (depth at inference, the Slow
module) and the readings committed beside their logs (analysis.json). Checkpoints are not committed, so where
a reading is missing its run is trained again (deterministic on CPU; each rerun is checked against its log).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stats  # noqa: E402
import sweep  # noqa: E402  (its runner, its learning-rate grid and its committed logs)

OUT = "out-long"
ITERS = 4000                       # 10x the sweep's 400 iterations of 8 x 128 characters
VARIANTS = ["hrm-post", "hrm-pre", "transformer-post", "transformer-pre", "unitf-post", "unitf_full-post"]
GAPS = [("hrm-post", "transformer-post"), ("hrm-pre", "transformer-pre"), ("hrm-post", "unitf-post"),
        ("hrm-pre", "hrm-post"), ("unitf-post", "transformer-post"), ("unitf_full-post", "unitf-post")]
MCHARS = 8 * 128 / 1e6             # millions of characters an iteration reads (batch 8 x 128)
REACH = [("transformer-post", "hrm-post"), ("unitf-post", "hrm-post"), ("unitf_full-post", "hrm-post"),
         ("transformer-pre", "hrm-pre")]   # (baseline, HRM): when does the baseline reach HRM's final CE?
READ = ["hrm-post", "unitf-post"]   # checkpoint readings (depth at inference, the Slow module) after 10x training
AT = [400, 1000, 2000, 3000, 4000]   # iterations the gap table reads the curves at
SEEDS = sweep.SEEDS


def job(v, lr, seed):
    return sweep.command("char", v, lr, seed, iters=ITERS, out=OUT)


def candidates(v):
    """The variant's best 400-iteration learning rate and one grid step lower (None before the sweep has one)."""
    if not sweep.settled("char", v):
        return None
    best = sweep.best_lr("char", v)
    return [best, sweep.GRID[sweep.GRID.index(best) - 1]]


def chosen(v):
    """The better of the two candidates at 4000 iterations, once both have finished (seed 1337)."""
    lrs = candidates(v)
    dirs = [job(v, lr, SEEDS[0])[0] for lr in lrs or []]
    if not dirs or not all(sweep.finished(d) for d in dirs):
        return None
    return min(lrs, key=lambda lr: sweep.final_val(job(v, lr, SEEDS[0])[0]))


def phase_a():
    """Best lr for every variant first, then the lower one: each variant gets a long curve early."""
    return [job(v, lrs[k], SEEDS[0]) for k in (0, 1) for v in VARIANTS if (lrs := candidates(v))]


def phase_b():
    return [job(v, chosen(v), s) for s in SEEDS[1:] for v in VARIANTS if chosen(v) is not None]


def chosen_runs(v):
    """The out_dirs of the variant's finished runs at its chosen lr, one per seed."""
    lr = chosen(v)
    return [d for d in (job(v, lr, s)[0] for s in SEEDS) if sweep.finished(d)] if lr else []


def curve(v):
    """{iteration: [val CE of each finished seed]} at the chosen lr."""
    out = {}
    for d in chosen_runs(v):
        for r in sweep.run_log(d):
            if r.get("val_loss") is not None:
                out.setdefault(r["iter"], []).append(r["val_loss"])
    return out


def paired_gap(a, b, it):
    """stats.paired of a minus b at iteration it (the runs share seeds), or None."""
    at = [{sweep.seed_of(d): r["val_loss"] for d in chosen_runs(v) for r in sweep.run_log(d)
           if r["iter"] == it and r.get("val_loss") is not None} for v in (a, b)]
    return stats.paired(*at)


def gap(a, b, it):
    """(a minus b, its standard error) of the seed means at iteration it, or None."""
    ca, cb = curve(a).get(it), curve(b).get(it)
    if not ca or not cb or len(ca) < 2 or len(cb) < 2:
        return None
    return sweep.difference({a: sweep.mean_sd(ca), b: sweep.mean_sd(cb)}, a, b)


def reading_jobs():
    """The READ variants' finished chosen runs whose checkpoint readings are not committed yet."""
    jobs = []
    for v in READ:
        lr = chosen(v)
        for s in SEEDS if lr else []:
            d, cmd = job(v, lr, s)
            if sweep.finished(d) and not os.path.exists(sweep.analysis_path(d)):
                jobs.append((d, cmd))
    return jobs


def read_checkpoints(workers):
    """Checkpoints are not committed, so a missing reading reruns its run (CPU float32 runs are deterministic;
    a rerun already finished in out-long/ exits at once). Only a rerun that reproduces its committed log is
    read, and its reading is committed beside the log."""
    jobs = reading_jobs()
    if not jobs:
        return
    for d in sweep.run_all(jobs, workers, rerun=True):
        print(f"reading {d}", flush=True)
        sweep.analysis(d)


def readings_tables():
    """Depth at inference and the Slow-module reading after 4000 iterations, beside the same at 400."""
    print(f"### Long run: depth at inference after 400 and {ITERS} iterations (val CE, mean ± sd over the seeds "
          "read; HRM: N' Slow firings with T kept, or T' Fast steps per firing with N kept; UniTF: M' steps)\n")
    print("| variant | iterations | varied | " + " | ".join(f"{f:g}x" for f in sweep.DEPTHS) + " |")
    print("|---|---|---|" + "---|" * len(sweep.DEPTHS))
    for v in READ:
        for its, runs in ((400, sweep.best_runs("char", v)), (ITERS, chosen_runs(v))):
            n = sum(1 for d in runs if sweep.analysis(d))
            for what, cells in sweep.depth_cells(sweep.depth_rows(runs)).items():
                print(f"| {v} | {its} (n={n}) | {what}' | " + " | ".join(cells) + " |")
    print()
    print(f"### Long run: the Slow-module reading of post-norm HRM after 400 and {ITERS} iterations (mean ± sd "
          "over the seeds read; 64 validation sequences of 128 characters)\n")
    print(sweep.SLOW_LEGEND)
    print("| iterations | CE | ΔCE, H frozen | z_H drift | w_H | w_L | w_I |\n|---|---|---|---|---|---|---|")
    for its, runs in ((400, sweep.best_runs("char", "hrm-post")), (ITERS, chosen_runs("hrm-post"))):
        cells, n = sweep.slow_cells(runs)
        if cells:
            print(f"| {its} (n={n}) | {cells} |")
    print()
    if any(sweep.analysis(d) for d in chosen_runs("hrm-post")):
        print(f"### Long run: the Slow-module reading, seed by seed: post-norm HRM after {ITERS} iterations\n")
        print("| seed | CE | ΔCE, H frozen | z_H drift | w_H / w_L / w_I |\n|---|---|---|---|---|")
        sweep.slow_seed_rows(chosen_runs("hrm-post"))
        print()


def train_seconds(log):
    """A run's training time from its log's time_s, which restarts from 0 when a run is resumed."""
    total, last = 0.0, 0.0
    for r in log:
        t = r.get("time_s") or 0.0
        if t < last:          # resumed: the clock restarted
            total += last
        last = t
    return total + last


def mean_curve(v):
    """{iteration: seed-mean val CE}, at iterations every finished seed has evaluated."""
    c = curve(v)
    n = max((len(x) for x in c.values()), default=0)
    return {it: sum(x) / n for it, x in sorted(c.items()) if len(x) == n}


def reach_table():
    """How much training each baseline needs to match HRM's final CE: the first evaluation (every 200
    iterations) where its seed mean is at or below HRM's, in characters and in counted training FLOPs."""
    print(f"### Long run: how soon each baseline matches HRM's CE after {ITERS} iterations (seed means; "
          f"first evaluation, every {ITERS // 20} iterations, at or below it)\n")
    print(f"| baseline | HRM | HRM's CE at {ITERS} it | baseline reaches it at iter | characters | "
          "training FLOPs, baseline / HRM |")
    print("|---|---|---|---|---|---|")
    for b, h in REACH:
        cb, ch = mean_curve(b), mean_curve(h)
        if ITERS not in ch or not cb:
            continue
        it = next((i for i, ce in cb.items() if ce <= ch[ITERS]), None)
        fb, fh = sweep.size_of("char", b)[1], sweep.size_of("char", h)[1]
        cells = ["not reached", "-", "-"] if it is None else [
            str(it), f"{it * MCHARS:.2f}M ({it / ITERS:.0%} of HRM's)", f"{it * fb / (ITERS * fh):.2f}x"]
        print(f"| {b} | {h} | {ch[ITERS]:.3f} | " + " | ".join(cells) + " |")
    print()


def tables(plots=True):
    uni = sweep.unigrams()["char"]
    print(f"### Long run: validation CE after {ITERS} iterations ({ITERS * MCHARS:.1f}M characters, 10x the "
          f"sweep), seed 1337, at the best 400-iteration lr and one grid step lower\n")
    print("| variant | params | MFLOPs/token | best lr at 400 it | CE | one step lower | CE | chosen |")
    print("|---|---|---|---|---|---|---|---|")
    for v in VARIANTS:
        lrs = candidates(v)
        if not lrs:
            continue
        cells = " | ".join(f"{sweep.lr_name(lr)} | {sweep.cell(job(v, lr, SEEDS[0])[0])}" for lr in lrs)
        c = chosen(v)
        print(f"| {v} | {sweep.size_cells('char', v)} | {cells} | {sweep.lr_name(c) if c else '-'} |")
    print()
    print(f"### Long run: each variant at its chosen lr, 3 seeds, after {ITERS} iterations\n")
    print("| variant | lr | " + " | ".join(f"seed {s}" for s in SEEDS) +
          " | mean ± sd | at 400 iterations, its best lr there (sweep) | below unigram |")
    print("|---|---|" + "---|" * (len(SEEDS) + 3))
    for v in VARIANTS:
        lr = chosen(v)
        if lr is None:
            continue
        dirs = [job(v, lr, s)[0] for s in SEEDS]
        m, sd, n = sweep.mean_sd([sweep.final_val(d) for d in dirs if sweep.finished(d)])
        short = sweep.mean_sd([sweep.final_val(d) for d in sweep.best_runs("char", v)])
        print(f"| {v} | {sweep.lr_name(lr)} | " + " | ".join(sweep.cell(d) for d in dirs) +
              f" | {m:.3f} ± {sd:.3f} (n={n}) | {short[0]:.3f} ± {short[1]:.3f} (n={short[2]}) | {uni - m:.3f} |")
    print()
    done = [d for d, _ in phase_a() + phase_b() if sweep.finished(d)]
    hours = sum(train_seconds(sweep.run_log(d)) for d in done) / 3600
    print(f"{len(done)} runs committed, {hours:.1f} hours of training in all (one core each; their logs' time_s)\n")
    print("### Long run: differences along the curves (row minus column, paired by seed: mean, 95% interval, p; "
          "negative = row better)\n")
    print("| row | column | " + " | ".join(f"iter {it} ({it * MCHARS:.2f}M chars)" for it in AT) + " |")
    print("|---|---|" + "---|" * len(AT))
    for a, b in GAPS:
        cells = []
        for it in AT:
            d = paired_gap(a, b, it)
            cells.append("-" if d is None else str(d))
        print(f"| {a} | {b} | " + " | ".join(cells) + " |")
    print()
    reach_table()
    readings_tables()
    missing = [v for v in VARIANTS if not curve(v)]
    if plots and missing:   # never overwrite the committed plot with a partial one
        print(f"long_run.py: not drawing docs/long_run.png: no committed run at the chosen lr of "
              f"{', '.join(missing)}; the committed plot is kept", file=sys.stderr)
    elif plots:
        draw(uni)


def draw(uni):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"hrm": "C0", "transformer": "C1", "unitf": "C2", "unitf_full": "C3"}
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=130)
    for v in VARIANTS:
        arch, norm = v.rsplit("-", 1)
        c = curve(v)
        its = sorted(c)
        st = dict(color=colors[arch], linestyle="-" if norm == "post" else "--")
        ax.plot([i * MCHARS for i in its], [sum(c[i]) / len(c[i]) for i in its],
                label=f"{v} (lr {sweep.lr_name(chosen(v))}, {len(c[its[-1]])} seeds)", **st)
        ax.fill_between([i * MCHARS for i in its], [min(c[i]) for i in its], [max(c[i]) for i in its],
                        color=colors[arch], alpha=0.15)
    ax.axhline(uni, color="0.4", linewidth=1, linestyle=":", label=f"unigram {uni:.2f}")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_yticks([1.5, 2, 2.5, 3, 4, 5])
    ax.set_xlabel("characters seen (millions)")
    ax.set_ylabel("validation CE (log scale)")
    ax.set_title(f"Character testbed, {ITERS} iterations (band: seed min-max)", fontsize=9)
    for k, (a, b) in enumerate(GAPS[:3]):
        its = sorted(set(curve(a)) & set(curve(b)) - {0})   # iteration 0 is the untrained models' init CE
        pts = [(i * MCHARS, gap(a, b, i)) for i in its]
        pts = [(t, d) for t, d in pts if d]
        if pts:
            t, d = zip(*pts)
            bx.plot(t, [x[0] for x in d], color=f"C{k}", label=f"{a} minus {b}")
            bx.fill_between(t, [x[0] - 2 * x[1] for x in d], [x[0] + 2 * x[1] for x in d], color=f"C{k}", alpha=0.15)
    bx.axhline(0, color="0.4", linewidth=1)
    bx.set_xlabel("characters seen (millions)")
    bx.set_ylabel("difference in validation CE (band: ± 2 se)")
    bx.set_title("HRM minus each baseline, 3-seed means", fontsize=9)
    sweep.finish(fig, (ax, bx), "long_run.png")


def main():
    ap = sweep.runner_parser(__doc__, "print the tables and draw the plot only")
    args = ap.parse_args()
    os.chdir(sweep.ROOT)
    if args.dry_run:
        sweep.dry_run(phase_a() + phase_b())
        for d, cmd in reading_jobs():   # finished runs to rerun for their checkpoints (reading not committed)
            print(f"# rerun for its checkpoint, then read it: OMP_NUM_THREADS=1 python {' '.join(cmd[1:])}")
        return
    if not args.tables:
        sweep.require_data("long_run.py", [("shakespeare_char", "--dataset=shakespeare_char")])
        missing = [v for v in VARIANTS if candidates(v) is None]
        if missing:
            from hrmlm.common import fail   # here, not at the top: --tables needs no torch
            fail(f"no settled 400-iteration learning rate yet for {', '.join(missing)}; run python experiments/sweep.py first")
        sweep.run_all(phase_a(), args.workers)
        sweep.run_all(phase_b(), args.workers)
        read_checkpoints(args.workers)
    tables()


if __name__ == "__main__":
    from hrmlm.signals import exit_on_signals   # Ctrl-C, SIGTERM, SIGHUP: one line in every phase
    exit_on_signals()
    main()
