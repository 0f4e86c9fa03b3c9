"""HRM's equations and every gradient route, checked against references written out by hand.

Two references, for two questions:
  - `hrm_reference` calls no module of model.py: every RMSNorm, attention, RoPE rotation, SwiGLU, gate and
    fusion is spelled out from docs/MODEL.md sections 1-2 on the model's own weights, so a model that computes a
    different equation (g and 1 - g swapped, a reordered context, the Slow module fed a stale z_L, a flipped
    entropy sign) disagrees with it. It runs every step in full autograd: forward values and K = M gradients.
  - `hrm_windowed_loss` runs the model's own modules step by step and cuts the gradient by hand where
    Algorithm 3 says (the last-K window, K_slow, sg() between passes), so the model's gradient routing is
    compared with an explicit one; `unitf_windowed_loss` is the same for UniTF.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from hrmlm import engine
from conftest import V, assert_grads_close, grads, grads_differ, make, tiny
from model import ModelConfig, build_model

# --- the equations, with raw tensor operations -----------------------------------------------------

VOCAB, D, H, n = 37, 16, 2, 10


def rms(x, w, eps=1e-5):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x):
    """Rotate-half RoPE, base 10000, positions 0..n-1, on (B, H, n, hd)."""
    hd = x.size(-1)
    inv = 1.0 / 10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    ang = torch.arange(x.size(-2), dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos().double(), ang.sin().double()   # the model's tables are float32, as here
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def block(x, p):
    """docs/MODEL.md section 1: a = MHSA_causal(x); x' = RMSNorm(x + a); x'' = RMSNorm(x' + SwiGLU(x'))."""
    B, t, d = x.shape
    hd = d // H
    q, k, v = (x @ p["attn.qkv.weight"].T).split(d, dim=-1)
    q, k, v = (z.view(B, t, H, hd).transpose(1, 2) for z in (q, k, v))
    q, k = rope(q), rope(k)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, t, d) @ p["attn.proj.weight"].T
    x1 = rms(x + a, p["norm1.weight"])
    mlp = ((x1 @ p["mlp.w1.weight"].T) * torch.nn.functional.silu(x1 @ p["mlp.w2.weight"].T)) @ p["mlp.w3.weight"].T
    return rms(x1 + mlp, p["norm2.weight"])


def sub(p, prefix):
    return {k[len(prefix):]: v for k, v in p.items() if k.startswith(prefix)}


def gated(z, context, p):
    """Eqs. concat, gate, content, lgate: c = RMSNorm([...]); g = sigmoid(c W_g); z <- g z + (1-g) alpha h W_out."""
    c = rms(torch.cat(context, dim=-1), p["norm.weight"])
    g = torch.sigmoid(c @ p["gate.weight"].T)
    h = block(c @ p["proj_in.weight"].T, sub(p, "block."))
    return g * z + (1 - g) * p["alpha"] * (h @ p["proj_out.weight"].T)


def hrm_reference(p, cfg, idx, targets):
    """Algorithm 2 for S = 1 with every step in full autograd (forward values do not depend on K)."""
    x_tilde = block(p["wte.weight"][idx], sub(p, "input_block."))
    z_L = p["z_L0"].expand_as(x_tilde)
    z_H = p["z_H0"].expand_as(x_tilde)
    for i in range(1, cfg.M + 1):
        z_L = gated(z_L, (z_L, z_H, x_tilde), sub(p, "L_net."))        # Fast: [z_L; z_H; x~]
        if i % cfg.T == 0:
            z_H = gated(z_H, (z_H, z_L), sub(p, "H_net."))              # Slow: [z_H; z_L new]
    h_H, h_L, h_I = rms(z_H, p["fusion.norm_H.weight"]), rms(z_L, p["fusion.norm_L.weight"]), rms(x_tilde, p["fusion.norm_I.weight"])
    w = torch.softmax(torch.cat([h_H, h_L, h_I], -1) @ p["fusion.gate.weight"].T / p["fusion.tau"], dim=-1)
    out = w[..., 0:1] * h_H + w[..., 1:2] * h_L + w[..., 2:3] * h_I
    logits = (out @ p["fusion.proj.weight"].T) @ p["wte.weight"].T
    logp = logits.log_softmax(-1)
    ce = -logp.gather(-1, targets[..., None]).mean()
    w_bar = w.mean(dim=(0, 1))
    entropy = -(w_bar * w_bar.log()).sum()
    return logits, ce - cfg.ent_lambda * entropy


