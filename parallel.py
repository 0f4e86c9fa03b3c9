"""
Several processes (torchrun) for train.py: the process group, errors and signals every rank agrees on,
DDP or FSDP2 around the model, and the whole state gathered into one single-file checkpoint.

One process is the case world_size = 1: every function here then does the obvious local thing.
"""

import math
import os
import signal
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from checkpoint import check_optimizer_fits, one_line
from model import HRM, Transformer


@dataclass
class Ranks:
    ddp: bool = False        # under torchrun (DDP or FSDP)
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: str = "cpu"

    @property
    def master(self):
        return self.rank == 0


def init_process_group(device):
    """The process group torchrun asks for (NCCL on CUDA, gloo on CPU), each rank on its own GPU."""
    if int(os.environ.get("RANK", -1)) == -1:
        return Ranks(device=device)
    rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    return Ranks(True, rank, local_rank, world_size, device)


def end_process_group(ranks):
    if ranks.ddp:
        dist.destroy_process_group()


def stop_on_errors(errors, ranks, prog="train.py"):
    """All ranks learn whether any rank found an error and stop together, exit status 2 (a rank that exited
    alone would be killed by torchrun mid-print). Rank 0 prints each distinct error once, one line each, so
    a bad setting that every rank finds is one line; an error only some ranks found names them."""
    everyone = [errors]
    if ranks.ddp:
        everyone = [None] * ranks.world_size
        dist.all_gather_object(everyone, errors)
    if not any(everyone):
        return
    if ranks.master:
        found = {}   # message -> the ranks that found it, in the order of first appearance
        for r, errs in enumerate(everyone):
            for msg in errs:
                found.setdefault(msg, []).append(r)
        for msg, where in found.items():
            who = "" if len(where) == ranks.world_size else f" (rank {', '.join(map(str, where))})"
            sys.stderr.write(f"{prog}: error{who}: {msg}\n")
        sys.stderr.flush()
    if ranks.ddp:
        dist.barrier()
        dist.destroy_process_group()
    sys.exit(2)


def micro_batches(accum, batch, world_size, saved=None):
    """The (gradient_accumulation_steps, batch_size, note) a run uses on world_size ranks; ValueError if none.
    accum counts global micro-batches, so each rank runs accum / world_size of them. A new run whose accum is
    not a multiple of the world size splits each micro-batch so every rank gets whole ones (the same global
    batch). A resumed run must see the same tokens at every iteration as the run it continues, and micro-batch
    j of iteration i is drawn from its own generator: it keeps the micro-batches it was saved with (`saved`,
    when the global batch is the same) and refuses a world size that would have to split them."""
    note = None
    if saved and saved != (accum, batch) and saved[0] * saved[1] == accum * batch:
        accum, batch = saved
        note = (f"note: resuming with the checkpoint's micro-batches, gradient_accumulation_steps {accum} x "
                f"batch_size {batch} (the same global batch, so the same tokens)")
    if accum >= 1 and accum % world_size:
        if saved:
            ok = [w for w in range(1, accum + 1) if accum % w == 0]
            raise ValueError(f"resuming on {world_size} ranks would split the checkpoint's {accum} micro-batch(es) of "
                             f"{batch} sequences and change which tokens each iteration sees; resume on a number "
                             f"of ranks that divides {accum}: {', '.join(map(str, ok))}")
        f = world_size // math.gcd(accum, world_size)
        if batch % f == 0:
            note = (f"note: {world_size} ranks: gradient_accumulation_steps {accum} -> {accum * f}, batch_size "
                    f"{batch} -> {batch // f} (the same global batch)")
            accum, batch = accum * f, batch // f
    if accum < 1 or accum % world_size:
        raise ValueError(f"gradient_accumulation_steps={accum} must be a positive multiple of the world size "
                         f"{world_size} (it counts global micro-batches), or batch_size={batch} divisible so that "
                         f"each micro-batch can be split over the ranks")
    return accum, batch, note


def all_mean(values, ranks):
    """Mean of a list of floats over the items of every rank."""
    t = torch.tensor([sum(values), len(values)], dtype=torch.float64, device=ranks.device)
    if ranks.ddp:
        dist.all_reduce(t)
    return (t[0] / t[1]).item()


