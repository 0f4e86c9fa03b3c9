#!/usr/bin/env bash
# Why does sample.py decode slower than bench.py on a GPU? (docs/BENCHMARKS.md, "One GPU")
# bench.py's cached decoding repeats the same lengths; sample.py meets a new cache length at every token.
# If attention builds something per sequence length (cuDNN's SDPA builds a graph per shape), the first pass
# over the lengths is slow and a second pass over the same lengths is fast, and switching cuDNN's SDPA off
# removes the difference. Two greedy samples from the same prompt are those two passes. (sample.py now turns
# cuDNN's attention off itself; the A/B below overrides that.)
#
#     bash experiments/device_decode.sh        # on the GPU machine, after the README's setup; about 4 minutes
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out-decode}
python -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name(0))"
[ -f data/shakespeare/meta.json ] || python prepare.py
# the paper's HRM NT=8 at d=4096 (config/equalparam_nt8.py), trained 2 iterations: a checkpoint to decode from
python train.py config/equalparam_nt8.py --dataset=shakespeare --gradient_accumulation_steps=1 --eval_iters=1 \
    --max_iters=2 --eval_interval=2 --log_interval=1 --out_dir="$OUT" --overwrite=True 2>&1 | tail -3
SAMPLE="--out_dir=$OUT --num_samples=2 --max_new_tokens=256 --temperature=0 --start=ROMEO:"
for cudnn in True False; do
    echo "## torch.backends.cuda.enable_cudnn_sdp($cudnn)"
    python - $SAMPLE <<PY 2>&1 | grep -e '---' -e rror
import runpy, sys, torch
torch.backends.cuda.enable_cudnn_sdp($cudnn)
torch.backends.cuda.enable_cudnn_sdp = lambda enabled: None   # sample.py turns it off itself: not in this A/B
sys.argv = ["sample.py", *sys.argv[1:]]
runpy.run_path("sample.py", run_name="__main__")
PY
done
