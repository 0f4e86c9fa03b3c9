"""What more than one test file uses: the tiny train.py settings and runs, the datasets, the log readers,
the one-line error check, a script run under a patch, a fresh clone of the repository, bench.py's memory
measurement, the paper's sizes, the small models of the model tests; and the suite's own option: 2 processes
where pytest-xdist is installed (a time limit per test and a shuffled order are plugins', set in pytest.ini)."""

import functools
import hashlib
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time

import pytest
import torch

# Under pytest-xdist (pytest_cmdline_main below runs 2 workers, one per core of a 2-core machine) each worker and every
# process it starts keep to one thread: two workers' OpenMP threads contending for 2 cores run 5-10x slower.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"   # the processes it starts
    torch.set_num_threads(1)              # this one

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from model import ModelConfig, build_model  # noqa: E402  (after the path)

# --- train.py at tiny sizes ---------------------------------------------------------------------------

# A model small enough that a training iteration takes milliseconds on a 2-core CPU.
CPU = ["--device=cpu", "--dtype=float32"]
TINY_MODEL = ["--n_embd=32", "--n_head=4", "--block_size=32"]
TINY = [*CPU, "--dataset=shakespeare", "--gradient_accumulation_steps=1", *TINY_MODEL, "--batch_size=4",
        "--eval_iters=4", "--log_interval=1", "--warmup_iters=2", "--learning_rate=3e-3", "--min_lr=3e-4"]
HRM = ["--arch=hrm", "--N=2", "--T=2", "--K=2"]   # M = 4
# the README's commands (tests/test_docs.py) at tiny sizes: 2 iterations, appended to each train.py command line
TINY_README = [*CPU, *TINY_MODEL, "--batch_size=2", "--max_iters=2", "--eval_interval=2", "--eval_iters=1",
               "--log_interval=1", "--warmup_iters=1"]


def char_tiny(out, *extra):
    """train.py arguments for the character HRM (config/char_hrm.py) at tiny sizes, d=16 (ckpt_last.dcp: 495 KB):
    the config file, then the sizes and the out_dir again (the file sets its own, over run_train's TINY), then
    extra."""
    return ["config/char_hrm.py", "--n_embd=16", "--n_head=2", "--block_size=32", "--batch_size=4", "--eval_iters=4",
            "--log_interval=1", "--warmup_iters=2", "--eval_interval=2", f"--out_dir={out}", *extra]

# train.py's environment: one thread (2 cores; tests run two processes at once), no progress bars
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", HF_DATASETS_DISABLE_PROGRESS_BARS="1")


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """Five Shakespeare plays through prepare.py's real tokenise-and-write path."""
    from prepare import prepare_documents, shakespeare_plays
    d = tmp_path_factory.mktemp("data")
    prepare_documents(shakespeare_plays()[:5], str(d / "shakespeare"), num_threads=1)
    return str(d)


@pytest.fixture(scope="session")
def char_data(tmp_path_factory):
    """The same five plays as characters (prepare.prepare_chars): <char_data>/shakespeare_char."""
    from prepare import prepare_chars, shakespeare_plays
    d = tmp_path_factory.mktemp("chardata")
    prepare_chars(shakespeare_plays()[:5], str(d / "shakespeare_char"))
    return str(d)


