"""
Is HRM's recurrence alive in the runs we compare? (docs/RESULTS.md section 10.) At the learning rates that tune
best on the character testbed, AdamW moves a scalar up to ~lr a step, and HRM's learned injection scales alpha_L,
alpha_H (initialised at 0.1) can collapse to ~0: the shared blocks then add nothing and the model is its input
block and output fusion. This runner measures it and tries remedies (off by default; the paper's setting stays
train.py's default), at section 9's headline arms and schedule (docs/equalparam.py: post-norm, 2000 iterations of
8 x 128 characters, warmup 200, cosine to lr/10, K = 2).

    python docs/alive.py               # the runs still missing (two at a time, one thread each), their
                                       # readings, then the tables
    python docs/alive.py --workers=1   # one at a time; a second copy started later shares the work
    python docs/alive.py --dry-run     # the train.py commands still to run (at this phase); run nothing
    python docs/alive.py --tables      # tables only, from the committed logs (docs/logs/alive/, equalparam/)

Remedies:
  paper      alpha learned at the global lr (the paper, section 9's runs)
  fixed      alpha_L and alpha_H held at 0.1, not learned (--learn_alpha=False)
  mult0.1    alpha_L, alpha_H and tau at 0.1x the global lr (--scalar_lr_mult=0.1)
  mult0.01   the same at 0.01x
Phases (hyperparameters are chosen on seeds 7 and 8, which no test uses):
  A. selection, seed 7: for each HRM arm every remedy at the arm's centre lr (equalparam.py's) and half of it, grown
     a factor 2 at a time where a remedy's best is at an edge; the Transformers at their centre, half and double.
     NT=8 at d=128 first.
  B. the runner-up rule for every arm: the best and the runner-up (remedy, lr) with seed 8 too; the chosen one is
     the lower 2-seed mean. For HRM only alive runs compete: both blocks off must cost >= ALIVE nats at seed 7.
  C. the test: each arm's choice at seeds 1337, 42, 2024 (paired by seed with the Transformer of its width).
  W. the width control: HRM NT=8 at d=128 at lr 1.25e-3 (d=256's lr), the paper's setting, the test seeds.
Readings: for every finished HRM run, alive.json beside its log: alpha_L, alpha_H, val CE, and the CE cost of the
Fast block off, the Slow block off, both off (analyze.py's --alive readings), and of z_H frozen (H-frozen).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import equalparam as ep  # noqa: E402  (the arms, their centre lrs and the schedule)
import stats  # noqa: E402
import sweep  # noqa: E402  (the runner and the committed-log helpers)

OUT = "out-alive"
SELECT = (7, 8)                  # selection seeds: never in a test
SEEDS = sweep.SEEDS              # the test seeds (section 9's)
ALIVE = 0.05                     # nats: both shared blocks off must cost at least this for a run to count as alive
REMEDIES = {"paper": [], "fixed": ["--learn_alpha=False"], "mult0.1": ["--scalar_lr_mult=0.1"],
            "mult0.01": ["--scalar_lr_mult=0.01"]}
HRM_ARMS = ("hrm-nt8", "hrm-nt4", "hrm-nt12", "hrm-nt8-d256")
TF_OF = {"hrm-nt4": "tf-d128", "hrm-nt8": "tf-d128", "hrm-nt12": "tf-d128", "hrm-nt8-d256": "tf-d256"}
TF_ARMS = ("tf-d128", "tf-d256")
REACH = 3                        # the lr grid grows at most 2^3 = 8x from the centre either way
WIDTH = ("hrm-nt8", -3)          # (arm, k): lr 1e-2 * 2^-3 = 1.25e-3, the paper's setting


def job(arm, remedy, k, seed, name=None):
    """(out_dir, command) of one run: equalparam's arm at its centre lr times 2^k, with the remedy's overrides.
    The paper's runs at the test seeds (HRM's and the Transformers') are equalparam's own, so its committed runs
    count here; every other run is this runner's (out-alive/<arm>-<remedy>/, or out-alive/<name>/)."""
    if remedy == "paper" and seed in SEEDS and name is None:
        return ep.job(arm, k, seed)
    d, cmd = ep.job(arm, k, seed, REMEDIES[remedy], name=name or f"{arm}-{remedy}")
    new = d.replace(ep.OUT, OUT, 1)
    return new, [f"--out_dir={new}" if a == f"--out_dir={d}" else a for a in cmd]


