#!/usr/bin/env bash
# The GPU checks in one go, for a short GPU loan, into one log (device_check.log by default):
#   1 env       torch, its CUDA, the GPU, nvidia-smi
#   2 eager     the paper's HRM NT=8 (config/equalparam_nt8.py: 1.23B, batch 12 x 1024), 10 iterations eager
#   3 compiled  the same run (seed, batches) compiled, 25 iterations
#   4 compare   their losses equal within bf16 rounding (iterations 1-10); the ms/iter and MFU of each
#   5 dist      DDP and FSDP on 1 rank each under torchrun, side by side, at d=512 (a paper-size save takes ~45 s)
#   6 resume    both resumed from their ckpt_last.dcp
#   7 profile   3 training steps of the NT=8, compiled, under torch.profiler: kernel time in matrix products,
#               attention, the optimizer and the rest; the most memory allocated and reserved
#   8 decode    bench.py's CUDA-graph decode step against its weight-streaming floor
# Each step has a timeout (T below: the H200 logs in experiments/logs/device/ plus a margin); their sum, 355 s, printed
# first, is the script's own estimate at the paper's size on one H100 (expected: ~4.5 minutes). At 360 s or more it
# will not start (exit status 2).
#     bash tools/device_check.sh             # on the GPU machine, after the README's setup
#     DRY_RUN=1 bash tools/device_check.sh   # the same steps at toy sizes on the CPU (what CI runs)
# LOG=<file>, OUT=<folder> (default out-devcheck/); BENCH_STEPS=0 skips step 8. A failed step (exit 124: timed out)
# is logged and the rest still run; the exit status is 1 if any failed. Without DRY_RUN, where torch cannot use a
# GPU, it stops after step 1 with one line (exit status 1).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${LOG:-device_check.log}; OUT=${OUT:-out-devcheck}; failed=0
: > "$LOG"
declare -A T   # each step's timeout, seconds
if [ -n "${DRY_RUN:-}" ]; then   # toy sizes on the CPU: every step's command line, checked end to end
    DATA=shakespeare_char; TRAIN="config/char_hrm.py --device=cpu --n_embd=32 --n_head=2 --block_size=32 --batch_size=2"
    NARROW=""; EAGER=2; COMPILED=3; PROFILE="tiny cpu 2"; BENCH="--preset=tiny --device=cpu --models=hrm_nt4"
    T=([env]=60 [eager]=120 [compiled]=240 [compare]=30 [dist]=180 [resume]=180 [profile]=120 [decode]=300)
else   # on an H200: env 3 s; 12 iterations 81 s (25 s start-up, 0.5 s each, 45 s the final save: 20 GB); decode 50 s
    DATA=shakespeare; TRAIN="config/equalparam_nt8.py --gradient_accumulation_steps=1"
    NARROW="--n_embd=512 --n_head=8"; EAGER=10; COMPILED=25; PROFILE="paper cuda 12"
    BENCH="--preset=paper --models=hrm_nt8"
    T=([env]=10 [eager]=95 [compiled]=105 [compare]=3 [dist]=28 [resume]=20 [profile]=34 [decode]=60)
fi
TRAIN="$TRAIN --dataset=$DATA --eval_iters=1"; DIST="$TRAIN $NARROW"
[ "${BENCH_STEPS:-1}" = 0 ] && unset "T[decode]"
total=0; for t in "${T[@]}"; do total=$((total + t)); done
echo "# device_check.sh: ${#T[@]} steps; their timeouts sum to $total s (${DRY_RUN:+toy sizes: generous, not }the" \
    "script's own estimate)" | tee -a "$LOG"
[ -z "${DRY_RUN:-}" ] && [ $total -ge 360 ] && { echo "device_check.sh: error: the timeouts sum to $total s: not" \
    "under 6 minutes" | tee -a "$LOG" >&2; exit 2; }

step() {   # step ID "what" command...: run under timeout T[ID], its output into the log and $OUT/ID.txt, timed
    local id=$1 what=$2 keep=/dev/null t0=$SECONDS; shift 2
    [ -d "$OUT" ] && keep="$OUT/$id.txt"
    echo "## $id: $what (timeout ${T[$id]} s)" | tee -a "$LOG"; echo "\$ $*" >> "$LOG"
    timeout --kill-after=5 "${T[$id]}" "$@" 2>&1 | tee "$keep" >> "$LOG"
    local rc=${PIPESTATUS[0]}
    echo "-- exit $rc, $((SECONDS - t0)) s" | tee -a "$LOG"
    [ $rc -eq 0 ] || failed=1
}

step env "torch, CUDA, the GPU" python -c "import subprocess, sys, torch; ok = torch.cuda.is_available()
print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'available', ok,
      *(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())), flush=True)
ok and subprocess.run(['nvidia-smi']); sys.exit(not (ok or sys.argv[1]))" "${DRY_RUN:-}"
if [ $failed -ne 0 ]; then   # without a GPU every later step would run the GPU sizes on the CPU (the 1.2B model: 20 GB)
    echo "device_check.sh: error: torch cannot use a GPU on this machine (see $LOG); run it on the GPU machine, or" \
        "DRY_RUN=1 for the same steps at toy sizes on the CPU" | tee -a "$LOG" >&2
    exit 1
fi
mkdir -p "$OUT"
[ -f "data/$DATA/meta.json" ] || { echo "## data: prepare.py (not in the estimate)" | tee -a "$LOG"
    timeout 300 python prepare.py --dataset=$DATA >> "$LOG" 2>&1 || failed=1; }
