"""train.py on 2 gloo processes: FSDP2 (--fsdp=True) gives the numbers of one process, resumes exactly, and
writes the one checkpoint format that DDP, FSDP and a single process all read; DDP gives the numbers of one
process; a config error stops every rank with one line each."""

import os

import pytest
import torch

from checkpoint import load_checkpoint, model_from_checkpoint
from conftest import HRM, ROOT, by_iter, copy_run, one_error_line, raw_log, run_train

# --- FSDP ----------------------------------------------------------------------------------------------

FSDP_ARGS = HRM + ["--gradient_accumulation_steps=2", "--eval_interval=3", "--lr_decay_iters=6"]


def losses(out):
    return {it: (r["train_loss"], r["val_loss"], r["grad_norm"]) for it, r in by_iter(out).items()}


def close(a, b, tol):
    """Losses within tol; the grad norm within 1e-3 relative: torch's float32 norm of the 50257 x 32 embedding
    gradient is itself off by ~1e-4 on the CPU, and FSDP sums two shards' norms (more accurately)."""
    (la, va, ga), (lb, vb, gb) = a, b
    return abs(la - lb) <= tol and abs(va - vb) <= tol and (ga is None or abs(ga - gb) <= 1e-3 * ga)


# slow (CI time, 40 s of three 2-process runs): CI keeps test_fsdp_needs_torchrun and the DDP tests below;
# run before touching parallel.fully_shard_model, parallel.full_state or the FSDP resume path
@pytest.mark.slow
def test_fsdp_matches_one_process_and_resumes_exactly(data_dir, tmp_path):
    one, full, part = (str(tmp_path / n) for n in ("one", "fsdp", "fsdp_resumed"))
    run_train(FSDP_ARGS + ["--max_iters=6"], data_dir, one)
    run_train(FSDP_ARGS + ["--max_iters=6", "--fsdp=True"], data_dir, full, nproc=2)
    ref, got = losses(one), losses(full)
    assert sorted(ref) == sorted(got) == [0, 3, 6]
    for it in ref:
        assert close(ref[it], got[it], 1e-5), (it, ref[it], got[it])
    assert got[6][1] < got[0][1]

    # stop at 3, resume under FSDP: the same numbers as the uninterrupted FSDP run, to the bit
    run_train(FSDP_ARGS + ["--max_iters=3", "--fsdp=True"], data_dir, part, nproc=2)
    ckpt = load_checkpoint(os.path.join(part, "ckpt_last.pt"))
    single = torch.load(os.path.join(one, "ckpt_last.pt"), weights_only=True)
    assert ckpt["model"].keys() == single["model"].keys()            # the one format: full tensors, same names
    assert all(ckpt["model"][k].shape == single["model"][k].shape for k in single["model"])   # alpha, tau 0-d
    assert sorted(ckpt["optimizer"]["state"]) == sorted(single["optimizer"]["state"])         # positional keys
    assert all(ckpt["optimizer"]["state"][i][k].shape == v.shape                    # alpha's moments 0-d too
               for i, st in single["optimizer"]["state"].items() for k, v in st.items())
    model_from_checkpoint(ckpt)                                       # sample.py and analyze.py load it
    run_train(FSDP_ARGS + ["--max_iters=6", "--fsdp=True", "--init_from=resume"], data_dir, part, nproc=2)
    res = losses(part)
    for it in (3, 6):
        assert res[it] == got[it], (it, res[it], got[it])
    a = torch.load(os.path.join(full, "ckpt_last.pt"), weights_only=True)["model"]
    b = torch.load(os.path.join(part, "ckpt_last.pt"), weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


# slow: two more 2-process runs (CI time). CI checks above that FSDP writes the one format a single process
# reads; only this one resumes across the three (a DDP run under FSDP, an FSDP run in one process)
@pytest.mark.slow
def test_resume_across_ddp_fsdp_and_one_process(data_dir, tmp_path):
    """A DDP run resumed under FSDP, and an FSDP run resumed by one process, go on as one process would."""
    one, ddp, fsdp = (str(tmp_path / n) for n in ("one", "ddp", "fsdp"))
    run_train(FSDP_ARGS + ["--max_iters=6"], data_dir, one)
    run_train(FSDP_ARGS + ["--max_iters=3"], data_dir, ddp, nproc=2)
    run_train(FSDP_ARGS + ["--max_iters=6", "--fsdp=True", "--init_from=resume"], data_dir, ddp, nproc=2)
    run_train(FSDP_ARGS + ["--max_iters=3", "--fsdp=True"], data_dir, fsdp, nproc=2)
    run_train(FSDP_ARGS + ["--max_iters=6", "--init_from=resume"], data_dir, fsdp)
    ref = losses(one)
    for out in (ddp, fsdp):
        assert close(ref[6], losses(out)[6], 1e-5), (out, ref[6], losses(out)[6])


def test_fsdp_needs_torchrun(data_dir, tmp_path):
    p = run_train(FSDP_ARGS + ["--max_iters=1", "--fsdp=True"], data_dir, str(tmp_path), check=False)
    assert one_error_line(p).startswith("train.py: error: fsdp=True shards the model over torchrun's processes")


# --- DDP -----------------------------------------------------------------------------------------------

# slow (CI time): CI's FSDP test above checks 2 ranks == 1 process with the same micro-batch split; only this
# one checks DDP's own path (the DDP wrapper, no_sync over the micro-batches, the all-reduced gradient)
@pytest.mark.slow
def test_ddp_equals_one_process(data_dir, tmp_path):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    args = HRM + ["--max_iters=4", "--eval_interval=2", "--gradient_accumulation_steps=2", "--eval_iters=4"]
    run_train(args, data_dir, one)
    run_train(args, data_dir, two, nproc=2)
    l1, l2 = raw_log(one), raw_log(two)
    assert [r["iter"] for r in l1] == [r["iter"] for r in l2] == [0, 2, 4]
    for r1, r2 in zip(l1, l2):
        for key in ("train_loss", "val_loss"):
            assert abs(r1[key] - r2[key]) < 1e-5, (r1, r2)
    assert l1[-1]["val_loss"] < l1[0]["val_loss"]


def test_ddp_config_error_on_every_rank(data_dir, tmp_path):
    """An error every rank finds (3 micro-batches of 3 sequences cannot be shared out over 2 ranks) is one line,
    from rank 0; every rank stops before work."""
    p = run_train(HRM + ["--max_iters=2", "--gradient_accumulation_steps=3", "--batch_size=3"], data_dir,
                  str(tmp_path / "o"), check=False, nproc=2)
    assert p.returncode != 0
    lines = [l for l in p.stderr.splitlines() if l.startswith("train.py")]
    assert len(lines) == 1 and lines[0].startswith("train.py: error: gradient_accumulation_steps=3 must be a "
                                                   "positive multiple of the world size 2"), p.stderr[-3000:]
    assert "step 0" not in p.stdout and not (tmp_path / "o").exists()
    assert 'File "' + os.path.join(ROOT, "train.py") not in p.stderr   # torchrun's traceback only, none of ours


# slow (CI time): the only test of a config written for fewer ranks (1 micro-batch) split over 2 (the README's
# torchrun line runs a 6-micro-batch config, which needs no split)
@pytest.mark.slow
def test_ddp_splits_a_one_rank_config(data_dir, tmp_path):
    """A config written for one process (1 micro-batch of 4) runs on 2 ranks with the same global batch."""
    p = run_train(HRM + ["--max_iters=2", "--eval_interval=2", "--gradient_accumulation_steps=1"], data_dir,
                  str(tmp_path / "run"), nproc=2)
    assert "note: 2 ranks: gradient_accumulation_steps 1 -> 2, batch_size 4 -> 2 (the same global batch)" in p.stdout
    assert "8 x 32, 2 rank(s)" not in p.stdout and "2 x 2 x 32, 2 rank(s)" in p.stdout, p.stdout



def test_resume_on_more_ranks_that_would_split_is_one_line(trained, data_dir, tmp_path):
    """1 micro-batch of 4 saved on 1 rank cannot resume on 2 without splitting it (other tokens): one line."""
    out = copy_run(trained, tmp_path)
    p = run_train(HRM + ["--max_iters=6", "--eval_interval=2", "--init_from=resume"], data_dir, out, check=False,
                  nproc=2)
    ours = [l for l in p.stderr.splitlines() if l.startswith("train.py")]
    assert len(ours) == 1 and "would split" in ours[0] and "divides 1: 1" in ours[0], p.stderr[-3000:]


@pytest.mark.slow   # two 2-rank runs; CI checks the refusal above and DDP == one process in test_fsdp_matches_...
def test_resume_on_fewer_ranks_keeps_the_micro_batches(data_dir, tmp_path):
    """2 ranks -> 1 keeps the checkpoint's micro-batches (2 x 2, split from 1 x 4): the same tokens."""
    two = str(tmp_path / "two")
    run_train(HRM + ["--max_iters=2", "--eval_interval=2"], data_dir, two, nproc=2)   # 1 x 4 split into 2 x 2
    p = run_train(HRM + ["--max_iters=4", "--eval_interval=2", "--init_from=resume"], data_dir, two)
    assert "resuming with the checkpoint's micro-batches" in p.stdout, p.stdout
    ref = str(tmp_path / "ref")   # one process running the 2 x 2 micro-batches from the start
    run_train(HRM + ["--max_iters=4", "--eval_interval=2", "--gradient_accumulation_steps=2", "--batch_size=2"],
              data_dir, ref)
    a, b = by_iter(two), by_iter(ref)
    assert a.keys() == b.keys() == {0, 2, 4}
    for i in a:
        assert a[i]["val_loss"] == pytest.approx(b[i]["val_loss"], abs=1e-5), (i, a[i], b[i])