def options(arm):
    """The (remedy, k) an arm's selection may try."""
    rems = REMEDIES if arm in HRM_ARMS else ["paper"]
    return [(r, k) for r in rems for k in range(-REACH, REACH + 1)]


def val(arm, remedy, k, seed):
    return sweep.final_val(job(arm, remedy, k, seed)[0])


def alive_path(out_dir):
    return os.path.join(sweep.ROOT, sweep.log_dir(out_dir), "alive.json")


def reading(out_dir):
    """The committed alive.json of a run, computed once from its last checkpoint (None: not read, no checkpoint)."""
    path = alive_path(out_dir)
    if not os.path.exists(path):
        if not sweep.finished(out_dir) or not os.path.exists(os.path.join(out_dir, "ckpt_last.pt")):
            return None
        import torch
        from analyze import alive, load, slow_module_frozen, val_batches, val_ce
        torch.set_num_threads(1)
        model, ck = load(out_dir, "ckpt_last.pt", "cpu")
        if ck["iter_num"] != sweep.max_iters_of(sweep.facts(out_dir)["command"].split()):
            return None   # cut off before its last iteration
        batches = val_batches(ck, os.path.join(sweep.ROOT, "data"), 16, 4, model.config.block_size)
        ce = val_ce(model, batches, "cpu")
        with slow_module_frozen(model):
            frozen = val_ce(model, batches, "cpu") - ce
        r = {"iter": ck["iter_num"], "ce": ce, "h_frozen": frozen, **alive(model, batches, "cpu", ce)}
        with open(path + ".tmp", "w") as f:
            json.dump(r, f, indent=1)
        os.replace(path + ".tmp", path)
    with open(path) as f:
        try:
            return json.load(f)
        except ValueError as e:
            from common import fail
            fail(f"{os.path.relpath(path, sweep.ROOT)} cannot be read ({e}); restore it or delete it to read the run "
                 f"again", prog="alive.py")


def is_alive(out_dir):
    r = reading(out_dir)
    return None if r is None else r["off_both"] >= ALIVE


def tried(arm, seed=SELECT[0]):
    return [(r, k) for r, k in options(arm) if sweep.finished(job(arm, r, k, seed)[0])]


def ranked(arm):
    """The arm's seed-7 runs that may be chosen, best first: for HRM, alive ones only (read; unread ones wait)."""
    ok = [(r, k) for r, k in tried(arm) if arm in TF_ARMS or is_alive(job(arm, r, k, SELECT[0])[0])]
    return sorted(ok, key=lambda rk: val(arm, *rk, SELECT[0]))


def phase_a(arm):
    """The selection grid's start, then one lr step outward wherever a remedy's seed-7 best is at an edge."""
    start = (0, -1) if arm in HRM_ARMS else (0, -1, 1)
    rems = REMEDIES if arm in HRM_ARMS else ["paper"]
    jobs = [job(arm, r, k, SELECT[0]) for k in start for r in rems]
    for r in rems:
        ks = [k for rr, k in tried(arm) if rr == r]
        if ks and all(k in ks for k in start):
            best = min(ks, key=lambda k: val(arm, r, k, SELECT[0]))
            jobs += [job(arm, r, j, SELECT[0]) for j in (best - 1, best + 1) if abs(j) <= REACH]
    return jobs


def top_two(arm):
    """The best and the runner-up of the arm's selection (once bracketed: each has its lr neighbours tried)."""
    r = ranked(arm)
    if not r:
        return []
    done = tried(arm)
    rem, k = r[0]
    if not all((rem, j) in done or abs(j) > REACH for j in (k - 1, k + 1)):
        return []   # the best is not bracketed yet: phase A is still growing
    return r[:2]


