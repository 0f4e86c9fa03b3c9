"""What more than one test file uses: the tiny train.py settings and runs, the datasets, the log reader,
the one-line error check, and the small models of the model tests."""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from model import ModelConfig, build_model  # noqa: E402  (after the path)

# --- train.py at tiny sizes ---------------------------------------------------------------------------

# A model small enough that a training iteration takes milliseconds on a 2-core CPU.
TINY = [
        "--device=cpu", "--dtype=float32", "--dataset=shakespeare", "--gradient_accumulation_steps=1",
        "--n_embd=32", "--n_head=4", "--block_size=32", "--batch_size=4", "--eval_iters=4", "--log_interval=1",
        "--warmup_iters=2", "--learning_rate=3e-3", "--min_lr=3e-4"]
HRM = ["--arch=hrm", "--N=2", "--T=2", "--K=2"]   # M = 4

# train.py's environment: one thread (2 cores; tests run two processes at once), no progress bars
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", HF_DATASETS_DISABLE_PROGRESS_BARS="1")


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """Five Shakespeare plays through prepare.py's real tokenise-and-write path."""
    from prepare import prepare_documents, shakespeare_plays
    d = tmp_path_factory.mktemp("data")
    prepare_documents(shakespeare_plays()[:5], str(d / "shakespeare"), num_proc=1)
    return str(d)


@pytest.fixture(scope="session")
def char_data(tmp_path_factory):
    """The same five plays as characters (prepare.prepare_chars): <char_data>/shakespeare_char."""
    from prepare import prepare_chars, shakespeare_plays
    d = tmp_path_factory.mktemp("chardata")
    prepare_chars(shakespeare_plays()[:5], str(d / "shakespeare_char"))
    return str(d)


def run_train(args, data_dir, out_dir, check=True, timeout=300, nproc=None):
    """Run train.py in a subprocess (with torchrun when nproc is given); returns CompletedProcess."""
    cmd = [sys.executable]
    if nproc:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    cmd += [os.path.join(ROOT, "train.py"), *TINY, f"--data_dir={data_dir}", f"--out_dir={out_dir}", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=ENV)
    if check and p.returncode != 0:
        raise AssertionError(f"train.py failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def train_cmd(args, data_dir, out_dir):
    """The command line run_train runs (for a Popen the test signals or kills)."""
    return [sys.executable, os.path.join(ROOT, "train.py"), *TINY, f"--data_dir={data_dir}", f"--out_dir={out_dir}",
            *args]


def run_script(script, *args, env=None, timeout=300):
    """python <script> <args> in the repository (env: this process's unless given); returns CompletedProcess."""
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)


@pytest.fixture(scope="session")
def trained(data_dir, tmp_path_factory):
    """A finished 4-iteration HRM run (checkpoints at 2 and 4) to copy from: never change it in place."""
    out = str(tmp_path_factory.mktemp("trained") / "run")
    run_train(HRM + ["--max_iters=4", "--eval_interval=2"], data_dir, out)
    return out


def copy_run(src, tmp_path, name="run"):
    out = str(tmp_path / name)
    shutil.copytree(src, out)
    return out


def raw_log(out_dir, key=None):
    """Every line of out_dir/log.jsonl, duplicates included (or only its `key` field). Where a test wants
    one row per iteration, it reads checkpoint.read_log(out_dir) instead."""
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return rows if key is None else [r[key] for r in rows]


def by_iter(out_dir):
    """checkpoint.read_log(out_dir) as {iteration: row} (an iteration logged twice: its last line)."""
    from checkpoint import read_log
    return {r["iter"]: r for r in read_log(out_dir)[0]}


def one_error_line(p, code=2, prog="train.py"):
    """A run that stopped with exactly one line, '<prog>: error...', no traceback, exit code `code`."""
    lines = [l for l in p.stderr.strip().splitlines() if l.strip()]
    assert p.returncode == code, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error"), p.stderr[-2000:]
    return lines[0]


def snapshot(folder, skip=()):
    """{relative path: sha256} of every file under folder but those named in skip (to show nothing changed)."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            if name not in skip:
                path = os.path.join(root, name)
                out[os.path.relpath(path, folder)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


def write_docs(folder, n, words="Some words of document"):
    """n small .txt documents for prepare.py --input."""
    os.makedirs(folder, exist_ok=True)
    for i in range(n):
        with open(os.path.join(folder, f"doc{i}.txt"), "w") as f:
            f.write(f"{words} {i}.\n" * 40)
    return folder


class Evil:
    """A pickle payload: loading it with weights_only=False would run `touch path`."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


# --- small models for test_model, test_equations, test_decoding --------------------------------------

V = 101  # small vocabulary for the functional tests


def tiny(arch="hrm", **kw):
    base = dict(arch=arch, vocab_size=V, block_size=80, n_embd=32, n_head=4)
    base.update(kw)
    return ModelConfig(**base)


def make(cfg, seed=0, scale=1.0):
    torch.manual_seed(seed)
    m = build_model(cfg)
    if scale != 1.0:  # larger weights so that logits are far from uniform and greedy decoding varies
        with torch.no_grad():
            for p in m.parameters():
                if p.dim() >= 2:
                    p.mul_(scale)
    return m


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, V, (2, 16), generator=g), torch.randint(0, V, (2, 16), generator=g)


def grads(m, loss):
    m.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def assert_grads_close(g1, g2):
    assert g1.keys() == g2.keys()
    for n in g1:
        torch.testing.assert_close(g1[n], g2[n], rtol=1e-4, atol=1e-7, msg=n)


def grads_differ(g1, g2):
    return any(not torch.allclose(g1[n], g2[n], rtol=1e-3, atol=1e-6) for n in g1)
