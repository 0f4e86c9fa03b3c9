"""
Does the gap close? (docs/RESULTS.md section 11.) Section 10's alive HRM lost to its Transformer after 2000 iterations
of the character testbed, by a gap still narrowing. Here: the BPE testbed in the paper's regime (post-norm, under one
token per parameter) at two budgets, each with its own schedule and lrs; the character pair trained 4x longer; and
section 10's loose ends: the lr bracket, and alpha at the paper's lr.

    python experiments/crossover.py              # the runs and readings still missing, then the tables and figure
    python experiments/crossover.py --dry-run    # the train.py commands still to run (at this phase); run nothing
    python experiments/crossover.py --tables     # tables and figure only, from the committed logs (logs/crossover/)

Phases, in run order, each finishing a comparison: bracket, alive.py's NT=8 and NT=12 choice (lr 2.5e-3, remedy
"paper") at 3.5e-3, seed 7, between it and the collapsed 5e-3. bpe400: HRM NT=8 (config/shakespeare_hrm.py, T=4)
and the Transformer L=4 (equal stored parameters) for 400 iterations: selection on seed 7 over lr 1e-3 x 2^k from
k = -1, 0, 1, grown at an edge (HRM: alive runs only), the best two at seed 8 too, the lower 2-seed mean chosen,
then the test seeds. paper_lr: the character HRM NT=8 at the paper's 1.5e-4 and warmup (max(1000, 100 N T)) for its
10k iterations, seed 7. char8000: section 10's choices (HRM NT=8 at 2.5e-3, tf-d128 at 3e-3), test seeds, 8000
iterations. bpe4000: bpe400 at 4000 iterations. Every HRM run is read (alive.json) from its last checkpoint.
"""

import math
import os
import sys
from functools import partial

import numpy as np
from scipy import stats

import report
import runner
from arms import ARMS, SEEDS, lr_text
from hrmlm import signals
from report import ALIVE, ALIVE_COLS, alive_reading, header, heading

OUT = "out-crossover"
SELECT = (7, 8)   # selection seeds: never in a test
BPE = {"hrm": ("shakespeare_hrm", ["--T=4"]), "tf": ("shakespeare_transformer", [])}
START, REACH, CENTRE = (-1, 0, 1), 3, 1e-3
CHAR = {"hrm": ("hrm-nt8", 2.5e-3), "tf": ("tf-d128", 3e-3)}   # section 10's choices (docs/RESULTS.md)
BPE_TOKENS, CHAR_TOKENS = 8 * 64, 8 * 128    # tokens an iteration reads
AT = {400: [100, 200, 300, 400], 4000: [400, 1000, 2000, 4000], 8000: [2000, 4000, 6000, 8000]}
# the paper's EqualParam curves (its figure "equalparam"): HRM NT=8 (1229M) and T L=4 (1280M), 6 x 12 x 1024 tokens
PAPER_TOKENS, PAPER_PARAMS = 6 * 12 * 1024, 1.229e9
PAPER_GAP = {500: 5.966 - 6.145, 1000: 5.427 - 5.694, 2000: 5.000 - 5.283, 4000: 4.627 - 4.938, 6000: 4.351 - 4.715,
             8000: 4.262 - 4.563, 10000: 4.239 - 4.562}


def job(group, name, cfg, over, lr, seed, iters, warmup=None, every=100):
    d = os.path.join(OUT, group, name, f"lr{lr_text(lr)}-s{seed}")
    return d, [sys.executable, "train.py", f"config/{cfg}.py", *over, f"--learning_rate={lr:.6g}",
               f"--max_iters={iters}", f"--lr_decay_iters={iters}", f"--warmup_iters={warmup or iters // 10}",
               f"--min_lr={lr / 10:.6g}", f"--seed={seed}", f"--out_dir={d}", "--log_interval=100",
               f"--eval_interval={every}"]


