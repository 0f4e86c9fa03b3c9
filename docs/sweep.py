"""
Reproduction v2 (docs/RESULTS.md): HPSearch in miniature, with the controls that tell architecture
from trainability. One command runs everything, skips what already finished (so it resumes after a
stop), then prints every table and draws every plot from the runs' logs:

    python prepare.py --dataset=shakespeare_char && python prepare.py
    python docs/sweep.py                 # all runs, then tables and plots (about 95 minutes, 2 cores)
    python docs/sweep.py --tables        # tables and plots only, from whatever runs exist

Phases (each run is a plain train.py command, printed before it starts):
  1. character testbed, 8 variants x 4 learning rates, seed 1337: HRM, Transformer L=4, UniTF
     (each post- and pre-norm) at matched stored parameters, plus two controls: HRM's Fast module
     alone (no Slow module) and UniTF with full backprop (K = M). Where a variant's best learning
     rate is at the edge of what it tried, the next half-decade step that way is run too (1b).
  2. each variant's best learning rate with 2 more seeds (3 in all).
  3. BPE testbed (config/shakespeare_*.py): the six architecture x norm variants at their best
     character-level learning rate and one grid step each side, seed 1337.
  4. the K ablation (K = 1, 2, 4 of M = 4) for post-norm HRM at its best learning rate, and the
     Slow-module ablation (analyze.py's HLRole A) on every HRM variant's best checkpoint.
Runs go two at a time, one thread each (2 cores); a run's output is in its out_dir/train.out.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from plot import load_log  # noqa: E402
from prepare import unigram_ce  # noqa: E402

OUT = "out-sweep"                          # every run's out_dir is under here
LRS = [3e-4, 1e-3, 3e-3, 1e-2]            # phase 1 grid: 1.5 decades, half-decade steps
GRID = [3e-5, 1e-4] + LRS + [3e-2, 1e-1]  # where a variant's best is at an edge, the grid grows that way
SEEDS = [1337, 42, 2024]
# variant: (config file, overrides); the UniTF on BPE is widened to d=144 to match stored parameters
CHAR = {
    "hrm-post": ("char_hrm", []), "hrm-pre": ("char_hrm", ["--norm=pre"]),
    "transformer-post": ("char_transformer", []), "transformer-pre": ("char_transformer", ["--norm=pre"]),
    "unitf-post": ("char_unitf", []), "unitf-pre": ("char_unitf", ["--norm=pre"]),
    "hrm_fast_only-post": ("char_hrm_fast_only", []), "unitf_full-post": ("char_unitf_full", []),
}
BPE = {
    "hrm-post": ("shakespeare_hrm", []), "hrm-pre": ("shakespeare_hrm", ["--norm=pre"]),
    "transformer-post": ("shakespeare_transformer", []), "transformer-pre": ("shakespeare_transformer", ["--norm=pre"]),
    "unitf-post": ("shakespeare_unitf", ["--n_embd=144"]), "unitf-pre": ("shakespeare_unitf", ["--n_embd=144", "--norm=pre"]),
}
LABEL = {"hrm": "HRM N=2,T=2,K=2", "transformer": "Transformer L=4", "unitf": "UniTF M=4,K=2",
         "hrm_fast_only": "control: HRM Fast module only", "unitf_full": "control: UniTF K=M=4"}
ITERS = {"char": 400, "bpe": 300}         # the BPE runs cost 2x per iteration (the 50257-wide head): 300 to fit


def max_iters(out_dir):
    return ITERS["bpe" if os.path.join(OUT, "bpe") in out_dir else "char"]


def lr_name(lr):
    return f"{lr:.0e}".replace("e-0", "e-")


def run_dir(testbed, variant, lr, seed, extra=""):
    return os.path.join(OUT, testbed, variant, f"lr{lr_name(lr)}-s{seed}{extra}")


def finished(out_dir):
    """True when the run logged its last iteration or stopped for good (diverged: train.py exit 3)."""
    if os.path.exists(os.path.join(out_dir, "diverged")):
        return True
    try:
        return any(r["iter"] == max_iters(out_dir) for r in load_log(out_dir))
    except SystemExit:
        return False


def final_val(out_dir):
    """Validation CE at the last iteration; inf for a diverged or missing run."""
    if not os.path.exists(os.path.join(out_dir, "log.jsonl")) or os.path.exists(os.path.join(out_dir, "diverged")):
        return math.inf
    rows = [r for r in load_log(out_dir) if r["iter"] == max_iters(out_dir)]
    v = rows[-1]["val_loss"] if rows else None
    return v if v is not None and math.isfinite(v) else math.inf


def command(testbed, variant, lr, seed, extra_args=(), extra=""):
    cfg, over = (CHAR if testbed == "char" else BPE)[variant]
    out_dir = run_dir(testbed, variant, lr, seed, extra)
    n = ITERS[testbed]
    cmd = [sys.executable, "train.py", f"config/{cfg}.py", *over, *extra_args, f"--learning_rate={lr}",
           f"--max_iters={n}", f"--lr_decay_iters={n}", f"--warmup_iters={n // 10}",
           f"--min_lr={lr / 10:.3g}", f"--seed={seed}", f"--out_dir={out_dir}", "--log_interval=100"]
    return out_dir, cmd


def run_all(jobs, workers, is_finished=None, val_of=None):
    """Run (out_dir, cmd) jobs, `workers` at a time with one thread each; skip finished ones, resume cut ones.
    is_finished(out_dir) and val_of(out_dir) default to this script's (docs/beyond_paper.py passes its own)."""
    is_finished, val_of = is_finished or finished, val_of or final_val
    todo = [(d, c) for d, c in jobs if not is_finished(d)]
    print(f"{len(jobs) - len(todo)} of {len(jobs)} runs already finished; {len(todo)} to go", flush=True)
    running, t0, done = [], time.time(), 0
    while todo or running:
        while todo and len(running) < workers:
            out_dir, cmd = todo.pop(0)
            os.makedirs(out_dir, exist_ok=True)
            if os.path.exists(os.path.join(out_dir, "ckpt_last.pt")):
                cmd = cmd + ["--init_from=resume"]     # exact resume of a run cut off by a stop
            else:
                cmd = cmd + ["--overwrite=True"]       # cut before its first checkpoint: start over
            print(" ".join(cmd[1:]), flush=True)
            out = open(os.path.join(out_dir, "train.out"), "a")
            env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
            running.append((out_dir, subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env), out))
        time.sleep(1)
        for item in list(running):
            out_dir, p, out = item
            if p.poll() is None:
                continue
            running.remove(item)
            out.close()
            done += 1
            if p.returncode == 3:                      # train.py's stop after max_nonfinite bad iterations
                open(os.path.join(out_dir, "diverged"), "w").close()
            elif p.returncode != 0:
                print(f"FAILED ({p.returncode}): {out_dir}; see {out_dir}/train.out", flush=True)
            el = time.time() - t0
            left = len(todo) + len(running)
            print(f"[{done}/{done + left}] {out_dir}: val {val_of(out_dir):.4f} | {el / 60:.1f} min, "
                  f"about {el / done * left / 60:.0f} min left", flush=True)


