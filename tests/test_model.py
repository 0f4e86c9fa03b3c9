"""model.py against ../shared/SPEC.md: sizes, keys, causality, the gradient window, caches, init."""

import math

import pytest
import torch
import torch.nn.functional as F

from model import ModelConfig, apply_rope, build_model, rope_table

V = 101  # small vocabulary for the functional tests


def tiny(arch="hrm", **kw):
    base = dict(arch=arch, vocab_size=V, block_size=80, n_embd=32, n_head=4)
    base.update(kw)
    return ModelConfig(**base)


def make(cfg, seed=0, scale=1.0):
    torch.manual_seed(seed)
    m = build_model(cfg)
    if scale != 1.0:  # larger weights so that logits are far from uniform and greedy decoding varies
        with torch.no_grad():
            for p in m.parameters():
                if p.dim() >= 2:
                    p.mul_(scale)
    return m


# --- SPEC section 3: the paper's sizes, to the parameter --------------------------------------

PAPER_SIZES = [
    (dict(arch="hrm", n_embd=4096, N=4, T=3, K=2), 1_229_357_059),
    (dict(arch="hrm", n_embd=2048, N=4, T=9, K=2), 358_825_987),
    (dict(arch="hrm", n_embd=5120, N=3, T=3, K=2), 1_856_512_003),
    (dict(arch="transformer", n_embd=4096, n_layer=2), 742_739_968),
    (dict(arch="transformer", n_embd=4096, n_layer=4), 1_279_627_264),
    (dict(arch="transformer", n_embd=4096, n_layer=12), 3_427_176_448),
    (dict(arch="unitf", n_embd=4096, M=12), 474_296_320),
    (dict(arch="unitf", n_embd=5760, M=12), 820_333_440),
    (dict(arch="unitf", n_embd=7296, M=12), 1_218_395_520),
]


@pytest.mark.parametrize("kw,expected", PAPER_SIZES)
def test_paper_sizes(kw, expected):
    with torch.device("meta"):
        m = build_model(ModelConfig(n_head=16, **kw))
    assert m.num_params() == expected


def test_hrm_size_independent_of_NTKS():
    with torch.device("meta"):
        sizes = {build_model(ModelConfig(n_embd=4096, n_head=16, N=n, T=t, K=k, S=s)).num_params()
                 for n, t, k, s in [(4, 3, 2, 1), (2, 2, 1, 3), (8, 6, 16, 2)]}
    assert sizes == {1_229_357_059}


def test_block_size_formula():
    from model import CausalAttnBlock
    for d in (64, 4096):
        with torch.device("meta"):
            b = CausalAttnBlock(d, 16)
        assert sum(p.numel() for p in b.parameters()) == 16 * d * d + 2 * d


BLOCK_KEYS = ["attn.qkv.weight", "attn.proj.weight", "mlp.w1.weight", "mlp.w2.weight", "mlp.w3.weight",
              "norm1.weight", "norm2.weight"]


def test_hrm_state_dict_keys_and_shapes():
    d, V_ = 4096, 50257
    with torch.device("meta"):
        m = build_model(ModelConfig(arch="hrm", n_embd=d, n_head=16, N=4, T=3, K=2))
    expected = {"wte.weight": (V_, d), "z_H0": (d,), "z_L0": (d,),
                "L_net.norm.weight": (3 * d,), "L_net.gate.weight": (d, 3 * d), "L_net.proj_in.weight": (d, 3 * d),
                "L_net.proj_out.weight": (d, d), "L_net.alpha": (),
                "H_net.norm.weight": (2 * d,), "H_net.gate.weight": (d, 2 * d), "H_net.proj_in.weight": (d, 2 * d),
                "H_net.proj_out.weight": (d, d), "H_net.alpha": (),
                "fusion.norm_H.weight": (d,), "fusion.norm_L.weight": (d,), "fusion.norm_I.weight": (d,),
                "fusion.gate.weight": (3, 3 * d), "fusion.tau": (), "fusion.proj.weight": (d, d)}
    block_shapes = {"attn.qkv.weight": (3 * d, d), "attn.proj.weight": (d, d), "mlp.w1.weight": (4 * d, d),
                    "mlp.w2.weight": (4 * d, d), "mlp.w3.weight": (d, 4 * d), "norm1.weight": (d,), "norm2.weight": (d,)}
    for prefix in ("input_block.", "L_net.block.", "H_net.block."):
        expected.update({prefix + k: s for k, s in block_shapes.items()})
    sd = m.state_dict()
    assert set(sd) == set(expected)
    assert {k: tuple(v.shape) for k, v in sd.items()} == expected


