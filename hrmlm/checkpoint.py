"""
The run folder (out_dir) train.py writes and sample.py, analyze.py and plot.py read:

    out_dir/ckpt_last.dcp/ everything a resume needs (weights, AdamW state, settings, iteration), every eval: a
                           torch.distributed.checkpoint folder that each rank (or the one process) writes its own
                           shards into (no rank gathers the model); any world size, or one process, reads it
    out_dir/ckpt.pt        the best model so far (weights and settings only, for sampling)
    out_dir/log.jsonl      one JSON line per evaluation
    out_dir/.lock          held (flock) by the train.py run using the folder

Every save is atomic and checksummed; every load is weights_only=True and checks the sums; a failure is one line.
An older code's ckpt_last.pt is still read (resumed, sampled), and replaced by ckpt_last.dcp at the first save.
start_run and Run are train.py's run: every check before work, what a resume restores, the saves.
"""

import fcntl
import functools
import json
import logging
import math
import os
import pickle
import shutil
import sys
import threading
import time
import warnings
import zlib
from contextlib import suppress
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hrmlm import parallel
from hrmlm.common import IO_ERROR, atomic_write, fail, one_line
from model import MODEL_FIELDS, ModelConfig, build_model

CKPT_BEST, CKPT_LAST, LOG, LOCK = "ckpt.pt", "ckpt_last.dcp", "log.jsonl", ".lock"
OLD_LAST = "ckpt_last.pt"   # older code's single-file resume state: read, never written
RUN_FILES = (LOG, CKPT_BEST, CKPT_LAST, OLD_LAST)   # what makes a folder hold a run
# dcp warns (from its writer's thread too) whenever one process saves or loads alone: every run without torchrun
warnings.filterwarnings("ignore", "torch.distributed is disabled, unavailable or uninitialized")
DCP_META = "meta.pt"   # in ckpt_last.dcp: everything but the tensors (settings, iteration, AdamW's hyperparameters)
# Settings a resume must keep: they decide which tokens each iteration sees and how val is measured, so
# changing them breaks exact resume. The others (max_iters, the learning-rate schedule, ...) may change.
DATA_KEYS = ("dataset", "batch_size", "block_size", "seed", "gradient_accumulation_steps", "eval_iters")
SILENT_KEYS = ("init_from", "out_dir", "data_dir", "overwrite", "device", "compile", "log_interval", "fsdp",
               "wandb_log", "wandb_project", "wandb_run_name")


def take_out_dir(out_dir, init_from, overwrite, eval_only):
    """Create out_dir, lock it for this process, and refuse to mix two runs in it. Returns (the open lock
    file, which the caller keeps for the whole run, None), or (None, one line saying why not)."""
    if not out_dir:
        return None, "out_dir is empty; give a folder, e.g. --out_dir=out"
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        return None, f"out_dir {out_dir!r} is a file, not a folder"
    try:
        os.makedirs(out_dir, exist_ok=True)
        lock = open(os.path.join(out_dir, LOCK), "a+")
        probe = os.path.join(out_dir, f".write_test.{os.getpid()}")
        open(probe, "w").close()
        os.remove(probe)
    except OSError as e:
        return None, f"cannot use out_dir {out_dir!r}: {e.strerror or e} (a file in its path, or not writable)"
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)   # the OS drops it when the process dies, however
    except OSError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        return None, (f"out_dir {out_dir!r} is in use by another train.py run ({holder}); wait for it or use "
                      f"another out_dir")
    try:
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} on {os.uname().nodename}, since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        lock.flush()
    except OSError as e:   # a full disk: the lock is held, its note cannot be written; nothing else was touched
        return None, f"cannot use out_dir {out_dir!r}: {e.strerror or e}; {intact(out_dir)}"
    dcp = os.path.join(out_dir, CKPT_LAST)
    if not os.path.exists(dcp) and os.path.isdir(dcp + ".tmp.old"):   # killed between save_sharded's two renames
        os.replace(dcp + ".tmp.old", dcp)
    for name in os.listdir(out_dir):  # temporaries of a save that crashed or was killed: we hold the lock
        if name.startswith(tuple(f"{n}.tmp" for n in RUN_FILES)):
            remove(os.path.join(out_dir, name))
    held = [n for n in RUN_FILES if os.path.exists(os.path.join(out_dir, n))]
    if init_from == "scratch" and held and eval_only:   # surely meant: evaluate the run the folder holds
        return None, (f"out_dir {out_dir!r} holds a run ({', '.join(held)}), but --eval_only=True without "
                      f"--init_from=resume evaluates a new, untrained model; add --init_from=resume")
    if init_from != "resume" and held and not eval_only:
        if not overwrite:
            return None, (f"out_dir {out_dir!r} already holds a run ({', '.join(held)}); resume it with "
                          f"--init_from=resume, replace it with --overwrite=True, or choose another --out_dir")
        for n in held:
            remove(os.path.join(out_dir, n))
    if init_from == "resume" and not os.path.exists(resume_path(out_dir)):
        return None, (f"init_from='resume' but {os.path.join(out_dir, CKPT_LAST)} does not exist" +
                      (f" (the folder holds only {', '.join(held)}: a run stopped before its first checkpoint); start "
                       f"it again with --init_from=scratch --overwrite=True" if held else ""))
    return lock, None


