"""
The long run (docs/RESULTS.md section 6): does the character testbed's ordering hold with 10x the training? sweep.py's
runs stop at 400 iterations with their curves still falling; these run 4000 iterations of the same 8 x 128 batches
for six variants (VARIANTS), the sweep's schedule scaled (400 warmup iterations, an evaluation every 200).

    python experiments/long_run.py              # the runs and readings still missing, then the tables
    python experiments/long_run.py --dry-run    # list the train.py commands still to run; run nothing
    python experiments/long_run.py --tables     # tables and plot only, from the committed logs (experiments/logs/long/)

Phase A: each variant at its best 400-iteration lr and one grid step lower, seed 1337. Phase B: the better of the two
with seeds 42 and 2024. READ's chosen runs are read as section 5's (report.analysis), trained again for the checkpoint.
"""

import os

from matplotlib.ticker import NullFormatter, ScalarFormatter

import arms
import report
import runner
from arms import LONG_ITERS as ITERS, SEEDS, candidates, lr_text
from arms import long_chosen as chosen, long_job as job
from hrmlm import signals
from hrmlm.common import UserError
from report import heading, mean_sd

VARIANTS = ["hrm-post", "hrm-pre", "transformer-post", "transformer-pre", "unitf-post", "unitf_full-post"]
GAPS = [("hrm-post", "transformer-post"), ("hrm-pre", "transformer-pre"), ("hrm-post", "unitf-post"),
        ("hrm-pre", "hrm-post"), ("unitf-post", "transformer-post"), ("unitf_full-post", "unitf-post")]
MCHARS = 8 * 128 / 1e6             # millions of characters an iteration reads (batch 8 x 128)
REACH = [("transformer-post", "hrm-post"), ("unitf-post", "hrm-post"), ("unitf_full-post", "hrm-post"),
         ("transformer-pre", "hrm-pre")]   # (baseline, HRM): when does the baseline reach HRM's final CE?
READ = ["hrm-post", "unitf-post"]   # checkpoint readings (depth at inference, the Slow module) after 10x training
AT = [400, 1000, 2000, 3000, 4000]   # iterations the gap table reads the curves at


def phase_a():
    """Best lr for every variant first, then the lower one: each variant gets a long curve early."""
    return [job(v, lrs[k], SEEDS[0]) for k in (0, 1) for v in VARIANTS if (lrs := candidates(v))]


def phase_b():
    return [job(v, chosen(v), s) for s in SEEDS[1:] for v in VARIANTS if chosen(v) is not None]


def chosen_runs(v):
    """The out_dirs of the variant's finished runs at its chosen lr, one per seed."""
    lr = chosen(v)
    return [d for d in (job(v, lr, s)[0] for s in SEEDS) if runner.finished(d)] if lr else []


def curve(v):
    """{iteration: [val CE of each finished seed]} at the chosen lr."""
    c = report.curves(chosen_runs(v)).values()
    return {it: [x[it] for x in c if it in x] for it in sorted(set().union(*c))}


def reading_jobs():
    """The READ variants' finished chosen runs whose checkpoint readings are not committed yet: trained again."""
    return [(d, cmd) for v in READ if chosen(v) for d, cmd in (job(v, chosen(v), s) for s in SEEDS)
            if runner.finished(d) and not os.path.exists(report.reading_path(d, "analysis.json"))]


def mean_curve(v):
    """{iteration: seed-mean val CE}, at iterations every finished seed has evaluated."""
    c = curve(v)
    n = max((len(x) for x in c.values()), default=0)
    return {it: sum(x) / n for it, x in sorted(c.items()) if len(x) == n}


def reach_table():
    """How much training each baseline needs to match HRM's final CE: the first evaluation where its seed mean is at
    or below HRM's, in characters and in counted training FLOPs."""
    heading(f"Long run: how soon each baseline matches HRM's CE after {ITERS} iterations (seed means; first "
            f"evaluation, every {ITERS // 20} iterations, at or below it)", "baseline", "HRM",
            f"HRM's CE at {ITERS} it", "baseline reaches it at iter", "characters", "training FLOPs, baseline / HRM")
    for b, h in REACH:
        cb, ch = mean_curve(b), mean_curve(h)
        if ITERS not in ch or not cb:
            continue
        it = next((i for i, ce in cb.items() if ce <= ch[ITERS]), None)
        fb, fh = arms.size_of("char", b)[1], arms.size_of("char", h)[1]
        cells = ["not reached", "-", "-"] if it is None else [
            str(it), f"{it * MCHARS:.2f}M ({it / ITERS:.0%} of HRM's)", f"{it * fb / (ITERS * fh):.2f}x"]
        print(f"| {b} | {h} | {ch[ITERS]:.3f} | " + " | ".join(cells) + " |")
    print()


