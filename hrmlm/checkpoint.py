"""
The run folder (out_dir) train.py writes and sample.py, analyze.py and plot.py read:

    out_dir/ckpt_last.dcp/ everything a resume needs (weights, AdamW state, settings, iteration), every eval: a
                           torch.distributed.checkpoint folder that each rank (or the one process) writes its own
                           shards into (no rank gathers the model); any world size, or one process, reads it
    out_dir/ckpt.pt        the best model so far (weights and settings only, for sampling)
    out_dir/log.jsonl      one JSON line per evaluation
    out_dir/.lock          held (flock) by the train.py run using the folder

Each function takes what it needs as arguments, so every script (and a test) can use it alone:
  take_out_dir     lock the folder and refuse to mix two runs in it
  finished_run     whether the folder holds a finished run of these very settings (nothing to do)
  save_checkpoint  ckpt.pt, atomic (common.atomic_write: a temporary beside it, fsync, os.replace); a full disk is one line
  save_sharded, load_sharded  ckpt_last.dcp: written by every rank at once, in the background (finish_sharded
                   waits for it), read at any world size
                   (a ckpt_last.pt of older code is still read, and replaced by ckpt_last.dcp at the first save)
  load_checkpoint  weights_only=True (no pickled code runs), one-line errors; model_from_checkpoint
  find_checkpoint  init_from=<file or out_dir>: the checkpoint a new run starts from
  check_resume     what differs between a checkpoint and the settings of the run resuming it
  append_log, trim_log, read_log
  start_run, Run   train.py's run: every check before work, one line per problem; what a resume restores
                   (load_weights, restore); the saves of ckpt.pt and ckpt_last.dcp (save)
"""

import fcntl
import json
import logging
import math
import os
import pickle
import shutil
import sys
import time
import warnings
import zlib

from dataclasses import dataclass, field

import torch

from hrmlm import parallel
from hrmlm.common import IO_ERROR, atomic_write, fail, one_line
from model import MODEL_FIELDS, ModelConfig, build_model

CKPT_BEST, CKPT_LAST, LOG, LOCK = "ckpt.pt", "ckpt_last.dcp", "log.jsonl", ".lock"
OLD_LAST = "ckpt_last.pt"   # older code's single-file resume state: read, never written
RUN_FILES = (LOG, CKPT_BEST, CKPT_LAST, OLD_LAST)   # what makes a folder hold a run
# dcp warns, from its writer's thread too, whenever one process saves or loads alone: what every run without torchrun means
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
        return None, f"out_dir {out_dir!r} is in use by another train.py run ({holder}); wait for it or use another out_dir"
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
    """A run file, or an FSDP run's checkpoint folder."""
    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def resume_path(out_dir):
    """The checkpoint --init_from=resume reads: ckpt_last.dcp, else an older run's ckpt_last.pt (the first save of
    ckpt_last.dcp removes it: a kill in between leaves both, and the folder is the later)."""
    dcp, pt = os.path.join(out_dir, CKPT_LAST), os.path.join(out_dir, OLD_LAST)
    return pt if os.path.isfile(pt) and not os.path.isdir(dcp) else dcp


def read_info(path):
    """A checkpoint's settings and iteration without its tensors: a file memory-mapped (nothing is read until
    used), or an FSDP folder's meta.pt."""
    if os.path.isdir(path):
        path = os.path.join(path, DCP_META)
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def intact(out_dir, damaged=None):
    """What a run can still be resumed or sampled from, for an error line: 'intact: ckpt.pt (iter 200), ...'."""
    held = []
    for path in (os.path.join(out_dir, CKPT_BEST), resume_path(out_dir)):
        if damaged and os.path.abspath(path) == os.path.abspath(damaged):
            continue
        try:
            it = read_info(path)["iter_num"]
        except Exception:   # absent or unreadable: not something to resume or sample from
            continue
        held.append(f"{path} (iter {it})")
    return "intact: " + (", ".join(held) or "no checkpoint")


def stop_on_write_error(what, iter_num, e, out_dir, prog="train.py", show=True):
    """A write that failed (a full disk) ends the run at once, with one line naming what is still intact
    (now: nothing that could block on a collective runs; torchrun stops the other ranks). Exit status 1."""
    reason = e.strerror if isinstance(e, OSError) and e.strerror else f"{one_line(e)} (is the disk full?)"
    fail(f"cannot {what} at iter {iter_num}: {reason}; {intact(out_dir)}", IO_ERROR, prog, show=show, now=True)