def remove(path):
    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def resume_path(out_dir):
    """The checkpoint --init_from=resume reads: ckpt_last.dcp, else an older run's ckpt_last.pt (the first save of
    ckpt_last.dcp removes it: a kill in between leaves both, and the folder is the later)."""
    dcp, pt = os.path.join(out_dir, CKPT_LAST), os.path.join(out_dir, OLD_LAST)
    return pt if os.path.isfile(pt) and not os.path.isdir(dcp) else dcp


def read_info(path):
    """A checkpoint's settings and iteration: a file memory-mapped (no tensor read until used), or a dcp's meta.pt."""
    return torch.load(os.path.join(path, DCP_META) if os.path.isdir(path) else path, map_location="cpu",
                      weights_only=True, mmap=True)


def intact(out_dir, damaged=None):
    """What a run can still be resumed or sampled from, for an error line: 'intact: ckpt.pt (iter 200), ...'."""
    held = []
    for path in (os.path.join(out_dir, CKPT_BEST), resume_path(out_dir)):
        with suppress(Exception):   # absent or unreadable: not something to resume or sample from
            if not damaged or os.path.abspath(path) != os.path.abspath(damaged):
                held.append(f"{path} (iter {read_info(path)['iter_num']})")
    return "intact: " + (", ".join(held) or "no checkpoint")


def stop_on_write_error(what, iter_num, e, out_dir, show=True):
    """A failed write (a full disk) ends the run at once (os._exit: nothing that could block on a collective runs;
    torchrun stops the other ranks), exit status 1, with one line naming what is still intact."""
    reason = e.strerror if isinstance(e, OSError) and e.strerror else f"{one_line(e)} (is the disk full?)"
    fail(f"cannot {what} at iter {iter_num}: {reason}; {intact(out_dir)}", IO_ERROR, "train.py", show=show, now=True)


def find_checkpoint(path):
    """init_from=<path>: the checkpoint file (or ckpt_last.dcp folder) itself, or in a train.py out_dir its ckpt.pt,
    else its ckpt_last.dcp (or older code's ckpt_last.pt). ValueError (one line) where there is none."""
    if os.path.isfile(path) or os.path.isfile(os.path.join(path, DCP_META)):
        return path
    for name in (CKPT_BEST, CKPT_LAST, OLD_LAST):
        if os.path.exists(os.path.join(path, name)):
            return os.path.join(path, name)
    raise ValueError(f"init_from={path!r} is neither 'scratch', 'resume', a checkpoint file nor a folder holding "
                     f"{CKPT_BEST} or {CKPT_LAST}")


