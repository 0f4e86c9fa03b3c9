"""
EqualParam in miniature at the paper's headline settings (docs/RESULTS.md, "Headline settings"): does HRM's
lead over a Transformer of equal stored parameters appear at NT = 8 and 12, where the paper's is largest, and
does it depend on M or on width? Post-norm, the character testbed, 2000 iterations of 8 x 128 characters.

    python experiments/equalparam.py                # the runs still missing (two at a time, one thread each), the
                                             # checkpoint readings still missing, then the tables
    python experiments/equalparam.py --workers=1    # one at a time; a second copy started later shares the work
                                             # (runners claim runs with a lock), so a free core joins in
    python experiments/equalparam.py --dry-run      # the train.py commands still to run (at this phase); run nothing
    python experiments/equalparam.py --tables       # tables only, from the committed logs (experiments/logs/equalparam/)

Arms (K = 2 and clip grad_clip * K / M throughout, train.py's defaults for HRM):
  d=128 (about 1.0M parameters): Transformer L=4; HRM NT=4 (N=2, T=2), NT=8 (N=2, T=4), NT=12 (N=4, T=3).
  d=256 (about 4M): Transformer L=4; HRM NT=8.  d=64 (about 0.27M) and d=32 (about 0.07M): Transformer L=4,
  the flat curve's lower points. Heads are 32 wide at every width. Every run: warmup 10% (200 iterations),
  cosine to lr/10, an evaluation every 100 iterations.
Phases:
  A. seed 1337 at 3 learning rates a factor 2 apart, centred on the committed 400-iteration best (experiments/sweep.py;
     half of it at d=256), grown a factor 2 at a time until each arm's best is bracketed;
  B. the best with seeds 42 and 2024 (paired by seed across arms);
  C. the runner-up with seeds 42 and 2024 where its seed-1337 CE is within one seed sd of the best's;
     the chosen lr is then the lower 3-seed mean (until then the tables show the best, marked provisional);
  D. a control for NT=12: the paper's HRM warmup rule, max(1000, N*T*100) of 10000 iterations, scaled to 2000
     (240 iterations), at NT=12's chosen lr, 3 seeds.
Readings (no training): the H-frozen cost and depth at inference (experiments/sweep.py's analysis) are read from
each finished HRM run's last checkpoint and committed beside its log. Checkpoints are not committed: where a
chosen run's reading is missing, that run is trained again (deterministic on CPU, checked against its log).
"""

import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stats  # noqa: E402
import sweep  # noqa: E402  (its runner and its committed-log helpers)

OUT = "out-equalparam"
ITERS = 2000
MCHARS = 8 * 128 / 1e6             # millions of characters an iteration reads
SEEDS = sweep.SEEDS
# arm: (config file, overrides, centre learning rate: the 400-iteration best, halved at d=256), in run order
ARMS = {
    "tf-d128": ("char_transformer", [], 3e-3),
    "hrm-nt4": ("char_hrm", [], 1e-2),
    "hrm-nt8": ("char_hrm", ["--T=4"], 1e-2),
    "hrm-nt12": ("char_hrm", ["--N=4", "--T=3"], 1e-2),
    "tf-d64": ("char_transformer", ["--n_embd=64", "--n_head=2"], 3e-3),
    "tf-d256": ("char_transformer", ["--n_embd=256", "--n_head=8"], 1.5e-3),
    "hrm-nt8-d256": ("char_hrm", ["--T=4", "--n_embd=256", "--n_head=8"], 5e-3),
    # added once HRM at 1.0M scored below the d=64 Transformer: the flat curve's lowest point, so that the flat
    # size HRM matches is read between measured widths rather than extrapolated (d=64's best lr as the centre)
    "tf-d32": ("char_transformer", ["--n_embd=32", "--n_head=1"], 6e-3),
}
CONTROL = ("hrm-nt12-warm240", "hrm-nt12", ["--warmup_iters=240"])   # (name, arm, overrides): phase D
REACH = 4                          # the grid grows at most 2^4 = 16x from the centre either way
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


def lr_of(arm, k):
    return ARMS[arm][2] * 2.0 ** k


def lr_text(lr):
    """1.5e-3, 3e-3, 1.25e-2: the shortest exact mantissa (the grid steps by factors of 2)."""
    m, e = f"{lr:.3e}".split("e")
    return f"{m.rstrip('0').rstrip('.')}e{int(e)}"