def tried(testbed, variant):
    """The grid points this variant has a finished seed-1337 run at."""
    return [lr for lr in GRID if finished(run_dir(testbed, variant, lr, SEEDS[0]))]


def best_lr(testbed, variant):
    vals = {lr: final_val(run_dir(testbed, variant, lr, SEEDS[0])) for lr in tried(testbed, variant)}
    if not vals:
        return None
    lr = min(vals, key=vals.get)
    return lr if math.isfinite(vals[lr]) else None


def edge_runs():
    """Phase 1b: a variant whose best lr is the highest (lowest) it tried gets the next grid point up
    (down), so every reported best is bracketed by a worse lr on each side where the grid allows."""
    jobs = []
    for v in CHAR:
        lrs, lr = tried("char", v), best_lr("char", v)
        if lr is None:
            continue
        i = GRID.index(lr)
        if lr == lrs[-1] and i + 1 < len(GRID):
            jobs.append(command("char", v, GRID[i + 1], SEEDS[0]))
        if lr == lrs[0] and i > 0:
            jobs.append(command("char", v, GRID[i - 1], SEEDS[0]))
    return jobs


def phase1():
    return [command("char", v, lr, SEEDS[0]) for v in CHAR for lr in LRS]


def phase234():
    jobs = []
    for v in CHAR:
        lr = best_lr("char", v)
        if lr is not None:
            jobs += [command("char", v, lr, s) for s in SEEDS[1:]]
    for v in BPE:
        lr = best_lr("char", v)
        if lr is not None:
            i = GRID.index(lr)
            jobs += [command("bpe", v, g, SEEDS[0]) for g in GRID[i - 1:i + 2]]
    lr = best_lr("char", "hrm-post")
    if lr is not None:
        jobs += [command("char", "hrm-post", lr, SEEDS[0], [f"--K={k}"], f"-K{k}") for k in (1, 4)]
    return jobs