def checksums(obj, at=""):
    """CRC-32 of every tensor's bytes in a checkpoint's (nested) entries, by its path ('model/L_net.alpha')."""
    if torch.is_tensor(obj):
        return {at: zlib.crc32(obj.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    return {k: v for key, val in items for k, v in checksums(val, f"{at}/{key}" if at else str(key)).items()}


def file_crc(path):
    with open(path, "rb") as f:
        return functools.reduce(lambda crc, chunk: zlib.crc32(chunk, crc), iter(lambda: f.read(1 << 24), b""), 0)


def save_checkpoint(path, ckpt):
    """ckpt.pt, with its checksums, atomically (common.atomic_write: a kill mid-save leaves the previous file). A
    failed save (a full disk: OSError, or torch's zip writer's RuntimeError) stops the run with one line."""
    ckpt = dict(ckpt, checksums=checksums({k: ckpt[k] for k in ("model", "optimizer") if k in ckpt}))
    try:
        with atomic_write(path, "wb") as f:
            torch.save(ckpt, f)
    except (OSError, RuntimeError) as e:
        stop_on_write_error(f"save {path}", ckpt.get("iter_num"), e, os.path.dirname(path))


def load_checkpoint(path):
    """A train.py checkpoint as a dict, weights_only=True (no pickled code runs); each failure a one-line ValueError."""
    sharded = os.path.isfile(os.path.join(path, DCP_META))
    if not os.path.isfile(path) and not sharded:
        raise ValueError(f"no checkpoint at {path}" + (" (it is a folder)" if os.path.isdir(path) else ""))
    try:   # mmap: the tensors stay in the file until used (a resume holds one copy of the weights, not two)
        ckpt = read_info(path)
    except pickle.UnpicklingError:  # torch's own message advises weights_only=False: never do that here
        raise ValueError(f"{path} holds Python objects other than tensors and was not loaded "
                         f"(not a train.py checkpoint, or unsafe)") from None
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise ValueError(f"cannot load {path}: {type(e).__name__}: {first} (truncated or not a checkpoint)") from None
    if sharded and isinstance(ckpt, dict):
        ckpt["sharded"] = path   # the tensors stay in the folder: load_sharded reads them into a model
    if not isinstance(ckpt, dict) or not {"model", "model_args"} <= ckpt.keys() and "sharded" not in ckpt:
        raise ValueError(f"{path} is not a train.py checkpoint (no 'model' and 'model_args' entries)")
    if saved := ckpt.get("checksums"):   # a damaged byte is never trusted (older code wrote no checksums)
        if "sharded" in ckpt:   # each of torchrun's ranks checks every W-th file
            rank, world, _ = _dist()
            bad = [n if os.path.isfile(f) else f"{n} missing" for n in sorted(saved)[rank::world]
                   if not os.path.isfile(f := os.path.join(path, n)) or file_crc(f) != saved[n]]
        else:
            now = checksums({k: ckpt[k] for k in ("model", "optimizer") if k in ckpt})
            bad = [k for k in saved if now.get(k) != saved[k]] + [k for k in now if k not in saved]
        if bad:
            raise ValueError(f"{path} is damaged: {len(bad)} {'file' if 'sharded' in ckpt else 'tensor'}(s) missing "
                             f"or not as written (checksums: {', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); "
                             f"{intact(os.path.dirname(os.path.normpath(path)), damaged=path)}")
    if "model" in ckpt:   # older code kept alpha and tau 0-d; model.py keeps them as 1-element vectors
        ckpt["model"] = {k: v.reshape(1) if v.dim() == 0 else v for k, v in ckpt["model"].items()}
    return ckpt


def nonfinite_tensors(state_dict):
    return [k for k, v in state_dict.items() if v.is_floating_point() and not torch.isfinite(v).all()]


def model_from_checkpoint(ckpt, path="the checkpoint"):
    """The model a checkpoint (load_checkpoint's dict) holds. Refuses non-finite weights: such a model only ever
    samples one token and trains with every step skipped."""
    bad = nonfinite_tensors(ckpt.get("model", {}))
    if bad:
        raise ValueError(f"{path} has non-finite weights in {len(bad)} tensor(s) ({', '.join(bad[:3])}"
                         f"{', ...' if len(bad) > 3 else ''}); use an earlier checkpoint")
    try:
        model = build_model(ModelConfig(**ckpt["model_args"]))
        if "sharded" in ckpt:   # an FSDP run's ckpt_last.dcp, read whole by this one process
            load_sharded(ckpt["sharded"], model)
        else:
            model.load_state_dict(ckpt["model"])
    except ShardError:
        raise
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{path} does not build a model: {one_line(e)}") from None
    return model


# --- ckpt_last.dcp: the resume state, sharded (one shard file in one process) -------------------------------

def _dist():
    """(rank, world size, barrier) of torchrun's process group, or of the one process."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), dist.barrier
    return 0, 1, lambda: None


PENDING = []      # the save of ckpt_last.dcp being written in the background: (thread, future, path, info, error)
SAVE_GROUP = []   # under torchrun, the process group those background writes coordinate on (gloo, their own)


def save_sharded(path, model, optimizer, info, master, wait=True):
    """ckpt_last.dcp: every rank's shards of the weights and AdamW state, copied to host memory at once and written
    into path.tmp in the background (dcp.async_save) while training goes on; once every rank's are written, rank 0
    (in the background too) adds meta.pt (info, AdamW's hyperparameters, every file's checksum) and swaps the
    folder in whole: a kill before that leaves the previous one. finish_sharded waits for it (the next save, the
    run's end, a signal's save: wait=True). Every rank calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict
    finish_sharded()
    tmp, old = path + ".tmp", path + ".tmp.old"
    rank, world, barrier = _dist()
    try:
        if master and os.path.exists(tmp):
            shutil.rmtree(tmp)
        barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        groups = [{k: v for k, v in g.items() if k != "params"} for g in optim_sd["param_groups"]]
        if dist.is_initialized() and not SAVE_GROUP:   # training's collectives stay on the default group, never
            SAVE_GROUP.append(dist.new_group(backend="gloo"))   # interleaved; and async_save needs a CPU backend,
            # which NCCL's default group lacks (one GPU under torchrun too)
        future = dcp.async_save({"model": model_sd, "optimizer": optim_sd["state"]}, checkpoint_id=tmp,
                                no_dist=world == 1, process_group=SAVE_GROUP[0] if SAVE_GROUP else None)
    except (OSError, RuntimeError, CheckpointException) as e:   # the last: dcp's, a BaseException
        save_failed(e, path, info, master)
    error = []   # swap_in's, for finish_sharded to report

    def swap_in():   # rank 0's end: the old folder leaves only once the new one is whole, and older code's file
        try:
            future.result()
            sums = {n: file_crc(os.path.join(tmp, n)) for n in os.listdir(tmp)}
            with atomic_write(os.path.join(tmp, DCP_META), "wb") as f:
                torch.save(dict(info, param_groups=groups, checksums=sums), f)
            if os.path.exists(path):
                os.replace(path, old)
            os.replace(tmp, path)
            for stale in (old, os.path.join(os.path.dirname(path), OLD_LAST)):
                with suppress(OSError):   # absent, or it cannot go (read-only): harmless, a resume reads ckpt_last.dcp
                    remove(stale)
        except (OSError, RuntimeError, CheckpointException) as e:
            error.append(e)
    thread = threading.Thread(target=swap_in, daemon=True) if master else None
    if thread:
        thread.start()
    PENDING.append((thread, future, path, info, error))
    if wait:
        finish_sharded()


def finish_sharded():
    """Wait for a pending save of ckpt_last.dcp to be whole (or stop with its error, one line). Every rank calls it."""
    from torch.distributed.checkpoint.api import CheckpointException
    if not PENDING:
        return
    thread, future, path, info, error = PENDING.pop()
    try:
        future.result()   # this rank's writes: their error, if any, is raised here
        if thread:
            thread.join()
            if error:
                raise error[0]
        _dist()[2]()   # barrier: every rank past the swap before the next save starts
    except (OSError, RuntimeError, CheckpointException) as e:
        save_failed(e, path, info, thread is not None)


def save_failed(e, path, info, master):
    """A failed save of ckpt_last.dcp (a full disk): its half-written folder goes now, and the run stops (one line)."""
    e = next(iter(e.failures.values()), (e,))[0] if hasattr(e, "failures") else e   # dcp's: {rank: (exception, tb)}
    if master:
        shutil.rmtree(path + ".tmp", ignore_errors=True)
    # a rank whose own write worked sees the failing rank leave its collective: that one speaks for both
    stop_on_write_error(f"save {path}", info.get("iter_num"), e, os.path.dirname(path),
                        show=master or isinstance(e, OSError))


def load_sharded(path, model, optimizer=None, param_groups=None):
    """ckpt_last.dcp into this model (at any world size, FSDP or not: each rank reads the pieces it holds) and, given,
    the optimizer with the saved AdamW hyperparameters. ValueError (one line): it does not fit, or a weight is NaN."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_model_state_dict, set_state_dict
    try:
        model_sd, optim_sd = get_state_dict(model, optimizer or [])   # optim_sd: {} without one
        if not os.path.isfile(os.path.join(path, ".metadata")):   # written last: the save did not finish
            raise ShardError(f"{path}: its .metadata (the index of its shards) is missing; resume from an "
                             f"intact checkpoint")
        state = {"model": model_sd} | ({"optimizer": optim_sd["state"]} if optim_sd else {})
        logging.disable(logging.ERROR)   # dcp logs each failure with a traceback; the line below is the one
        try:
            dcp.load(state, checkpoint_id=path, no_dist=_dist()[1] == 1)   # in place, into this rank's tensors
        except CheckpointException as e:        # a BaseException: a shard missing, truncated or foreign
            why = next(iter(e.failures.values()), (e,))[0]   # {rank: (exception, its traceback)}
            if isinstance(why, (ValueError, RuntimeError)):   # the planner's: a tensor missing or of another shape
                raise ShardError(f"{path} does not fit this model: {one_line(why, 200)}") from None
            raise ShardError(f"{path}: cannot read a shard or its index ({one_line(why, 200)}): one is "
                             f"missing or damaged; resume from an intact checkpoint") from None
        finally:
            logging.disable(logging.NOTSET)
        bad = nonfinite_tensors({k: getattr(v, "_local_tensor", v) for k, v in model_sd.items()})
        if bad:
            raise ValueError(f"non-finite weights ({', '.join(bad[:3])}); use an earlier checkpoint or start again")
        if optimizer is None:
            return set_model_state_dict(model, model_sd)
        if len(param_groups) != len(optim_sd["param_groups"]):
            raise ValueError(f"it holds {len(param_groups)} AdamW parameter groups, this run has "
                             f"{len(optim_sd['param_groups'])} (scalar_lr_mult != 1 adds one)")
        optim_sd["param_groups"] = [dict(saved, params=g["params"])
                                    for saved, g in zip(param_groups, optim_sd["param_groups"])]
        set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)   # shapes: dcp's
    except ShardError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, AssertionError) as e:
        raise ValueError(f"{path} does not fit this model: {one_line(e)}") from None


class ShardError(ValueError):
    """load_sharded's error that is already the whole line (a shard missing or truncated, a tensor that does not
    fit): its callers pass it on as it is."""


def load_optimizer_state(model, optimizer, osd, path):
    """An older ckpt_last.pt's AdamW state (torch's positional format; alpha's and tau's moments 0-d), at any world
    size: positions become parameter names, which set_optimizer_state_dict shards under FSDP. ValueError (one line)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    vec = lambda k, t: t.reshape(1) if t.dim() == 0 and k != "step" else t  # noqa: E731
    try:
        osd = {"state": {order[i]: {k: vec(k, t) for k, t in st.items()} for i, st in osd["state"].items()},
               "param_groups": [dict(g, params=[order[i] for i in g["params"]]) for g in osd["param_groups"]]}
        set_optimizer_state_dict(model, optimizer, osd, options=StateDictOptions(full_state_dict=True))
        for p in (p for g in optimizer.param_groups for p in g["params"]):   # torch checks the groups' sizes only
            for k, v in optimizer.state.get(p, {}).items():
                if k != "step" and torch.is_tensor(v) and v.shape != p.shape:
                    raise ValueError(f"the AdamW {k} of a parameter of shape {tuple(p.shape)} has shape "
                                     f"{tuple(v.shape)}")
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{path}: its optimizer state does not fit this model: {one_line(e)}") from None


