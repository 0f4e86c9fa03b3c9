"""bench.py, and the paper's complexity claim 'train activations O(K A)' measured."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from bench import model_config
from hrmlm.common import counted_train_flops, train_flops
from conftest import ROOT, measured_iter_mb, one_error_line, run_script


def run_bench(models, tmp_path, *extra, timeout=600):
    """python bench.py --preset=tiny --models=<models> <extra>: its JSON rows and the finished process."""
    out = tmp_path / "b.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench.py"), "--preset=tiny", f"--models={models}",
                        f"--json={out}", *extra], capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    assert p.returncode == 0, p.stderr
    return json.loads(out.read_text()), p


def iter_mem(N, T, K, **options):
    """A training iteration's peak memory (MB) of HRM at the tiny preset with these N, T, K and options."""
    return measured_iter_mb("hrm_nt4", "tiny", N=N, T=T, K=K, vocab_size=256, **options)


def test_train_memory_is_O_K_not_O_M():
    """At K = 2 the peak memory of a training iteration is flat from M = 4 to M = 48: no activation
    of the no-grad steps outlives its step. Full backprop at M = 48 shows the test can see growth."""
    m4, m48 = iter_mem(2, 2, 2), iter_mem(24, 2, 2)
    assert m48 < 1.10 * m4, (m4, m48)
    full = iter_mem(24, 2, 48)
    assert full > 4 * m4, (m4, full)


@pytest.mark.slow   # CI time (11 s): CI checks grad_ckpt's gradients and recomputation (test_equations.py), not memory
def test_full_backprop_at_flat_memory_with_grad_ckpt():
    """grad_ckpt (docs/MODEL.md section 8): full backprop through M = 48 steps keeps only the states between steps,
    so a training iteration's peak stays within 1.3x of the paper's K = 2 (measured: 0.9x; plain K = 48: 17x)."""
    k2, ckpt = iter_mem(24, 2, 2), iter_mem(24, 2, 48, grad_ckpt=True)
    assert ckpt < 1.3 * k2, (k2, ckpt)
    assert iter_mem(24, 2, 48) > 4 * k2   # the same run without checkpoints: the test sees the growth


# slow: minutes on 2 cores. CI measures the K window's memory above (grad_ckpt's only in slow runs); only this one
# measures K_slow's (its gradient routing is checked in CI: test_equations.py's K_slow tests)
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_K_slow_memory_grows_with_firings_not_M():
    """K_slow = 24 firings keeps 24 Slow-firing activations (plus the K Fast steps); with grad_ckpt only states."""
    k2, ks = iter_mem(24, 2, 2), iter_mem(24, 2, 2, K_slow=24)
    assert 2 * k2 < ks < iter_mem(24, 2, 48) / 2, (k2, ks)
    assert iter_mem(24, 2, 2, K_slow=24, grad_ckpt=True) < 1.3 * k2


def test_flop_model_options():
    """Full backprop: S (M + 2M) C; + M C with grad_ckpt; K_slow adds 2 C per firing beyond the window's."""
    C = 1 * 1024 * (32 * 4096 ** 2 + 4 * 1024 * 4096)
    assert train_flops(model_config("hrm_nt12_full", "paper"), 1, 1024) == (12 + 24) * C
    assert train_flops(model_config("hrm_nt12_gradckpt_full", "paper"), 1, 1024) == (12 + 36) * C
    assert train_flops(model_config("hrm_nt12_kslow4", "paper"), 1, 1024) == (12 + 4 + 2 * 3) * C  # firing 4 is in K
    pw = 1024 * 24 * 4096 ** 2   # a Fast step without attention; the 4 attending ones are 3, 6, 9, 12
    assert train_flops(model_config("hrm_nt12_hybrid4", "paper"), 1, 1024) == 4 * C + 8 * pw + 2 * (C + pw)


