"""
KV cache policies measured (docs/MODEL.md section 5; docs/RESULTS.md section 8): what sharing cache slots across a
recurrence's steps costs in quality against what it saves in memory, on the character testbed's trained models
(VARIANTS, at their chosen lrs after 400 and 4000 iterations, 3 seeds), read with analyze.py's kv_table. Where a policy
loses quality (UniTF under `last`), Huginn's remedy: UniTF trained through that cache (train.py --train_kv=last).

    python experiments/kv_policies.py            # rerun the runs whose readings (kv.json) are missing, read them
    python experiments/kv_policies.py --dry-run  # list the train.py commands it would rerun; run nothing
    python experiments/kv_policies.py --tables   # the table only, from the committed readings
    python experiments/kv_policies.py --speed    # time each variant's cached decoding alone; its tok/s go to the table
"""

import json
import os
import statistics
import time

import torch

import report
import runner
from arms import LONG_ITERS, SEEDS, best_lr, command, long_chosen, long_job
from hrmlm import engine, signals
from hrmlm.common import atomic_write
from model import build_model
from tools.analyze import kv_table
from tools.plan import model_config, train_settings

REMEDIES = ["unitf-post train_kv=last", "unitf-pre train_kv=last"]   # Huginn's remedy for UniTF under `last`
VARIANTS = ["hrm-post", "hrm-pre", "unitf-post", "unitf-pre", "unitf_full-post", *REMEDIES]
LONG = ["hrm-post", "hrm-pre", "unitf-post", "unitf_full-post"]   # also read after the long runs' 4000 iterations
POLICIES = {"hrm": ["full", "last", "fired"], "unitf": ["full", "last"]}
LENGTHS = [400, LONG_ITERS]


def jobs_of(v, iters):
    """(out_dir, command) of the variant's runs at its chosen lr for that length, one per seed. The remedy runs
    (400 iterations only) are UniTF post-norm's at its chosen lr, trained with train.py's --train_kv=last."""
    base = v.split()[0]
    lr = best_lr("char", base) if iters == 400 else long_chosen(base) if v in LONG else None
    if lr is None:
        return []
    if v in REMEDIES:
        return [command("char", base, lr, s, ["--train_kv=last"], out="out-trainkv") for s in SEEDS]
    return [command("char", v, lr, s) if iters == 400 else long_job(v, lr, s) for s in SEEDS]


PROBES = (3, 10)   # the remedy at these multiples of the lr too (seed 1337): is a stall the lr's?


def probe_jobs(v):
    lr = best_lr("char", v.split()[0]) if v in REMEDIES else None
    return [] if lr is None else [command("char", v.split()[0], float(f"{lr * f:.3g}"), SEEDS[0],
                                                ["--train_kv=last"], out="out-trainkv") for f in PROBES]


def runs(v, iters):
    """The variant's finished runs (their logs committed) for that length."""
    return [(d, cmd) for d, cmd in jobs_of(v, iters) if runner.finished(d)]


def reading(out_dir, read=False):
    """The committed kv.json of a run, or None; read: where it is missing, every policy read from the run's last
    checkpoint and committed."""
    def compute(model, batches):
        return {"rows": kv_table(model, batches, "cpu", POLICIES[model.config.arch])}
    return report.reading(out_dir, "kv.json", compute if read else None, ("hrm", "unitf"), (("rows", (list,)),))


SPEED = os.path.join(runner.ROOT, "experiments", "logs", "kv_speed.json")


def speed(reps=5, tokens=None, prompt=16):
    """Cached greedy tok/s (batch 1, one thread) of fresh weights of each variant's shape under each of its policies,
    the median of reps rounds that each time every one once, written to SPEED. tokens: block_size - prompt at most
    (past it each token would be a full forward, not a cached step)."""
    models = {}
    for v in VARIANTS:
        torch.manual_seed(0)
        models[v] = build_model(model_config(train_settings(jobs_of(v, 400)[0][1][2:]))).eval()
    room = min(m.config.block_size for m in models.values()) - prompt
    tokens = room if tokens is None else tokens
    if tokens > room:
        raise ValueError(f"{prompt} + {tokens} tokens outgrow block_size {room + prompt}: the tokens past it would "
                         "each be a full forward, not a cached step")
    g = torch.Generator().manual_seed(0)
    x = {v: torch.randint(0, m.config.vocab_size, (1, prompt), generator=g) for v, m in models.items()}
    times = {(v, kv): [] for v, m in models.items() for kv in POLICIES[m.config.arch]}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            for r in range(reps + 1):   # round 0 warms up: not counted
                for v, kv in times:
                    t0 = time.perf_counter()
                    engine.generate(models[v], x[v], tokens, temperature=0, kv=kv)
                    if r:
                        times[v, kv].append(time.perf_counter() - t0)
                print(f"round {r}/{reps} timed", flush=True)
    finally:   # as it was: a caller's (a test's) later work keeps its threads
        torch.set_num_threads(threads)
    rows = {v: {kv: tokens / statistics.median(ts) for (w, kv), ts in times.items() if w == v} for v in models}
    with atomic_write(SPEED) as f:
        json.dump({"threads": 1, "reps": reps, "tokens": tokens, "prompt": prompt, "tok_s": rows}, f, indent=1)