# --- tables and plots ------------------------------------------------------------------------------

def fmt(v):
    return "diverged" if v == math.inf else f"{v:.3f}"


def cell(out_dir):
    """A table cell for a run: its final CE, "diverged", or "-" where it has not finished."""
    return fmt(final_val(out_dir)) if finished(out_dir) else "-"


def mean_sd(vals):
    vals = [v for v in vals if math.isfinite(v)]
    if not vals:
        return math.inf, 0.0, 0
    m = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return m, sd, len(vals)


def params_of(out_dir):
    import torch
    from model import ModelConfig, build_model
    path = os.path.join(out_dir, "ckpt_last.pt")
    if not os.path.exists(path):
        return None
    args = torch.load(path, map_location="cpu", weights_only=True)["model_args"]
    with torch.device("meta"):
        return build_model(ModelConfig(**args)).num_params()


def slow_ablation(out_dir):
    """(CE, CE with the Slow module frozen at z_H0) on the best checkpoint, as analyze.py computes them."""
    cache = os.path.join(out_dir, "hlrole_a.json")
    if not os.path.exists(cache):
        import torch
        from analyze import load, slow_module_frozen, val_batches, val_ce
        torch.set_num_threads(1)
        model, ck = load(out_dir, "ckpt.pt", "cpu")
        batches = val_batches(ck, None, 16, 4, model.config.block_size)
        ce = val_ce(model, batches, "cpu")
        with slow_module_frozen(model):
            frozen = val_ce(model, batches, "cpu")
        with open(cache, "w") as f:
            json.dump({"ce": ce, "ce_h_frozen": frozen}, f)
    with open(cache) as f:
        r = json.load(f)
    return r["ce"], r["ce_h_frozen"]


