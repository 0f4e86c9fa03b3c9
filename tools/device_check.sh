#!/usr/bin/env bash
# The GPU checks in one go, for whoever has a GPU for a few minutes: one log (device_check.log by default) with
#   1. the environment: torch, its CUDA, the GPU, nvidia-smi
#   2. one GPU at the paper's d=4096, NT=8 (config/equalparam_nt8.py) for 12 iterations on the BPE Shakespeare,
#      its measured peak memory beside plan.py's count for one GPU
#   3. sampling from it (cached decoding)
#   4. FSDP on 1 rank and a resume from its sharded state (ckpt_last.dcp)
#   5. bench.py's paper table (HRM NT=8 and the Transformer L=4)
#   6. the CUDA-graph decode step (--static_cache --compile) against the weight-streaming floor
# On one H100 it is meant to take under 9 minutes. Run from the repository root, after the README's setup:
#
#     bash tools/device_check.sh                 # on the GPU machine
#     DRY_RUN=1 bash tools/device_check.sh       # the same steps at toy sizes on the CPU (what CI runs)
#
# LOG=<file> and OUT=<folder> move the log and the runs (default out-devcheck/); BENCH_STEPS=0 skips steps 5-6. Each step is timed; a failing
# step is logged with its exit status and the rest still run; the script exits non-zero if any step failed. Without
# DRY_RUN, where torch cannot use a GPU, it stops after step 1 with one line (exit status 1).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${LOG:-device_check.log}
OUT=${OUT:-out-devcheck}
failed=0
: > "$LOG"

if [ -n "${DRY_RUN:-}" ]; then   # toy sizes on the CPU: every step's command line, checked end to end
    TRAIN="config/char_hrm.py --dataset=shakespeare_char --device=cpu --n_embd=32 --n_head=2 --block_size=32 --batch_size=2 --eval_iters=2"
    ITERS=2; PLAN="config/char_hrm.py"; BENCH="--preset=tiny --device=cpu"; COMPILE=""; MODELS=hrm_nt4
else
    TRAIN="config/equalparam_nt8.py --dataset=shakespeare --gradient_accumulation_steps=1 --eval_iters=2"
    ITERS=12; PLAN="config/equalparam_nt8.py"; BENCH="--preset=paper"; COMPILE="--compile"; MODELS=hrm_nt8,tf_l4
fi

step() {   # step "what" command...: run it, its output into the log, timed
    local what=$1; shift
    echo "## $what" | tee -a "$LOG"
    echo "\$ $*" >> "$LOG"
    local t0=$SECONDS
    "$@" >> "$LOG" 2>&1
    local rc=$?
    echo "-- exit $rc, $((SECONDS - t0)) s" | tee -a "$LOG"
    [ $rc -eq 0 ] || failed=1
}

step "environment" python -c "import sys, torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'available',
torch.cuda.is_available(), *(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())));
sys.exit(not (torch.cuda.is_available() or sys.argv[1]))" "${DRY_RUN:-}"
if [ $failed -ne 0 ]; then   # without a GPU every later step would run the GPU sizes on the CPU (the 1.2B model: 20 GB)
    echo "device_check.sh: error: torch cannot use a GPU on this machine (see $LOG); run it on the GPU machine, or" \
        "DRY_RUN=1 for the same steps at toy sizes on the CPU" | tee -a "$LOG" >&2
    exit 1
fi
[ -n "${DRY_RUN:-}" ] || step "nvidia-smi" nvidia-smi
if [ -n "${DRY_RUN:-}" ]; then
    [ -f data/shakespeare_char/meta.json ] || step "data" python prepare.py --dataset=shakespeare_char
else
    [ -f data/shakespeare/meta.json ] || step "data" python prepare.py
fi
step "one GPU: $ITERS iterations ($PLAN)" python train.py $TRAIN --max_iters=$ITERS --eval_interval=$ITERS \
    --log_interval=1 --out_dir="$OUT/one" --overwrite=True
step "plan.py's count for one GPU" python tools/plan.py $PLAN --world_size=1
step "sampling" python sample.py --out_dir="$OUT/one" --num_samples=1 --max_new_tokens=64 --start="ROMEO:"
step "FSDP on 1 rank" torchrun --standalone --nproc_per_node=1 train.py $TRAIN --fsdp=True --max_iters=$ITERS \
    --eval_interval=$((ITERS / 2)) --log_interval=1 --out_dir="$OUT/fsdp" --overwrite=True
step "FSDP resumed from ckpt_last.dcp" torchrun --standalone --nproc_per_node=1 train.py $TRAIN --fsdp=True \
    --max_iters=$((ITERS + ITERS / 2)) --eval_interval=$((ITERS / 2)) --log_interval=1 --out_dir="$OUT/fsdp" \
    --init_from=resume
if [ "${BENCH_STEPS:-1}" = 0 ]; then   # the tests' quick dry run: tests/test_bench.py runs these two at toy sizes
    echo "## bench.py's steps: skipped (BENCH_STEPS=0)" | tee -a "$LOG"
else
    step "bench.py's table" python bench.py $BENCH --models=$MODELS
    step "CUDA-graph decode against the weight-streaming floor" python bench.py $BENCH --models=${MODELS%%,*} --profile \
        --static_cache $COMPILE
fi
echo "device check: $([ $failed -eq 0 ] && echo 'every step passed' || echo 'a step FAILED'); log: $LOG" | tee -a "$LOG"
exit $failed
