"""HRM's equations written out with raw tensor operations on the model's own weights.

The reference below calls no module of model.py: every RMSNorm, attention, RoPE rotation, SwiGLU,
gate and fusion is spelled out from SPEC sections 1-2, so a model that computes a different equation
(g and 1 - g swapped, a reordered context, the Slow module fed a stale z_L, a flipped entropy sign)
disagrees with it.
"""

import math

import pytest
import torch

from model import ModelConfig, build_model

V, D, H, n = 37, 16, 2, 10


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
    """SPEC 1: a = MHSA_causal(x); x' = RMSNorm(x + a); x'' = RMSNorm(x' + SwiGLU(x'))."""
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
    cfg = ModelConfig(arch="hrm", vocab_size=V, block_size=n, n_embd=D, n_head=H, N=2, T=2, K=4, ent_lambda=0.5)
    torch.manual_seed(0)
    m = build_model(cfg).double()  # float64: the comparison is about equations, not rounding
    with torch.no_grad():  # weights large enough that every term matters, alphas and tau off their inits
        for name, q in m.named_parameters():
            q.copy_(torch.randn_like(q) * (0.4 if q.dim() >= 2 else 0.3) + (1.0 if q.dim() < 2 else 0.0))
    g = torch.Generator().manual_seed(1)
    idx, tgt = torch.randint(0, V, (2, n), generator=g), torch.randint(0, V, (2, n), generator=g)
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