def phase_b(arm):
    return [job(arm, r, k, SELECT[1]) for r, k in top_two(arm)]


def chosen(arm):
    """(remedy, k) with the lower 2-seed selection mean among the top two, once both have both seeds; else None."""
    two = top_two(arm)
    if not two or any(not sweep.finished(job(arm, *rk, s)[0]) for rk in two for s in SELECT):
        return None
    return min(two, key=lambda rk: sum(val(arm, *rk, s) for s in SELECT))


def phase_c(arm):
    return [job(arm, *chosen(arm), s) for s in SEEDS] if chosen(arm) else []


def phase_w():
    return [job(WIDTH[0], "paper", WIDTH[1], s, name="hrm-nt8-width") for s in SEEDS]


def phase_r(arm):
    """Section 9's runs of the arm at its chosen lr again, for the checkpoints their committed logs lack: the alive
    readings of the HRM that section 9 compared (a rerun's CE is shown beside the committed one)."""
    k = ep.shown_k(arm)[0]
    return [] if k is None else [job(arm, "paper", k, s, name=f"{arm}-rerun") for s in SEEDS]


def groups():
    """The jobs in the order they run, as groups: each arm's selection and test before the next arm's, so every
    session's work completes a comparison (NT=8 at d=128 and its Transformer first)."""
    return [phase_a("hrm-nt8"), phase_a("tf-d128"), phase_b("hrm-nt8") + phase_b("tf-d128"),
            phase_c("hrm-nt8") + phase_c("tf-d128"), phase_r("hrm-nt8"), phase_w(),
            *[f(arm) for arm in ("hrm-nt4", "hrm-nt12") for f in (phase_a, phase_b, phase_c, phase_r)],
            *[f(arm) for f in (phase_a, phase_b, phase_c) for arm in ("hrm-nt8-d256", "tf-d256")], phase_r("hrm-nt8-d256")]


def all_jobs():
    return list(dict(j for g in groups() for j in g).items())


def next_jobs(workers):
    """The unfinished jobs of the first groups that have any, enough to keep `workers` busy."""
    todo = []
    for g in groups():
        todo += [(d, c) for d, c in g if not sweep.finished(d) and (d, c) not in todo]
        if len(todo) >= workers:
            break
    return todo


def hrm_dirs():
    """Every finished HRM run of this runner's jobs."""
    return [d for d, _ in all_jobs() if "hrm" in d.split(os.sep)[1] and sweep.finished(d)]


def read_finished():
    for d in hrm_dirs():
        if not os.path.exists(alive_path(d)) and os.path.exists(os.path.join(d, "ckpt_last.pt")):
            print(f"reading {d}", flush=True)
            reading(d)


def run(workers):
    """Run what is missing, phase by phase, reading each finished HRM run (its phase B depends on it)."""
    while True:
        todo = next_jobs(workers)
        if not todo:
            return
        sweep.run_all(todo, workers)
        read_finished()
        left = next_jobs(workers)
        if {d for d, _ in left} == {d for d, _ in todo}:
            held = [d for d, _ in left if os.path.isdir(d) and ep.busy(d)]
            if not held:
                from common import fail
                fail(f"{len(left)} runs did not finish (see each out_dir's train.out), first: {left[0][0]}",
                     code=1, prog="alive.py")
            import time
            print(f"waiting for {len(held)} runs another runner holds", flush=True)
            time.sleep(60)


# --- tables, from the committed logs and readings alone -------------------------------------------

def final_alphas(out_dir):
    """alpha_L, alpha_H of the run's last logged evaluation (log.jsonl carries them since this runner)."""
    last = sweep.run_log(out_dir)[-1]
    return last.get("alpha_L"), last.get("alpha_H")


