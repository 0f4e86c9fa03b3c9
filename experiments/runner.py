"""
The runner every study shares: each run a plain train.py command in a subprocess, `workers` at a time with one thread
each, stored as experiments/logs/<study>/.../log.jsonl and run.json once it ends: a run is finished once run.json is
committed, so the same command, run again, goes on. A stop signal sends each running train.py one SIGTERM, waits for
them, and ends the study with one line and 128 + n. A run another train.py or runner holds is skipped.
"""

import argparse
import fcntl
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)   # train.py's modules (hrmlm, model, tools), for every study

import torch  # noqa: E402

from hrmlm import signals  # noqa: E402
from hrmlm.checkpoint import read_info, read_log, resume_path  # noqa: E402
from hrmlm.common import UserError, atomic_write, counted_train_flops  # noqa: E402
from model import ModelConfig, build_model  # noqa: E402

LOGS = os.path.join("experiments", "logs")   # committed: out-<study>/<run>/log.jsonl -> experiments/logs/<study>/<run>/
NUMBER = (int, float, type(None))   # a logged number, or null (not measured, non-finite)
# a run's exit status when a signal stopped it: saved (train.py's 128 + n), or killed by it (-n)
STOPPED = {c: s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) for c in (128 + s, -s)}


def log_dir(out_dir):
    """Where a finished run's log and facts are committed: out-sweep/char/x/y -> experiments/logs/sweep/char/x/y.
    Runs outside an out-<name> folder of the repository (a user's --out elsewhere) keep them in out_dir."""
    parts = os.path.normpath(out_dir).split(os.sep, 1)
    if os.path.isabs(out_dir) or len(parts) < 2 or not parts[0].startswith("out-"):
        return out_dir
    return os.path.join(LOGS, parts[0][len("out-"):], parts[1])


def bad_committed(path, why):
    """A committed file that cannot be read (truncated, hand-edited, a field of the wrong type) is bad input."""
    rel = os.path.relpath(path, ROOT)
    raise UserError(f"{rel} cannot be read ({why}); restore it (git checkout -- {rel}) or delete it to make it again")


def committed_json(path, fields=()):
    """A committed JSON object (run.json, analysis.json, ...), each of `fields` ((name, types)) of its type if there."""
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


def facts(out_dir):
    """The committed facts of a finished run (experiments/logs/.../run.json), or None."""
    path = os.path.join(ROOT, log_dir(out_dir), "run.json")
    fields = (("final_val", NUMBER), ("diverged", (bool,)), ("command", (str,)))
    return committed_json(path, fields) if os.path.exists(path) else None


def finished(out_dir):
    """True when the run's log and facts are committed: it logged its last iteration or diverged."""
    return facts(out_dir) is not None


def final_val(out_dir):
    """Validation CE at the last iteration; inf for a diverged or missing run."""
    f = facts(out_dir)
    v = None if f is None or f["diverged"] else f["final_val"]
    return v if v is not None and math.isfinite(v) else math.inf


def seed_of(out_dir):
    return facts(out_dir)["command"].split("--seed=")[1].split()[0]


def run_log(out_dir):
    """The committed log of a finished run: a list of rows, one per logged iteration."""
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


def max_iters_of(cmd):
    return int(next(a for a in cmd if a.startswith("--max_iters=")).split("=")[1])


def resume_state(out_dir):
    """The path of the run's resume state in out_dir, or None where it has none."""
    path = resume_path(out_dir)
    return path if path and os.path.exists(path) else None


def store(out_dir, cmd, returncode):
    """Commit-ready copy of a finished run: its log.jsonl and run.json (command, outcome, final val, ms/iter, size,
    FLOPs) under experiments/logs/, run.json last and atomically, so a run counts as finished only once both exist."""
    dst = os.path.join(ROOT, log_dir(out_dir))
    os.makedirs(dst, exist_ok=True)
    rows = read_log(out_dir)[0] if os.path.exists(os.path.join(out_dir, "log.jsonl")) else []
    if rows and os.path.abspath(dst) != os.path.abspath(out_dir):
        shutil.copyfile(os.path.join(out_dir, "log.jsonl"), os.path.join(dst, "log.jsonl"))
    last = [r for r in rows if r["iter"] == max_iters_of(cmd)]
    # ms/iter between evaluations (their time included); time_s restarts at 0 where the run resumed: left out there
    ms = [1000 * (b["time_s"] - a["time_s"]) / (b["iter"] - a["iter"]) for a, b in zip(rows, rows[1:])
          if (b.get("time_s") or 0) > (a.get("time_s") or 0)]
    info = {"command": " ".join(["python"] + [a for a in cmd[1:] if not a.startswith(("--overwrite", "--init_from"))]),
            "diverged": returncode == 3, "final_val": last[-1]["val_loss"] if last else None,
            "ms_per_iter_median": statistics.median(ms) if ms else None}
    if resume_state(out_dir):   # stored parameters and counted training FLOPs per token, from its settings
        ck = read_info(resume_state(out_dir))
        cfg, c = ModelConfig(**ck["model_args"]), ck["config"]
        with torch.device("meta"):
            params = build_model(cfg).num_params()
        b, n = c["batch_size"] * c["gradient_accumulation_steps"], c["block_size"]
        info.update(params=params, train_flops_per_token=counted_train_flops(cfg, b, n) / (b * n),
                    model_args=ck["model_args"])
    with atomic_write(os.path.join(dst, "run.json")) as f:
        json.dump(info, f, indent=1)


