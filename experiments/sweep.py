"""
Reproduction v3 (docs/RESULTS.md sections 1-5): HPSearch in miniature, with the controls that tell
architecture from trainability. One command runs what is missing, skipping finished runs (so it resumes
after a stop), then prints every table and draws every plot from the committed logs:

    python prepare.py --dataset=shakespeare_char && python prepare.py
    python experiments/sweep.py                 # all runs, then tables and plots (about 3 hours on 2 cores)
    python experiments/sweep.py --tables        # tables and plots only, from experiments/logs/sweep/ alone (a fresh clone)

Phases (each run is a plain train.py command, printed before it starts):
  1. character testbed, 15 variants x 4 learning rates, seed 1337: HRM, Transformer L=4, UniTF (each
     post- and pre-norm) at matched stored parameters, and seven controls that each differ from one of
     those in one thing: HRM's Fast module alone (no Slow module), the same widened to HRM's parameters,
     UniTF at HRM's width d=128, UniTF with full backprop (K = M), HRM and UniTF clipped at the
     Transformer's 1.0, and a pre-norm Transformer L=1 (HRM's input block alone); and post-norm HRM and
     UniTF trained at a random depth per iteration (train.py's random_depth). Where a variant's best
     learning rate is at the edge of what it tried, the next half-decade step that way is run too, until
     every best is bracketed.
  2. each variant's best learning rate with 2 more seeds (3 in all); the K ablation (K = 1, 4 of M = 4)
     for post-norm HRM at its best, 3 seeds.
  3. BPE testbed (config/shakespeare_*.py, 400 iterations): the six architecture x norm variants at their
     best character-level learning rate and one grid step each side, grown until bracketed, then 3 seeds;
     and a control, the post-norm Transformer with HRM's untied matrix before the tied logits (out_proj).
Tables only: the checkpoint readings (Slow-module ablation, z_H drift, fusion weights, depth at inference)
are computed once from out-sweep/'s last checkpoints and committed beside the logs (analysis.json).
Runs go two at a time, one thread each (2 cores); a run's output is in its out_dir/train.out, and when it
finishes its log.jsonl and run.json (command, final CE, parameters, counted FLOPs) go to experiments/logs/sweep/.
"""

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)   # train.py's modules; imported where used, so --tables from run.json files needs no torch

OUT = "out-sweep"                          # every run's out_dir (checkpoints; not committed) is under here
LOGS = os.path.join("experiments", "logs")        # committed: out-<name>/<run>/log.jsonl -> experiments/logs/<name>/<run>/
LRS = [3e-4, 1e-3, 3e-3, 1e-2]            # phase 1 grid: 1.5 decades, half-decade steps
GRID = [1e-5, 3e-5, 1e-4] + LRS + [3e-2, 1e-1, 3e-1]  # where a variant's best is at an edge, the grid grows that way
SEEDS = [1337, 42, 2024]
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
CHAR_LR_OF = {"transformer_proj-post": "transformer-post"}   # a BPE-only variant starts at this one's char best
ITERS = {"char": 400, "bpe": 400}         # the quick start's 400 iterations on both testbeds


def log_dir(out_dir):
    """Where a finished run's log and facts are committed: out-sweep/char/x/y -> experiments/logs/sweep/char/x/y.
    Runs outside an out-<name> folder of the repository (a user's --out elsewhere) keep them in out_dir."""
    parts = os.path.normpath(out_dir).split(os.sep, 1)
    if os.path.isabs(out_dir) or len(parts) < 2 or not parts[0].startswith("out-"):
        return out_dir
    return os.path.join(LOGS, parts[0][len("out-"):], parts[1])


def logged_ms_iter(out_dir):
    """The ms/iter values of a run's progress lines (train.py's stdout, kept in out_dir/train.out)."""
    path = os.path.join(out_dir, "train.out")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [float(line.split(" ms/iter")[0].rsplit(",", 1)[-1]) for line in f if " ms/iter" in line]


def lr_name(lr):
    return f"{lr:.0e}".replace("e-0", "e-")


def run_dir(testbed, variant, lr, seed, extra=""):
    return os.path.join(OUT, testbed, variant, f"lr{lr_name(lr)}-s{seed}{extra}")


def bad_committed(path, why):
    """A committed file that cannot be read (truncated, hand-edited, a field of the wrong type) is bad input: one
    line naming it, exit 2, from whichever runner is running."""
    from hrmlm.common import fail
    rel = os.path.relpath(path, ROOT)
    fail(f"{rel} cannot be read ({why}); restore it (git checkout -- {rel}) or delete it to make it again",
         prog=os.path.basename(sys.argv[0]))


def committed_json(path, fields=()):
    """A committed JSON object (run.json, analysis.json, kv.json, ...), each of `fields` ((name, types)) of its type
    where present; else bad_committed."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        bad_committed(path, e)
    if not isinstance(data, dict):
        bad_committed(path, f"a JSON {type(data).__name__}, not an object")
    for name, types in fields:
        if name in data and not isinstance(data[name], types) or isinstance(data.get(name), bool) and bool not in types:
            bad_committed(path, f"its {name!r} is {data[name]!r}")
    return data


NUMBER = (int, float, type(None))   # a logged number, or null (not measured, non-finite)


def facts(out_dir):
    """The committed facts of a finished run (experiments/logs/.../run.json), or None."""
    path = os.path.join(ROOT, log_dir(out_dir), "run.json")
    if not os.path.exists(path):
        return None
    return committed_json(path, (("final_val", NUMBER), ("diverged", (bool,)), ("command", (str,))))


def finished(out_dir):
    """True when the run's log and facts are committed: it logged its last iteration or diverged."""
    return facts(out_dir) is not None


def run_log(out_dir):
    """The committed log of a finished run: a list of rows, one per logged iteration."""
    from hrmlm.checkpoint import read_log
    path = os.path.join(ROOT, log_dir(out_dir))
    try:
        rows, _ = read_log(path)
    except ValueError as e:
        bad_committed(os.path.join(path, "log.jsonl"), e)
    for r in rows:
        bad = [k for k in ("train_loss", "val_loss", "lr", "grad_norm", "time_s", "alpha_L", "alpha_H")
               if k in r and (not isinstance(r[k], NUMBER) or isinstance(r[k], bool))]
        if bad:
            bad_committed(os.path.join(path, "log.jsonl"), f"iteration {r['iter']}'s {bad[0]!r} is {r[bad[0]]!r}")
    return rows


