"""
HRM-LM, the Transformer and the Universal Transformer (UniTF), in one file, in the paper's order. Read it beside
the paper ("Hierarchical vs. Flat Iteration in Shared-Weight Transformers") and docs/MODEL.md, which maps every
equation to the code below and says how we resolve the paper's slips. It needs only torch: copy it anywhere.

  section of this file                          the paper (section; equation)             docs/MODEL.md
  1. CausalAttnBlock (RMSNorm, RoPE, SwiGLU)    "Architecture Overview"; Eq. causal_attn  section 1
  2. LanguageModel: W_emb, the tied logits      "Input Encoding"; "Output Fusion"         sections 2, 3
  3-4. the Fast module L_net, the Slow H_net    "Gated Fast-Module Update", "Slow-Module  section 2
                                                Update"; Eqs. concat, gate, content, lgate
  5. the output fusion                          "Output Fusion"                           section 2
  6. HRM: input encoding, z^0, sg, L_acc        "State Initialization and Supervision     sections 2, 4
                                                Passes"; Eq. detach; Algorithms 2 and 3
  7. Transformer (L blocks), UniTF (1 block x M) Eqs. tfm1-2; appendix "UniTF"            sections 3, 4

Attention takes a KV cache (the paper sizes it, Eq. kv_hrm; engine.py decodes with it), its application's slot and
its first position. Options beyond the paper (docs/MODEL.md section 8) are ModelConfig fields, off by default.
"""

import math
from dataclasses import dataclass, fields, replace
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

ARCHS = ("hrm", "transformer", "unitf")
UNUSED = {"hrm": ("n_layer", "unitf_init_c", "out_proj"),   # the fields each arch has no use for
          "transformer": ("N", "T", "M", "K", "S", "ent_lambda", "unitf_init_c", "learn_alpha"),
          "unitf": ("n_layer", "N", "T", "S", "ent_lambda", "learn_alpha")}


