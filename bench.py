"""
The paper's Latency and GenSpeed tables, plus cached decoding and training throughput, measured side by side in
one run on this machine.

    python bench.py --preset=cpu --json=bench.json          # a 2-core CPU, a few minutes (the default on a CPU)
    python bench.py --preset=paper                           # d=4096, seq 1024, bf16: for a GPU (its default there)
    python bench.py --preset=cpu --models=hrm_nt12,tf_l4     # a subset
    python bench.py --preset=cpu --models=hrm_nt12 --compile # torch.compile'd forward (a minute per model)
    python bench.py --preset=cpu --models=beyond             # the options beyond the paper (docs/MODEL.md section 8)

Each phase of each model runs in a fresh process: on the CPU its peak resident memory is that model's alone
(on CUDA: torch.cuda.max_memory_allocated).
  - latency: one forward of one sequence (batch 1, no cache), median of reps
  - generation: the paper's protocol (prompt 64, generate 128, batch 1, greedy), with full recompute (as the paper
    measured) and with the cache; bound: what cached/recompute would be if a cached token cost only its weight
    matrix-vector products (each weight read once per block application: the floor at batch 1)
  - training: one forward+backward with the model's K (no optimiser step); MFU from the FLOPs that really run
    (hrmlm/common.py) against a matmul peak measured in this run (CUDA: also the datasheet bf16 peak), and beside
    it, labelled, the MFU of the paper's FLOP model (S(M + 2K) C for HRM, (M + 2K) C for UniTF, 3 L C for the
    Transformer, C = B n (32 d^2 + 4 n d)), which leaves out HRM's gates, Slow module and no-grad steps' extras.
Model weights are random: latency and memory do not depend on their values.
"""

from hrmlm import signals

if __name__ == "__main__":   # first of all (torch takes seconds to import): a signal is one line, at once
    signals.guard("bench.py")

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from torch.autograd import DeviceType  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from hrmlm import common, engine  # noqa: E402
from hrmlm.common import (DTYPES, HelpFormatter, UserError, check_output_path, counted_train_flops,  # noqa: E402
                          datasheet_tflops, measure_peak_tflops, precision_context, train_flops, usable_device)
from model import ModelConfig, build_model  # noqa: E402


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)   # this device's work: bench.py --device=cuda:1 times cuda:1


def timed(fn, device, reps, warmup=None):
    """Median wall time of fn() over reps runs, after one warm-up run (of warmup, else fn)."""
    (warmup or fn)()
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