@pytest.fixture
def setup():
    cfg = ModelConfig(arch="hrm", vocab_size=VOCAB, block_size=n, n_embd=D, n_head=H, N=2, T=2, K=4, ent_lambda=0.5)
    torch.manual_seed(0)
    m = build_model(cfg).double()  # float64: the comparison is about equations, not rounding
    with torch.no_grad():  # weights large enough that every term matters, alphas and tau off their inits
        for name, q in m.named_parameters():
            q.copy_(torch.randn_like(q) * (0.4 if q.dim() >= 2 else 0.3) + (1.0 if q.dim() < 2 else 0.0))
    g = torch.Generator().manual_seed(1)
    idx, tgt = torch.randint(0, VOCAB, (2, n), generator=g), torch.randint(0, VOCAB, (2, n), generator=g)
    p = {**dict(m.named_parameters()), **dict(m.named_buffers())}
    return m, cfg, p, idx, tgt


def test_hrm_forward_and_loss_match_the_equations(setup):
    m, cfg, p, idx, tgt = setup
    logits, loss = m(idx, tgt)
    ref_logits, ref_loss = hrm_reference(p, cfg, idx, tgt)
    assert ref_logits.std() > 0.5
    torch.testing.assert_close(logits, ref_logits, rtol=1e-7, atol=1e-7)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-6, atol=1e-6)  # the model's CE is float32


def test_hrm_gradients_match_the_equations(setup):
    """K = M here, so every step carries gradient in both; the gradients must agree too."""
    m, cfg, p, idx, tgt = setup
    _, loss = m(idx, tgt)
    g_model = torch.autograd.grad(loss, list(m.parameters()))
    _, ref_loss = hrm_reference(p, cfg, idx, tgt)
    g_ref = torch.autograd.grad(ref_loss, list(m.parameters()))
    for (name, _), a, b in zip(m.named_parameters(), g_model, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=name)  # float32 CE: float32 rounding


# --- the gradient routes: the model's modules, cut by hand ------------------------------------------

def hrm_windowed_loss(m, idx, targets, K=None, K_slow=0, cut_fast=True, detach_passes=True):
    """HRM written out with full autograd on the model's modules and cut by hand (Algorithm 3): the output
    of a Fast step outside the last K (K=None: no window, full backprop) is detached, so a Slow firing
    there reads a detached z_L, and so is the output of a Slow firing that is neither one of the last
    K_slow nor inside the last K steps. cut_fast=False leaves the Fast steps uncut (gradient would then
    also run through L_net between firings); detach_passes=False lets gradient cross the passes."""
    c = m.config
    K = c.M if K is None else K
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
        if detach_passes:
            z_L, z_H = z_L.detach(), z_H.detach()
    return loss


def unitf_windowed_loss(m, idx, targets, K=None):
    """UniTF written out: M applications of the block, the state detached before the last K (K=None: none);
    pre-norm's final norm where the model has one."""
    c = m.config
    x = m.wte(idx)
    for i in range(1, c.M + 1):
        x = m.block(x, m.rope)
        if K is not None and i == c.M - K:
            x = x.detach()
    if m.norm_f is not None:
        x = m.norm_f(x)
    if m.config.out_proj:   # the control's untied matrix, HRM's fusion.proj, between the state and the tied logits
        x = x @ m.out_proj.weight.T
    return F.cross_entropy((x @ m.wte.weight.T).view(-1, V), targets.view(-1))


class NoSlowModule:
    """The model as hrm_windowed_loss sees it, with an identity Slow module (the fast_only control)."""

    def __init__(self, m):
        self.m = m

    def __getattr__(self, name):
        return (lambda z_H, z_L, rope: z_H) if name == "H_net" else getattr(self.m, name)


# --- the last-K window (Algorithm 3) and pass boundaries (Eq. detach) --------------------------------