@dataclass
class ModelConfig:
    arch: str = "hrm"          # "hrm" | "transformer" | "unitf"
    vocab_size: int = 50257    # GPT-2 BPE
    block_size: int = 1024     # longest sequence (RoPE table and KV cache length)
    n_embd: int = 4096         # d
    n_head: int = 16
    n_layer: int = 4           # transformer: L independent blocks
    N: int = 4                 # hrm: Slow-module firings per pass
    T: int = 3                 # hrm: Fast steps per Slow firing
    M: Optional[int] = None    # steps per pass; hrm: always N*T (filled in); unitf: default 12; transformer: None
    K: int = 2                 # hrm/unitf: gradient window, the last K of M steps (K >= M: full backprop)
    S: int = 1                 # hrm: supervision passes
    ent_lambda: float = 0.01   # hrm: weight of the fusion-entropy bonus (the paper gives no value; ours)
    unitf_init_c: float = 2.0  # unitf: c in std = 0.02/sqrt(c*M*d/4096) (paper v4 uses 4)
    norm: str = "post"         # "post" (the paper) | "pre": x + f(RMSNorm(x)) in every block, a control for trainability
    fast_only: bool = False    # hrm: a control with no Slow module, z_H held at z_H0 (re-injection and gating, no hierarchy)
    K_slow: int = 0            # hrm: the last K_slow Slow firings of a pass also carry gradient ("hierarchical BPTT")
    grad_ckpt: bool = False    # hrm/unitf: steps with gradient are recomputed in backward (same gradients, flat memory)
    fast_attn_steps: Optional[int] = None  # hrm: how many Fast steps attend (None: all M; 0: position-wise, RNN-style)
    out_proj: bool = False     # transformer/unitf: HRM's untied d x d matrix before the tied logits (a control)
    learn_alpha: bool = True   # hrm: False holds alpha_L, alpha_H at 0.1 (a buffer): a remedy for their collapse

    def __post_init__(self):
        """Fill in M (HRM: N*T; UniTF: 12 unless given); refuse what no model can be built from, naming the field."""
        def bad(field, why):
            raise ValueError(f"ModelConfig.{field}: {why}")
        is_int = lambda v, least: isinstance(v, int) and not isinstance(v, bool) and v >= least  # noqa: E731
        if self.arch not in ARCHS:
            bad("arch", f"unknown arch {self.arch!r}, expected one of {ARCHS}")
        for f in ("vocab_size", "block_size", "n_embd", "n_head", "n_layer", "N", "T", "K", "S"):
            if not is_int(getattr(self, f), 1):
                bad(f, f"must be an integer >= 1, got {getattr(self, f)!r}")
        for f in ("out_proj", "learn_alpha", "fast_only", "grad_ckpt"):
            if not isinstance(getattr(self, f), bool):
                bad(f, f"must be True or False, got {getattr(self, f)!r}")
        if self.n_embd % self.n_head:
            bad("n_embd", f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if (self.n_embd // self.n_head) % 2:
            bad("n_head", f"head_dim={self.n_embd // self.n_head} must be even for RoPE")
        if self.arch == "hrm" and self.M not in (None, self.N * self.T):
            bad("M", f"for hrm M is N*T={self.N * self.T}; got M={self.M!r} (leave it None)")
        for f in UNUSED[self.arch]:   # set away from its default, such a field would be silently ignored
            if getattr(self, f) != getattr(type(self), f):
                bad(f, f"arch={self.arch!r} does not use {f}; leave it at its default {getattr(type(self), f)!r}")
        if self.arch != "transformer":
            self.M = self.N * self.T if self.arch == "hrm" else 12 if self.M is None else self.M
            if not is_int(self.M, 1):
                bad("M", f"must be an integer >= 1, got {self.M!r}")
        if self.norm not in ("post", "pre"):
            bad("norm", f"must be 'post' (the paper) or 'pre', got {self.norm!r}")
        if self.fast_only and self.arch != "hrm":
            bad("fast_only", f"is an HRM control; arch={self.arch!r} has no Slow module to remove")
        if not is_int(self.K_slow, 0) or self.K_slow and (self.arch != "hrm" or self.fast_only):
            bad("K_slow", f"is an integer >= 0 (0: the paper) and needs a Slow module; got {self.K_slow!r}")
        if self.grad_ckpt and self.arch == "transformer":
            bad("grad_ckpt", "is for the recurrent archs hrm/unitf")
        k = self.fast_attn_steps
        if k is not None and (self.arch != "hrm" or not is_int(k, 0) or k > self.M):
            bad("fast_attn_steps", f"is None (all M steps attend) or 0..M={self.M} for arch='hrm'; got {k!r}")
        for f, least in (("ent_lambda", 0.0), ("unitf_init_c", 1e-300)):   # >= 0 and > 0
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= least):
                bad(f, f"must be a finite number {'>= 0' if least == 0 else '> 0'}, got {v!r}")


MODEL_FIELDS = tuple(f.name for f in fields(ModelConfig))


# ---------------------------------------------------------------------------
# 1. The shared block: CausalAttnBlock (Eq. causal_attn; docs/MODEL.md section 1)
#    a = MHSA_causal(x);  x' = RMSNorm(x + a);  x'' = RMSNorm(x' + SwiGLU(x'))

class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + 1e-5) * weight."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_table(block_size, head_dim, base=10000.0):
    """RoPE tables (block_size, head_dim), rotate-half layout: cos, and sin_rot = sin with its first half negated,
    so that [-x2, x1] sin (x1, x2 the halves of a head) is exactly [x2, x1] sin_rot, [x2, x1] one roll of x."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    ang = torch.outer(torch.arange(block_size, dtype=torch.float32), inv_freq)
    ang = torch.cat([ang, ang], dim=-1)
    sin_rot = ang.sin()
    sin_rot[:, :head_dim // 2] *= -1
    return ang.cos(), sin_rot


def apply_rope(x, cos, sin_rot):
    """Rotate-half RoPE on the last dim (a head): x * cos + [-x2, x1] * sin, written with one roll."""
    return x * cos + x.roll(x.size(-1) // 2, -1) * sin_rot


class CausalSelfAttention(nn.Module):
    """MHSA_causal with a fused W_qkv (split [q, k, v]), RoPE on q and k, scale 1/sqrt(head_dim)."""

    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)

    def forward(self, x, rope, pos=0, cache=None, slot=0):
        """x: positions pos..pos+t of the sequence (pos: an int, or engine.StaticKVCache's tensor of the t positions).
        With a cache (engine.py), its slot `slot` holds this application's keys and values of positions 0..pos;
        these t are written after them, and attention reads all of them under the mask the cache returns."""
        B, t, d = x.shape
        qkv = self.qkv(x).view(B, t, 3, self.n_head, d // self.n_head).permute(2, 0, 3, 1, 4)  # (3, B, H, t, hd)
        at = pos if isinstance(pos, torch.Tensor) else slice(pos, pos + t)
        cos, sin_rot = rope[0][at], rope[1][at]                    # RoPE at the tokens' own positions
        if cos.dtype != qkv.dtype:
            cos, sin_rot = cos.to(qkv.dtype), sin_rot.to(qkv.dtype)
        q, k = apply_rope(qkv[:2], cos, sin_rot).unbind(0)         # q and k rotated together
        v, mask = qkv[2], None
        if cache is not None:
            k, v, mask = cache.update(slot, pos, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and k.size(2) == t)
        return self.proj(y.transpose(1, 2).reshape(B, t, d))


class SwiGLU(nn.Module):
    """SwiGLU(x) = (x W1 * silu(x W2)) W3, d_ff = 4d."""

    def __init__(self, d):
        super().__init__()
        self.w1 = nn.Linear(d, 4 * d, bias=False)
        self.w2 = nn.Linear(d, 4 * d, bias=False)
        self.w3 = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        return self.w3(self.w1(x) * F.silu(self.w2(x)))


class CausalAttnBlock(nn.Module):
    """Post-norm block, 16d^2 + 2d parameters (the paper's 14d^2 is a slip: docs/MODEL.md section 1). norm="pre"
    (section 8, not the paper): x + attn(norm1(x)), then x + mlp(norm2(x)), a control for trainability."""

    def __init__(self, d, n_head, norm="post", attn=True):
        super().__init__()
        self.pre = norm == "pre"
        self.attn = CausalSelfAttention(d, n_head) if attn else None  # attn=False: never attends (no keys)
        self.norm1 = RMSNorm(d) if attn or not self.pre else None     # pre-norm's norm1 feeds attention only
        self.mlp = SwiGLU(d)
        self.norm2 = RMSNorm(d)

    def forward(self, x, rope, pos=0, cache=None, slot=0, attend=True):
        """attend=False (fast_attn_steps, docs/MODEL.md section 8): a = 0, so the block is position-wise."""
        if self.pre:
            if attend:
                x = x + self.attn(self.norm1(x), rope, pos, cache, slot)
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + self.attn(x, rope, pos, cache, slot) if attend else x)   # x' (Eq. causal_attn)
        return self.norm2(x + self.mlp(x))                                          # x''


# ---------------------------------------------------------------------------
# 2. What the three models share (docs/MODEL.md sections 2-4): the token embedding of "Input Encoding",
#    e = W_emb[x], the weight-tied logits of "Output Fusion", logits = h_out W_emb^T; RoPE; the init; the CE loss

class LanguageModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = self.trained_config = config   # config: the depth the next forward runs (set_depth)
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)   # W_emb
        cos, sin_rot = rope_table(config.block_size, config.n_embd // config.n_head)
        self.register_buffer("rope_cos", cos, persistent=False)  # derived, not in the state_dict
        self.register_buffer("rope_sin_rot", sin_rot, persistent=False)
        self.norm_f = None   # a final RMSNorm before the logits: the baselines' under norm="pre" only
        # out_proj: the baselines given what HRM's fusion ends in (OutputFusion.proj), a control (RESULTS section 4)
        self.out_proj = nn.Linear(config.n_embd, config.n_embd, bias=False) if config.out_proj else None

    @property
    def rope(self):
        return self.rope_cos, self.rope_sin_rot

    def _init_weights(self, module=None, std=0.02):
        """N(0, std) for every linear and embedding weight of the module (docs/MODEL.md section 4): 0.02 for the
        model, less for a block applied many times."""
        for m in (self if module is None else module).modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=std)

    def num_params(self):
        """Stored parameters; the tied output projection counts once."""
        return sum(p.numel() for p in self.parameters())

    def set_depth(self, n=None):
        """Run the next forwards n steps deep with the same weights (docs/MODEL.md section 8): UniTF M' = n steps,
        HRM N' = n Slow firings with T kept; None: the trained depth again. No weight depends on the depth."""
        c = self.trained_config
        if c.arch == "transformer":
            raise ValueError("a Transformer's depth is its n_layer independent blocks; only hrm/unitf recur")
        self.config = c if n is None else replace(c, **({"N": n, "M": None} if c.arch == "hrm" else {"M": n}))

    def _step(self, module, *args):
        """One recurrent step; with grad_ckpt (section 8) a step with gradient is recomputed in backward."""
        if self.config.grad_ckpt and torch.is_grad_enabled():
            return checkpoint(module, *args, use_reentrant=False)
        return module(*args)

    def head(self, x, targets=None, last_only=False):
        """The weight-tied logits x W_emb^T (of the last position alone: last_only) and, given targets, the CE loss."""
        if last_only:
            x = x[:, -1:]
        if self.norm_f is not None:   # norm="pre" only (docs/MODEL.md section 8)
            x = self.norm_f(x)
        if self.out_proj is not None:
            x = self.out_proj(x)
        logits = x @ self.wte.weight.T
        return logits, (self.cross_entropy(logits, targets) if targets is not None else None)

    def cross_entropy(self, logits, targets):
        """CE(logits, Y): mean over the positions whose target is not -1, in float32 even under autocast."""
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1)


# ---------------------------------------------------------------------------
# 3. The Fast module f_L (section "Gated Fast-Module Update"; Eqs. concat, gate, content, lgate)
#    c = RMSNorm([z_L; z_H; x~]);  g = sigmoid(c W_g^L);  h = Block(c W_in; theta_L)
#    z_L <- g * z_L + (1 - g) * alpha * h W_out
# 4. The Slow module f_H (section "Slow-Module Update"), the same gated form on
#    c_H = RMSNorm([z_H; z_L]) -- no x~: tokens reach the Slow module only through z_L.

class GatedModule(nn.Module):
    """One gated recurrent update: the Fast module (n_in=3) or the Slow module (n_in=2)."""

    def __init__(self, d, n_head, n_in, norm="post", attn=True, learn_alpha=True):
        super().__init__()
        self.norm = RMSNorm(n_in * d)
        self.gate = nn.Linear(n_in * d, d, bias=False)      # W_g
        self.proj_in = nn.Linear(n_in * d, d, bias=False)   # W_in
        self.block = CausalAttnBlock(d, n_head, norm, attn)  # theta_L or theta_H, shared over steps
        self.proj_out = nn.Linear(d, d, bias=False)         # W_out
        # injection scale, learned (the paper); learn_alpha=False holds it at 0.1 (docs/MODEL.md section 8).
        # a scalar kept as a 1-element vector (FSDP2 shards no 0-d tensor), read 0-d as alpha[0] (no float32 promotion)
        alpha = torch.full((1,), 0.1)
        self.register_parameter("alpha", nn.Parameter(alpha)) if learn_alpha else self.register_buffer("alpha", alpha)

    def forward(self, z, context, rope, pos=0, cache=None, slot=0, attend=True):
        """z: the state this module updates; context: [z; other sources] along the last dim."""
        c = self.norm(torch.cat(context, dim=-1))   # Eq. concat; the RMSNorm over it: docs/MODEL.md section 2
        g = torch.sigmoid(self.gate(c))              # Eq. gate
        h = self.block(self.proj_in(c), rope, pos, cache, slot, attend)   # Eq. content
        return g * z + (1 - g) * self.alpha[0] * self.proj_out(h)         # Eq. lgate


class FastModule(GatedModule):
    """L_net: runs every step; context [z_L; z_H; x~] (Eq. concat)."""

    def __init__(self, d, n_head, norm="post", attn=True, learn_alpha=True):
        super().__init__(d, n_head, n_in=3, norm=norm, attn=attn, learn_alpha=learn_alpha)

    def forward(self, z_L, z_H, x_tilde, rope, pos=0, cache=None, slot=0, attend=True):
        return super().forward(z_L, (z_L, z_H, x_tilde), rope, pos, cache, slot, attend)


class SlowModule(GatedModule):
    """H_net: fires when i % T == 0; context [z_H; z_L] with the z_L just computed."""

    def __init__(self, d, n_head, norm="post", learn_alpha=True):
        super().__init__(d, n_head, n_in=2, norm=norm, learn_alpha=learn_alpha)

    def forward(self, z_H, z_L, rope, pos=0, cache=None, slot=0):
        return super().forward(z_H, (z_H, z_L), rope, pos, cache, slot)


# ---------------------------------------------------------------------------
# 5. Output fusion (section "Output Fusion")
#    w = softmax([h_H; h_L; h_I] W_og / tau);  h_out = w1 h_H + w2 h_L + w3 h_I

class OutputFusion(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm_H, self.norm_L, self.norm_I = RMSNorm(d), RMSNorm(d), RMSNorm(d)
        self.gate = nn.Linear(3 * d, 3, bias=False)       # W_og
        self.tau = nn.Parameter(torch.ones(1))            # learned temperature (read tau[0], as alpha)
        self.proj = nn.Linear(d, d, bias=False)           # before the tied logits (counted in P_out)

    def forward(self, z_H, z_L, x_tilde):
        h_H, h_L, h_I = self.norm_H(z_H), self.norm_L(z_L), self.norm_I(x_tilde)
        w = torch.softmax(self.gate(torch.cat([h_H, h_L, h_I], dim=-1)) / self.tau[0], dim=-1)  # (B, n, 3)
        out = w[..., 0:1] * h_H + w[..., 1:2] * h_L + w[..., 2:3] * h_I                      # h_out
        return self.proj(out), w


# ---------------------------------------------------------------------------
# 6. HRM (docs/MODEL.md section 2): input encoding, the states' init, Algorithm 2 (forward) with its
#    supervision passes, Algorithm 3 (one pass)

def fast_attn_schedule(M, k):
    """The Fast steps (of 1..M) that attend when fast_attn_steps = k (None: all M, the paper): k evenly spaced steps
    ending at step M, which every gradient window holds; k = N puts them on the Slow firings (docs/MODEL.md sec. 8)."""
    k = M if k is None else k
    return sorted({M - j * M // k for j in range(k)})


class HRM(LanguageModel):
    def __init__(self, config):
        super().__init__(config)
        d, n_head, norm = config.n_embd, config.n_head, config.norm
        self.input_block = CausalAttnBlock(d, n_head, norm)   # theta_I, applied once ("Input Encoding")
        self.L_net = FastModule(d, n_head, norm, config.fast_attn_steps != 0, config.learn_alpha)  # theta_L, every step
        # theta_H, every T steps (fast_only: none, z_H stays z_H0); the fusion's norms make norm_f unneeded
        self.H_net = None if config.fast_only else SlowModule(d, n_head, norm, config.learn_alpha)
        self.fusion = OutputFusion(d)
        # "State Initialization": fixed prototypes z^0 ~ TN(0, 1; [-2, 2]) in R^d, buffers: saved, never trained
        self.register_buffer("z_H0", torch.empty(d))
        self.register_buffer("z_L0", torch.empty(d))
        self._init_weights()
        self._init_weights(self.L_net.block, 0.02 / math.sqrt(config.M))
        if self.H_net is not None:
            self._init_weights(self.H_net.block, 0.02 / math.sqrt(config.M))
        nn.init.trunc_normal_(self.z_H0, mean=0.0, std=1.0, a=-2.0, b=2.0)
        nn.init.trunc_normal_(self.z_L0, mean=0.0, std=1.0, a=-2.0, b=2.0)
        self.set_depth(None)

    def set_depth(self, n=None):
        super().set_depth(n)
        self.attending = fast_attn_schedule(self.config.M, self.config.fast_attn_steps)   # Fast steps that attend

    def forward(self, idx, targets=None, cache=None, pos=0, last_only=False):
        """Algorithm 2. Returns (logits of the last pass, L_acc: the loss averaged over the S passes).
        idx holds positions pos..pos+n (pos > 0: decoding against a cache, engine.py)."""
        c = self.config
        x_tilde = self.input_block(self.wte(idx), self.rope, pos, cache, ("I",))   # "Input Encoding": once
        B, n, d = x_tilde.shape
        z_H = self.z_H0.to(x_tilde.dtype).expand(B, n, d)                    # z^(1,0) = expand(z^0)
        z_L = self.z_L0.to(x_tilde.dtype).expand(B, n, d)
        L_acc = None
        for s in range(c.S):                                                  # Loop 3: supervision passes
            z_H, z_L = self.one_pass(x_tilde, z_H, z_L, s, pos, cache)
            if targets is not None or s == c.S - 1:
                h_out, w = self.fusion(z_H, z_L, x_tilde)
                logits, ce = self.head(h_out, targets, last_only)             # logits = h_out W_emb^T
                if targets is not None:
                    w_bar = w.float().mean(dim=(0, 1))                         # w-bar: mean over batch and positions
                    # H(w-bar); 0 log 0 = 0: a weight of exactly 0 adds nothing (and no NaN to the gradient)
                    entropy = -(w_bar * torch.log(w_bar.clamp_min(torch.finfo(w_bar.dtype).tiny))).sum()
                    L_s = ce - c.ent_lambda * entropy                          # L_s = CE - lambda H(w-bar)
                    L_acc = L_s / c.S if L_acc is None else L_acc + L_s / c.S  # L_acc = (1/S) sum_s L_s
            z_H, z_L = z_H.detach(), z_L.detach()                             # Eq. detach: z^(s+1,0) = sg(z^(s,M))
        return logits, L_acc

    def one_pass(self, x_tilde, z_H, z_L, s=0, pos=0, cache=None):
        """Algorithm 3 (OnePass): M steps; steps 1..M-K without gradient (Loop 4a), the last K with (Loop 4b).
        Returns z_H, z_L, as the paper's does. K_slow = k (docs/MODEL.md section 8, the paper's "Hierarchical
        BPTT") also runs Slow firings j > N - k with gradient: a chain along z_H whose firings outside the Fast
        window read a detached z_L, so their gradient reaches theta_H, never theta_L; Fast steps before the
        window stay no_grad."""
        c = self.config
        grad = torch.is_grad_enabled()
        for i in range(1, c.M + 1):            # i counts from 1 in every pass
            in_window = grad and i > c.M - c.K
            with torch.set_grad_enabled(in_window):   # each block application's KV cache slot: ("L", s, i), ...
                z_L = self._step(self.L_net, z_L, z_H, x_tilde, self.rope, pos, cache, ("L", s, i), i in self.attending)
            if i % c.T == 0 and self.H_net is not None:  # the Slow module sees the z_L just computed
                j = i // c.T                             # firing j of N in this pass
                with torch.set_grad_enabled(in_window or (grad and j > c.N - c.K_slow)):
                    z_H = self._step(self.H_net, z_H, z_L, self.rope, pos, cache, ("H", s, j))
        return z_H, z_L


# ---------------------------------------------------------------------------
# 7. Baselines (docs/MODEL.md section 3): the Transformer (Eqs. tfm1-2) and UniTF (appendix "UniTF")

class Transformer(LanguageModel):
    """L independent post-norm blocks on the embedding, tied logits, no final norm (norm="pre": one)."""

    def __init__(self, config):
        super().__init__(config)
        self.blocks = nn.ModuleList(CausalAttnBlock(config.n_embd, config.n_head, config.norm)
                                    for _ in range(config.n_layer))
        self.norm_f = RMSNorm(config.n_embd) if config.norm == "pre" else None  # pre-norm leaves x unnormalised
        self._init_weights()

    def forward(self, idx, targets=None, cache=None, pos=0, last_only=False):
        x = self.wte(idx)
        for l, block in enumerate(self.blocks):
            x = block(x, self.rope, pos, cache, l)
        return self.head(x, targets, last_only)


class UniTF(LanguageModel):
    """Flat iteration: one block applied M times to the embedding, the same last-K window."""

    def __init__(self, config):
        super().__init__(config)
        c = config
        self.block = CausalAttnBlock(c.n_embd, c.n_head, c.norm)
        self.norm_f = RMSNorm(c.n_embd) if c.norm == "pre" else None  # pre-norm leaves x unnormalised
        self._init_weights()
        self._init_weights(self.block, 0.02 / math.sqrt(c.unitf_init_c * c.M * c.n_embd / 4096))

    def forward(self, idx, targets=None, cache=None, pos=0, last_only=False):
        c = self.config
        x = self.wte(idx)
        grad = torch.is_grad_enabled()
        for i in range(1, c.M + 1):
            with torch.set_grad_enabled(grad and i > c.M - c.K):
                x = self._step(self.block, x, self.rope, pos, cache, i - 1)
        return self.head(x, targets, last_only)


def build_model(config):
    """The model for config.arch, initialised as docs/MODEL.md section 4 says."""
    return {"hrm": HRM, "transformer": Transformer, "unitf": UniTF}[config.arch](config)