def alive_cells(out_dir):
    """'alpha_L / alpha_H | blocks off: Fast, Slow, both' of a run; '-' where not read."""
    r = reading(out_dir)
    if r is None:
        a = final_alphas(out_dir)
        return (f"{a[0]:.3f} / {a[1]:.3f}" if None not in a else "-") + " | not read"
    return (f"{r['alpha_L']:.3f} / {r['alpha_H']:.3f} | {r['off_L']:+.3f}, {r['off_H']:+.3f}, {r['off_both']:+.3f}"
            + ("" if r["off_both"] >= ALIVE else " (off)"))


def selection_table():
    print(f"### Alive HRM: selection at seed {SELECT[0]} (not a test seed), {ep.ITERS} iterations\n")
    print(f"alpha: the final alpha_L / alpha_H (initialised at 0.1). Blocks off: val CE with the Fast block's alpha, "
          f"the Slow block's, and both set to 0 (gates kept), minus val CE; (off): both cost under {ALIVE} nats, the "
          f"recurrence is switched off and the run cannot be chosen. 64 validation sequences of 128 characters.\n")
    print("| arm | remedy | lr | val CE | alpha_L / alpha_H | blocks off: Fast, Slow, both | H frozen |")
    print("|---|---|---|---|---|---|---|")
    for arm in HRM_ARMS + TF_ARMS:
        for r, k in sorted(tried(arm), key=lambda rk: (list(REMEDIES).index(rk[0]), rk[1])):
            d = job(arm, r, k, SELECT[0])[0]
            rd = reading(d) if arm in HRM_ARMS else None
            cells = alive_cells(d) if arm in HRM_ARMS else "- | -"
            hf = f"{rd['h_frozen']:+.3f}" if rd else "-"
            print(f"| {arm} | {r} | {ep.lr_text(ep.lr_of(arm, k))} | {sweep.cell(d)} | {cells} | {hf} |")
    print()


def test_rows():
    """{arm: {seed: val CE}} at each arm's choice, for finished test runs."""
    out = {}
    for arm in HRM_ARMS + TF_ARMS:
        c = chosen(arm)
        if c:
            out[arm] = sweep.by_seed([job(arm, *c, s)[0] for s in SEEDS])
    out["hrm-nt8-lr1.25e-3"] = sweep.by_seed([d for d, _ in phase_w()])
    return {k: v for k, v in out.items() if v}


def test_table():
    table = test_rows()
    if not table:
        return
    print(f"### Alive HRM against the Transformer: each arm's choice at the test seeds {', '.join(map(str, SEEDS))}"
          f" (paired by seed; 95% intervals; negative = HRM better)\n")
    print("| arm | remedy, lr | seeds | mean | vs Transformer: diff [95% CI], p | verdict |\n|---|---|---|---|---|---|")
    for arm, vals in table.items():
        base = TF_OF.get(arm if arm in TF_OF else "hrm-nt8")
        c = chosen(arm) if arm in HRM_ARMS + TF_ARMS else ("paper", WIDTH[1])
        d = stats.paired(vals, table[base]) if base in table and arm not in TF_ARMS else None
        m = sweep.mean_sd(list(vals.values()))[0]
        print(f"| {arm} | {c[0]}, {ep.lr_text(ep.lr_of(arm if arm in ep.ARMS else 'hrm-nt8', c[1]))} | {len(vals)} | "
              f"{m:.3f} | {d or '-'} | {stats.verdict(d) if d else '-'} |")
    print()


def tables():
    selection_table()
    test_table()
    done = [d for d, _ in all_jobs() if sweep.finished(d)]
    print(f"{len(done)} runs committed; {len(all_jobs()) - len(done)} known still to run at this phase\n")


def main():
    ap = sweep.runner_parser(__doc__, "print the tables only, from the committed logs")
    args = ap.parse_args()
    os.chdir(sweep.ROOT)
    if args.dry_run:
        sweep.dry_run(all_jobs())
        return
    if not args.tables:
        sweep.require_data("alive.py", [("shakespeare_char", "--dataset=shakespeare_char")])
        run(args.workers)
        read_finished()
    tables()


if __name__ == "__main__":
    main()
