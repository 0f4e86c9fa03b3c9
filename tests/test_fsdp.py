"""train.py --fsdp=True (FSDP2, fully_shard) on 2 gloo processes: the numbers of one process, exact resume,
and the one checkpoint format that DDP, FSDP and a single process all read and write."""

import os

import pytest
import torch

from conftest import read_log, run_train
from checkpoint import load_checkpoint, model_from_checkpoint

HRM = ["--arch=hrm", "--N=2", "--T=2", "--K=2", "--gradient_accumulation_steps=2", "--eval_interval=3",
       "--lr_decay_iters=6"]


def losses(out):
    return {r["iter"]: (r["train_loss"], r["val_loss"], r["grad_norm"]) for r in read_log(out)}


def close(a, b, tol):
    """Losses within tol; the grad norm within 1e-3 relative: torch's float32 norm of the 50257 x 32 embedding
    gradient is itself off by ~1e-4 on the CPU, and FSDP sums two shards' norms (more accurately)."""
    (la, va, ga), (lb, vb, gb) = a, b
    return abs(la - lb) <= tol and abs(va - vb) <= tol and (ga is None or abs(ga - gb) <= 1e-3 * ga)


def test_fsdp_matches_one_process_and_resumes_exactly(data_dir, tmp_path):
    one, full, part = (str(tmp_path / n) for n in ("one", "fsdp", "fsdp_resumed"))
    run_train(HRM + ["--max_iters=6"], data_dir, one)
    run_train(HRM + ["--max_iters=6", "--fsdp=True"], data_dir, full, nproc=2)
    ref, got = losses(one), losses(full)
    assert sorted(ref) == sorted(got) == [0, 3, 6]
    for it in ref:
        assert close(ref[it], got[it], 1e-5), (it, ref[it], got[it])
    assert got[6][1] < got[0][1]

    # stop at 3, resume under FSDP: the same numbers as the uninterrupted FSDP run, to the bit
    run_train(HRM + ["--max_iters=3", "--fsdp=True"], data_dir, part, nproc=2)
    ckpt = load_checkpoint(os.path.join(part, "ckpt_last.pt"))
    single = torch.load(os.path.join(one, "ckpt_last.pt"), weights_only=True)
    assert ckpt["model"].keys() == single["model"].keys()            # the one format: full tensors, same names
    assert all(ckpt["model"][k].shape == single["model"][k].shape for k in single["model"])   # alpha, tau 0-d
    assert sorted(ckpt["optimizer"]["state"]) == sorted(single["optimizer"]["state"])         # positional keys
    assert all(ckpt["optimizer"]["state"][i][k].shape == v.shape                    # alpha's moments 0-d too
               for i, st in single["optimizer"]["state"].items() for k, v in st.items())
    model_from_checkpoint(ckpt)                                       # sample.py and analyze.py load it
    run_train(HRM + ["--max_iters=6", "--fsdp=True", "--init_from=resume"], data_dir, part, nproc=2)
    res = losses(part)
    for it in (3, 6):
        assert res[it] == got[it], (it, res[it], got[it])
    a = torch.load(os.path.join(full, "ckpt_last.pt"), weights_only=True)["model"]
    b = torch.load(os.path.join(part, "ckpt_last.pt"), weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow   # two more 2-process runs; CI keeps the FSDP run and its own resume above
def test_resume_across_ddp_fsdp_and_one_process(data_dir, tmp_path):
    """A DDP run resumed under FSDP, and an FSDP run resumed by one process, go on as one process would."""
    one, ddp, fsdp = (str(tmp_path / n) for n in ("one", "ddp", "fsdp"))
    run_train(HRM + ["--max_iters=6"], data_dir, one)
    run_train(HRM + ["--max_iters=3"], data_dir, ddp, nproc=2)
    run_train(HRM + ["--max_iters=6", "--fsdp=True", "--init_from=resume"], data_dir, ddp, nproc=2)
    run_train(HRM + ["--max_iters=3", "--fsdp=True"], data_dir, fsdp, nproc=2)
    run_train(HRM + ["--max_iters=6", "--init_from=resume"], data_dir, fsdp)
    ref = losses(one)
    for out in (ddp, fsdp):
        assert close(ref[6], losses(out)[6], 1e-5), (out, ref[6], losses(out)[6])


def test_fsdp_needs_torchrun(data_dir, tmp_path):
    p = run_train(HRM + ["--max_iters=1", "--fsdp=True"], data_dir, str(tmp_path), check=False)
    assert p.returncode == 2
    assert p.stderr.strip().startswith("train.py: error: fsdp=True shards the model over torchrun's processes")
