"""What every study prints and draws with, from the committed logs alone: the statistics (Welch's t, the paired t
where runs share seeds), table parts, the checkpoint readings committed beside a run's log, the plots' shared parts."""

import json
import math
import os
import sys
from dataclasses import dataclass

import matplotlib
matplotlib.use("Agg")   # before pyplot's import: files only, never a window
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from scipy import stats  # noqa: E402  Student's t (scipy is for experiments/ alone: requirements.txt)

import runner  # noqa: E402
from hrmlm.common import unigram_ce, write_result  # noqa: E402
from tools import analyze  # noqa: E402

DEPTHS = [0.5, 1, 2, 4]   # multiples of the trained depth for the inference-depth tables


# --- statistics ---------------------------------------------------------------------------------------------------

@dataclass
class Diff:
    diff: float      # mean of a minus mean of b (paired: mean of the per-seed differences)
    lo: float        # 95% interval
    hi: float
    p: float         # two-sided p-value of "no difference"
    df: float        # degrees of freedom (Welch's are fractional)
    test: str        # "welch" or "paired"
    n: int           # runs per group (paired: pairs)

    @property
    def degenerate(self):
        """No test: the runs (paired: the per-seed differences) do not vary, or their spread overflowed."""
        return not math.isfinite(self.p)

    def __str__(self):
        if self.degenerate:
            return f"{self.diff:+.3f} (no spread among the {self.n} runs: no interval, no p-value)"
        return f"{self.diff:+.3f} [{self.lo:+.3f}, {self.hi:+.3f}], p = {p_text(self.p)}"


def p_text(p):
    if not math.isfinite(p):
        return "none (no spread)"
    return "<0.001" if p < 0.001 else f"{p:.3f}" if p < 0.1 else f"{p:.2f}"


def _mean_var(xs):
    """Mean and sample variance; 0 where the spread is rounding (under 1e-9 of the values: equal CEs differ in
    float's last digits), inf where it overflows (values near 1e308)."""
    m = math.fsum(xs) / len(xs)
    try:
        v = math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1)
    except OverflowError:
        return m, math.inf
    return m, 0.0 if math.sqrt(v) <= 1e-9 * max(1.0, max(abs(x) for x in xs)) else v


def _result(diff, se, df, test, n):
    """A Diff; with no spread (se 0) or an overflowed one, a degenerate Diff (p, interval nan): the t-test assumes
    runs that vary, and a zero-width interval with p = 0 would claim a certainty the data does not give."""
    if se == 0 or not math.isfinite(se) or not math.isfinite(diff):
        return Diff(diff, math.nan, math.nan, math.nan, df, test, n)
    h = float(stats.t.ppf(0.975, df)) * se
    return Diff(diff, diff - h, diff + h, float(2 * stats.t.sf(abs(diff) / se, df)), df, test, n)


def welch(a, b):
    """Welch's t-test of mean(a) - mean(b); None with fewer than 2 finite runs on a side (a diverged run's CE
    is inf: it is left out, and the table beside says so)."""
    a, b = [x for x in a if math.isfinite(x)], [x for x in b if math.isfinite(x)]
    if len(a) < 2 or len(b) < 2:
        return None
    (ma, va), (mb, vb) = _mean_var(a), _mean_var(b)
    sa, sb = va / len(a), vb / len(b)
    se = math.sqrt(sa + sb)
    if se == 0 or not math.isfinite(se):
        return _result(ma - mb, se, len(a) + len(b) - 2, "welch", min(len(a), len(b)))
    df = (sa + sb) ** 2 / ((sa ** 2 / (len(a) - 1) if sa else 0) + (sb ** 2 / (len(b) - 1) if sb else 0) or 1e-300)
    return _result(ma - mb, se, df, "welch", min(len(a), len(b)))