# slow: minutes on 2 cores. CI checks these options' KV cache on the model (test_decoding.py's
# test_kv_cache_size) and their FLOP model (test_flop_model_options); only this one runs bench.py's rows for them
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_beyond_rows(tmp_path):
    """Two rows of --models=beyond at the tiny preset: KV cache of the attending applications only."""
    (hybrid, ckpt), _ = run_bench("hrm_nt12_hybrid4,hrm_nt12_gradckpt_full", tmp_path)
    assert hybrid["kv_cache_mb"] == pytest.approx(2 * (1 + 4 + 4) * 192 * 64 * 4 / 2**20)   # 1 + S (k + N)
    assert ckpt["kv_cache_mb"] == pytest.approx(2 * 17 * 192 * 64 * 4 / 2**20)
    for r in (hybrid, ckpt):
        assert r["gen_tok_s_cached"] > 0 and r["train_ms_iter"] > 0 and r["train_peak_mem_mb"] > 0


def test_flop_model():
    hrm = model_config("hrm_nt12", "paper")
    tf = model_config("tf_l4", "paper")
    C = 1 * 1024 * (32 * 4096 ** 2 + 4 * 1024 * 4096)
    assert train_flops(hrm, 1, 1024) == (12 + 2 * 2) * C   # S (M + 2K) C
    assert train_flops(tf, 1, 1024) == 3 * 4 * C           # 3 L C
    # the labelled paper-model column: for the Transformer it is the counted FLOPs without the tied head
    head = 3 * 2 * 1024 * 4096 * tf.vocab_size
    assert counted_train_flops(tf, 1, 1024) - head == pytest.approx(train_flops(tf, 1, 1024), rel=1e-3)


@pytest.mark.parametrize("L", [2, 4])
def test_counted_flops_transformer_is_6N_plus_12Lnd(L):
    """torch's FLOP counter on the real Transformer at the paper's size agrees with nanoGPT's 6 N + 12 L n d
    per token (N counts the tied embedding once: its FLOPs are the output layer's) within 5%."""
    import torch
    from model import build_model
    cfg = model_config(f"tf_l{L}", "paper")
    with torch.device("meta"):
        N = build_model(cfg).num_params()
    B, n = 2, 1024
    expected = B * n * (6 * N + 12 * L * n * cfg.n_embd)
    assert abs(counted_train_flops(cfg, B, n) / expected - 1) < 0.05


def test_counted_flops_see_what_the_paper_model_leaves_out():
    """HRM NT=12: the counter sees the gates, the Slow module and the no-grad steps' extras, so it counts
    more than S (M + 2K) C (measured: 36.0 C against 16 C); the window shows too: K = 4 adds the backward of
    2 Fast steps (each 1.44 C forward with its gate and projections) and of the Slow firing at step 9."""
    hrm = model_config("hrm_nt12", "paper")
    k2 = counted_train_flops(hrm, 1, 1024)
    assert k2 > 2 * train_flops(hrm, 1, 1024)
    k4 = counted_train_flops(model_config("hrm_nt12", "paper", K=4), 1, 1024)
    C = 1 * 1024 * (32 * 4096 ** 2 + 4 * 1024 * 4096)
    assert 7 * C < k4 - k2 < 9.5 * C        # measured 8.3 C: 2 x 2 x 1.44 C (Fast) + 2 x 1.3 C (Slow)


