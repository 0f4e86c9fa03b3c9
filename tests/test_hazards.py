"""The hazards of the paths users take at scale, each checked on the CPU: compile with random_depth, DDP's buffer
broadcast, and the torch that FSDP2's public API needs."""

import os
import re

import pytest
import torch
import torch.distributed as dist

from hrmlm import parallel
from conftest import ROOT
from model import ModelConfig, build_model


def test_compile_covers_every_random_depth():
    """random_depth at D = 5 runs 9 depths: each compiles once (a counting backend), none falls back to eager
    past torch's recompile limit of 8, and a depth seen before reuses its graph."""
    import torch._dynamo
    torch._dynamo.reset()
    compiled = []

    def counting(gm, example_inputs):
        compiled.append(gm)
        return gm.forward

    model = build_model(ModelConfig(arch="unitf", vocab_size=16, block_size=8, n_embd=16, n_head=2, M=5, K=1))
    fast = parallel.compile_model(model, depths=9, backend=counting)
    x = torch.randint(0, 16, (1, 8))
    with torch.no_grad():
        for depth in list(range(1, 10)) + [3]:
            model.set_depth(depth)
            assert torch.allclose(fast(x)[0], model(x)[0], atol=1e-6)
    assert len(compiled) == 9, len(compiled)
    torch._dynamo.reset()


def test_ddp_does_not_broadcast_buffers():
    """RoPE tables and z0 are the same on every rank and never change: DDP must not re-send them every forward."""
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = build_model(ModelConfig(arch="hrm", vocab_size=16, block_size=8, n_embd=16, n_head=2, N=1, T=2))
        ddp = parallel.wrap(model, parallel.Ranks(True, 0, 0, 1), fsdp=False)
        assert ddp.broadcast_buffers is False
    finally:
        dist.destroy_process_group()


def test_requirements_admit_only_a_torch_with_public_fsdp2():
    """parallel.fully_shard_model imports fully_shard and MixedPrecisionPolicy from torch.distributed.fsdp, public
    from torch 2.6 (before: torch.distributed._composable.fsdp): requirements.txt must not admit an older torch."""
    line = next(l for l in open(os.path.join(ROOT, "requirements.txt")) if re.match(r"torch\b", l))
    floor = tuple(int(v) for v in re.search(r"[>=]=\s*([\d.]+)", line).group(1).split("."))   # >= or a pin
    assert floor >= (2, 6), line
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: F401


def test_autocast_weight_cache_off_where_it_would_drop_gradients(monkeypatch):
    """In torch before pytorch#165068 autocast caches the bf16 copy a no-grad step made, without gradient history,
    and HRM's and UniTF's window steps reuse it: their shared weights get no gradient, silently. precision_context
    asks the running torch (autocast_cache_keeps_grad) and turns the cache off where it would; FSDP always
    casts at every use (parallel.fully_shard_model)."""
    from hrmlm import common
    assert common.autocast_cache_keeps_grad("cpu", torch.bfloat16)          # torch 2.13: fixed
    assert common.precision_context("cpu", "bfloat16")._cache_enabled
    monkeypatch.setattr(common, "autocast_cache_keeps_grad", lambda device_type, dtype: False)   # an older torch
    assert not common.precision_context("cpu", "bfloat16")._cache_enabled
