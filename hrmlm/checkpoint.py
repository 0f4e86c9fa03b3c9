"""The run folder: ckpt.pt, the best model; log.jsonl, a line per evaluation; ckpt_last.dcp/iter_<n>/, the resume
state at iteration n: a torch.distributed.checkpoint folder each rank writes its shards into, read at any world size,
finished once its meta.pt (written last) is there. Files are checksummed, written whole or not at all, and loaded
weights_only=True with their sums checked (a flipped byte is refused). A problem is a UserError of one line."""

import fcntl
import functools
import json
import logging
import math
import os
import pickle
import shutil
import warnings
import zlib
from contextlib import suppress

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_model_state_dict, set_state_dict

from hrmlm.common import atomic_write, one_line
from hrmlm.signals import IO_ERROR, UserError
from model import ModelConfig, build_model

CKPT_BEST, CKPT_LAST, LOG, META = "ckpt.pt", "ckpt_last.dcp", "log.jsonl", "meta.pt"
# dcp warns whenever one process saves or loads alone: every run without torchrun
warnings.filterwarnings("ignore", "torch.distributed is disabled, unavailable or uninitialized")


def checksums(obj, at=""):
    """CRC-32 of every tensor's bytes in a checkpoint's (nested) entries, by its path ('model/L_net.alpha')."""
    if torch.is_tensor(obj):
        return {at: zlib.crc32(obj.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    return {k: v for key, val in items for k, v in checksums(val, f"{at}/{key}" if at else str(key)).items()}


def file_crc(path):
    with open(path, "rb") as f:
        return functools.reduce(lambda crc, chunk: zlib.crc32(chunk, crc), iter(lambda: f.read(1 << 24), b""), 0)


def write_failed(path, e):
    """A failed write (a full disk) as the run's last line, exit status 1, naming what is still intact."""
    e = next(iter(e.failures.values()), (e,))[0] if hasattr(e, "failures") else e   # dcp's: {rank: (error, tb)}
    why = e.strerror if isinstance(e, OSError) and e.strerror else f"{one_line(e)} (is the disk full?)"
    return UserError(f"cannot save {path}: {why}; {intact(run_of(path))}", IO_ERROR)


def save_checkpoint(path, ckpt):
    """ckpt.pt with its checksums, atomically (a kill mid-save leaves the previous file)."""
    ckpt = dict(ckpt, checksums=checksums({k: ckpt[k] for k in ("model", "optimizer") if k in ckpt}))
    try:
        with atomic_write(path, "wb") as f:
            torch.save(ckpt, f)
    except (OSError, RuntimeError) as e:   # torch's zip writer reports a full disk as a RuntimeError
        raise write_failed(path, e) from None


def save_resume(out_dir, model, optimizer, info):
    """out_dir/ckpt_last.dcp/iter_<n>: every rank writes its shards of the weights and the AdamW state (dcp.save: no
    rank gathers the model), then rank 0 writes meta.pt (info, AdamW's hyperparameters, every file's checksum) and
    removes the older folders. A kill before meta.pt leaves the previous state whole. Every rank calls it."""
    root = os.path.join(out_dir, CKPT_LAST)
    path, rank = os.path.join(root, f"iter_{info['iter_num']:06d}"), dist.get_rank() if dist.is_initialized() else 0
    model_sd, optim_sd = get_state_dict(model, optimizer)
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optim_sd["param_groups"]]
    try:
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)   # this iteration's save that never finished (a kill)
        dist.barrier() if dist.is_initialized() else None
        dcp.save({"model": model_sd, "optimizer": optim_sd["state"]}, checkpoint_id=path,
                 no_dist=not dist.is_initialized())
        if rank == 0:
            sums = {n: file_crc(os.path.join(path, n)) for n in os.listdir(path)}
            with atomic_write(os.path.join(path, META), "wb") as f:
                torch.save(dict(info, param_groups=groups, checksums=sums), f)
            for old in set(os.listdir(root)) - {os.path.basename(path)}:
                shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    except (OSError, RuntimeError, CheckpointException) as e:   # the last: dcp's, a BaseException
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        raise write_failed(path, e) from None
    dist.barrier() if dist.is_initialized() else None   # every rank returns once it is whole: none cuts it short