V = 50257
# the paper's Latency/GenSpeed rows (d=4096 unless noted)
PAPER = {
    "tf_l2": dict(arch="transformer", n_layer=2), "tf_l4": dict(arch="transformer", n_layer=4),
    "tf_l12": dict(arch="transformer", n_layer=12),
    "hrm_nt4": dict(arch="hrm", N=2, T=2, K=2), "hrm_nt8": dict(arch="hrm", N=2, T=4, K=2),
    "hrm_nt12": dict(arch="hrm", N=4, T=3, K=2), "hrm_nt36": dict(arch="hrm", N=12, T=3, K=2, n_embd=2048),
    "unitf_m12": dict(arch="unitf", M=12, K=2),
}
# the options beyond the paper (docs/MODEL.md section 8), measured only when named (--models=beyond: all of them)
BEYOND = {
    "hrm_nt12_full": dict(arch="hrm", N=4, T=3, K=12),                           # full BPTT, K = M
    "hrm_nt12_gradckpt_full": dict(arch="hrm", N=4, T=3, K=12, grad_ckpt=True),  # the same, steps recomputed
    "hrm_nt12_kslow4": dict(arch="hrm", N=4, T=3, K=2, K_slow=4),                # gradient along all 4 firings
    "hrm_nt12_hybrid4": dict(arch="hrm", N=4, T=3, K=2, fast_attn_steps=4),      # 4 of 12 Fast steps attend
    "hrm_nt12_rnn": dict(arch="hrm", N=4, T=3, K=2, fast_attn_steps=0),          # no Fast step attends
    "hrm_m48_k2": dict(arch="hrm", N=24, T=2, K=2),                              # M = 48: the paper's window
    "hrm_m48_full": dict(arch="hrm", N=24, T=2, K=48),
    "hrm_m48_gradckpt_full": dict(arch="hrm", N=24, T=2, K=48, grad_ckpt=True),
}
ROWS = {**PAPER, **BEYOND}
PRESETS = {   # the paper's setting (hrm_nt36 at d=2048); training at batch 1 (a worker's spec may set train_batch)
    "paper": dict(d=4096, n_head=16, seq=1024, vocab=V, dtype="bfloat16", reps=20, gen_reps=5, train_reps=5),
    # cpu: minutes on 2 cores; the vocabulary scales with d (50257 * 256/4096 = 3141) so that the tied output
    # layer weighs what it does at the paper's size (0.77 of a block) instead of 12 blocks. tiny: seconds, for tests
    "cpu": dict(d=256, n_head=4, seq=256, vocab=V * 256 // 4096, dtype="float32", reps=3, gen_reps=5, train_reps=2),
    "tiny": dict(d=64, n_head=4, seq=64, vocab=V * 64 // 4096, dtype="float32", reps=1, gen_reps=1, train_reps=1),
}
PROMPT, GEN = 64, 128


def model_config(name, preset, **override):
    p = PRESETS[preset]
    kw = dict(ROWS[name])
    d = kw.pop("n_embd", 4096) * p["d"] // 4096
    kw.update(override)
    return ModelConfig(vocab_size=kw.pop("vocab_size", p["vocab"]), block_size=max(p["seq"], PROMPT + GEN),
                       n_embd=d, n_head=p["n_head"], **kw)


def reset_peak(device):
    """Start a new peak: CUDA's counter, or on Linux the process's RSS high-water mark (VmHWM)."""
    if device.startswith("cuda"):
        return torch.cuda.reset_peak_memory_stats(device)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_mb(device):
    """Peak since the last reset_peak (CUDA: allocated tensors; CPU: resident memory)."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(device) / 2**20
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 2**10  # kB


def current_mb(device):
    if device.startswith("cuda"):
        return torch.cuda.memory_allocated(device) / 2**20
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def policy_of(model, kv):
    """kv where the model has that cache policy, else the exact one (a Transformer; fired for UniTF)."""
    try:
        engine.cache_slots(model, kv)
    except ValueError:
        return "full"
    return kv


def floor_products(model, prompt, device, dtype, g):
    """The floor under cached decoding: the weight matrices one cached step multiplies by, in order (every nn.Linear
    as the model calls it, a shared block's once per application, then the tied output layer), and a function
    that runs exactly those matrix-vector products, nothing else."""
    ws, cache = [], engine.new_cache(model, 1, max_len=prompt.size(1))
    with torch.no_grad():
        model(prompt[:, :-1], cache=cache)
        hooks = [m.register_forward_hook(lambda m, inp, out: ws.append(m.weight))
                 for m in model.modules() if isinstance(m, torch.nn.Linear)]
        model(prompt[:, -1:], cache=cache, pos=prompt.size(1) - 1, last_only=True)
    for h in hooks:
        h.remove()
    ws.append(model.wte.weight)
    xs = {n: torch.randn(1, n, generator=g).to(device=device, dtype=dtype) for n in {w.size(1) for w in ws}}
    return ws, torch.no_grad()(lambda: [torch.nn.functional.linear(xs[w.size(1)], w) for w in ws])


def measure_inference(model, cfg, p, device, dtype, g, spec):
    """Latency, generation (recompute and cached, under cache policy spec["kv"] where the model has it, else the
    exact one), the matvec floor under cached decoding, the KV cache."""
    kv = policy_of(model, spec.get("kv", "full"))
    x = torch.randint(0, cfg.vocab_size, (1, p["seq"]), generator=g).to(device)
    prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT), generator=g).to(device)
    ws, products = floor_products(model, prompt, device, dtype, g)
    if spec.get("compile"):  # every forward below compiled, recompute and cached alike; warm-ups compile
        model.forward = torch.compile(model.forward, dynamic=True)
    with torch.no_grad():
        out = {"kv": kv, "latency_ms": timed(lambda: model(x), device, p["reps"]) * 1000}
    if device.startswith("cuda"):
        out["peak_mem_mb"] = peak_mb(device)

    def gen(use_cache, n=GEN):
        return engine.generate(model, prompt, n, temperature=0, use_cache=use_cache, kv=kv if use_cache else "full")
    gen(False, 8), gen(True, 8)   # warm-ups (compiling, where compiled)
    rounds = [[timed(products, device, 5)] + [timed(lambda: gen(c), device, 1, lambda: None) for c in (False, True)]
              for _ in range(p["gen_reps"])]   # interleaved: the floor and both generations of the same minutes
    floor, recompute, cached = (statistics.median(r[i] for r in rounds) for i in range(3))
    out.update(gen_tok_s_recompute=GEN / recompute, gen_tok_s_cached=GEN / cached, rounds=[
        {"floor_ms": f * 1e3, "gen_speedup": r / c, "gen_speedup_bound": r / GEN / f} for f, r, c in rounds])
    before = current_mb(device)   # on CUDA what the cache allocates; on the CPU (RSS is too coarse) its bytes
    cache = engine.new_cache(model, 1, max_len=PROMPT + GEN, dtype=dtype, kv=kv)
    return {**out, "gen_speedup": out["gen_tok_s_cached"] / out["gen_tok_s_recompute"],
            "decode_matvec_ms": floor * 1000, "decode_weight_mb": sum(w.numel() * w.element_size() for w in ws) / 2**20,
            "gen_speedup_bound": (recompute / GEN) / floor,
            "kv_cache_mb": current_mb(device) - before if device.startswith("cuda") else cache.nbytes() / 2**20,
            "kv_cache_formula_mb": engine.kv_cache_bytes(model, PROMPT + GEN, dtype=dtype, kv=kv) / 2**20}


def profile_decoding(model, cfg, p, device, dtype, g, spec, n_prof=32):
    """--profile: where a cached token's time goes. One-token steps timed alternately with the floor (the same
    weight matrix-vector products back to back), so the machine's drift hits both alike; then n_prof steps under
    torch.profiler: per token, the ops' (a GPU's kernels') time and count, and the share in matrix products.
    spec["static"]: against engine.StaticKVCache, compiled (spec["compile"]) with fixed shapes in mode
    "reduce-overhead" (CUDA graphs on a GPU; on a CPU that mode compiles as the default one does)."""
    kv, static = policy_of(model, spec.get("kv", "full")), spec.get("static", False)   # kv as in the table
    prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT), generator=g).to(device)
    _, products = floor_products(model, prompt, device, dtype, g)
    if spec.get("compile"):   # the fixed-shape step in one graph: a graph break is an error, not a split CUDA graph
        model.forward = torch.compile(model.forward, dynamic=not static, mode="reduce-overhead" if static else None,
                                      fullgraph=static)
    cache = engine.new_cache(model, 1, max_len=PROMPT + GEN, dtype=dtype, kv=kv, static=static)
    at = lambda pos, t=1: engine.position(cache, pos, t)   # noqa: E731  (a device tensor under static)
    step = lambda pos, tok=prompt[:, -1:]: model(tok, cache=cache, pos=at(pos), last_only=True)   # noqa: E731
    with torch.no_grad():
        model(prompt, cache=cache, pos=at(0, PROMPT), last_only=True)   # the prefill
        times = [(timed(products, device, 1), timed(lambda: step(pos), device, 1, warmup=lambda: None))
                 for pos in range(PROMPT, PROMPT + GEN)]
        floors, steps = zip(*times[8:])   # the first 8 steps warm up (and compile)
        activities, t, clock = profiler_clock(device)
        with profile(activities=activities) as prof:
            for pos in range(PROMPT + 8, PROMPT + 8 + n_prof):   # positions written before: rewritten alike
                step(pos)
        sync(device)
    ev, mms = profile_rows(prof.key_averages(), clock == "GPU")
    ms = lambda es: sum(t(e) for e in es) / n_prof / 1e3   # noqa: E731  per token
    return {"cache": type(cache).__name__, "step_ms": statistics.median(steps) * 1e3,
            "floor_ms": statistics.median(floors) * 1e3, "clock": clock, "steps": len(steps), "profiled_ms": ms(ev),
            "mm_ms": ms(mms), "mm_calls": sum(e.count for e in mms) / n_prof, "ops": sum(e.count for e in ev) / n_prof,
            "top": [(e.key, t(e) / n_prof / 1e3, e.count / n_prof) for e in sorted(ev, key=lambda e: -t(e))[:8]]}


def profile_rows(ev, gpu):
    """(the rows that add up to the time, the matrix products among them) of torch.profiler's key_averages()."""
    if not gpu:
        return ev, [e for e in ev if e.key in ("aten::mm", "aten::addmm")]
    # on a GPU the kernels alone: an op's device time is its kernels', which have rows of their own, and a CUDA
    ev = [e for e in ev if e.device_type == DeviceType.CUDA   # graph's replay has no ops; its record_function
          and not getattr(e, "is_user_annotation", False)]   # ranges mirrored there
    return ev, [e for e in ev if re.search(r"gemm|gemv|nvjet|xmma|splitKreduce", e.key)   # cuBLAS's kernels, and
                and not re.search(r"flash|fmha|sdpa|attention", e.key)]   # not attention's (cutlass inside)


def profiler_clock(device):
    """--profile's (what torch.profiler records, an op's own time in microseconds, the clock's name): on a GPU its
    kernels, timed there (the ops' CPU time is launch cost, not work), else the CPU's."""
    if device.startswith("cuda"):
        return [ProfilerActivity.CPU, ProfilerActivity.CUDA], (lambda e: e.self_device_time_total), "GPU"
    return [ProfilerActivity.CPU], (lambda e: e.self_cpu_time_total), "CPU"


def show_profile(name, r):
    fixed = " (fixed-shape cache)" if r.get("cache") == "StaticKVCache" else ""
    print(f"{name}{fixed}: a cached token takes {r['step_ms']:.2f} ms, the floor {r['floor_ms']:.2f} ms (medians of "
          f"{r['steps']} alternating timings): {r['floor_ms'] / r['step_ms']:.0%} of the bound")
    unit = "kernels" if r["clock"] == "GPU" else "ops"
    print(f"  profiled, per token: {r['profiled_ms']:.2f} ms of {r['clock']} time in {r['ops']:.0f} {unit}; matrix "
          f"products {r['mm_ms']:.2f} ms ({r['mm_ms'] / r['profiled_ms']:.0%}), the same products alone "
          f"{r['floor_ms']:.2f} ms; the rest {r['profiled_ms'] - r['mm_ms']:.2f} ms")
    for key, ms, calls in r["top"]:
        print(f"  {ms:7.3f} ms {calls:6.1f} calls  {key[:70]}")


def measure_memory(model, cfg, p, device, dtype, g, spec):
    """Peak resident memory of one forward on the CPU (in a fresh process whose allocator returns freed tensors
    to the OS: see run_worker)."""
    with torch.no_grad():
        model(torch.randint(0, cfg.vocab_size, (1, p["seq"]), generator=g))
    return {"peak_mem_mb": peak_mb(device)}


def measure_training(model, cfg, p, device, dtype, g, spec):
    """One forward + backward with the model's K (no optimiser step): time, memory, counted FLOPs."""
    model.train()
    B, n = spec.get("train_batch", 1), p["seq"]
    x, y = (torch.randint(0, cfg.vocab_size, (B, n), generator=g).to(device) for _ in range(2))
    ctx = precision_context("cuda" if device.startswith("cuda") else "cpu", p["dtype"])   # the run's own device

    def step():
        with ctx:
            _, loss = model(x, y)
        loss.backward()
        model.zero_grad(set_to_none=True)
    step()  # warm-up: allocates the gradients once
    sync(device)
    reset_peak(device)
    base = current_mb(device)
    dt = timed(step, device, p["train_reps"])
    out = {"train_ms_iter": dt * 1000, "train_tok_s": B * n / dt}
    if device.startswith("cuda") or spec.get("mem_env"):  # a timing process's RSS on the CPU is not a clean measure
        out["train_peak_mem_mb"] = peak_mb(device)
        out["train_iter_mem_mb"] = peak_mb(device) - base  # what the iteration itself added at its peak
    flops = counted_train_flops(cfg, B, n)    # MFU: what really ran; beside it the paper's S(M+2K)C model
    return {**out, "train_flops": flops, "train_flops_paper": train_flops(cfg, B, n),
            "train_achieved_tflops": flops / dt / 1e12}


def worker(phase, spec):
    """One phase for one model in this (fresh) process; returns a dict of measurements."""
    device, p = spec["device"], PRESETS[spec["preset"]]
    cfg = model_config(spec["model"], spec["preset"], **spec.get("override", {}))
    dtype = DTYPES[p["dtype"]]
    torch.manual_seed(0)
    model = build_model(cfg).to(device)
    out = {"params": model.num_params()}
    if phase != "train":   # inference in the preset's dtype (bf16 weights, as the paper's memory figures imply)
        model = model.to(dtype).eval()
    g = torch.Generator().manual_seed(0)
    reset_peak(device)  # the peaks below are this model's, after the cast: not torch's import, nor fp32 weights
    measure = {"profile": profile_decoding, "infer": measure_inference, "mem": measure_memory,
               "train": measure_training}[phase]
    return {**out, **measure(model, cfg, p, device, dtype, g, spec)}


def run_worker(phase, spec):
    """One phase in a fresh process, which ends with this one (orphaned). With spec["mem_env"], glibc hands every
    block of 64 KiB or more back to the OS when it is freed, so that peak RSS counts live tensors, not heap
    fragmentation; that makes large allocations slower, so timings come from processes without it."""
    spec = {**spec, "parent": os.getpid()}
    cmd = [sys.executable, os.path.abspath(__file__), f"--_worker={phase}", f"--_spec={json.dumps(spec)}"]
    env = dict(os.environ, **({"MALLOC_MMAP_THRESHOLD_": "65536"} if spec.get("mem_env") else {}))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{spec['model']} {phase} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def orphaned(parent):   # a worker's watch: its parent gone (SIGKILLed: nobody kills it or reads its result), it ends
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def default_preset(device):
    """The sizes a run on this device measures unless told: the paper's on a GPU, the CPU preset elsewhere."""
    return "paper" if device.startswith("cuda") else "cpu"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None,
                    help="sizes: tiny (tests), cpu (a CPU: the default there), paper (a GPU: the default on CUDA)")
    ap.add_argument("--models", default=",".join(PAPER), help="comma-separated subset of " + ",".join(ROWS) +
                    "; beyond = " + ",".join(BEYOND))
    ap.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda, ...")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the forward for latency and generation (recompute and cached alike; training "
                         "stays eager): about a minute per model on a 2-core CPU")
    ap.add_argument("--kv", choices=list(engine.KV_POLICIES), default="full",
                    help="KV cache policy of cached generation (engine.py): full is exact; last and fired share "
                         "slots and CHANGE the output (HRM; UniTF: last; Transformers always full)")
    ap.add_argument("--profile", action="store_true",
                    help="instead of the table, per model: a cached token's time against the matvec floor (timed "
                         "alternately), then torch.profiler's ops (a GPU's kernels) per token")
    ap.add_argument("--static_cache", action="store_true",
                    help="with --profile: decode against a fixed-shape cache (engine.StaticKVCache, the same tokens), "
                         "compiled by --compile in mode reduce-overhead: CUDA graphs on a GPU, plain compile on a CPU")
    ap.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_spec", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    threads = os.environ.get("BENCH_THREADS", str(torch.get_num_threads()))
    if not threads.isdigit() or int(threads) < 1:
        raise UserError(f"BENCH_THREADS={threads!r}: give the workers' torch threads, an integer >= 1")
    if args._worker:
        spec = json.loads(args._spec)
        threading.Thread(target=orphaned, args=(spec.get("parent", os.getppid()),), daemon=True).start()
        torch.set_num_threads(int(threads))
        print(json.dumps(worker(args._worker, spec)))
        return
    if args.static_cache and not args.profile:
        raise UserError("--static_cache measures the one-token step: add --profile (the table's generation uses the "
                        "growing cache, whose shapes change with every token)")
    device = usable_device(args.device)
    args.preset = args.preset or default_preset(device)
    names = [n for m in args.models.split(",") if m.strip() for n in (BEYOND if m.strip() == "beyond" else [m.strip()])]
    unknown = [m for m in names if m not in ROWS]
    if unknown or not names:   # "--models=," or "--models=": nothing to measure is a mistake, not a success
        raise UserError((f"unknown model(s) {unknown}" if unknown else f"--models={args.models!r} names no model")
                        + f"; choose from {', '.join(ROWS)} (or beyond)")
    if args.json:
        check_output_path(args.json, "--json")
    lacking = [m for m in names if args.kv == "fired" and ROWS[m]["arch"] == "unitf"]
    if lacking:   # as sample.py refuses it: a UniTF has no Slow firings (Transformers keep the exact cache, as said)
        raise UserError(f"--kv=fired does not apply to {', '.join(lacking)} (UniTF's policies: full, last); name only "
                        f"HRM and Transformer rows with --models, or use --kv=last")
    p = PRESETS[args.preset]
    if args.preset == "paper" and device == "cpu":
        print("note: --preset=paper is sized for a GPU; on this CPU it will take very long", file=sys.stderr)
    peak = measure_peak_tflops(device, DTYPES[p["dtype"]])
    dev_name = torch.cuda.get_device_name(device) if device.startswith("cuda") else f"CPU ({os.cpu_count()} cores)"
    sheet = datasheet_tflops(device)
    print(f"# bench.py --preset={args.preset} on {dev_name}: d={p['d']}, seq={p['seq']}, vocab={p['vocab']}, "
          f"{p['dtype']}, " + ("forward compiled for latency and generation, " if args.compile else "") +
          (f"KV cache policy {args.kv} (Transformers: full), " if args.kv != "full" else "") +
          f"measured matmul peak {peak:.2f} TFLOP/s" + (f", datasheet bf16 {sheet:.0f} TFLOP/s" if sheet else ""),
          flush=True)
    results, t_all = [], time.time()
    for name in names:
        t0 = time.time()
        spec = {"model": name, "preset": args.preset, "device": device}
        if args.profile:   # instead of the table
            results.append({"model": name, **run_worker("profile", {**spec, "compile": args.compile, "kv": args.kv,
                                                                     "static": args.static_cache})})
            show_profile(name, results[-1])
            continue
        r = {"model": name, **run_worker("infer", {**spec, "compile": args.compile, "kv": args.kv})}
        r.update({k: v for k, v in run_worker("train", spec).items() if k != "params"})
        if not device.startswith("cuda"):  # memory from separate fresh processes (see run_worker)
            r["peak_mem_mb"] = run_worker("mem", {**spec, "mem_env": True})["peak_mem_mb"]
            r.update({k: v for k, v in run_worker("train", {**spec, "mem_env": True}).items() if "_mem_mb" in k})
        cfg = model_config(name, args.preset)
        r.update(mfu=r["train_achieved_tflops"] / peak,
                 mfu_paper_model=r["train_flops_paper"] / r["train_ms_iter"] * 1e3 / 1e12 / peak,
                 mfu_datasheet=r["train_achieved_tflops"] / sheet if sheet else None, d=cfg.n_embd,
                 M=cfg.M if cfg.arch != "transformer" else cfg.n_layer, device=dev_name, preset=args.preset,
                 dtype=p["dtype"], seq=p["seq"], compiled=args.compile)
        results.append(r)
        print(f"  {name}: {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    if not args.profile:
        show_table(results, time.time() - t_all)
    if args.json:
        common.write_result(args.json, lambda f: json.dump(results, f, indent=1))   # whole or not at all
        if not args.profile:
            print(f"wrote {args.json}")


def show_table(results, seconds):
    ref = next((r for r in results if r["model"] == "tf_l4"), None)
    cols = ["model", "params", "latency ms", "x T-L4", "peak MB", "gen tok/s (recompute)", "x T-L4",
            "gen tok/s (cached)", "cached/recompute (min-max)", "bound (min-max)", "% of bound", "KV cache MB",
            "train ms/iter", "train tok/s", "train peak MB", "train iter MB", "MFU", "MFU (paper FLOP model)"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in results:
        lat_x = f"{r['latency_ms'] / ref['latency_ms']:.2f}" if ref else "-"
        gen_x = f"{r['gen_tok_s_recompute'] / ref['gen_tok_s_recompute']:.2f}" if ref else "-"
        mfu = f"{r['mfu']:.1%}" + (f" ({r['mfu_datasheet']:.1%} of datasheet)" if r["mfu_datasheet"] else "")
        span = {k: "-".join(f"{f(x[k] for x in r['rounds']):.1f}" for f in (min, max)) for k in r["rounds"][0]}
        print(f"| {r['model']} | {r['params'] / 1e6:.1f}M | {r['latency_ms']:.1f} | {lat_x} | {r['peak_mem_mb']:.0f} | "
              f"{r['gen_tok_s_recompute']:.1f} | {gen_x} | {r['gen_tok_s_cached']:.1f} | {r['gen_speedup']:.1f}x "
              f"({span['gen_speedup']}) | {r['gen_speedup_bound']:.1f}x ({span['gen_speedup_bound']}) | "
              f"{r['gen_speedup'] / r['gen_speedup_bound']:.0%} | "
              f"{r['kv_cache_mb']:.2f} | {r['train_ms_iter']:.1f} | {r['train_tok_s']:.0f} | "
              f"{r['train_peak_mem_mb']:.0f} | {r['train_iter_mem_mb']:.1f} | {mfu} | {r['mfu_paper_model']:.1%} |")
    print(f"\n{len(results)} models in {seconds:.0f} s. On the CPU, peak MB is the peak resident memory of "
          f"a fresh process (Python and torch included) and train iter MB what one training iteration adds at its "
          f"peak; KV cache for prompt {PROMPT} + {GEN} generated tokens. bound: what cached/recompute would be if "
          f"a cached token cost only its weight matrix-vector products (timed alone, in this run); both: medians of "
          f"{len(results[0]['rounds'])} interleaved rounds of the floor and the two generations, min-max beside them.")
    off = [r["model"] for r in results if abs(r["kv_cache_mb"] - r["kv_cache_formula_mb"]) > 1e-3 * r["kv_cache_mb"]]
    same = "equal docs/MODEL.md section 5's formula 2 * applications * n * d * bytes for every model"
    print("KV cache sizes " + (f"DIFFER from docs/MODEL.md section 5's formula for {off}" if off else same))


if __name__ == "__main__":   # a worker too: subprocess.run kills it when a signal stops this process
    signals.main(main)