def job(arm, k, seed, extra=(), name=None):
    """(out_dir, train.py command) of one run: the arm at the centre lr times 2^k."""
    cfg, over, _ = ARMS[arm]
    lr = lr_of(arm, k)
    out_dir = os.path.join(OUT, name or arm, f"lr{lr_text(lr)}-s{seed}")
    warmup = [] if any(e.startswith("--warmup_iters=") for e in extra) else [f"--warmup_iters={ITERS // 10}"]
    cmd = [sys.executable, "train.py", f"config/{cfg}.py", *over, f"--learning_rate={lr:.6g}",
           f"--max_iters={ITERS}", f"--lr_decay_iters={ITERS}", *warmup,
           f"--min_lr={lr / 10:.6g}", f"--seed={seed}", f"--out_dir={out_dir}", "--log_interval=100",
           "--eval_interval=100", *extra]
    return out_dir, cmd


def val(arm, k, seed):
    return sweep.final_val(job(arm, k, seed)[0])


def tried(arm):
    """The k of every finished seed-1337 run of the arm."""
    return [k for k in range(-REACH, REACH + 1) if sweep.finished(job(arm, k, SEEDS[0])[0])]


def best_k(arm):
    ks = tried(arm)
    return min(ks, key=lambda k: val(arm, k, SEEDS[0])) if ks else None


def bracketed(arm):
    """The best k has a finished neighbour on each side (or sits at the reach's end)."""
    k, ks = best_k(arm), tried(arm)
    return k is not None and all(j in ks or abs(j) > REACH for j in (k - 1, k + 1))


def phase_a():
    """The three centre points of every arm, then one step outward where an arm's best is at an edge."""
    jobs = [job(a, k, SEEDS[0]) for k in (0, -1, 1) for a in ARMS]
    for a in ARMS:
        k = best_k(a)
        if k is not None and all(sweep.finished(job(a, j, SEEDS[0])[0]) for j in (-1, 0, 1)):
            jobs += [job(a, j, SEEDS[0]) for j in (k - 1, k + 1) if abs(j) <= REACH]
    return list(dict(jobs).items())


def runner_up(arm):
    """The second-best k at seed 1337 where it is within one seed sd of the best (after the best's seeds)."""
    k = best_k(arm)
    vals = sweep.by_seed([job(arm, k, s)[0] for s in SEEDS])
    if len(vals) < len(SEEDS):
        return None
    sd = sweep.mean_sd(list(vals.values()))[1]
    rest = [j for j in tried(arm) if j != k]
    j = min(rest, key=lambda j: val(arm, j, SEEDS[0])) if rest else None
    return j if j is not None and val(arm, j, SEEDS[0]) - vals[SEEDS[0]] <= sd else None


def phase_bc():
    jobs = []
    for a in ARMS:
        if bracketed(a):
            jobs += [job(a, best_k(a), s) for s in SEEDS[1:]]
            j = runner_up(a)
            if j is not None:
                jobs += [job(a, j, s) for s in SEEDS[1:]]
    return jobs


def chosen_k(arm):
    """The lr (as k) with the lower 3-seed mean among those with all 3 seeds; None until phase C is through."""
    if not bracketed(arm) or best_k(arm) is None:
        return None
    k = best_k(arm)
    full = {j: sweep.by_seed([job(arm, j, s)[0] for s in SEEDS]) for j in {k, runner_up(arm)} - {None}}
    if len(full.get(k, {})) < len(SEEDS) or any(len(v) < len(SEEDS) for v in full.values()):
        return None
    return min(full, key=lambda j: sum(full[j].values()))


def shown_k(arm):
    """(k, final): the lr an arm's tables show. Final: the chosen lr, phases B and C through. Until then, where
    the best is bracketed and has 2 or more seeds, that best (provisional: a runner-up's seeds may change it)."""
    k = chosen_k(arm)
    if k is not None:
        return k, True
    if bracketed(arm) and len(sweep.by_seed([job(arm, best_k(arm), s)[0] for s in SEEDS])) >= 2:
        return best_k(arm), False
    return None, False


def label(name):
    return name if name not in ARMS or shown_k(name)[1] else f"{name} (provisional)"


def control_job(seed):
    name, arm, extra = CONTROL
    return job(arm, chosen_k(arm), seed, extra, name)


def phase_d():
    return [control_job(s) for s in SEEDS] if chosen_k(CONTROL[1]) is not None else []