def paired(a, b):
    """Paired t-test of a - b where a[i] and b[i] share a seed ({seed: value} dicts); None under 2 pairs."""
    seeds = sorted(s for s in set(a) & set(b) if math.isfinite(a[s]) and math.isfinite(b[s]))
    if len(seeds) < 2:
        return None
    d = [a[s] - b[s] for s in seeds]
    m, v = _mean_var(d)
    return _result(m, math.sqrt(v / len(d)), len(d) - 1, "paired", len(d))


def verdict(d, effect=None):
    """What the 95% interval lets one say: a sign where it excludes 0; "the data cannot tell" where it spans
    both signs (and, given the size of an effect in question, whether the interval reaches it)."""
    if d is None:
        return "too few runs"
    if d.degenerate:
        return f"no test: no spread among the {d.n} runs (or it overflows)"
    if d.lo > 0 or d.hi < 0:
        return ("a lower" if d.hi < 0 else "a higher") + f" CE (p = {p_text(d.p)})"
    tail = "" if effect is None else (
        f"; an effect of {effect:+.2f} is {'inside' if d.lo <= effect <= d.hi else 'outside'} the interval")
    return f"the data cannot tell (the interval spans both signs){tail}"


def mean_sd(vals):
    """(mean, sample sd, n) of the finite values."""
    vals = [v for v in vals if math.isfinite(v)]
    if not vals:
        return math.inf, 0.0, 0
    m = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return m, sd, len(vals)


def difference(summary, a, b):
    """(row minus column, its standard error) of two (mean, sd, n) seed summaries, or None where one is missing."""
    if a not in summary or b not in summary or summary[a][2] < 2 or summary[b][2] < 2:
        return None
    (ma, sa, na), (mb, sb, nb) = summary[a], summary[b]
    return ma - mb, math.sqrt(sa ** 2 / na + sb ** 2 / nb)


def curves(dirs):
    """{seed: {iteration: val CE}} of the finished runs among dirs."""
    return {int(runner.seed_of(d)): {r["iter"]: r["val_loss"] for r in runner.run_log(d) if r.get("val_loss")}
            for d in dirs if runner.finished(d)}


def gaps(a, b, its):
    """The runs a minus the runs b at each iteration of its, paired by seed: {iteration: Diff or None}."""
    a, b = curves(a), curves(b)
    return {i: paired({s: c[i] for s, c in a.items() if i in c}, {s: c[i] for s, c in b.items() if i in c}) for i in its}


# --- tables -------------------------------------------------------------------------------------------------------

def header(*cols):
    """A Markdown table's first two lines."""
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))


def heading(title, *cols, note=None):
    """A Markdown table's title (and a note under it), then its first two lines."""
    print(f"### {title}\n")
    if note:
        print(note)
    header(*cols)


def fmt(v):
    return "diverged" if v == math.inf else f"{v:.3f}"


def cell(out_dir):
    """A table cell for a run: its final CE, "diverged", or "-" where it has not finished."""
    return fmt(runner.final_val(out_dir)) if runner.finished(out_dir) else "-"


def unigrams():
    """The unigram CE of each testbed, computed from the data once and committed beside the logs."""
    path, data = os.path.join(runner.ROOT, runner.LOGS, "sweep", "unigram.json"), os.path.join(runner.ROOT, "data")
    if not os.path.exists(path):
        if not all(os.path.exists(os.path.join(data, d, "val.bin")) for d in ("shakespeare_char", "shakespeare")):
            return {"char": math.nan, "bpe": math.nan}
        os.makedirs(os.path.dirname(path), exist_ok=True)
        u = {"char": unigram_ce(data, "shakespeare_char"), "bpe": unigram_ce(data, "shakespeare")}
        write_result(path, lambda f: json.dump(u, f, indent=1))   # whole or not at all
    return runner.committed_json(path, (("char", (int, float)), ("bpe", (int, float))))


def train_seconds(log):
    """A run's training time from its log's time_s, which restarts from 0 when a run is resumed."""
    total, last = 0.0, 0.0
    for r in log:
        t = r.get("time_s") or 0.0
        if t < last:          # resumed: the clock restarted
            total += last
        last = t
    return total + last


