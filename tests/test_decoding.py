"""Decoding (docs/MODEL.md section 5): the per-application KV cache gives the full forward's logits, greedy
decoding is the same with and without it, sampling is seeded; and sample.py on a tiny checkpoint."""

import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

from hrmlm import engine
from hrmlm.checkpoint import load_checkpoint, model_from_checkpoint
from hrmlm.signals import UserError
from conftest import ENV, ROOT, V, char_tiny, error_in_process, in_process, make, one_error_line, run_script, run_train, tiny
from model import build_model

# --- cached decoding ------------------------------------------------------------------------------

CACHE_CFGS = [tiny("hrm", N=2, T=2, K=1, S=1), tiny("hrm", N=2, T=2, K=1, S=2),
              tiny("transformer", n_layer=3), tiny("unitf", M=3, K=1),
              # fast_attn_steps (docs/MODEL.md section 8): caches for the attending applications only
              tiny("hrm", N=3, T=2, K=1, S=2, fast_attn_steps=2), tiny("hrm", N=2, T=2, K=1, fast_attn_steps=0),
              tiny("hrm", N=2, T=2, K=1, fast_only=True, fast_attn_steps=1)]


CACHE_IDS = ["hrm-S1", "hrm-S2", "transformer", "unitf", "hrm-hybrid2-S2", "hrm-rnn", "hrm-fast_only-hybrid1"]