# slow: a minute on 2 cores. CI runs the worker's train phase (the memory tests) and the FLOP models above;
# only this one runs bench.py whole: every column of a row, the decode floor, the printed table
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_tiny_end_to_end(tmp_path):
    rows, p = run_bench("hrm_nt12,tf_l4,unitf_m12", tmp_path)
    assert [r["model"] for r in rows] == ["hrm_nt12", "tf_l4", "unitf_m12"]
    for r in rows:
        for key in ("params", "latency_ms", "peak_mem_mb", "gen_tok_s_recompute", "gen_tok_s_cached",
                    "kv_cache_mb", "train_ms_iter", "train_peak_mem_mb", "mfu"):
            assert r[key] > 0, (key, r)
        assert r["kv_cache_mb"] == pytest.approx(r["kv_cache_formula_mb"])
        assert r["decode_matvec_ms"] > 0 and r["gen_speedup_bound"] > 0 and r["compiled"] is False
        # the tiny preset's one round of floor and generations: the medians are that round's
        (one,) = r["rounds"]
        assert one["gen_speedup_bound"] == pytest.approx(r["gen_speedup_bound"])
        assert one["gen_speedup"] == pytest.approx(r["gen_speedup"]) and one["floor_ms"] == r["decode_matvec_ms"]
    assert re.search(r"\| hrm_nt12 \|.* [\d.]+x \([\d.]+-[\d.]+\) \| [\d.]+x \([\d.]+-[\d.]+\) \| \d+% \|", p.stdout)
    hrm = rows[0]
    # the floor reads each weight once per block application: HRM NT=12 at d=64 reads L_net's 12 times
    d, V = 64, 50257 * 64 // 4096
    block, fast, slow = 16 * d * d, 16 * d * d + 2 * 3 * d * d + d * d, 16 * d * d + 2 * 2 * d * d + d * d
    fusion = 3 * d * 3 + d * d
    assert hrm["decode_weight_mb"] == pytest.approx((block + 12 * fast + 4 * slow + fusion + V * d) * 4 / 2**20)
    # 17 block applications (1 + M + N) for HRM NT=12 vs 4 for T-L4: 2 * 17 * 192 * 64 * 4 bytes
    assert hrm["kv_cache_mb"] == pytest.approx(2 * 17 * 192 * 64 * 4 / 2**20)
    assert "| hrm_nt12 |" in p.stdout and "equal docs/MODEL.md section 5's formula" in p.stdout


def test_unknown_model_is_one_line():
    line = one_error_line(run_script("bench.py", "--models=gpt5"), prog="bench.py")
    assert "unknown model(s) ['gpt5']" in line and "hrm_nt12" in line


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bench_compile(tmp_path):
    """--compile (about 90 s on 2 cores): the compiled forward gives the same kind of row."""
    (r,), p = run_bench("hrm_nt4", tmp_path, "--compile", timeout=900)
    assert r["compiled"] is True and r["gen_tok_s_cached"] > 0 and r["latency_ms"] > 0
    assert "forward compiled" in p.stdout


def test_bench_cache_policy():
    """--kv=fired: HRM NT=12's cached generation runs on N + 2 = 6 slots (the measured cache equals the formula);
    a Transformer keeps its exact cache, and says so."""
    from bench import worker
    hrm = worker("infer", {"model": "hrm_nt12", "preset": "tiny", "device": "cpu", "kv": "fired"})
    assert hrm["kv"] == "fired" and hrm["gen_tok_s_cached"] > 0
    assert hrm["kv_cache_mb"] == hrm["kv_cache_formula_mb"] == pytest.approx(2 * 6 * 192 * 64 * 4 / 2**20)
    assert worker("infer", {"model": "tf_l4", "preset": "tiny", "device": "cpu", "kv": "fired"})["kv"] == "full"


def test_bench_profile_static_cache_makes_the_same_products():
    """--profile --static_cache: the one-token step against the fixed-shape cache (eager here; compiled, one graph:
    tests/test_decoding.py) makes the matrix products it makes against the growing cache (the test below)."""
    from bench import worker
    s = worker("profile", {"model": "hrm_nt4", "preset": "tiny", "device": "cpu", "kv": "full", "static": True})
    assert s["cache"] == "StaticKVCache" and s["steps"] == 120 and s["step_ms"] > 0
    assert s["mm_calls"] == 7 * 5 + 6 * 3 + 2 + 1


def test_bench_profile_breaks_a_cached_token_down():
    """--profile: a cached token against the floor, timed alternately, and torch.profiler's ops per token; the
    matrix products are the model's: HRM NT=4 makes 5 per block application and 2 per gated update (7
    applications: input block, 4 Fast steps, 2 Slow firings) plus the fusion's 2 and the tied head."""
    from bench import show_profile, worker
    r = worker("profile", {"model": "hrm_nt4", "preset": "tiny", "device": "cpu", "kv": "last"})
    assert r["steps"] == 120 and r["step_ms"] > 0 and r["floor_ms"] > 0
    assert 0 < r["mm_ms"] < r["profiled_ms"]
    assert r["mm_calls"] == 7 * 5 + 6 * 3 + 2 + 1
    show_profile("hrm_nt4", r)   # prints without error