def check_resume(ckpt, path, model_args, config, meta):
    """Whether the run `config` (with `model_args` and the dataset's `meta`) can resume ckpt exactly.
    Returns (errors, notes): one line per reason it cannot; the schedule settings that changed (allowed)."""
    errors = []
    saved = {k: ckpt.get("model_args", {}).get(k, getattr(ModelConfig, k)) for k in model_args}   # older: defaults
    diff = [f"{k}={saved[k]!r} in the checkpoint vs {v!r} now" for k, v in model_args.items() if saved[k] != v]
    if diff:
        errors.append(f"{path} holds a different model: " + ", ".join(diff))
    old = ckpt.get("config", {})
    changed = {k: (old[k], config[k]) for k in config if k in old and old[k] != config[k] and k not in MODEL_FIELDS}
    data_diff = [f"{k}={a!r} in the checkpoint vs {b!r} now" for k, (a, b) in changed.items() if k in DATA_KEYS]
    if (ckpt.get("meta") or {}).get("tokens") and meta and meta.get("tokens") != ckpt["meta"]["tokens"]:
        data_diff.append(f"the dataset's token counts {ckpt['meta']['tokens']} in the checkpoint vs "
                         f"{meta.get('tokens')} now (prepared again?)")
    mult = [(c.get("scalar_lr_mult", 1.0) != 1) for c in (old, config)]
    if model_args.get("arch") == "hrm" and mult[0] != mult[1] and "scalar_lr_mult" in config:
        errors.append(f"{path} was trained with scalar_lr_mult={old.get('scalar_lr_mult', 1.0):g}, this run has "
                      f"{config['scalar_lr_mult']:g}: its AdamW state has {3 if mult[0] else 2} parameter groups, this "
                      f"run {3 if mult[1] else 2} (alpha and tau on their own, or not); resume with "
                      f"--scalar_lr_mult={old.get('scalar_lr_mult', 1.0):g}")
    if data_diff:
        errors.append(f"cannot resume {path} exactly: " + ", ".join(data_diff) +
                      "; use the checkpoint's settings, or start a new run in another out_dir")
    if "optimizer" not in ckpt and "sharded" not in ckpt:
        errors.append(f"{path} holds no optimizer state, so training cannot resume from it exactly "
                      f"(ckpt.pt is the weights-only copy for sampling; resume from ckpt_last.dcp)")
    bad = nonfinite_tensors(ckpt.get("model", {}))   # a sharded one: load_sharded checks its pieces
    if bad:
        errors.append(f"{path} has non-finite weights ({', '.join(bad[:3])}); it cannot train; use an earlier "
                      f"checkpoint or start again")
    notes = [f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items() if k not in DATA_KEYS + SILENT_KEYS]
    return errors, notes