def final_val(out_dir):
    """Validation CE at the last iteration; inf for a diverged or missing run."""
    f = facts(out_dir)
    if f is None or f["diverged"]:
        return math.inf
    v = f["final_val"]
    return v if v is not None and math.isfinite(v) else math.inf


def last_ckpt(out_dir):
    """The name of the run's resume state in out_dir: ckpt_last.dcp, or the ckpt_last.pt of a run made before it;
    None where there is neither."""
    return next((n for n in ("ckpt_last.dcp", "ckpt_last.pt") if os.path.exists(os.path.join(out_dir, n))), None)


def model_facts(out_dir):
    """Stored parameters and counted training FLOPs per token, from the run's checkpoint."""
    import torch
    from hrmlm.checkpoint import read_info
    from hrmlm.flops import counted_train_flops
    from model import ModelConfig, build_model
    if not last_ckpt(out_dir):
        return {}
    ck = read_info(os.path.join(out_dir, last_ckpt(out_dir)))
    cfg, c = ModelConfig(**ck["model_args"]), ck["config"]
    with torch.device("meta"):
        params = build_model(cfg).num_params()
    b, n = c["batch_size"] * c["gradient_accumulation_steps"], c["block_size"]
    return {"params": params, "train_flops_per_token": counted_train_flops(cfg, b, n) / (b * n),
            "model_args": ck["model_args"]}


def store(out_dir, cmd, returncode):
    """Commit-ready copy of a finished run: its log.jsonl and run.json (command, outcome, final val, size,
    FLOPs) under experiments/logs/, written last and atomically, so a run counts as finished only once both exist."""
    dst = os.path.join(ROOT, log_dir(out_dir))
    os.makedirs(dst, exist_ok=True)
    from tools.plot import load_log
    rows = load_log(out_dir) if os.path.exists(os.path.join(out_dir, "log.jsonl")) else []
    if rows and os.path.abspath(dst) != os.path.abspath(out_dir):
        shutil.copyfile(os.path.join(out_dir, "log.jsonl"), os.path.join(dst, "log.jsonl"))
    last = [r for r in rows if r["iter"] == max_iters_of(cmd)]
    ms = logged_ms_iter(out_dir)
    info = {"command": " ".join(["python"] + [a for a in cmd[1:] if not a.startswith(("--overwrite", "--init_from"))]),
            "diverged": returncode == 3, "final_val": last[-1]["val_loss"] if last else None,
            "ms_per_iter_median": sorted(ms)[len(ms) // 2] if ms else None, **model_facts(out_dir)}
    from hrmlm.common import atomic_write
    with atomic_write(os.path.join(dst, "run.json")) as f:
        json.dump(info, f, indent=1)


def max_iters_of(cmd):
    return int(next(a for a in cmd if a.startswith("--max_iters=")).split("=")[1])


def command(testbed, variant, lr, seed, extra_args=(), extra="", iters=None, out=OUT):
    cfg, over = (CHAR if testbed == "char" else BPE)[variant]
    out_dir = run_dir(testbed, variant, lr, seed, extra).replace(OUT, out, 1)
    n = iters or ITERS[testbed]
    cmd = [sys.executable, "train.py", f"config/{cfg}.py", *over, *extra_args, f"--learning_rate={lr}",
           f"--max_iters={n}", f"--lr_decay_iters={n}", f"--warmup_iters={n // 10}",
           f"--min_lr={lr / 10:.3g}", f"--seed={seed}", f"--out_dir={out_dir}", "--log_interval=100"]
    if n > 1000:
        cmd.append(f"--eval_interval={n // 20}")   # 21 points on a long curve
    return out_dir, cmd


def runner_parser(doc, tables_help, dry_run=True):
    """The command line every runner (sweep.py, equalparam.py, long_run.py, beyond_paper.py) shares."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = ap.add_mutually_exclusive_group()   # each one alone does what it says, and nothing else
    what.add_argument("--tables", action="store_true", help=tables_help)
    if dry_run:
        what.add_argument("--dry-run", action="store_true", help="list the train.py commands still to run; run nothing")
    ap.add_argument("--workers", type=workers_arg, default=2, help="runs at once (one thread each)")
    return ap


def workers_arg(text):
    """--workers: an integer >= 1 (0 would wait for ever with nothing running)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return n


STOP_LINE = "saving at the end of this iteration"   # what train.py prints the moment a signal reaches it
STOPPED = {c: s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) for c in (128 + s, -s)}   # saved, or quit


def run_all(jobs, workers, rerun=False):
    """Run (out_dir, cmd) jobs, `workers` at a time with one thread each; skip finished ones (their logs are
    committed), resume cut ones from their last checkpoint; store() each one that finishes.
    rerun=True: the jobs are finished runs, run again for their checkpoints (not committed); each is checked
    against its committed log, and the out_dirs that reproduce it are returned.
    Ctrl-C or SIGTERM to the runner (or a run stopped by one) stops it the way it stops train.py: no new run
    starts, the running ones get the signal, save and stop, and the runner exits 128 + n; the same command
    resumes them. A second signal quits them without saving. A runner killed outright (SIGKILL) still stops its
    runs (they get SIGTERM, and save), so no run is left going with nobody to store it."""
    todo, kept = [(d, c) for d, c in jobs if rerun or not finished(d)], []
    if rerun:
        kept = [d for d, c in todo if kept_rerun(d, c)]   # an earlier rerun's checkpoint, still here: no third run
        todo = [(d, c) for d, c in todo if d not in kept]
        print(f"rerunning {len(todo)} finished runs for their checkpoints", flush=True)
    else:
        print(f"{len(jobs) - len(todo)} of {len(jobs)} runs already finished; {len(todo)} to go", flush=True)
    running, t0, done, reproduced, stop = [], time.time(), 0, [], []

    def on_signal(signum, frame):
        stop.append(signum)
        if len(stop) == 1:
            print(f"{signal.Signals(signum).name}: {len(running)} running run(s) save and stop; no new run starts "
                  f"(send it again to quit them without saving)", flush=True)
        forward(running, signum, again=len(stop) > 1)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}   # common.STOP_SIGNALS
    try:
        while (todo and not stop) or running:
            while todo and not stop and len(running) < workers:
                out_dir, cmd = todo.pop(0)
                os.makedirs(out_dir, exist_ok=True)
                claim = claim_run(out_dir)
                why = ("another runner has it" if claim is None else   # or finished it since this list was made:
                       "another runner finished it" if not rerun and finished(out_dir) else train_running(out_dir))
                if why:
                    print(f"skipping {out_dir}: {why}", flush=True)
                    if claim:
                        claim.close()
                    continue
                if last_ckpt(out_dir):
                    cmd = cmd + ["--init_from=resume"]     # exact resume of a run cut off by a stop
                else:
                    cmd = cmd + ["--overwrite=True"]       # cut before its first checkpoint: start over
                print(" ".join(cmd[1:]), flush=True)
                out = open(os.path.join(out_dir, "train.out"), "a")
                env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
                # its own session: a terminal's Ctrl-C reaches the runner only, which passes it on once
                p = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, preexec_fn=stop_with_parent)
                running.append((out_dir, cmd, p, out, claim, out.tell()))
            time.sleep(1)
            for item in list(running):
                out_dir, cmd, p, out, claim, _ = item
                if p.poll() is None:
                    continue
                running.remove(item)
                out.close()
                claim.close()
                if p.returncode in STOPPED:
                    if not stop:               # stopped by a signal that was not the runner's: stop as if it were
                        print(f"{out_dir} was stopped by {signal.Signals(STOPPED[p.returncode]).name}", flush=True)
                        on_signal(STOPPED[p.returncode], None)
                    print(f"stopped: {out_dir}; the same command resumes it from its last checkpoint", flush=True)
                    continue
                done += 1
                if p.returncode in (0, 3):                 # 3: train.py's stop after max_nonfinite bad iterations
                    if not rerun:
                        store(out_dir, cmd, p.returncode)
                    elif check_rerun(out_dir):
                        reproduced.append(out_dir)
                else:
                    print(f"FAILED ({p.returncode}): {out_dir}; see {out_dir}/train.out", flush=True)
                el = time.time() - t0
                left = len(todo) + len(running)
                print(f"[{done}/{done + left}] {out_dir}: val {final_val(out_dir):.4f} (committed) | {el / 60:.1f} "
                      f"min, about {el / done * left / 60:.0f} min left", flush=True)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if stop:
        from hrmlm.common import SIGNALLED, fail
        fail(f"interrupted by {signal.Signals(stop[0]).name}; run the same command to resume", SIGNALLED + stop[0],
             prog=os.path.basename(sys.argv[0]))
    return kept + reproduced