def test_bench_profile_on_a_gpu_counts_each_kernel_once():
    """On a GPU, torch.profiler gives an op's row the device time of the kernels it launched, and each kernel a row
    of its own; inside a CUDA graph the kernels have no op at all. --profile sums the kernels alone and finds the
    matrix products by cuBLAS's kernel names (an H200's profile counted every kernel twice before)."""
    from types import SimpleNamespace as E
    from torch.autograd import DeviceType
    from bench import profile_rows
    cpu, gpu = DeviceType.CPU, DeviceType.CUDA
    ev = [E(key="aten::mm", device_type=cpu), E(key="## Call CompiledFxGraph abc", device_type=cpu),
          E(key="nvjet_sm90_tst_128x8_64x12_2x1_v_bz_TNT", device_type=gpu),
          E(key="void gemv2T_kernel_val<int, int, __nv_bfloat16>", device_type=gpu),
          E(key="void cublasLt::splitKreduce_kernel<32, 16, int, float>", device_type=gpu),
          E(key="fmha_cutlassF_bf16_aligned_64x64_rf_sm80(AttentionKernel<cutlass::gemm::GemmShape<64>>)",
            device_type=gpu),
          E(key="## Call CompiledFxGraph abc", device_type=gpu, is_user_annotation=True),
          E(key="triton_poi_fused_add_mul_0", device_type=gpu)]
    rows, mms = profile_rows(ev, gpu=True)
    assert [e.key[:6] for e in rows] == ["nvjet_", "void g", "void c", "fmha_c", "triton"]
    assert [e.key[:6] for e in mms] == ["nvjet_", "void g", "void c"]
    rows, mms = profile_rows(ev, gpu=False)   # the CPU's ops: their self time excludes their children's
    assert rows == ev and [e.key for e in mms] == ["aten::mm"]


def test_bench_profile_command(tmp_path):
    rows, p = run_bench("tf_l2", tmp_path, "--profile")
    assert [r["model"] for r in rows] == ["tf_l2"] and "of the bound" in p.stdout and "aten::mm" in p.stdout
    assert "| tf_l2 |" not in p.stdout   # the profile, not the table


def test_bench_on_cuda_is_honest(monkeypatch):
    """On a GPU: the paper preset by default; inference memory peaks counted from after the bf16 cast (the fp32
    weights once doubled the figure); --profile in the GPU's own time (CPU time there is launch cost); the static
    decode step compiled fullgraph (a graph break would silently split its CUDA graph)."""
    import types
    import bench
    assert bench.default_preset("cuda:0") == "paper" and bench.default_preset("cpu") == "cpu"
    event = types.SimpleNamespace(self_device_time_total=7.0, self_cpu_time_total=3.0)
    (_, on_gpu, gpu), (_, on_cpu, cpu) = bench.profiler_clock("cuda"), bench.profiler_clock("cpu")
    assert (on_gpu(event), gpu) == (7.0, "GPU") and (on_cpu(event), cpu) == (3.0, "CPU")
    monkeypatch.setitem(bench.PRESETS, "tiny", dict(bench.PRESETS["tiny"], dtype="bfloat16"))
    built, at_reset = [], []
    real_build = bench.build_model
    monkeypatch.setattr(bench, "build_model", lambda cfg: built.append(real_build(cfg)) or built[-1])
    monkeypatch.setattr(bench, "reset_peak", lambda device: at_reset.append(built[-1].wte.weight.dtype))
    # no bf16 forward: this CPU's bf16 attention may need avx512 (ATEN_CPU_CAPABILITY=default refuses it); the cast's
    # order is what is checked
    monkeypatch.setattr(bench, "measure_memory", lambda *a: {})
    bench.worker("mem", {"model": "tf_l4", "preset": "tiny", "device": "cpu"})   # every inference phase casts there
    assert at_reset == [torch.bfloat16], at_reset

    class Compiled(Exception):
        pass

    def compile(f, **kw):   # what --profile --static_cache --compile asks torch.compile for; stop there
        raise Compiled(kw)
    monkeypatch.setattr(bench.torch, "compile", compile)
    with pytest.raises(Compiled) as e:
        bench.worker("profile", {"model": "tf_l4", "preset": "tiny", "device": "cpu", "compile": True, "static": True})
    assert e.value.args[0] == dict(dynamic=False, mode="reduce-overhead", fullgraph=True), e.value.args
