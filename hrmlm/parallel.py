"""
Several processes (torchrun) for train.py: the process group, errors and signals every rank agrees on, DDP or
FSDP2 around the model. One process is the case world_size = 1, where each function does the obvious local thing.
"""

import datetime
import math
import os
import signal
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from hrmlm.common import BAD_INPUT, SIGNALLED, fail
from hrmlm.signals import exit_on_signals
from model import HRM, Transformer, build_model


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
    if not device.startswith("cuda"):
        dist.init_process_group(backend="gloo")
        return Ranks(True, rank, local_rank, world_size, device)
    n = torch.cuda.device_count()   # 1: a scheduler gave each process its own GPU (CUDA_VISIBLE_DEVICES), its cuda:0
    if n > 1 and local_rank >= n:
        fail(f"LOCAL_RANK={local_rank}, but this process sees {n} GPUs: run one process per GPU", BAD_INPUT,
             "train.py", show=rank == 0)
    device = f"cuda:{local_rank if n > 1 else 0}"
    torch.cuda.set_device(device)
    # device_id binds NCCL to this GPU at once; 30 minutes: a rank waits while the master writes a 3.4B model's
    # ckpt.pt (13.7 GB gathered and fsynced), past NCCL's default 10
    dist.init_process_group(backend="nccl", device_id=torch.device(device), timeout=datetime.timedelta(minutes=30))
    return Ranks(True, rank, local_rank, world_size, device)


def end_process_group(ranks):
    if ranks.ddp:
        dist.destroy_process_group()


def stop_on_errors(errors, ranks, prog="train.py"):
    """All ranks stop together (exit status 2) if any found an error: a rank that exited alone would be killed by
    torchrun mid-print. Rank 0 prints each distinct error once; one only some ranks found names them."""
    everyone = [errors]
    if ranks.ddp:
        everyone = [None] * ranks.world_size
        dist.all_gather_object(everyone, errors)
    if not any(everyone):
        return
    found = {}   # message -> the ranks that found it, in the order of first appearance
    for r, errs in enumerate(everyone):
        for msg in errs:
            found.setdefault(msg, []).append(r)
    lines = [msg + ("" if len(where) == ranks.world_size else f" (rank {', '.join(map(str, where))})")
             for msg, where in found.items()]
    if ranks.ddp:
        dist.barrier()
        dist.destroy_process_group()
    fail(lines, BAD_INPUT, prog, show=ranks.master)