def test_baseline_state_dict_keys():
    with torch.device("meta"):
        t = build_model(ModelConfig(arch="transformer", n_embd=64, n_head=4, n_layer=3))
        u = build_model(ModelConfig(arch="unitf", n_embd=64, n_head=4, M=5))
    assert set(t.state_dict()) == {"wte.weight"} | {f"blocks.{l}.{k}" for l in range(3) for k in BLOCK_KEYS}
    assert set(u.state_dict()) == {"wte.weight"} | {f"block.{k}" for k in BLOCK_KEYS}


@pytest.mark.parametrize("kw,field", [
    (dict(n_embd=30, n_head=4), "n_embd"), (dict(K=0), "K"), (dict(T=0), "T"), (dict(N=0), "N"),
    (dict(S=0), "S"), (dict(arch="gpt"), "arch"), (dict(arch="hrm", N=2, T=2, M=5), "M"),
    (dict(arch="unitf", M=0), "M"), (dict(n_embd=12, n_head=4), "n_head"), (dict(ent_lambda=-1.0), "ent_lambda"),
    (dict(K_slow=-1), "K_slow"), (dict(K_slow=1, fast_only=True), "K_slow"), (dict(arch="unitf", K_slow=1), "K_slow"),
    (dict(grad_ckpt=1), "grad_ckpt"), (dict(arch="transformer", grad_ckpt=True), "grad_ckpt"),
    (dict(fast_attn_steps=13), "fast_attn_steps"), (dict(fast_attn_steps=-1), "fast_attn_steps"),
    (dict(arch="unitf", fast_attn_steps=2), "fast_attn_steps"),
])
def test_invalid_config_names_field(kw, field):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        ModelConfig(**{**dict(n_embd=32, n_head=4), **kw})


# --- RoPE (SPEC section 1: rotate-half, base 10000) -------------------------------------------------

def test_rope_is_rotate_half():
    """apply_rope (one roll, signed sin table) equals RoPE written out: x1*cos - x2*sin, x2*cos + x1*sin."""
    hd, n = 8, 11
    x = torch.randn(2, 3, n, hd, generator=torch.Generator().manual_seed(0))
    pos = torch.arange(n, dtype=torch.float32)
    theta = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)   # (hd/2,)
    ang = pos[:, None] * theta[None, :]
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    want = torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], dim=-1)
    cos, sin_rot = rope_table(32, hd)
    got = apply_rope(x, cos[:n], sin_rot[:n])
    assert (got - want).abs().max().item() < 1e-5
    # and q.k after RoPE depends on the positions only through their difference
    q, k = torch.randn(hd), torch.randn(hd)
    def dot(i, j):
        return (apply_rope(q, cos[i], sin_rot[i]) * apply_rope(k, cos[j], sin_rot[j])).sum()
    assert abs(dot(5, 2) - dot(20, 17)) < 1e-4 and abs(dot(5, 2) - dot(5, 3)) > 1e-3


# --- causality ----------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg", [tiny("hrm", N=2, T=2, K=2, S=2), tiny("transformer", n_layer=2),
                                 tiny("unitf", M=3, K=1), tiny("hrm", N=2, T=2, fast_attn_steps=1)],
                         ids=["hrm", "transformer", "unitf", "hrm-hybrid1"])
def test_causality(cfg):
    m = make(cfg, scale=5.0).eval()
    idx = torch.randint(0, V, (2, 24), generator=torch.Generator().manual_seed(1))
    t = 13
    idx2 = idx.clone()
    idx2[:, t] = (idx[:, t] + 7) % V
    with torch.no_grad():
        a, _ = m(idx)
        b, _ = m(idx2)
    assert torch.equal(a[:, :t], b[:, :t])
    assert (a[:, t:] - b[:, t:]).abs().max() > 1e-4  # and the change does reach t and after


