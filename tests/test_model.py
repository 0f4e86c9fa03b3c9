"""model.py against docs/MODEL.md: the paper's sizes to the parameter, state_dict keys, initialisation,
RoPE, causality, config errors, the options beyond the paper (norm, fast_only, fast_attn_steps) and the
golden fingerprints of the post-norm model."""

import math
import os

import pytest
import torch

from hrmlm import engine
from conftest import PAPER_SIZES, V, make, tiny
from model import ModelConfig, apply_rope, build_model, rope_table

# --- docs/MODEL.md section 3: the paper's sizes, to the parameter --------------------------------------



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
                "L_net.proj_out.weight": (d, d), "L_net.alpha": (1,),
                "H_net.norm.weight": (2 * d,), "H_net.gate.weight": (d, 2 * d), "H_net.proj_in.weight": (d, 2 * d),
                "H_net.proj_out.weight": (d, d), "H_net.alpha": (1,),
                "fusion.norm_H.weight": (d,), "fusion.norm_L.weight": (d,), "fusion.norm_I.weight": (d,),
                "fusion.gate.weight": (3, 3 * d), "fusion.tau": (1,), "fusion.proj.weight": (d, d)}
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
    (dict(arch="hrm", out_proj=True), "out_proj"), (dict(arch="transformer", out_proj=1), "out_proj"),
])
def test_invalid_config_names_field(kw, field):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        ModelConfig(**{**dict(n_embd=32, n_head=4), **kw})


# --- RoPE (docs/MODEL.md section 1: rotate-half, base 10000) -------------------------------------------------

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


# --- initialisation (docs/MODEL.md section 4) -------------------------------------------------------------

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


# --- 0 log 0 = 0 in the fusion-entropy term -------------------------------------------------------

def test_fusion_entropy_with_a_zero_weight_is_finite():
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="hrm", vocab_size=64, n_embd=32, n_head=4, N=1, T=2, K=1, block_size=16))

    def zero_first_weight(module, inputs, output):
        out, w = output
        w = torch.cat([w[..., :1] * 0, w[..., 1:] / w[..., 1:].sum(-1, keepdim=True)], dim=-1)
        return out, w
    model.fusion.register_forward_hook(zero_first_weight)
    x = torch.randint(0, 64, (2, 16))
    _, loss = model(x, x)
    assert torch.isfinite(loss), loss
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# --- norm="post" is the paper's model, bit for bit; norm="pre" is another computation ---------------

# (loss, sum of logits, sum of |grad| over every parameter) of the model before `norm` existed
# (commit b4d4aae), for seed 0 and the batch below. Any change to the post-norm path moves them.
GOLDEN = {"hrm": (3.9007978439331055, -0.543360473327084, 4.94459675832915),
          "transformer": (3.9204471111297607, 20.053005531968665, 39.5382723432774),
          "unitf": (3.9295148849487305, 17.040584222207144, 37.36723568918376)}
GOLDEN_CFG = {"hrm": dict(N=2, T=2, K=2, S=2), "transformer": dict(n_layer=2), "unitf": dict(M=3, K=2)}


def fingerprint(arch, **kw):
    torch.manual_seed(0)
    m = build_model(ModelConfig(arch=arch, vocab_size=50, block_size=16, n_embd=32, n_head=4,
                                **GOLDEN_CFG[arch], **kw))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 50, (2, 16), generator=g), torch.randint(0, 50, (2, 16), generator=g)
    logits, loss = m(x, y)
    loss.backward()
    return (loss.item(), logits.double().sum().item(),
            sum(p.grad.double().abs().sum().item() for _, p in sorted(m.named_parameters())))


@pytest.mark.parametrize("arch", ["hrm", "transformer", "unitf"])
def test_post_norm_is_the_paper_model_unchanged(arch):
    got = fingerprint(arch, norm="post")
    assert got == pytest.approx(GOLDEN[arch], rel=1e-6, abs=1e-9)
    pre = fingerprint(arch, norm="pre")
    assert abs(pre[0] - got[0]) > 1e-4  # and pre-norm is a different computation


def test_pre_norm_keys_and_sizes():
    for arch, kw in GOLDEN_CFG.items():
        post = build_model(tiny(arch, **kw))
        pre = build_model(tiny(arch, norm="pre", **kw))
        extra = set(pre.state_dict()) - set(post.state_dict())
        assert extra == (set() if arch == "hrm" else {"norm_f.weight"})  # HRM's fusion already normalises
        assert pre.num_params() - post.num_params() == (0 if arch == "hrm" else 32)


def test_pre_norm_block_formula():
    """x + attn(norm1(x)), then x + mlp(norm2(x)), with the same parameters as the post-norm block."""
    from model import CausalAttnBlock, rope_table
    torch.manual_seed(0)
    blk = CausalAttnBlock(32, 4, "pre")
    for p in blk.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(2, 8, 32)
    rope = rope_table(8, 8)
    h = x + blk.attn(blk.norm1(x), rope)
    want = h + blk.mlp(blk.norm2(h))
    torch.testing.assert_close(blk(x, rope), want, rtol=0, atol=0)
    post = blk.norm1(x + blk.attn(x, rope))
    blk.pre = False
    torch.testing.assert_close(blk(x, rope), blk.norm2(post + blk.mlp(post)), rtol=0, atol=0)