@pytest.mark.parametrize("cfg", CACHE_CFGS, ids=CACHE_IDS)
def test_cached_logits_match_full_forward(cfg):
    m = make(cfg, scale=4.0).eval()
    idx = torch.randint(0, V, (2, 50), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full, _ = m(idx)
        cache = engine.new_cache(m, 2)
        chunks = [m(idx[:, :12], cache=cache)[0]]                                    # prefill
        chunks += [m(idx[:, t:t + 1], cache=cache, pos=t)[0] for t in range(12, 40)]  # one token at a time
        chunks.append(m(idx[:, 40:], cache=cache, pos=40)[0])                      # a chunk after the prefix
    cached = torch.cat(chunks, dim=1)
    # HRM's cached logits match to ~3e-7 here (a key from a wrong slot moves them by ~1e-4 or less: its
    # attention enters through alpha = 0.1 and the gates), UniTF's to ~2e-5
    assert (cached - full).abs().max().item() < (1e-5 if cfg.arch == "hrm" else 1e-4)
    assert full.std() > 0.1  # logits are not trivially flat


# --- the fixed-shape cache (engine.StaticKVCache: CUDA graphs' prerequisite, checked on the CPU) ---------------

# every policy of each architecture, and HRM with applications that keep no cache (fast_attn_steps)
STATIC = {"hrm-S2": ("full", "last", "fired"), "unitf": ("full", "last"), "transformer": ("full",),
          "hrm-hybrid2-S2": ("full",)}


@pytest.mark.parametrize("cfg,kv", [(CACHE_CFGS[CACHE_IDS.index(i)], kv) for i, kvs in STATIC.items() for kv in kvs],
                         ids=[f"{i}-{kv}" for i, kvs in STATIC.items() for kv in kvs])
def test_static_cache_decodes_as_the_cache(cfg, kv):
    """Positions as device tensors, every slot read at its whole length with a mask: the logits of a prefill, of
    one token at a time and of a chunk are the growing cache's under each policy, and the cache holds the same
    keys. In float64: they differ in the order of float sums only (float32: up to 2e-4 for UniTF under `last`)."""
    m = make(cfg, scale=4.0).eval().double()
    idx = torch.randint(0, V, (2, 30), generator=torch.Generator().manual_seed(5))
    out = {}
    with torch.no_grad():
        for static in (False, True):
            cache = engine.new_cache(m, 2, max_len=40, kv=kv, static=static)   # 10 positions never written
            at = lambda p, t=1: engine.position(cache, p, t)   # noqa: E731
            chunks = [m(idx[:, :8], cache=cache, pos=at(0, 8))[0]]
            chunks += [m(idx[:, t:t + 1], cache=cache, pos=at(t))[0] for t in range(8, 22)]
            chunks.append(m(idx[:, 22:], cache=cache, pos=at(22, 8))[0])
            out[static] = torch.cat(chunks, dim=1), cache.k[:, :, :, :30].clone()
    assert isinstance(cache, engine.StaticKVCache)
    with pytest.raises(ValueError, match=r"KV cache full: 36 \+ 5 > 40"):   # checked on the host, as KVCache does
        engine.position(cache, 36, 5)
    assert (out[True][0] - out[False][0]).abs().max().item() < 1e-10
    assert (out[True][1] - out[False][1]).abs().max().item() < 1e-10 and out[True][1].abs().max() > 0


def test_static_cache_refuses_positions_it_did_not_make_last():
    """The mask a StaticKVCache's attention reads is the one the latest engine.position() made: a forward given
    an earlier call's positions would read another forward's mask, so it is refused, not silently misread."""
    m = make(tiny("hrm", N=1, T=2, K=1), scale=4.0).eval()
    idx = torch.randint(0, V, (1, 16), generator=torch.Generator().manual_seed(5))
    cache = engine.new_cache(m, 1, max_len=24, static=True)
    first = engine.position(cache, 0, 8)
    engine.position(cache, 8, 8)
    with torch.no_grad(), pytest.raises(ValueError, match=r"positions engine.position\(\) made for this forward"):
        m(idx[:, :8], cache=cache, pos=first)


def test_static_cache_step_compiles_once_and_reads_nothing_back():
    """Compiled, the one-token step against a StaticKVCache is one graph for every position (a counting backend:
    no recompile as pos moves, no graph break) that reads nothing back to the host, and whose cache inputs, which
    it writes in place, have static addresses: what CUDA graphs need. And it decodes as the eager step does."""
    import torch._dynamo
    m = make(tiny("hrm", N=1, T=2, K=1), scale=4.0).eval()
    idx = torch.randint(0, V, (1, 24), generator=torch.Generator().manual_seed(5))
    graphs, inputs = [], []

    def backend(gm, example_inputs):
        graphs.append(gm)
        inputs.append(example_inputs)
        return gm.forward
    torch._dynamo.reset()
    step = torch.compile(m.forward, backend=backend, fullgraph=True, dynamic=False)
    out = {}
    with torch.no_grad():
        for f in (m.forward, step):
            cache = engine.new_cache(m, 1, max_len=24, static=True)
            f(idx[:, :8], cache=cache, pos=engine.position(cache, 0, 8))   # the prefill: its own graph
            n = len(graphs)
            out[f] = torch.cat([f(idx[:, t:t + 1], cache=cache, pos=engine.position(cache, t))[0]
                                for t in range(8, 24)], 1)
    torch._dynamo.reset()
    assert len(graphs) == n + 1, len(graphs)   # 16 positions, one graph
    reads = [str(node.target) for node in graphs[-1].graph.nodes if str(node.target) in ("item", "tolist")]
    assert not reads, reads   # nothing read back to the host inside the step (a CUDA graph cannot)
    kv = {cache.k.untyped_storage().data_ptr(), cache.v.untyped_storage().data_ptr()}
    slots = [t for t in inputs[-1] if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in kv]
    assert len(slots) == 2 * len(engine.applications(m))
    assert all(getattr(t, "_dynamo_static_input_type", None) for t in slots)   # else Inductor skips the graph
    weights = {t.data_ptr() for t in (*m.parameters(), *m.buffers())}
    moving = [tuple(t.shape) for t in inputs[-1] if isinstance(t, torch.Tensor) and t.data_ptr() not in weights
              and not getattr(t, "_dynamo_static_input_type", None)]
    assert moving == [(1, 1)], moving   # the token alone is copied in: the position and the mask are set in place
    assert (out[step] - out[m.forward]).abs().max().item() < 1e-5


def fit_cycle(m, steps=60):
    """A few Adam steps on a fixed random cycle of tokens, so greedy decoding walks through many tokens."""
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(8))
    seq = perm[torch.arange(64) % 37].unsqueeze(0)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(steps):
        _, loss = m(seq[:, :-1], seq[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return seq


@pytest.mark.parametrize("cfg", CACHE_CFGS, ids=CACHE_IDS)
def test_greedy_cached_equals_uncached(cfg):
    m = make(cfg)
    seq = fit_cycle(m)
    m.eval()
    prompt = seq[:, 3:11]
    a = engine.generate(m, prompt, 64, temperature=0, use_cache=True)
    b = engine.generate(m, prompt, 64, temperature=0, use_cache=False)
    assert a.shape == (1, 72)
    assert torch.equal(a, b)
    assert torch.equal(engine.generate(m, prompt, 64, temperature=0, static=True), b)   # engine.StaticKVCache
    assert len(set(a[0, 8:].tolist())) > 3  # greedy output is not one repeated token


def test_generate_past_block_size_rebuilds_cache():
    m = make(tiny("hrm", N=1, T=2, K=1, block_size=24), scale=4.0).eval()
    prompt = torch.randint(0, V, (2, 20), generator=torch.Generator().manual_seed(7))
    a = engine.generate(m, prompt, 30, temperature=0, use_cache=True)
    b = engine.generate(m, prompt, 30, temperature=0, use_cache=False)
    assert a.shape == (2, 50) and torch.equal(a, b)
    assert torch.equal(engine.generate(m, prompt, 30, temperature=0, static=True), b)   # the fixed-shape cache rebuilt too


def test_sampling_is_seeded_and_cache_agnostic():
    m = make(tiny("transformer", n_layer=2), scale=4.0).eval()
    prompt = torch.zeros((1, 1), dtype=torch.long)
    torch.manual_seed(11)
    a = engine.generate(m, prompt, 20, temperature=0.8, top_k=10)
    torch.manual_seed(11)
    b = engine.generate(m, prompt, 20, temperature=0.8, top_k=10, use_cache=False)
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="temperature"):
        engine.generate(m, prompt, 1, temperature=-1)
    with pytest.raises(ValueError, match="top_k"):
        engine.generate(m, prompt, 1, top_k=0)


def test_sampler_makes_no_host_sync_and_draws_the_same_tokens():
    """Top-k sampling as gpt-fast does it, without an op that makes the host wait for the GPU (a boolean-mask
    assignment needs nonzero's count; a Python list as an index is a host-to-device copy): the ops are recorded
    on the CPU. The tokens are those of the boolean-mask sampler it replaced, for the same seed."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.add(str(func).split(".")[1])
            return func(*args, **(kwargs or {}))
    m = make(tiny("hrm", N=2, T=2), scale=4.0).eval()
    prompt = torch.zeros((1, 3), dtype=torch.long)
    torch.manual_seed(5)
    with Ops() as ops:
        got = engine.generate(m, prompt, 12, temperature=0.8, top_k=10)
    assert not ops.seen & {"index", "index_put_", "nonzero", "masked_select", "_local_scalar_dense", "lift_fresh"}, ops.seen
    torch.manual_seed(5)   # the sampler before: logits[logits < v[:, [-1]]] = -inf
    idx = prompt
    for _ in range(12):
        logits = m(idx)[0][:, -1, :].float() / 0.8
        v, _ = torch.topk(logits, 10)
        logits[logits < v[:, [-1]]] = -float("inf")
        idx = torch.cat((idx, torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)), dim=1)
    assert torch.equal(got, idx)


@pytest.mark.parametrize("cfg,apps", [(tiny("hrm", N=2, T=3, S=2), 1 + 2 * 6 + 2 * 2),
                                      (tiny("transformer", n_layer=3), 3), (tiny("unitf", M=5), 5),
                                      # 1 + S (k + N) with fast_attn_steps = k; N = 0 without a Slow module
                                      (tiny("hrm", N=2, T=3, S=2, fast_attn_steps=2), 1 + 2 * (2 + 2)),
                                      (tiny("hrm", N=2, T=3, S=2, fast_attn_steps=0), 1 + 2 * (0 + 2)),
                                      (tiny("hrm", N=2, T=3, S=2, fast_attn_steps=3, fast_only=True), 1 + 2 * 3)])
def test_kv_cache_size(cfg, apps):
    m = build_model(cfg)
    assert len(engine.applications(m)) == apps
    cache = engine.new_cache(m, batch_size=3)
    assert cache.nbytes() == engine.kv_cache_bytes(m, cfg.block_size, batch_size=3)
    assert engine.kv_cache_bytes(m, 100) == 2 * apps * 100 * cfg.n_embd * 4
    assert engine.kv_cache_bytes(m, 100, dtype=torch.bfloat16) == 2 * apps * 100 * cfg.n_embd * 2


# --- cache policies (--kv): where each application writes, what it costs, what it changes --------------

@pytest.mark.parametrize("cfg,kv,slots", [
    # HRM N=2, T=3, S=1: application 0 the input block, 1..6 the Fast steps, 7..8 the Slow firings
    (tiny("hrm", N=2, T=3), "full", list(range(9))),
    (tiny("hrm", N=2, T=3), "last", [0, 1, 1, 1, 1, 1, 1, 2, 2]),
    (tiny("hrm", N=2, T=3), "fired", [0, 1, 1, 1, 2, 2, 2, 3, 3]),                    # N + 2 slots
    (tiny("hrm", N=2, T=3, S=2), "fired", [0] + [1, 1, 1, 2, 2, 2] * 2 + [3] * 4),   # passes share them too
    (tiny("hrm", N=2, T=3, fast_attn_steps=2), "fired", [0, 1, 2, 3, 3]),           # Fast steps 3 and 6 attend
    (tiny("unitf", M=5), "last", [0] * 5),
])
def test_cache_policy_slots_and_size(cfg, kv, slots):
    m = build_model(cfg)
    assert engine.cache_slots(m, kv) == slots
    cache = engine.new_cache(m, batch_size=3, kv=kv)
    assert cache.k.shape[0] == max(slots) + 1
    assert cache.nbytes() == engine.kv_cache_bytes(m, cfg.block_size, batch_size=3, kv=kv) \
        == 2 * (max(slots) + 1) * cfg.block_size * cfg.n_embd * 4 * 3


def test_cache_policy_that_does_not_apply_is_refused():
    with pytest.raises(ValueError, match="--kv=last does not apply to transformer"):
        engine.cache_slots(build_model(tiny("transformer", n_layer=2)), "last")
    with pytest.raises(ValueError, match="--kv=fired does not apply to unitf"):
        engine.cache_slots(build_model(tiny("unitf", M=3)), "fired")
    with pytest.raises(ValueError, match="choose from full, last, fired"):
        engine.cache_slots(build_model(tiny("unitf", M=3)), "lasts")


@pytest.mark.parametrize("cfg,kv", [(tiny("hrm", N=2, T=3, K=1), "last"), (tiny("hrm", N=2, T=3, K=1), "fired"),
                                    (tiny("unitf", M=3, K=1), "last")], ids=["hrm-last", "hrm-fired", "unitf-last"])
def test_shared_cache_holds_the_last_writer_and_changes_decoding(cfg, kv):
    """A prefill is exact under every policy, and leaves in each shared slot the keys and values of the last
    application that writes it (the exact cache's slot of that application); decoding then reads them in place
    of each step's own, so the logits move off the full forward's (the policy is approximate, as --help says)."""
    m = make(cfg, scale=4.0).eval()
    idx = torch.randint(0, V, (2, 30), generator=torch.Generator().manual_seed(5))
    slots = engine.cache_slots(m, kv)
    with torch.no_grad():
        full, _ = m(idx)
        exact, shared = engine.new_cache(m, 2), engine.new_cache(m, 2, kv=kv)
        assert torch.equal(m(idx[:, :20], cache=exact)[0], m(idx[:, :20], cache=shared)[0])   # prefill: exact
        last_writer = {s: app for app, s in enumerate(slots)}   # applications run in their numbered order
        for s, app in last_writer.items():
            assert torch.equal(shared.k[s, :, :, :20], exact.k[app, :, :, :20]), (s, app)
            assert torch.equal(shared.v[s, :, :, :20], exact.v[app, :, :, :20]), (s, app)
        steps = [m(idx[:, t:t + 1], cache=shared, pos=t)[0] for t in range(20, 30)]
    assert (torch.cat(steps, 1) - full[:, 20:]).abs().max().item() > 1e-4


def test_shared_cache_is_exact_where_nothing_is_shared():
    """N = T = 1 (one application per module) and UniTF M = 1: `last` and `fired` are the exact cache."""
    for cfg, kvs in [(tiny("hrm", N=1, T=1, K=1), ("last", "fired")), (tiny("unitf", M=1, K=1), ("last",))]:
        m = make(cfg, scale=4.0).eval()
        for kv in kvs:
            assert engine.cache_slots(m, kv) == list(range(len(engine.applications(m))))
        a = engine.generate(m, torch.zeros((1, 3), dtype=torch.long), 20, temperature=0, kv=kvs[-1])
        assert torch.equal(a, engine.generate(m, torch.zeros((1, 3), dtype=torch.long), 20, temperature=0, use_cache=False))


@pytest.mark.parametrize("cfg", [tiny("hrm", N=2, T=2, K=1, S=2), tiny("unitf", M=3, K=2), tiny("transformer", n_layer=2)],
                         ids=["hrm-S2", "unitf", "transformer"])
def test_teacher_forced_full_is_the_forward_gradients_included(cfg):
    """train_kv's token-by-token pass (engine.teacher_forced) under the exact policy is the full forward: the
    same logits, and the same gradients of the CE, through the K window and across positions (each step's
    keys from earlier tokens carry their gradient, as in the parallel forward)."""
    m = make(cfg, scale=2.0)
    idx = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(3))
    y = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(4))
    grads = []
    for logits in (lambda: m(idx)[0], lambda: engine.teacher_forced(m, idx, "full")[0]):
        m.zero_grad(set_to_none=True)
        out = logits()
        m.cross_entropy(out, y).backward()
        grads.append((out.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}))
    (a, ga), (b, gb) = grads
    assert (a - b).abs().max().item() < 1e-5
    assert ga.keys() == gb.keys() and len(ga) > 5
    for n in ga:
        assert (ga[n] - gb[n]).abs().max().item() <= 1e-5 * (1 + ga[n].abs().max().item()), n


def test_teacher_forced_last_is_decoding_under_last():
    """Under `last`, the training pass sees what decoding with that cache sees: its logits are the prefill of
    the first token then one-token steps against KVCache(kv="last"), and not the full forward's."""
    m = make(tiny("unitf", M=3, K=1), scale=4.0)
    idx = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(6))
    tf = engine.teacher_forced(m, idx, "last")[0]
    assert tf.requires_grad
    with torch.no_grad():
        cache = engine.new_cache(m, 2, kv="last")
        dec = torch.cat([m(idx[:, t:t + 1], cache=cache, pos=t)[0] for t in range(16)], 1)
        full = m(idx)[0]
    assert (tf.detach() - dec).abs().max().item() < 1e-5
    assert (tf.detach() - full).abs().max().item() > 1e-3


def test_under_last_the_first_step_hears_the_context_louder_than_its_token():
    """Why training through `last` stalls post-norm UniTF at the unigram line (docs/RESULTS.md section 8): at
    initialisation a token's first step attends to the past tokens' last-step values, which are normalised
    states, so the attention output is several times the token's own embedding (N(0, 0.02)), which the
    post-norm RMSNorm(x + a) then all but drowns. Under the exact cache the first step attends to embeddings
    and its output is a small fraction of the token's."""
    torch.manual_seed(1337)
    from model import ModelConfig
    m = build_model(ModelConfig(arch="unitf", vocab_size=65, block_size=64, n_embd=256, n_head=8, M=4, K=2)).eval()
    x = torch.randint(0, 65, (4, 48), generator=torch.Generator().manual_seed(0))
    ratio = {}
    for kv in ("full", "last"):
        outs = []
        h = m.block.attn.register_forward_hook(lambda mod, inp, out: outs.append(out[:, -1]))
        with torch.no_grad():
            engine.teacher_forced(m, x, kv)
        h.remove()
        first = torch.stack(outs[0::4][8:])   # step 1 of tokens 8.., which have a context to hear
        ratio[kv] = (first.pow(2).mean().sqrt() / m.wte(x).pow(2).mean().sqrt()).item()
    assert ratio["full"] < 0.2 and ratio["last"] > 3, ratio


# --- norm="pre" and the fast_only control: causality and the cache ---------------------------------

PRE = [tiny("hrm", N=2, T=2, K=1, S=2, norm="pre"), tiny("transformer", n_layer=3, norm="pre"),
       tiny("unitf", M=3, K=1, norm="pre"), tiny("hrm", N=2, T=2, K=1, fast_only=True),
       tiny("hrm", N=2, T=2, K=1, fast_only=True, norm="pre")]


PRE_IDS = ["hrm-pre", "transformer-pre", "unitf-pre", "fast_only", "fast_only-pre"]


@pytest.mark.parametrize("cfg", PRE, ids=PRE_IDS)
def test_pre_norm_and_fast_only_causality_and_cache(cfg):
    m = make(cfg, scale=4.0).eval()
    idx = torch.randint(0, V, (2, 40), generator=torch.Generator().manual_seed(5))
    idx2 = idx.clone()
    idx2[:, 13] = (idx[:, 13] + 7) % V
    with torch.no_grad():
        full, _ = m(idx)
        b, _ = m(idx2)
        cache = engine.new_cache(m, 2)
        chunks = [m(idx[:, :12], cache=cache)[0]] + [m(idx[:, t:t + 1], cache=cache, pos=t)[0] for t in range(12, 30)]
        chunks.append(m(idx[:, 30:], cache=cache, pos=30)[0])
    assert torch.equal(full[:, :13], b[:, :13]) and (full[:, 13:] - b[:, 13:]).abs().max() > 1e-4
    assert (torch.cat(chunks, 1) - full).abs().max().item() < 1e-4 and full.std() > 0.1
    c = m.config
    apps = (c.n_layer if c.arch == "transformer" else c.M if c.arch == "unitf" else
            1 + c.S * c.M + (0 if c.fast_only else c.S * c.N))
    assert cache.k.shape[0] == apps == len(engine.applications(m))


# --- self-speculative decoding: the model at a shallower depth drafts, the trained depth checks ---------------------

@pytest.mark.parametrize("arch,kw", [("hrm", dict(N=3, T=2)), ("hrm", dict(N=3, T=2, S=2)), ("unitf", dict(M=4))])
def test_self_speculative_greedy_is_plain_greedy(arch, kw):
    """Token for token, at every draft depth below the trained one and several draft lengths, past block_size (the
    cropped rest is stream()'s); the drafts are both kept and refused, so both paths run."""
    m = make(tiny(arch, vocab_size=13, block_size=24, **kw), scale=3.0).eval()
    idx = torch.randint(0, 13, (1, 5), generator=torch.Generator().manual_seed(1))
    plain, seen = engine.generate(m, idx, 40, temperature=0), {"drafted": 0, "accepted": 0}
    for d in range(1, kw.get("N", kw.get("M"))):
        for k in (1, 3, 8):
            stats = {}
            assert torch.equal(engine.generate(m, idx, 40, temperature=0, draft_depth=d, draft_tokens=k, stats=stats),
                               plain), (d, k, stats)
            seen = {key: seen[key] + stats[key] for key in seen}
    assert 0 < seen["accepted"] < seen["drafted"], seen


@pytest.mark.parametrize("temperature,top_k", [(1.0, None), (0.7, 3)])
def test_speculative_acceptance_keeps_the_full_distribution(temperature, top_k):
    """The acceptance rule alone: a draft x ~ q kept with probability min(1, p(x)/q(x)), else a draw from
    max(p - q, 0): over 20,000 draws each token comes out as often as p says (chi-square, p > 0.001; seeded)."""
    from scipy import stats
    g = torch.Generator().manual_seed(0)
    p_logits, bonus, q_logits = (torch.randn(1, 6, generator=g) * 2 for _ in range(3))
    q, p = engine.probs(q_logits, temperature, top_k), engine.probs(p_logits, temperature, top_k)[0]
    torch.manual_seed(0)
    counts = torch.zeros(6)
    for _ in range(20_000):
        x = torch.multinomial(q, 1)
        kept, fix = engine.accept(torch.cat([p_logits, bonus]), [x], [q], temperature, top_k)
        counts[(x if kept else fix)[0, 0]] += 1
    support = p > 0
    assert counts[~support].sum() == 0   # top_k: nothing outside the full model's top k
    assert stats.chisquare(counts[support], 20_000 * p[support] / p[support].sum()).pvalue > 1e-3, (counts, p)


def test_a_transformer_has_no_draft_depth():
    m = make(tiny("transformer", n_layer=2)).eval()
    with pytest.raises(UserError, match="a Transformer has no shallower self"):
        engine.generate(m, torch.zeros(1, 2, dtype=torch.long), 4, temperature=0, draft_depth=1)


# --- sample.py on a tiny checkpoint: text out, greedy identical with and without the cache -----------

@pytest.fixture(scope="module")
def ckpt_dir(data_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sample"))
    run_train(["--arch=hrm", "--N=2", "--T=2", "--K=1", "--S=2", "--max_iters=20", "--eval_interval=20",
               "--learning_rate=1e-2"], data_dir, out)
    return out


def sample(*args):
    return in_process("sample.py", *args)   # its stdout and stderr as a subprocess's (3 s of importing torch less)


def test_greedy_identical_with_and_without_cache(ckpt_dir):
    common = [f"--out_dir={ckpt_dir}", "--temperature=0", "--num_samples=1", "--max_new_tokens=48", "--start=ROMEO:"]
    a, b = sample(*common), sample(*common, "--use_cache=False")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout.startswith("ROMEO:") and len(a.stdout) > 40
    assert a.stdout == b.stdout
    assert "cached, kv=full" in a.stderr and "full recompute" in b.stderr
    # the rate after the first token apart: the first carries the prefill and a first call's warm-up
    n, secs, rate, then = re.search(r"\((\d+) tokens in ([\d.]+) s, ([\d.]+) tok/s; after the first, ([\d.]+) "
                                    r"tok/s; cached", a.stderr).groups()
    assert int(n) == 48 and abs(float(rate) - 48 / float(secs)) <= 0.05 * float(rate) + 0.1 and float(then) > 0
    c = sample(*common, "--kv=fired")   # a shared cache: text of its own, said so on stderr
    assert c.returncode == 0 and c.stdout.startswith("ROMEO:") and "cached, kv=fired" in c.stderr, c.stderr
    d = sample(*common, "--ckpt=ckpt_last.dcp")   # the resume state (its newest folder): here the same iteration 20
    assert d.returncode == 0 and d.stdout == a.stdout, d.stderr
    for k in (1, 4):   # self-speculative: drafted at one Slow firing of the trained two, the same text
        e = sample(*common, "--draft_depth=1", f"--draft_tokens={k}")
        assert e.returncode == 0 and e.stdout == a.stdout and "drafted at depth 1" in e.stderr, e.stderr


def test_decoding_attends_without_cudnn_and_changes_nothing_global(ckpt_dir, monkeypatch):
    """cuDNN's attention costs a graph build at each new length, i.e. at every decoded token (6x on an H200): every
    decoding forward of engine.py (sample.py's stream, teacher_forced's token by token) runs without it, scoped to
    the forward, so the caller's setting is the same before, between tokens and after."""
    model = model_from_checkpoint(load_checkpoint(os.path.join(ckpt_dir, "ckpt.pt"))).eval()
    seen, real = [], model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **k: seen.append(torch.backends.cuda.cudnn_sdp_enabled())
                        or real(*a, **k))
    idx = torch.zeros(1, 3, dtype=torch.long)
    between = [torch.backends.cuda.cudnn_sdp_enabled() for _ in engine.stream(model, idx, 3, temperature=0)]
    engine.teacher_forced(model, idx, "full")
    assert seen == [False] * 6 and between == [True] * 3 and torch.backends.cuda.cudnn_sdp_enabled()


@pytest.mark.slow   # a minute of compiling on 2 cores
def test_sample_compiled_is_greedy_identical(ckpt_dir):
    common = [f"--out_dir={ckpt_dir}", "--temperature=0", "--num_samples=2", "--max_new_tokens=24", "--start=ROMEO:"]
    a, b = sample(*common), run_script("sample.py", *common, "--compile=True")
    assert a.returncode == 0 and b.returncode == 0 and a.stdout == b.stdout and "compiled" in b.stderr, b.stderr


def test_sampling_is_seeded(ckpt_dir):
    common = [f"--out_dir={ckpt_dir}", "--num_samples=2", "--max_new_tokens=20"]
    a, b, c = sample(*common, "--seed=7"), sample(*common, "--seed=7"), sample(*common, "--seed=8")
    assert a.returncode == b.returncode == c.returncode == 0, a.stderr + c.stderr
    assert a.stdout.count("\n") >= 2 and a.stderr.count("tokens in") == 2  # two samples were drawn
    assert a.stdout == b.stdout and a.stdout != c.stdout


def test_long_prompt_is_cropped_with_a_note(ckpt_dir, tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text("To be, or not to be, that is the question. " * 20)
    p = sample(f"--out_dir={ckpt_dir}", f"--start=FILE:{prompt}", "--num_samples=1", "--max_new_tokens=5")
    assert p.returncode == 0, p.stderr
    assert "over block_size=32; keeping its last 32 tokens" in p.stderr


@pytest.mark.parametrize("args,msg", [
    (["--out_dir=/nonexistent"], "no checkpoint at /nonexistent/ckpt.pt"),
    (["--temperature=-0.5"], "temperature must be >= 0"),
    (["--top_k=-1"], "top_k must be >= 1"),
    (["--start=FILE:/nonexistent.txt"], "cannot read the prompt file"),
    (["--tempreature=1"], "unknown config key 'tempreature'"),
    (["--kv=lst"], "kv must be one of full, last, fired, got kv='lst'"),
    (["--kv=last", "--use_cache=False"], "with use_cache=True, got kv='last' and use_cache=False"),
    (["--compile=True", "--use_cache=False"], "compile=True and draft_depth decode against the exact cache"),
    (["--draft_depth=1", "--kv=last"], "compile=True and draft_depth decode against the exact cache"),
    (["--draft_depth=2"], "draft_depth must be 1..1 (below the trained depth 2), draft_tokens >= 1, one sequence"),
])
def test_sample_bad_input_is_one_line(ckpt_dir, args, msg):
    if args[0] in ("--out_dir=/nonexistent", "--tempreature=1"):   # the real entry point: exit status, no traceback
        line = one_error_line(run_script("sample.py", f"--out_dir={ckpt_dir}", *args), prog="sample.py")
    else:
        line = error_in_process("sample.py", f"--out_dir={ckpt_dir}", *args)
    assert msg in line, line



# SIGHUP slow (CI time): sample.py's one handler, which CI runs under SIGHUP in test_cli.py
@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGHUP, marks=pytest.mark.slow)])
def test_sample_streams_and_ctrl_c_keeps_the_text(ckpt_dir, sig):
    """Text appears while generating (10^7 tokens would take hours), and Ctrl-C keeps it: exit 130, one line; a
    closed terminal (SIGHUP) too, with 129."""
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "sample.py"), f"--out_dir={ckpt_dir}",
                             "--num_samples=1", "--max_new_tokens=10000000", "--start=ROMEO:"],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    got, deadline = b"", time.time() + 120
    while len(got) < 40:   # streamed: these bytes come long before the sample could have ended
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.time()))
        if not ready:
            proc.kill()
            pytest.fail(f"no streamed text within 120 s, only {got!r}")
        chunk = os.read(proc.stdout.fileno(), 4096)
        assert chunk, proc.stderr.read().decode()[-2000:]
        got += chunk
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    text = (got + out).decode()
    assert proc.returncode == 128 + sig, err
    assert text.startswith("ROMEO:") and len(text) > 40
    lines = [l for l in err.decode().splitlines() if l.strip()]
    assert len(lines) == 1 and f"interrupted by {signal.Signals(sig).name}" in lines[0] and "Traceback" not in err.decode(), err