def stop_with_parent():
    """In a run's process, before train.py starts: get SIGTERM (and save) when the runner dies, even by SIGKILL
    (Linux's PR_SET_PDEATHSIG), instead of running on with nobody to store it and its out_dir locked."""
    if sys.platform == "linux":
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)   # 1 = PR_SET_PDEATHSIG


def forward(running, signum, again):
    """Pass the runner's signal to its running runs, once: a run that already has it (a scheduler signals every
    process of a job) has said so in its train.out, and a second signal would quit it without saving.
    again=True (the runner's second signal) passes it to every run: they quit at once."""
    if not again:
        time.sleep(0.5)   # time for a run that got the signal too to say so
    for out_dir, _, p, _, _, start in list(running):
        if p.poll() is not None:
            continue
        with open(os.path.join(out_dir, "train.out"), errors="replace") as f:
            f.seek(start)
            if again or STOP_LINE not in f.read():
                p.send_signal(signum)


def train_running(out_dir):
    """Why out_dir cannot be run now: a train.py still holds its lock (say, one a killed runner left); or None."""
    import fcntl
    path = os.path.join(out_dir, ".lock")
    if not os.path.exists(path):
        return None
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)   # released when f closes
        except BlockingIOError:
            f.seek(0)
            return f"a train.py is still running in it ({f.read().strip() or 'no note'})"
    return None


