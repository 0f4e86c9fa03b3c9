"""torch.compile with its real backend, inductor, on the CPU: train.py's compile=True (parallel.compile_model, each
block application unit compiled on its own) gives eager's numbers, compiles nothing new as random_depth changes the
depth every iteration, and resumes to the bit. tests/test_hazards.py and test_training.py count dynamo's graphs
with a counting backend (the graphs run eagerly); here inductor generates the C++ kernels that run, each test from
an empty inductor cache (TORCHINDUCTOR_CACHE_DIR in tmp_path), as on a new machine.

All slow (out of CI): a cold inductor compile costs about 4 s of CPU per graph (C++ built with g++), and even
the smallest (one UniTF block, its forward and backward) took 23 s of CPU here, past CI's 20 s. Run them with
python -m pytest -m slow tests/test_compile.py

Exactness, measured: float32 compiled and eager losses are equal to the bit or one float32 ulp apart, gradients
within 1e-6 of their norm; two fresh compiles (empty caches, other hash seeds, 1 or 2 threads) give the same
kernels and the same run to the bit, also the README's quick start over its 400 iterations (val 2.2664 both)."""

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from conftest import grads, last_state, raw_log, run_train
from hrmlm import parallel
from hrmlm.common import precision_context
from model import ModelConfig, build_model

TINY_HRM = dict(arch="hrm", vocab_size=64, block_size=32, n_embd=32, n_head=4, N=2, T=2, K=2)   # M = 4


def compiled_counts():
    """(graphs dynamo captured, graphs inductor compiled or read from its cache: forwards and backwards) since the
    last counters.clear()."""
    ind = counters["inductor"]
    return counters["stats"]["unique_graphs"], ind["fxgraph_cache_miss"] + ind["fxgraph_cache_hit"]


@pytest.fixture
def fresh_dynamo():
    """No graph of an earlier test: each compiles as a new process would (inductor's cache on disk may answer)."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.fixture
def inductor_cache(monkeypatch, tmp_path):
    """An empty inductor cache (TORCHINDUCTOR_CACHE_DIR, read at each use): what this test compiles, it compiles
    (a first run on a new machine); call it with a name for another empty one."""
    def use(name="inductor"):
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / name))
    use()
    return use


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


def flat(g):
    return torch.cat([t.flatten() for t in g.values()])


@pytest.mark.slow   # a cold compile of 14 graphs (22 with their backwards): 84 s of CPU, 2 to 7 minutes on 2 busy cores
@pytest.mark.timeout(900)
def test_inductor_matches_eager_in_float32_and_bf16(fresh_dynamo, inductor_cache):
    """One forward and backward of a tiny HRM (M = 4, K = 2: steps with and without gradient, both modules) compiled
    by train.py's call, against the same weights eager. float32: the loss within 1e-6 (measured: equal to the bit)
    and every parameter's gradient within 1e-5 of eager's, relative to its norm (measured: 7.5e-7 at most; 1e-3 on
    one weight matrix fails it). bfloat16 autocast, within bf16 noise: bf16 rounds to 8 bits (2^-9 relative per
    rounding), and eager itself lands 0.2% to 3.4% (alpha and tau, sums that cancel) from float32 per gradient, so
    compiled bf16 must be within 5% of both eager bf16 and float32 per gradient, the whole gradient no farther
    from float32 than 1.5x eager bf16's distance, and the loss within 1e-4 of both (measured: 7e-6 and 1e-6;
    eager bf16 is 8e-6 from float32). Inductor keeps a fused kernel's intermediates in float32 where eager rounds
    each op's output to bf16: compiled bf16 is not eager bf16's bits, it is as close to float32."""
    torch.manual_seed(0)
    eager = build_model(ModelConfig(**TINY_HRM))
    fast = build_model(ModelConfig(**TINY_HRM))
    fast.load_state_dict(eager.state_dict())
    assert parallel.compile_model(fast) is fast   # backend="inductor", in place
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, 64, (2, 32), generator=g) for _ in range(2))
    out = {}
    for dtype in ("float32", "bfloat16"):
        for name, m in (("eager", eager), ("compiled", fast)):
            with precision_context("cpu", dtype):
                loss = m(x, y)[1]
            out[dtype, name] = loss.item(), grads(m, loss)
    graphs, kernels = compiled_counts()
    assert graphs > 0 and counters["inductor"]["fxgraph_cache_miss"] > 0 and kernels > graphs, dict(counters)
    assert not counters["graph_break"] and counters["frames"]["ok"] == counters["frames"]["total"] == graphs

    (l32, g32), (c32, gc32) = out["float32", "eager"], out["float32", "compiled"]
    assert abs(c32 - l32) <= 1e-6, (c32, l32)
    assert g32.keys() == gc32.keys() and len(g32) == len(list(eager.parameters()))
    far = {n: rel_err(gc32[n], g32[n]) for n in g32 if rel_err(gc32[n], g32[n]) > 1e-5}
    assert not far, far

    (lb, gb), (cb, gcb) = out["bfloat16", "eager"], out["bfloat16", "compiled"]
    assert abs(cb - lb) <= 1e-4 and abs(cb - l32) <= 1e-4, (cb, lb, l32)
    far = {n: (rel_err(gcb[n], gb[n]), rel_err(gcb[n], g32[n])) for n in g32
           if max(rel_err(gcb[n], gb[n]), rel_err(gcb[n], g32[n])) > 0.05}
    assert not far, far
    assert rel_err(flat(gcb), flat(g32)) <= 1.5 * rel_err(flat(gb), flat(g32))


@pytest.mark.slow   # a cold compile per arch: 20 to 50 s on 2 busy cores
@pytest.mark.timeout(900)
@pytest.mark.parametrize("arch,kw", [("unitf", dict(M=5, K=1)), ("hrm", dict(N=5, T=2, K=2))])
def test_inductor_covers_every_random_depth(arch, kw, fresh_dynamo, inductor_cache):
    """tests/test_hazards.py's test_compile_covers_every_random_depth with inductor in place of its counting
    backend: random_depth at D = 5 runs 9 depths; the first three make every graph (dynamo's and inductor's, the
    backwards included), the other six and a return to depth 3 none; the loss, and the logits without gradient,
    are eager's within 1e-6 at every depth; no graph break, no frame left eager."""
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, vocab_size=16, block_size=8, n_embd=16, n_head=2, **kw)
    eager, fast = build_model(cfg), build_model(cfg)
    fast.load_state_dict(eager.state_dict())
    parallel.compile_model(fast)
    x = torch.randint(0, 16, (2, 8))
    made = []
    for depth in list(range(1, 10)) + [3]:
        for m in (fast, eager):
            m.set_depth(depth)
        _, loss = fast(x, x)
        _, ref = eager(x, x)
        assert abs(loss.item() - ref.item()) <= 1e-6, (depth, loss, ref)
        loss.backward()
        with torch.no_grad():
            assert (fast(x)[0] - eager(x)[0]).abs().max() <= 1e-6, depth
        made.append(compiled_counts())
    assert made[3:] == [made[2]] * 7 and made[2][1] > made[2][0] > 0, made
    assert counters["inductor"]["fxgraph_cache_miss"] > 0, dict(counters["inductor"])
    assert not counters["graph_break"] and counters["frames"]["ok"] == counters["frames"]["total"] == made[-1][0]