class StopSignals:
    """Ctrl-C (SIGINT) and SIGTERM ask the run to stop at the end of the iteration (and save); a second
    signal quits at once without saving. requested() is true on every rank as soon as any rank got one,
    so that all stop at the same iteration and save together."""

    def __init__(self, ranks):
        self.ranks, self.received = ranks, []
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum, frame):
        if self.received:
            sys.stderr.write(f"train.py: {signal.Signals(signum).name} again: quitting without saving\n")
            os._exit(128 + signum)
        self.received.append(signum)
        if self.ranks.master:
            sys.stderr.write(f"train.py: {signal.Signals(signum).name}: saving at the end of this iteration "
                             f"(send it again to quit without saving)\n")

    def requested(self):
        if not self.ranks.ddp:
            return bool(self.received)
        flag = torch.tensor([len(self.received)], device=self.ranks.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() > 0

    def exit(self, iter_num, saved):
        """End the run: one line (from rank 0) saying where, and exit status 128 + the signal number, as a
        shell reports a process that a signal ended (130 for SIGINT, 143 for SIGTERM)."""
        signum = self.received[0] if self.received else signal.SIGTERM   # another rank's signal: SIGTERM's code
        if self.ranks.master:
            sys.stderr.write(f"train.py: stopped by {signal.Signals(signum).name if self.received else 'a signal'} "
                             f"at iter {iter_num}" + (f"; saved {saved}; continue with --init_from=resume"
                                                      if saved else "") + "\n")
        end_process_group(self.ranks)
        sys.exit(128 + signum)


# --- DDP and FSDP2 ---------------------------------------------------------------------------------------

def shard_units(model):
    """The modules FSDP shards and gathers one at a time: each block with its own projections; the rest
    (embedding, fusion, norms) is the root unit."""
    if isinstance(model, HRM):
        return [m for m in (model.input_block, model.L_net, model.H_net) if m is not None]
    return list(model.blocks) if isinstance(model, Transformer) else [model.block]


def fully_shard_model(model):
    """FSDP2 over the ranks: each block (with its projections) is a unit gathered when it runs, the rest is
    the root. HRM's and UniTF's shared blocks run M times a pass, so they stay gathered through the forward
    (one all-gather, not M); a Transformer's blocks run once and are freed after their forward. The weights
    are gathered in float32 and autocast casts them, as under DDP: the same numbers as DDP.
    fully_shard takes no 0-d parameter: alpha and tau become 1-element vectors for the run (they only
    broadcast, so every number is the same); full_state() gives them back 0-d, the one checkpoint format.
    Returns the names of those parameters."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp = MixedPrecisionPolicy(reduce_dtype=torch.float32)
    scalars = [n for n, p in model.named_parameters() if p.dim() == 0]
    for name in scalars:
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, torch.nn.Parameter(model.get_parameter(name).detach().reshape(1)))
    for unit in shard_units(model):
        fully_shard(unit, mp_policy=mp, reshard_after_forward=isinstance(model, Transformer))
    fully_shard(model, mp_policy=mp)
    return scalars


def wrap(model, ranks, fsdp):
    """DDP around the model under torchrun (FSDP was applied by fully_shard_model); the model itself
    otherwise. Gradients are views of DDP's buckets: one copy of them, not two."""
    if not ranks.ddp or fsdp:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP
    return DDP(model, device_ids=[ranks.local_rank] if ranks.device.startswith("cuda") else None,
               gradient_as_bucket_view=True)


def no_sync_unless(model, ranks, fsdp, last):
    """Reduce gradients only on the last micro-batch of an iteration."""
    if fsdp:
        model.set_requires_gradient_sync(last)
    elif ranks.ddp:
        model.require_backward_grad_sync = last


def _param_order(model, optimizer):
    """Parameter names in the optimizer's order: the positions of torch's optimizer state dict."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


def _rekey(osd, key, scalars, scalar_shape):
    """An optimizer state dict with each parameter key p replaced by key(p) (positions <-> FSDP's names), the
    AdamW moments of the 0-d parameters reshaped to scalar_shape ((1,) in an FSDP run, () in checkpoints)."""
    def moments(name, v):
        return {k: t.reshape(scalar_shape) if name in scalars and k != "step" else t for k, t in v.items()}
    return {"state": {key(p): moments(p if isinstance(p, str) else key(p), v) for p, v in osd["state"].items()},
            "param_groups": [dict(g, params=[key(p) for p in g["params"]]) for g in osd["param_groups"]]}


def load_optimizer_state(model, optimizer, osd, fsdp, scalars, path):
    """A checkpoint's optimizer state (torch's positional format) into this run's optimizer; under FSDP
    positions become parameter names, which set_optimizer_state_dict shards to each rank. ValueError (one
    line) where it does not fit: other parameter groups, or moments of other shapes."""
    try:
        if not fsdp:
            optimizer.load_state_dict(osd)
        else:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
            order = _param_order(model, optimizer)
            set_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True),
                                     optim_state_dict=_rekey(osd, order.__getitem__, scalars, (1,)))
        check_optimizer_fits(optimizer)
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{path}: its optimizer state does not fit this model: {one_line(e)}") from None


def full_state(model, optimizer, ranks, fsdp, scalars, with_optimizer):
    """The model's (and optimizer's) whole state as one process holds it, on the master (None elsewhere).
    Under FSDP every rank must call this (it gathers the shards); the optimizer state goes back to torch's
    positional keys and the 0-d parameters to 0-d."""
    if not fsdp:
        return model.state_dict(), optimizer.state_dict() if with_optimizer else None
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(model, options=full)   # full on rank 0, empty on the others
    osd = get_optimizer_state_dict(model, optimizer, options=full) if with_optimizer else None
    if not ranks.master:
        return None, None
    model_sd.update({n: model_sd[n].reshape(()) for n in scalars if n in model_sd})   # 0-d again
    if not with_optimizer:
        return model_sd, None
    return model_sd, _rekey(osd, _param_order(model, optimizer).index, scalars, ())
