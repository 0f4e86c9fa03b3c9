"""
EqualParam in miniature at the paper's headline settings (docs/RESULTS.md section 9): does HRM's lead over a
Transformer of equal stored parameters appear at NT = 8 and 12, where the paper's is largest, and does it depend on
M or on width? Post-norm, the character testbed, 2000 iterations of 8 x 128 characters; the arms are arms.ARMS.

    python experiments/equalparam.py             # the runs and checkpoint readings still missing, then the tables
    python experiments/equalparam.py --dry-run   # the train.py commands still to run (at this phase); run nothing
    python experiments/equalparam.py --tables    # tables only, from the committed logs (experiments/logs/equalparam/)

Phases: A. seed 1337 at 3 lrs a factor 2 apart around each arm's centre, grown until its best is bracketed; B. the best
with seeds 42 and 2024; C. the runner-up too where its seed-1337 CE is within one seed sd, the lower 3-seed mean then
chosen (until then the best, provisional); D. NT=12 with the paper's warmup rule (240) at its chosen lr. Each
finished HRM run is read (report.analysis), a chosen run whose reading is missing trained again for its checkpoint.
"""

import math
import os

import torch

import report
import runner
from arms import ARMS, CONTROL, EP_REACH, SEEDS, best_k, bracketed, by_seed, chosen_k, control_job, lr_of, lr_text
from arms import EP_ITERS as ITERS, arm_job as job, arm_tried as tried, runner_up, shown_k
from hrmlm import signals
from model import ModelConfig, build_model
from report import heading, mean_sd

MCHARS = 8 * 128 / 1e6             # millions of characters an iteration reads
# (row, column, what the difference asks); negative = row better. Rows and columns share seeds: paired tests.
COMPARISONS = [
    ("hrm-nt4", "tf-d128", "HRM NT=4 vs Transformer L=4 at d=128 (equal stored parameters)"),
    ("hrm-nt8", "tf-d128", "HRM NT=8 vs Transformer L=4 at d=128"),
    ("hrm-nt12", "tf-d128", "HRM NT=12 vs Transformer L=4 at d=128"),
    ("hrm-nt8-d256", "tf-d256", "HRM NT=8 vs Transformer L=4 at d=256"),
    ("hrm-nt8", "hrm-nt4", "HRM: M=8 vs M=4 (T=4 vs T=2)"),
    ("hrm-nt12", "hrm-nt8", "HRM: M=12 (N=4, T=3) vs M=8 (N=2, T=4)"),
    ("hrm-nt12", "hrm-nt4", "HRM: M=12 (N=4, T=3) vs M=4 (N=2, T=2)"),
    ("hrm-nt12-warm240", "hrm-nt12", "HRM NT=12: the paper's warmup rule (240 iterations) vs 10% (200)"),
    ("tf-d128", "tf-d64", "Transformer: d=128 vs d=64 (4x the parameters)"),
    ("tf-d256", "tf-d128", "Transformer: d=256 vs d=128 (4x the parameters)"),
    ("hrm-nt8-d256", "hrm-nt8", "HRM NT=8: d=256 vs d=128"),
    ("hrm-nt4", "tf-d64", "HRM NT=4 (1.0M) vs the Transformer at d=64 (0.27M)"),
    ("hrm-nt8", "tf-d64", "HRM NT=8 (1.0M) vs the Transformer at d=64 (0.27M)"),
    ("hrm-nt12", "tf-d64", "HRM NT=12 (1.0M) vs the Transformer at d=64 (0.27M)"),
]
# does the gap depend on width? ((row, column) at d=256) minus ((row, column) at d=128), paired by seed
GAP_CHANGES = [(("hrm-nt8-d256", "tf-d256"), ("hrm-nt8", "tf-d128"),
                "HRM NT=8's gap to the Transformer at d=256 minus its gap at d=128")]
FLAT = ("tf-d32", "tf-d64", "tf-d128", "tf-d256")      # the flat curve: CE against stored parameters, Transformer L=4
LOOPED = ("hrm-nt4", "hrm-nt8", "hrm-nt12", "hrm-nt8-d256")


