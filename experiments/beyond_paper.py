"""
Beyond the paper (docs/RESULTS.md): the paper's own future work for its "gradient coverage bottleneck"
and its KV cache, run on the character testbed at matched budget. One command runs what is missing,
skipping finished runs (so it resumes after a stop), then prints the table and draws the plot from the
committed logs (experiments/logs/beyond/: each finished run's log.jsonl, run.json and measure.json):

    python prepare.py --dataset=shakespeare_char
    python experiments/beyond_paper.py              # all runs (19 x 300 iterations, 2 at a time; ~40 min), then the table
    python experiments/beyond_paper.py --dry-run    # list the train.py commands still to run; run nothing
    python experiments/beyond_paper.py --tables     # the table and plot only, from the committed logs alone

Every run is config/char_hrm.py (d=128, lr 3e-3, batch 8 x 128 characters) for 300 iterations with N=4,
T=2: M = 8 instead of the config's 4, so that a pass has 4 Slow firings for hierarchical BPTT to chain
over. Seeds 1337, 42, 2024. The variants (model.py options, docs/MODEL.md section 8):
  paper-K2    the paper's window: the last K = 2 of M = 8 steps carry gradient
  full        full BPTT, K = M = 8
  full-ckpt   full BPTT with grad_ckpt: the same gradients (so the same CE, to float rounding), flat memory;
              one seed only, for its time and memory
  kslow4      K = 2 and K_slow = 4: gradient along the z_H chain over all 4 Slow firings ("hierarchical BPTT")
  hybrid4     fast_attn_steps = 4: the Fast module attends only on the 4 Slow-firing steps
              (KV cache: 1+8+4 -> 1+4+4 applications)
  rnn         fast_attn_steps = 0: no Fast step attends, the paper's RNN-style position-wise variant
  chunked4    chunked BPTT with C = 4: S = 2 passes of N = 2, T = 2 with K = 4 (a loss per chunk, detached);
              train.py backpropagates the S losses together, so its memory is full BPTT's (grad_ckpt would
              flatten it, as for full-ckpt): chunking changes the objective, not the memory
Clipping follows train.py (grad_clip * K / M of a pass): 0.25 for K = 2, 1.0 for full and chunked runs.
Memory and time: "iter MB" is what one training iteration adds to the peak resident memory of a fresh
process (bench.py's method: glibc returns freed blocks, so the peak counts live tensors), measured once
per variant from its checkpoint's model arguments; "ms/iter" is the median of the runs' logged values
(two runs share the 2 cores, one thread each); "KV cache" holds block_size = 128 positions, float32.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stats  # noqa: E402
import sweep  # noqa: E402  (its runner)

OUT = "out-beyond"
SEEDS = [1337, 42, 2024]
HRM8 = ["--N=4", "--T=2"]                    # M = 8 for every variant but the chunked one (2 passes of 4)
VARIANTS = {  # name: (train.py overrides on config/char_hrm.py, what it is)
    "paper-K2": (HRM8 + ["--K=2"], "the paper: last K=2 of M=8 steps"),
    "full": (HRM8 + ["--K=8"], "full BPTT, K=M=8"),
    "full-ckpt": (HRM8 + ["--K=8", "--grad_ckpt=True"], "full BPTT, grad_ckpt"),
    "kslow4": (HRM8 + ["--K=2", "--K_slow=4"], "K=2, K_slow=4: all Slow firings"),
    "hybrid4": (HRM8 + ["--K=2", "--fast_attn_steps=4"], "K=2, 4 of 8 Fast steps attend"),
    "rnn": (HRM8 + ["--K=2", "--fast_attn_steps=0"], "K=2, no Fast step attends"),
    "chunked4": (["--N=2", "--T=2", "--S=2", "--K=4"], "chunked BPTT, C=4: S=2 passes of 4, K=4"),
}


def run_dir(out, variant, seed):
    return os.path.join(out, variant, f"s{seed}")


finished, final_val = sweep.finished, sweep.final_val   # from the committed logs (experiments/logs/beyond/)


def command(args, variant, seed):
    out_dir = run_dir(args.out, variant, seed)
    n = args.max_iters
    cmd = [sys.executable, "train.py", "config/char_hrm.py", *VARIANTS[variant][0], f"--max_iters={n}",
           f"--lr_decay_iters={n}", f"--warmup_iters={max(1, n // 10)}", f"--eval_interval={max(1, n // 4)}",
           f"--log_interval={max(1, n // 8)}", f"--seed={seed}", f"--out_dir={out_dir}", f"--data_dir={args.data_dir}"]
    return out_dir, cmd


# --- memory and time ---------------------------------------------------------------------------------

def measure_worker(out_dir):
    """In a fresh process: one training iteration of the run's model (from its checkpoint's arguments, random
    weights: memory does not depend on them) at its batch shape; the peak it adds, as bench.py measures."""
    import torch
    from hrmlm import engine
    from bench import current_mb, peak_mb, reset_peak
    from hrmlm.common import timed
    from model import ModelConfig, build_model
    torch.set_num_threads(1)
    from hrmlm.checkpoint import read_info
    ck = read_info(os.path.join(out_dir, sweep.last_ckpt(out_dir)))
    cfg, args = ck["config"], ck["model_args"]
    torch.manual_seed(0)
    model = build_model(ModelConfig(**args)).train()
    x = torch.randint(0, args["vocab_size"], (cfg["batch_size"], cfg["block_size"]))

    def step():
        _, loss = model(x, x)
        loss.backward()
        model.zero_grad(set_to_none=True)
    step()                                   # warm-up: allocates the gradients once
    reset_peak("cpu")
    base = current_mb("cpu")
    step()
    iter_mb = peak_mb("cpu") - base
    return {"iter_mb": iter_mb, "ms_iter_alone": timed(step, "cpu", 3) * 1000,
            "kv_cache_mb": engine.kv_cache_bytes(model, cfg["block_size"]) / 2**20, "params": model.num_params()}


def measured(out_dir):
    """measure_worker's result, computed once in a separate process from the run's checkpoint and committed
    beside its log (experiments/logs/beyond/<variant>/s<seed>/measure.json); None without either."""
    path = os.path.join(ROOT, sweep.log_dir(out_dir), "measure.json")
    if not os.path.exists(path):
        if not sweep.last_ckpt(out_dir):
            return None
        env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536")
        p = subprocess.run([sys.executable, os.path.abspath(__file__), f"--_measure={out_dir}"],
                           capture_output=True, text=True, env=env, cwd=ROOT)
        if p.returncode != 0:
            raise RuntimeError(f"measuring {out_dir} failed:\n{p.stderr[-2000:]}")
        with open(path, "w") as f:
            f.write(p.stdout.strip().splitlines()[-1])
    return sweep.committed_json(path)


# --- table and plot ------------------------------------------------------------------------------------

mean_sd = sweep.mean_sd   # mean, sample sd and count of the finite values


def tables(args, plots=True):
    iters = args.max_iters
    print(f"### Beyond the paper: character testbed, HRM N=4, T=2 (M=8), d=128, {iters} iterations, lr 3e-3, "
          f"seeds {', '.join(map(str, args.seeds))}\n")
    print("| variant | what | val CE (mean ± sd) | vs paper K=2 (paired by seed: 95% interval, p) | MFLOPs/token | "
          "iter MB | ms/iter | KV cache MB | params |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows, by_seed = {}, {}
    for v in args.variants:
        dirs = [run_dir(args.out, v, s) for s in args.seeds]
        m, sd, n = mean_sd([final_val(d) for d in dirs])
        by_seed[v] = {s: final_val(d) for s, d in zip(args.seeds, dirs) if math.isfinite(final_val(d))}
        meas = next((r for r in (measured(d) for d in dirs if finished(d)) if r), None)
        ms = [f["ms_per_iter_median"] for f in map(sweep.facts, dirs) if f and f.get("ms_per_iter_median")]
        rows[v] = (m, sd, n, meas)
        base = rows.get("paper-K2", (math.inf,))[0]
        ce = "-" if n == 0 else f"{m:.3f} ± {sd:.3f} (n={n})"
        diff = f"{m - base:+.3f}" if n and math.isfinite(base) and v != "paper-K2" else "-"
        d = stats.paired(by_seed[v], by_seed.get("paper-K2", {})) if v != "paper-K2" else None
        if d:   # one seed (full-ckpt): the difference alone
            diff = str(d)
        fl = next((f["train_flops_per_token"] for f in map(sweep.facts, dirs) if f and "train_flops_per_token" in f), None)
        print(f"| {v} | {VARIANTS[v][1]} | {ce} | {diff} | {f'{fl / 1e6:.1f}' if fl else '-'} | " +
              (f"{meas['iter_mb']:.1f} | " if meas else "- | ") + (f"{statistics.median(ms):.0f} | " if ms else "- | ") +
              (f"{meas['kv_cache_mb']:.2f} | {meas['params'] / 1e6:.3f}M |" if meas else "- | - |"))
    print("\niter MB: peak memory one training iteration adds (fresh process, batch 8 x 128); ms/iter: median of "
          "the runs' median logged values, two runs sharing 2 cores; KV cache: 128 positions, float32, batch 1.\n")
    missing = [v for v in args.variants if not any(finished(run_dir(args.out, v, s)) for s in args.seeds)]
    if plots and missing:   # never overwrite the committed plot with a partial one
        print(f"beyond_paper.py: not drawing docs/beyond_paper.png: no committed run of {', '.join(missing)}; "
              f"the committed plot is kept", file=sys.stderr)
    elif plots:
        draw(args, rows)


def draw(args, rows):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=130)
    for c, v in enumerate(args.variants):
        logs = [sweep.run_log(d) for d in (run_dir(args.out, v, s) for s in args.seeds) if finished(d)]
        if not logs:
            continue
        its = sorted(set.intersection(*[{r["iter"] for r in lg} for lg in logs]))
        ys = [[{r["iter"]: r["val_loss"] for r in lg}[i] for lg in logs] for i in its]
        ax.plot(its, [sum(y) / len(y) for y in ys], marker="o", markersize=2.5, color=f"C{c}",
                label=f"{v} ({len(logs)} seeds)")
        ax.fill_between(its, [min(y) for y in ys], [max(y) for y in ys], color=f"C{c}", alpha=0.15)
        m, sd, n, meas = rows[v]
        if meas and n:
            bx.errorbar(meas["iter_mb"], m, yerr=sd, fmt="o", color=f"C{c}", capsize=3, label=v)
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel("validation CE (log scale)")
    ax.set_title("HRM M=8 on the character testbed (band: seed min-max)", fontsize=9)
    bx.set_xlabel("memory one training iteration adds (MB)")
    bx.set_ylabel("final validation CE (mean ± sd)")
    bx.set_title("Quality against training memory", fontsize=9)
    sweep.finish(fig, (ax, bx), "beyond_paper.png")


def main():
    ap = sweep.runner_parser(__doc__, "print the table and draw the plot only")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--max_iters", type=int, default=300, help="iterations per run (the same for every variant)")
    ap.add_argument("--out", default=OUT, help="every run's out_dir is under here")
    ap.add_argument("--data_dir", default="data", help="where prepare.py wrote shakespeare_char")
    ap.add_argument("--_measure", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._measure:
        print(json.dumps(measure_worker(args._measure)))
        return
    os.chdir(ROOT)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    args.seeds = [int(s) for s in args.seeds.split(",")]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        from hrmlm.common import fail   # here, not at the top: --tables needs no torch
        fail(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    # seed-major, so every variant has a run early; full-ckpt has full's gradients (tested), so one seed
    # shows its time and memory, and the quality column is full's
    jobs = [command(args, v, s) for s in args.seeds for v in args.variants if v != "full-ckpt" or s == args.seeds[0]]
    if args.dry_run:
        sweep.dry_run(jobs)
        return
    if not args.tables:
        if not os.path.exists(os.path.join(args.data_dir, "shakespeare_char", "val.bin")):
            from hrmlm.common import fail
            fail(f"{args.data_dir}/shakespeare_char not found; run python prepare.py --dataset=shakespeare_char")
        sweep.run_all(jobs, args.workers)
    tables(args)


if __name__ == "__main__":
    from hrmlm.signals import exit_on_signals   # Ctrl-C, SIGTERM, SIGHUP: one line in every phase
    exit_on_signals()
    main()