def resume_path(out_dir):
    """The resume state in out_dir: the newest folder of ckpt_last.dcp that holds meta.pt, else None."""
    root = os.path.join(out_dir, CKPT_LAST)
    if os.path.isfile(os.path.join(root, META)):   # one state, no iteration folders: written by earlier code
        return root
    done = [d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, META))] if os.path.isdir(root) else []
    return os.path.join(root, max(done, key=lambda d: int(d.split("_")[-1]))) if done else None


def read_info(path):
    """A checkpoint's settings and iteration: a file memory-mapped (no tensor read until used), or a dcp's meta.pt."""
    return torch.load(os.path.join(path, META) if os.path.isdir(path) else path, map_location="cpu",
                      weights_only=True, mmap=True)


def run_of(path):   # the out_dir a checkpoint is in: ckpt.pt's folder, or the one that holds its ckpt_last.dcp
    parts = os.path.normpath(path).split(os.sep)
    return os.sep.join(parts[:parts.index(CKPT_LAST)] if CKPT_LAST in parts else parts[:-1]) or "."


def intact(out_dir, damaged=None):
    """What a run can still be resumed or sampled from, for an error line: 'intact: ckpt.pt (iter 200), ...'."""
    held = []
    for path in (os.path.join(out_dir, CKPT_BEST), resume_path(out_dir)):
        with suppress(Exception):   # absent or unreadable: not something to resume or sample from
            if os.path.abspath(path) != os.path.abspath(damaged or ""):
                held.append(f"{path} (iter {read_info(path)['iter_num']})")
    return "intact: " + (", ".join(held) or "no checkpoint")


def load_checkpoint(path):
    """ckpt.pt or a resume state's meta.pt as a dict, its checksums checked; a UserError where it is missing,
    damaged, truncated, foreign or unsafe. A resume state's tensors stay in its folder (load_resume reads them)."""
    if os.path.basename(os.path.normpath(path)) == CKPT_LAST and not os.path.isfile(os.path.join(path, META)):
        path = resume_path(os.path.dirname(os.path.normpath(path))) or path   # a run's ckpt_last.dcp: its newest state
    sharded = os.path.isfile(os.path.join(path, META))
    if not os.path.isfile(path) and not sharded:
        raise UserError(f"no checkpoint at {path}" + (" (it is a folder)" if os.path.isdir(path) else ""))
    try:
        ckpt = read_info(path)
    except pickle.UnpicklingError:   # torch's own message advises weights_only=False: never do that here
        raise UserError(f"{path} holds Python objects other than tensors and was not loaded "
                        f"(not a train.py checkpoint, or unsafe)") from None
    except Exception as e:
        raise UserError(f"cannot load {path}: {one_line(e, 200)} (truncated or not a checkpoint)") from None
    if not isinstance(ckpt, dict) or not ({"model", "model_args"} <= ckpt.keys() or sharded):
        raise UserError(f"{path} is not a train.py checkpoint (no 'model' and 'model_args' entries)")
    saved = ckpt.get("checksums") or {}
    if sharded:   # every file (each of torchrun's ranks reads them all: every rank finds the same problem)
        ckpt["sharded"] = path
        bad = [n if os.path.isfile(f) else f"{n} missing" for n in sorted(saved)
               if not os.path.isfile(f := os.path.join(path, n)) or file_crc(f) != saved[n]]
    else:
        now = checksums({k: ckpt[k] for k in ("model", "optimizer") if k in ckpt})
        bad = [k for k in saved if now.get(k) != saved[k]] + [k for k in now if saved and k not in saved]
    if bad:
        raise UserError(f"{path} is damaged: {len(bad)} {'file' if sharded else 'tensor'}(s) missing or not as "
                        f"written (checksums: {', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); "
                        f"{intact(run_of(path), path)}")
    return ckpt


def nonfinite(state_dict):
    return [k for k, v in state_dict.items() if v.is_floating_point() and not torch.isfinite(v).all()]