def test_gradient_window_equals_detached_state(batch):
    idx, tgt = batch
    m = make(tiny("hrm", N=2, T=3, K=2, S=1), scale=3.0)
    K = m.config.K
    _, loss = m(idx, tgt)
    g_model = grads(m, loss)
    ref = hrm_windowed_loss(m, idx, tgt, K=K)
    torch.testing.assert_close(loss, ref)
    assert_grads_close(g_model, grads(m, ref))
    # without the detach, steps 1..M-K would add gradient: the window really cuts it
    assert grads_differ(g_model, grads(m, hrm_windowed_loss(m, idx, tgt, K=None)))


def test_early_steps_change_loss_not_gradient_path(batch):
    """Perturb the first M-K steps' output: the loss moves, the gradient still equals the detached reference."""
    idx, tgt = batch
    m = make(tiny("hrm", N=2, T=2, K=1, S=1), scale=3.0)
    _, base = m(idx, tgt)
    with torch.no_grad():
        m.z_L0.add_(0.5)     # changes what steps 1..M-K produce
    _, loss = m(idx, tgt)
    assert abs(loss.item() - base.item()) > 1e-5
    assert_grads_close(grads(m, loss), grads(m, hrm_windowed_loss(m, idx, tgt, K=1)))


def test_full_backprop_when_K_ge_M(batch):
    idx, tgt = batch
    m = make(tiny("hrm", N=2, T=2, K=4, S=1), scale=3.0)
    g = grads(m, m(idx, tgt)[1])
    assert_grads_close(g, grads(m, hrm_windowed_loss(m, idx, tgt, K=None)))
    assert grads_differ(g, grads(m, hrm_windowed_loss(m, idx, tgt, K=2)))   # M = 4: the state cut after step 2
    m.config.K = 99  # K > M is full backprop too
    assert_grads_close(g, grads(m, m(idx, tgt)[1]))


def test_no_gradient_across_passes(batch):
    idx, tgt = batch
    m = make(tiny("hrm", N=1, T=2, K=2, S=2), scale=3.0)
    _, loss = m(idx, tgt)
    g = grads(m, loss)
    ref = hrm_windowed_loss(m, idx, tgt, detach_passes=True)
    torch.testing.assert_close(loss, ref)
    assert_grads_close(g, grads(m, ref))
    assert grads_differ(g, grads(m, hrm_windowed_loss(m, idx, tgt, detach_passes=False)))


def test_unitf_gradient_window(batch):
    idx, tgt = batch
    m = make(tiny("unitf", M=4, K=1), scale=3.0)
    g = grads(m, m(idx, tgt)[1])
    assert_grads_close(g, grads(m, unitf_windowed_loss(m, idx, tgt, K=1)))
    assert grads_differ(g, grads(m, unitf_windowed_loss(m, idx, tgt, K=None)))


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
    torch.testing.assert_close(loss, hrm_windowed_loss(m, idx, tgt))
    m.config.ent_lambda = 0.0
    _, loss0 = m(idx, tgt)
    assert loss0.item() > loss.item()  # the entropy bonus is subtracted (entropy of 3 weights > 0)


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
    assert len(engine.applications(chunked)) == len(engine.applications(full))


# --- K_slow: the last Slow firings carry gradient too (docs/MODEL.md section 8) -------------------------------

def test_K_slow_gradient_routing(batch):
    """K_slow = 3 of N = 4 firings, Fast window K = 1 (only step 8): gradient runs back along z_H across
    firings 2, 3, 4 (steps 4, 6, 8), never into the Fast steps outside the window."""
    idx, tgt = batch
    m = make(tiny("hrm", N=4, T=2, K=1, S=2, K_slow=3), scale=3.0)
    from tools.analyze import record_steps
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
    ref = hrm_windowed_loss(m, idx, tgt, K=1, K_slow=3)
    torch.testing.assert_close(loss, ref)
    assert_grads_close(g, grads(m, ref))   # the same parameters, the same gradients
    # the extra firings add gradient to the Slow module only: every other parameter's is the paper's
    g0 = grads(m, hrm_windowed_loss(m, idx, tgt, K=1, K_slow=0))
    assert grads_differ({n: g[n] for n in g if n.startswith("H_net.")}, g0)
    def rest(gr):
        return {n: v for n, v in gr.items() if not n.startswith("H_net.")}
    assert_grads_close(rest(g), rest(g0))
    # and the cuts matter: without the z_L detach, or with one firing fewer, the gradient differs
    assert grads_differ(g, grads(m, hrm_windowed_loss(m, idx, tgt, K=1, K_slow=3, cut_fast=False)))
    assert grads_differ(g, grads(m, hrm_windowed_loss(m, idx, tgt, K=1, K_slow=2)))
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