def hours(out_dirs):
    """The finished runs' training time in all, in hours (one core each; their logs' time_s)."""
    return sum(train_seconds(runner.run_log(d)) for d in out_dirs) / 3600


# --- checkpoint readings, committed beside the logs ----------------------------------------------------------------

def reading_path(out_dir, name):
    return os.path.join(runner.ROOT, runner.log_dir(out_dir), name)


def reading(out_dir, name, compute=None, archs=("hrm",), fields=()):
    """The committed reading `name` (analysis.json, alive.json, kv.json) beside a run's log; where it is missing,
    computed once from the finished run's last-iteration state (whose CE the tables report, not ckpt.pt's), as
    {"iter", **compute(model, batches)} on 64 validation sequences, and committed. None where it cannot be."""
    path = reading_path(out_dir, name)
    if not os.path.exists(path):
        state = runner.resume_state(out_dir)
        if compute is None or not state or not runner.finished(out_dir):
            return None
        torch.set_num_threads(1)
        model, ck = analyze.load(out_dir, os.path.relpath(state, out_dir), "cpu", archs)
        if ck["iter_num"] != runner.max_iters_of(runner.facts(out_dir)["command"].split()):
            return None
        batches = analyze.val_batches(ck, os.path.join(runner.ROOT, "data"), 16, 4, model.config.block_size)
        r = {"iter": ck["iter_num"], **compute(model, batches)}
        write_result(path, lambda f: json.dump(r, f, indent=1))   # a full disk: one line, exit status 1
    return runner.committed_json(path, fields)


def read_finished(jobs, name, read):
    """read() each finished HRM run of jobs whose reading `name` is missing, where its checkpoint is here."""
    for d, _ in jobs:
        if "hrm" in d and runner.finished(d) and runner.resume_state(d) and not os.path.exists(reading_path(d, name)):
            print(f"reading {d}", flush=True)
            read(d)


def phased(groups, jobs, name, read):
    """A study's run(workers): groups()'s jobs round by round (runner.next_jobs), the finished HRM runs read
    (reading `name`) after each round, since a later phase may depend on a reading, and once more at the end."""
    def run(workers):
        after = lambda: read_finished(jobs(), name, read)   # noqa: E731
        runner.run_until_done(lambda: runner.next_jobs(groups(), workers), workers, after)
        after()
    return run


def analysis(out_dir):
    """The sweep's reading (analysis.json), or None: for HRM the Slow-module ablation (CE with z_H frozen at z_H0),
    z_H's drift, the fusion weights (analyze.py's HLRole A-C); for HRM and UniTF, val CE at DEPTHS x trained depth."""
    def compute(model, batches):
        r = {"ce": analyze.val_ce(model, batches, "cpu"), "depth": analyze.depth_table(model, batches, "cpu", DEPTHS)}
        if model.config.arch == "hrm":
            with analyze.slow_module_frozen(model):
                r["ce_h_frozen"] = analyze.val_ce(model, batches, "cpu")
            steps, r["fusion"] = analyze.step_stats(model, batches, "cpu")
            r["z_H_drift"] = steps[-1]["z_H_drift"]     # after the last step: what the fusion reads
        return r
    return reading(out_dir, "analysis.json", compute, ("hrm", "unitf"))


SLOW_LEGEND = ("ΔCE: CE with z_H frozen at its prototype z_H0 (H_net's update replaced by the identity) minus CE; "
               "drift: ‖z_H - z_H0‖ / ‖z_H0‖ after the last step; w_H, w_L, w_I: the output fusion's mean weights.\n")