def bpe_job(arch, k, seed, iters):
    return job(f"bpe{iters}", arch, *BPE[arch], CENTRE * 2.0 ** k, seed, iters)


def bracket_jobs():
    return [job("bracket", f"{arm}-paper", *ARMS[arm][:2], 3.5e-3, SELECT[0], 2000) for arm in ("hrm-nt8", "hrm-nt12")]


def paper_lr_job():
    return job("paper_lr", "hrm-nt8", *ARMS["hrm-nt8"][:2], 1.5e-4, SELECT[0], 10000, warmup=1000, every=500)


def char_jobs(arch):
    arm, lr = CHAR[arch]
    return [job("char8000", arm, *ARMS[arm][:2], lr, s, 8000, every=200) for s in SEEDS]


def val(arch, k, seed, iters):
    return runner.final_val(bpe_job(arch, k, seed, iters)[0])


def tried(arch, iters):
    return [k for k in range(-REACH, REACH + 1) if runner.finished(bpe_job(arch, k, SELECT[0], iters)[0])]


def select(arch, iters):
    """(the selection's jobs at this phase, the chosen k or None): the start grid; one step out where the best alive
    seed-7 run is at an edge of what was tried (below the lowest where none is alive); the best two at seed 8."""
    ks, start = tried(arch, iters), [bpe_job(arch, k, SELECT[0], iters) for k in START]
    live = {k: arch == "tf" or (r := alive_reading(bpe_job(arch, k, SELECT[0], iters)[0])) and r["off_both"] >= ALIVE
            for k in ks}
    if not set(START) <= set(ks) or None in live.values():
        return start, None   # the start not through, or a run not read yet
    ok = sorted((k for k in ks if live[k]), key=lambda k: val(arch, k, SELECT[0], iters))
    grow = [j for j in ([ok[0] - 1, ok[0] + 1] if ok else [min(ks) - 1]) if j not in ks and abs(j) <= REACH]
    if grow or not ok:
        return start + [bpe_job(arch, j, SELECT[0], iters) for j in grow], None
    second = [bpe_job(arch, k, SELECT[1], iters) for k in ok[:2]]
    if not all(runner.finished(d) for d, _ in second):
        return start + second, None
    return start + second, min(ok[:2], key=lambda k: sum(val(arch, k, s, iters) for s in SELECT))


def test_jobs(iters):
    chosen = {a: select(a, iters)[1] for a in BPE}
    return [bpe_job(a, k, s, iters) for a, k in chosen.items() if k is not None for s in SEEDS]


def groups():
    return [bracket_jobs(), *[select(a, 400)[0] for a in BPE], test_jobs(400), [paper_lr_job()],
            char_jobs("hrm") + char_jobs("tf"), *[select(a, 4000)[0] for a in BPE], test_jobs(4000)]


def all_jobs():
    return list(dict(j for g in groups() for j in g).items())


# --- tables and figure, from the committed logs and readings alone ------------------------------------------------

def cells(d, read=alive_reading):
    """report.alive_cells of one run (a Transformer has none)."""
    return report.alive_cells([d], read) if "hrm" in d else "- | - | -"


def bracket_table():
    rows = [(d, arm) for (d, _), arm in zip(bracket_jobs(), ("hrm-nt8", "hrm-nt12")) if runner.finished(d)]
    stored = partial(report.reading, name="alive.json")   # alive.py's runs: read there, with its readings
    if rows:
        heading(f"The alive lr bracketed: HRM at 3.5e-3 beside section 10's 2.5e-3 and 5e-3, seed {SELECT[0]}, 2000 "
                "iterations", "arm", "lr", "val CE", *ALIVE_COLS)
        for d, arm in rows:
            for lr, run in ((2.5e-3, None), (3.5e-3, d), (5e-3, None)):
                run = run or os.path.join("out-alive", f"{arm}-paper", f"lr{lr_text(lr)}-s{SELECT[0]}")
                read = alive_reading if run == d else stored
                print(f"| {arm} | {lr_text(lr)} | {report.cell(run)} | {cells(run, read)} |")
        print()


