"""
Beyond the paper (docs/RESULTS.md section 7): the paper's own future work for its "gradient coverage bottleneck" and
its KV cache (arms.BEYOND; docs/MODEL.md section 8), run on the character testbed at matched budget. Every run is
config/char_hrm.py with N=4, T=2 (M = 8: 4 Slow firings for hierarchical BPTT to chain over) for 300 iterations, seeds
1337, 42, 2024; full-ckpt has full's gradients (tested), so one seed shows its time and memory.

    python experiments/beyond_paper.py              # all runs (19 x 300 iterations; ~40 min on 2 cores), then the table
    python experiments/beyond_paper.py --dry-run    # list the train.py commands still to run; run nothing
    python experiments/beyond_paper.py --tables     # the table and plot only, from the committed logs alone

"iter MB" and "KV cache MB" are measured once per run in a fresh process (measure.json beside its log).
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys

import torch

import report
import runner
from arms import BEYOND as VARIANTS, BEYOND_OUT as OUT, SEEDS, beyond_command
from hrmlm import engine, signals
from hrmlm.checkpoint import read_info
from hrmlm.common import UserError, write_result
from model import ModelConfig, build_model
from report import heading, mean_sd
from runner import ROOT, finished, final_val


def measure_worker(out_dir):
    """In a fresh process: one training iteration of the run's model (from its checkpoint's arguments, random
    weights: memory does not depend on them) at its batch shape; the peak it adds, as bench.py measures."""
    from bench import current_mb, peak_mb, reset_peak, timed   # bench.py's meters, for the measuring process alone
    torch.set_num_threads(1)
    ck = read_info(runner.resume_state(out_dir))
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
    path = report.reading_path(out_dir, "measure.json")
    if not os.path.exists(path):
        if not runner.resume_state(out_dir):
            return None
        env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536")
        p = subprocess.run([sys.executable, os.path.abspath(__file__), f"--_measure={out_dir}"],
                           capture_output=True, text=True, env=env, cwd=ROOT)
        if p.returncode != 0:
            raise RuntimeError(f"measuring {out_dir} failed:\n{p.stderr[-2000:]}")
        write_result(path, lambda f: f.write(p.stdout.strip().splitlines()[-1]))
    return runner.committed_json(path)


def tables(args):
    heading(f"Beyond the paper: character testbed, HRM N=4, T=2 (M=8), d=128, {args.max_iters} iterations, lr 3e-3, "
            f"seeds {', '.join(map(str, args.seeds))}", "variant", "what", "val CE (mean ± sd)",
            "vs paper K=2 (paired by seed: 95% interval, p)", "MFLOPs/token", "iter MB", "ms/iter", "KV cache MB",
            "params")
    rows, by_seed = {}, {}
    for v in args.variants:
        dirs = [beyond_command(v, s, args.out)[0] for s in args.seeds]
        m, sd, n = mean_sd([final_val(d) for d in dirs])
        by_seed[v] = {s: final_val(d) for s, d in zip(args.seeds, dirs) if math.isfinite(final_val(d))}
        meas = next((r for r in (measured(d) for d in dirs if finished(d)) if r), None)
        fs = [f for f in map(runner.facts, dirs) if f]
        ms = [f["ms_per_iter_median"] for f in fs if f.get("ms_per_iter_median")]
        fl = next((f["train_flops_per_token"] for f in fs if "train_flops_per_token" in f), None)
        rows[v] = (m, sd, n, meas)
        base = rows.get("paper-K2", (math.inf,))[0]
        ce = "-" if n == 0 else f"{m:.3f} ± {sd:.3f} (n={n})"
        d = report.paired(by_seed[v], by_seed.get("paper-K2", {})) if v != "paper-K2" else None
        # one seed (full-ckpt): the difference alone
        diff = str(d) if d else f"{m - base:+.3f}" if n and math.isfinite(base) and v != "paper-K2" else "-"
        print(f"| {v} | {VARIANTS[v][1]} | {ce} | {diff} | {f'{fl / 1e6:.1f}' if fl else '-'} | " +
              (f"{meas['iter_mb']:.1f} | " if meas else "- | ") + (f"{statistics.median(ms):.0f} | " if ms else "- | ") +
              (f"{meas['kv_cache_mb']:.2f} | {meas['params'] / 1e6:.3f}M |" if meas else "- | - |"))
    print("\niter MB: peak memory one training iteration adds (fresh process, batch 8 x 128); ms/iter: median of "
          "the runs' median logged values, two runs sharing 2 cores; KV cache: 128 positions, float32, batch 1.\n")
    missing = [v for v in args.variants if not any(finished(beyond_command(v, s, args.out)[0]) for s in args.seeds)]
    if report.drawable("beyond_paper.png", missing, "no committed run of"):
        draw(args, rows)


def draw(args, rows):
    fig, (ax, bx) = report.figure(2)
    for c, v in enumerate(args.variants):
        logs = [runner.run_log(d) for d in (beyond_command(v, s, args.out)[0] for s in args.seeds) if finished(d)]
        if not logs:
            continue
        report.band(ax, *report.seed_curve(logs), marker="o", markersize=2.5, color=f"C{c}",
                    label=f"{v} ({len(logs)} seeds)")
        m, sd, n, meas = rows[v]
        if meas and n:
            bx.errorbar(meas["iter_mb"], m, yerr=sd, fmt="o", color=f"C{c}", capsize=3, label=v)
    ax.set_yscale("log")
    report.dress(ax, "iteration", "validation CE (log scale)", "HRM M=8 on the character testbed (band: seed min-max)")
    report.dress(bx, "memory one training iteration adds (MB)", "final validation CE (mean ± sd)",
                 "Quality against training memory")
    report.finish(fig, (ax, bx), "beyond_paper.png")


def main():
    ap = runner.runner_parser(__doc__, "print the table and draw the plot only")
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
        raise UserError(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    # seed-major, so every variant has a run early; full-ckpt has full's gradients (tested), so one seed
    # shows its time and memory, and the quality column is full's
    jobs = [beyond_command(v, s, args.out, args.max_iters, args.data_dir) for s in args.seeds for v in args.variants
            if v != "full-ckpt" or s == args.seeds[0]]
    if args.dry_run:
        return runner.dry_run(jobs)
    if not args.tables:
        if not os.path.exists(os.path.join(args.data_dir, "shakespeare_char", "val.bin")):
            raise UserError(f"{args.data_dir}/shakespeare_char not found; run python prepare.py --dataset=shakespeare_char")
        runner.run_all(jobs, args.workers)
    tables(args)


if __name__ == "__main__":
    signals.main(main)