# --- train.py compiled: a run at random depths, and its resume ------------------------------------------------

# the character data, M = 4 (HRM) or M = 2 (UniTF) so that random_depth's D = 2: N' (M') in 1..3; batch 2 x 32
ARGS = {"hrm": ["--arch=hrm", "--N=2", "--T=2", "--K=2"], "unitf": ["--arch=unitf", "--M=2", "--K=1"]}
COMMON = ["--dataset=shakespeare_char", "--batch_size=2", "--eval_interval=6", "--lr_decay_iters=12"]
DEPTHS = [3, 3, 3, 3, 2, 2, 2, 3, 2, 2, 1, 2]   # seed 1337's draws at D = 2 for iterations 0..11


class Probe:
    """train.py run in this process (conftest.run_train), watched: each training iteration's loss (the float the
    model returned) and depth, and the graphs dynamo captured and inductor compiled (or read from its cache) in each
    training iteration and each evaluation (labelled by the iteration it precedes)."""

    def __init__(self, monkeypatch):
        from hrmlm import common
        import model as model_py
        real_batch = common.get_batch

        def get_batch(data, split, seed, stream, i, *rest):
            self.switch(("train", i) if stream == 0 else ("eval", self.next))
            self.next = i + 1 if stream == 0 else self.next
            return real_batch(data, split, seed, stream, i, *rest)
        monkeypatch.setattr(common, "get_batch", get_batch)   # train.py imports it from hrmlm.common as it starts
        for cls in (model_py.HRM, model_py.UniTF):   # outside the compiled units: nothing traced changes
            def forward(m, idx, targets=None, *a, _real=cls.forward, **kw):
                out = _real(m, idx, targets, *a, **kw)
                if targets is not None and torch.is_grad_enabled() and not idx.is_meta:   # not train.py's
                    i = self.label[1]                                                     # FLOP count
                    self.losses[i] = out[1].item()
                    self.depths[i] = m.config.N if m.config.arch == "hrm" else m.config.M
                return out
            monkeypatch.setattr(cls, "forward", forward)

    def switch(self, label):
        if label != self.label:
            if self.label is not None:   # what was made since self.start goes to self.label
                made = self.made.get(self.label, (0, 0))
                self.made[self.label] = tuple(m + now - s for m, now, s in zip(made, compiled_counts(), self.start))
            self.label, self.start = label, compiled_counts()

    def run(self, args, data, out):
        """train.py compiled from scratch, as a new process compiles: dynamo's graphs reset (inductor's cache on
        disk answers what it holds). Returns (its CompletedProcess, {losses, depths, made})."""
        torch._dynamo.reset()
        counters.clear()
        self.losses, self.depths, self.made, self.label, self.next = {}, {}, {}, None, 0
        p = run_train(args, data, out)
        self.switch(None)
        return p, dict(losses=self.losses, depths=self.depths, made=self.made, frames=dict(counters["frames"]),
                       breaks=sum(counters["graph_break"].values()), inductor=dict(counters["inductor"]))


