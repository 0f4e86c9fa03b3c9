"""
The runs more than one study reads, defined once, and the learning rates chosen for them from the committed logs: the
sweep's (sweep.py; long_run.py, kv_policies.py and alive.py start from it), the headline arms (equalparam.py; alive.py),
the long run's (long_run.py; kv_policies.py, alive.py) and beyond_paper.py's (alive.py trains them again).
"""

import math
import os
import sys

import report
import runner

SEEDS = [1337, 42, 2024]   # every study's test seeds, paired across its arms

# --- the sweep (sections 1-5): experiments/sweep.py ------------------------------------------------------------------
SWEEP_OUT = "out-sweep"
LRS = [3e-4, 1e-3, 3e-3, 1e-2]            # phase 1 grid: 1.5 decades, half-decade steps
GRID = [1e-5, 3e-5, 1e-4] + LRS + [3e-2, 1e-1, 3e-1]  # where a variant's best is at an edge, the grid grows that way
# variant: (config file, overrides). The first eight are v2's; the last four are controls that differ from
# a v2 variant in one thing each (docs/RESULTS.md section 3). The UniTF on BPE is widened to d=144 to
# match stored parameters.
CHAR = {
    "hrm-post": ("char_hrm", []), "hrm-pre": ("char_hrm", ["--norm=pre"]),
    "transformer-post": ("char_transformer", []), "transformer-pre": ("char_transformer", ["--norm=pre"]),
    "unitf-post": ("char_unitf", []), "unitf-pre": ("char_unitf", ["--norm=pre"]),
    "hrm_fast_only-post": ("char_hrm_fast_only", []), "unitf_full-post": ("char_unitf_full", []),
    "hrm_fast_only_wide-post": ("char_hrm_fast_only_wide", []), "unitf_d128-post": ("char_unitf_d128", []),
    # clip 1.0 for the recurrent models too (train.py clips them at grad_clip * K / M = grad_clip / 2)
    "hrm_clip1-post": ("char_hrm", ["--grad_clip=2.0"]), "unitf_clip1-post": ("char_unitf", ["--grad_clip=2.0"]),
    # HRM's input block alone with the tied head: what HRM computes when its output fusion reads only x~
    "transformer_l1-pre": ("char_transformer", ["--n_layer=1", "--norm=pre"]),
    # trained at a random depth per iteration (N' or M' uniform on 1..2D-1, mean D; Huginn's recipe), evaluated
    # at the trained depth: does a model that no single depth is special to use more steps at inference?
    "hrm_rdepth-post": ("char_hrm", ["--random_depth=True"]), "unitf_rdepth-post": ("char_unitf", ["--random_depth=True"]),
}
BPE = {
    "hrm-post": ("shakespeare_hrm", []), "hrm-pre": ("shakespeare_hrm", ["--norm=pre"]),
    "transformer-post": ("shakespeare_transformer", []), "transformer-pre": ("shakespeare_transformer", ["--norm=pre"]),
    "unitf-post": ("shakespeare_unitf", ["--n_embd=144"]), "unitf-pre": ("shakespeare_unitf", ["--n_embd=144", "--norm=pre"]),
    # the post-norm Transformer given HRM's untied d x d matrix before the tied logits (model.py's out_proj): is
    # that matrix what lets post-norm HRM escape the unigram plateau? Its grid starts where transformer-post's did
    "transformer_proj-post": ("shakespeare_transformer", ["--out_proj=True"]),
}
VARIANTS = {"char": CHAR, "bpe": BPE}
CHAR_LR_OF = {"transformer_proj-post": "transformer-post"}   # a BPE-only variant starts at this one's char best
SWEEP_ITERS = {"char": 400, "bpe": 400}   # the quick start's 400 iterations on both testbeds
K_ABLATION = [("hrm-post", [f"--K={k}"], f"-K{k}") for k in (1, 4)]   # (variant, overrides, out_dir suffix)


def lr_text(lr):
    """1.5e-3, 3e-3, 1.25e-2: the shortest exact mantissa (equalparam's grid steps by factors of 2)."""
    m, e = f"{lr:.3e}".split("e")
    return f"{m.rstrip('0').rstrip('.')}e{int(e)}"


def run_dir(testbed, variant, lr, seed, extra=""):
    return os.path.join(SWEEP_OUT, testbed, variant, f"lr{lr_text(lr)}-s{seed}{extra}")


def command(testbed, variant, lr, seed, extra_args=(), extra="", iters=None, out=SWEEP_OUT):
    """(out_dir, train.py command) of a sweep variant's run; other studies run it longer (iters) or elsewhere (out)."""
    cfg, over = VARIANTS[testbed][variant]
    out_dir = run_dir(testbed, variant, lr, seed, extra).replace(SWEEP_OUT, out, 1)
    n = iters or SWEEP_ITERS[testbed]
    cmd = [sys.executable, "train.py", f"config/{cfg}.py", *over, *extra_args, f"--learning_rate={lr}",
           f"--max_iters={n}", f"--lr_decay_iters={n}", f"--warmup_iters={n // 10}",
           f"--min_lr={lr / 10:.3g}", f"--seed={seed}", f"--out_dir={out_dir}", "--log_interval=100"]
    if n > 1000:
        cmd.append(f"--eval_interval={n // 20}")   # 21 points on a long curve
    return out_dir, cmd


