"""Issue 11 for train.py: one run per out_dir, no data lost under faults, one clear line for bad input.

Each case drives the real train.py in a subprocess at tiny sizes and checks the exit code, the one error
line (no traceback) and that the files a user already had are unchanged.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, TINY, faulty_train, one_error_line, run_train

HRM = ["--arch=hrm", "--N=2", "--T=2", "--K=2"]


def raw_iters(out_dir):
    """The iterations in log.jsonl, every line, duplicates included."""
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line)["iter"] for line in f]


def digest(out_dir):
    """name -> sha256 of every file in out_dir (to show that nothing changed)."""
    return {n: hashlib.sha256(open(os.path.join(out_dir, n), "rb").read()).hexdigest()
            for n in sorted(os.listdir(out_dir)) if os.path.isfile(os.path.join(out_dir, n)) and n != ".lock"}


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
    """A finished 4-iteration run (checkpoints at 2 and 4) to copy from."""
    out = str(tmp_path_factory.mktemp("faults") / "run")
    run_train(HRM + ["--max_iters=4", "--eval_interval=2"], data_dir, out)
    return out


def copy_run(trained, tmp_path):
    out = str(tmp_path / "run")
    shutil.copytree(trained, out)
    return out


# --- item 1: one run per out_dir ---------------------------------------------------------------------

def test_second_run_on_a_busy_out_dir_is_refused(data_dir, tmp_path):
    out = str(tmp_path / "run")
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), *TINY, *HRM, f"--data_dir={data_dir}",
           f"--out_dir={out}", "--max_iters=100000", "--eval_interval=100000"]
    first = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))
    try:
        for line in first.stdout:       # wait until it trains
            if line.startswith("iter 1/"):
                break
        log_before = open(os.path.join(out, "log.jsonl")).read()
        for extra in (["--overwrite=True"], ["--init_from=resume"]):
            p = run_train(HRM + ["--max_iters=2"] + extra, data_dir, out, check=False)
            line = one_error_line(p)
            assert "is in use by another train.py run" in line and f"pid {first.pid}" in line, line
        assert open(os.path.join(out, "log.jsonl")).read() == log_before   # nothing interleaved
        assert first.poll() is None
    finally:
        first.kill()
        first.wait()
    # the OS dropped the lock with the process: the out_dir can be taken again
    p = run_train(HRM + ["--max_iters=2", "--overwrite=True"], data_dir, out)
    assert raw_iters(out) == [0, 2]


# --- item 11: a new run never silently replaces an old one --------------------------------------------

def test_new_run_into_a_used_out_dir_is_refused(trained, data_dir, tmp_path):
    out = copy_run(trained, tmp_path)
    before = digest(out)
    line = one_error_line(run_train(HRM + ["--max_iters=2"], data_dir, out, check=False))
    assert "already holds a run" in line and "--init_from=resume" in line and "--overwrite=True" in line
    assert digest(out) == before
    run_train(HRM + ["--max_iters=2", "--eval_interval=2", "--overwrite=True"], data_dir, out)
    assert raw_iters(out) == [0, 2]       # one run in the log, not two
    assert torch.load(os.path.join(out, "ckpt_last.pt"), weights_only=True)["iter_num"] == 2


# --- item 2: the data is checked against meta.json before any work -------------------------------------

def test_mixed_dataset_is_refused(data_dir, tmp_path):
    d = tmp_path / "data"
    shutil.copytree(os.path.join(data_dir, "shakespeare"), d / "shakespeare")
    with open(d / "shakespeare" / "train.bin", "ab") as f:   # train.bin from another preparation
        f.write(b"\x01\x00" * 1000)
    p = run_train(HRM + ["--max_iters=2"], str(d), str(tmp_path / "out"), check=False)
    line = one_error_line(p)
    assert "train.bin" in line and "meta.json" in line, line
    assert "step 0" not in p.stdout


# --- item 3: 0 log 0 = 0 in the fusion-entropy term ---------------------------------------------------

def test_fusion_entropy_with_a_zero_weight_is_finite():
    from model import ModelConfig, build_model
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


# --- item 4: a diverged model is never "good" -----------------------------------------------------------

def test_diverged_model_never_becomes_the_best(data_dir, tmp_path):
    out = str(tmp_path / "run")
    p = run_train(HRM + ["--max_iters=12", "--eval_interval=2", "--learning_rate=1e6", "--warmup_iters=0",
                         "--decay_lr=False", "--max_nonfinite=3"], data_dir, out, check=False)
    log = [json.loads(l) for l in open(os.path.join(out, "log.jsonl"))]
    initial = log[0]["val_loss"]
    assert any(r["val_loss"] is not None and r["val_loss"] > initial for r in log[1:]), log  # it did diverge
    if os.path.exists(os.path.join(out, "ckpt.pt")):
        assert torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["best_val_loss"] < initial
    if p.returncode == 3:
        assert "last good checkpoint: none (no evaluation beat the initial model)" in p.stdout, p.stdout


# --- item 5: a failed save is one line, leaves no temporary, and stale ones are cleaned -------------------

def run_faulty(args, data_dir, out, tmp_path, fault, at):
    return faulty_train(HRM + args, data_dir, out, tmp_path, fault, at)


def test_failed_save_is_one_line_and_leaves_no_temporary(trained, data_dir, tmp_path):
    out = copy_run(trained, tmp_path)
    before = digest(out)
    # resume to 6: the first save (ckpt.pt at iter 6) fails as on a full disk
    p = run_faulty(["--max_iters=6", "--eval_interval=2", "--init_from=resume"], data_dir, out, tmp_path, "full", 1)
    line = one_error_line(p, code=1)
    assert "cannot save" in line and "No space left on device" in line and "ckpt_last.pt" in line, line
    assert not [n for n in os.listdir(out) if ".tmp." in n]
    after = digest(out)
    assert {k: after[k] for k in ("ckpt.pt", "ckpt_last.pt")} == {k: before[k] for k in ("ckpt.pt", "ckpt_last.pt")}


def test_stale_temporary_is_removed_on_resume(trained, data_dir, tmp_path):
    out = copy_run(trained, tmp_path)
    stale = os.path.join(out, "ckpt_last.pt.tmp.999999")
    with open(stale, "wb") as f:
        f.write(b"\0" * 1000)
    run_train(HRM + ["--max_iters=6", "--eval_interval=2", "--init_from=resume"], data_dir, out)
    assert not os.path.exists(stale)


# --- item 6: log and checkpoint stay consistent under a kill between them ---------------------------------

def test_kill_between_log_and_checkpoint_logs_each_iteration_once(data_dir, tmp_path):
    ref, out = str(tmp_path / "ref"), str(tmp_path / "run")
    args = ["--max_iters=6", "--eval_interval=2"]
    run_train(HRM + args, data_dir, ref)
    # saves: ckpt.pt@2, ckpt_last.pt@2, ckpt.pt@4 <- killed here, after the log line for iter 4
    p = run_faulty(args, data_dir, out, tmp_path, "kill", 3)
    assert p.returncode == -signal.SIGKILL
    assert raw_iters(out) == [0, 2, 4]
    run_train(HRM + args + ["--init_from=resume"], data_dir, out)
    assert raw_iters(out) == raw_iters(ref) == [0, 2, 4, 6]
    a = {r["iter"]: r for r in map(json.loads, open(os.path.join(ref, "log.jsonl")))}
    b = {r["iter"]: r for r in map(json.loads, open(os.path.join(out, "log.jsonl")))}
    for it in (4, 6):
        assert a[it]["val_loss"] == b[it]["val_loss"]


# --- item 7: a resume that cannot be exact is refused; schedule changes are allowed with a note -----------

def test_resume_with_other_data_settings_is_refused(trained, data_dir, tmp_path):
    out = copy_run(trained, tmp_path)
    before = digest(out)
    p = run_train(HRM + ["--max_iters=6", "--init_from=resume", "--batch_size=8", "--seed=7"], data_dir, out,
                  check=False)
    line = one_error_line(p)
    assert "batch_size=4 in the checkpoint vs 8 now" in line and "seed=1337 in the checkpoint vs 7 now" in line, line
    assert digest(out) == before
    p = run_train(HRM + ["--max_iters=6", "--eval_interval=2", "--init_from=resume", "--learning_rate=1e-3"],
                  data_dir, out)
    assert "note: resuming with changed settings" in p.stdout and "max_iters 4 -> 6" in p.stdout, p.stdout
    assert "learning_rate 0.003 -> 0.001" in p.stdout


# --- item 8 and a checkpoint without optimizer state --------------------------------------------------------

@pytest.mark.parametrize("damage,msg", [("nan", "non-finite weights"), ("no_optimizer", "no optimizer state")])
def test_damaged_checkpoint_is_refused(trained, data_dir, tmp_path, damage, msg):
    out = copy_run(trained, tmp_path)
    path = os.path.join(out, "ckpt_last.pt")
    ck = torch.load(path, weights_only=True)
    if damage == "nan":
        ck["model"]["fusion.tau"] = torch.tensor(float("nan"))
    else:
        del ck["optimizer"]
    torch.save(ck, path)
    line = one_error_line(run_train(HRM + ["--max_iters=6", "--init_from=resume"], data_dir, out, check=False))
    assert msg in line, line


# --- values out of range, out_dir problems: one line, before the model is built ---------------------------

@pytest.mark.parametrize("args,msg", [
    (["--device=bogus"], "is not a device"),
    (["--learning_rate=-1"], "learning_rate must be > 0"),
    (["--beta2=1.5"], "beta2 must be in [0, 1)"),
    (["--seed=-1"], "seed must be >= 0"),
    (["--out_dir="], "out_dir is empty"),
])
def test_out_of_range_values_are_one_line(args, msg, data_dir, tmp_path):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *TINY, *HRM, f"--data_dir={data_dir}",
                        f"--out_dir={tmp_path / 'out2'}", "--max_iters=2", *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    line = one_error_line(p)
    assert msg in line, line
    assert "step 0" not in p.stdout


@pytest.mark.parametrize("where", ["is_a_file", "under_a_file"])
def test_bad_out_dir_is_found_before_work(where, data_dir, tmp_path):
    f = tmp_path / "afile"
    f.write_text("keep me")
    out = str(f) if where == "is_a_file" else str(f / "sub")
    p = run_train(HRM + ["--max_iters=2"], data_dir, out, check=False)
    line = one_error_line(p)
    assert "out_dir" in line, line
    assert "step 0" not in p.stdout and f.read_text() == "keep me"


# --- SIGINT and SIGTERM save, and the resumed run matches an uninterrupted one bit for bit ------------------

@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_signal_saves_and_resume_is_exact(sig, data_dir, tmp_path):
    ref, out = str(tmp_path / "ref"), str(tmp_path / "run")
    args = HRM + ["--max_iters=24", "--eval_interval=8", "--log_interval=1"]
    run_train(args, data_dir, ref)
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), *TINY, f"--data_dir={data_dir}", f"--out_dir={out}", *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))
    for line in proc.stdout:
        if line.startswith("iter 5/"):
            proc.send_signal(sig)
            break
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, stderr
    assert "Traceback" not in stderr
    assert f"stopped by {signal.Signals(sig).name}" in stderr and "--init_from=resume" in stderr, stderr
    stopped_at = torch.load(os.path.join(out, "ckpt_last.pt"), weights_only=True)["iter_num"]
    assert 5 <= stopped_at < 24
    run_train(args + ["--init_from=resume"], data_dir, out)
    assert raw_iters(out) == raw_iters(ref)
    a = {r["iter"]: r for r in map(json.loads, open(os.path.join(ref, "log.jsonl")))}
    b = {r["iter"]: r for r in map(json.loads, open(os.path.join(out, "log.jsonl")))}
    for it in a:
        if it > stopped_at:
            for key in ("train_loss", "val_loss", "grad_norm", "lr"):
                assert a[it][key] == b[it][key], (it, key)
    wa = torch.load(os.path.join(ref, "ckpt_last.pt"), weights_only=True)["model"]
    wb = torch.load(os.path.join(out, "ckpt_last.pt"), weights_only=True)["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