def rows():
    """{row name: {seed: final val CE}} at each arm's chosen lr (and the control's), for finished runs."""
    out = {}
    for a in ARMS:
        k = shown_k(a)[0]
        if k is not None:
            out[a] = sweep.by_seed([job(a, k, s)[0] for s in SEEDS])
    if chosen_k(CONTROL[1]) is not None:
        out[CONTROL[0]] = sweep.by_seed([control_job(s)[0] for s in SEEDS])
    return out


def chosen_dirs(name):
    if name == CONTROL[0]:
        return [control_job(s)[0] for s in SEEDS] if chosen_k(CONTROL[1]) is not None else []
    k = shown_k(name)[0]
    return [] if k is None else [job(name, k, s)[0] for s in SEEDS]


def all_jobs():
    return phase_a() + phase_bc() + phase_d()


def read_finished(workers):
    """Read every finished HRM run whose checkpoint is here; rerun the chosen runs whose reading is missing."""
    reruns = []
    for name in list(ARMS) + [CONTROL[0]]:
        if "hrm" not in name:
            continue
        for d, cmd in all_jobs():
            if d.split(os.sep)[1] != name or not sweep.finished(d) or os.path.exists(sweep.analysis_path(d)):
                continue
            if sweep.last_ckpt(d):
                print(f"reading {d}", flush=True)
                sweep.analysis(d)
            elif d in chosen_dirs(name):
                reruns.append((d, cmd))
    for d in sweep.run_all(reruns, workers, rerun=True) if reruns else []:
        print(f"reading {d}", flush=True)
        sweep.analysis(d)


def run(workers):
    """Run what is missing, phase by phase, until every phase is through. Another runner may hold some runs:
    then wait for it, and stop with one line where a round leaves a run neither finished nor held."""
    while True:
        todo = [(d, c) for d, c in all_jobs() if not sweep.finished(d)]
        if not todo:
            return
        sweep.run_all(todo, workers)
        read_finished(workers)
        left = [(d, c) for d, c in all_jobs() if not sweep.finished(d)]
        if {d for d, _ in left} == {d for d, _ in todo}:       # nothing finished this round
            held = [d for d, _ in left if os.path.isdir(d) and busy(d)]
            if not held:
                from hrmlm.common import fail
                fail(f"{len(left)} runs did not finish (see each out_dir's train.out), first: {left[0][0]}",
                     code=1, prog="equalparam.py")
            print(f"waiting for {len(held)} runs another runner holds", flush=True)
            time.sleep(60)


def busy(out_dir):
    claim = sweep.claim_run(out_dir)
    if claim is None:
        return True
    claim.close()
    return False


# --- tables, from the committed logs alone --------------------------------------------------------

def size_cells(arm):
    f = next((sweep.facts(d) for d, _ in all_jobs() if d.split(os.sep)[1] == arm and sweep.facts(d)), None)
    if not f or "params" not in f:
        return "- | -"
    ms = f.get("ms_per_iter_median")
    return f"{f['params'] / 1e6:.2f}M | {ms:.0f}" if ms else f"{f['params'] / 1e6:.2f}M | -"


def lr_table():
    print(f"### Headline settings: validation CE after {ITERS} iterations, seed 1337, by learning rate "
          "(a factor 2 apart; * = the best)\n")
    print("| arm | params | ms/iter (1 thread) | learning rate: CE | chosen lr (3 seeds) |\n|---|---|---|---|---|")
    for a in ARMS:
        ks = tried(a)
        if not ks:
            continue
        b = best_k(a)
        cells = ", ".join(f"{lr_text(lr_of(a, k))}: {sweep.cell(job(a, k, SEEDS[0])[0])}{'*' if k == b else ''}"
                          for k in ks)
        c, final = shown_k(a)
        chosen = "-" if c is None else lr_text(lr_of(a, c)) + ("" if final else " (provisional)")
        print(f"| {a} | {size_cells(a)} | {cells} | {chosen} |")
    print()


def seeds_table(table, uni):
    print(f"### Headline settings: each arm at its chosen lr, 3 seeds, after {ITERS} iterations "
          f"({ITERS * MCHARS:.2f}M characters)\n")
    print("| arm | " + " | ".join(f"seed {s}" for s in SEEDS) + " | mean ± sd | below unigram |")
    print("|---|" + "---|" * (len(SEEDS) + 2))
    for name, vals in [(name, vals) for name, vals in table.items() if vals]:
        m, sd, n = sweep.mean_sd(list(vals.values()))
        print(f"| {label(name)} | " + " | ".join(sweep.fmt(vals[s]) if s in vals else "-" for s in SEEDS) +
              f" | {m:.3f} ± {sd:.3f} (n={n}) | {uni - m:.3f} |")
    print()


