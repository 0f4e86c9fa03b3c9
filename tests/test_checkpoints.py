"""Checkpoints and faults: one run per out_dir, no data lost under faults (a full disk, SIGKILL mid-save,
a kill between the log line and the checkpoint, SIGINT/SIGTERM), exact resume, safe loading, a diverged
or non-finite run never becoming "good", one clear line for bad input, and a run written by an older
version of the code that still resumes, samples and analyses.

Each case drives the real train.py in a subprocess at tiny sizes and checks the exit code, the one error
line (no traceback) and that the files a user already had are unchanged.
"""

import json
import os
import shutil
import signal
import subprocess
import time

import pytest
import torch

from hrmlm.checkpoint import nonfinite as nonfinite_tensors, resume_path as last_path
from conftest import (ENV, HRM, ROOT, TINY, Evil, by_iter, char_tiny, copy_run, last_state, one_error_line, patched,
                      raw_log, read_until, run_script, run_train, save_ckpt, save_last, snapshot, train_cmd, wait_for)

# torch.save with a fault at its FAULT_AT_SAVE-th call writing a .pt file (ckpt.pt, ckpt_last.dcp's meta.pt; not
# the tensors torch.distributed.checkpoint writes into its shard files with it): "full" writes part of the file
# and raises ENOSPC (a full disk); "zip" raises torch's zip-writer RuntimeError instead; "hang" writes part of the
# file, touches $MARKER and sleeps, for the test to SIGKILL mid-save.
FAULTY_SAVE = r"""
import errno, os, time, torch
calls = [0]
real_save = torch.save
def faulty_save(obj, f, *a, **k):
    calls[0] += ".pt" in str(getattr(f, "name", f))
    if calls[0] < int(os.environ["FAULT_AT_SAVE"]) or ".pt" not in str(getattr(f, "name", f)):
        return real_save(obj, f, *a, **k)
    f.write(b"PK\x03\x04 part of a checkpoint")
    if os.environ["FAULT"] == "zip":   # what torch's zip writer raises when the disk fills mid-record
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 2752 vs 2640")
    if os.environ["FAULT"] == "hang":
        f.flush()
        open(os.environ["MARKER"], "w").close()
        time.sleep(600)
    raise OSError(errno.ENOSPC, "No space left on device")
torch.save = faulty_save
"""


def faulty_train(args, data_dir, out, tmp_path, fault, at, marker=None, wait=True):
    """train.py (TINY + args) with torch.save failing at its at-th call; a CompletedProcess, or a Popen if not wait."""
    cmd = patched(FAULTY_SAVE, tmp_path, train_cmd(args, data_dir, out))
    env = dict(ENV, FAULT_AT_SAVE=str(at), FAULT=fault, MARKER=marker or "")
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def run_files(out):
    """What a refused or failed run must leave as it was: every file of the run (the lock file is the
    taker's own)."""
    return snapshot(out, skip={".lock"})


# --- one run per out_dir -------------------------------------------------------------------------------

def test_second_run_on_a_busy_out_dir_is_refused(data_dir, tmp_path):
    out = str(tmp_path / "run")
    cmd = train_cmd(HRM + ["--max_iters=100000", "--eval_interval=100000"], data_dir, out)
    first = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        read_until(first, "iter 1/", timeout=120)       # wait until it trains
        log_before = open(os.path.join(out, "log.jsonl")).read()
        for extra in (["--overwrite=True"], ["--init_from=resume"]):
            p = run_train(HRM + ["--max_iters=2"] + extra, data_dir, out, check=False)
            line = one_error_line(p)
            assert "is in use by another train.py run" in line and f"pid {first.pid}" in line, line
        assert open(os.path.join(out, "log.jsonl")).read() == log_before   # nothing interleaved
        assert first.poll() is None
    finally:
        first.kill()
        first.communicate(timeout=60)
    # the OS dropped the lock with the process: the out_dir can be taken again
    p = run_train(HRM + ["--max_iters=2", "--overwrite=True"], data_dir, out)
    assert raw_log(out, "iter") == [0, 2]


# --- a new run never silently replaces an old one; a bad out_dir or value is one line, before work -------

def test_new_run_into_a_used_out_dir_is_refused(trained, data_dir, tmp_path):
    out = copy_run(trained, tmp_path)
    before = run_files(out)
    line = one_error_line(run_train(HRM + ["--max_iters=2"], data_dir, out, check=False))
    assert "already holds a run" in line and "--init_from=resume" in line and "--overwrite=True" in line
    assert run_files(out) == before
    run_train(HRM + ["--max_iters=2", "--eval_interval=2", "--overwrite=True"], data_dir, out)
    assert raw_log(out, "iter") == [0, 2]       # one run in the log, not two
    assert last_state(out)["iter_num"] == 2


@pytest.mark.parametrize("where", ["is_a_file", "under_a_file"])
def test_bad_out_dir_is_found_before_work(where, data_dir, tmp_path):
    f = tmp_path / "afile"
    f.write_text("keep me")
    out = str(f) if where == "is_a_file" else str(f / "sub")
    p = run_train(HRM + ["--max_iters=2"], data_dir, out, check=False)
    line = one_error_line(p)
    assert "out_dir" in line, line
    assert "step 0" not in p.stdout and f.read_text() == "keep me"