def phase_a():
    """The three centre points of every arm, then one step outward where an arm's best is at an edge."""
    jobs = [job(a, k, SEEDS[0]) for k in (0, -1, 1) for a in ARMS]
    for a in ARMS:
        k = best_k(a)
        if k is not None and all(runner.finished(job(a, j, SEEDS[0])[0]) for j in (-1, 0, 1)):
            jobs += [job(a, j, SEEDS[0]) for j in (k - 1, k + 1) if abs(j) <= EP_REACH]
    return list(dict(jobs).items())


def phase_bc():
    """The best with seeds 42 and 2024, once bracketed; the runner-up too where it is close."""
    return [job(a, k, s) for a in ARMS if bracketed(a) for k in (best_k(a), runner_up(a)) if k is not None
            for s in SEEDS[1:]]


def phase_d():
    return [control_job(s) for s in SEEDS] if chosen_k(CONTROL[1]) is not None else []


def all_jobs():
    return phase_a() + phase_bc() + phase_d()


def label(name):
    return name if name not in ARMS or shown_k(name)[1] else f"{name} (provisional)"


def chosen_dirs(name):
    """The out_dirs of an arm's (or the control's) runs at its chosen lr, one per seed; [] before it has one."""
    if name == CONTROL[0]:
        return [d for d, _ in phase_d()]
    k = shown_k(name)[0]
    return [] if k is None else [job(name, k, s)[0] for s in SEEDS]


def read_finished(workers):
    """Read every finished HRM run whose checkpoint is here; rerun the chosen runs whose reading is missing."""
    report.read_finished(all_jobs(), "analysis.json", report.analysis)
    unread = [(d, c) for d, c in all_jobs() if "hrm" in d and runner.finished(d) and not runner.resume_state(d)
              and not os.path.exists(report.reading_path(d, "analysis.json"))]
    runner.rerun_and_read([(d, c) for d, c in unread if d in chosen_dirs(d.split(os.sep)[1])], workers, report.analysis)


# --- tables, from the committed logs alone --------------------------------------------------------

def size_cells(arm):
    f = next((runner.facts(d) for d, _ in all_jobs() if d.split(os.sep)[1] == arm and runner.facts(d)), None)
    if not f or "params" not in f:
        return "- | -"
    ms = f.get("ms_per_iter_median")
    return f"{f['params'] / 1e6:.2f}M | " + (f"{ms:.0f}" if ms else "-")


def lr_table():
    heading(f"Headline settings: validation CE after {ITERS} iterations, seed 1337, by learning rate (a factor 2 "
            "apart; * = the best)", "arm", "params", "ms/iter (1 thread)", "learning rate: CE", "chosen lr (3 seeds)")
    for a in ARMS:
        ks = tried(a)
        if not ks:
            continue
        b = best_k(a)
        cells = ", ".join(f"{lr_text(lr_of(a, k))}: {report.cell(job(a, k, SEEDS[0])[0])}{'*' if k == b else ''}"
                          for k in ks)
        c, final = shown_k(a)
        chosen = "-" if c is None else lr_text(lr_of(a, c)) + ("" if final else " (provisional)")
        print(f"| {a} | {size_cells(a)} | {cells} | {chosen} |")
    print()


def seeds_table(table, uni):
    heading(f"Headline settings: each arm at its chosen lr, 3 seeds, after {ITERS} iterations ({ITERS * MCHARS:.2f}M "
            "characters)", "arm", *[f"seed {s}" for s in SEEDS], "mean ± sd", "below unigram")
    for name, vals in [(name, vals) for name, vals in table.items() if vals]:
        m, sd, n = mean_sd(list(vals.values()))
        print(f"| {label(name)} | " + " | ".join(report.fmt(vals[s]) if s in vals else "-" for s in SEEDS) +
              f" | {m:.3f} ± {sd:.3f} (n={n}) | {uni - m:.3f} |")
    print()


def differences(table):
    heading("Headline settings: differences (row minus column; negative = row better; paired by seed, with Welch's "
            "test beside it; 95% intervals)", "row", "column", "question", "paired: diff [95% CI], p",
            "Welch: diff [95% CI], p", "verdict")
    for a, b, what in COMPARISONS:
        if a in table and b in table:
            p = report.paired(table[a], table[b])
            w = report.welch(list(table[a].values()), list(table[b].values()))
            print(f"| {label(a)} | {label(b)} | {what} | {p or '-'} | {w or '-'} | {report.verdict(p or w)} |")
    for (a, b), (c, d), what in GAP_CHANGES:   # {seed: (a - b) - (c - d)} against 0, a paired test
        if all(x in table for x in (a, b, c, d)):
            seeds = set(table[a]) & set(table[b]) & set(table[c]) & set(table[d])
            change = {s: (table[a][s] - table[b][s]) - (table[c][s] - table[d][s]) for s in seeds}
            p = report.paired(change, {s: 0.0 for s in seeds})
            print(f"| {a} - {b} | {c} - {d} | {what} | {p or '-'} | - | {report.verdict(p)} |")
    print()