def find_checkpoint(path):
    """init_from=<path>: the checkpoint file itself, or in a train.py out_dir its ckpt.pt (the best model),
    else its ckpt_last.dcp (or older code's ckpt_last.pt). ValueError (one line) where there is none."""
    if os.path.isfile(path):
        return path
    if os.path.isfile(os.path.join(path, DCP_META)):   # an FSDP run's ckpt_last.dcp itself
        return path
    for name in (CKPT_BEST, CKPT_LAST, OLD_LAST):
        if os.path.exists(os.path.join(path, name)):
            return os.path.join(path, name)
    raise ValueError(f"init_from={path!r} is neither 'scratch', 'resume', a checkpoint file nor a folder holding "
                     f"{CKPT_BEST} or {CKPT_LAST}")


def finished_run(out_dir, config):
    """'iter N, best val loss X' if out_dir holds a run of these very settings that reached max_iters (running
    its command again has nothing to do), else None."""
    try:
        ckpt = read_info(resume_path(out_dir))
        old, it = ckpt["config"], ckpt["iter_num"]
    except Exception:   # no such run, or not one to compare
        return None
    same = all(k not in old or old[k] == v for k, v in config.items() if k not in SILENT_KEYS)
    return f"iter {it}, best val loss {ckpt['best_val_loss']:.4f}" if same and it >= config["max_iters"] else None


