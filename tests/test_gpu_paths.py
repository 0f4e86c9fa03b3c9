"""The CUDA path's device bookkeeping, checked on the CPU with a mocked torch.cuda: MFU's datasheet peak per GPU
part and dtype, bench.py's timing and memory calls aimed at the device asked for, not device 0, the loud line
where a GPU is present but torch cannot use it, and each torchrun process's GPU."""

import re
import subprocess
import sys

import pytest
import torch

import bench
from hrmlm import common
from hrmlm import common as flops   # FLOPs and peaks live in common.py
from conftest import ENV, ROOT


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 NVL", 835.0), ("NVIDIA H100 80GB HBM3", 989.0),
    ("NVIDIA H200", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100-PCIE-40GB", 312.0),
    ("NVIDIA H800", 989.0), ("NVIDIA H800 PCIe", 756.0), ("NVIDIA B200", 2250.0)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mfu_peak_is_the_parts_datasheet_in_bf16_and_fp16(monkeypatch, name, peak, dtype):
    """Any "H100" used to count as the SXM part (989), overstating a PCIe card's peak by 31%; and fp16 used a
    measured peak where bf16 used the datasheet, so the two MFUs were not comparable."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(flops, "measure_peak_tflops", lambda *a, **k: pytest.fail("measured a known part's peak"))
    assert flops.device_peak_tflops("cuda:0", dtype) == peak


def test_unknown_gpu_and_float32_measure_the_peak(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    monkeypatch.setattr(flops, "measure_peak_tflops", lambda device, dtype, n=None: 123.0)
    assert flops.device_peak_tflops("cuda:0", torch.bfloat16) == 123.0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    assert flops.device_peak_tflops("cuda:0", torch.float32) == 123.0


def test_bench_times_and_measures_the_device_it_was_given(monkeypatch):
    """bench.py --device=cuda:1 synchronized and read the memory counters of device 0 (torch's current device)."""
    seen = []
    for fn in ("synchronize", "reset_peak_memory_stats", "max_memory_allocated", "memory_allocated",
               "get_device_name"):
        result = "Some GPU" if fn == "get_device_name" else 0
        monkeypatch.setattr(torch.cuda, fn, lambda device=None, fn=fn, result=result: seen.append((fn, device)) or result)
    bench.sync("cuda:1")
    bench.reset_peak("cuda:1")
    bench.peak_mb("cuda:1")
    bench.current_mb("cuda:1")
    flops.datasheet_tflops("cuda:1")
    assert seen and all(device == "cuda:1" for _, device in seen), seen
    assert {fn for fn, _ in seen} == {"synchronize", "reset_peak_memory_stats", "max_memory_allocated",
                                      "memory_allocated", "get_device_name"}


def test_a_gpu_torch_cannot_use_is_said_loudly(monkeypatch, capsys):
    """device=auto on a machine with an NVIDIA GPU and a torch that cannot use it (a CPU build, or a CUDA newer
    than the driver) once fell back to the CPU without a word."""
    import os
    real = os.path.exists
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(os.path, "exists", lambda p: p == "/dev/nvidia0" or real(p))
    assert common.usable_device("auto") == "cpu"
    err = capsys.readouterr().err
    assert err.startswith("note: this machine has an NVIDIA GPU (/dev/nvidia0), but torch ") and "CUDA build" in err
    monkeypatch.setattr(os.path, "exists", lambda p: False if "nvidia" in p else real(p))
    assert common.usable_device("auto") == "cpu" and capsys.readouterr().err == ""   # no GPU: nothing to say
    assert common.usable_device("cpu") == "cpu"
    assert common.torch_line("cpu") == f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}, cpu"


@pytest.mark.parametrize("visible,local_rank,device", [(8, 3, "cuda:3"), (1, 3, "cuda:0")])
def test_each_torchrun_process_takes_its_gpu(monkeypatch, visible, local_rank, device):
    """LOCAL_RANK picks the GPU among those visible; a process that sees one GPU (a scheduler's CUDA_VISIBLE_DEVICES)
    takes its cuda:0 (cuda:3 failed there). NCCL gets the device_id and a timeout past its default 10 minutes."""
    from hrmlm import parallel
    got = {}
    monkeypatch.setenv("RANK", str(local_rank))
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: got.update(set=d))
    monkeypatch.setattr(parallel.dist, "init_process_group", lambda **k: got.update(k))
    _, _, dev = parallel.init_process_group("cuda")
    assert dev == got["set"] == device and got["backend"] == "nccl"
    assert got["device_id"] == torch.device(device) and got["timeout"].total_seconds() == 1800