def run_train(args, data_dir, out_dir, check=True, timeout=300, nproc=None):
    """Run train.py: under torchrun when nproc is given, else in this process (in_process, one torch thread as in
    ENV: a subprocess's numbers to the bit, without its 3 s of importing torch); returns CompletedProcess."""
    args = [*TINY, f"--data_dir={data_dir}", f"--out_dir={out_dir}", *args]
    if nproc:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               os.path.join(ROOT, "train.py"), *args]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=ENV)
    else:
        p = in_process("train.py", *args)
    if check and p.returncode != 0:
        raise AssertionError(f"train.py failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def in_process(script, *args):
    """python <script> <args> run in this process (runpy, as __main__, cwd the repository): a CompletedProcess with
    the exit status of its SystemExit (0 if none) and what it printed (a stop's line is on its stderr). A subprocess
    costs 3 s of importing torch, so tests keep a few cases of each script as subprocesses (exit status, no
    traceback) and run the rest here. Put back
    after it: signal handlers and the wakeup fd, the exception hooks, sys.argv, the working directory, torch's
    thread count (1 while it runs, as ENV gives a subprocess), cuDNN attention's switch. Its os._exit(n)
    (train.py's stop, a signal's line) is a SystemExit(n) here, which must not end the test process."""
    import contextlib
    import gc
    import io
    import runpy
    import signal
    from hrmlm import signals
    from hrmlm.signals import STOP_SIGNALS
    signals.received.clear()   # what an earlier script in this process received
    saved, argv, cwd, os_exit = {s: signal.getsignal(s) for s in STOP_SIGNALS}, sys.argv, os.getcwd(), os._exit
    hooks, threads, wakeup = (sys.excepthook, sys.unraisablehook), torch.get_num_threads(), signal.set_wakeup_fd(-1)
    torch.set_num_threads(1)   # as ENV's OMP_NUM_THREADS=1 gives a subprocess: the same numbers
    sys.argv, out, err, code = [os.path.join(ROOT, script), *args], io.StringIO(), io.StringIO(), 0
    os.chdir(ROOT)

    def exit_now(n):
        raise SystemExit(n)
    os._exit = exit_now
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(sys.argv[0], run_name="__main__")   # its main() too
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) or e.code is None else 2
        err.write("" if isinstance(e.code, int) or e.code is None else f"{e}\n")
    finally:
        sys.argv, os._exit, (sys.excepthook, sys.unraisablehook) = argv, os_exit, hooks
        gc.collect()   # what the script held dies now (train.py's out_dir lock, kept by a SystemExit's frames)
        signal.set_wakeup_fd(wakeup)   # train.py's watcher thread of signals (StopSignals) hears no more
        torch.set_num_threads(threads)
        os.chdir(cwd)
        for s, h in saved.items():
            signal.signal(s, h)
        signals.received.clear()
    return subprocess.CompletedProcess([script, *args], code or 0, out.getvalue(), err.getvalue())


def error_in_process(script, *args):
    """The one error line of in_process(script, *args); fails where the script stops without one."""
    p = in_process(script, *args)
    line = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    assert p.returncode != 0 and line.startswith(f"{os.path.basename(script)}: error: "), (script, args, p)
    return line


def train_error_in_process(args, data_dir, out_dir):
    """error_in_process for train.py with run_train's arguments (and --max_iters=1, should it train)."""
    return error_in_process("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out_dir}", "--max_iters=1",
                            *args)


def train_cmd(args, data_dir, out_dir):
    """The command line run_train runs (for a Popen the test signals or kills)."""
    return [sys.executable, os.path.join(ROOT, "train.py"), *TINY, f"--data_dir={data_dir}", f"--out_dir={out_dir}",
            *args]


def run_script(script, *args, env=None, timeout=300):
    """python <script> <args> in the repository: in this process (in_process), or in a subprocess with env where
    one is given; returns CompletedProcess."""
    if env is None:
        return in_process(script, *args)
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)


@pytest.fixture(scope="session")
def trained(data_dir, tmp_path_factory):
    """A finished 4-iteration HRM run (checkpoints at 2 and 4) to copy from: never change it in place."""
    out = str(tmp_path_factory.mktemp("trained") / "run")
    run_train(HRM + ["--max_iters=4", "--eval_interval=2"], data_dir, out)
    return out


def save_ckpt(ck, path):
    """torch.save a hand-made checkpoint with its checksums made anew, as train.py would have written it: so a
    test of another check (a NaN, a wrong shape) is not stopped first by the checksum check."""
    import torch
    from hrmlm.checkpoint import checksums
    torch.save(dict(ck, checksums=checksums({k: ck[k] for k in ("model", "optimizer") if k in ck})), path)


def last_state(out_dir):
    """out_dir's resume state (its newest ckpt_last.dcp/iter_<n>) as one dict: meta.pt's entries,
    "model" (one process's weights) and "optimizer" ({"state": {parameter name: its AdamW moments}, "param_groups":
    AdamW's hyperparameters, from meta.pt})."""
    import tempfile
    import warnings
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from hrmlm.checkpoint import resume_path
    path = resume_path(out_dir)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "torch.distributed is disabled": one process reading is what we mean
        dcp_to_torch_save(path, os.path.join(tmp, "state.pt"))
        sd = torch.load(os.path.join(tmp, "state.pt"), weights_only=True)
    meta = torch.load(os.path.join(path, "meta.pt"), weights_only=True)
    return dict(meta, model=sd["model"], optimizer={"state": sd["optimizer"], "param_groups": meta["param_groups"]})