def runner_parser(doc, tables_help, dry_run=True):
    """The command line every study that trains shares."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = ap.add_mutually_exclusive_group()   # each one alone does what it says, and nothing else
    what.add_argument("--tables", action="store_true", help=tables_help)
    if dry_run:
        what.add_argument("--dry-run", action="store_true", help="list the train.py commands still to run; run nothing")
    ap.add_argument("--workers", type=workers_arg, default=2, help="runs at once (one thread each)")
    return ap


def workers_arg(text):
    """--workers: an integer >= 1 (0 would wait for ever with nothing running)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return int(text)


def run_all(jobs, workers, rerun=False):
    """Run (out_dir, cmd) jobs, skipping finished ones, resuming cut ones; store() each one that finishes.
    rerun=True: the jobs are finished runs, run again for their checkpoints (not committed); the out_dirs whose log
    reproduces the committed one are returned."""
    todo, kept = [(d, c) for d, c in jobs if rerun or not finished(d)], []
    if rerun:
        kept = [d for d, c in todo if kept_rerun(d, c)]   # an earlier rerun's checkpoint, still here: no third run
        todo = [(d, c) for d, c in todo if d not in kept]
        print(f"rerunning {len(todo)} finished runs for their checkpoints", flush=True)
    else:
        print(f"{len(jobs) - len(todo)} of {len(jobs)} runs already finished; {len(todo)} to go", flush=True)
    running, t0, done, reproduced, stop = [], time.time(), [], [], []

    def ended(run):
        out_dir, cmd, p, *files = run
        running.remove(run)
        for f in files:
            f.close()
        if p.returncode in STOPPED:
            if not stop:   # stopped by a signal that was not the runner's: the runner stops as if it were
                stop.append(STOPPED[p.returncode])
                print(f"{out_dir} was stopped by {signal.Signals(stop[0]).name}", flush=True)
            print(f"stopped: {out_dir}; the same command resumes it from its last checkpoint", flush=True)
            return
        done.append(out_dir)
        if p.returncode not in (0, 3):   # 3: train.py's stop after max_nonfinite bad iterations
            print(f"FAILED ({p.returncode}): {out_dir}; see {out_dir}/train.out", flush=True)
        elif not rerun:
            store(out_dir, cmd, p.returncode)
        elif check_rerun(out_dir):
            reproduced.append(out_dir)
        el, left = time.time() - t0, len(todo) + len(running)
        print(f"[{len(done)}/{len(done) + left}] {out_dir}: val {final_val(out_dir):.4f} (committed) | {el / 60:.1f} "
              f"min, about {el / len(done) * left / 60:.0f} min left", flush=True)

    try:
        while (todo or running) and not stop:
            while todo and len(running) < workers:
                run = start(*todo.pop(0), rerun)
                if run:
                    running.append(run)
            time.sleep(1)
            for run in [r for r in running if r[2].poll() is not None]:
                ended(run)
    except KeyboardInterrupt:   # hrmlm.signals.main's, on a stop signal
        stop.append(signals.received[0] if signals.received else signal.SIGINT)
    if stop:
        for run in running:
            run[2].terminate()   # SIGTERM, once: train.py saves at the end of its iteration
        for run in list(running):
            run[2].wait()
            ended(run)
        raise UserError(f"interrupted by {signal.Signals(stop[0]).name}; run the same command to resume",
                        128 + stop[0])
    return kept + reproduced


def start(out_dir, cmd, rerun):
    """Start a run: (out_dir, cmd, its process, its train.out, its claim); None (and why) where it is not to run now."""
    os.makedirs(out_dir, exist_ok=True)
    claim = claim_run(out_dir)
    why = ("another runner has it" if claim is None else   # or finished it since the list was made:
           "another runner finished it" if not rerun and finished(out_dir) else train_running(out_dir))
    if why:
        print(f"skipping {out_dir}: {why}", flush=True)
        if claim:
            claim.close()
        return None
    # an exact resume of a run cut off by a stop; one cut before its first checkpoint starts over
    cmd = cmd + (["--init_from=resume"] if resume_state(out_dir) else ["--overwrite=True"])
    print(" ".join(cmd[1:]), flush=True)
    out = open(os.path.join(out_dir, "train.out"), "a")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # its own session: a terminal's Ctrl-C reaches the runner alone, which passes it on once
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return out_dir, cmd, p, out, claim


def locked(path, mode):
    """path opened and locked (exclusive, not waiting); None where another process holds the lock."""
    f = open(path, mode)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return f
    except BlockingIOError:
        return f.close()