def bpe_tables(iters):
    ks = {a: tried(a, iters) for a in BPE}
    if not any(ks.values()):
        return
    heading(f"BPE crossover, {iters} iterations: selection on seeds {SELECT[0]} and {SELECT[1]} (* = chosen)", "arch",
            "lr", f"val CE, seed {SELECT[0]}", f"seed {SELECT[1]}", *ALIVE_COLS)
    for a in BPE:
        for k in ks[a]:
            d, d8 = bpe_job(a, k, SELECT[0], iters)[0], bpe_job(a, k, SELECT[1], iters)[0]
            star = "*" if select(a, iters)[1] == k else ""
            print(f"| {a} | {lr_text(CENTRE * 2.0 ** k)}{star} | {report.cell(d)} | {report.cell(d8)} | {cells(d)} |")
    print()
    tests = {a: [d for d, _ in test_jobs(iters) if f"/{a}/" in d] for a in BPE}
    if all(runner.finished(d) for ds in tests.values() for d in ds) and all(tests.values()):
        gap_table(f"BPE crossover, {iters} iterations", tests["hrm"], tests["tf"], AT[iters], BPE_TOKENS)
        lo, hi = crossing(tests["hrm"], tests["tf"])
        print("Where the gap changes sign (every evaluation, 95% intervals): " + (
            "the data cannot tell (no evaluation has HRM ahead and a later one behind)" if lo is None or hi is None
            else f"HRM ahead through iteration {lo}, behind from {hi}: the crossing lies in ({lo}, {hi}]") + "\n")


def gap_table(title, hrm, tf, its, tokens):
    """Each arm's test runs (final CE, readings), then the paired gap HRM minus Transformer along the curves."""
    params = runner.facts(hrm[0])["params"] if runner.finished(hrm[0]) else None
    heading(f"{title}: the test seeds, HRM minus Transformer (paired by seed; 95% intervals)", "iteration",
            "tokens per parameter", "gap [95% CI], p", "verdict")
    for i, d in report.gaps(hrm, tf, its).items():
        per = f"{i * tokens / params:.3f}" if params else "-"
        print(f"| {i} | {per} | {d or '-'} | {report.verdict(d)} |")
    print()
    print("HRM runs: " + "; ".join(f"seed {runner.seed_of(d)}: {cells(d)}" for d in hrm if runner.finished(d))
          + f" ({', '.join(ALIVE_COLS)})\n")


def crossing(hrm, tf):
    """Where the gap changes sign: (the last iteration whose interval is below 0, the first after it above 0)."""
    its = sorted(set.intersection(*map(set, report.curves(hrm).values())))
    g = {i: d for i, d in report.gaps(hrm, tf, its).items() if d}
    ahead = [i for i, d in g.items() if d.hi < 0]
    behind = [i for i, d in g.items() if d.lo > 0 and (not ahead or i > ahead[-1])]
    return (ahead[-1] if ahead else None), (behind[0] if behind else None)


def trend(hrm, tf, start=1000):
    """Per seed, gap(t) = a + b ln t fitted from `start` on; where each fit crosses 0 (b < 0 and the gap > 0)."""
    a, b = report.curves(hrm), report.curves(tf)
    out = {}
    for s in sorted(set(a) & set(b)):
        its = sorted(i for i in a[s] if i >= start and i in b[s])
        slope, icpt = np.polyfit(np.log(its), [a[s][i] - b[s][i] for i in its], 1)
        out[s] = (icpt, slope, math.exp(-icpt / slope) if slope < 0 < icpt + slope * math.log(its[-1]) else None)
    return out