def slow_table(title, first, rows, cost=False):
    """The Slow-module readings (mean ± sd over the runs read) of each (name, runs) of rows that has any, under
    SLOW_LEGEND; cost: frozen_cost's interval too."""
    heading(title, first, "CE", "ΔCE, H frozen", "z_H drift", "w_H", "w_L", "w_I",
            *(["ΔCE [95% CI], p"] if cost else []), note=SLOW_LEGEND)
    for name, runs in rows:
        rs = [r for r in map(analysis, runs) if r]
        if rs:
            cols = [[r["ce"] for r in rs], [r["ce_h_frozen"] - r["ce"] for r in rs], [r["z_H_drift"] for r in rs]]
            cols += [[r["fusion"][w] for r in rs] for w in ("w_H", "w_L", "w_I")]
            cells = [f"{m:{'+' if i == 1 else ''}.3f} ± {sd:.3f}" for i, (m, sd, _) in enumerate(map(mean_sd, cols))]
            cells += [str(frozen_cost(runs) or "-")] if cost else []
            print(f"| {name} (n={len(rs)}) | " + " | ".join(cells) + " |")
    print()


def slow_seed_table(title, runs):
    """The Slow-module readings run by run, then ΔCE's mean with its 95% interval (frozen against not, paired by
    checkpoint) where 2 or more are read."""
    heading(title, "seed", "CE", "ΔCE, H frozen", "z_H drift", "w_H / w_L / w_I")
    for d in runs:
        r = analysis(d)
        if r:
            w = r["fusion"]
            print(f"| {runner.seed_of(d)} | {r['ce']:.3f} | {r['ce_h_frozen'] - r['ce']:+.3f} | {r['z_H_drift']:.3f} | "
                  f"{w['w_H']:.3f} / {w['w_L']:.3f} / {w['w_I']:.3f} |")
    cost = frozen_cost(runs)
    if cost:
        print(f"| mean [95% CI], p | - | {cost} | - | - |")
    print()


def frozen_cost(runs):
    """What freezing z_H costs, CE frozen minus CE, paired by checkpoint (a Diff); None under 2 readings."""
    read = [(runner.seed_of(d), r) for d, r in ((d, analysis(d)) for d in runs) if r]
    return paired({s: r["ce_h_frozen"] for s, r in read}, {s: r["ce"] for s, r in read})


def depth_rows(runs):
    """{(varied, depth): [CE of each run]} from the runs' checkpoint readings."""
    out = {}
    for r in map(analysis, runs):
        for row in (r or {}).get("depth", []):
            out.setdefault((row["varied"], row["depth"]), []).append(row["ce"])
            if row["varied"] == "N" and row["depth"] == 1:    # the trained depth is on the T' line too
                out.setdefault(("T", 1.0), []).append(row["ce"])
    return out


def depth_table(title, first, rows):
    """Val CE at each of DEPTHS (mean ± sd of the readings): a line per (name, runs) of rows and per depth varied
    (N', T', M') that the readings have."""
    heading(title, *first, "varied", *[f"{f:g}x" for f in DEPTHS])
    for name, runs in rows:
        ces = depth_rows(runs)
        for what in ("N", "T", "M"):
            cells = ["{:.3f} ± {:.3f}".format(*mean_sd(ces[what, float(f)])[:2]) if ces.get((what, float(f))) else "-"
                     for f in DEPTHS]
            if any(c != "-" for c in cells):
                print(f"| {name} | {what}' | " + " | ".join(cells) + " |")
    print()


# --- is HRM's recurrence alive? alive.json beside the log (alive.py, crossover.py) -----------------------------------

ALIVE = 0.05   # nats: both shared blocks off must cost at least this for a run to count as alive
ALIVE_COLS = ("alpha_L / alpha_H", "blocks off: Fast, Slow, both", "H frozen")   # alive_cells' columns


def alive_reading(out_dir, more=lambda model, batches: {}):
    """The committed alive.json of a run, computed once from its last checkpoint (None: not read, no checkpoint): the
    alphas, each shared block off and both, the Slow module frozen; then more(model, batches)'s readings."""
    def compute(model, batches):
        ce = analyze.val_ce(model, batches, "cpu")
        with analyze.slow_module_frozen(model):
            frozen = analyze.val_ce(model, batches, "cpu") - ce
        return {"ce": ce, "h_frozen": frozen, **analyze.alive(model, batches, "cpu", ce), **more(model, batches)}
    return reading(out_dir, "alive.json", compute, fields=(("off_both", (int, float)),))


