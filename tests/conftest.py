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


# torch.save with a fault at its FAULT_AT_SAVE-th call, for the checkpoint tests: "full" writes part of the
# file and raises ENOSPC (a full disk); "kill" dies by SIGKILL before writing (between the log line and the
# checkpoint); "hang" writes part of the file, touches $MARKER and sleeps, for the test to SIGKILL mid-save.
FAULTY_SAVE = r"""
import errno, os, runpy, signal, sys, time, torch
calls = [0]
real_save = torch.save
def faulty_save(obj, f, *a, **k):
    calls[0] += 1
    if calls[0] < int(os.environ["FAULT_AT_SAVE"]):
        return real_save(obj, f, *a, **k)
    if os.environ["FAULT"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    f.write(b"PK\x03\x04 part of a checkpoint")
    if os.environ["FAULT"] == "hang":
        f.flush()
        open(os.environ["MARKER"], "w").close()
        time.sleep(600)
    raise OSError(errno.ENOSPC, "No space left on device")
torch.save = faulty_save
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def faulty_train(args, data_dir, out, tmp_path, fault, at, marker=None, wait=True):
    """train.py (TINY + args) with torch.save failing at its at-th call; a CompletedProcess, or a Popen if not wait."""
    script = tmp_path / "faulty_save.py"
    script.write_text(FAULTY_SAVE)
    cmd = [sys.executable, str(script), os.path.join(ROOT, "train.py"), *TINY, f"--data_dir={data_dir}",
           f"--out_dir={out}", *args]
    env = dict(os.environ, FAULT_AT_SAVE=str(at), FAULT=fault, MARKER=marker or "", OMP_NUM_THREADS="1")
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def one_error_line(p, code=2, prog="train.py"):
    """A run that stopped with exactly one line, '<prog>: error ...', no traceback, exit code `code`."""
    lines = [l for l in p.stderr.strip().splitlines() if l.strip()]
    assert p.returncode == code, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert "Traceback" not in p.stderr, p.stderr
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error"), p.stderr
    return lines[0]
