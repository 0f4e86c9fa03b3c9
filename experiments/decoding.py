"""
The paper's deployment future work, measured on the CPU (docs/BENCHMARKS.md): self-speculative decoding on trained
character-testbed checkpoints, and the claim that shared weights "remain resident in CPU or GPU L3/L2 cache".

    python experiments/decoding.py --train         # the four checkpoints it reads (out-spec/; about 25 min on 2 cores)
    python experiments/decoding.py --speculative   # per draft depth d and draft length k: acceptance, tokens per
                                                   # check, tok/s against plain cached decoding (greedy, same text)
    python experiments/decoding.py --cache         # time per block application at batch 1 across widths, fp32 and bf16

    python experiments/decoding.py --tables        # both tables again, from experiments/logs/decoding/*.json

Both measurements run on one thread, timings interleaved and repeated (median, with min and max); leave the machine
to them. Each writes experiments/logs/decoding/<name>.json and prints its table.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

import runner
from hrmlm import engine, signals
from hrmlm.common import write_result
from model import ModelConfig, build_model
from tools.analyze import load

import bench   # the weight matrices a cached token multiplies by (bench.floor_products)

OUT, LOGS = "out-spec", os.path.join(runner.ROOT, "experiments", "logs", "decoding")
# HRM NT=12 (N=4, T=3) and UniTF M=12 at d=128 on the character testbed, lr 2.5e-3 (section 10's alive choice), 2000
# iterations, seed 7; trained normally and with Huginn's random depth (each iteration's depth uniform on 1..2D-1)
ARCHS = {"hrm": ["config/char_hrm.py", "--N=4", "--T=3"], "unitf": ["config/char_unitf_d128.py", "--M=12"]}
RECIPE = ["--learning_rate=2.5e-3", "--min_lr=2.5e-4", "--max_iters=2000", "--lr_decay_iters=2000",
          "--warmup_iters=200", "--seed=7", "--log_interval=100", "--eval_interval=500"]
DRAFTS = {"hrm": (1, 2, 3), "unitf": (1, 2, 3, 6)}   # draft depths: Slow firings of N=4 (T kept); steps of M=12
KS = (2, 4, 8)                                       # draft tokens per check
PROMPTS, PROMPT, GEN, REPS = 4, 32, 96, 3            # 32 + 96 = the testbed's block_size: the cache never crops
WIDTHS = (128, 256, 512, 1024, 2048, 4096)
SHAPES = {"hrm_nt8": dict(arch="hrm", N=2, T=4), "tf_l4": dict(arch="transformer", n_layer=4),
          "tf_l12": dict(arch="transformer", n_layer=12)}


def jobs():
    return [(os.path.join(OUT, f"{arch}{tag}"), [sys.executable, "train.py", *ARCHS[arch], *extra, *RECIPE,
                                                 f"--out_dir={os.path.join(OUT, f'{arch}{tag}')}"])
            for arch in ARCHS for tag, extra in (("", []), ("-rdepth", ["--random_depth=True"]))]


def spread(ts):
    return {"median": statistics.median(ts), "min": min(ts), "max": max(ts)}


def speculative():
    """Each checkpoint: plain cached greedy decoding and every (d, k), interleaved REPS times, the same PROMPTS prompts
    (fixed offsets of the validation split). A setting whose text differs from plain greedy's stops the run."""
    val = np.memmap(os.path.join(runner.ROOT, "data", "shakespeare_char", "val.bin"), dtype=np.uint16, mode="r")
    at = np.linspace(0, len(val) - PROMPT - 1, PROMPTS).astype(int)
    prompts = [torch.from_numpy(val[i:i + PROMPT].astype(np.int64))[None] for i in at]
    rows = []
    for out_dir, _ in jobs():
        model = load(out_dir, "ckpt.pt", "cpu", archs=("hrm", "unitf"))[0]
        arch = model.config.arch
        settings = [None] + [(d, k) for d in DRAFTS[arch] for k in KS]
        ref = [engine.generate(model, p, GEN, temperature=0) for p in prompts]
        times, stats = {s: [] for s in settings}, {s: {} for s in settings}
        for rep in range(REPS):
            for s in settings:   # interleaved: a drift in the machine's speed reaches every setting alike
                kw = {} if s is None else dict(draft_depth=s[0], draft_tokens=s[1], stats=None if rep else stats[s])
                t0 = time.perf_counter()
                outs = [engine.generate(model, p, GEN, temperature=0, **kw) for p in prompts]
                times[s].append(time.perf_counter() - t0)
                if any(not torch.equal(a, b) for a, b in zip(outs, ref)):
                    raise SystemExit(f"{out_dir}: draft {s} changed the greedy text")
        plain = statistics.median(times[None])
        for s in settings:
            st, t = stats[s], statistics.median(times[s])
            rows.append({"run": os.path.basename(out_dir), "d": s and s[0], "k": s and s[1],
                         "acceptance": st["accepted"] / st["drafted"] if s else None,
                         "tokens_per_check": (st["accepted"] + st["verifies"]) / st["verifies"] if s else None,
                         "tok_s": PROMPTS * GEN / t, "speedup": plain / t, "seconds": spread(times[s])})
        print(f"{out_dir}: {len(settings)} settings measured", file=sys.stderr, flush=True)
    return rows