def tried(testbed, variant):
    """The grid points this variant has a finished seed-1337 run at."""
    return [lr for lr in GRID if runner.finished(run_dir(testbed, variant, lr, SEEDS[0]))]


def best_lr(testbed, variant):
    vals = {lr: runner.final_val(run_dir(testbed, variant, lr, SEEDS[0])) for lr in tried(testbed, variant)}
    lr = min(vals, key=vals.get, default=None)
    return lr if lr is not None and math.isfinite(vals[lr]) else None


def settled(testbed, variant):
    """True when the variant's best lr is final: a worse finished lr on each side, or the grid's end."""
    lrs, lr = tried(testbed, variant), best_lr(testbed, variant)
    if lr is None or (testbed == "char" and not set(LRS) <= set(lrs)):
        return False
    i = GRID.index(lr)
    return (lr != lrs[-1] or i + 1 == len(GRID)) and (lr != lrs[0] or i == 0)


def best_runs(testbed, v):
    lr = best_lr(testbed, v)
    return [] if lr is None else [d for d in (run_dir(testbed, v, lr, s) for s in SEEDS) if runner.finished(d)]


def size_of(testbed, variant):
    """(stored parameters, counted training FLOPs per token) of a variant, from any finished run's facts."""
    for lr in GRID:
        f = runner.facts(run_dir(testbed, variant, lr, SEEDS[0]))
        if f and "params" in f:
            return f["params"], f["train_flops_per_token"]
    return None, None


def size_cells(testbed, v):
    p, fl = size_of(testbed, v)
    return f"{p / 1e6:.2f}M | {fl / 1e6:.1f}" if p else "- | -"


def by_seed(out_dirs):
    """{seed: final val} of the finished runs among out_dirs, one per seed of SEEDS in order."""
    return {s: runner.final_val(d) for s, d in zip(SEEDS, out_dirs) if runner.finished(d)}


# --- the headline arms (section 9): experiments/equalparam.py ---------------------------------------------------------
EP_OUT = "out-equalparam"
EP_ITERS = 2000
# arm: (config file, overrides, centre learning rate: the 400-iteration best, halved at d=256), in run order
ARMS = {
    "tf-d128": ("char_transformer", [], 3e-3),
    "hrm-nt4": ("char_hrm", [], 1e-2),
    "hrm-nt8": ("char_hrm", ["--T=4"], 1e-2),
    "hrm-nt12": ("char_hrm", ["--N=4", "--T=3"], 1e-2),
    "tf-d64": ("char_transformer", ["--n_embd=64", "--n_head=2"], 3e-3),
    "tf-d256": ("char_transformer", ["--n_embd=256", "--n_head=8"], 1.5e-3),
    "hrm-nt8-d256": ("char_hrm", ["--T=4", "--n_embd=256", "--n_head=8"], 5e-3),
    # added once HRM at 1.0M scored below the d=64 Transformer: the flat curve's lowest point, so that the flat
    # size HRM matches is read between measured widths rather than extrapolated (d=64's best lr as the centre)
    "tf-d32": ("char_transformer", ["--n_embd=32", "--n_head=1"], 6e-3),
}
CONTROL = ("hrm-nt12-warm240", "hrm-nt12", ["--warmup_iters=240"])   # (name, arm, overrides): phase D
EP_REACH = 4                       # the grid grows at most 2^4 = 16x from the centre either way


def lr_of(arm, k):
    return ARMS[arm][2] * 2.0 ** k


def arm_job(arm, k, seed, extra=(), name=None, out=EP_OUT):
    """(out_dir, train.py command) of one run: the arm at the centre lr times 2^k (alive.py's: under out)."""
    cfg, over, _ = ARMS[arm]
    lr = lr_of(arm, k)
    out_dir = os.path.join(out, name or arm, f"lr{lr_text(lr)}-s{seed}")
    warmup = [] if any(e.startswith("--warmup_iters=") for e in extra) else [f"--warmup_iters={EP_ITERS // 10}"]
    cmd = [sys.executable, "train.py", f"config/{cfg}.py", *over, f"--learning_rate={lr:.6g}",
           f"--max_iters={EP_ITERS}", f"--lr_decay_iters={EP_ITERS}", *warmup,
           f"--min_lr={lr / 10:.6g}", f"--seed={seed}", f"--out_dir={out_dir}", "--log_interval=100",
           "--eval_interval=100", *extra]
    return out_dir, cmd


def arm_val(arm, k, seed):
    return runner.final_val(arm_job(arm, k, seed)[0])


def arm_tried(arm):
    """The k of every finished seed-1337 run of the arm."""
    return [k for k in range(-EP_REACH, EP_REACH + 1) if runner.finished(arm_job(arm, k, SEEDS[0])[0])]