@pytest.mark.timeout(420)   # about 80 s on a 2-core CPU (decode: 90 s more)
@pytest.mark.parametrize("bench", ["0", pytest.param("1", marks=pytest.mark.slow)])
def test_device_check_dry_run_passes(tmp_path, bench):
    """tools/device_check.sh, the GPU checks in one go, run end to end at toy sizes on the CPU (DRY_RUN=1): every
    step passes and lands in its one log, so the day a GPU is lent the script runs as written: eager and compiled
    training compared (their losses equal here, float32 on the CPU), DDP and FSDP side by side and both resumed, the
    training profile split into its parts. CI skips the bench.py decode step (BENCH_STEPS=0; 90 s), whose command
    tests/test_bench.py runs at the same toy sizes."""
    import os
    import subprocess
    from conftest import ENV, ROOT
    log = tmp_path / "dc.log"
    p = subprocess.run(["bash", os.path.join(ROOT, "tools", "device_check.sh")], cwd=ROOT, capture_output=True, text=True,
                       timeout=400, env=dict(ENV, DRY_RUN="1", BENCH_STEPS=bench, LOG=str(log), OUT=str(tmp_path / "out")))
    text = log.read_text()
    assert p.returncode == 0 and "device check: every step passed" in p.stdout, text[-3000:]
    for step in ("## env:", "## eager: 2 iterations", "## compiled: 3 iterations", "## compare:", "## dist:",
                 "## resume:", "## profile:") + (("## decode: the CUDA-graph",) if bench == "1" else
                                                  ("## decode: skipped",)):
        assert step in text, step
    assert text.count("-- exit 0,") == text.count("-- exit ") == 7 + (bench == "1")
    worst = re.search(r"losses of iterations 1-2: largest relative difference (\S+),", text)
    assert worst and float(worst[1]) < 1e-4, text[-3000:]   # float32 on the CPU: far inside bf16's 2^-7
    assert text.count("done: 4 iterations") == 2 and "# ddp:" in text and "# fsdp:" in text   # both resumed
    assert re.search(r"a step takes [\d.]+ ms of CPU time: matrix products [\d.]+ ms .*, attention .*, optimizer "
                     r".*, the rest", text)


# --- the meta-device build (parallel.build_on_device): today's initial weights, bit for bit --------------------

META_CASES = {"hrm": dict(arch="hrm", N=2, T=2, K=2), "hrm_fast_only": dict(arch="hrm", N=2, T=2, K=2, fast_only=True,
              learn_alpha=False), "transformer": dict(arch="transformer", n_layer=2),
              "transformer_pre_out_proj": dict(arch="transformer", n_layer=2, norm="pre", out_proj=True),
              "unitf": dict(arch="unitf", M=3, K=1)}


@pytest.mark.parametrize("case", META_CASES)
def test_meta_build_gives_todays_initial_weights(case):
    """Built on the meta device and materialised (train.py's way) the model has every parameter and buffer of a CPU
    build after the same seed, bit for bit, and the CPU generator is left where a CPU build leaves it; while it is
    built, every weight matrix is on the meta device (none is made whole on the CPU). FSDP's shards of it: FSDP runs
    give one process's numbers exactly (tests/test_distributed.py)."""
    from hrmlm.parallel import MetaInit, build_on_device
    from model import ModelConfig, build_model
    cfg = ModelConfig(vocab_size=301, n_embd=32, n_head=4, block_size=16, **META_CASES[case])
    torch.manual_seed(5)
    cpu, after_cpu = build_model(cfg), torch.rand(3)
    torch.manual_seed(5)
    meta, after_meta = build_on_device(cfg, "cpu", 0, 1), torch.rand(3)
    want, got = (dict(m.named_parameters()) | dict(m.named_buffers()) for m in (cpu, meta))
    assert want.keys() == got.keys()
    assert not [k for k in want if not torch.equal(want[k], got[k])], [k for k in want if not torch.equal(want[k], got[k])]
    assert torch.equal(after_cpu, after_meta)
    with MetaInit(lambda full: None):
        built = build_model(cfg)
    assert all(p.is_meta == (p.dim() >= 2) for p in built.parameters())


@pytest.mark.parametrize("user", [None, "max_split_size_mb:64"])
def test_cuda_allocator_grows_segments_unless_the_user_set_it(user):
    """hrmlm.parallel (every CUDA run of train.py imports it before its first CUDA allocation) sets expandable
    segments, torchtitan's and nanochat's setting; a PYTORCH_CUDA_ALLOC_CONF the user gave is kept."""
    env = {k: v for k, v in ENV.items() if k != "PYTORCH_CUDA_ALLOC_CONF"} | ({"PYTORCH_CUDA_ALLOC_CONF": user} if user
                                                                           else {})
    p = subprocess.run([sys.executable, "-c", "import os, hrmlm.parallel; print(os.environ['PYTORCH_CUDA_ALLOC_CONF'])"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.stdout.strip() == (user or "expandable_segments:True"), p.stderr
