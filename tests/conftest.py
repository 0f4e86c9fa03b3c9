import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# A model small enough that a training iteration takes milliseconds on a 2-core CPU.
TINY = [
        "--device=cpu", "--dtype=float32", "--dataset=shakespeare", "--gradient_accumulation_steps=1",
        "--n_embd=32", "--n_head=4", "--block_size=32", "--batch_size=4", "--eval_iters=4", "--log_interval=1",
        "--warmup_iters=2", "--learning_rate=3e-3", "--min_lr=3e-4"]


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """Five Shakespeare plays through prepare.py's real tokenise-and-write path."""
    from prepare import prepare_documents, shakespeare_plays
    d = tmp_path_factory.mktemp("data")
    prepare_documents(shakespeare_plays()[:5], str(d / "shakespeare"), num_proc=1)
    return str(d)


def run_train(args, data_dir, out_dir, check=True, timeout=300, nproc=None):
    """Run train.py in a subprocess (with torchrun when nproc is given); returns CompletedProcess."""
    cmd = [sys.executable]
    if nproc:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    cmd += [os.path.join(ROOT, "train.py"), *TINY, f"--data_dir={data_dir}", f"--out_dir={out_dir}", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    if check and p.returncode != 0:
        raise AssertionError(f"train.py failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def read_log(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]