def tables(plots=True):
    uni = {"char": unigram_ce("data", "shakespeare_char"), "bpe": unigram_ce("data", "shakespeare")}
    print(f"Unigram reference (token frequencies from train.bin, add-one smoothed, scored on val.bin): "
          f"character testbed {uni['char']:.3f}, BPE testbed {uni['bpe']:.3f} nats/token\n")

    print("### Character testbed: validation CE after 400 iterations, by learning rate (seed 1337)\n")
    cols = [lr for lr in GRID if any(lr in tried("char", v) for v in CHAR)]
    print("| variant | params | " + " | ".join(f"lr {lr_name(lr)}" for lr in cols) + " | best lr |")
    print("|---|---|" + "---|" * (len(cols) + 1))
    best = {}
    for v in CHAR:
        vals = [final_val(run_dir("char", v, lr, SEEDS[0])) if lr in tried("char", v) else None for lr in cols]
        best[v] = best_lr("char", v)
        p = params_of(run_dir("char", v, LRS[0], SEEDS[0]))
        cells = ["-" if x is None else ("**" + fmt(x) + "**") if lr == best[v] else fmt(x) for lr, x in zip(cols, vals)]
        print(f"| {v} | {p / 1e6:.2f}M | " + " | ".join(cells) + f" | {lr_name(best[v]) if best[v] else '-'} |"
              if p else f"| {v} | - | " + " | ".join(cells) + " | - |")
    print(f"| unigram | - | " + " | ".join(f"{uni['char']:.3f}" for _ in cols) + " | - |\n")

    print("### Character testbed: each variant at its best learning rate, 3 seeds\n")
    print("| variant | lr | " + " | ".join(f"seed {s}" for s in SEEDS) + " | mean ± sd | below unigram |")
    print("|---|---|" + "---|" * (len(SEEDS) + 2))
    summary = {}
    for v in CHAR:
        if best[v] is None:
            continue
        dirs = [run_dir("char", v, best[v], s) for s in SEEDS]
        m, sd, n = mean_sd([final_val(d) for d in dirs if finished(d)])
        summary[v] = (m, sd, n)
        print(f"| {v} | {lr_name(best[v])} | " + " | ".join(cell(d) for d in dirs) +
              f" | {m:.3f} ± {sd:.3f} (n={n}) | {uni['char'] - m:.3f} |")
    print()

    def gap(a, b):
        if a in summary and b in summary:
            return f"{summary[a][0] - summary[b][0]:+.3f}"
        return "-"
    print("### Character testbed: differences of the best-LR means (row minus column; negative = row better)\n")
    pairs = [("hrm-post", "transformer-post", "HRM vs Transformer, post-norm (the paper's Finding 1)"),
             ("hrm-pre", "transformer-pre", "HRM vs Transformer, pre-norm"),
             ("hrm-post", "unitf-post", "HRM vs UniTF, post-norm (Finding 3)"),
             ("hrm-pre", "unitf-pre", "HRM vs UniTF, pre-norm"),
             ("transformer-pre", "transformer-post", "Transformer: pre- minus post-norm"),
             ("unitf-pre", "unitf-post", "UniTF: pre- minus post-norm"),
             ("hrm-pre", "hrm-post", "HRM: pre- minus post-norm"),
             ("unitf_full-post", "unitf-post", "UniTF: full backprop minus K=2 (gradient to the embedding)"),
             ("hrm_fast_only-post", "unitf-post", "Fast module alone minus UniTF (re-injection and gating)"),
             ("hrm-post", "hrm_fast_only-post", "HRM minus the Fast module alone (the Slow module)"),
             ("unitf-post", "transformer-post", "UniTF minus Transformer, post-norm (shared vs independent weights)")]
    print("| comparison | difference |\n|---|---|")
    for a, b, what in pairs:
        print(f"| {what} | {gap(a, b)} |")
    print()
    # the post-norm HRM-vs-Transformer gap telescopes through the two controls, so each structural
    # difference gets its share: HRM - T = (HRM - Fast alone) + (Fast alone - UniTF) + (UniTF - T)
    chain = ["hrm-post", "hrm_fast_only-post", "unitf-post", "transformer-post"]
    if all(v in summary for v in chain):
        parts = [summary[a][0] - summary[b][0] for a, b in zip(chain, chain[1:])]
        print(f"Decomposition, post-norm: HRM - Transformer = {sum(parts):+.3f} = {parts[0]:+.3f} (the Slow module) "
              f"{parts[1]:+.3f} (re-injection, gating and fusion vs a plain shared stack) "
              f"{parts[2]:+.3f} (weight sharing at matched stored parameters)\n")

    print("### BPE testbed (GPT-2 BPE, d=128, 300 iterations): validation CE at the best character-level "
          "learning rate and one grid step each side (seed 1337)\n")
    print("| variant | lr / 3 | best char lr | lr x 3 |\n|---|---|---|---|")
    for v in BPE:
        if best.get(v) is None:
            continue
        i = GRID.index(best[v])
        cells = [f"{lr_name(g)}: {cell(run_dir('bpe', v, g, SEEDS[0]))}" for g in GRID[i - 1:i + 2]]
        print(f"| {v} | " + " | ".join(cells) + " |")
    print(f"| unigram | {uni['bpe']:.3f} | {uni['bpe']:.3f} | {uni['bpe']:.3f} |\n")

    if best.get("hrm-post"):
        lr = best["hrm-post"]
        print(f"### K ablation: post-norm HRM, M = 4, lr {lr_name(lr)}, seed 1337 (clipping at grad_clip * K / M)\n")
        print("| K | val CE |\n|---|---|")
        for k, extra in ((1, "-K1"), (2, ""), (4, "-K4")):
            print(f"| {k}{' (= M, full backprop)' if k == 4 else ''} | "
                  f"{cell(run_dir('char', 'hrm-post', lr, SEEDS[0], extra))} |")
        print()

    print("### Slow-module ablation (HLRole A): CE with z_H frozen at z_H0, on each HRM variant's best "
          "checkpoint at its best lr, seed 1337 (64 validation sequences)\n")
    print("| variant | CE | CE, H frozen | ΔCE |\n|---|---|---|---|")
    for v in ("hrm-post", "hrm-pre"):
        d = run_dir("char", v, best[v], SEEDS[0]) if best.get(v) else None
        if d and os.path.exists(os.path.join(d, "ckpt.pt")):
            ce, fr = slow_ablation(d)
            print(f"| {v} | {ce:.3f} | {fr:.3f} | {fr - ce:+.3f} |")
    print()
    missing = [f"{tb}/{v}" for tb, vs in (("char", CHAR), ("bpe", BPE)) for v in vs if not tried(tb, v)]
    if plots and missing:   # a fresh clone has no runs: the committed plots stay as they are
        print(f"sweep.py: not drawing docs/sweep_lr.png and docs/sweep_curves.png: no finished run for "
              f"{len(missing)} variant(s) ({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}) under "
              f"out-sweep/; the committed plots are kept", file=sys.stderr)
    elif plots:
        draw(best, uni)


