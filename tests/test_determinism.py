"""The same train.py command twice on one machine with one thread count: the same run to the bit (CPU, float32).

This is what the README's quick-start table rests on. Across CPUs or thread counts float32 sums round
differently in the last digits, and training amplifies that; those differences are bounded by the
tolerances of tests/test_docs.py's quick-start check, not here.
"""

import os

import torch

from conftest import HRM, last_state, raw_log, run_train

# character data as in the quick start; HRM (M = 4, K = 2); warmup, then decay; evaluations and saves at 0, 4, 8, 12
ARGS = HRM + ["--dataset=shakespeare_char", "--max_iters=12", "--eval_interval=4", "--lr_decay_iters=12"]


def tensors(obj, path=""):
    """{path: tensor} for every tensor in a (nested) checkpoint: the weights and AdamW's state."""
    if isinstance(obj, torch.Tensor):
        return {path: obj}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    return {k: v for key, sub in items for k, v in tensors(sub, f"{path}/{key}").items()}


def assert_same_run(a, b):
    """Two run folders hold the same run: every log.jsonl float equal (==, not close; time_s is wall time)
    and every checkpoint tensor equal (torch.equal)."""
    log_a, log_b = ([{k: v for k, v in row.items() if k != "time_s"} for row in raw_log(d)] for d in (a, b))
    assert [r["iter"] for r in log_a] == [0, 4, 8, 12]
    assert log_a == log_b, (log_a, log_b)
    for name in ("ckpt.pt", "ckpt_last.dcp"):
        ca, cb = (last_state(d) if name == "ckpt_last.dcp" else torch.load(os.path.join(d, name), weights_only=True)
                  for d in (a, b))
        ta, tb = tensors(ca), tensors(cb)
        assert ta.keys() == tb.keys() and any(k.startswith("/model/") for k in ta), name
        assert name == "ckpt.pt" or any(k.startswith("/optimizer/state/") for k in ta), name
        differ = [k for k in ta if not torch.equal(ta[k], tb[k])]
        assert not differ, (name, differ)
        for key in ("iter_num", "best_val_loss", "best_iter"):
            assert ca[key] == cb[key], (name, key)


def test_the_same_command_twice_is_the_same_run_to_the_bit(char_data, tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    run_train(ARGS, char_data, a)   # conftest.ENV: OMP_NUM_THREADS=1 for both
    run_train(ARGS, char_data, b)
    assert_same_run(a, b)