def claim_run(out_dir):
    """An open file holding an exclusive lock on out_dir/runner.lock while this runner runs (and stores) the
    run, so two runners started side by side (one per free core) never start the same run; None where
    another runner holds it."""
    import fcntl
    f = open(os.path.join(out_dir, "runner.lock"), "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def kept_rerun(out_dir, cmd):
    """True where out_dir already holds what a rerun would make: a checkpoint of the last iteration (say, from a
    rerun whose reading a stop cut off) and a log that reproduces the committed one."""
    if not last_ckpt(out_dir) or train_running(out_dir):
        return False
    path = os.path.join(out_dir, last_ckpt(out_dir))
    from hrmlm.checkpoint import read_info
    try:
        done = read_info(path)["iter_num"] == max_iters_of(cmd)
    except Exception:   # unreadable (cut off mid-write): rerun it
        return False
    return done and check_rerun(out_dir)


def check_rerun(out_dir):
    """A rerun of a committed run must reproduce its log (CPU float32 runs are deterministic); say so, or say
    where it first differs (its checkpoint, and what is read from it, would be the rerun's, not the log's).
    True where it reproduces the log."""
    from tools.plot import load_log
    def rows(log):   # every logged number but the wall-clock time
        return {r["iter"]: {k: v for k, v in r.items() if k != "time_s"} for r in log}
    new, old = rows(load_log(out_dir)), rows(run_log(out_dir))
    diff = [it for it in sorted(old) if new.get(it) != old[it]]
    if diff:
        print(f"WARNING: {out_dir} does not reproduce its committed log: at iteration {diff[0]} it logged "
              f"{new.get(diff[0])}, the committed log {old[diff[0]]}; not reading its checkpoint", flush=True)
        return False
    print(f"{out_dir} reproduces its committed log exactly ({len(old)} rows)", flush=True)
    return True


def require_data(script, datasets):
    """Stop with one line before any run where a dataset (name, prepare.py's argument for it) is missing."""
    for ds, hint in datasets:
        if not all(os.path.exists(os.path.join(ROOT, "data", ds, f)) for f in ("train.bin", "val.bin", "meta.json")):
            from hrmlm.common import fail   # here, not at the top: --tables needs no torch
            fail(f"data/{ds} not found; run python prepare.py {hint}".rstrip(), prog=script)


def runner_main(doc, jobs, run, tables, datasets):
    """The main of a runner with no options of its own (equalparam.py, alive.py): --dry-run lists jobs(), --tables
    prints tables(); else the data is checked, run(workers) trains and reads what is missing, then tables()."""
    args = runner_parser(doc, "print the tables only, from the committed logs").parse_args()
    os.chdir(ROOT)
    if args.dry_run:
        return dry_run(jobs())
    if not args.tables:
        require_data(os.path.basename(sys.argv[0]), datasets)
        run(args.workers)
    tables()


def dry_run(jobs):
    """--dry-run: each job's command, marked where its log is committed (the runner will skip it)."""
    for d, cmd in jobs:
        print(("# finished: " if finished(d) else "") + "OMP_NUM_THREADS=1 python " + " ".join(cmd[1:]))


def variants(testbed):
    return CHAR if testbed == "char" else BPE


def tried(testbed, variant):
    """The grid points this variant has a finished seed-1337 run at."""
    return [lr for lr in GRID if finished(run_dir(testbed, variant, lr, SEEDS[0]))]


def best_lr(testbed, variant):
    vals = {lr: final_val(run_dir(testbed, variant, lr, SEEDS[0])) for lr in tried(testbed, variant)}
    if not vals:
        return None
    lr = min(vals, key=vals.get)
    return lr if math.isfinite(vals[lr]) else None


def settled(testbed, variant):
    """True when the variant's best lr is final: a worse finished lr on each side, or the grid's end."""
    lrs, lr = tried(testbed, variant), best_lr(testbed, variant)
    if lr is None or (testbed == "char" and not set(LRS) <= set(lrs)):
        return False
    i = GRID.index(lr)
    return (lr != lrs[-1] or i + 1 == len(GRID)) and (lr != lrs[0] or i == 0)


def edge_runs(testbed):
    """A variant whose best lr is the highest (lowest) it tried gets the next grid point up (down), so
    every reported best is bracketed by a worse lr on each side where the grid allows."""
    jobs = []
    for v in variants(testbed):
        lrs, lr = tried(testbed, v), best_lr(testbed, v)
        if lr is None:
            continue
        i = GRID.index(lr)
        if lr == lrs[-1] and i + 1 < len(GRID):
            jobs.append(command(testbed, v, GRID[i + 1], SEEDS[0]))
        if lr == lrs[0] and i > 0:
            jobs.append(command(testbed, v, GRID[i - 1], SEEDS[0]))
    return jobs


def phase1():
    """Character testbed: every variant at the 4 grid learning rates, seed 1337."""
    return [command("char", v, lr, SEEDS[0]) for v in CHAR for lr in LRS]


def bpe_start():
    """BPE testbed: each variant at its best character-level learning rate and one grid step each side."""
    jobs = []
    for v in BPE:
        lr = best_lr("char", CHAR_LR_OF.get(v, v))
        if lr is not None:
            i = GRID.index(lr)
            jobs += [command("bpe", v, g, SEEDS[0]) for g in GRID[max(i - 1, 0):i + 2]]
    return jobs


def seed_runs(testbed):
    """Each variant's best learning rate with the other two seeds."""
    return [command(testbed, v, best_lr(testbed, v), s) for v in variants(testbed)
            if best_lr(testbed, v) is not None for s in SEEDS[1:]]


K_ABLATION = [("hrm-post", [f"--K={k}"], f"-K{k}") for k in (1, 4)]   # (variant, overrides, out_dir suffix)


def k_runs():
    """The K ablation: post-norm HRM at its best character-level lr with K = 1 and K = 4 (= M), 3 seeds."""
    lr = best_lr("char", "hrm-post")
    return [] if lr is None else [command("char", v, lr, s, args, extra) for v, args, extra in K_ABLATION
                                  for s in SEEDS]


def grow(testbed, workers):
    """Run edge_runs until every variant's best learning rate is bracketed (or at the grid's end)."""
    while True:
        jobs = edge_runs(testbed)
        if not jobs:
            return
        run_all(jobs, workers)


def run_everything(workers, testbeds=("char", "bpe")):
    if "char" in testbeds:
        run_all(phase1(), workers)
        grow("char", workers)
        run_all(seed_runs("char"), workers)
        run_all(k_runs(), workers)
    if "bpe" in testbeds:
        run_all(bpe_start(), workers)
        grow("bpe", workers)
        run_all(seed_runs("bpe"), workers)


# --- tables and plots, from the committed logs alone ----------------------------------------------

def fmt(v):
    return "diverged" if v == math.inf else f"{v:.3f}"


def cell(out_dir):
    """A table cell for a run: its final CE, "diverged", or "-" where it has not finished."""
    return fmt(final_val(out_dir)) if finished(out_dir) else "-"


def mean_sd(vals):
    """(mean, sample sd, n) of the finite values."""
    vals = [v for v in vals if math.isfinite(v)]
    if not vals:
        return math.inf, 0.0, 0
    m = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return m, sd, len(vals)


def unigrams():
    """The unigram CE of each testbed, computed from the data once and committed beside the logs."""
    path = os.path.join(ROOT, LOGS, "sweep", "unigram.json")
    if not os.path.exists(path):
        if not all(os.path.exists(os.path.join(ROOT, "data", d, "val.bin")) for d in ("shakespeare_char", "shakespeare")):
            return {"char": math.nan, "bpe": math.nan}
        from hrmlm.data import unigram_ce
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump({"char": unigram_ce(os.path.join(ROOT, "data"), "shakespeare_char"),
                       "bpe": unigram_ce(os.path.join(ROOT, "data"), "shakespeare")}, f, indent=1)
    return committed_json(path, (("char", (int, float)), ("bpe", (int, float))))


def size_of(testbed, variant):
    """(stored parameters, counted training FLOPs per token) of a variant, from any finished run's facts."""
    for lr in GRID:
        f = facts(run_dir(testbed, variant, lr, SEEDS[0]))
        if f and "params" in f:
            return f["params"], f["train_flops_per_token"]
    return None, None


def size_cells(testbed, v):
    p, fl = size_of(testbed, v)
    return f"{p / 1e6:.2f}M | {fl / 1e6:.1f}" if p else "- | -"


def lr_table(testbed, title):
    vs = variants(testbed)
    print(f"### {title}\n")
    cols = [lr for lr in GRID if any(lr in tried(testbed, v) for v in vs)]
    head = ["variant", "params", "MFLOPs/token"] + [f"lr {lr_name(lr)}" for lr in cols] + ["best lr"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for v in vs:
        best = best_lr(testbed, v)
        cells = [("**" + cell(d) + "**" if lr == best else cell(d)) if lr in tried(testbed, v) else "-"
                 for lr, d in ((lr, run_dir(testbed, v, lr, SEEDS[0])) for lr in cols)]
        print("| " + " | ".join([v, size_cells(testbed, v)] + cells + [lr_name(best) if best else "-"]) + " |")
    print()


def seeds_table(testbed, title, uni):
    """Each variant at its best lr over the 3 seeds."""
    print(f"### {title}\n")
    print("| variant | MFLOPs/token | lr | " + " | ".join(f"seed {s}" for s in SEEDS) + " | mean ± sd | below unigram |")
    print("|---|---|---|" + "---|" * (len(SEEDS) + 2))
    for v in variants(testbed):
        lr = best_lr(testbed, v)
        if lr is None:
            continue
        dirs = [run_dir(testbed, v, lr, s) for s in SEEDS]
        m, sd, n = mean_sd([final_val(d) for d in dirs if finished(d)])
        print(f"| {v} | {size_cells(testbed, v).split(' | ')[1]} | {lr_name(lr)} | " + " | ".join(cell(d) for d in dirs) +
              f" | {m:.3f} ± {sd:.3f} (n={n}) | {uni - m:.3f} |")
    print()


def difference(summary, a, b):
    """(row minus column, its standard error) of two variants' seed means, or None where one is missing."""
    if a not in summary or b not in summary or summary[a][2] < 2 or summary[b][2] < 2:
        return None
    (ma, sa, na), (mb, sb, nb) = summary[a], summary[b]
    return ma - mb, math.sqrt(sa ** 2 / na + sb ** 2 / nb)


# (row, column, what the row changes, what it claims to measure); each pair differs in the one thing named
COMPARISONS = [
    ("hrm-post", "transformer-post", "HRM vs Transformer L=4 at equal stored parameters (the paper's Finding 1)"),
    ("hrm-pre", "transformer-pre", "the same, pre-norm"),
    ("hrm-post", "unitf-post", "HRM vs UniTF d=256 at equal stored parameters (Finding 3)"),
    ("hrm-pre", "unitf-pre", "the same, pre-norm"),
    ("hrm-post", "hrm_fast_only-post", "the Slow module, added to the Fast module alone (+0.34M parameters)"),
    ("hrm-post", "hrm_fast_only_wide-post", "the Slow module against the same parameters spent on width (d=160)"),
    ("hrm_fast_only-post", "unitf_d128-post", "HRM's step (input block, re-injection, gates, fusion) vs a plain shared block, both d=128"),
    ("unitf_d128-post", "transformer-post", "weight sharing: one block applied 4 times vs 4 blocks, both d=128"),
    ("unitf-post", "unitf_d128-post", "UniTF's width, d=256 vs d=128 (4x the parameters)"),
    ("unitf-post", "transformer-post", "UniTF d=256 vs Transformer at equal stored parameters"),
    ("unitf_full-post", "unitf-post", "UniTF full backprop K=M=4 vs K=2 (gradient reaches the embedding)"),
    ("hrm_clip1-post", "hrm-post", "HRM clipped at 1.0 (the Transformer's) vs at grad_clip * K / M = 0.5"),
    ("unitf_clip1-post", "unitf-post", "UniTF clipped at 1.0 vs at 0.5"),
    ("hrm-pre", "transformer_l1-pre", "pre-norm HRM vs its input block alone, a Transformer L=1 (what HRM is when the fusion reads only x~)"),
    ("hrm_rdepth-post", "hrm-post", "HRM trained at random depth, N' uniform on 1..3, vs at N = 2 (both evaluated at N = 2)"),
    ("unitf_rdepth-post", "unitf-post", "UniTF trained at random depth, M' uniform on 1..7, vs at M = 4 (both evaluated at M = 4)"),
    ("transformer-pre", "transformer-post", "Transformer: pre- vs post-norm"),
    ("unitf-pre", "unitf-post", "UniTF: pre- vs post-norm"),
    ("hrm-pre", "hrm-post", "HRM: pre- vs post-norm"),
]


def by_seed(out_dirs):
    """{seed: final val} of the finished runs among out_dirs, one per seed of SEEDS in order."""
    return {s: final_val(d) for s, d in zip(SEEDS, out_dirs) if finished(d)}


def seed_values(testbed, v):
    """{seed: final val} of a variant's finished runs at its best lr."""
    lr = best_lr(testbed, v)
    return {} if lr is None else by_seed([run_dir(testbed, v, lr, s) for s in SEEDS])


def differences_table():
    import stats
    print("### Character testbed: differences of the best-lr seed means (row minus column; negative = row better)\n")
    print("Every variant ran seeds 1337, 42 and 2024, so each difference is paired by seed (95% interval and p of "
          "the paired t); Welch's, which ignores the pairing, beside it. The verdict follows the paired interval: a "
          "sign where it excludes 0, else \"the data cannot tell\".\n")
    print("| row | column | what differs | Δ CE | Welch: 95% interval, p | paired: 95% interval, p | verdict | "
          "FLOPs/token, row / column |")
    print("|---|---|---|---|---|---|---|---|")
    for a, b, what in COMPARISONS:
        va, vb = seed_values("char", a), seed_values("char", b)
        w, pr = stats.welch(list(va.values()), list(vb.values())), stats.paired(va, vb)
        fa, fb = size_of("char", a)[1], size_of("char", b)[1]
        ratio = f"{fa / fb:.2f}x" if fa and fb else "-"
        if pr is None and w is None:
            print(f"| {a} | {b} | {what} | - | - | - | - | {ratio} |")
            continue
        cells = [f"[{d.lo:+.3f}, {d.hi:+.3f}], p = {stats.p_text(d.p)}" if d else "-" for d in (w, pr)]
        d = pr or w
        verdict = "row better" if d.hi < 0 else "row worse" if d.lo > 0 else "the data cannot tell"
        print(f"| {a} | {b} | {what} | {d.diff:+.3f} | {cells[0]} | {cells[1]} | {verdict} | {ratio} |")
    print()
    chain = ["hrm-post", "hrm_fast_only-post", "unitf_d128-post", "transformer-post"]
    ds = [stats.paired(seed_values("char", a), seed_values("char", b)) for a, b in zip(chain, chain[1:])]
    if all(ds):
        total = stats.paired(seed_values("char", chain[0]), seed_values("char", chain[-1]))
        print(f"Decomposition, post-norm, d=128 throughout, paired by seed (95% intervals): HRM - Transformer = "
              f"{total.diff:+.3f} = {ds[0].diff:+.3f} [{ds[0].lo:+.3f}, {ds[0].hi:+.3f}] (the Slow module) "
              f"{ds[1].diff:+.3f} [{ds[1].lo:+.3f}, {ds[1].hi:+.3f}] (HRM's step vs a plain shared block) "
              f"{ds[2].diff:+.3f} [{ds[2].lo:+.3f}, {ds[2].hi:+.3f}] (weight sharing)\n")


def analysis_path(out_dir):
    return os.path.join(ROOT, log_dir(out_dir), "analysis.json")


def analysis(out_dir):
    """The checkpoint readings of a finished run, computed once from the run's checkpoint and committed
    beside its log (experiments/logs/.../analysis.json): for HRM the Slow-module ablation (CE with z_H frozen at
    z_H0), z_H's drift from z_H0 and the fusion weights (analyze.py's HLRole A-C); for HRM and UniTF, val CE
    at 0.5x to 4x the trained depth (analyze.py --depth). None where neither exists. They read the model
    after the last iteration (ckpt_last.dcp), whose CE the tables report, not the best one (ckpt.pt)."""
    path = analysis_path(out_dir)
    if not os.path.exists(path):
        if not last_ckpt(out_dir) or not finished(out_dir):
            return None     # nothing to read, or a run still training (its log is not committed yet)
        import torch
        from tools.analyze import depth_table, load, slow_module_frozen, step_stats, val_batches, val_ce
        torch.set_num_threads(1)
        model, ck = load(out_dir, last_ckpt(out_dir), "cpu", ("hrm", "unitf"))
        if ck["iter_num"] != max_iters_of(facts(out_dir)["command"].split()):
            return None     # a run cut off (or rerun and cut off) before its last iteration: nothing to read yet
        batches = val_batches(ck, os.path.join(ROOT, "data"), 16, 4, model.config.block_size)
        r = {"iter": ck["iter_num"], "ce": val_ce(model, batches, "cpu"),
             "depth": depth_table(model, batches, "cpu", DEPTHS)}
        if model.config.arch == "hrm":
            with slow_module_frozen(model):
                r["ce_h_frozen"] = val_ce(model, batches, "cpu")
            steps, r["fusion"] = step_stats(model, batches, "cpu")
            r["z_H_drift"] = steps[-1]["z_H_drift"]     # after the last step: what the fusion reads
        from hrmlm.common import atomic_write
        with atomic_write(path) as f:
            json.dump(r, f, indent=1)
    return committed_json(path)


DEPTHS = [0.5, 1, 2, 4]   # multiples of the trained depth for the inference-depth table


def best_runs(testbed, v):
    lr = best_lr(testbed, v)
    return [] if lr is None else [d for d in (run_dir(testbed, v, lr, s) for s in SEEDS) if finished(d)]


def slow_cells(runs):
    """('CE | ΔCE, H frozen | z_H drift | w_H | w_L | w_I' (mean ± sd) over the HRM runs' checkpoint readings,
    how many were read); (None, 0) where none has been."""
    rs = [r for r in (analysis(d) for d in runs) if r]
    if not rs:
        return None, 0

    def ms(key, sign=""):
        m, sd, n = mean_sd([key(r) for r in rs])
        return f"{m:{sign}.3f} ± {sd:.3f}"
    return (f"{ms(lambda r: r['ce'])} | {ms(lambda r: r['ce_h_frozen'] - r['ce'], '+')} | "
            f"{ms(lambda r: r['z_H_drift'])} | {ms(lambda r: r['fusion']['w_H'])} | "
            f"{ms(lambda r: r['fusion']['w_L'])} | {ms(lambda r: r['fusion']['w_I'])}"), len(rs)


SLOW_LEGEND = ("ΔCE: CE with z_H frozen at its prototype z_H0 (H_net's update replaced by the identity) minus CE; "
               "drift: ‖z_H - z_H0‖ / ‖z_H0‖ after the last step; w_H, w_L, w_I: the output fusion's mean weights.\n")


def seed_of(out_dir):
    return facts(out_dir)["command"].split("--seed=")[1].split()[0]


def slow_seed_rows(runs):
    """'| seed | CE | ΔCE, H frozen | z_H drift | w_H / w_L / w_I |' rows, one per read run, then ΔCE's mean with
    its 95% interval (frozen against not, paired by checkpoint) where 2 or more are read."""
    for d in runs:
        r = analysis(d)
        if r:
            w = r["fusion"]
            print(f"| {seed_of(d)} | {r['ce']:.3f} | {r['ce_h_frozen'] - r['ce']:+.3f} | {r['z_H_drift']:.3f} | "
                  f"{w['w_H']:.3f} / {w['w_L']:.3f} / {w['w_I']:.3f} |")
    cost = frozen_cost(runs)
    if cost:
        print(f"| mean [95% CI], p | - | {cost} | - | - |")


def frozen_cost(runs):
    """What freezing z_H costs, CE frozen minus CE, paired by checkpoint: mean, 95% interval and p (a
    stats.Diff); None under 2 readings."""
    import stats
    read = [(seed_of(d), r) for d, r in ((d, analysis(d)) for d in runs) if r]
    return stats.paired({s: r["ce_h_frozen"] for s, r in read}, {s: r["ce"] for s, r in read})


def slow_table():
    print("### The Slow-module reading: each HRM variant at its best lr, 3 seeds (mean ± sd; 64 validation "
          "sequences of 128 characters)\n")
    print(SLOW_LEGEND)
    print("| variant | CE | ΔCE, H frozen | z_H drift | w_H | w_L | w_I |\n|---|---|---|---|---|---|---|")
    for v in ("hrm-post", "hrm-pre", "hrm_fast_only-post"):
        cells, n = slow_cells(best_runs("char", v))
        if cells:
            print(f"| {v} (n={n}) | {cells} |")
    print()
    print("### The Slow-module reading, seed by seed: post-norm HRM at its best lr\n")
    print("| seed | CE | ΔCE, H frozen | z_H drift | w_H / w_L / w_I |\n|---|---|---|---|---|")
    slow_seed_rows(best_runs("char", "hrm-post"))
    print()


DEPTH_VARIANTS = ["hrm-post", "hrm-pre", "hrm_rdepth-post", "unitf-post", "unitf-pre", "unitf_full-post",
                  "unitf_d128-post", "unitf_rdepth-post"]


def depth_rows(runs):
    """{(varied, depth): [CE of each run]} from the runs' checkpoint readings."""
    out = {}
    for r in (analysis(d) for d in runs):
        for row in (r or {}).get("depth", []):
            out.setdefault((row["varied"], row["depth"]), []).append(row["ce"])
            if row["varied"] == "N" and row["depth"] == 1:    # the trained depth is on the T' line too
                out.setdefault(("T", 1.0), []).append(row["ce"])
    return out


def depth_cells(rows):
    """{varied: 'mean ± sd' cells at each of DEPTHS} for the lines (N', T', M') the readings have."""
    out = {}
    for what in ("N", "T", "M"):
        cells = []
        for f in DEPTHS:
            vals = rows.get((what, float(f)))
            cells.append("{:.3f} ± {:.3f}".format(*mean_sd(vals)[:2]) if vals else "-")
        if any(c != "-" for c in cells):
            out[what] = cells
    return out


def depth_table_md():
    print("### Depth at inference: val CE with the trained weights run at other depths, best lr, 3 seeds "
          "(mean ± sd; HRM: N' Slow firings with T kept, or T' Fast steps per firing with N kept; UniTF: M' steps)\n")
    print("| variant | varied | " + " | ".join(f"{f:g}x" for f in DEPTHS) + " |\n|---|---|" + "---|" * len(DEPTHS))
    for v in DEPTH_VARIANTS:
        for what, cells in depth_cells(depth_rows(best_runs("char", v))).items():
            print(f"| {v} | {what}' | " + " | ".join(cells) + " |")
    print()


def tables(plots=True):
    uni = unigrams()
    print(f"Unigram reference (token frequencies from train.bin, add-one smoothed, scored on val.bin): "
          f"character testbed {uni['char']:.3f}, BPE testbed {uni['bpe']:.3f} nats/token\n")
    lr_table("char", "Character testbed: validation CE after 400 iterations, by learning rate (seed 1337)")
    seeds_table("char", "Character testbed: each variant at its best learning rate, 3 seeds", uni["char"])
    differences_table()
    lr_table("bpe", "BPE testbed (GPT-2 BPE, d=128, 400 iterations): validation CE by learning rate (seed 1337)")
    seeds_table("bpe", "BPE testbed: each variant at its best learning rate, 3 seeds", uni["bpe"])

    k_table()
    slow_table()
    depth_table_md()
    if plots:
        draw(uni)


def k_table():
    """The K ablation, 3 seeds: each K's CE, and its difference from K = 2 (the paper's) paired by seed."""
    import stats
    lr = best_lr("char", "hrm-post")
    if not lr:
        return
    print(f"### K ablation: post-norm HRM, M = 4, lr {lr_name(lr)}, 3 seeds (clipping at grad_clip * K / M; "
          "difference from K = 2 paired by seed, 95% interval)\n")
    print("| K | MFLOPs/token | " + " | ".join(f"seed {s}" for s in SEEDS) + " | mean ± sd | minus K = 2 |")
    print("|---|---|" + "---|" * (len(SEEDS) + 2))
    dirs = {k: [run_dir("char", "hrm-post", lr, s, extra) for s in SEEDS] for k, extra in ((1, "-K1"), (2, ""), (4, "-K4"))}
    for k, ds in dirs.items():
        fl = next((f"{facts(d)['train_flops_per_token'] / 1e6:.1f}" for d in ds if finished(d)), "-")
        m, sd, n = mean_sd(list(by_seed(ds).values()))
        diff = "-" if k == 2 else (stats.paired(by_seed(ds), by_seed(dirs[2])) or "-")
        print(f"| {k}{' (= M, full backprop)' if k == 4 else ''} | {fl} | " + " | ".join(cell(d) for d in ds) +
              f" | {fmt(m)} ± {sd:.3f} (n={n}) | {diff} |")
    # the paper's claim is a trend in K: the two ends of it, paired by seed
    print(f"\nK = 4 minus K = 1, paired by seed: {stats.paired(by_seed(dirs[4]), by_seed(dirs[1])) or '-'}\n")


def save(fig, name):
    """Byte-identical output for identical logs: no timestamp or version in the PNG's metadata."""
    fig.savefig(os.path.join(ROOT, "docs", name), metadata={"Software": None})


def finish(fig, axes, name):
    """The two-panel plots' common end (experiments/long_run.py, experiments/beyond_paper.py): grid, legend, save."""
    for a in axes:
        a.grid(True, which="both", linestyle=":", color="0.85")
        a.legend(fontsize=6.5)
    fig.tight_layout()
    save(fig, name)
    print(f"wrote docs/{name}")


def draw(uni):
    """Each plot whose runs are all committed; one line names the others, whose committed files are kept."""
    import matplotlib
    matplotlib.use("Agg")
    kept = []
    for name, testbed, fn in (("sweep_lr.png", "char", draw_lr), ("bpe_lr.png", "bpe", draw_lr),
                              ("sweep_curves.png", "char", draw_curves), ("depth.png", "char", draw_depth)):
        missing = [v for v in variants(testbed) if not settled(testbed, v)]
        if missing:   # never overwrite a committed plot with an empty or partial one
            kept.append(f"docs/{name} ({len(missing)} {testbed} variant(s) unsettled: {', '.join(missing[:3])}"
                        f"{', ...' if len(missing) > 3 else ''})")
            continue
        fn(name, testbed, uni)
        print(f"wrote docs/{name}")
    if kept:
        print(f"sweep.py: not drawing {'; '.join(kept)}: no committed runs for them; the committed plots are kept",
              file=sys.stderr)


COLORS = {"hrm": "C0", "transformer": "C1", "unitf": "C2", "hrm_fast_only": "C4", "unitf_full": "C3",
          "hrm_fast_only_wide": "C5", "unitf_d128": "C6", "hrm_clip1": "C7", "unitf_clip1": "C8",
          "transformer_l1": "C9", "hrm_rdepth": "navy", "unitf_rdepth": "darkgreen", "transformer_proj": "saddlebrown"}


def style(v):
    arch, norm = v.rsplit("-", 1)
    return dict(color=COLORS[arch], linestyle="-" if norm == "post" else "--")


def draw_lr(name, testbed, uni):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=130)
    for v in variants(testbed):
        pts = [(lr, final_val(run_dir(testbed, v, lr, SEEDS[0]))) for lr in tried(testbed, v)]
        pts = [(lr, y) for lr, y in pts if math.isfinite(y)]
        if pts:
            ax.plot(*zip(*pts), marker="o", markersize=3, label=v, **style(v))
    ax.axhline(uni[testbed], color="0.4", linewidth=1, linestyle=":", label=f"unigram {uni[testbed]:.2f}")
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("final validation CE")
    ax.set_title(f"{'Character' if testbed == 'char' else 'BPE'} testbed, {ITERS[testbed]} iterations: "
                 f"CE vs learning rate (seed 1337)", fontsize=9)
    ax.grid(True, linestyle=":", color="0.85")
    ax.legend(fontsize=5.5)
    fig.tight_layout()
    save(fig, name)


def draw_curves(name, testbed, uni):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=130)
    for v in variants(testbed):
        logs = [run_log(d) for d in best_runs(testbed, v)]
        if not logs:
            continue
        iters = sorted(set.intersection(*[{r["iter"] for r in lg} for lg in logs]))
        ys = [[{r["iter"]: r["val_loss"] for r in lg}[i] for lg in logs] for i in iters]
        ax.plot(iters, [sum(y) / len(y) for y in ys], marker="o", markersize=2.5,
                label=f"{v} (lr {lr_name(best_lr(testbed, v))}, {len(logs)} seeds)", **style(v))
        ax.fill_between(iters, [min(y) for y in ys], [max(y) for y in ys], color=style(v)["color"], alpha=0.15)
    ax.axhline(uni[testbed], color="0.4", linewidth=1, linestyle=":", label=f"unigram {uni[testbed]:.2f}")
    ax.set_yscale("log")  # keeps iteration 0 (ln 80 = 4.38) on the chart beside the final values
    ax.set_xlabel("iteration")
    ax.set_ylabel("validation CE (log scale)")
    ax.set_title("Character testbed: learning curves at each variant's best lr (band: seed min-max)", fontsize=9)
    ax.grid(True, which="both", linestyle=":", color="0.85")
    ax.legend(fontsize=5)
    fig.tight_layout()
    save(fig, name)