def append_log(out_dir, row):
    """One evaluation's line in out_dir/log.jsonl. A failed write (a full disk) stops the run with one line; a
    half-written line is dropped by trim_log when the run resumes."""
    row = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}   # strict JSON
    try:
        with open(os.path.join(out_dir, LOG), "a") as f:
            f.write(json.dumps(row, allow_nan=False) + "\n")
    except OSError as e:
        stop_on_write_error(f"write {os.path.join(out_dir, LOG)}", row["iter"], e, out_dir)


def trim_log(out_dir, upto):
    """On resume, drop log lines after the checkpoint's iteration (written before a kill that came ahead of
    the checkpoint, so the resumed run logs them again) and any half-written line: one line per iteration."""
    path = os.path.join(out_dir, LOG)
    if not os.path.exists(path):
        return
    keep = []
    with open(path) as f:
        for line in f:
            with suppress(ValueError, KeyError, TypeError):
                if json.loads(line)["iter"] <= upto:
                    keep.append(line if line.endswith("\n") else line + "\n")
    try:
        with atomic_write(path) as f:
            f.writelines(keep)
    except OSError as e:   # a full disk: the log stays as it was, the temporary goes
        raise ValueError(f"cannot rewrite {path} for the resume: {e.strerror or e}; it was left as it was, "
                         f"{intact(out_dir)}") from None