def model_from_checkpoint(ckpt, path="the checkpoint"):
    """The model a checkpoint (load_checkpoint's dict) holds. Refuses non-finite weights: such a model only ever
    samples one token and trains with every step skipped."""
    try:
        model = build_model(ModelConfig(**ckpt["model_args"]))
    except (TypeError, ValueError) as e:
        raise UserError(f"{path} does not build a model: {one_line(e)}") from None
    if "sharded" in ckpt:   # an FSDP run's resume state, read whole by this one process
        load_resume(ckpt["sharded"], model)
        return model
    bad = nonfinite(ckpt["model"])
    if bad:
        raise UserError(f"{path} has non-finite weights in {len(bad)} tensor(s) ({', '.join(bad[:3])}"
                        f"{', ...' if len(bad) > 3 else ''}); use an earlier checkpoint")
    try:
        model.load_state_dict({k: v.reshape(1) if v.dim() == 0 else v for k, v in ckpt["model"].items()})
    except RuntimeError as e:   # older code kept alpha and tau 0-d; model.py keeps them as 1-element vectors
        raise UserError(f"{path} does not build a model: {one_line(e)}") from None
    return model


def load_resume(path, model, optimizer=None, param_groups=None):
    """A resume state into this model (at any world size, FSDP or not: each rank reads the pieces it holds) and,
    given, the optimizer with the saved AdamW hyperparameters. UserError: it does not fit, or a weight is not finite."""
    model_sd, optim_sd = get_state_dict(model, optimizer or [])   # optim_sd: {} without one
    state = {"model": model_sd} | ({"optimizer": optim_sd["state"]} if optim_sd else {})
    logging.disable(logging.ERROR)   # dcp logs each failure with a traceback; the line below is the one
    try:
        dcp.load(state, checkpoint_id=path, no_dist=not dist.is_initialized())   # in place, into this rank's tensors
    except CheckpointException as e:   # a BaseException: a shard missing, truncated or foreign
        why = next(iter(e.failures.values()), (e,))[0]   # {rank: (exception, its traceback)}
        if isinstance(why, (ValueError, RuntimeError)):   # the planner's: a tensor missing or of another shape
            raise UserError(f"{path} does not fit this model: {one_line(why, 200)}") from None
        raise UserError(f"{path}: cannot read a shard or its index ({one_line(why, 200)}); resume from an intact "
                        f"checkpoint") from None
    finally:
        logging.disable(logging.NOTSET)
    bad = nonfinite({k: getattr(v, "_local_tensor", v) for k, v in model_sd.items()})
    if bad:
        raise UserError(f"{path} has non-finite weights ({', '.join(bad[:3])}); use an earlier checkpoint")
    if optimizer is None:
        return set_model_state_dict(model, model_sd)
    if len(param_groups) != len(optim_sd["param_groups"]):
        raise UserError(f"{path} does not fit this model: it holds {len(param_groups)} AdamW parameter groups, this "
                        f"run has {len(optim_sd['param_groups'])}")
    optim_sd["param_groups"] = [dict(saved, params=g["params"]) for saved, g in zip(param_groups,
                                                                                    optim_sd["param_groups"])]
    try:
        set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    except (KeyError, TypeError, ValueError, RuntimeError) as e:   # a moment of another shape: dcp's check
        raise UserError(f"{path} does not fit this model: {one_line(e)}") from None


def read_log(out_dir):
    """log.jsonl's rows sorted by iteration (one logged twice: its last line), and how many lines are not a JSON
    object with an integer "iter" (a run killed mid-write, a hand edit). UserError where no line is."""
    path = os.path.join(out_dir, LOG)
    if not os.path.isfile(path):
        raise UserError(f"{path} not found (is {out_dir!r} a train.py out_dir?)")
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [line for line in f if line.strip()]
    rows = []
    for line in lines:
        with suppress(ValueError):
            rows.append(json.loads(line))
    rows = [r for r in rows if isinstance(r, dict) and type(r.get("iter")) is int]   # not a bool either
    skipped = len(lines) - len(rows)
    if not rows:
        raise UserError(f"{path} has no log lines" + (f" ({skipped} malformed)" if skipped else " (it is empty)") +
                        "; train.py writes one per evaluation")
    by_iter = {r["iter"]: r for r in rows}
    return [by_iter[i] for i in sorted(by_iter)], skipped