# --- the gradient window (Algorithm 3) and pass boundaries (Eq. detach) ----------------------------

def hrm_reference_loss(m, idx, targets, detach_after=None, detach_passes=True):
    """HRM written out with full autograd; the state is detached after step `detach_after` of every pass."""
    c = m.config
    x = m.input_block(m.wte(idx), m.rope)
    z_L = m.z_L0.expand_as(x)
    z_H = m.z_H0.expand_as(x)
    loss = 0.0
    for _ in range(c.S):
        for i in range(1, c.M + 1):
            z_L = m.L_net(z_L, z_H, x, m.rope)
            if i % c.T == 0:
                z_H = m.H_net(z_H, z_L, m.rope)
            if i == detach_after:
                z_L, z_H = z_L.detach(), z_H.detach()
        out, w = m.fusion(z_H, z_L, x)
        logits = out @ m.wte.weight.T
        w_bar = w.mean(dim=(0, 1))
        ent = -(w_bar * w_bar.log()).sum()
        loss = loss + (F.cross_entropy(logits.view(-1, V), targets.view(-1)) - c.ent_lambda * ent) / c.S
        if detach_passes:
            z_L, z_H = z_L.detach(), z_H.detach()
    return loss


def grads(m, loss):
    m.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def assert_grads_close(g1, g2):
    assert g1.keys() == g2.keys()
    for n in g1:
        torch.testing.assert_close(g1[n], g2[n], rtol=1e-4, atol=1e-7, msg=n)


def grads_differ(g1, g2):
    return any(not torch.allclose(g1[n], g2[n], rtol=1e-3, atol=1e-6) for n in g1)


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, V, (2, 16), generator=g), torch.randint(0, V, (2, 16), generator=g)


def test_gradient_window_equals_detached_state(batch):
    idx, tgt = batch
    m = make(tiny("hrm", N=2, T=3, K=2, S=1), scale=3.0)
    M, K = m.config.M, m.config.K
    _, loss = m(idx, tgt)
    g_model = grads(m, loss)
    ref = hrm_reference_loss(m, idx, tgt, detach_after=M - K)
    torch.testing.assert_close(loss, ref)
    assert_grads_close(g_model, grads(m, ref))
    # without the detach, steps 1..M-K would add gradient: the window really cuts it
    assert grads_differ(g_model, grads(m, hrm_reference_loss(m, idx, tgt, detach_after=None)))


def test_early_steps_change_loss_not_gradient_path(batch):
    """Perturb the first M-K steps' output: the loss moves, the gradient still equals the detached reference."""
    idx, tgt = batch
    m = make(tiny("hrm", N=2, T=2, K=1, S=1), scale=3.0)
    _, base = m(idx, tgt)
    with torch.no_grad():
        m.z_L0.add_(0.5)     # changes what steps 1..M-K produce
    _, loss = m(idx, tgt)
    assert abs(loss.item() - base.item()) > 1e-5
    assert_grads_close(grads(m, loss), grads(m, hrm_reference_loss(m, idx, tgt, detach_after=m.config.M - 1)))


def test_full_backprop_when_K_ge_M(batch):
    idx, tgt = batch
    m = make(tiny("hrm", N=2, T=2, K=4, S=1), scale=3.0)
    g = grads(m, m(idx, tgt)[1])
    assert_grads_close(g, grads(m, hrm_reference_loss(m, idx, tgt, detach_after=None)))
    assert grads_differ(g, grads(m, hrm_reference_loss(m, idx, tgt, detach_after=2)))
    m.config.K = 99  # K > M is full backprop too
    assert_grads_close(g, grads(m, m(idx, tgt)[1]))


def test_no_gradient_across_passes(batch):
    idx, tgt = batch
    m = make(tiny("hrm", N=1, T=2, K=2, S=2), scale=3.0)
    _, loss = m(idx, tgt)
    g = grads(m, loss)
    ref = hrm_reference_loss(m, idx, tgt, detach_passes=True)
    torch.testing.assert_close(loss, ref)
    assert_grads_close(g, grads(m, ref))
    assert grads_differ(g, grads(m, hrm_reference_loss(m, idx, tgt, detach_passes=False)))


