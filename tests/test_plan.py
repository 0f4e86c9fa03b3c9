"""plan.py: the memory of a training iteration, counted on the meta device, against a real
measured one; fused attention (nothing n x n); the bf16 weight casts; the command line a user gets."""

import os
import re
import subprocess
import sys

import pytest
import torch

from bench import model_config
from conftest import ROOT, md_tables, measured_iter_mb, one_error_line, patched, run_script, sh_commands
from model import ModelConfig, build_model
from tools.plan import count_iteration


@pytest.mark.parametrize("name", ["hrm_nt4", pytest.param("tf_l4", marks=pytest.mark.slow)])
def test_plan_matches_a_measured_float32_iteration(name):
    """The counted peak of forward + backward equals the measured resident peak of one real iteration (a fresh
    process whose allocator returns every freed block: bench.py's method). The issue's bar is 15%; measured
    it is within 0.1% for HRM, the Transformer and UniTF, so the test holds it to 5%."""
    over = {"vocab_size": 300}    # not 4d = 1024 nor d: the logits are told apart by their last dimension
    measured = measured_iter_mb(name, "cpu", **over) * 2**20
    counted = count_iteration(model_config(name, "cpu", **over), 4, torch.float32, grads_persistent=False, seq=256)
    assert abs(counted["iteration_peak"] / measured - 1) < 0.05, (counted, measured / 2**20)
    assert counted["logits"] < counted["activations"] < counted["iteration_peak"]


def test_attention_saves_nothing_n_by_n():
    """Fused attention: the saved activations grow linearly with the sequence, as on a GPU (the math kernel
    the meta device would run saves the n x n weights and would make this ratio 2.85)."""
    cfg = ModelConfig(arch="hrm", vocab_size=300, n_embd=64, n_head=4, block_size=1024, N=2, T=2, K=2)
    a, b = (count_iteration(cfg, 1, torch.float32, seq=n)["activations"] for n in (512, 1024))
    assert abs(b / a - 2) < 0.01, (a, b)


def test_bf16_saves_half_and_keeps_one_cast_of_each_weight():
    """Under bf16 autocast each nn.Linear weight is cast once per iteration and kept for backward: exactly 2 bytes
    per parameter. (The tied head multiplies by wte.weight.T, a view, which autocast does not cache: that copy
    is saved as an activation.) The activations are about half of float32's."""
    cfg = model_config("tf_l4", "tiny", vocab_size=300)
    with torch.device("meta"):
        model = build_model(cfg)
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2) - model.wte.weight.numel()
    bf16, fp32 = count_iteration(cfg, 2, torch.bfloat16), count_iteration(cfg, 2, torch.float32)
    assert bf16["weight_casts"] == 2 * matrices and fp32["weight_casts"] == 0
    assert 0.45 < (bf16["activations"] - bf16["logits"]) / (fp32["activations"] - fp32["logits"]) < 0.75


MAXRSS = """
import resource
import torch   # what plan.py imports first: the RSS it brings is not the plan's
BASE = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
def finish():
    print("MAXRSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - BASE, BASE)
"""


def test_paper_configs_planned_without_memory(tmp_path):
    """python tools/plan.py <paper configs> --gpu_mem_gb=80: verdicts, largest micro-batch, a command line that keeps
    the global batch; a few hundred MB (nothing is allocated at paper size)."""
    cmd = patched(MAXRSS, tmp_path, [sys.executable, "tools/plan.py", "config/equalparam_nt12.py",
                                     "config/tfbaseline_tf_l12.py", "--gpu_mem_gb=80"])
    # what planning adds to the peak RSS over its imports: < 0.5 GB, no paper-size tensor (the embedding alone is
    # 0.8 GB). Counted above the imports: whole-process peaks of 0.31 GB and, in fresh-clone full-suite runs,
    # 1.05 GB were both read, the difference unexplained and not the plan's
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    grown, base = map(int, p.stdout.split("MAXRSS_KB")[1].split())
    assert grown < 500_000, (grown, base)
    hrm, tf = p.stdout.split("config/tfbaseline_tf_l12.py:")
    assert "1229M params" in hrm and re.search(r"ddp .* fits", hrm)
    assert "3427M params" in tf and re.search(r"ddp .* DOES NOT FIT", tf) and re.search(r"fsdp .* fits", tf)
    m = re.search(r"ddp: largest micro-batch that fits: (\d+) .*--batch_size=(\d+) --gradient_accumulation_steps=(\d+)", tf)
    assert m and int(m[1]) == int(m[2]) < 12 and int(m[2]) * int(m[3]) == 12 * 6   # the paper's 72 sequences


def test_plan_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("n_embdd = 5\n")
    line = one_error_line(run_script("tools/plan.py", str(bad)), prog="plan.py")
    assert line.startswith("plan.py: error:") and "n_embd" in line


def test_markdown_row_where_a_larger_micro_batch_fits(tmp_path):
    """--markdown searches from the largest micro-batch down: where a larger one than the config's fits, the row
    still reads the config's own micro-batch (it was never planned, and the row was a KeyError traceback)."""
    cfg = tmp_path / "small.py"
    cfg.write_text("n_embd = 64\nn_head = 2\nN = 2\nT = 2\nblock_size = 64\nvocab_size = 80\n"
                   "batch_size = 2\ngradient_accumulation_steps = 4\n")
    p = run_script("tools/plan.py", str(cfg), "--markdown=80", "--world_size=1")
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.splitlines()[-1].startswith("| small.py |") and "micro-batch 8" in p.stdout, p.stdout