# --- P_flat: the flat size each HRM matches (2604.21106's phi read off it; its magnitudes are withdrawn) ---

def param_split(arm):
    """(N_once, [(r, N_rec), ...]) of an HRM arm, counted on the model its runs built (meta device): the Fast
    module (L_net) runs r = M times per pass, the Slow module (H_net) r = N times, everything else once."""
    f = next(runner.facts(d) for d, _ in all_jobs() if d.split(os.sep)[1] == arm and runner.facts(d))
    with torch.device("meta"):
        m = build_model(ModelConfig(**f["model_args"]))
    count = lambda prefix: sum(p.numel() for n, p in m.named_parameters() if n.startswith(prefix))  # noqa: E731
    rec = [(m.config.M, count("L_net.")), (m.config.N, count("H_net."))]
    return m.num_params() - sum(n for _, n in rec), rec


def flat_ln_params(ce, curve):
    """ln P at which the flat curve [(ln P, CE), ...] (ascending P) reaches ce: linear in ln P within the
    segment that brackets ce; beyond the curve's ends, its end segment extended (an extrapolation)."""
    segs = list(zip(curve, curve[1:]))
    seg = next(((p, q) for p, q in segs if min(p[1], q[1]) <= ce <= max(p[1], q[1])),
               segs[0] if ce > max(y for _, y in curve) else segs[-1])
    (x0, y0), (x1, y1) = seg
    return x0 + (ce - y0) * (x1 - x0) / (y1 - y0) if y1 != y0 else math.nan


def flat_size_table(table):
    """Per seed, the flat curve through the Transformer widths and the stored parameters at which it reaches each HRM
    arm's CE (P_flat), with the t interval of the seeds' mean ln P_flat (phi: withdrawn, docs/RESULTS.md section 9)."""
    if not all(a in table for a in FLAT):
        return
    size = {a: runner.facts(chosen_dirs(a)[0])["params"] for a in FLAT}
    heading("Headline settings: the flat size each HRM matches (P_flat), at equal tokens", "arm",
            "params: once + Fast x M + Slow x N", "P_flat [95% CI]", "P_flat / P", "extrapolated", "seeds",
            note="P_flat: the stored parameters at which the Transformer L=4 (d=32 to 256, one curve per seed, linear "
            "in ln P between widths, its end segments extended beyond them) reaches the arm's CE. Extrapolated: the "
            "seeds whose CE lies outside the curve's measured range (above d=32's or below d=256's), where P_flat is "
            "the end segment's extension. Interval: the t interval of the seeds' mean ln P_flat. Once: the stored "
            "parameters HRM runs once (embedding, input block, fusion).\n")
    for arm in [a for a in LOOPED if a in table]:
        seeds = [s for s in SEEDS if s in table[arm] and all(s in table[a] for a in FLAT)]
        curves = {s: [(math.log(size[a]), table[a][s]) for a in FLAT] for s in seeds}
        lnp = {s: flat_ln_params(table[arm][s], curves[s]) for s in seeds}
        ci = report.paired(lnp, {s: 0.0 for s in seeds})     # the t interval of mean ln P_flat, as gap_changes'
        if ci is None:                                        # under 2 seeds (with a finite P_flat)
            continue
        above = [s for s in seeds if table[arm][s] > max(y for _, y in curves[s])]   # worse than d=32: P_flat below it
        below = [s for s in seeds if table[arm][s] < min(y for _, y in curves[s])]   # better than d=256: above it
        once, rec = param_split(arm)
        total, M = once + sum(n for _, n in rec), rec[0][0]
        p = [math.exp(x) / 1e6 for x in (ci.diff, ci.lo, ci.hi)]
        where = ", ".join([f"{len(above)} of {len(seeds)} below d=32"] * bool(above) +
                          [f"{len(below)} of {len(seeds)} above d=256"] * bool(below)) or "none"
        print(f"| {label(arm)} | {once / 1e6:.2f}M + {rec[0][1] / 1e6:.2f}M x {M} + {rec[1][1] / 1e6:.2f}M x "
              f"{rec[1][0]} | {p[0]:.3f}M [{p[1]:.3f}M, {p[2]:.3f}M] | {math.exp(ci.diff) / total:.3f} | {where} | "
              f"{len(seeds)} |")
    print()