def test_unitf_gradient_window(batch):
    idx, tgt = batch
    m = make(tiny("unitf", M=4, K=1), scale=3.0)
    g = grads(m, m(idx, tgt)[1])

    def ref(detach_after):
        x = m.wte(idx)
        for i in range(1, 5):
            x = m.block(x, m.rope)
            if i == detach_after:
                x = x.detach()
        return F.cross_entropy((x @ m.wte.weight.T).view(-1, V), tgt.view(-1))
    assert_grads_close(g, grads(m, ref(3)))
    assert grads_differ(g, grads(m, ref(None)))


@pytest.mark.parametrize("arch", ["hrm", "unitf"])
def test_K_changes_no_forward_value(arch, batch):
    idx, tgt = batch
    kw = dict(N=2, T=2) if arch == "hrm" else dict(M=4)
    m1 = make(tiny(arch, K=1, **kw), scale=3.0)
    m4 = make(tiny(arch, K=4, **kw), scale=3.0)
    l1, loss1 = m1(idx, tgt)
    l4, loss4 = m4(idx, tgt)
    torch.testing.assert_close(l1, l4)
    torch.testing.assert_close(loss1, loss4)


def test_loss_is_mean_over_passes_and_entropy_term(batch):
    idx, tgt = batch
    m = make(tiny("hrm", N=1, T=2, K=2, S=3, ent_lambda=0.3), scale=3.0)
    _, loss = m(idx, tgt)
    torch.testing.assert_close(loss, hrm_reference_loss(m, idx, tgt))
    m.config.ent_lambda = 0.0
    _, loss0 = m(idx, tgt)
    assert loss0.item() > loss.item()  # the entropy bonus is subtracted (entropy of 3 weights > 0)


# --- cached decoding (SPEC section 5) ------------------------------------------------------------

CACHE_CFGS = [tiny("hrm", N=2, T=2, K=1, S=1), tiny("hrm", N=2, T=2, K=1, S=2),
              tiny("transformer", n_layer=3), tiny("unitf", M=3, K=1),
              # fast_attn_steps (SPEC section 8): caches for the attending applications only
              tiny("hrm", N=3, T=2, K=1, S=2, fast_attn_steps=2), tiny("hrm", N=2, T=2, K=1, fast_attn_steps=0),
              tiny("hrm", N=2, T=2, K=1, fast_only=True, fast_attn_steps=1)]
CACHE_IDS = ["hrm-S1", "hrm-S2", "transformer", "unitf", "hrm-hybrid2-S2", "hrm-rnn", "hrm-fast_only-hybrid1"]


@pytest.mark.parametrize("cfg", CACHE_CFGS, ids=CACHE_IDS)
def test_cached_logits_match_full_forward(cfg):
    m = make(cfg, scale=4.0).eval()
    idx = torch.randint(0, V, (2, 50), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full, _ = m(idx)
        cache = m.new_cache(2)
        chunks = [m(idx[:, :12], cache=cache)[0]]                          # prefill
        chunks += [m(idx[:, t:t + 1], cache=cache)[0] for t in range(12, 40)]  # one token at a time
        chunks.append(m(idx[:, 40:], cache=cache)[0])                    # a chunk after the prefix
    cached = torch.cat(chunks, dim=1)
    assert cache.pos == 50
    # HRM's cached logits match to ~3e-7 here (a key from a wrong slot moves them by ~1e-4 or less: its
    # attention enters through alpha = 0.1 and the gates), UniTF's to ~2e-5
    assert (cached - full).abs().max().item() < (1e-5 if cfg.arch == "hrm" else 1e-4)
    assert full.std() > 0.1  # logits are not trivially flat


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
    a = m.generate(prompt, 64, temperature=0, use_cache=True)
    b = m.generate(prompt, 64, temperature=0, use_cache=False)
    assert a.shape == (1, 72)
    assert torch.equal(a, b)
    assert len(set(a[0, 8:].tolist())) > 3  # greedy output is not one repeated token


def test_generate_past_block_size_rebuilds_cache():
    m = make(tiny("hrm", N=1, T=2, K=1, block_size=24), scale=4.0).eval()
    prompt = torch.randint(0, V, (2, 20), generator=torch.Generator().manual_seed(7))
    a = m.generate(prompt, 30, temperature=0, use_cache=True)
    b = m.generate(prompt, 30, temperature=0, use_cache=False)
    assert a.shape == (2, 50) and torch.equal(a, b)


def test_sampling_is_seeded_and_cache_agnostic():
    m = make(tiny("transformer", n_layer=2), scale=4.0).eval()
    prompt = torch.zeros((1, 1), dtype=torch.long)
    torch.manual_seed(11)
    a = m.generate(prompt, 20, temperature=0.8, top_k=10)
    torch.manual_seed(11)
    b = m.generate(prompt, 20, temperature=0.8, top_k=10, use_cache=False)
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="temperature"):
        m.generate(prompt, 1, temperature=-1)
    with pytest.raises(ValueError, match="top_k"):
        m.generate(prompt, 1, top_k=0)