def differences(table):
    print("### Headline settings: differences (row minus column; negative = row better; paired by seed, "
          "with Welch's test beside it; 95% intervals)\n")
    print("| row | column | question | paired: diff [95% CI], p | Welch: diff [95% CI], p | verdict |")
    print("|---|---|---|---|---|---|")
    for a, b, what in COMPARISONS:
        if a in table and b in table:
            p = stats.paired(table[a], table[b])
            w = stats.welch(list(table[a].values()), list(table[b].values()))
            print(f"| {label(a)} | {label(b)} | {what} | {p or '-'} | {w or '-'} | {stats.verdict(p or w)} |")
    gap_changes(table)
    print()


def gap_changes(table):
    """GAP_CHANGES as rows of the differences table: {seed: (a - b) - (c - d)} against 0, a paired test."""
    for (a, b), (c, d), what in GAP_CHANGES:
        if all(x in table for x in (a, b, c, d)):
            seeds = set(table[a]) & set(table[b]) & set(table[c]) & set(table[d])
            change = {s: (table[a][s] - table[b][s]) - (table[c][s] - table[d][s]) for s in seeds}
            p = stats.paired(change, {s: 0.0 for s in seeds})
            print(f"| {a} - {b} | {c} - {d} | {what} | {p or '-'} | - | {stats.verdict(p)} |")


# --- P_flat: the flat size each HRM matches (2604.21106's phi read off it; its magnitudes are withdrawn) ---

def param_split(arm):
    """(N_once, [(r, N_rec), ...]) of an HRM arm, counted on the model its runs built (meta device): the Fast
    module (L_net) runs r = M times per pass, the Slow module (H_net) r = N times, everything else once."""
    import torch
    from model import ModelConfig, build_model
    f = next(sweep.facts(d) for d, _ in all_jobs() if d.split(os.sep)[1] == arm and sweep.facts(d))
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
    arm's CE (P_flat), with the t interval of the seeds' mean ln P_flat. phi's magnitudes are withdrawn (docs/RESULTS.md
    section 9): one token budget, an extrapolation below d=32, a curve flat at its top, and 'whole' phi is not
    2604.21106's definition; the direct tests against each Transformer width stand in for them."""
    if not all(a in table for a in FLAT):
        return
    size = {a: sweep.facts(chosen_dirs(a)[0])["params"] for a in FLAT}
    print("### Headline settings: the flat size each HRM matches (P_flat), at equal tokens\n")
    print("P_flat: the stored parameters at which the Transformer L=4 (d=32 to 256, one curve per seed, linear in ln P "
          "between widths, its end segments extended beyond them) reaches the arm's CE. Extrapolated: the seeds whose "
          "CE lies outside the curve's measured range (above d=32's or below d=256's), where P_flat is the end "
          "segment's extension. Interval: the t interval of the seeds' mean ln P_flat. Once: the stored parameters "
          "HRM runs once (embedding, input block, fusion).\n")
    print("| arm | params: once + Fast x M + Slow x N | P_flat [95% CI] | P_flat / P | extrapolated | seeds |\n"
          "|---|---|---|---|---|---|")
    for arm in [a for a in LOOPED if a in table]:
        seeds = [s for s in SEEDS if s in table[arm] and all(s in table[a] for a in FLAT)]
        if len(seeds) < 2:
            continue
        curves = {s: [(math.log(size[a]), table[a][s]) for a in FLAT] for s in seeds}
        lnp = {s: flat_ln_params(table[arm][s], curves[s]) for s in seeds}
        ci = stats.paired(lnp, {s: 0.0 for s in seeds})     # the t interval of mean ln P_flat, as gap_changes'
        if ci is None:                                        # under 2 seeds with a finite P_flat
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
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=130)
    for i, arm in enumerate(ARMS):
        logs = [sweep.run_log(d) for d in chosen_dirs(arm)]
        its = sorted(set.intersection(*[{r["iter"] for r in log if "val_loss" in r} for log in logs]) - {0})
        vals = [[next(r["val_loss"] for r in log if r["iter"] == it and "val_loss" in r) for log in logs]
                for it in its]
        st = dict(color=f"C{i}", linestyle="-" if "hrm" in arm else "--")
        ax.plot([it * MCHARS for it in its], [sum(v) / len(v) for v in vals],
                label=f"{label(arm)} (lr {lr_text(lr_of(arm, shown_k(arm)[0]))})", **st)
        ax.fill_between([it * MCHARS for it in its], [min(v) for v in vals], [max(v) for v in vals],
                        color=f"C{i}", alpha=0.15)
    ax.set_ylim(top=2.6)
    ax.set_xlabel("characters seen (millions)")
    ax.set_ylabel("validation CE")
    ax.set_title(f"Headline settings, {ITERS} iterations (3-seed mean, band: seed min-max)", fontsize=9)
    size = {a: sweep.facts(chosen_dirs(a)[0])["params"] / 1e6 for a in ARMS}
    for group, st in ((FLAT, dict(color="C1", marker="s", linestyle="--", label="Transformer L=4, d=32 to 256")),
                      (LOOPED[:3], dict(color="C0", marker="o", linestyle="", label="HRM NT=4, 8, 12 at d=128")),
                      (LOOPED[3:], dict(color="C3", marker="o", linestyle="", label="HRM NT=8 at d=256"))):
        means = [sweep.mean_sd(list(table[a].values())) for a in group]
        bx.errorbar([size[a] for a in group], [m for m, _, _ in means], yerr=[sd for _, sd, _ in means],
                    capsize=3, **st)
    for a in LOOPED[:3]:
        bx.annotate(a.split("-")[1].upper(), (size[a], sweep.mean_sd(list(table[a].values()))[0]), fontsize=7,
                    xytext=(4, 0), textcoords="offset points")
    bx.set_xscale("log")
    bx.set_xlabel("stored parameters (millions, log scale)")
    bx.set_ylabel(f"validation CE after {ITERS} iterations (± sd)")
    bx.set_title("The flat curve and where HRM sits on it", fontsize=9)
    sweep.finish(fig, (ax, bx), "equalparam.png")