# --- fast_attn_steps (docs/MODEL.md section 8): which Fast steps attend --------------------------------------

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
    """A block applied with attend=False equals the same block whose attention adds a = 0 (W_o = 0)."""
    from model import CausalAttnBlock
    torch.manual_seed(0)
    b = CausalAttnBlock(32, 4, norm)
    x = torch.randn(2, 7, 32)
    rope = rope_table(16, 8)
    got = b(x, rope, attend=False)
    with torch.no_grad():
        b.attn.proj.weight.zero_()
    torch.testing.assert_close(got, b(x, rope), rtol=0, atol=1e-6)
    # position-wise: a shorter input gives the same rows (up to BLAS blocking, which varies with shape)
    torch.testing.assert_close(got[:, :3], b(x[:, :3], rope, attend=False), rtol=0, atol=1e-6)


def test_fast_attn_steps_M_is_the_paper(batch):
    idx, tgt = batch
    a, la = make(tiny("hrm", N=2, T=2), scale=3.0)(idx, tgt)
    b, lb = make(tiny("hrm", N=2, T=2, fast_attn_steps=4), scale=3.0)(idx, tgt)
    assert torch.equal(a, b) and torch.equal(la, lb)
    c, _ = make(tiny("hrm", N=2, T=2, fast_attn_steps=2), scale=3.0)(idx, tgt)
    assert (a - c).abs().max() > 1e-5  # skipping attention in steps 1, 3 changes the output



# --- random_depth (docs/MODEL.md section 8): set_depth runs the same weights at another depth --------------

@pytest.mark.parametrize("arch,kw,n,field", [("unitf", dict(M=4), 7, "M"), ("hrm", dict(N=2, T=2), 3, "N"),
                                             ("hrm", dict(N=2, T=2), 1, "N")])
def test_set_depth_is_the_model_built_at_that_depth(arch, kw, n, field):
    """set_depth(n) computes what a model built with N or M = n and the same weights computes; None restores."""
    m = make(tiny(arch, **kw), scale=3.0).eval()
    other = build_model(tiny(arch, **{**kw, field: n})).eval()
    other.load_state_dict(m.state_dict())
    idx = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        trained = m(idx)[0]
        m.set_depth(n)
        deeper, want = m(idx)[0], other(idx)[0]
        m.set_depth(None)
        again = m(idx)[0]
    assert torch.equal(deeper, want)
    assert (deeper - trained).abs().max() > 1e-3      # the depth changed what it computes
    assert torch.equal(again, trained) and m.config is m.trained_config


def test_set_depth_keeps_the_cache_slots_consistent():
    """An HRM at a drawn depth decodes with the cache as the model built at that depth does."""
    m = make(tiny("hrm", N=2, T=2), scale=3.0).eval()
    m.set_depth(3)
    other = build_model(tiny("hrm", N=3, T=2)).eval()
    other.load_state_dict(m.state_dict())
    idx = torch.randint(0, V, (1, 5), generator=torch.Generator().manual_seed(1))
    assert torch.equal(engine.generate(m, idx, 6, top_k=1), engine.generate(other, idx, 6, top_k=1))


def test_transformer_has_no_depth_to_set():
    with pytest.raises(ValueError, match="only hrm/unitf recur"):
        make(tiny("transformer", n_layer=2)).set_depth(3)


STANDALONE = """
import dataclasses, sys, torch
import model
ours = [m.__name__ for m in list(sys.modules.values()) if m.__name__ != "model" and
        (getattr(m, "__file__", None) or "").startswith(sys.argv[1])]
assert not ours, ours   # nothing of the project is imported beside model.py
for arch in ("hrm", "transformer", "unitf"):
    c = model.ModelConfig(arch=arch, vocab_size=50, block_size=16, n_embd=16, n_head=2)
    torch.manual_seed(0)
    m = model.build_model(c)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    idx = torch.randint(0, 50, (2, 16))
    _, loss = m(idx, idx)
    loss.backward()
    opt.step()
    after = m(idx, idx)[1].item()
    assert after < loss.item(), (arch, loss.item(), after)
    print(arch, f"{loss.item():.4f} -> {after:.4f}")
"""


def test_model_py_copied_alone_builds_and_trains_every_arch(tmp_path):
    """model.py alone in an empty folder (a fresh interpreter whose only project file it is) builds each
    architecture and takes a training step that lowers the loss on its batch."""
    import shutil
    import subprocess
    import sys
    from conftest import ROOT
    shutil.copy(os.path.join(ROOT, "model.py"), tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([sys.executable, "-c", STANDALONE, str(tmp_path)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert [line.split()[0] for line in p.stdout.splitlines()] == ["hrm", "transformer", "unitf"], p.stdout
    with open(os.path.join(ROOT, "model.py")) as f:
        imports = {line.split()[1].split(".")[0] for line in f if line.startswith(("import ", "from "))}
    assert imports <= {"math", "dataclasses", "typing", "torch"}, imports


@pytest.mark.parametrize("arch,change", [("hrm", {"n_embd": 32, "n_head": 4}), ("hrm", {"N": 3, "M": None}),
                                         ("transformer", {"n_layer": 3}), ("unitf", {"M": 6}),
                                         ("unitf", {"n_embd": 32, "n_head": 4})])
def test_model_config_round_trips_through_replace(arch, change):
    import dataclasses
    c = ModelConfig(arch=arch, vocab_size=50, block_size=16, n_embd=16, n_head=2)
    assert dataclasses.replace(c) == c
    d = dataclasses.replace(c, **change)
    assert all(getattr(d, k) == v for k, v in change.items() if v is not None)
    assert d.M == {"hrm": d.N * d.T, "transformer": None, "unitf": change.get("M", 12)}[arch]
    assert dataclasses.replace(d, **{k: getattr(c, k) for k in change}) == c   # and back