@pytest.mark.parametrize("cfg,apps", [(tiny("hrm", N=2, T=3, S=2), 1 + 2 * 6 + 2 * 2),
                                      (tiny("transformer", n_layer=3), 3), (tiny("unitf", M=5), 5),
                                      # 1 + S (k + N) with fast_attn_steps = k; N = 0 without a Slow module
                                      (tiny("hrm", N=2, T=3, S=2, fast_attn_steps=2), 1 + 2 * (2 + 2)),
                                      (tiny("hrm", N=2, T=3, S=2, fast_attn_steps=0), 1 + 2 * (0 + 2)),
                                      (tiny("hrm", N=2, T=3, S=2, fast_attn_steps=3, fast_only=True), 1 + 2 * 3)])
def test_kv_cache_size(cfg, apps):
    m = build_model(cfg)
    assert m.n_cache_apps() == apps
    cache = m.new_cache(batch_size=3)
    assert cache.nbytes() == m.kv_cache_bytes(cfg.block_size, batch_size=3)
    assert m.kv_cache_bytes(100) == 2 * apps * 100 * cfg.n_embd * 4
    assert m.kv_cache_bytes(100, dtype=torch.bfloat16) == 2 * apps * 100 * cfg.n_embd * 2


# --- initialisation (SPEC section 4) -------------------------------------------------------------

def _std_ok(t, std):
    # the sample std of n normals has relative standard error ~ 1/sqrt(2n); allow 6 of those
    n = t.numel()
    return abs(t.std().item() / std - 1) < 6 / math.sqrt(2 * n)


def test_init_hrm():
    torch.manual_seed(0)
    m = build_model(ModelConfig(arch="hrm", vocab_size=1000, n_embd=256, n_head=4, N=2, T=4, block_size=16))
    M = 8
    for name, p in m.named_parameters():
        if name.endswith("alpha"):
            assert p.item() == pytest.approx(0.1)
        elif name == "fusion.tau":
            assert p.item() == 1.0
        elif "norm" in name:
            assert torch.all(p == 1)
        elif name.startswith(("L_net.block.", "H_net.block.")):
            assert _std_ok(p, 0.02 / math.sqrt(M)), name
        else:
            assert _std_ok(p, 0.02), name
    for z in (m.z_H0, m.z_L0):
        assert z.min() >= -2 and z.max() <= 2
        assert _std_ok(z, 0.8796)  # the std of TN(0, 1, [-2, 2])
    pids = {id(p) for p in m.parameters()}
    assert id(m.z_H0) not in pids and id(m.z_L0) not in pids
    assert {"z_H0", "z_L0"} <= set(m.state_dict())


def test_init_baselines():
    torch.manual_seed(0)
    d, M = 256, 6
    u = build_model(ModelConfig(arch="unitf", vocab_size=1000, n_embd=d, n_head=4, M=M, block_size=16, unitf_init_c=4))
    for name, p in u.named_parameters():
        if "norm" in name:
            continue
        std = 0.02 / math.sqrt(4 * M * d / 4096) if name.startswith("block.") else 0.02
        assert _std_ok(p, std), name
    t = build_model(ModelConfig(arch="transformer", vocab_size=1000, n_embd=d, n_head=4, n_layer=2, block_size=16))
    for name, p in t.named_parameters():
        if "norm" not in name:
            assert _std_ok(p, 0.02), name