def missing():
    """Every run whose reading is missing: the 400-iteration ones first (minutes each, not hours), then the long ones
    seed by seed, so that a stopped session leaves each variant read at as many seeds as the others."""
    jobs = [j for v in VARIANTS for j in runs(v, 400)]
    jobs += [j for v in REMEDIES for j in probe_jobs(v) if runner.finished(j[0])]
    jobs += [j for n in LENGTHS[1:] for i in range(len(SEEDS)) for v in VARIANTS for j in jobs_of(v, n)[i:i + 1]
             if runner.finished(j[0])]
    return [(d, cmd) for d, cmd in jobs if reading(d) is None]


def table():
    """Markdown: per variant and length, each policy's seed-mean decoding CE, its paired difference from the
    exact cache (95% interval, p), greedy agreement, bytes per token and tok/s."""
    fast = runner.committed_json(SPEED, (("tok_s", (dict,)),)).get("tok_s", {}) if os.path.exists(SPEED) else {}
    lines = ["### KV cache policies: decoding val CE by policy (mean ± sd over seeds; difference from `full` paired "
             "by seed, 95% interval and p; cached tok/s from --speed)\n",
             "| variant | iters | kv | seeds | decoding CE | vs full | greedy agreement | KV bytes/token | cached tok/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for v in VARIANTS:
        for n in LENGTHS:
            by = {runner.seed_of(d): {r["kv"]: r for r in k["rows"]} for d, _ in runs(v, n) if (k := reading(d))}
            if not by:
                continue
            for kv in next(iter(by.values())):
                ce = {s: rows[kv]["ce"] for s, rows in by.items()}
                m, sd, k = report.mean_sd(list(ce.values()))
                d = None if kv == "full" else report.paired(ce, {s: rows["full"]["ce"] for s, rows in by.items()})
                diff = "-" if kv == "full" else "too few seeds" if d is None else \
                    f"{d.diff:+.4f} [{d.lo:+.4f}, {d.hi:+.4f}], p = {report.p_text(d.p)}"   # 4 places: small effects
                agree = report.mean_sd([rows[kv]["greedy_agree"] for rows in by.values()])[0]
                tok_s = f"{fast[v][kv]:.0f}" if kv in fast.get(v, {}) else "-"
                lines.append(f"| {v} | {n} | {kv} | {k} | {m:.4f} ± {sd:.4f} | {diff} | {agree:.3f} | "
                             f"{next(iter(by.values()))[kv]['kv_bytes_per_token']} | {tok_s} |")
    if len(lines) == 3:
        lines.append("| (no readings yet: run python experiments/kv_policies.py) | | | | | | | | |")
    return "\n".join(lines) + "\n" + remedy_line()


def remedy_line():
    """Does training through the shared cache recover the exact model's quality at equal tokens? Each remedy's
    decoding CE under `last` against the same seeds' standard runs decoded exactly, paired by seed."""
    lines = []
    for remedy in REMEDIES:
        base = remedy.split()[0]
        ce = [{runner.seed_of(d): next(r["ce"] for r in k["rows"] if r["kv"] == kv)
               for d, _ in runs(v, 400) if (k := reading(d))} for v, kv in ((remedy, "last"), (base, "full"))]
        d = report.paired(*ce)
        if d is not None:
            lines.append(f"- {remedy} decoded under `last`, against {base} decoded exactly (same seeds, paired): "
                         f"{d.diff:+.4f} [{d.lo:+.4f}, {d.hi:+.4f}], p = {report.p_text(d.p)} ({d.n} seeds)")
        for f, (out_dir, _) in zip(PROBES, probe_jobs(remedy)):
            if k := reading(out_dir):
                last = next(r["ce"] for r in k["rows"] if r["kv"] == "last")
                lines.append(f"  - at {f}x its lr (seed {SEEDS[0]}): decoding CE under `last` {last:.4f}")
    return "".join("\n" + line for line in lines) + ("\n" if lines else "")


def main():
    ap = runner.runner_parser(__doc__, "print the table only, from the committed readings")
    ap.add_argument("--speed", action="store_true", help="time each variant's cached decoding (one thread; leave "
                    "the machine to it), write experiments/logs/kv_speed.json and print the table; train and read nothing")
    args = ap.parse_args()
    os.chdir(runner.ROOT)
    if args.speed and (args.tables or args.dry_run):
        ap.error("--speed times decoding and prints the table: give it alone")
    train = [j for v in REMEDIES for j in jobs_of(v, 400) + probe_jobs(v)]   # the remedy's runs, trained here
    if args.dry_run:
        return runner.dry_run(train, missing())
    if not args.tables:
        runner.require_data([("shakespeare_char", "--dataset=shakespeare_char")])
    if args.speed:
        speed()
    elif not args.tables:
        runner.run_all(train, args.workers)
        jobs = missing()
        print(f"{len(jobs)} runs to rerun and read", flush=True)
        for i in range(0, len(jobs), args.workers):   # read each group as it finishes, not all at the end
            group = [(d, c) for d, c in jobs[i:i + args.workers] if reading(d) is None]   # another runner's since
            runner.rerun_and_read(group, args.workers, lambda d: reading(d, read=True))
    print(table())


if __name__ == "__main__":
    signals.main(main)