def test_ctrl_c_stops_sample_even_when_its_parent_ignored_sigint(ckpt_dir):
    """A child inherits SIGINT ignored from a parent that ignores it (nohup, some job runners and test workers):
    Python then installs no KeyboardInterrupt handler, and sample.py used to run on after a Ctrl-C (issue 49's
    lost Ctrl-C). Its own handler makes it stop: exit 130, one line."""
    code = ("import signal, subprocess, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            "sys.exit(subprocess.call(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", code, sys.executable, os.path.join(ROOT, "sample.py"),
                             f"--out_dir={ckpt_dir}", "--num_samples=1", "--max_new_tokens=10000000"],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    got = b""
    while len(got) < 20:   # generating: the handler is in place
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready, "no streamed text within 120 s"
        got += os.read(proc.stdout.fileno(), 4096)
    for child in psutil_children(proc.pid):
        os.kill(child, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted by SIGINT" in err.decode()


def psutil_children(pid):
    """The pids of pid's children (from /proc: no psutil needed)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_streamed_text_equals_decoding_it_all_at_once(ckpt_dir):
    """BPE tokens can end inside a character: the streamed text must still be decode(all tokens)."""
    from hrmlm.checkpoint import load_checkpoint, model_from_checkpoint
    from hrmlm.common import get_codec
    ck = load_checkpoint(os.path.join(ckpt_dir, "ckpt.pt"))
    model = model_from_checkpoint(ck).eval()
    encode, decode = get_codec(ck["meta"])
    start = "ROMEO: ¿qué? ☃"
    y = engine.generate(model, torch.tensor([encode(start)]), 60, temperature=0)
    p = run_script("sample.py", f"--out_dir={ckpt_dir}", f"--start={start}", "--num_samples=1",
                   "--max_new_tokens=60", "--temperature=0")
    assert p.returncode == 0, p.stderr
    assert p.stdout == decode(y[0].tolist()) + "\n"


@pytest.mark.slow   # trains a character model (CI time)
def test_prompt_characters_outside_a_char_vocabulary_are_named(char_data, tmp_path):
    out = str(tmp_path / "c")
    run_train(char_tiny(out, "--eval_iters=2", "--max_iters=2"), char_data, out)
    p = run_script("sample.py", f"--out_dir={out}", "--start=ROMEO: ☃{", "--num_samples=1", "--max_new_tokens=5")
    assert p.returncode == 0, p.stderr
    note = [l for l in p.stderr.splitlines() if l.startswith("note:")]
    assert len(note) == 1 and "'{☃'" in note[0] and "read as a space" in note[0], p.stderr