# --- options beyond the paper (SPEC section 8) ---------------------------------------------------

def hrm_detached_by_hand(m, idx, targets, K, K_slow, cut_fast=True):
    """HRM under the K / K_slow windows, written out with full autograd and cut by hand: the output of a
    Fast step outside the last K is detached (so a Slow firing there reads a detached z_L), and so is the
    output of a Slow firing that is neither one of the last K_slow nor inside the last K steps.
    cut_fast=False leaves the Fast steps uncut: gradient would then also run through L_net between firings."""
    c = m.config
    x = m.input_block(m.wte(idx), m.rope)
    z_L, z_H = m.z_L0.expand_as(x), m.z_H0.expand_as(x)
    loss = 0.0
    for _ in range(c.S):
        for i in range(1, c.M + 1):
            z_L = m.L_net(z_L, z_H, x, m.rope)
            if i <= c.M - K and cut_fast:
                z_L = z_L.detach()
            if i % c.T == 0:
                z_H = m.H_net(z_H, z_L, m.rope)
                if i <= c.M - K and i // c.T <= c.N - K_slow:
                    z_H = z_H.detach()
        out, w = m.fusion(z_H, z_L, x)
        w_bar = w.mean(dim=(0, 1))
        ce = F.cross_entropy((out @ m.wte.weight.T).view(-1, V), targets.view(-1))
        loss = loss + (ce + c.ent_lambda * (w_bar * w_bar.log()).sum()) / c.S
        z_L, z_H = z_L.detach(), z_H.detach()
    return loss


def test_K_slow_gradient_routing(batch):
    """K_slow = 3 of N = 4 firings, Fast window K = 1 (only step 8): gradient runs back along z_H across
    firings 2, 3, 4 (steps 4, 6, 8), never into the Fast steps outside the window."""
    idx, tgt = batch
    m = make(tiny("hrm", N=4, T=2, K=1, S=2, K_slow=3), scale=3.0)
    from analyze import record_steps
    with record_steps(m) as record:
        _, loss = m(idx, tgt)
    steps = [(i, z_L, za if fired else None) for i, fired, z_L, zb, za in record]
    assert [i for i, _, _ in steps] == list(range(1, 9)) * 2
    for _, z_L, z_H in steps:
        for z in (z_L, z_H):
            if z is not None and z.requires_grad:
                z.retain_grad()
    g = grads(m, loss)
    # which steps carry gradient, in both passes: z_L of step 8 only; z_H of the firings at steps 4, 6, 8
    for i, z_L, z_H in steps:
        assert z_L.requires_grad == (i == 8), i
        if z_H is not None:
            assert z_H.requires_grad == (i >= 4), i
            assert z_H.requires_grad == (z_H.grad is not None and z_H.grad.abs().sum() > 0), i
    ref = hrm_detached_by_hand(m, idx, tgt, K=1, K_slow=3)
    torch.testing.assert_close(loss, ref)
    assert_grads_close(g, grads(m, ref))   # the same parameters, the same gradients
    # the extra firings add gradient to the Slow module only: every other parameter's is the paper's
    g0 = grads(m, hrm_detached_by_hand(m, idx, tgt, K=1, K_slow=0))
    assert grads_differ({n: g[n] for n in g if n.startswith("H_net.")}, g0)
    def rest(gr):
        return {n: v for n, v in gr.items() if not n.startswith("H_net.")}
    assert_grads_close(rest(g), rest(g0))
    # and the cuts matter: without the z_L detach, or with one firing fewer, the gradient differs
    assert grads_differ(g, grads(m, hrm_detached_by_hand(m, idx, tgt, K=1, K_slow=3, cut_fast=False)))
    assert grads_differ(g, grads(m, hrm_detached_by_hand(m, idx, tgt, K=1, K_slow=2)))
    # ...but not the forward values
    m0 = make(tiny("hrm", N=4, T=2, K=1, S=2), scale=3.0)
    torch.testing.assert_close(m0(idx, tgt)[1], loss)