def draw(best, uni):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"hrm": "C0", "transformer": "C1", "unitf": "C2", "hrm_fast_only": "C4", "unitf_full": "C3"}

    def style(v):
        arch, norm = v.rsplit("-", 1)
        return dict(color=colors[arch], linestyle="-" if norm == "post" else "--")

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=130)
    for testbed, ax in zip(("char", "bpe"), axes):
        for v in (CHAR if testbed == "char" else BPE):
            pts = [(lr, final_val(run_dir(testbed, v, lr, SEEDS[0]))) for lr in GRID]
            pts = [(lr, y) for lr, y in pts if math.isfinite(y)]
            if pts:
                ax.plot(*zip(*pts), marker="o", markersize=3, label=v, **style(v))
        ax.axhline(uni[testbed], color="0.4", linewidth=1, linestyle=":", label=f"unigram {uni[testbed]:.2f}")
        ax.set_xscale("log")
        ax.set_xlabel("peak learning rate")
        ax.set_ylabel("final validation CE")
        ax.set_title(f"{'Character' if testbed == 'char' else 'BPE'} testbed, {ITERS[testbed]} iterations: "
                     f"CE vs learning rate (seed 1337)", fontsize=9)
        ax.grid(True, linestyle=":", color="0.85")
        ax.legend(fontsize=6.5)
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "docs", "sweep_lr.png"))

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=130)
    for v in CHAR:
        if best.get(v) is None:
            continue
        logs = [load_log(d) for d in (run_dir("char", v, best[v], s) for s in SEEDS)
                if os.path.exists(os.path.join(d, "log.jsonl")) and finished(d)]
        if not logs:
            continue
        iters = sorted(set.intersection(*[{r["iter"] for r in lg} for lg in logs]))
        ys = [[{r["iter"]: r["val_loss"] for r in lg}[i] for lg in logs] for i in iters]
        mean = [sum(y) / len(y) for y in ys]
        ax.plot(iters, mean, marker="o", markersize=2.5, label=f"{v} (lr {lr_name(best[v])}, {len(logs)} seeds)", **style(v))
        ax.fill_between(iters, [min(y) for y in ys], [max(y) for y in ys], color=style(v)["color"], alpha=0.15)
    ax.axhline(uni["char"], color="0.4", linewidth=1, linestyle=":", label=f"unigram {uni['char']:.2f}")
    ax.set_yscale("log")  # keeps iteration 0 (ln 80 = 4.38) on the chart beside the final values
    ax.set_xlabel("iteration")
    ax.set_ylabel("validation CE (log scale)")
    ax.set_title("Character testbed: learning curves at each variant's best lr (band: seed min-max)", fontsize=9)
    ax.grid(True, which="both", linestyle=":", color="0.85")
    ax.legend(fontsize=6.5)
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "docs", "sweep_curves.png"))
    print("wrote docs/sweep_lr.png and docs/sweep_curves.png")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", action="store_true", help="print the tables and draw the plots only")
    ap.add_argument("--workers", type=int, default=2, help="runs at once (one thread each)")
    args = ap.parse_args()
    os.chdir(ROOT)
    for ds, hint in (("shakespeare_char", "--dataset=shakespeare_char"), ("shakespeare", "")):
        if not os.path.exists(os.path.join("data", ds, "val.bin")):
            sys.exit(f"sweep.py: error: data/{ds} not found; run python prepare.py {hint}")
    if not args.tables:
        run_all(phase1(), args.workers)
        while True:                      # grow the grid until each best is bracketed
            jobs = edge_runs()
            if not jobs:
                break
            run_all(jobs, args.workers)
        run_all(phase234(), args.workers)
    tables()


if __name__ == "__main__":
    main()
