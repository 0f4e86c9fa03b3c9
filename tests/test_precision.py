"""bf16 and torch.compile on the CPU: the CUDA path's two switches, proven where CI runs."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, run_train

ARCHS = {"hrm": ["--arch=hrm", "--N=2", "--T=2", "--K=2"], "transformer": ["--arch=transformer", "--n_layer=2"],
         "unitf": ["--arch=unitf", "--M=3", "--K=2"]}


def log_of(out):
    with open(os.path.join(out, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow   # all three: CI time (the memory plan's bf16 policy test runs in CI)
@pytest.mark.parametrize("arch", ["hrm", "transformer", "unitf"])
def test_bf16_trains_and_samples_on_cpu(arch, data_dir, tmp_path):
    """dtype=bfloat16 under CPU autocast: training lowers the loss like float32 does (within bf16 noise),
    and sample.py decodes the checkpoint in bf16, cached and uncached greedy alike."""
    args = ARCHS[arch] + ["--max_iters=6", "--eval_interval=6", "--learning_rate=1e-2"]
    f32, bf16 = str(tmp_path / "f32"), str(tmp_path / "bf16")
    run_train(args, data_dir, f32)
    p = run_train(args + ["--dtype=bfloat16"], data_dir, bf16)
    assert "cpu bfloat16" in p.stdout
    a, b = log_of(f32), log_of(bf16)
    assert b[-1]["val_loss"] < b[0]["val_loss"]
    assert abs(a[-1]["val_loss"] - b[-1]["val_loss"]) < 0.1, (a[-1], b[-1])
    outs = []
    for cache in (True, False):
        s = subprocess.run([sys.executable, os.path.join(ROOT, "sample.py"), f"--out_dir={bf16}", "--device=cpu",
                            "--dtype=bfloat16", "--temperature=0", "--num_samples=1", "--max_new_tokens=12",
                            f"--use_cache={cache}"], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert s.returncode == 0, s.stderr
        outs.append(s.stdout)
    assert outs[0] == outs[1] and len(outs[0]) > 12   # the prompt and 12 tokens (a 6-step model: often newlines)


COUNT_RECOMPILES = r"""
import os, runpy, sys, torch
import torch._dynamo
frames = []
def counting_backend(gm, example_inputs):
    frames.append(len(frames))
    return gm.forward                       # run the captured graph as is: the test counts compilations
real_compile = torch.compile
torch.compile = lambda m, **k: real_compile(m, backend=counting_backend)
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print(f"GRAPHS={len(frames)}", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_compile_matches_eager_without_recompiles(arch, data_dir, tmp_path):
    """compile=True for a few iterations: the same losses as eager (float32, within 1e-4), and the graphs
    are captured in the first iteration only (counted over a 3- and a 6-iteration run: no more later)."""
    from conftest import TINY
    args = ARCHS[arch] + ["--eval_interval=100"]
    script = tmp_path / "count.py"
    script.write_text(COUNT_RECOMPILES)
    counts, logs = [], []
    for n in (3, 6):
        out = str(tmp_path / f"compiled{n}")
        cmd = [sys.executable, str(script), os.path.join(ROOT, "train.py"), *TINY, f"--data_dir={data_dir}",
               f"--out_dir={out}", *args, f"--max_iters={n}", "--compile=True"]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1200,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert p.returncode == 0, p.stderr[-3000:]
        counts.append(int(p.stdout.split("GRAPHS=")[1].split()[0]))
        logs.append(p.stdout)
    assert counts[0] == counts[1] > 0, counts        # 3 more iterations compiled nothing new

    def losses(text):
        return [float(l.split("loss ")[1].split(",")[0]) for l in text.splitlines() if l.startswith("iter ")]
    e = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *TINY, f"--data_dir={data_dir}",
                        f"--out_dir={tmp_path / 'eager'}", *args, "--max_iters=6"], capture_output=True, text=True,
                       cwd=ROOT, timeout=600)
    for x, y in zip(losses(e.stdout), losses(logs[1])):
        assert abs(x - y) < 1e-4, (losses(e.stdout), losses(logs[1]))