# --- a failed save is one line, leaves no temporary, and stale ones are cleaned -----------------------------

def test_failed_save_is_one_line_and_leaves_no_temporary(trained, data_dir, tmp_path):
    out = copy_run(trained, tmp_path)
    before = run_files(out)
    # resume to 6: the first save (ckpt.pt at iter 6) fails as on a full disk
    p = faulty_train(HRM + ["--max_iters=6", "--eval_interval=2", "--init_from=resume"], data_dir, out, tmp_path,
                     "full", 1)
    line = one_error_line(p, code=1)
    assert "cannot save" in line and "No space left on device" in line and "iter_000004 (iter 4)" in line, line
    assert not [n for n in os.listdir(out) if ".tmp" in n]
    after = run_files(out)
    assert {k: v for k, v in after.items() if k.startswith("ckpt")} == {k: v for k, v in before.items() if k.startswith("ckpt")}


def test_stale_temporary_is_removed_on_resume(trained, data_dir, tmp_path):
    out = copy_run(trained, tmp_path)
    stale, half = os.path.join(out, "ckpt.pt.tmp.999999"), os.path.join(out, "ckpt_last.dcp", "iter_000099")
    with open(stale, "wb") as f:
        f.write(b"\0" * 1000)
    shutil.copytree(last_path(out), half)   # a save killed before its meta.pt: not finished, so never read
    os.remove(os.path.join(half, "meta.pt"))
    run_train(HRM + ["--max_iters=6", "--eval_interval=2", "--init_from=resume"], data_dir, out)
    assert not os.path.exists(stale) and not os.path.exists(half)


# --- SIGKILL mid-save, after the log line: the log and the checkpoints stay consistent ---------------------

@pytest.mark.slow   # CI time (25 s): CI's background-save kill test SIGKILLs mid-write and checks the log and the resume
def test_kill_mid_save_between_log_and_checkpoint(data_dir, tmp_path):
    """SIGKILL while ckpt.pt of iteration 4 is half written, after the log line for 4: the previous checkpoints
    still load, as they were; the half-written temporary is all that is left of the save; the resumed run
    removes it and logs each iteration once, with the numbers of an uninterrupted run."""
    ref, out = str(tmp_path / "ref"), str(tmp_path / "run")
    args = HRM + ["--max_iters=6", "--eval_interval=2"]
    run_train(args, data_dir, ref)
    # torch.save: ckpt.pt@2, ckpt_last.dcp's meta.pt@2, ckpt.pt@4 <- killed while writing it, after iter 4's log line
    marker = str(tmp_path / "writing")
    proc = faulty_train(args, data_dir, out, tmp_path, "hang", 3, marker, wait=False)
    try:
        wait_for(lambda: os.path.exists(marker) or proc.poll() is not None, 120, "the save of iteration 4 to start")
        assert os.path.exists(marker), proc.communicate(timeout=60)   # it ended without reaching the save
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert raw_log(out, "iter") == [0, 2, 4]
    best, last = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True), last_state(out)
    assert best["iter_num"] == last["iter_num"] == 2                     # still loadable: the previous ones
    for k in last["model"]:
        assert torch.equal(best["model"][k], last["model"][k])
    assert [n for n in os.listdir(out) if ".tmp." in n] == [f"ckpt.pt.tmp.{proc.pid}"]   # the half-written file
    run_train(args + ["--init_from=resume"], data_dir, out)
    assert not [n for n in os.listdir(out) if ".tmp." in n]
    assert last_state(out)["iter_num"] == 6
    assert raw_log(out, "iter") == raw_log(ref, "iter") == [0, 2, 4, 6]
    a, b = by_iter(ref), by_iter(out)
    for it in (4, 6):
        assert a[it]["val_loss"] == b[it]["val_loss"]


# torch.distributed.checkpoint's file writer, stuck at its second save (iteration 4's resume state): it touches $MARKER
# and sleeps, for the test to SIGKILL mid-write
STUCK_WRITER = r"""
import os, time
from torch.distributed.checkpoint import filesystem
real, calls = filesystem._FileSystemWriter.write_data, [0]
def write_data(self, *a, **k):
    calls[0] += 1
    if calls[0] == 2:
        open(os.environ["MARKER"], "w").close()
        time.sleep(600)
    return real(self, *a, **k)
filesystem._FileSystemWriter.write_data = write_data
"""


def test_a_kill_during_a_save_loses_nothing(data_dir, tmp_path):
    """SIGKILL while iteration 4's resume state is being written: its folder has no meta.pt (the mark of a finished
    save), so the previous one (iteration 2) is the state; the resume logs what an uninterrupted run logs, each
    iteration once, and the unfinished folder goes at its next save."""
    ref, out, marker = str(tmp_path / "ref"), str(tmp_path / "run"), str(tmp_path / "writing")
    args = HRM + ["--max_iters=6", "--eval_interval=2", "--log_interval=1"]
    run_train(args, data_dir, ref)
    cmd = patched(STUCK_WRITER, tmp_path, train_cmd(args, data_dir, out))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(ENV, MARKER=marker), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: os.path.exists(marker) or proc.poll() is not None, 120, "iteration 4's save to start")
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert last_state(out)["iter_num"] == 2 and os.path.isdir(os.path.join(out, "ckpt_last.dcp", "iter_000004"))
    run_train(args + ["--init_from=resume"], data_dir, out)
    a, b = by_iter(ref), by_iter(out)   # iteration 4 logged again by the resume: read_log keeps its last line
    assert sorted(a) == sorted(b) == [0, 2, 4, 6]
    assert all(a[it]["val_loss"] == b[it]["val_loss"] and a[it]["train_loss"] == b[it]["train_loss"] for it in a)
    assert not [n for n in os.listdir(out) if ".tmp" in n] and os.listdir(os.path.join(out, "ckpt_last.dcp")) == [
        "iter_000006"]