def checksums(obj, at=""):
    """CRC-32 of every tensor's bytes in a checkpoint's (nested) entries, by its path ('model/L_net.alpha'):
    written with every checkpoint, compared when one is read, so a damaged byte is never trusted."""
    if torch.is_tensor(obj):
        return {at: zlib.crc32(obj.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    return {k: v for key, val in items for k, v in checksums(val, f"{at}/{key}" if at else str(key)).items()}


def file_crc(path):
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return crc


def verify(path, ckpt):
    """ValueError (one line naming the file, what differs and what is still intact) where a checkpoint's tensors, or
    an FSDP folder's files, differ from the checksums written with it. One without them (older code) passes.
    A folder's files are shared out over torchrun's ranks (each checks every W-th), one process checks all."""
    saved = ckpt.get("checksums")
    if not saved:
        return
    if "sharded" in ckpt:
        import torch.distributed as dist
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        names = sorted(saved)[rank::world]
        bad = [n if os.path.isfile(os.path.join(path, n)) else f"{n} missing" for n in names
               if not os.path.isfile(os.path.join(path, n)) or file_crc(os.path.join(path, n)) != saved[n]]
    else:
        now = checksums({k: ckpt[k] for k in ("model", "optimizer") if k in ckpt})
        bad = [k for k in saved if now.get(k) != saved[k]] + [k for k in now if k not in saved]
    if bad:
        out_dir = os.path.dirname(os.path.normpath(path))
        raise ValueError(f"{path} is damaged: {len(bad)} {'file' if 'sharded' in ckpt else 'tensor'}(s) missing or not "
                         f"as written (checksums: {', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); "
                         f"{intact(out_dir, damaged=path)}")


def save_checkpoint(path, ckpt):
    """Write ckpt (ckpt.pt) to path atomically: a temporary file beside it, fsync, then os.replace, so a kill mid-save
    leaves the previous file intact. A failed save (a full disk: OSError, or torch's zip writer's
    RuntimeError) removes its temporary and stops the run with one line (stop_on_write_error)."""
    ckpt = dict(ckpt, checksums=checksums({k: ckpt[k] for k in ("model", "optimizer") if k in ckpt}))
    try:
        with atomic_write(path, "wb") as f:
            torch.save(ckpt, f)
    except (OSError, RuntimeError) as e:
        stop_on_write_error(f"save {path}", ckpt.get("iter_num"), e, os.path.dirname(path))


def load_checkpoint(path):
    """A train.py checkpoint as a dict, loaded with weights_only=True (a pickle holding code never runs).
    Every failure is a ValueError with one line that names the file and the problem."""
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
    verify(path, ckpt)
    if "model" in ckpt:   # older code kept alpha and tau 0-d; model.py keeps them as 1-element vectors
        ckpt["model"] = {k: v.reshape(1) if v.dim() == 0 else v for k, v in ckpt["model"].items()}
    return ckpt


def check_optimizer_fits(optimizer):
    """Raise ValueError where a loaded AdamW moment has another shape than its parameter (torch checks the
    groups' sizes when it loads, not the shapes; a wrong shape would fail later, inside a step)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            for k, v in optimizer.state.get(p, {}).items():
                if k != "step" and torch.is_tensor(v) and v.shape != p.shape:
                    raise ValueError(f"the AdamW {k} of a parameter of shape {tuple(p.shape)} has shape {tuple(v.shape)}")


def nonfinite_tensors(state_dict):
    """Names of the floating-point tensors holding a NaN or Inf."""
    return [k for k, v in state_dict.items() if v.is_floating_point() and not torch.isfinite(v).all()]


def model_from_checkpoint(ckpt, path="the checkpoint"):
    """The model a train.py checkpoint holds (ckpt: the dict load_checkpoint returns). Refuses non-finite
    weights: such a model only ever samples one token and trains with every step skipped."""
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
    import torch.distributed as dist
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), dist.barrier
    return 0, 1, lambda: None


PENDING = []      # the save of ckpt_last.dcp being written in the background: (thread, future, path, info, error)
SAVE_GROUP = []   # under torchrun, the process group those background writes coordinate on (gloo, their own)


def save_sharded(path, model, optimizer, info, master, wait=True):
    """ckpt_last.dcp: every rank writes its own shards of the weights and AdamW state at once
    (torch.distributed.checkpoint), so no rank gathers the model and each writes 1/W of it; rank 0 adds
    meta.pt (info: settings, iteration, AdamW's hyperparameters; every file's checksum). The state is copied to
    host memory at once and written into path.tmp in the background (dcp.async_save) while training goes on; as
    soon as every rank's files are written, rank 0 (in the background too) sums them, writes meta.pt and swaps
    the folder in whole. A kill before that leaves the previous ckpt_last.dcp, as a kill mid-write always did.
    The next save, the run's end, a signal's save (wait=True) wait for it (finish_sharded). Every rank calls it."""
    import threading
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict
    finish_sharded()
    tmp = path + ".tmp"
    rank, world, barrier = _dist()
    try:
        if master and os.path.exists(tmp):
            shutil.rmtree(tmp)
        barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        groups = [{k: v for k, v in g.items() if k != "params"} for g in optim_sd["param_groups"]]
        if world > 1 and not SAVE_GROUP:   # training's collectives stay on the default group, never interleaved
            SAVE_GROUP.append(dist.new_group(backend="gloo"))
        future = dcp.async_save({"model": model_sd, "optimizer": optim_sd["state"]}, checkpoint_id=tmp,
                                no_dist=world == 1, process_group=SAVE_GROUP[0] if SAVE_GROUP else None)
    except (OSError, RuntimeError, CheckpointException) as e:   # the last: dcp's, a BaseException
        save_failed(e, path, info, master)
    error = []
    thread = threading.Thread(target=swap_in, args=(future, path, dict(info, param_groups=groups), error),
                              daemon=True) if master else None
    if thread:
        thread.start()
    PENDING.append((thread, future, path, info, error))
    if wait:
        finish_sharded()


def swap_in(future, path, info, error):
    """Rank 0's end of a background save, once dcp has written every rank's files (and its .metadata): their
    checksums and the rest into meta.pt, then the folder in place of the old one, which leaves only now; an
    older run's ckpt_last.pt beside it goes. An error is kept in `error` for finish_sharded to report."""
    from torch.distributed.checkpoint.api import CheckpointException
    tmp, old = path + ".tmp", path + ".tmp.old"
    try:
        future.result()
        sums = {n: file_crc(os.path.join(tmp, n)) for n in os.listdir(tmp)}
        with open(os.path.join(tmp, DCP_META), "wb") as f:
            torch.save(dict(info, checksums=sums), f)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(path):
            os.replace(path, old)
        os.replace(tmp, path)
        for stale in (old, os.path.join(os.path.dirname(path), OLD_LAST)):
            try:
                remove(stale)
            except OSError:   # absent, or it cannot go (read-only): harmless, a resume reads ckpt_last.dcp
                pass
    except (OSError, RuntimeError, CheckpointException) as e:
        error.append(e)


def finish_sharded():
    """Wait for the background save of ckpt_last.dcp, if one is pending, to be whole (or stop with its error, one
    line). Every rank calls it, at the same point."""
    from torch.distributed.checkpoint.api import CheckpointException
    if not PENDING:
        return
    thread, future, path, info, error = PENDING.pop()
    master = thread is not None
    try:
        future.result()   # this rank's writes: their error, if any, is raised here
        if thread:
            thread.join()
            if error:
                raise error[0]
        _dist()[2]()   # barrier: every rank past the swap before the next save starts
    except (OSError, RuntimeError, CheckpointException) as e:
        save_failed(e, path, info, master)


def save_failed(e, path, info, master):
    """A save of ckpt_last.dcp that failed (a full disk): its half-written folder goes now, not at the next start,
    and the run stops with one line (stop_on_write_error)."""
    from torch.distributed.checkpoint.api import CheckpointException
    if isinstance(e, CheckpointException):
        e = next(iter(e.failures.values()), (e,))[0]   # {rank: (exception, its traceback)}
    if master:
        shutil.rmtree(path + ".tmp", ignore_errors=True)
    # a rank whose own write worked sees the failing rank leave its collective: that one speaks for both
    stop_on_write_error(f"save {path}", info.get("iter_num"), e, os.path.dirname(path),
                        show=master or isinstance(e, OSError))


def load_sharded(path, model, optimizer=None, param_groups=None):
    """ckpt_last.dcp into this model (FSDP-sharded, DDP or one process, at any world size: each rank reads the
    pieces it holds) and, given, the optimizer, with the saved AdamW hyperparameters (param_groups). ValueError
    (one line) where it does not fit, or holds a non-finite weight."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict, set_model_state_dict,
                                                         set_state_dict)
    try:
        if optimizer is None:
            model_sd, optim_sd = get_model_state_dict(model), None
        else:
            model_sd, optim_sd = get_state_dict(model, optimizer)
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
                raise ValueError(f"{path} does not fit this model: {one_line(why, 200)}") from None
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
        optim_sd["param_groups"] = [dict(saved, params=g["params"]) for saved, g in zip(param_groups, optim_sd["param_groups"])]
        set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
        check_optimizer_fits(optimizer)
    except ShardError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, AssertionError) as e:
        raise ValueError(f"{path} does not fit this model: {one_line(e)}") from None


class ShardError(ValueError):
    """A sharded checkpoint's shard that cannot be read (missing, truncated): load_sharded says so as it is."""


def load_optimizer_state(model, optimizer, osd, path):
    """An older run's ckpt_last.pt's AdamW state (torch's positional format; alpha's and tau's moments 0-d) into this
    run's optimizer, at any world size: positions become parameter names, which set_optimizer_state_dict shards
    where FSDP is on. ValueError (one line) where it does not fit: other parameter groups, or other shapes."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    vec = lambda k, t: t.reshape(1) if t.dim() == 0 and k != "step" else t  # noqa: E731
    try:
        osd = {"state": {order[i]: {k: vec(k, t) for k, t in st.items()} for i, st in osd["state"].items()},
               "param_groups": [dict(g, params=[order[i] for i in g["params"]]) for g in osd["param_groups"]]}
        set_optimizer_state_dict(model, optimizer, osd, options=StateDictOptions(full_state_dict=True))
        check_optimizer_fits(optimizer)
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{path}: its optimizer state does not fit this model: {one_line(e)}") from None


def restore_state(model, optimizer, ckpt, path, resume):
    """What train.py applies once the model and optimizer exist: a sharded checkpoint's weights (and, to resume,
    its AdamW state and hyperparameters), or an older single file's AdamW state (its weights were loaded before
    sharding). ValueError (one line) where it does not fit."""
    if "sharded" in ckpt:
        load_sharded(path, model, optimizer if resume else None, ckpt.get("param_groups"))
    elif resume:
        load_optimizer_state(model, optimizer, ckpt.pop("optimizer"), path)


def full_weights(model, ranks, fsdp):
    """The model's weights as one process holds them (ckpt.pt), on the master (None elsewhere). Under FSDP every
    rank must call this (it gathers the shards, to the master's CPU)."""
    if not fsdp:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return sd if ranks.master else None


def check_resume(ckpt, path, model_args, config, meta):
    """Whether the run `config` (with `model_args` and the dataset's `meta`) can resume ckpt exactly.
    Returns (errors, notes): one line per reason it cannot; the schedule settings that changed (allowed)."""
    errors = []
    saved = ckpt.get("model_args", {})
    diff = {k: (saved.get(k, getattr(ModelConfig, k)), model_args[k]) for k in model_args
            if saved.get(k, getattr(ModelConfig, k)) != model_args[k]}  # a key older than the file: its default
    if diff:
        errors.append(f"{path} holds a different model: " +
                      ", ".join(f"{k}={a!r} in the checkpoint vs {b!r} now" for k, (a, b) in diff.items()))
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
            try:
                if json.loads(line)["iter"] <= upto:
                    keep.append(line if line.endswith("\n") else line + "\n")
            except (ValueError, KeyError, TypeError):
                pass
    try:
        with atomic_write(path) as f:
            f.writelines(keep)
    except OSError as e:   # a full disk: the log stays as it was, the temporary goes
        raise ValueError(f"cannot rewrite {path} for the resume: {e.strerror or e}; it was left as it was, "
                         f"{intact(out_dir)}") from None


def read_log(out_dir):
    """out_dir/log.jsonl as a list of dicts sorted by iteration, and the number of lines skipped: lines
    that are not a JSON object with an integer "iter" (a run killed mid-write, a hand edit). An iteration
    logged twice keeps its last line. Raises ValueError (one line) where there is no valid line at all."""
    path = os.path.join(out_dir, LOG)
    if not os.path.isfile(path):
        raise ValueError(f"{path} not found (is {out_dir!r} a train.py out_dir?)")
    rows, skipped = [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError:
                r = None
            if isinstance(r, dict) and isinstance(r.get("iter"), int) and not isinstance(r["iter"], bool):
                rows.append(r)
            else:
                skipped += 1
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
        """ckpt.pt (the best model, for sampling) holds the weights and settings, one file the master writes
        atomically; ckpt_last.dcp (for resume) also the AdamW state and the counters, the shards every rank writes at
        once. Every rank calls it (FSDP gathers ckpt.pt's weights to the master)."""
        c, master, fsdp = self.config, self.ranks.master, self.config["fsdp"]
        finish_sharded()   # the last resume state first, whole (or its error, one line): saves stay in order
        info = {"model_args": self.model_args, "config": c, "iter_num": self.iter_num,
                "best_val_loss": self.best_val_loss, "best_iter": self.best_iter, "meta": self.meta}
        if os.path.basename(path) == CKPT_LAST:
            info.update(skipped_total=self.skipped_total, eval_pending=self.eval_pending, grad_norm=self.grad_norm)
            return save_sharded(path, model, optimizer, info, master, wait)
        model_sd = full_weights(model, self.ranks, fsdp) if master or fsdp else None   # FSDP: a collective
        if master:
            save_checkpoint(path, dict(info, model=model_sd))

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
        """The rest of the start once the model and optimizer exist: the checkpoint's AdamW state (a sharded one's
        weights too) and, to resume, its counters, dropping what a killed run logged after it; wandb. Stops every
        rank on any error (`errors`: load_weights', one line each), else prints the notes (on the master)."""
        c, master = self.config, self.ranks.master
        if self.ckpt is not None and not errors:
            try:
                restore_state(model, optimizer, self.ckpt, self.source, self.resume)
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
        log = (lambda line: print(line, flush=True)) if master else (lambda line: None)
        for note in self.notes:
            log(note)
        if self.ckpt is not None and not self.resume:   # a new run from these weights: a fresh optimizer and schedule
            log(f"starting from the weights of {self.source} (iter {self.ckpt['iter_num']})")
        elif self.ckpt is not None:   # where the run stopped
            for k in ("iter_num", "best_val_loss", "best_iter", "skipped_total", "eval_pending", "grad_norm"):
                setattr(self, k, self.ckpt.get(k, getattr(self, k)))
        self.ckpt = None


def start_run(config, ranks, dtype):
    """Everything train.py can check before any work once its process group is up (ranks) and its precision known
    (dtype), in order: the settings, the dataset, the model's settings, wandb; then whether out_dir already holds
    this very run, finished (say so and exit 0); out_dir's lock; the checkpoint to start from and, to resume,
    whether it fits these settings.
    Each problem is one line and every rank stops on them together (exit status 2: common.fail); else the Run,
    with its checkpoint loaded (weights not yet applied) and the errors and notes left for Run.restore."""
    from hrmlm import data
    from configurator import check_train_settings, train_setting_notes
    c = config
    errors = check_train_settings(dict(c, dtype=dtype), ranks.ddp)   # ranges, choices, combinations
    resume, notes = c["init_from"] == "resume", []   # notes: printed once every check has passed
    if not errors:
        notes += train_setting_notes(c)
    if ranks.ddp and not ranks.device.startswith("cuda"):   # torchrun without a usable GPU: say where it runs
        notes.append(f"note: {ranks.world_size} processes on the CPU (gloo), not GPUs: torch sees no GPU it can use")
    if not resume:   # a new run on more ranks than its config was written for splits its micro-batches
        try:         # (parallel.micro_batches); a resumed run keeps its checkpoint's (below)
            accum, batch, note = parallel.micro_batches(c["gradient_accumulation_steps"], c["batch_size"],
                                                        ranks.world_size)
            c.update(gradient_accumulation_steps=accum, batch_size=batch)
            notes += [note] if note else []
        except ValueError as e:
            errors.append(str(e))
    splits, meta = {}, None
    try:   # the files checked against meta.json, and each split long enough for block_size
        splits, meta = data.open_dataset(c["data_dir"], c["dataset"], c["block_size"], c["vocab_size"])
    except ValueError as e:
        errors.append(str(e))
    c["vocab_size"] = meta["vocab_size"] if meta else c["vocab_size"] or 50257   # the dataset's
    model_args = {k: c[k] for k in MODEL_FIELDS}
    try:
        ModelConfig(**model_args)
    except ValueError as e:
        errors.append(str(e))
    if c["wandb_log"] and ranks.master:
        try:
            import wandb  # noqa: F401
        except ImportError:
            errors.append("wandb_log=True needs the wandb package: pip install wandb (or leave wandb_log off)")
    run = Run(c, ranks, splits, meta, model_args, notes=notes)
    out_dir = c["out_dir"]
    finished = not resume and not c["overwrite"] and not c["eval_only"] and not errors and finished_run(out_dir, c)
    if finished and ranks.master:   # the same command again: say so, touch nothing
        print(f"{out_dir} holds this run, finished ({finished}): nothing to do; sample it with "
            f"python sample.py --out_dir={out_dir}, or train it again with --overwrite=True", flush=True)
    if finished:
        sys.exit(parallel.end_process_group(ranks))
    if ranks.master and not errors:
        run.lock, problem = take_out_dir(out_dir, c["init_from"] if c["init_from"] in ("resume", "scratch") else "from",
                                         c["overwrite"], c["eval_only"])
        errors += [problem] if problem else []
    parallel.stop_on_errors(errors, ranks)
    if c["init_from"] != "scratch":   # every rank loads it: ckpt_last.dcp to resume, or the weights a new run starts from
        try:
            run.source = resume_path(out_dir) if resume else find_checkpoint(c["init_from"])
            run.ckpt = load_checkpoint(run.source)
        except ValueError as e:
            errors.append(str(e))
    if resume and run.ckpt is not None:
        saved = tuple(run.ckpt.get("config", {}).get(k, c[k]) for k in ("gradient_accumulation_steps", "batch_size"))
        try:
            accum, batch, note = parallel.micro_batches(c["gradient_accumulation_steps"], c["batch_size"],
                                                        ranks.world_size, saved)
            c.update(gradient_accumulation_steps=accum, batch_size=batch)
            notes += [note] if note else []
        except ValueError as e:
            errors.append(str(e))
        problems, changed = check_resume(run.ckpt, run.source, model_args, c, meta)
        errors += problems
        if changed:
            notes.append("note: resuming with changed settings (the schedule, not the data): " + ", ".join(changed))
    parallel.stop_on_errors(errors, ranks)
    return run