def save_last(state, out_dir):
    """Write a last_state() dict (a test's damaged copy) as out_dir's resume state (ckpt_last.dcp/iter_<n>, the
    folders there before removed), with the checksums of the files written, as save_resume would."""
    import tempfile
    import warnings
    from torch.distributed.checkpoint.format_utils import torch_save_to_dcp
    from hrmlm.checkpoint import file_crc
    shutil.rmtree(os.path.join(out_dir, "ckpt_last.dcp"), ignore_errors=True)
    path = os.path.join(out_dir, "ckpt_last.dcp", f"iter_{state['iter_num']:06d}")
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save({"model": state["model"], "optimizer": state["optimizer"]["state"]}, os.path.join(tmp, "s.pt"))
        torch_save_to_dcp(os.path.join(tmp, "s.pt"), path)
    meta = {k: v for k, v in state.items() if k not in ("model", "optimizer")}
    torch.save(dict(meta, checksums={n: file_crc(os.path.join(path, n)) for n in os.listdir(path)}),
               os.path.join(path, "meta.pt"))


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
    from hrmlm.checkpoint import read_log
    return {r["iter"]: r for r in read_log(out_dir)[0]}


def progress_losses(stdout):
    """The train loss of each of train.py's progress lines ('iter i/n (p%): loss x, ...'), in order."""
    return [float(x) for x in re.findall(r"^iter \d+/\d+ \([^)]*\): loss ([0-9.]+)", stdout, flags=re.M)]


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


# --- a script run under a patch ---------------------------------------------------------------------------

# After a patch's own code: run the script as `python script args` would (sys.argv, sys.path[0]), then the patch's
# finish(), if it defines one, even when the script exits or raises.
RUN_AS_MAIN = r"""
import os as _os, runpy as _runpy, sys as _sys
_sys.argv = _sys.argv[1:]
_sys.path.insert(0, _os.path.dirname(_os.path.abspath(_sys.argv[0])))
try:
    _runpy.run_path(_sys.argv[0], run_name="__main__")
finally:
    if "finish" in globals():
        finish()
"""


def patched(patch, folder, cmd):
    """cmd ([python, script, args...]) with `patch` (Python source: monkeypatches, and optionally a finish()) run
    first in the same process: the command line to run instead. The wrapper script is written to folder."""
    wrapper = os.path.join(str(folder), f"patched_{hashlib.sha256(patch.encode()).hexdigest()[:12]}.py")
    with open(wrapper, "w") as f:
        f.write(patch + RUN_AS_MAIN)
    return [cmd[0], wrapper, *cmd[1:]]


# --- waiting on a process or a file, with a deadline ------------------------------------------------------------

def wait_for(condition, timeout, what):
    """Poll condition() until it is true; past timeout seconds fail, saying what was awaited."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout} s for {what}", pytrace=False)
        time.sleep(0.05)


def read_until(proc, prefix, timeout):
    """Read proc's stdout pipe line by line up to the first line that starts with prefix, and return it; fail if
    the process ends first or no such line comes within timeout seconds (and kill it). Reads the pipe's file
    descriptor a byte at a time, so nothing after that line is taken from a later read or communicate()."""
    fd, deadline, seen, line = proc.stdout.fileno(), time.monotonic() + timeout, [], b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            proc.kill()
            pytest.fail(f"no line starting {prefix!r} from pid {proc.pid} within {timeout} s; it printed:\n"
                        + "".join(seen[-20:]), pytrace=False)
        byte = os.read(fd, 1)
        if not byte:
            pytest.fail(f"pid {proc.pid} ended (exit status {proc.wait(timeout=60)}) before printing a line starting "
                        f"{prefix!r}:\n" + "".join(seen[-20:]), pytrace=False)
        line += byte
        if byte == b"\n":
            text, line = line.decode(errors="replace"), b""
            if text.startswith(prefix):
                return text
            seen.append(text)


# --- the repository as a fresh clone has it --------------------------------------------------------------------

def fresh_clone(dst):
    """Copy the repository's files as a fresh clone has them (tracked, or untracked and not ignored: no out-*/
    runs, no data/) to dst; returns dst as a str."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True, timeout=60).stdout.split("\n")
    for f in filter(None, files):
        if os.path.exists(os.path.join(ROOT, f)):
            os.makedirs(os.path.dirname(os.path.join(dst, f)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, f), os.path.join(dst, f))
    return str(dst)