def test_K_slow_within_fast_window_changes_nothing(batch):
    """Firings 3 and 4 of N = 4 (steps 6, 8) are inside K = 4 already: K_slow = 2 adds nothing."""
    idx, tgt = batch

    def g(K_slow):
        m = make(tiny("hrm", N=4, T=2, K=4, K_slow=K_slow), scale=3.0)
        return grads(m, m(idx, tgt)[1])
    assert_grads_close(g(0), g(2))
    assert grads_differ(g(0), g(3))   # firing 2 (step 4) is outside: K_slow = 3 reaches it


GRAD_CKPT_CFGS = [dict(arch="hrm", N=3, T=2, K=6), dict(arch="hrm", N=3, T=2, K=3, S=2),
                  dict(arch="hrm", N=4, T=2, K=1, K_slow=3), dict(arch="hrm", N=3, T=2, K=6, fast_attn_steps=2),
                  dict(arch="hrm", N=2, T=2, K=4, norm="pre"), dict(arch="unitf", M=5, K=5),
                  dict(arch="unitf", M=5, K=2)]


@pytest.mark.parametrize("kw", GRAD_CKPT_CFGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_grad_ckpt_same_gradients(kw, batch):
    idx, tgt = batch
    plain = make(tiny(**kw), scale=3.0)
    ckpt = make(tiny(grad_ckpt=True, **kw), scale=3.0)
    loss_p, loss_c = plain(idx, tgt)[1], ckpt(idx, tgt)[1]
    assert loss_p.item() == loss_c.item()
    gp, gc = grads(plain, loss_p), grads(ckpt, loss_c)
    assert gp.keys() == gc.keys()
    for n in gp:
        torch.testing.assert_close(gc[n], gp[n], rtol=1e-6, atol=1e-6, msg=n)


def test_grad_ckpt_recomputes_exactly_the_steps_with_gradient(batch):
    """In backward, grad_ckpt re-runs each step that carries gradient once: K Fast steps and the firings
    with gradient (HRM N=4, T=2, K=3, K_slow=3: steps 6..8 and firings at 4, 6, 8), the K UniTF steps."""
    idx, tgt = batch
    for kw, blocks in [(dict(arch="hrm", N=4, T=2, K=3, K_slow=3), {"L_net.block": (8, 3), "H_net.block": (4, 3)}),
                       (dict(arch="unitf", M=5, K=2), {"block": (5, 2)})]:
        for on in (False, True):
            m = make(tiny(grad_ckpt=on, **kw))
            calls = dict.fromkeys(blocks, 0)
            for name in blocks:
                m.get_submodule(name).register_forward_pre_hook(
                    lambda mod, args, name=name: calls.__setitem__(name, calls[name] + 1))
            _, loss = m(idx, tgt)
            fwd = dict(calls)
            loss.backward()
            assert fwd == {k: v[0] for k, v in blocks.items()}
            assert {k: calls[k] - fwd[k] for k in calls} == {k: (v[1] if on else 0) for k, v in blocks.items()}


@pytest.mark.parametrize("N,T,k,steps", [(3, 2, 1, {6}), (3, 2, 2, {3, 6}), (3, 2, 3, {2, 4, 6}), (4, 2, 3, {3, 6, 8}),
                                         (3, 2, 6, {1, 2, 3, 4, 5, 6}), (3, 2, None, {1, 2, 3, 4, 5, 6})])
def test_fast_attn_steps_which_steps_attend(N, T, k, steps):
    """k evenly spaced steps ending at M (model.py's choice); k = N gives the Slow-firing steps."""
    m = make(tiny("hrm", N=N, T=T, S=2, fast_attn_steps=k))
    step, seen = [0], []
    m.L_net.register_forward_pre_hook(lambda mod, args: step.__setitem__(0, step[0] % (N * T) + 1))
    m.L_net.block.attn.register_forward_pre_hook(lambda mod, args: seen.append(step[0]))
    with torch.no_grad():
        m(torch.zeros(1, 5, dtype=torch.long))
    assert seen == sorted(steps) * 2  # the same steps in both passes


def test_fast_attn_steps_zero_has_no_attention():
    m = make(tiny("hrm", N=2, T=2, fast_attn_steps=0))
    assert m.L_net.block.attn is None and m.H_net.block.attn is not None
    keys = set(m.state_dict())
    assert not any(k.startswith("L_net.block.attn.") for k in keys) and "L_net.block.norm1.weight" in keys
    pre = make(tiny("hrm", N=2, T=2, fast_attn_steps=0, norm="pre"))
    assert "L_net.block.norm1.weight" not in pre.state_dict()  # pre-norm's norm1 fed the attention only
    m.eval()(torch.zeros(1, 4, dtype=torch.long))
    _, loss = pre(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long))
    loss.backward()
    assert all(p.grad is not None for p in pre.parameters())  # no unused parameter (DDP would stop on one)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_skipped_attention_is_a_zero(norm):
    """A block applied with cache_slot=None equals the same block whose attention adds a = 0 (W_o = 0)."""
    from model import CausalAttnBlock
    torch.manual_seed(0)
    b = CausalAttnBlock(32, 4, norm)
    x = torch.randn(2, 7, 32)
    rope = rope_table(16, 8)
    got = b(x, rope, cache_slot=None)
    with torch.no_grad():
        b.attn.proj.weight.zero_()
    torch.testing.assert_close(got, b(x, rope), rtol=0, atol=1e-6)
    # position-wise: a shorter input gives the same rows (up to BLAS blocking, which varies with shape)
    torch.testing.assert_close(got[:, :3], b(x[:, :3], rope, cache_slot=None), rtol=0, atol=1e-6)