def best_k(arm):
    return min(arm_tried(arm), key=lambda k: arm_val(arm, k, SEEDS[0]), default=None)


def bracketed(arm):
    """The best k has a finished neighbour on each side (or sits at the reach's end)."""
    k, ks = best_k(arm), arm_tried(arm)
    return k is not None and all(j in ks or abs(j) > EP_REACH for j in (k - 1, k + 1))


def runner_up(arm):
    """The second-best k at seed 1337 where it is within one seed sd of the best (after the best's seeds)."""
    k = best_k(arm)
    vals = by_seed([arm_job(arm, k, s)[0] for s in SEEDS])
    if len(vals) < len(SEEDS):
        return None
    sd = report.mean_sd(list(vals.values()))[1]
    j = min((j for j in arm_tried(arm) if j != k), key=lambda j: arm_val(arm, j, SEEDS[0]), default=None)
    return j if j is not None and arm_val(arm, j, SEEDS[0]) - vals[SEEDS[0]] <= sd else None


def chosen_k(arm):
    """The lr (as k) with the lower 3-seed mean among those with all 3 seeds; None until phase C is through."""
    if not bracketed(arm):
        return None
    k = best_k(arm)
    full = {j: by_seed([arm_job(arm, j, s)[0] for s in SEEDS]) for j in {k, runner_up(arm)} - {None}}
    if any(len(v) < len(SEEDS) for v in full.values()):
        return None
    return min(full, key=lambda j: sum(full[j].values()))


def shown_k(arm):
    """(k, final): the lr an arm's tables show. Final: the chosen lr, phases B and C through. Until then, where
    the best is bracketed and has 2 or more seeds, that best (provisional: a runner-up's seeds may change it)."""
    k = chosen_k(arm)
    if k is not None:
        return k, True
    if bracketed(arm) and len(by_seed([arm_job(arm, best_k(arm), s)[0] for s in SEEDS])) >= 2:
        return best_k(arm), False
    return None, False


def control_job(seed):
    name, arm, extra = CONTROL
    return arm_job(arm, chosen_k(arm), seed, extra, name)


# --- the long run (section 6): experiments/long_run.py --------------------------------------------------------------
LONG_OUT = "out-long"
LONG_ITERS = 4000                  # 10x the sweep's 400 iterations of 8 x 128 characters


def long_job(v, lr, seed):
    return command("char", v, lr, seed, iters=LONG_ITERS, out=LONG_OUT)


def candidates(v):
    """The variant's best 400-iteration learning rate and one grid step lower (None before the sweep has one)."""
    if not settled("char", v):
        return None
    best = best_lr("char", v)
    return [best, GRID[GRID.index(best) - 1]]


def long_chosen(v):
    """The better of the two candidates at 4000 iterations, once both have finished (seed 1337)."""
    lrs = candidates(v)
    dirs = [long_job(v, lr, SEEDS[0])[0] for lr in lrs or []]
    if not dirs or not all(runner.finished(d) for d in dirs):
        return None
    return min(lrs, key=lambda lr: runner.final_val(long_job(v, lr, SEEDS[0])[0]))


# --- beyond the paper (section 7): experiments/beyond_paper.py ------------------------------------------------------
BEYOND_OUT = "out-beyond"
HRM8 = ["--N=4", "--T=2"]                    # M = 8 for every variant but the chunked one (2 passes of 4)
BEYOND = {  # name: (train.py overrides on config/char_hrm.py, what it is)
    "paper-K2": (HRM8 + ["--K=2"], "the paper: last K=2 of M=8 steps"),
    "full": (HRM8 + ["--K=8"], "full BPTT, K=M=8"),
    "full-ckpt": (HRM8 + ["--K=8", "--grad_ckpt=True"], "full BPTT, grad_ckpt"),
    "kslow4": (HRM8 + ["--K=2", "--K_slow=4"], "K=2, K_slow=4: all Slow firings"),
    "hybrid4": (HRM8 + ["--K=2", "--fast_attn_steps=4"], "K=2, 4 of 8 Fast steps attend"),
    "rnn": (HRM8 + ["--K=2", "--fast_attn_steps=0"], "K=2, no Fast step attends"),
    "chunked4": (["--N=2", "--T=2", "--S=2", "--K=4"], "chunked BPTT, C=4: S=2 passes of 4, K=4"),
}


def beyond_command(variant, seed, out=BEYOND_OUT, n=300, data_dir="data"):
    """(out_dir, train.py command) of a beyond_paper.py run: `n` iterations (300 by default) at lr 3e-3."""
    out_dir = os.path.join(out, variant, f"s{seed}")
    cmd = [sys.executable, "train.py", "config/char_hrm.py", *BEYOND[variant][0], f"--max_iters={n}",
           f"--lr_decay_iters={n}", f"--warmup_iters={max(1, n // 10)}", f"--eval_interval={max(1, n // 4)}",
           f"--log_interval={max(1, n // 8)}", f"--seed={seed}", f"--out_dir={out_dir}", f"--data_dir={data_dir}"]
    return out_dir, cmd
