"""Issue 5: exact resume, crash-safe checkpoints, safe loading, non-finite losses, early errors, DDP == 1 process."""

import os
import signal
import time

import pytest
import torch

from conftest import faulty_train, read_log, run_train

HRM = ["--arch=hrm", "--N=2", "--T=2", "--K=2"]
FIXED = ["--eval_interval=2", "--lr_decay_iters=8", "--gradient_accumulation_steps=2"]


@pytest.mark.slow   # CI time: test_faults_train's signal test resumes bit for bit in CI
def test_exact_resume(data_dir, tmp_path):
    """Stop at 3, resume to 8 == run to 8 in one go: same losses and weights, to the bit."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    run_train(HRM + FIXED + ["--max_iters=8"], data_dir, a)
    run_train(HRM + FIXED + ["--max_iters=3"], data_dir, b)
    assert torch.load(os.path.join(b, "ckpt_last.pt"), weights_only=True)["iter_num"] == 3
    run_train(HRM + FIXED + ["--max_iters=8", "--init_from=resume"], data_dir, b)
    la = {r["iter"]: r for r in read_log(a)}
    lb = {r["iter"]: r for r in read_log(b)}
    assert sorted(lb) == [0, 2, 3, 4, 6, 8]          # the resumed run does not log iteration 3 twice
    for it in (4, 6, 8):
        for key in ("train_loss", "val_loss", "grad_norm", "lr"):
            assert la[it][key] == lb[it][key], (it, key)  # bitwise on CPU float32
    wa = torch.load(os.path.join(a, "ckpt_last.pt"), weights_only=True)
    wb = torch.load(os.path.join(b, "ckpt_last.pt"), weights_only=True)
    for k in wa["model"]:
        assert torch.equal(wa["model"][k], wb["model"][k]), k
    for key in ("iter_num", "best_val_loss"):
        assert wa[key] == wb[key]


@pytest.mark.slow   # CI time: test_faults_train's failed-save test covers the atomic save
def test_sigkill_during_save_keeps_previous_checkpoint(data_dir, tmp_path):
    out = str(tmp_path / "run")
    run_train(HRM + ["--max_iters=2", "--eval_interval=2"], data_dir, out)
    before = torch.load(os.path.join(out, "ckpt_last.pt"), weights_only=True)
    marker = str(tmp_path / "writing")
    # resume to 4; the 2nd save of that run (ckpt_last.pt at iter 4) hangs halfway and gets SIGKILL
    proc = faulty_train(HRM + ["--max_iters=4", "--eval_interval=2", "--init_from=resume",
                               "--always_save_checkpoint=True"], data_dir, out, tmp_path, "hang", 2, marker, wait=False)
    deadline = time.time() + 120
    while not os.path.exists(marker):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    after = torch.load(os.path.join(out, "ckpt_last.pt"), weights_only=True)   # still loadable
    assert after["iter_num"] == before["iter_num"] == 2
    for k in before["model"]:
        assert torch.equal(before["model"][k], after["model"][k])
    assert any(n.startswith("ckpt_last.pt.tmp") for n in os.listdir(out))     # the half-written file
    run_train(HRM + ["--max_iters=4", "--eval_interval=2", "--init_from=resume"], data_dir, out)
    assert torch.load(os.path.join(out, "ckpt_last.pt"), weights_only=True)["iter_num"] == 4


@pytest.mark.slow   # CI time: test_faults_train's diverged-model test covers ckpt.pt's rule
def test_best_and_last_checkpoints_are_kept_apart(data_dir, tmp_path):
    out = str(tmp_path / "run")
    run_train(HRM + ["--max_iters=4", "--eval_interval=2"], data_dir, out)
    # then a learning rate far too high: val gets worse, so ckpt.pt (best) and ckpt_last.pt part ways
    run_train(HRM + ["--max_iters=8", "--eval_interval=2", "--init_from=resume", "--learning_rate=0.1",
                     "--warmup_iters=0", "--decay_lr=False"], data_dir, out)
    best = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    last = torch.load(os.path.join(out, "ckpt_last.pt"), weights_only=True)
    log = {r["iter"]: r["val_loss"] for r in read_log(out) if r["iter"] > 0}
    assert last["iter_num"] == 8
    assert best["iter_num"] == min(log, key=log.get) != 8
    assert best["best_val_loss"] == min(log.values())


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("trained"))
    run_train(HRM + ["--max_iters=2", "--eval_interval=2"], data_dir, out)
    return out


def test_truncated_checkpoint_is_named(trained, data_dir, tmp_path):
    out = str(tmp_path / "t")
    os.makedirs(out)
    data = open(os.path.join(trained, "ckpt_last.pt"), "rb").read()
    open(os.path.join(out, "ckpt_last.pt"), "wb").write(data[: len(data) // 2])
    p = run_train(HRM + ["--max_iters=4", "--init_from=resume"], data_dir, out, check=False)
    assert p.returncode == 2 and "cannot load" in p.stderr and "ckpt_last.pt" in p.stderr


def test_other_architecture_is_named(trained, data_dir):
    p = run_train(["--arch=transformer", "--max_iters=4", "--init_from=resume"], data_dir, trained, check=False)
    assert p.returncode == 2
    assert "holds a different model: arch='hrm' in the checkpoint vs 'transformer' now" in p.stderr
    p = run_train(HRM + ["--n_embd=64", "--max_iters=4", "--init_from=resume"], data_dir, trained, check=False)
    assert p.returncode == 2 and "n_embd=32 in the checkpoint vs 64 now" in p.stderr


def test_pickled_code_is_refused(trained, data_dir, tmp_path):
    """weights_only=True: a checkpoint carrying an arbitrary object is refused, and its code never runs."""
    out = str(tmp_path / "evil")
    os.makedirs(out)
    ck = torch.load(os.path.join(trained, "ckpt_last.pt"), weights_only=True)
    flag = tmp_path / "pwned"
    ck["payload"] = Evil(str(flag))
    torch.save(ck, os.path.join(out, "ckpt_last.pt"))
    p = run_train(HRM + ["--max_iters=4", "--init_from=resume"], data_dir, out, check=False)
    assert p.returncode == 2 and "holds Python objects other than tensors" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not flag.exists()


class Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.mark.slow   # CI time: test_faults_train's diverged-model test runs in CI
def test_non_finite_iterations_are_skipped_then_stop(data_dir, tmp_path):
    out = str(tmp_path / "run")
    run_train(HRM + ["--max_iters=2", "--eval_interval=2"], data_dir, out)
    good = torch.load(os.path.join(out, "ckpt_last.pt"), weights_only=True)
    # an absurd learning rate: the first step makes the weights ~1e30, every later loss is NaN
    p = run_train(HRM + ["--max_iters=20", "--eval_interval=2", "--init_from=resume", "--learning_rate=1e30",
                         "--warmup_iters=0", "--decay_lr=False", "--max_nonfinite=3"], data_dir, out, check=False)
    assert p.returncode == 3, p.stdout + p.stderr
    assert "step skipped (1 in a row, 1 in all)" in p.stdout
    assert "stopping at iter 5: 3 non-finite iterations in a row" in p.stdout
    assert f"last good checkpoint: {os.path.join(out, 'ckpt.pt')} (iter 2, val loss" in p.stdout, p.stdout
    after = torch.load(os.path.join(out, "ckpt_last.pt"), weights_only=True)
    assert after["iter_num"] == 2                        # the NaN model was never saved
    for k in good["model"]:
        assert torch.equal(good["model"][k], after["model"][k])
    log = read_log(out)
    assert log[-1]["iter"] == 4 and log[-1]["skipped"] == 1   # iteration 3 was skipped before the eval at 4


@pytest.mark.slow   # CI time: tests/test_fsdp.py checks 2 ranks == 1 process (the same micro-batch split) in CI
def test_ddp_equals_one_process(data_dir, tmp_path):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    args = HRM + ["--max_iters=4", "--eval_interval=2", "--gradient_accumulation_steps=2", "--eval_iters=4"]
    run_train(args, data_dir, one)
    run_train(args, data_dir, two, nproc=2)
    l1, l2 = read_log(one), read_log(two)
    assert [r["iter"] for r in l1] == [r["iter"] for r in l2] == [0, 2, 4]
    for r1, r2 in zip(l1, l2):
        for key in ("train_loss", "val_loss"):
            assert abs(r1[key] - r2[key]) < 1e-5, (r1, r2)
    assert l1[-1]["val_loss"] < l1[0]["val_loss"]


def test_ddp_config_error_on_every_rank(data_dir, tmp_path):
    # 3 micro-batches of 3 sequences cannot be shared out evenly over 2 ranks (4 of 4 would be: see below)
    p = run_train(HRM + ["--max_iters=2", "--gradient_accumulation_steps=3", "--batch_size=3"], data_dir,
                  str(tmp_path), check=False, nproc=2)
    assert p.returncode != 0
    lines = [l for l in p.stderr.splitlines() if l.startswith("train.py: error")]
    assert sorted(l.split(":")[1].strip() for l in lines) == ["error (rank 0)", "error (rank 1)"], p.stderr
    assert all(l.endswith("must be a positive multiple of the world size 2 (it counts global micro-batches)")
               for l in lines)
    assert "step 0" not in p.stdout


@pytest.mark.slow   # CI time: the README's torchrun line runs a one-rank config on 2 ranks
def test_ddp_splits_a_one_rank_config(data_dir, tmp_path):
    """A config written for one process (1 micro-batch of 4) runs on 2 ranks with the same global batch."""
    p = run_train(HRM + ["--max_iters=2", "--eval_interval=2", "--gradient_accumulation_steps=1"], data_dir,
                  str(tmp_path / "run"), nproc=2)
    assert "note: 2 ranks: gradient_accumulation_steps 1 -> 2, batch_size 4 -> 2 (the same global batch)" in p.stdout
    assert "8 x 32, 2 rank(s)" not in p.stdout and "2 x 2 x 32, 2 rank(s)" in p.stdout, p.stdout