# --- what the docs show: commands, tables -------------------------------------------------------------------------

def sh_commands(text):
    """The commands of the ```sh blocks in a page's text, one per entry (continuation lines and loops kept whole)."""
    cmds = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        current = []
        for line in block.splitlines():
            current.append(line)
            code = " ".join(l.split("#")[0] for l in current)
            depth = len(re.findall(r"\bdo\b", code)) - len(re.findall(r"\bdone\b", code))
            if not line.rstrip().endswith("\\") and depth <= 0:
                cmds.append("\n".join(current))
                current = []
    return cmds


def md_tables(text):
    """Every markdown table in text: runs of lines starting with '|', each run one string."""
    tables, cur = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cur.append(line.rstrip())
        elif cur:
            tables.append("\n".join(cur))
            cur = []
    return tables


# --- bench.py's memory measurement; the paper's sizes ---------------------------------------------------------------

@functools.lru_cache(maxsize=None)   # the same measurement serves several tests
def measured_iter_mb(model, preset, **override):
    """The peak memory (MB) of one float32 training iteration at micro-batch 4 on the CPU, measured by bench.py's
    worker in a fresh process (its allocator returns every freed block)."""
    from bench import run_worker
    spec = {"model": model, "preset": preset, "device": "cpu", "train_batch": 4, "mem_env": True,
            "override": override}
    return run_worker("train", spec)["train_iter_mem_mb"]


# The paper's nine models (docs/MODEL.md section 3): their config file, ModelConfig fields (n_head=16) and exact size.
PAPER_MODELS = {
    "equalparam_nt8": (dict(arch="hrm", n_embd=4096, N=4, T=3, K=2), 1_229_357_059),
    "equalflops_hrm_d2048_nt36": (dict(arch="hrm", n_embd=2048, N=4, T=9, K=2), 358_825_987),
    "equalflops_hrm_d5120_nt9": (dict(arch="hrm", n_embd=5120, N=3, T=3, K=2), 1_856_512_003),
    "equalparam_tf_l2": (dict(arch="transformer", n_embd=4096, n_layer=2), 742_739_968),
    "equalparam_tf_l4": (dict(arch="transformer", n_embd=4096, n_layer=4), 1_279_627_264),
    "equalflops_tf_l12": (dict(arch="transformer", n_embd=4096, n_layer=12), 3_427_176_448),
    "unitf_d4096": (dict(arch="unitf", n_embd=4096, M=12), 474_296_320),
    "unitf_d5760": (dict(arch="unitf", n_embd=5760, M=12), 820_333_440),
    "unitf_d7296": (dict(arch="unitf", n_embd=7296, M=12), 1_218_395_520),
}
PAPER_SIZES = list(PAPER_MODELS.values())   # [(ModelConfig fields, parameters)]


# --- the suite's options: two processes where pytest-xdist is installed -------------------------------------------

# The rest is plugins' (requirements.txt; pytest.ini sets them): pytest-timeout's limit per test, fixtures included,
# and pytest-random-order's shuffle, off unless asked: --random-order-bucket=global (--random-order-seed=SEED to repeat
# one) shuffles every collected test across files, all that the suite needs of a shuffle, the same order on each xdist
# worker (it hands them the seed). Not pytest-randomly: it shuffles every run unless turned off, only files and the
# tests within each file (never interleaving files), and reseeds random and numpy before each test.

@pytest.hookimpl(wrapper=True)
def pytest_cmdline_main(config):
    """With pytest-xdist (installed and not turned off with -p no:xdist): 2 workers, one per core of a 2-core machine,
    each file on one worker (its fixtures built once), unless the command line says otherwise (-n 0: all in this
    process); without it, all in this process. Not in pytest.ini's addopts, where -n is a usage error without xdist.
    Runs before xdist's own pytest_cmdline_main, which starts the workers (not in the workers themselves)."""
    if config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput"):
        if config.option.numprocesses is None:
            config.option.numprocesses = 2
        if config.option.dist == "no" and not config.option.distload:
            config.option.dist = "loadfile"
    return (yield)


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
