"""
Several processes (torchrun) for train.py: the process group, the micro-batches split over the ranks, the model
built on each rank's device (whole, or FSDP2-sharded), DDP around it; and torch.compile per block-application unit
(one process too). One process on the CPU without compile imports none of it.
"""

import datetime
import math
import os

import torch
import torch._dynamo
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard   # public since torch 2.6
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.overrides import TorchFunctionMode

from hrmlm.signals import UserError
from model import HRM, Transformer, build_model

# CUDA's allocator grows its segments rather than leaving freed blocks of odd sizes unusable (torchtitan's and
# nanochat's setting); read at the first CUDA allocation, which comes after this import. A user's setting wins
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


def init_process_group(device):
    """(rank, world size, device) of this torchrun process, its process group started (NCCL on CUDA, gloo on CPU),
    each rank on its own GPU."""
    rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    if not device.startswith("cuda"):
        dist.init_process_group(backend="gloo")
        return rank, world_size, device
    n = torch.cuda.device_count()   # 1: a scheduler gave each process its own GPU (CUDA_VISIBLE_DEVICES), its cuda:0
    if n > 1 and local_rank >= n:
        raise UserError(f"LOCAL_RANK={local_rank}, but this process sees {n} GPUs: run one process per GPU")
    device = f"cuda:{local_rank if n > 1 else 0}"
    torch.cuda.set_device(device)
    # device_id binds NCCL to this GPU at once; 30 minutes: a rank waits while the master writes a 3.4B model's
    # ckpt.pt (13.7 GB gathered and fsynced), past NCCL's default 10
    dist.init_process_group(backend="nccl", device_id=torch.device(device), timeout=datetime.timedelta(minutes=30))
    return rank, world_size, device


def micro_batches(accum, batch, world_size, resume=False, say=print):
    """(gradient_accumulation_steps, batch_size) on world_size ranks. accum counts global micro-batches; a new run
    splits them so each rank gets whole ones (and says so). A resumed run keeps its own (micro-batch j of iteration i
    is drawn from its own generator): UserError for a world size that would split them."""
    if accum % world_size and resume:
        ok = [w for w in range(1, accum + 1) if accum % w == 0]
        raise UserError(f"resuming on {world_size} ranks would split the checkpoint's {accum} micro-batch(es) of "
                        f"{batch} sequences and change which tokens each iteration sees; resume on a number of ranks "
                        f"that divides {accum}: {', '.join(map(str, ok))}")
    if accum % world_size and batch % (f := world_size // math.gcd(accum, world_size)) == 0:
        say(f"note: {world_size} ranks: gradient_accumulation_steps {accum} -> {accum * f}, batch_size "
            f"{batch} -> {batch // f} (the same global batch)")
        accum, batch = accum * f, batch // f
    if accum % world_size:
        raise UserError(f"gradient_accumulation_steps={accum} must be a positive multiple of the world size "
                        f"{world_size} (it counts global micro-batches), or batch_size={batch} divisible so that "
                        f"each micro-batch can be split over the ranks")
    return accum, batch


def shard_units(model):
    """What FSDP shards and gathers one at a time: each block with its projections; the rest is the root."""
    if isinstance(model, HRM):
        return [m for m in (model.input_block, model.L_net, model.H_net) if m is not None]
    return list(model.blocks) if isinstance(model, Transformer) else [model.block]


def fully_shard_model(model, dtype=torch.float32):
    """FSDP2, a unit per shard_units entry; HRM's and UniTF's shared blocks (M runs a pass) stay gathered through the
    forward. Under bf16 the Linears are gathered in bf16 (autocast's cast in one process), gradients reduced in
    float32: DDP's numbers (tests/dist_equality.py; docs/TRAINING.md, "bf16 under DDP and FSDP")."""
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


def build_on_device(config, device, rank, world_size, fsdp=False, dtype=torch.float32):
    """The model, initialised as a CPU build after the same seed (bit for bit), on `device`, whole or FSDP-sharded,
    never whole on the CPU (a 3.4B model is 13.7 GB): each weight MetaInit draws goes to the device or to a shard."""
    world, rank = (world_size, rank) if fsdp else (1, 0)

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
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    for unit in shard_units(model):
        unit.compile(backend=backend)
    return model


def wrap(model, device, fsdp):
    """DDP around the model (not FSDP: fully_shard_model), gradients views of its buckets (one copy)."""
    if fsdp:
        return model
    # broadcast_buffers=False: the buffers (RoPE tables, z0) are the same on every rank and never change
    return DDP(model, device_ids=[torch.device(device).index] if device.startswith("cuda") else None,
               gradient_as_bucket_view=True, broadcast_buffers=False)


def sync_gradients(model, fsdp, last):
    """Reduce gradients only on the last micro-batch of an iteration."""
    if fsdp:
        model.set_requires_gradient_sync(last)
    else:
        model.require_backward_grad_sync = last


def full_state_dict(model):
    """An FSDP model's weights whole, on rank 0's CPU (a collective: every rank calls it), for ckpt.pt."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