def ms(vals, fmt=".3f"):
    """'mean ± sd' of the values (one value: itself; '-' where there are none, as a Slow block a model lacks)."""
    if all(v is None for v in vals):
        return "-"
    m, sd, n = mean_sd(vals)
    return f"{m:{fmt}}" + (f" ± {sd:.3f}" if n > 1 else "")


def alive_cells(dirs, read=alive_reading):
    """ALIVE_COLS' cells over the runs read (mean ± sd); '(off)' where a run's both-off cost is under ALIVE; the last
    logged alphas where no run was read."""
    rs = [r for r in map(read, dirs) if r]
    if not rs:
        a = [(r.get("alpha_L"), r.get("alpha_H")) for r in (runner.run_log(d)[-1] for d in dirs)]
        cells = f"{ms([x for x, _ in a])} / {ms([y for _, y in a])}" if a and None not in a[0] else "-"
        return cells + " | not read | -"
    off = sum(r["off_both"] < ALIVE for r in rs)
    return (f"{ms([r['alpha_L'] for r in rs])} / {ms([r['alpha_H'] for r in rs])} | "
            f"{ms([r['off_L'] for r in rs], '+.3f')}, {ms([r['off_H'] for r in rs], '+.3f')}, "
            f"{ms([r['off_both'] for r in rs], '+.3f')}" + ("" if not off else " (off)" if len(rs) == 1 else
                                                  f" ({off} of {len(rs)} off)") +
            f" | {ms([r['h_frozen'] for r in rs], '+.3f')}")


# --- plots --------------------------------------------------------------------------------------------------------

def seed_curve(logs, skip=()):
    """(the iterations every log evaluated at, but skip; [[val CE of each log] at each])."""
    its = sorted(set.intersection(*[{r["iter"] for r in log if "val_loss" in r} for log in logs]) - set(skip))
    return its, [[{r["iter"]: r["val_loss"] for r in log if "val_loss" in r}[i] for log in logs] for i in its]


def band(ax, x, ys, **style):
    """The seeds' mean at each x, and the band between their min and max."""
    ax.plot(x, [sum(y) / len(y) for y in ys], **style)
    ax.fill_between(x, [min(y) for y in ys], [max(y) for y in ys], color=style["color"], alpha=0.15)


def unigram_line(ax, uni):
    ax.axhline(uni, color="0.4", linewidth=1, linestyle=":", label=f"unigram {uni:.2f}")


def figure(panels=1, **kw):
    """A figure of one panel, or of two side by side."""
    return plt.subplots(1, panels, figsize=(6.4, 4.2) if panels == 1 else (11, 4.2), dpi=130, **kw)


def dress(ax, xlabel, ylabel, title, legend=None, which="major"):
    """A panel's labels and title; with legend (its font size), its grid and legend too."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    if legend:
        ax.grid(True, which=which, linestyle=":", color="0.85")
        ax.legend(fontsize=legend)


def save(fig, name):
    """Laid out and saved, byte-identical for identical logs: no timestamp or version in the PNG's metadata."""
    fig.tight_layout()
    write_result(os.path.join(runner.ROOT, "docs", name),   # whole or not at all: the committed plot stays
                 lambda f: fig.savefig(f, format="png", metadata={"Software": None}), "wb")


def drawable(name, missing, why):
    """True where no run docs/<name> needs is missing; else one line says which, and the committed plot is kept."""
    if missing:
        print(f"{os.path.basename(sys.argv[0])}: not drawing docs/{name}: {why} {', '.join(missing)}; the committed "
              "plot is kept", file=sys.stderr)
    return not missing


def finish(fig, axes, name):
    """The two-panel plots' common end: grid, legend, save."""
    for a in axes:
        a.grid(True, which="both", linestyle=":", color="0.85")
        a.legend(fontsize=6.5)
    save(fig, name)
    print(f"wrote docs/{name}")