def micro_batches(accum, batch, world_size, saved=None):
    """(gradient_accumulation_steps, batch_size, note) on world_size ranks, or ValueError. accum counts global
    micro-batches; a new run splits them so each rank gets whole ones. A resumed run keeps its saved ones (`saved`):
    micro-batch j of iteration i is drawn from its own generator, so it refuses a world size that would split them."""
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
    """A stop signal asks the run to save and stop at the end of the iteration (signals.exit_on_signals with defer);
    a second quits at once without saving. requested() is true on every rank once any rank got one."""

    def __init__(self, ranks):
        self.ranks = ranks
        self.received = exit_on_signals("train.py", defer="saving at the end of this iteration (send it again to "
                                        "quit without saving)", describe=lambda: "; quitting without saving",
                                        speak=ranks.master)

    def requested(self):
        if not self.ranks.ddp:
            return bool(self.received)
        flag = torch.tensor([len(self.received)], device=self.ranks.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() > 0

    def exit(self, iter_num, saved):
        """End the run: one line (from rank 0) saying where, and exit status 128 + the signal number."""
        self.received.done.set()   # saved: a signal from here on changes nothing
        signum = self.received[0] if self.received else signal.SIGTERM   # another rank's signal: SIGTERM's code
        end_process_group(self.ranks)
        fail(f"stopped by {signal.Signals(signum).name if self.received else 'a signal'} at iter {iter_num}" +
             (f"; saved {saved}; continue with --init_from=resume" if saved else ""), SIGNALLED + signum,
             "train.py", show=self.ranks.master)


def shard_units(model):
    """What FSDP shards and gathers one at a time: each block with its projections; the rest is the root."""
    if isinstance(model, HRM):
        return [m for m in (model.input_block, model.L_net, model.H_net) if m is not None]
    return list(model.blocks) if isinstance(model, Transformer) else [model.block]


def fully_shard_model(model, dtype=torch.float32):
    """FSDP2, a unit per shard_units entry; HRM's and UniTF's shared blocks (M runs a pass) stay gathered through the
    forward. Under bf16 the Linears are gathered in bf16 (autocast's cast in one process), gradients reduced in
    float32: DDP's numbers (tests/dist_equality.py; docs/TRAINING.md, "bf16 under DDP and FSDP")."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard   # public since torch 2.6
    fp32 = MixedPrecisionPolicy(reduce_dtype=torch.float32)
    low = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    reshard = isinstance(model, Transformer)   # a Transformer's blocks run once: freed after their forward
    for unit in shard_units(model):
        linears = [m for m in unit.modules() if isinstance(m, nn.Linear)]
        if dtype != torch.float32 and linears:   # one group: gathered in bf16 together, one all-gather
            fully_shard(linears, mp_policy=low, reshard_after_forward=reshard)
        fully_shard(unit, mp_policy=fp32, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=fp32)


class MetaInit(TorchFunctionMode):
    """While model.py builds: every weight matrix (torch.empty, 2+ dimensions) is made on the meta device, and each
    init of one runs on a CPU tensor of its shape, so the CPU generator draws what a CPU build draws, bit for bit;
    `drawn` keeps what the rank holds of it (keep). The rest (norms, alpha, tau, z0, RoPE) is a few KB on the CPU."""

    def __init__(self, keep):
        super().__init__()
        self.keep, self.drawn = keep, {}   # id of a meta weight -> (the weight, what this rank keeps of its init)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.empty and len(args[0] if len(args) == 1 and not isinstance(args[0], int) else args) >= 2:
            kwargs = dict(kwargs, device="meta")
        w = args[0] if args else kwargs.get("tensor")   # nn.init's functions pass it as tensor=
        if isinstance(w, torch.Tensor) and w.is_meta and func.__name__[-1:] == "_" != func.__name__[:1]:
            if func.__name__ not in ("kaiming_uniform_", "normal_", "uniform_", "trunc_normal_"):   # model.py's
                raise NotImplementedError(f"the meta-device build cannot replay {func.__name__} on a weight")
            self.drawn.pop(id(w), None)   # the value this init replaces goes first (a CPU build holds one)
            full = torch.empty(w.shape, dtype=w.dtype, device="cpu")
            func(full, *args[1:], **kwargs) if args else func(**dict(kwargs, tensor=full))
            self.drawn[id(w)] = (w, self.keep(full))
            return w
        return func(*args, **kwargs)


def build_on_device(config, device, ranks, fsdp=False, dtype=torch.float32):
    """The model, initialised as a CPU build after the same seed (bit for bit), on `device`, whole or FSDP-sharded,
    never whole on the CPU (a 3.4B model is 13.7 GB): each weight MetaInit draws goes to the device or to a shard."""
    world, rank = (ranks.world_size, ranks.rank) if fsdp else (1, 0)

    def shard(full):   # what this rank holds of a parameter: FSDP2's dim-0 piece (torch.chunk's), a copy
        pieces = full.chunk(world)
        return (pieces[rank] if rank < len(pieces) else full[:0]).to(device, copy=True)
    with MetaInit(shard if fsdp else lambda full: full.to(device)) as init:
        model = build_model(config)
    drawn = {n: init.drawn.pop(id(p))[1] for n, p in model.named_parameters() if p.is_meta}
    if not fsdp:   # the drawn weights become the parameters (no copy), the few KB of the rest move
        model.load_state_dict(drawn, strict=False, assign=True)
        return model.to(device)
    values = {n: drawn.pop(n) if n in drawn else shard(p.detach()) for n, p in model.named_parameters()}
    values |= {n: b.to(device) for n, b in model.named_buffers()}   # buffers: never meta, never sharded
    fully_shard_model(model, dtype)
    model.to_empty(device=device)
    with torch.no_grad():
        for n, t in [*model.named_parameters(), *model.named_buffers()]:
            (t.to_local() if hasattr(t, "to_local") else t).copy_(values.pop(n))   # a DTensor: this rank's shard
    return model


def compile_model(model, backend="inductor"):
    """torch.compile each shard unit in place (torchtitan's way): a shared unit reuses its graphs at every step and
    depth, and FSDP's gathers fall between graphs (the whole model: 7 graph breaks; tests/test_hazards.py). The
    recompile limit covers a unit's variants (with and without gradient, the first step's z0): none runs eager."""
    import torch._dynamo
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    for unit in shard_units(model):
        unit.compile(backend=backend)
    return model


def wrap(model, ranks, fsdp):
    """DDP around the model under torchrun (not FSDP: fully_shard_model), gradients views of its buckets (one copy)."""
    if not ranks.ddp or fsdp:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP
    # broadcast_buffers=False: the buffers (RoPE tables, z0) are the same on every rank and never change
    return DDP(model, device_ids=[ranks.local_rank] if ranks.device.startswith("cuda") else None,
               gradient_as_bucket_view=True, broadcast_buffers=False)


def no_sync_unless(model, ranks, fsdp, last):
    """Reduce gradients only on the last micro-batch of an iteration."""
    if fsdp:
        model.set_requires_gradient_sync(last)
    elif ranks.ddp:
        model.require_backward_grad_sync = last