def read_log(out_dir):
    """log.jsonl's rows sorted by iteration (one logged twice: its last line), and how many lines are not a JSON object
    with an integer "iter" (a run killed mid-write, a hand edit). ValueError (one line) where no line is."""
    path = os.path.join(out_dir, LOG)
    if not os.path.isfile(path):
        raise ValueError(f"{path} not found (is {out_dir!r} a train.py out_dir?)")
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [line for line in f if line.strip()]
    rows = []
    for line in lines:
        with suppress(ValueError):
            rows.append(json.loads(line))
    rows = [r for r in rows if isinstance(r, dict) and type(r.get("iter")) is int]   # not a bool either
    skipped = len(lines) - len(rows)
    if not rows:
        raise ValueError(f"{path} has no log lines" + (f" ({skipped} malformed)" if skipped else " (it is empty)") +
                         "; train.py writes one per evaluation")
    by_iter = {r["iter"]: r for r in rows}
    return [by_iter[i] for i in sorted(by_iter)], skipped


# --- train.py's run: every check before work (start_run), what a resume restores, and the saves ----------

@dataclass
class Run:
    """A train.py run whose every check has passed. The counters at the end are what ckpt_last.dcp keeps and a
    resume continues; the rest is fixed for the run."""
    config: dict             # the settings (micro-batches fitted to the world size; vocab_size the dataset's)
    ranks: object            # parallel.Ranks: this process among torchrun's (or alone)
    splits: dict             # the dataset's train/val tokens, memory-mapped (data.open_dataset)
    meta: dict               # its meta.json (None where there is none)
    model_args: dict         # the ModelConfig fields, as checkpoints keep them
    source: str = None       # the checkpoint the weights come from (None: from scratch)
    ckpt: dict = None        # that checkpoint, loaded; each part dropped once applied
    lock: object = None      # out_dir's flock, held until the process ends: one run per out_dir
    wandb: object = None     # the Weights & Biases run (wandb_log), on the master
    iter_num: int = 0
    best_val_loss: float = float("inf")   # from the step-0 evaluation: a "good" model must beat the initial one
    best_iter: int = None
    skipped_total: int = 0   # non-finite iterations skipped so far
    eval_pending: bool = False   # a signal stopped the evaluation of iter_num: the resume does it first
    grad_norm: float = float("nan")   # the last finite step's, which that evaluation logs
    notes: list = field(default_factory=list)   # printed once every check has passed (restore)

    @property
    def resume(self):
        return self.config["init_from"] == "resume"

    def save(self, path, model, optimizer, wait=True):
        """ckpt.pt (the best model, for sampling): weights and settings, one file the master writes; ckpt_last.dcp
        (to resume) also the AdamW state and the counters, sharded (save_sharded). Every rank calls it."""
        finish_sharded()   # the last resume state first, whole (or its error, one line): saves stay in order
        info = {"model_args": self.model_args, "config": self.config, "iter_num": self.iter_num,
                "best_val_loss": self.best_val_loss, "best_iter": self.best_iter, "meta": self.meta}
        if os.path.basename(path) == CKPT_LAST:
            info.update(skipped_total=self.skipped_total, eval_pending=self.eval_pending, grad_norm=self.grad_norm)
            return save_sharded(path, model, optimizer, info, self.ranks.master, wait)
        if self.config["fsdp"]:   # a collective: every rank's shards gathered, to the master's CPU
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
            model_sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.ranks.master:
            save_checkpoint(path, dict(info, model=model_sd if self.config["fsdp"] else model.state_dict()))

    def load_weights(self, model):
        """A single-file checkpoint's weights into the model (whole, or each rank its FSDP shards), dropped from
        the checkpoint at once (its memory too). A sharded one's come with the optimizer (restore)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        if self.ckpt is not None and "model" in self.ckpt:
            try:
                set_model_state_dict(model, self.ckpt.pop("model"), options=StateDictOptions(full_state_dict=True))
            except (KeyError, ValueError, RuntimeError) as e:   # a missing key, a tensor of another shape: named
                return [f"{self.source} does not fit this model: {one_line(e)}"]
        return []

    def restore(self, model, optimizer, errors):
        """The rest of the start once the model and optimizer exist: a sharded checkpoint's weights, and to resume
        the AdamW state and counters, dropping what a killed run logged after it; wandb. Stops every rank on any
        error (`errors`: load_weights', one line each), else prints the notes (on the master)."""
        c, master = self.config, self.ranks.master
        if self.ckpt is not None and not errors:
            try:
                if "sharded" in self.ckpt:
                    load_sharded(self.source, model, optimizer if self.resume else None, self.ckpt.get("param_groups"))
                elif self.resume:   # an older ckpt_last.pt: its weights came with load_weights
                    load_optimizer_state(model, optimizer, self.ckpt.pop("optimizer"), self.source)
                if self.resume and master:
                    trim_log(c["out_dir"], self.ckpt["iter_num"])
            except ValueError as e:
                errors.append(str(e))
        if c["wandb_log"] and master and not errors:
            import wandb
            try:   # out_dir/wandb; WANDB_MODE=offline needs no account
                self.wandb = wandb.init(project=c["wandb_project"], config=c, dir=c["out_dir"],
                                        name=c["wandb_run_name"] or os.path.basename(os.path.abspath(c["out_dir"])))
            except Exception as e:   # e.g. not logged in
                errors.append(f"wandb_log=True but wandb.init failed: {one_line(e)}")
        parallel.stop_on_errors(errors, self.ranks)
        if self.ckpt is not None and not self.resume:   # a new run from these weights: a fresh optimizer and schedule
            self.notes.append(f"starting from the weights of {self.source} (iter {self.ckpt['iter_num']})")
        elif self.ckpt is not None:   # where the run stopped
            for k in ("iter_num", "best_val_loss", "best_iter", "skipped_total", "eval_pending", "grad_norm"):
                setattr(self, k, self.ckpt.get(k, getattr(self, k)))
        for note in self.notes if master else ():
            print(note, flush=True)
        self.ckpt = None


def start_run(config, ranks, dtype):
    """Every check train.py can make before work, in order: settings, dataset, model, wandb; out_dir holds this run,
    finished (exit 0); out_dir's lock; the checkpoint and whether a resume fits it. Every rank stops on the problems
    together, one line each (exit status 2); else the Run, its checkpoint loaded, its notes left for Run.restore."""
    from hrmlm import data
    from configurator import check_train_settings, train_setting_notes
    c = config
    errors = check_train_settings(dict(c, dtype=dtype), ranks.ddp)   # ranges, choices, combinations
    resume, notes = c["init_from"] == "resume", []   # notes: printed once every check has passed
    notes += [] if errors else train_setting_notes(c)

    def attempt(f, *args):   # its ValueError is one more error line
        try:
            return f(*args)
        except ValueError as e:
            errors.append(str(e))

    def fit_micro_batches(saved=None):   # parallel.micro_batches: a resumed run keeps its checkpoint's (saved)
        accum, batch, note = parallel.micro_batches(c["gradient_accumulation_steps"], c["batch_size"],
                                                    ranks.world_size, saved)
        c.update(gradient_accumulation_steps=accum, batch_size=batch)
        notes.extend([note] if note else [])
    if ranks.ddp and not ranks.device.startswith("cuda"):   # torchrun without a usable GPU: say where it runs
        notes.append(f"note: {ranks.world_size} processes on the CPU (gloo), not GPUs: torch sees no GPU it can use")
    if not resume:   # a new run on more ranks than its config was written for splits its micro-batches
        attempt(fit_micro_batches)
    splits, meta = attempt(data.open_dataset, c["data_dir"], c["dataset"], c["block_size"],   # checked: meta.json,
                           c["vocab_size"]) or ({}, None)   # and each split long enough for block_size
    c["vocab_size"] = meta["vocab_size"] if meta else c["vocab_size"] or 50257   # the dataset's
    model_args = {k: c[k] for k in MODEL_FIELDS}
    attempt(lambda: ModelConfig(**model_args))
    if c["wandb_log"] and ranks.master:
        try:
            import wandb  # noqa: F401
        except ImportError:
            errors.append("wandb_log=True needs the wandb package: pip install wandb (or leave wandb_log off)")
    run = Run(c, ranks, splits, meta, model_args, notes=notes)
    out_dir = c["out_dir"]
    finished = False   # out_dir holds this very run, finished: the same command again
    if not resume and not c["overwrite"] and not c["eval_only"] and not errors:
        with suppress(Exception):   # no run there, or not one to compare
            old = read_info(resume_path(out_dir))
            finished = old["iter_num"] >= c["max_iters"] and all(
                k not in old["config"] or old["config"][k] == v for k, v in c.items() if k not in SILENT_KEYS)
    if finished:   # say so, touch nothing
        if ranks.master:
            print(f"{out_dir} holds this run, finished (iter {old['iter_num']}, best val loss "
                  f"{old['best_val_loss']:.4f}): nothing to do; sample it with python sample.py --out_dir={out_dir}, "
                  f"or train it again with --overwrite=True", flush=True)
        sys.exit(parallel.end_process_group(ranks))
    if ranks.master and not errors:
        mode = c["init_from"] if c["init_from"] in ("resume", "scratch") else "from"
        run.lock, problem = take_out_dir(out_dir, mode, c["overwrite"], c["eval_only"])
        errors += [problem] if problem else []
    parallel.stop_on_errors(errors, ranks)
    if c["init_from"] != "scratch":   # every rank loads it: ckpt_last.dcp to resume, or a new run's weights
        run.source = resume_path(out_dir) if resume else attempt(find_checkpoint, c["init_from"])
        run.ckpt = run.source and attempt(load_checkpoint, run.source)
    if resume and run.ckpt is not None:
        attempt(fit_micro_batches, tuple(run.ckpt.get("config", {}).get(k, c[k])
                                         for k in ("gradient_accumulation_steps", "batch_size")))
        problems, changed = check_resume(run.ckpt, run.source, model_args, c, meta)
        errors += problems
        if changed:
            notes.append("note: resuming with changed settings (the schedule, not the data): " + ", ".join(changed))
    parallel.stop_on_errors(errors, ranks)
    return run