def tables():
    bracket_table()
    for iters in (400, 4000):
        bpe_tables(iters)
    if all(runner.finished(d) for d, _ in char_jobs("hrm") + char_jobs("tf")):
        hrm, tf = [d for d, _ in char_jobs("hrm")], [d for d, _ in char_jobs("tf")]
        gap_table("Character testbed, 8000 iterations", hrm, tf, AT[8000], CHAR_TOKENS)
        fits = trend(hrm, tf)
        header("seed", "fit gap = a + b ln t (t >= 1000)", "gap at 8000 (fit)", "crosses 0 at")
        for s, (a, b, t0) in fits.items():
            print(f"| {s} | {a:+.3f} {b:+.4f} ln t | {a + b * math.log(8000):+.3f} | "
                  f"{f'{t0:,.0f}' if t0 else 'never (not narrowing)' if b >= 0 else 'already below 0'} |")
        t0s = [math.log(t0) for _, _, t0 in fits.values() if t0]
        if len(t0s) == len(fits) > 1:   # a t-interval on ln t0 over the seeds
            m, sd, n = report.mean_sd(t0s)
            h = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
            print(f"| all | - | - | {math.exp(m):,.0f} [{math.exp(m - h):,.0f}, {math.exp(m + h):,.0f}] |")
        print()
    d = paper_lr_job()[0]
    if runner.finished(d):
        log = {r["iter"]: r for r in runner.run_log(d)}
        heading("alpha at the paper's lr: character HRM NT=8, lr 1.5e-4, warmup 1000, 10000 iterations, seed 7",
                "iteration", "val CE", "alpha_L", "alpha_H")
        for i in (0, 1000, 2000, 5000, 10000):
            print(f"| {i} | {log[i]['val_loss']:.3f} | {log[i]['alpha_L']:.4f} | {log[i]['alpha_H']:.4f} |")
        print(f"\nReading at 10000: {cells(d)} ({', '.join(ALIVE_COLS)})\n")
    draw()


def draw():
    series = [("BPE, 4000 iterations", [d for d, _ in test_jobs(4000)], BPE_TOKENS, "C0"),
              ("BPE, 400 iterations", [d for d, _ in test_jobs(400)], BPE_TOKENS, "C1"),
              ("characters, 8000 iterations", [d for d, _ in char_jobs("hrm") + char_jobs("tf")], CHAR_TOKENS, "C2")]
    series = [(n, ds, t, c) for n, ds, t, c in series   # both arms' test runs, every one finished
              if {"hrm" in d for d in ds} == {True, False} and all(runner.finished(d) for d in ds)]
    if not series:
        return
    fig, axes = report.figure(2)
    for name, dirs, tokens, color in series:
        hrm, tf = [d for d in dirs if "hrm" in d], [d for d in dirs if "hrm" not in d]
        a, b = report.curves(hrm), report.curves(tf)
        its = sorted(set.intersection(*[set(c) for c in [*a.values(), *b.values()]]) - {0})
        ys = [[a[s][i] - b[s][i] for s in sorted(a)] for i in its]
        per = tokens / runner.facts(hrm[0])["params"]
        for ax, x in zip(axes, (its, [i * per for i in its])):
            report.band(ax, x, ys, color=color, label=name)
    for ax, x in zip(axes, (list(PAPER_GAP), [i * PAPER_TOKENS / PAPER_PARAMS for i in PAPER_GAP])):
        ax.plot(x, list(PAPER_GAP.values()), "k*", label="the paper (OpenWebText, 1.2B)")
        ax.axhline(0, color="0.4", linewidth=1)
        ax.set_xscale("log")
    report.dress(axes[0], "iteration", "val CE, HRM minus Transformer", "The gap along training (seed band)")
    report.dress(axes[1], "tokens per parameter", "val CE, HRM minus Transformer", "The paper's axis")
    report.finish(fig, axes, "crossover.png")


def main():   # phase by phase, each round's finished HRM runs read (the selection reads them)
    runner.runner_main(__doc__, all_jobs, report.phased(groups, all_jobs, "alive.json", alive_reading), tables,
                       [("shakespeare_char", "--dataset=shakespeare_char"), ("shakespeare", "")])


if __name__ == "__main__":
    signals.main(main)