def readings_table():
    print("### Headline settings: HRM's checkpoint readings at the chosen lr (mean ± sd over the seeds read)\n")
    print(sweep.SLOW_LEGEND)
    print("| arm | CE | ΔCE, H frozen | z_H drift | w_H | w_L | w_I | ΔCE [95% CI], p |\n"
          "|---|---|---|---|---|---|---|---|")
    for name in [a for a in ARMS if "hrm" in a] + [CONTROL[0]]:
        cells, n = sweep.slow_cells(chosen_dirs(name))
        if cells:
            print(f"| {label(name)} (n={n}) | {cells} | {sweep.frozen_cost(chosen_dirs(name)) or '-'} |")
    print()
    print("### Headline settings: depth at inference (val CE at multiples of the trained depth; N' Slow firings "
          "with T kept, or T' Fast steps per firing with N kept)\n")
    print("| arm | varied | " + " | ".join(f"{f:g}x" for f in sweep.DEPTHS) + " |")
    print("|---|---|" + "---|" * len(sweep.DEPTHS))
    for name in [a for a in ARMS if "hrm" in a]:
        for what, cells in sweep.depth_cells(sweep.depth_rows(chosen_dirs(name))).items():
            print(f"| {label(name)} | {what}' | " + " | ".join(cells) + " |")
    print()


def tables():
    uni = sweep.unigrams()["char"]
    lr_table()
    table = rows()
    if table:
        seeds_table(table, uni)
        differences(table)
        flat_size_table(table)
        readings_table()
    done = [d for d, _ in all_jobs() if sweep.finished(d)]
    from long_run import train_seconds
    hours = sum(train_seconds(sweep.run_log(d)) for d in done) / 3600
    print(f"{len(done)} runs committed ({hours:.1f} hours of training in all, one core each; their logs' time_s); "
          f"{len(all_jobs()) - len(done)} known still to run at this phase\n")
    missing = [a for a in ARMS if len(table.get(a, {})) < len(SEEDS)]   # a provisional arm is drawn, so labelled
    if missing and done:   # never overwrite the committed plot with a partial one
        print(f"equalparam.py: not drawing docs/equalparam.png: no 3 committed seeds at a chosen (or provisional) lr for "
              f"{', '.join(missing)}; the committed plot is kept", file=sys.stderr)
    elif not missing:
        draw(table)


def main():
    sweep.runner_main(__doc__, all_jobs, lambda workers: (run(workers), read_finished(workers)), tables,
                      [("shakespeare_char", "--dataset=shakespeare_char")])


if __name__ == "__main__":
    from hrmlm.signals import exit_on_signals   # Ctrl-C, SIGTERM, SIGHUP: one line in every phase
    exit_on_signals()
    main()