def train_running(out_dir):
    """Why out_dir cannot be run now: a train.py still holds its lock (say, one a killed runner left); or None."""
    path = os.path.join(out_dir, ".lock")
    if not os.path.exists(path):
        return None
    free = locked(path, "a+")
    if free:
        return free.close()   # None
    with open(path) as f:
        return f"a train.py is still running in it ({f.read().strip() or 'no note'})"


def claim_run(out_dir):
    """out_dir/runner.lock, held while this runner runs (and stores) the run; None where another runner holds it."""
    return locked(os.path.join(out_dir, "runner.lock"), "w")


def kept_rerun(out_dir, cmd):
    """True where out_dir already holds what a rerun would make: a checkpoint of the last iteration (say, from a
    rerun whose reading a stop cut off) and a log that reproduces the committed one."""
    if not resume_state(out_dir) or train_running(out_dir):
        return False
    try:
        done = read_info(resume_state(out_dir))["iter_num"] == max_iters_of(cmd)
    except Exception:   # unreadable (cut off mid-write): rerun it
        return False
    return done and check_rerun(out_dir)


def check_rerun(out_dir):
    """A rerun of a committed run must reproduce its log (CPU float32 runs are deterministic); say so, or say
    where it first differs (its checkpoint, and what is read from it, would be the rerun's, not the log's)."""
    def rows(log):   # every logged number but the wall-clock time
        return {r["iter"]: {k: v for k, v in r.items() if k != "time_s"} for r in log}
    new, old = rows(read_log(out_dir)[0]), rows(run_log(out_dir))
    diff = [it for it in sorted(old) if new.get(it) != old[it]]
    if diff:
        print(f"WARNING: {out_dir} does not reproduce its committed log: at iteration {diff[0]} it logged "
              f"{new.get(diff[0])}, the committed log {old[diff[0]]}; not reading its checkpoint", flush=True)
        return False
    print(f"{out_dir} reproduces its committed log exactly ({len(old)} rows)", flush=True)
    return True


def rerun_and_read(jobs, workers, read):
    """Finished runs trained again for their checkpoints (not committed), read() on each that reproduces its log."""
    for d in run_all(jobs, workers, rerun=True) if jobs else []:
        print(f"reading {d}", flush=True)
        read(d)


def next_jobs(groups, workers):
    """The unfinished jobs of the first of groups (lists of jobs, in run order) that has any, topped up from the next
    ones to a multiple of `workers`, so no core idles beside a lone run (planned again each round)."""
    todo = []
    for g in groups:
        new = [(d, c) for d, c in g if not finished(d) and (d, c) not in todo]
        todo += new[:-len(todo) % workers] if todo else new
        if todo and len(todo) % workers == 0:
            break
    return todo


def run_until_done(plan, workers, after):
    """Run plan()'s jobs round by round (finished runs unlock later phases), after() between rounds, until it plans
    none; wait for runs another runner holds, and end with one line where a round leaves a run unfinished."""
    while todo := plan():
        run_all(todo, workers)
        after()
        left = plan()
        if {d for d, _ in left} == {d for d, _ in todo}:       # nothing finished this round
            # held by another runner (the claim taken to see is let go: falsy)
            held = [d for d, _ in left if os.path.isdir(d) and ((c := claim_run(d)) is None or c.close())]
            if not held:
                raise UserError(f"{len(left)} runs did not finish (see each out_dir's train.out), first: "
                                f"{left[0][0]}", 1)
            print(f"waiting for {len(held)} runs another runner holds", flush=True)
            time.sleep(60)


def require_data(datasets):
    """A UserError before any run where a dataset (name, prepare.py's argument for it) is missing."""
    for ds, hint in datasets:
        if not all(os.path.exists(os.path.join(ROOT, "data", ds, f)) for f in ("train.bin", "val.bin", "meta.json")):
            raise UserError(f"data/{ds} not found; run python prepare.py {hint}".rstrip())


def runner_main(doc, jobs, run, tables, datasets, reruns=list,
                tables_help="print the tables only, from the committed logs"):
    """A study's main where it has no options of its own: --dry-run lists jobs() and reruns(), --tables prints
    tables(); else the data is checked, run(workers) trains and reads what is missing, then tables()."""
    args = runner_parser(doc, tables_help).parse_args()
    os.chdir(ROOT)
    if args.dry_run:
        return dry_run(jobs(), reruns())
    if not args.tables:
        require_data(datasets)
        run(args.workers)
    tables()


def dry_run(jobs, reruns=()):
    """--dry-run: each job's command, marked where its log is committed (the runner will skip it); then the finished
    runs to train again for their checkpoints (a reading missing)."""
    for d, cmd in jobs:
        print(("# finished: " if finished(d) else "") + "OMP_NUM_THREADS=1 python " + " ".join(cmd[1:]))
    for d, cmd in reruns:
        print(f"# rerun for its checkpoint, then read it: OMP_NUM_THREADS=1 python {' '.join(cmd[1:])}")