def tables():
    uni = report.unigrams()["char"]
    heading(f"Long run: validation CE after {ITERS} iterations ({ITERS * MCHARS:.1f}M characters, 10x the sweep), "
            "seed 1337, at the best 400-iteration lr and one grid step lower", "variant", "params", "MFLOPs/token",
            "best lr at 400 it", "CE", "one step lower", "CE", "chosen")
    for v in VARIANTS:
        lrs = candidates(v)
        if not lrs:
            continue
        cells = " | ".join(f"{lr_text(lr)} | {report.cell(job(v, lr, SEEDS[0])[0])}" for lr in lrs)
        c = chosen(v)
        print(f"| {v} | {arms.size_cells('char', v)} | {cells} | {lr_text(c) if c else '-'} |")
    print()
    heading(f"Long run: each variant at its chosen lr, 3 seeds, after {ITERS} iterations", "variant", "lr",
            *[f"seed {s}" for s in SEEDS], "mean ± sd", "at 400 iterations, its best lr there (sweep)", "below unigram")
    for v in VARIANTS:
        lr = chosen(v)
        if lr is None:
            continue
        dirs = [job(v, lr, s)[0] for s in SEEDS]
        m, sd, n = mean_sd([runner.final_val(d) for d in dirs if runner.finished(d)])
        short = mean_sd([runner.final_val(d) for d in arms.best_runs("char", v)])
        print(f"| {v} | {lr_text(lr)} | " + " | ".join(report.cell(d) for d in dirs) +
              f" | {m:.3f} ± {sd:.3f} (n={n}) | {short[0]:.3f} ± {short[1]:.3f} (n={short[2]}) | {uni - m:.3f} |")
    print()
    done = [d for d, _ in phase_a() + phase_b() if runner.finished(d)]
    print(f"{len(done)} runs committed, {report.hours(done):.1f} hours of training in all (one core each; their logs' "
          "time_s)\n")
    heading("Long run: differences along the curves (row minus column, paired by seed: mean, 95% interval, p; "
            "negative = row better)", "row", "column", *[f"iter {it} ({it * MCHARS:.2f}M chars)" for it in AT])
    for a, b in GAPS:
        diffs = report.gaps(chosen_runs(a), chosen_runs(b), AT).values()
        print(f"| {a} | {b} | " + " | ".join(str(d or "-") for d in diffs) + " |")
    print()
    reach_table()
    report.depth_table(f"Long run: depth at inference after 400 and {ITERS} iterations (val CE, mean ± sd over the "
                       "seeds read; HRM: N' Slow firings with T kept, or T' Fast steps per firing with N kept; UniTF: "
                       "M' steps)", ("variant", "iterations"),
                       ((f"{v} | {its} (n={sum(1 for d in runs if report.analysis(d))})", runs) for v in READ
                        for its, runs in ((400, arms.best_runs("char", v)), (ITERS, chosen_runs(v)))))
    report.slow_table(f"Long run: the Slow-module reading of post-norm HRM after 400 and {ITERS} iterations (mean ± "
                      "sd over the seeds read; 64 validation sequences of 128 characters)", "iterations",
                      ((400, arms.best_runs("char", "hrm-post")), (ITERS, chosen_runs("hrm-post"))))
    if any(report.analysis(d) for d in chosen_runs("hrm-post")):
        report.slow_seed_table(f"Long run: the Slow-module reading, seed by seed: post-norm HRM after {ITERS} "
                               "iterations", chosen_runs("hrm-post"))
    if report.drawable("long_run.png", [v for v in VARIANTS if not curve(v)], "no committed run at the chosen lr of"):
        draw(uni)


def draw(uni):
    colors = {"hrm": "C0", "transformer": "C1", "unitf": "C2", "unitf_full": "C3"}
    fig, (ax, bx) = report.figure(2)
    for v in VARIANTS:
        arch, norm = v.rsplit("-", 1)
        c = curve(v)
        its = sorted(c)
        report.band(ax, [i * MCHARS for i in its], [c[i] for i in its], color=colors[arch], linestyle="-" if norm ==
                    "post" else "--", label=f"{v} (lr {lr_text(chosen(v))}, {len(c[its[-1]])} seeds)")
    report.unigram_line(ax, uni)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_yticks([1.5, 2, 2.5, 3, 4, 5])
    report.dress(ax, "characters seen (millions)", "validation CE (log scale)",
                 f"Character testbed, {ITERS} iterations (band: seed min-max)")
    for k, (a, b) in enumerate(GAPS[:3]):
        its = sorted(set(curve(a)) & set(curve(b)) - {0})   # iteration 0 is the untrained models' init CE
        # (a minus b, its standard error) of the seed means at each iteration, or None
        pts = [(i * MCHARS, report.difference({v: mean_sd(curve(v).get(i, [])) for v in (a, b)}, a, b)) for i in its]
        pts = [(t, d) for t, d in pts if d]
        if pts:
            t, d = zip(*pts)
            bx.plot(t, [x[0] for x in d], color=f"C{k}", label=f"{a} minus {b}")
            bx.fill_between(t, [x[0] - 2 * x[1] for x in d], [x[0] + 2 * x[1] for x in d], color=f"C{k}", alpha=0.15)
    bx.axhline(0, color="0.4", linewidth=1)
    report.dress(bx, "characters seen (millions)", "difference in validation CE (band: ± 2 se)",
                 "HRM minus each baseline, 3-seed means")
    report.finish(fig, (ax, bx), "long_run.png")


def main():
    def run(workers):
        missing = [v for v in VARIANTS if candidates(v) is None]
        if missing:
            raise UserError(f"no settled 400-iteration learning rate yet for {', '.join(missing)}; run python "
                            "experiments/sweep.py first")
        runner.run_all(phase_a(), workers)
        runner.run_all(phase_b(), workers)
        runner.rerun_and_read(reading_jobs(), workers, report.analysis)
    runner.runner_main(__doc__, lambda: phase_a() + phase_b(), run, tables,
                       [("shakespeare_char", "--dataset=shakespeare_char")], reading_jobs,
                       "print the tables and draw the plot only")


if __name__ == "__main__":
    signals.main(main)
