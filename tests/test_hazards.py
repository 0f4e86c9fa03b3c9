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


def counting_backend(graphs):
    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    return counting


@pytest.mark.parametrize("arch,kw", [("unitf", dict(M=5, K=1)), ("hrm", dict(N=5, T=2, K=2))])
def test_compile_covers_every_random_depth(arch, kw):
    """random_depth at D = 5 runs 9 depths: compiled per block application unit, the first three depths make every
    graph (with and without gradient, the first step's expanded z0, a Slow firing in the window or not), the other
    six none; none falls back to eager (the same numbers as the eager model). The whole model compiled one graph
    per depth (and fell back to eager past torch's recompile limit of 8)."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    compiled = []
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch=arch, vocab_size=16, block_size=8, n_embd=16, n_head=2, **kw))
    eager = build_model(ModelConfig(arch=arch, vocab_size=16, block_size=8, n_embd=16, n_head=2, **kw))
    eager.load_state_dict(model.state_dict())
    fast = parallel.compile_model(model, backend=counting_backend(compiled))
    assert fast is model and list(fast.state_dict()) == list(eager.state_dict())   # in place: saved as ever
    x = torch.randint(0, 16, (2, 8))
    made = []
    for depth in list(range(1, 10)) + [3]:
        for m in (fast, eager):
            m.set_depth(depth)
        _, loss = fast(x, x)
        _, ref = eager(x, x)
        assert torch.allclose(loss, ref, atol=1e-6), (depth, loss, ref)
        loss.backward()
        with torch.no_grad():
            assert torch.allclose(fast(x)[0], eager(x)[0], atol=1e-6)
        made.append(len(compiled))
    assert made[3:] == [made[2]] * 7, made   # no graph after the third depth
    assert not counters["graph_break"] and not counters["frames"].get("fallback"), dict(counters["graph_break"])
    torch._dynamo.reset()


def test_compile_under_fsdp_has_no_graph_break():
    """Each unit compiled after fully_shard (train.py's order): FSDP2's hooks stay outside the graphs, so no graph
    break for any architecture, where the whole model compiled breaks at them: 7 times for HRM at M=4, 3 for UniTF
    (the figures docs/TRAINING.md quotes, counted here on torch's pinned version)."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    breaks = {}
    try:
        for arch, kw in (("hrm", dict(N=2, T=2, K=2)), ("transformer", dict(n_layer=2)), ("unitf", dict(M=4, K=1))):
            for whole in (False, True):
                torch._dynamo.reset()
                counters.clear()
                graphs = []
                model = build_model(ModelConfig(arch=arch, vocab_size=16, block_size=8, n_embd=16, n_head=2, **kw))
                parallel.fully_shard_model(model)
                if whole:
                    model = torch.compile(model, backend=counting_backend(graphs))
                else:
                    parallel.compile_model(model, backend=counting_backend(graphs))
                x = torch.randint(0, 16, (2, 8))
                for _ in range(2):
                    model(x, x)[1].backward()
                assert graphs, arch
                breaks[arch, whole] = sum(counters["graph_break"].values())
    finally:
        torch._dynamo.reset()
        dist.destroy_process_group()
    assert breaks == {("hrm", False): 0, ("transformer", False): 0, ("unitf", False): 0,
                      ("hrm", True): 7, ("transformer", True): 0, ("unitf", True): 3}, breaks


def test_ddp_does_not_broadcast_buffers():
    """RoPE tables and z0 are the same on every rank and never change: DDP must not re-send them every forward."""
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = build_model(ModelConfig(arch="hrm", vocab_size=16, block_size=8, n_embd=16, n_head=2, N=1, T=2))
        ddp = parallel.wrap(model, "cpu", fsdp=False)
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