@pytest.fixture
def probe(monkeypatch, fresh_dynamo):
    return Probe(monkeypatch)


@pytest.mark.slow   # a cold compile inside train.py: HRM 1 to 4 minutes on 2 busy cores, UniTF 7 to 30 s
@pytest.mark.timeout(900)
@pytest.mark.parametrize("arch", ARGS)
def test_random_depth_compiles_each_variant_once_and_matches_eager(arch, probe, inductor_cache, char_data, tmp_path):
    """12 iterations at random depth (N' or M' drawn in 1..3 each iteration), compiled from an empty cache: graphs
    are made in the first evaluation (no gradient), the first iteration (the window with gradient: forwards and
    backwards) and the first iteration at depth 1 (whose first step, from the expanded z^0 or the embedding, is the
    only one in the gradient window), none in the 9 other iterations nor in the evaluations at 6 and 12; no graph
    break, no frame left eager. Every iteration's loss is eager's within 1e-6 (float32; measured: equal to the bit
    but for one float32 ulp, 2.4e-7, at HRM's iteration 11)."""
    args = ARGS[arch] + COMMON + ["--random_depth=True", "--max_iters=12"]
    _, run = probe.run(args + ["--compile=True"], char_data, str(tmp_path / "compiled"))
    assert [run["depths"][i] for i in range(12)] == DEPTHS
    made = {label: n for label, n in run["made"].items() if any(n)}
    first_at_1 = DEPTHS.index(1)   # iteration 10
    assert set(made) == {("eval", 0), ("train", 0), ("train", first_at_1)}, run["made"]
    graphs, compiled = made[("train", 0)]
    assert 0 < graphs < compiled, made   # inductor compiled forwards and their backwards
    assert run["inductor"]["fxgraph_cache_miss"] > 0, run["inductor"]   # compiled here, not read from a cache
    assert run["breaks"] == 0 and run["frames"]["ok"] == run["frames"]["total"] == sum(n[0] for n in made.values())
    _, eager = probe.run(args + ["--compile=False"], char_data, str(tmp_path / "eager"))
    assert eager["depths"] == run["depths"] and not any(any(n) for n in eager["made"].values())
    diffs = [abs(run["losses"][i] - eager["losses"][i]) for i in range(12)]
    assert max(diffs) <= 1e-6, diffs


def tensors(obj, path=""):
    """{path: tensor} for every tensor in a (nested) checkpoint: the weights and AdamW's state."""
    if isinstance(obj, torch.Tensor):
        return {path: obj}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    return {k: v for key, sub in items for k, v in tensors(sub, f"{path}/{key}").items()}


@pytest.mark.slow   # three compiled train.py runs, two of them cold compiles: 1 to 4 minutes on 2 busy cores
@pytest.mark.timeout(1200)
def test_compiled_resume_is_exact_even_compiled_afresh(probe, inductor_cache, char_data, tmp_path):
    """A compiled random-depth HRM run stopped at iteration 6 and resumed (--init_from=resume) is the uninterrupted
    compiled run to the bit: every iteration's loss, every logged number, every weight and AdamW moment at 12. The
    resumed part compiles anew from an empty inductor cache (as on a new machine, or after the cache was cleared):
    inductor's CPU code generation gives the same kernels each time (here in one process; in separate processes
    with other hash seeds too, the module docstring's measurements)."""
    args = ARGS["hrm"] + COMMON + ["--random_depth=True", "--compile=True"]
    a, b = str(tmp_path / "whole"), str(tmp_path / "stopped")
    _, whole = probe.run(args + ["--max_iters=12"], char_data, a)
    _, first = probe.run(args + ["--max_iters=6"], char_data, b)
    inductor_cache("another")   # empty
    _, rest = probe.run(args + ["--max_iters=12", "--init_from=resume"], char_data, b)
    assert rest["inductor"]["fxgraph_cache_miss"] > 0, rest["inductor"]   # compiled anew
    assert sorted(first["losses"]) == list(range(6)) and sorted(rest["losses"]) == list(range(6, 12))
    assert whole["losses"] == first["losses"] | rest["losses"]
    rows = lambda out: [{k: v for k, v in r.items() if k != "time_s"} for r in raw_log(out)]  # noqa: E731
    assert [r["iter"] for r in rows(a)] == [0, 6, 12] and rows(a) == rows(b)
    ta, tb = tensors(last_state(a)), tensors(last_state(b))
    assert ta.keys() == tb.keys() and any(k.startswith("/optimizer/state/") for k in ta)
    assert not [k for k in ta if not torch.equal(ta[k], tb[k])]