def draw(table):
    """docs/equalparam.png: each arm's validation curve (3-seed mean, band min-max), and the final CE against
    stored parameters, the flat curve beside the HRM arms."""
    fig, (ax, bx) = report.figure(2)
    for i, arm in enumerate(ARMS):
        its, vals = report.seed_curve([runner.run_log(d) for d in chosen_dirs(arm)], skip={0})
        report.band(ax, [it * MCHARS for it in its], vals, color=f"C{i}", linestyle="-" if "hrm" in arm else "--",
                    label=f"{label(arm)} (lr {lr_text(lr_of(arm, shown_k(arm)[0]))})")
    ax.set_ylim(top=2.6)
    report.dress(ax, "characters seen (millions)", "validation CE",
                 f"Headline settings, {ITERS} iterations (3-seed mean, band: seed min-max)")
    size = {a: runner.facts(chosen_dirs(a)[0])["params"] / 1e6 for a in ARMS}
    for group, st in ((FLAT, dict(color="C1", marker="s", linestyle="--", label="Transformer L=4, d=32 to 256")),
                      (LOOPED[:3], dict(color="C0", marker="o", linestyle="", label="HRM NT=4, 8, 12 at d=128")),
                      (LOOPED[3:], dict(color="C3", marker="o", linestyle="", label="HRM NT=8 at d=256"))):
        means = [mean_sd(list(table[a].values())) for a in group]
        bx.errorbar([size[a] for a in group], [m for m, _, _ in means], yerr=[sd for _, sd, _ in means],
                    capsize=3, **st)
    for a in LOOPED[:3]:
        bx.annotate(a.split("-")[1].upper(), (size[a], mean_sd(list(table[a].values()))[0]), fontsize=7,
                    xytext=(4, 0), textcoords="offset points")
    bx.set_xscale("log")
    report.dress(bx, "stored parameters (millions, log scale)", f"validation CE after {ITERS} iterations (± sd)",
                 "The flat curve and where HRM sits on it")
    report.finish(fig, (ax, bx), "equalparam.png")


def tables():
    uni = report.unigrams()["char"]
    lr_table()
    table = {n: by_seed(chosen_dirs(n)) for n in [*ARMS, CONTROL[0]] if chosen_dirs(n)}   # {row: {seed: CE}}
    if table:
        seeds_table(table, uni)
        differences(table)
        flat_size_table(table)
        report.slow_table("Headline settings: HRM's checkpoint readings at the chosen lr (mean ± sd over the seeds "
                          "read)", "arm", ((label(n), chosen_dirs(n)) for n in (*LOOPED, CONTROL[0])), cost=True)
        report.depth_table("Headline settings: depth at inference (val CE at multiples of the trained depth; N' Slow "
                           "firings with T kept, or T' Fast steps per firing with N kept)", ("arm",),
                           ((label(n), chosen_dirs(n)) for n in LOOPED))
    done = [d for d, _ in all_jobs() if runner.finished(d)]
    print(f"{len(done)} runs committed ({report.hours(done):.1f} hours of training in all, one core each; their logs' "
          f"time_s); {len(all_jobs()) - len(done)} known still to run at this phase\n")
    missing = [a for a in ARMS if len(table.get(a, {})) < len(SEEDS)]   # a provisional arm is drawn, so labelled
    if (done or not missing) and report.drawable("equalparam.png", missing, "no 3 committed seeds at a chosen (or "
                                                 "provisional) lr for"):
        draw(table)


def main():
    def run(workers):   # phase by phase until every phase is through, each round's finished HRM runs read
        runner.run_until_done(lambda: [(d, c) for d, c in all_jobs() if not runner.finished(d)], workers,
                              lambda: read_finished(workers))
        read_finished(workers)
    runner.runner_main(__doc__, all_jobs, run, tables, [("shakespeare_char", "--dataset=shakespeare_char")])


if __name__ == "__main__":
    signals.main(main)