# --- grad_ckpt: the same gradients, recomputed --------------------------------------------------------

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


# --- pre-norm and the Fast-module-only control keep the windows ---------------------------------------

@pytest.mark.parametrize("fast_only", [False, True])
def test_pre_norm_hrm_gradient_window(batch, fast_only):
    """The last-K window under pre-norm: the same gradients as the state detached after step M-K."""
    idx, tgt = batch
    m = make(tiny("hrm", N=2, T=3, K=2, S=2, norm="pre", fast_only=fast_only), scale=3.0)
    _, loss = m(idx, tgt)
    g_model = grads(m, loss)
    ref = NoSlowModule(m) if fast_only else m   # the reference's Slow step becomes the identity
    g_ref = grads(m, hrm_windowed_loss(ref, idx, tgt, K=m.config.K))
    assert_grads_close(g_model, g_ref)


def test_pre_norm_unitf_gradient_window(batch):
    idx, tgt = batch
    m = make(tiny("unitf", M=4, K=2, norm="pre"), scale=3.0)
    _, loss = m(idx, tgt)
    g_model = grads(m, loss)
    g_ref = grads(m, unitf_windowed_loss(m, idx, tgt, K=2))   # norm_f included
    assert_grads_close(g_model, g_ref)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_out_proj_is_a_matrix_before_the_tied_logits(batch, norm):
    """out_proj (the BPE-plateau control): logits = RMSNorm?(x) W_p^T W_emb^T, W_p untied and N(0, 0.02) like
    HRM's fusion.proj; the Transformer's blocks written out, and UniTF against its windowed reference."""
    idx, tgt = batch
    m = make(tiny("transformer", n_layer=2, norm=norm, out_proj=True), scale=3.0)
    x = m.wte(idx)
    for block in m.blocks:
        x = block(x, m.rope)
    x = m.norm_f(x) if norm == "pre" else x
    ref = F.cross_entropy((x @ m.out_proj.weight.T @ m.wte.weight.T).view(-1, V), tgt.view(-1))
    _, loss = m(idx, tgt)
    torch.testing.assert_close(loss, ref)
    assert_grads_close(grads(m, loss), grads(m, ref))
    assert m.num_params() == make(tiny("transformer", n_layer=2, norm=norm)).num_params() + 32 * 32
    assert abs(make(tiny("transformer", out_proj=True)).out_proj.weight.std().item() - 0.02) < 0.004
    u = make(tiny("unitf", M=3, K=2, norm=norm, out_proj=True), scale=3.0)
    g = grads(u, u(idx, tgt)[1])
    assert_grads_close(g, grads(u, unitf_windowed_loss(u, idx, tgt, K=2)))


def test_fast_only_is_hrm_with_z_H_frozen(batch):
    """fast_only == an HRM whose Slow update is the identity (z_H = z_H0 throughout), with no H_net weights."""
    idx, tgt = batch
    fo = make(tiny("hrm", N=2, T=2, K=2, fast_only=True))
    full = make(tiny("hrm", N=2, T=2, K=2))
    assert not any(k.startswith("H_net.") for k in fo.state_dict())
    missing, unexpected = full.load_state_dict(fo.state_dict(), strict=False)
    assert not unexpected and missing and all(k.startswith("H_net.") for k in missing)
    full.H_net.forward = lambda z_H, z_L, *rest: z_H
    with torch.no_grad():
        torch.testing.assert_close(fo(idx, tgt)[0], full(idx, tgt)[0], rtol=0, atol=0)
    with pytest.raises(ValueError, match="fast_only"):
        ModelConfig(arch="unitf", fast_only=True)
    with pytest.raises(ValueError, match="norm"):
        ModelConfig(norm="sandwich")