def speculative_table(result):
    """The table, and per run and draft depth what a round costs in plain tokens' time (tokens per check over the
    speedup) fitted over k as k drafts plus one check: why a setting falls short of its tokens per check."""
    print("| run | val CE | draft d, k | drafts kept | tokens per check | tok/s | x plain cached | round cost |")
    print("|---|---|---|---|---|---|---|---|")
    for r in result["rows"]:
        spec = ("plain", "-", "-", "-") if r["d"] is None else (f"{r['d']}, {r['k']}", f"{r['acceptance']:.1%}",
                f"{r['tokens_per_check']:.2f}", f"{r['tokens_per_check'] / r['speedup']:.2f}")
        print(f"| {r['run']} | {runner.final_val(os.path.join(OUT, r['run'])):.4f} | {' | '.join(spec[:3])} | "
              f"{r['tok_s']:.0f} | {r['speedup']:.2f}x | {spec[3]} |")
    print("\nround cost (in plain cached tokens' time) = k x draft token + check, fitted over k:")
    for run, d in dict.fromkeys((r["run"], r["d"]) for r in result["rows"] if r["d"]):
        ks = [(r["k"], r["tokens_per_check"] / r["speedup"]) for r in result["rows"] if (r["run"], r["d"]) == (run, d)]
        draft, check = np.polyfit(*zip(*ks), 1)
        print(f"  {run}, d={d}: a drafted token {draft:.2f}, the check {check:.2f}")
    g = result["genspeed"]
    print("\nGenSpeed (d=128, untrained weights), HRM NT=12 / T-L4: " + ", ".join(
        f"{h} {g['hrm_nt12 ' + h]:.0f} / {g['tf_l4 ' + h]:.0f} tok/s = {g['hrm_nt12 ' + h] / g['tf_l4 ' + h]:.2f}x"
        for h in ("recompute", "cached")))


def genspeed():
    """The paper's GenSpeed at the testbed's size: HRM NT=12 and T-L4 (d=128, untrained: speed does not depend on the
    weights), cached and full recompute, interleaved."""
    cfgs = {"hrm_nt12": dict(arch="hrm", N=4, T=3), "tf_l4": dict(arch="transformer", n_layer=4)}
    models = {n: build_model(ModelConfig(vocab_size=80, block_size=128, n_embd=128, n_head=4, **kw)).eval()
              for n, kw in cfgs.items()}
    p, times = torch.randint(0, 80, (1, PROMPT), generator=torch.Generator().manual_seed(0)), {}
    for _ in range(REPS):
        for (n, m), cache in ((nm, c) for nm in models.items() for c in (True, False)):
            t0 = time.perf_counter()
            engine.generate(m, p, GEN, temperature=0, use_cache=cache)
            times.setdefault(f"{n} {'cached' if cache else 'recompute'}", []).append(time.perf_counter() - t0)
    return {n: GEN / statistics.median(ts) for n, ts in times.items()}