@pytest.mark.parametrize("arg", ["--gpu_mem_gb=nan", *[pytest.param(a, marks=pytest.mark.slow)
                                                          for a in ("--gpu_mem_gb=inf", "--reserve_gb=nan")]])
def test_plan_refuses_non_finite_sizes(arg):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "plan.py"), "config/equalparam_nt12.py", arg],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 2 and p.stderr.startswith("plan.py: error:") and "finite" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


# --- docs/MEMORY.md's table is plan.py's output ------------------------------------------------------------------

def memory_page_command():
    page = open(os.path.join(ROOT, "docs", "MEMORY.md")).read()
    (cmd,) = [c for c in sh_commands(page) if "--markdown=" in c]
    return page, cmd


# One per architecture, and the verdicts beyond a plain DDP run: ablation_s3 (S = 3, "DDP micro-batch 6 or FSDP
# micro-batch 6") and equalflops_tf_l12 ("DDP micro-batch 4 or FSDP"). In ls's order, as the page's command lists them.
SOME_CONFIGS = ["ablation_s3.py", "equalflops_tf_l12.py", "equalparam_nt8.py", "equalparam_tf_l4.py", "m48_unitf.py"]


def test_memory_table_rows_are_plans_output_for_one_config_of_each_kind():
    """CI's share of the check below (the whole table takes 26 s): the page's command, run as written in bash but
    with SOME_CONFIGS in place of its list of every config, prints exactly the page's rows for them, in order."""
    page, cmd = memory_page_command()
    listing = re.search(r"\$\(ls [^)]*\)", cmd)[0]
    some = cmd.replace(listing, " ".join(f"config/{c}" for c in SOME_CONFIGS))
    p = subprocess.run(["bash", "-c", f"set -eo pipefail; {some}"], capture_output=True, text=True, cwd=ROOT,
                       timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    (printed,) = md_tables(p.stdout)
    rows = printed.splitlines()
    (committed,) = [t for t in md_tables(page) if t.splitlines()[0] == rows[0]]
    mine = [r for r in committed.splitlines() if r.split(" | ")[0] in {f"| {c}" for c in SOME_CONFIGS}]
    assert [r.split(" | ")[0] for r in rows[2:]] == [f"| {c}" for c in SOME_CONFIGS], printed
    assert mine == rows[2:], f"docs/MEMORY.md's rows are not what `{cmd}` prints for them (run it, paste):\n" + \
        "\n".join(f"page: {m}\nnow:  {r}" for m, r in zip(mine, rows[2:]) if m != r)


@pytest.mark.slow   # CI time (26 s): CI checks one config of each kind above
def test_memory_table_is_plans_output():
    """The command docs/MEMORY.md shows, run as written (in bash, in the repository), prints the page's table
    exactly: every config it plans, with their sizes and verdicts. (tests/test_docs.py counts this command as run.)"""
    page, cmd = memory_page_command()
    p = subprocess.run(["bash", "-c", f"set -eo pipefail; {cmd}"], capture_output=True, text=True, cwd=ROOT,
                       timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    (printed,) = md_tables(p.stdout)
    header = printed.splitlines()[0]
    committed = [t for t in md_tables(page) if t.splitlines()[0] == header]
    assert len(committed) == 1, f"docs/MEMORY.md has {len(committed)} tables headed {header!r}"
    assert len(printed.splitlines()) > 2 + 20, printed   # the paper's configs, not an empty table
    if committed[0] != printed:
        diff = [f"docs/MEMORY.md: {a}\nplan.py now:   {b}"
                for a, b in zip(committed[0].splitlines(), printed.splitlines()) if a != b]
        pytest.fail(f"docs/MEMORY.md's table is not what `{cmd}` prints (run it and paste its output):\n"
                    + "\n".join(diff or [f"{len(committed[0].splitlines())} rows vs {len(printed.splitlines())}"]),
                    pytrace=False)


def test_host_figures_are_one_tensor_each():
    """plan.py's host line: a save of the resume state copies the rank's tensors to the host one at a time (the
    largest float32 weight; under FSDP its 1/W shard), and the meta-device build holds the largest weight at
    start-up: the GPT-2 embedding here. Checked against the model's own parameters, at 6 ranks."""
    from tools.plan import plan, train_settings
    settings = train_settings([os.path.join(ROOT, "config", "shakespeare_hrm.py")])   # GPT-2 vocabulary
    model = build_model(ModelConfig(**{k: settings[k] for k in ModelConfig.__dataclass_fields__ if k in settings}))
    ddp, fsdp = (plan(settings, 6, 80e9, 2e9, fsdp=f) for f in (False, True))
    largest = 4 * max(p.numel() for p in model.parameters())
    assert ddp["host_save"] == largest and fsdp["host_save"] == largest / 6
    assert ddp["host_start"] == 4 * max(p.numel() for p in model.parameters()) == 4 * model.wte.weight.numel()