for run in eager:$EAGER:False compiled:$COMPILED:True; do IFS=: read -r id n compile <<< "$run"
    step $id "$n iterations, --compile=$compile" python train.py $TRAIN --compile=$compile --max_iters=$n \
        --eval_interval=$n --log_interval=1 --out_dir="$OUT/$id" --overwrite=True
    rm -rf "$OUT/$id/ckpt.pt" "$OUT/$id/ckpt_last.dcp"   # 20 GB at the paper's size, on a 64 GB disk
done
step compare "the losses within bf16 rounding; ms/iter and MFU" python - "$OUT"/{eager,compiled}.txt <<'EOF'
import re, sys
line = r"^iter \d+/\d+ .*?: loss (\S+), .* ([\d.]+) ms/iter, .* MFU ([\d.]+)%"
runs = [[tuple(map(float, m)) for m in re.findall(line, open(f).read(), re.M)] for f in sys.argv[1:]]
for name, r in zip(("eager", "compiled"), runs):   # the first fifth of the iterations warm up (and compile)
    k, mean = max(1, len(r) // 5), lambda i: sum(x[i] for x in r[k:]) / max(1, len(r) - k)   # noqa: E731
    print(f"{name}: iterations {k + 1}-{len(r)}: {mean(1):.1f} ms/iter, MFU {mean(2):.1f}%")
pairs = list(zip(*runs))   # bf16 keeps 8 significant bits (a rounding: up to 2^-8 relative); two roundings' worth
worst = max((abs(a[0] - b[0]) / abs(b[0]) for a, b in pairs), default=float("nan"))
print(f"losses of iterations 1-{len(pairs)}: largest relative difference {worst:.2e}, tolerance 2^-7 = {2**-7:.2e}")
sys.exit(not (worst <= 2**-7 and len(pairs) == len(runs[0])))
EOF
side_by_side() {   # DDP and FSDP at once (small: two on one GPU), each one's output in turn; fails if either does
    local rc=0 pid pids=() m
    for m in ddp fsdp; do
        torchrun --standalone --nproc_per_node=1 train.py $DIST --fsdp=$([ $m = fsdp ] && echo True || echo False) \
            --eval_interval=2 --log_interval=1 --out_dir="$OUT/$m" "$@" > "$OUT/$m.txt" 2>&1 & pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    for m in ddp fsdp; do echo "# $m:"; cat "$OUT/$m.txt"; done
    return $rc
}
export -f side_by_side; export DIST OUT
step dist "DDP and FSDP on 1 rank, 2 iterations" bash -c 'side_by_side "$@"' - --max_iters=2 --overwrite=True
step resume "both resumed from ckpt_last.dcp" bash -c 'side_by_side "$@"' - --max_iters=4 --init_from=resume
step profile "a training step's kernel time, and memory" python - $PROFILE <<'EOF'
import re, sys, torch
from bench import PRESETS, model_config, profile_rows, profiler_clock, sync
from hrmlm import common, parallel
from model import build_model
preset, dev, batch, n = *sys.argv[1:3], int(sys.argv[3]), 3
p, cfg, gpu = PRESETS[preset], model_config("hrm_nt8", preset), dev.startswith("cuda")
with torch.device(dev):   # drawn where it runs: the weights' values do not matter here
    model = build_model(cfg)
model = parallel.compile_model(model) if gpu else model   # as train.py: compiled on a GPU, not on a CPU
opt, ctx = torch.optim.AdamW(model.parameters(), fused=gpu), common.precision_context(dev, p["dtype"])
x, y = (torch.randint(0, cfg.vocab_size, (batch, p["seq"]), device=dev) for _ in range(2))
def step():   # train.py's iteration: forward, backward, clipping, AdamW
    with ctx:
        loss = model(x, y)[1]
    loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); opt.zero_grad(set_to_none=True)
activities, t, clock = profiler_clock(dev)
with torch.profiler.profile(activities=activities, schedule=torch.profiler.schedule(wait=2, warmup=1, active=n)) as pr:
    for _ in range(3 + n):   # 3 to warm up (compile, AdamW's state), n profiled
        step(); sync(dev); pr.step()
ev, mm = profile_rows(pr.key_averages(), gpu)
ms = lambda es: sum(t(e) for e in es) / n / 1e3   # noqa: E731  per step
parts = {"matrix products": ms(mm), "attention": ms([e for e in ev if e not in mm and re.search(
    r"flash|fmha|sdpa|attention", e.key, re.I)]), "optimizer": ms([e for e in ev if re.search(
    r"adam|multi_tensor|lpnorm|foreach|optimizer", e.key, re.I)])}   # AdamW's kernels and clipping's
parts["the rest"] = ms(ev) - sum(parts.values())
print(f"hrm_nt8 (--preset={preset}), batch {batch} x {p['seq']}, {'compiled' if gpu else 'eager'}: a step takes "
      f"{ms(ev):.1f} ms of {clock} time: " + ", ".join(f"{k} {v:.1f} ms ({v / ms(ev):.0%})" for k, v in parts.items()))
print(f"memory: {torch.cuda.max_memory_allocated(dev) / 2**30:.1f} GiB allocated at most, "
      f"{torch.cuda.max_memory_reserved(dev) / 2**30:.1f} GiB reserved" if gpu else "memory: (a CPU: no device memory)")
EOF
if [ -n "${T[decode]:-}" ]; then step decode "the CUDA-graph step against its floor" python bench.py $BENCH --profile \
    --static_cache --compile; else echo "## decode: skipped (BENCH_STEPS=0)" | tee -a "$LOG"; fi
echo "device check: $([ $failed -eq 0 ] && echo 'every step passed' || echo 'a step FAILED'); log: $LOG" | tee -a "$LOG"
exit $failed