def cache_warming():
    """Time per cached token at batch 1 (prefill 64, then one token) and per block application, with the weight bytes
    that token reads (bench.floor_products: every matrix as the model multiplies by it) over its time: the effective
    bandwidth. Beside it the floor, those matrix-vector products alone, timed interleaved with the token."""
    rows = []
    for w in WIDTHS:
        for name, kw in SHAPES.items():
            model = build_model(ModelConfig(vocab_size=256, block_size=128, n_embd=w, n_head=max(2, w // 64), **kw))
            for dtype in (torch.float32, torch.bfloat16):
                rows.append({"model": name, "d": w, "dtype": str(dtype).split(".")[1],
                             **time_token(model.to(dtype).eval(), dtype, reps=20 if w <= 1024 else 5)})
                print(f"{name} d={w} {rows[-1]['dtype']}: {rows[-1]['token_ms']['median']:.2f} ms per token",
                      file=sys.stderr, flush=True)
    return rows


@torch.no_grad()
def time_token(model, dtype, reps):
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 256, (1, 65), generator=g)
    ws, products = bench.floor_products(model, prompt, "cpu", dtype, g)
    cache = engine.new_cache(model, 1, max_len=65, dtype=dtype)
    model(prompt[:, :64], cache=cache, pos=0)
    t, floor = [], []
    for _ in range(reps):   # interleaved: a drift in the machine's speed reaches both alike
        t.append(bench.timed(lambda: model(prompt[:, 64:], cache=cache, pos=64, last_only=True), "cpu", 1) * 1e3)
        floor.append(bench.timed(products, "cpu", 1) * 1e3)
    nbytes, apps = sum(x.numel() * x.element_size() for x in ws), len(engine.applications(model))
    distinct = {id(x): x for x in ws}.values()   # a shared block's matrices once
    return {"applications": apps, "weight_mb": nbytes / 2**20,
            "distinct_mb": sum(x.numel() * x.element_size() for x in distinct) / 2**20,
            "token_ms": spread(t), "floor_ms": spread(floor), "ms_per_application": statistics.median(t) / apps,
            "gb_s": nbytes / 1e6 / statistics.median(t), "floor_gb_s": nbytes / 1e6 / statistics.median(floor)}


def cache_table(rows):
    print("| model | d | dtype | weights MB (distinct) | where they fit | read per token MB | applications | "
          "ms per token (min-max) | ms per application | GB/s | floor GB/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        where = "L2 (2 MiB)" if r["distinct_mb"] <= 2 else "L3 (480 MiB)" if r["distinct_mb"] <= 480 else "DRAM"
        t = r["token_ms"]
        print(f"| {r['model']} | {r['d']} | {r['dtype']} | {r['distinct_mb']:.1f} | {where} | {r['weight_mb']:.1f} | "
              f"{r['applications']} | {t['median']:.2f} ({t['min']:.2f}-{t['max']:.2f}) | "
              f"{r['ms_per_application']:.3f} | {r['gb_s']:.1f} | {r['floor_gb_s']:.1f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", action="store_true", help="train the checkpoints, two at a time")
    ap.add_argument("--speculative", action="store_true", help="measure the speculative table and GenSpeed")
    ap.add_argument("--cache", action="store_true", help="measure the cache-warming table")
    ap.add_argument("--tables", action="store_true", help="both tables from the committed measurements")
    args = ap.parse_args()
    if not (args.train or args.speculative or args.cache or args.tables):
        ap.error("give --train, --speculative, --cache or --tables")
    if args.train:
        runner.run_all(jobs(), 2)
    torch.set_num_threads(1)   # one core, as the paper's per-core cache claim
    for flag, measure, name in ((args.speculative, lambda: {"rows": speculative(), "genspeed": genspeed()},
                                 "speculative"), (args.cache, cache_warming, "cache")):
        path = os.path.join(LOGS, f"{name}.json")
        if flag:
            result = measure()
            os.makedirs(LOGS, exist_ok=True)
            write_result(path, lambda f: json.dump(result, f, indent=1))
        if flag or (args.tables and os.path.exists(path)):
            with open(path) as f:
                (speculative_table if name == "speculative" else cache_table)(json.load(f))


if __name__ == "__main__":
    signals.main(main)