# --- resume: exact after a signal; refused where it cannot be exact; schedule changes allowed with a note ---

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_setup_stops_with_one_line(sig, data_dir, tmp_path):
    """A signal before the loop (while torch imports, while the run is set up) ends train.py at once with one
    line and 128 + n, not a KeyboardInterrupt traceback from inside an import; nothing is written."""
    for delay in (0.5, 1.5):
        out = str(tmp_path / f"run{delay}")
        proc = subprocess.Popen(train_cmd(HRM + ["--max_iters=1000"], data_dir, out), cwd=ROOT, text=True, env=ENV,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(delay)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 128 + sig and "Traceback" not in stderr, (delay, proc.returncode, stderr)
        last = stderr.strip().splitlines()[-1]
        if "before training started" in last:   # the setup's handler
            assert last == f"train.py: error: interrupted by {signal.Signals(sig).name} before training started; " \
                "nothing was saved", last
            assert not os.path.exists(os.path.join(out, "ckpt_last.dcp"))
        else:                                    # a slow start: the loop's handler had it
            assert f"stopped by {signal.Signals(sig).name}" in last, last


# SIGTERM, SIGHUP slow (CI time): the same handler (parallel.StopSignals) as SIGINT, which CI runs (and the setup
# test above runs SIGHUP). SIGHUP (a closed terminal, an ssh session dropping) once ended the run with 129, no line
# and nothing saved
@pytest.mark.parametrize("sig", [signal.SIGINT] + [pytest.param(s, marks=pytest.mark.slow) for s in (signal.SIGTERM,
                                                                                               signal.SIGHUP)])
def test_signal_saves_and_resume_is_exact(sig, data_dir, tmp_path):
    """Stopped by a signal mid-run, resumed: the same losses, learning rates, weights and best val loss as the
    uninterrupted run, to the bit (CPU float32)."""
    ref, out = str(tmp_path / "ref"), str(tmp_path / "run")
    args = HRM + ["--max_iters=24", "--eval_interval=8", "--log_interval=1"]
    run_train(args, data_dir, ref)
    proc = subprocess.Popen(train_cmd(args, data_dir, out), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV)
    read_until(proc, "iter 5/", timeout=120)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, stderr
    assert "Traceback" not in stderr
    assert f"stopped by {signal.Signals(sig).name}" in stderr and "--init_from=resume" in stderr, stderr
    stopped_at = last_state(out)["iter_num"]
    assert 5 <= stopped_at < 24
    run_train(args + ["--init_from=resume"], data_dir, out)
    assert raw_log(out, "iter") == raw_log(ref, "iter")   # each iteration once
    a, b = by_iter(ref), by_iter(out)
    for it in a:
        if it > stopped_at:
            for key in ("train_loss", "val_loss", "grad_norm", "lr"):
                assert a[it][key] == b[it][key], (it, key)
    ca = last_state(ref)
    cb = last_state(out)
    assert all(torch.equal(ca["model"][k], cb["model"][k]) for k in ca["model"])
    for key in ("iter_num", "best_val_loss"):
        assert ca[key] == cb[key], key


def test_resume_keeps_the_checkpoints_data_and_takes_a_new_schedule(trained, data_dir, tmp_path):
    """Other data or model settings: the checkpoint's are kept (they decide which tokens each iteration sees), and
    the note names what was ignored; the resume is the uninterrupted run's. Another schedule: taken, with a note;
    here a learning rate far too high, so val gets worse and the two checkpoints part ways: ckpt.pt keeps the best
    evaluation, the resume state the last."""
    ref = copy_run(trained, tmp_path, "ref")
    run_train(HRM + ["--max_iters=6", "--eval_interval=2", "--init_from=resume"], data_dir, ref)
    out = copy_run(trained, tmp_path)
    p = run_train(HRM + ["--max_iters=6", "--eval_interval=2", "--init_from=resume", "--batch_size=8", "--seed=7",
                         "--n_embd=64"], data_dir, out)
    assert all(f"{w} (kept the checkpoint's)" in p.stdout for w in ("n_embd 32 -> 64", "batch_size 4 -> 8",
                                                                    "seed 1337 -> 7")), p.stdout
    assert by_iter(out)[6]["val_loss"] == by_iter(ref)[6]["val_loss"]
    out = copy_run(trained, tmp_path, "run2")
    p = run_train(HRM + ["--max_iters=8", "--eval_interval=2", "--init_from=resume", "--learning_rate=0.1",
                         "--warmup_iters=0", "--decay_lr=False"], data_dir, out)
    assert "note: resuming with changed settings" in p.stdout and "max_iters 4 -> 8" in p.stdout, p.stdout
    assert "learning_rate 0.003 -> 0.1" in p.stdout
    best = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    last = last_state(out)
    log = {it: r["val_loss"] for it, r in by_iter(out).items() if it > 0}
    assert last["iter_num"] == 8
    assert best["iter_num"] == min(log, key=log.get) != 8
    assert best["best_val_loss"] == min(log.values())


# --- safe loading: damaged, truncated, foreign and pickled checkpoints are refused in one line --------------

def test_non_finite_resume_state_is_refused(trained, data_dir, tmp_path):
    """A non-finite weight in the resume state; and an older code's single ckpt_last.pt, which is no longer read."""
    out = copy_run(trained, tmp_path)
    ck = last_state(out)
    ck["model"]["fusion.tau"] = torch.full((1,), float("nan"))
    save_last(ck, out)
    line = one_error_line(run_train(HRM + ["--max_iters=6", "--init_from=resume"], data_dir, out, check=False))
    assert "non-finite weights" in line, line
    shutil.rmtree(os.path.join(out, "ckpt_last.dcp"))
    save_ckpt(ck, os.path.join(out, "ckpt_last.pt"))
    line = one_error_line(run_train(HRM + ["--max_iters=6", "--init_from=resume"], data_dir, out, check=False))
    assert "holds no resume state" in line and "older code's ckpt_last.pt is no longer read" in line, line


def flip_a_byte(path):
    """Flip one byte in the middle of a file (a sharded checkpoint's shard), as a bad disk would."""
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x20
    open(path, "wb").write(bytes(data))


def flip_a_weight_byte(path, name="wte.weight"):
    """Flip one byte inside a tensor's data in a checkpoint file, as a bad disk or a copy gone wrong would: the file
    still loads, and the weight is finite (one bit of a float32's exponent set makes it huge, not NaN)."""
    t = torch.load(path, weights_only=True)["model"][name]
    data = bytearray(open(path, "rb").read())
    at = data.find(t.reshape(-1)[:8].numpy().tobytes())
    assert at > 0
    data[at + 3] ^= 0x20
    open(path, "wb").write(bytes(data))
    assert torch.isfinite(torch.load(path, weights_only=True)["model"][name]).all()


def test_a_flipped_byte_is_refused_by_resume_sample_and_analyze(trained, data_dir, tmp_path):
    """Every checkpoint carries its checksums: a flipped byte in a resume state once resumed, trained and said
    done; now the resume, sample.py and analyze.py each stop with one line (exit 2) naming the file and what is
    intact, and nothing in the folder changes."""
    out = copy_run(trained, tmp_path)
    flip_a_byte(os.path.join(last_path(out), "__0_0.distcp"))
    before = snapshot(out, skip=(".lock",))
    p = run_train(HRM + ["--max_iters=6", "--init_from=resume"], data_dir, out, check=False)
    line = one_error_line(p)
    assert p.returncode == 2 and "iter_000004 is damaged: 1 file(s) missing or not as written (checksums: __0_0.distcp)" in line, line
    assert "intact: " + os.path.join(out, "ckpt.pt") + " (iter" in line, line
    assert snapshot(out, skip=(".lock",)) == before
    flip_a_weight_byte(os.path.join(out, "ckpt.pt"))
    for script, args in (("sample.py", ["--max_new_tokens=2"]), ("tools/analyze.py", [])):
        p = run_script(script, f"--out_dir={out}", *args)
        line = one_error_line(p, prog=os.path.basename(script))
        assert p.returncode == 2 and "ckpt.pt is damaged" in line, (script, line)


def test_a_folder_with_only_a_log_names_the_way_out(data_dir, tmp_path):
    """A run killed before its first checkpoint leaves log.jsonl alone: resuming it names --overwrite=True."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "log.jsonl").write_text('{"iter": 0, "val_loss": 4.38}\n')
    line = one_error_line(run_train(HRM + ["--max_iters=6", "--init_from=resume"], data_dir, str(out), check=False))
    assert "holds no resume state (ckpt_last.dcp), only log.jsonl" in line and "--init_from=scratch --overwrite=True" \
        in line, line
    line = one_error_line(run_train(HRM + ["--max_iters=6"], data_dir, str(out), check=False))   # nothing to resume:
    assert "already holds a run (log.jsonl); replace it with --overwrite=True" in line, line     # not advised
    (out / "ckpt.pt").write_bytes(b"the best weights")   # killed in its first resume save, after ckpt.pt: kept
    line = one_error_line(run_train(HRM + ["--max_iters=6", "--init_from=resume"], data_dir, str(out), check=False))
    assert f"its ckpt.pt is intact; start a new run from its weights with --init_from={out}" in line \
        and "--overwrite=True would delete it" in line, line


def test_the_log_is_strict_json(tmp_path):
    """A non-finite number is logged as null, never as bare NaN or Infinity (not JSON: strict readers refuse it)."""
    from hrmlm.checkpoint import append_log
    append_log(str(tmp_path), {"iter": 3, "train_loss": float("nan"), "val_loss": float("inf"), "lr": 0.1})
    line = (tmp_path / "log.jsonl").read_text()
    assert json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c}")) == {
        "iter": 3, "train_loss": None, "val_loss": None, "lr": 0.1}


def test_truncated_checkpoint_is_named(trained, data_dir, tmp_path):
    """A truncated meta.pt (the resume state's settings) and a truncated ckpt.pt (a truncated shard: its checksum
    says so, test_a_flipped_byte_is_refused_by_resume_sample_and_analyze)."""
    out = copy_run(trained, tmp_path)
    for path, how in ((os.path.join(last_path(out), "meta.pt"), ["--init_from=resume"]),
                      (os.path.join(out, "ckpt.pt"), [f"--init_from={out}", f"--out_dir={tmp_path / 'new'}"])):
        data = open(path, "rb").read()
        open(path, "wb").write(data[: len(data) // 2])
        line = one_error_line(run_train(HRM + ["--max_iters=6", *how], data_dir, out, check=False))
        assert "cannot load" in line and os.path.dirname(path) if path.endswith("meta.pt") else path in line, line


def test_weights_of_another_model_are_named(trained, data_dir, tmp_path):
    """init_from=<a run>: a new run from its weights, whose model must be the one they fit; another is named."""
    p = run_train(["--arch=transformer", "--max_iters=6", f"--init_from={trained}"], data_dir, str(tmp_path / "a"),
                  check=False)
    assert "ckpt.pt does not fit this model" in one_error_line(p)
    p = run_train(HRM + ["--n_embd=64", "--max_iters=6", f"--init_from={trained}"], data_dir, str(tmp_path / "b"),
                  check=False)
    assert "ckpt.pt does not fit this model" in one_error_line(p) and "size mismatch" in one_error_line(p)


def test_pickled_code_is_refused(trained, data_dir, tmp_path):
    """weights_only=True: a checkpoint carrying an arbitrary object is refused, and its code never runs."""
    out = copy_run(trained, tmp_path)
    meta = os.path.join(last_path(out), "meta.pt")
    ck = torch.load(meta, weights_only=True)
    flag = tmp_path / "pwned"
    ck["payload"] = Evil(str(flag))
    torch.save(ck, meta)
    p = run_train(HRM + ["--max_iters=6", "--init_from=resume"], data_dir, out, check=False)
    assert "holds Python objects other than tensors" in one_error_line(p)
    assert not flag.exists()


# --- non-finite losses: skipped, then the run stops; a diverged model is never "good" ------------------------

def test_diverged_model_never_becomes_the_best(data_dir, tmp_path):
    """lr 1e6 from the start: the first step makes the weights huge, so iteration 2's evaluation is finite but far
    worse than iteration 0's, and from iteration 1 on every step is non-finite and skipped. The run stops with
    exit status 3 after max_nonfinite = 3 of them in a row, names no good checkpoint (none beat the initial
    model), and ckpt.pt never holds the diverged model: it is absent or strictly better than the initial val.
    ckpt_last.dcp (for resume) holds the last finite model."""
    out = str(tmp_path / "run")
    p = run_train(HRM + ["--max_iters=12", "--eval_interval=2", "--learning_rate=1e6", "--warmup_iters=0",
                         "--decay_lr=False", "--max_nonfinite=3"], data_dir, out, check=False)
    assert p.returncode == 3, (p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    assert "step skipped (1 in a row, 1 in all)" in p.stdout, p.stdout
    assert "train.py: error: stopping at iter 3: 3 non-finite iterations in a row (max_nonfinite=3)" in p.stderr, p.stderr
    assert "last good checkpoint: none (no evaluation beat the initial model)" in p.stderr, p.stderr
    log = raw_log(out)
    initial = log[0]["val_loss"]
    assert any(r["val_loss"] is not None and r["val_loss"] > initial for r in log[1:]), log  # it did diverge
    assert log[-1]["iter"] == 2 and log[-1]["skipped"] == 1
    path = os.path.join(out, "ckpt.pt")
    best = torch.load(path, weights_only=True) if os.path.exists(path) else None
    logged = {r["iter"]: r["val_loss"] for r in log}
    assert best is None or (best["best_val_loss"] < initial and logged[best["iter_num"]] < initial), best
    last = last_state(out)
    assert last["iter_num"] == 2 and not nonfinite_tensors(last["model"])


def test_divergence_near_the_end_is_not_done(data_dir, tmp_path):
    """The same divergence with fewer iterations left than max_nonfinite: every step after the first skipped, the
    loop reaches max_iters. It once printed "done ... best val loss" (the untrained value) with exit 0; it is
    exit status 3, naming the last good checkpoint (none here)."""
    out = str(tmp_path / "run")
    p = run_train(HRM + ["--max_iters=4", "--eval_interval=2", "--learning_rate=1e6", "--warmup_iters=0",
                         "--decay_lr=False", "--max_nonfinite=10"], data_dir, out, check=False)
    assert p.returncode == 3 and "done:" not in p.stdout, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert p.stderr.strip().splitlines()[-1] == ("train.py: error: the last 3 iteration(s) up to iter 4 were all "
                                                 "non-finite (steps skipped); last good checkpoint: none (no "
                                                 "evaluation beat the initial model)"), p.stderr


# slow (CI time): the diverged-model test above checks the skip, the stop and exit status 3 in CI, on a run
# with no good checkpoint; only this one stops a run that has one, which the message names, and checks that
# ckpt_last.dcp keeps that last finite model
@pytest.mark.slow
def test_non_finite_iterations_are_skipped_then_stop(data_dir, tmp_path):
    out = str(tmp_path / "run")
    run_train(HRM + ["--max_iters=2", "--eval_interval=2"], data_dir, out)
    good = last_state(out)
    # an absurd learning rate: the first step makes the weights ~1e30, every later loss is NaN
    p = run_train(HRM + ["--max_iters=20", "--eval_interval=2", "--init_from=resume", "--learning_rate=1e30",
                         "--warmup_iters=0", "--decay_lr=False", "--max_nonfinite=3"], data_dir, out, check=False)
    assert p.returncode == 3, p.stdout + p.stderr
    assert "step skipped (1 in a row, 1 in all)" in p.stdout
    assert "stopping at iter 5: 3 non-finite iterations in a row" in p.stderr
    assert f"last good checkpoint: {os.path.join(out, 'ckpt.pt')} (iter 2, val loss" in p.stderr, p.stderr
    after = last_state(out)
    assert after["iter_num"] == 2                        # the NaN model was never saved
    for k in good["model"]:
        assert torch.equal(good["model"][k], after["model"][k])
    log = raw_log(out)
    assert log[-1]["iter"] == 4 and log[-1]["skipped"] == 1   # iteration 3 was skipped before the eval at 4


# --- a run written by an earlier version of the code (tests/data/run_758bc35): its log pins the schedule, the
# micro-batches, the targets' shift and the evaluation split; its ckpt.pt still samples and analyses -----------

LEGACY_DIR = os.path.join(ROOT, "tests", "data", "run_758bc35")
LEGACY = ["config/char_hrm.py", *TINY, "--dataset=shakespeare_char", "--n_embd=16", "--n_head=2", "--eval_interval=2"]
"""The settings of the run in tests/data/run_758bc35, made at commit 758bc35 by

    prepare.prepare_chars(prepare.shakespeare_plays()[:5], "/tmp/legacy/data/shakespeare_char")
    python train.py *LEGACY --data_dir=/tmp/legacy/data --out_dir=/tmp/legacy/run --max_iters=4

that is: train.py config/char_hrm.py, then conftest's TINY with --dataset=shakespeare_char --n_embd=16
--n_head=2 (after the config file, so that they win over it), --eval_interval=2 --max_iters=4. Its
resumed_to_6.jsonl is the line for iteration 6 in log.jsonl after the same command with --max_iters=6
--init_from=resume, on a copy of that run. Its ckpt_last.pt (the single-file resume state of that time) is no
longer read, so today's train.py runs the same commands afresh (test_a_fresh_run_reproduces_the_committed_log)."""


@pytest.fixture
def legacy_run(tmp_path):
    """A copy of the old run's out_dir: its checkpoints and log."""
    out = str(tmp_path / "legacy")
    os.makedirs(out)
    for name in ("ckpt.pt", "log.jsonl"):
        shutil.copy(os.path.join(LEGACY_DIR, name), out)
    return out


def committed(name):
    with open(os.path.join(LEGACY_DIR, name)) as f:
        return [{k: v for k, v in json.loads(line).items() if k != "time_s"} for line in f]


def without_time_and_alphas(rows):   # the alphas: logged since issue 47, not by the code that made the log
    return [{k: v for k, v in r.items() if k not in ("time_s", "alpha_L", "alpha_H")} for r in rows]


@pytest.mark.parametrize("fsdp", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_fresh_run_reproduces_the_committed_log(char_data, tmp_path, fsdp):
    """The committed run's commands, run today: its log lines (iterations 0, 2, 4) and, resumed to 6 (under FSDP on
    one rank too), the line the old code wrote there. To float32 rounding: they were written on another CPU, where
    float digits move (ATEN_CPU_CAPABILITY=default here moves them by 1e-7 relative); a change in the schedule, the
    batches, the targets' shift, the evaluation split or a resume that lost state is 1e-3 off or more."""
    out = str(tmp_path / "run")
    run_train(LEGACY + [f"--data_dir={char_data}", f"--out_dir={out}", "--max_iters=4"], char_data, out)
    assert without_time_and_alphas(raw_log(out)) == [pytest.approx(r, rel=1e-5) for r in committed("log.jsonl")]
    p = run_train(LEGACY + [f"--data_dir={char_data}", f"--out_dir={out}", "--max_iters=6", "--init_from=resume"] +
                  ["--fsdp=True"] * fsdp, char_data, out, nproc=1 if fsdp else None)
    assert "max_iters 4 -> 6" in p.stdout, p.stdout
    log = raw_log(out)
    assert [r["iter"] for r in log] == [0, 2, 4, 6]
    assert without_time_and_alphas(log[-1:]) == [pytest.approx(committed("resumed_to_6.jsonl")[0], rel=1e-5)]
    sd = last_state(out)["model"]
    assert {k: log[-1][k] for k in ("alpha_L", "alpha_H")} == {"alpha_L": sd["L_net.alpha"].item(),
                                                                "alpha_H": sd["H_net.alpha"].item()}


def test_legacy_checkpoint_samples(legacy_run):
    """sample.py loads the old ckpt.pt and prints text in its characters."""
    s = run_script("sample.py", f"--out_dir={legacy_run}", "--start=ROMEO:", "--num_samples=1", "--max_new_tokens=40",
                   "--temperature=0")
    assert s.returncode == 0, s.stderr
    text = s.stdout.split("---------------")[0]
    chars = torch.load(os.path.join(legacy_run, "ckpt.pt"), weights_only=True)["meta"]["chars"]
    assert text.startswith("ROMEO:") and len(text.rstrip("\n")) >= 40 + len("ROMEO:") - 1, text
    assert set(text) <= set(chars)


def test_legacy_checkpoint_analyses(legacy_run, char_data, tmp_path, capsys):
    """analyze.py reads the old ckpt.pt: the M = 4 steps, the firings at 2 and 4, the fusion weights."""
    from tools import analyze
    out = tmp_path / "a.json"
    analyze.main([f"--out_dir={legacy_run}", f"--data_dir={char_data}", "--batches=2", f"--json={out}"])
    assert "HLRole(A)" in capsys.readouterr().out
    r = json.loads(out.read_text())
    assert [s["step"] for s in r["steps"]] == [1, 2, 3, 4]
    assert [s["h_fired"] for s in r["steps"]] == [False, True, False, True]
    assert sum(r["fusion"].values()) == pytest.approx(1.0, abs=1e-5)
    assert abs(r["ce"] - raw_log(legacy_run)[-1]["val_loss"]) < 1.0


# --- a full disk, for real (a small tmpfs) and as torch's zip writer reports it ------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A folder on its own small tmpfs (mounting needs root: skipped with the reason where not permitted);
    yields a function that mounts it at a given size."""
    mounts = []

    def mount(size):
        d = tmp_path / f"disk{len(mounts)}"
        d.mkdir()
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True,
                           text=True, timeout=60)
        if p.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({(p.stderr or 'mount failed').strip()[:120]})")
        mounts.append(d)
        return d
    yield mount
    for d in mounts:
        subprocess.run(["umount", "-l", str(d)], capture_output=True, timeout=60)


def fill(folder):
    """Take every free byte of folder's file system."""
    with open(os.path.join(folder, "filler"), "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_full_disk_on_save_is_one_line(small_disk, char_data):
    disk = small_disk("200k")   # ckpt.pt (87 KB) fits, ckpt_last.dcp (495 KB) does not
    out = str(disk / "run")
    p = run_train(char_tiny(out, "--max_iters=4"), char_data, out, check=False)
    line = one_error_line(p, code=1)
    assert f"cannot save {out}/ckpt_last.dcp/iter_000002" in line and "No space left on device" in line, line
    assert f"intact: {out}/ckpt.pt (iter 2)" in line, line
    assert sorted(os.listdir(out)) == [".lock", "ckpt.pt", "ckpt_last.dcp", "log.jsonl"]
    assert os.listdir(os.path.join(out, "ckpt_last.dcp")) == []   # no half-written state left filling the disk


def test_full_disk_on_a_sharded_save_leaves_no_temporary(small_disk, char_data):
    """FSDP's resume state on a full disk: one line (exit 1), and its half-written folder is gone before the exit
    (it once stayed, 10 MB on the full disk, until the next start)."""
    disk = small_disk("300k")   # ckpt.pt (84 KB) fits, the sharded state (about 250 KB with its index) does not
    out = str(disk / "run")
    p = run_train(char_tiny(out, "--max_iters=4", "--fsdp=True"), char_data, out, check=False, nproc=1)
    lines = [l for l in p.stderr.splitlines() if l.startswith("train.py")]
    assert p.returncode != 0 and len(lines) == 1 and f"cannot save {out}/ckpt_last.dcp/iter_000002" in lines[0], p.stderr
    assert not [n for n in os.listdir(out) if ".tmp" in n] and os.listdir(os.path.join(out, "ckpt_last.dcp")) == []


@pytest.mark.slow   # CI time: CI fills a real disk on save, and on prepare's staging folder
def test_full_disk_on_resume_is_one_line_and_keeps_the_log(small_disk, char_data):
    disk = small_disk("1500k")   # two resume states (a save writes the new one beside the old), ckpt.pt, the log
    out = str(disk / "run")
    run_train(char_tiny(out, "--max_iters=4"), char_data, out)
    before = snapshot(out, skip=(".lock",))
    fill(disk)
    p = run_train(char_tiny(out, "--max_iters=6", "--init_from=resume"), char_data, out, check=False)
    line = one_error_line(p, code=2)
    assert "No space left on device" in line and "iter_000004 (iter 4)" in line, line
    assert snapshot(out, skip=(".lock",)) == before and not [n for n in os.listdir(out) if ".tmp." in n]
    os.remove(disk / "filler")   # with room again, the same command resumes
    run_train(char_tiny(out, "--max_iters=6", "--init_from=resume"), char_data, out)
    assert [r["iter"] for r in raw_log(out)] == [0, 2, 4, 6]


def test_full_disk_in_prepare_is_one_line(small_disk):
    disk = small_disk("1m")   # the character dataset is 10 MB
    p = run_script("prepare.py", "--dataset=shakespeare_char", f"--data_dir={disk}")
    line = one_error_line(p, code=1, prog="prepare.py")   # a write that failed: exit status 1, as every script
    assert "No space left on device" in line and "left as it was" in line, line
    assert os.listdir(disk) == []   # the staging folder went too


def test_zip_writer_error_is_one_line(trained, data_dir, tmp_path):
    """torch's zip writer reports a full disk as RuntimeError ("unexpected pos ..."), not OSError."""
    out = copy_run(trained, tmp_path)
    before = snapshot(out, skip=(".lock",))
    p = faulty_train(HRM + ["--max_iters=6", "--eval_interval=2", "--init_from=resume"], data_dir, out, tmp_path,
                     "zip", 1)
    line = one_error_line(p, code=1)
    assert "cannot save" in line and "unexpected pos" in line and "intact:" in line, line
    assert not [n for n in os.listdir(out) if ".tmp." in n]
    assert {k: v for k, v in snapshot(out, skip=(".lock",)).items() if k.startswith("ckpt")} == \
        {k: v for k, v in before.items() if k.startswith("ckpt")}


# --- damaged checkpoints on resume: one line that names what does not fit ---------------------------------

@pytest.mark.parametrize("damage,words", [
    ("shape", ["does not fit this model", "Size mismatch", "L_net.gate.weight"]),
    ("groups", ["does not fit this model", "AdamW parameter groups"]),
    pytest.param("missing", ["does not fit this model", "Missing key", "fusion.tau"], marks=pytest.mark.slow),
    pytest.param("moment", ["does not fit this model", "Size mismatch", "exp_avg"], marks=pytest.mark.slow),
])
def test_damaged_checkpoint_on_resume_names_what_does_not_fit(trained, data_dir, tmp_path, damage, words):
    out = copy_run(trained, tmp_path)
    ck = last_state(out)
    if damage == "shape":
        ck["model"]["L_net.gate.weight"] = ck["model"]["L_net.gate.weight"][:, :5].clone()
    elif damage == "missing":
        del ck["model"]["fusion.tau"]
    elif damage == "groups":
        ck["param_groups"] = ck["param_groups"][:1]
    else:
        ck["optimizer"]["state"]["wte.weight"]["exp_avg"] = ck["optimizer"]["state"]["wte.weight"]["exp_avg"][:3].clone()
    save_last(ck, out)
    before = snapshot(out, skip=(".lock",))
    line = one_error_line(run_train(HRM + ["--max_iters=6", "--eval_interval=2", "--init_from=resume"], data_dir,
                                    out, check=False))
    assert all(w in line for w in words) and line.count("does not fit this model") == 1, line
    assert snapshot(out, skip=(".lock",)) == before


def test_sample_names_the_tensor_that_does_not_fit(trained, tmp_path):
    out = copy_run(trained, tmp_path)
    ck = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    ck["model"]["H_net.proj_out.weight"] = torch.zeros(3, 3)
    save_ckpt(ck, os.path.join(out, "ckpt.pt"))
    line = one_error_line(run_script("sample.py", f"--out_dir={out}", "--max_new_tokens=2"), prog="sample.py")
    assert "size mismatch for H_net.proj_out.weight" in line, line


# --- a signal during a long evaluation saves at once; the resume evaluates that iteration ------------------

@pytest.mark.slow   # CI time (15 s): CI's signal test saves and resumes at an iteration boundary
def test_signal_during_an_evaluation_saves_and_resume_evaluates(char_data, tmp_path):
    """SIGTERM inside iteration 2's evaluation: saved at once, and the resume evaluates iteration 2 first, logging
    what the uninterrupted run logs there, grad_norm included (it once logged null: the norm was not saved)."""
    ref, out = str(tmp_path / "ref"), str(tmp_path / "run")
    args = ["--max_iters=4", "--eval_interval=2", "--eval_iters=400"]   # an evaluation of a second or two
    run_train(char_tiny(ref, *args), char_data, ref)
    proc = subprocess.Popen(train_cmd(char_tiny(out, *args), char_data, out), cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    read_until(proc, "step 0:", timeout=120)   # two iterations (milliseconds), then iteration 2's evaluation
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "stopped by SIGTERM at iter 2" in err, err
    ck = last_state(out)
    assert ck["iter_num"] == 2 and ck["eval_pending"] is True   # stopped inside the evaluation, not after it
    assert [r["iter"] for r in raw_log(out)] == [0]
    run_train(char_tiny(out, *args, "--init_from=resume"), char_data, out)
    a, b = by_iter(ref), by_iter(out)
    assert sorted(b) == [0, 2, 4] and b[2]["grad_norm"] is not None
    for it in (2, 4):
        assert {k: a[it][k] for k in ("train_loss", "val_loss", "grad_norm", "lr")} == \
            {k: b[it][k] for k in ("train_loss", "val_loss", "grad_norm", "lr")}, it


def test_atomic_write_is_whole_or_nothing(tmp_path):
    """common.atomic_write, the one writer of checkpoints, logs rewritten on resume and the runners' JSON: an error
    (or a signal) mid-write leaves the old file as it was and no temporary; success replaces it."""
    from hrmlm.common import atomic_write
    path = tmp_path / "f.json"
    path.write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_write(str(path)) as f:
            f.write("half of the new")
            raise KeyboardInterrupt
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["f.json"]
    with atomic_write(str(path)) as f:
        f.write("new")
    assert path.read_text() == "new" and os.listdir(tmp_path) == ["f.json"]
