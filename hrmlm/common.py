"""
What every script shares: its one way to stop on an error, the "auto" device and dtype settings, and timing.
Every script stops on an error through fail(): one line, "<script>.py: error: <what is wrong and how to fix it>",
and an exit status from the table in docs/TRAINING.md, "Exit statuses".
"""

import argparse
import os
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext

import torch

from hrmlm.signals import SIGNALLED, STOP_SIGNALS  # noqa: F401  (the scripts import them from here too)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
IO_ERROR, BAD_INPUT, DIVERGED = 1, 2, 3   # a write failed; input no run can use; non-finite (128 + n: signal n)


class Failure(SystemExit):
    """A script's stop: SystemExit with the exit status, and str() is its line(s)."""

    def __init__(self, line, code=BAD_INPUT):
        super().__init__(code)
        self.line = line

    def __str__(self):
        return self.line


def fail(msg, code=BAD_INPUT, prog=None, show=True, now=False):
    """Stop with '<prog>: error: <msg>' (msg a list: one line each) and exit status `code`. prog: default, the
    calling file's name; show=False: no line (a torchrun rank but 0); now=True: os._exit, past anything that could
    block on a collective. From a module another program imported (a test, experiments/sweep.py) nothing is
    printed: a SystemExit whose str() is the line."""
    frame = sys._getframe(1)
    while frame.f_code.co_filename == __file__ and frame.f_back:   # a helper here stopping for its caller: the caller
        frame = frame.f_back
    prog = prog or os.path.basename(frame.f_code.co_filename)
    line = "\n".join(f"{prog}: error: {m}" for m in ([msg] if isinstance(msg, str) else msg))
    if os.path.basename(getattr(sys.modules.get("__main__"), "__file__", None) or "") != prog:
        raise SystemExit(line)
    if show:
        print(line, file=sys.stderr, flush=True)
    if now:
        os._exit(code)
    raise Failure(line, code)


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """--help of the argparse scripts: the docstring as written, and every option with its default."""


def auto_device(device):
    """device="auto": "cuda" when torch can use a GPU, else "cpu", said loudly where the machine has an NVIDIA GPU
    that this torch cannot use (a CPU build, or a CUDA newer than the driver); any other value is kept."""
    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    gpu = next((p for p in ("/dev/nvidia0", "/proc/driver/nvidia/version") if os.path.exists(p)), None)
    if gpu:
        print(f"note: this machine has an NVIDIA GPU ({gpu}), but torch {torch.__version__} (CUDA "
              f"{torch.version.cuda or 'none: a CPU build'}) cannot use it, so this runs on the CPU; install the pinned "
              f"torch's CUDA build (README, 'On a GPU') or check the driver with nvidia-smi", file=sys.stderr, flush=True)
    return "cpu"


def torch_line(device):
    """What runs: 'torch 2.13.0+cu126, CUDA 12.6, cuda:0 (NVIDIA H100 80GB HBM3)', for every run's header."""
    name = f" ({torch.cuda.get_device_name(device)})" if str(device).startswith("cuda") else ""
    return f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}, {device}{name}"


def usable_device(device):
    """auto_device then check_device, or stop with check_device's line (named for the caller, exit status 2)."""
    try:
        return check_device(auto_device(device))
    except ValueError as e:
        fail(str(e))


def check_device(device):
    """A device these scripts run on and this machine has, or a ValueError with one line saying why not."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda") or (dev.type == "cpu" and dev.index not in (None, 0)):
        raise ValueError(f"device={device!r} is not a device these scripts run on; use auto, cpu, cuda or "
                         f"cuda:<index>")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available on this machine; use cpu")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"device={device!r} but this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def check_output_path(path, flag):
    """A ValueError (one line) now, not after a whole run, where results could not be written to `path`."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path!r} is a folder; give a file name")
    if not os.path.isdir(folder):
        raise ValueError(f"{flag} {path!r}: the folder {os.path.dirname(path)!r} does not exist; create it first")
    if not os.access(folder, os.W_OK) or os.path.exists(path) and not os.access(path, os.W_OK):
        raise ValueError(f"{flag} {path!r} is not writable")


def auto_dtype(dtype, device_type):
    """dtype="auto": bfloat16 on a CUDA device that supports it, else float32; any other value is kept."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"


def precision_context(device_type, dtype):
    """The forward's precision: nothing for float32, else autocast to dtype with its weight cache (a weight cast
    once per forward), off only where this torch would reuse a copy made under no_grad without its gradient."""
    if dtype == "float32":
        return nullcontext()
    cache = autocast_cache_keeps_grad(device_type, DTYPES[dtype])
    return torch.autocast(device_type=device_type, dtype=DTYPES[dtype], cache_enabled=cache)


def autocast_cache_keeps_grad(device_type, dtype):
    """Whether autocast's weight cache is safe for HRM and UniTF, whose first use of a shared weight is a no-grad
    step: in torch before pytorch#165068 (pytorch#112583) the bf16 copy cached there has no gradient history, and
    every later step that reuses it computes no gradient for the weight, silently. Tried on a 2 x 2 weight."""
    w = torch.ones(2, 2, device=device_type, requires_grad=True)
    x = torch.ones(1, 2, device=device_type)
    with torch.autocast(device_type=device_type, dtype=dtype):
        with torch.no_grad():
            torch.nn.functional.linear(x, w)
        return torch.nn.functional.linear(x, w).requires_grad


def fmt_time(sec):
    return f"{sec:.0f} s" if sec < 90 else f"{sec / 60:.1f} min" if sec < 5400 else f"{sec / 3600:.1f} h"


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


@contextmanager
def atomic_write(path, mode="w"):
    """Every file here is written whole or not at all: into path.tmp.<pid>, fsynced, then os.replace'd onto path;
    on any error (a full disk, a signal) the temporary goes and the old file stays."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def one_line(e, limit=300):
    """An exception as one line (torch puts a tensor's name on the second line of a load_state_dict error): its
    type and its message, cut at `limit` characters."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"