def claim_out_dir(out_dir, resume, overwrite, claim=True):
    """out_dir for a run: one train.py at a time (an flock), one run (overwrite: the old one goes whole); (lock, state)."""
    if not out_dir:
        raise UserError("out_dir is empty; give a folder, e.g. --out_dir=out")
    lock = None
    try:
        if claim:
            os.makedirs(out_dir, exist_ok=True)
            lock = open(os.path.join(out_dir, ".lock"), "a+")
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        raise UserError(f"out_dir {out_dir!r} is in use by another train.py run ({lock.read().strip()}); wait for "
                        f"it or use another out_dir") from None
    except OSError as e:
        raise UserError(f"cannot use out_dir {out_dir!r}: {e.strerror or e}") from None
    last, held = resume_path(out_dir), [n for n in (LOG, CKPT_BEST, CKPT_LAST, "ckpt_last.pt")
                                        if os.path.exists(os.path.join(out_dir, n))]
    if resume and not last:
        raise UserError(f"init_from='resume' but {out_dir} holds no resume state ({CKPT_LAST})" + (
            f", only {', '.join(held)}" + " (older code's ckpt_last.pt is no longer read)" * ("ckpt_last.pt" in held) +
            (f": its ckpt.pt is intact; start a new run from its weights with --init_from={out_dir} and another "
             f"--out_dir (--overwrite=True would delete it)" if CKPT_BEST in held else
             ": start it again with --init_from=scratch --overwrite=True") if held else ""))
    if held and claim and not (resume or overwrite):
        raise UserError(f"out_dir {out_dir!r} already holds a run ({', '.join(held)}); " + "resume it with "
                        "--init_from=resume, " * bool(last) + "replace it with --overwrite=True, or choose another out_dir")
    if lock:
        lock.truncate(0)
        print(f"pid {os.getpid()} on {os.uname().nodename}", file=lock, flush=True)
        # a killed run's temporaries (atomic_write's), and with overwrite the old run, whole
        for name in [n for n in os.listdir(out_dir) if ".tmp." in n] + (held if overwrite and not resume else []):
            shutil.rmtree(p) if os.path.isdir(p := os.path.join(out_dir, name)) else os.remove(p)
    return lock, last


def finished(out_dir, config):   # the iteration of out_dir's state of this very run (config) at its end, or 0
    with suppress(Exception):   # no state there, or not one to read: not finished
        info, same = read_info(resume_path(out_dir)), ("init_from", "out_dir", "data_dir", "device", "compile", "fsdp")
        return info["iter_num"] if info["iter_num"] >= config["max_iters"] and all(
            info["config"].get(k) == v for k, v in config.items() if k not in same and "wandb" not in k) else 0
    return 0


def find_checkpoint(path, out_dir):
    """init_from=<path>: a checkpoint file or resume state itself, or in a train.py out_dir its ckpt.pt, else its
    resume state (load_checkpoint says what is wrong with anything else); never inside the new run's out_dir."""
    if not os.path.exists(path):
        raise UserError(f"init_from must be 'scratch', 'resume', or a checkpoint or out_dir to start from; {path!r} "
                        f"does not exist")
    if (os.path.realpath(path) + os.sep).startswith(os.path.realpath(out_dir or ".") + os.sep):
        raise UserError(f"init_from={path!r} is in out_dir={out_dir!r}: a new run starts in a folder of its own (give "
                        f"another --out_dir)")
    if not os.path.isdir(path) or os.path.isfile(os.path.join(path, META)) or path.rstrip(os.sep).endswith(CKPT_LAST):
        return path   # a file, a resume state, or a run's ckpt_last.dcp (load_checkpoint reads its newest state)
    best = os.path.join(path, CKPT_BEST)
    return best if os.path.isfile(best) else resume_path(path) or path


def load_weights(model, state_dict, path):
    """A ckpt.pt's weights into the model (whole, or each rank its FSDP shards); UserError where they do not fit."""
    state_dict = {k: v.reshape(1) if v.dim() == 0 else v for k, v in state_dict.items()}   # older code's 0-d alpha
    try:
        set_model_state_dict(model, state_dict, options=StateDictOptions(full_state_dict=True))
    except (KeyError, ValueError, RuntimeError) as e:   # a missing key, a tensor of another shape: named
        raise UserError(f"{path} does not fit this model: {one_line(e)}") from None


def append_log(out_dir, row):
    """One evaluation's line in log.jsonl (strict JSON: a NaN is null). A resumed run logs again what a killed one
    logged after its resume state: read_log keeps each iteration's last line."""
    row = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}
    try:
        with open(os.path.join(out_dir, LOG), "a") as f:
            f.write(json.dumps(row, allow_nan=False) + "\n")
    except OSError as e:
        raise UserError(f"cannot write {os.path.join(out_dir, LOG)} at iter {row['iter']}: {e.strerror or e}; "
                        f"{intact(out_dir)}", IO_ERROR) from None