def test_fast_attn_steps_M_is_the_paper(batch):
    idx, tgt = batch
    a, la = make(tiny("hrm", N=2, T=2), scale=3.0)(idx, tgt)
    b, lb = make(tiny("hrm", N=2, T=2, fast_attn_steps=4), scale=3.0)(idx, tgt)
    assert torch.equal(a, b) and torch.equal(la, lb)
    c, _ = make(tiny("hrm", N=2, T=2, fast_attn_steps=2), scale=3.0)(idx, tgt)
    assert (a - c).abs().max() > 1e-5  # skipping attention in steps 1, 3 changes the output


def test_chunked_bptt_is_S_passes_of_C_steps(batch):
    """The paper's chunked BPTT ("partition the M steps into chunks of size C; backpropagate through each
    chunk independently and accumulate gradients") written out on an M = 8 model as a hand loop -- a loss
    at the end of every chunk of C = 4 steps, the state detached between chunks -- equals the config
    N = C/T, S = M/C, K = C: the same loss, the same gradients, and the same logits as the M-step model."""
    idx, tgt = batch
    M, T, C = 8, 2, 4
    full = make(tiny("hrm", N=M // T, T=T, K=M), scale=3.0)
    chunked = build_model(tiny("hrm", N=C // T, T=T, K=C, S=M // C))
    chunked.load_state_dict(full.state_dict())   # the same weights (init stds differ: they use the pass's M)
    m = full
    x = m.input_block(m.wte(idx), m.rope)
    z_L, z_H = m.z_L0.expand_as(x), m.z_H0.expand_as(x)
    losses = []
    for i in range(1, M + 1):
        z_L = m.L_net(z_L, z_H, x, m.rope)
        if i % T == 0:
            z_H = m.H_net(z_H, z_L, m.rope)
        if i % C == 0:                                      # the end of a chunk: its own loss
            out, w = m.fusion(z_H, z_L, x)
            w_bar = w.mean(dim=(0, 1))
            losses.append(F.cross_entropy((out @ m.wte.weight.T).view(-1, V), tgt.view(-1))
                          + m.config.ent_lambda * (w_bar * w_bar.log()).sum())
            z_L, z_H = z_L.detach(), z_H.detach()          # chunks are independent
    ref = sum(losses) / len(losses)                         # accumulated (as a mean: a scale only)
    logits, loss = chunked(idx, tgt)
    torch.testing.assert_close(loss, ref)
    assert_grads_close(grads(chunked, loss), grads(full, ref))
    with torch.no_grad():
        torch.testing.assert_close(logits, full(idx)[0])
    assert chunked.n_cache_apps() == full.n_cache_apps()