def draw_depth(name, testbed, uni):
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=130, sharey=True)
    for ax, varied in zip(axes, ("N", "T")):
        for v in DEPTH_VARIANTS:
            rows = depth_rows(best_runs("char", v))
            what = varied if v.startswith("hrm") else "M"
            pts = [(f, mean_sd(rows[(what, f)])[0]) for f in map(float, DEPTHS) if (what, f) in rows]
            pts = [(f, y) for f, y in pts if math.isfinite(y)]
            if pts:
                ax.plot(*zip(*pts), marker="o", markersize=3, label=f"{v} ({what}')", **style(v))
        ax.axhline(uni[testbed], color="0.4", linewidth=1, linestyle=":", label=f"unigram {uni[testbed]:.2f}")
        ax.axvline(1, color="0.6", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("inference depth / trained depth")
        ax.set_ylabel("validation CE (3-seed mean)")
        ax.set_title(f"Depth at inference: HRM varies {varied}', UniTF varies M'", fontsize=9)
        ax.grid(True, linestyle=":", color="0.85")
        ax.legend(fontsize=6)
    fig.tight_layout()
    save(fig, name)


def main():
    ap = runner_parser(__doc__, "print the tables and draw the plots only", dry_run=False)
    ap.add_argument("--testbeds", default="char,bpe", help="run these testbeds' phases only (char: phases 1, 2 "
                    "and the K ablation; bpe: needs char's learning rates)")
    args = ap.parse_args()
    args.testbeds = args.testbeds.split(",")
    if not args.tables and not set(args.testbeds) <= {"char", "bpe"}:
        from hrmlm.common import fail   # here, not at the top: --tables needs no torch
        fail(f"--testbeds={','.join(args.testbeds)}: choose from char, bpe")
    os.chdir(ROOT)
    if not args.tables:
        require_data("sweep.py", [("shakespeare_char", "--dataset=shakespeare_char"), ("shakespeare", "")])
        run_everything(args.workers, args.testbeds)
    tables()


if __name__ == "__main__":
    from hrmlm.signals import exit_on_signals   # Ctrl-C, SIGTERM, SIGHUP: one line in every phase
    exit_on_signals()
    main()
