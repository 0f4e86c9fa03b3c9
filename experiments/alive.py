"""
Is HRM's recurrence alive in the runs we compare? (docs/RESULTS.md section 10.) At the learning rates that tune
best on the character testbed, AdamW moves a scalar up to ~lr a step, and HRM's learned injection scales alpha_L,
alpha_H (initialised at 0.1) can collapse to ~0: the shared blocks then add nothing and the model is its input
block and output fusion. This runner measures it and tries remedies (off by default; the paper's setting stays
train.py's default), at section 9's headline arms and schedule (experiments/equalparam.py: post-norm, 2000 iterations of
8 x 128 characters, warmup 200, cosine to lr/10, K = 2).

    python experiments/alive.py               # the runs still missing (two at a time, one thread each), their
                                       # readings, then the tables
    python experiments/alive.py --workers=1   # one at a time; a second copy started later shares the work
    python experiments/alive.py --dry-run     # the train.py commands still to run (at this phase); run nothing
    python experiments/alive.py --tables      # tables only, from the committed logs (experiments/logs/alive/, equalparam/)

Remedies:
  paper      alpha learned at the global lr (the paper, section 9's runs)
  fixed      alpha_L and alpha_H held at 0.1, not learned (--learn_alpha=False)
  mult0.1    alpha_L, alpha_H and tau at 0.1x the global lr (--scalar_lr_mult=0.1)
  mult0.01   the same at 0.01x
Phases (hyperparameters are chosen on seeds 7 and 8, which no test uses):
  A. selection, seed 7: for each HRM arm every remedy at the arm's centre lr (equalparam.py's) and half of it, grown
     a factor 2 at a time where a remedy's best alive run is at an edge, and downward while none is alive; the
     Transformers at their centre, half and double. NT=8 at d=128 first.
  B. the runner-up rule for every arm: the best and the runner-up (remedy, lr) with seed 8 too; the chosen one is
     the lower 2-seed mean. For HRM only alive runs compete: both blocks off must cost >= ALIVE nats at seed 7.
  C. the test: each arm's choice at seeds 1337, 42, 2024 (paired by seed with the Transformer of its width).
  W. the width control: HRM NT=8 at d=128 at lr 1.25e-3 (d=256's lr), the paper's setting, the test seeds;
     paired with section 9's d=256 runs (the same setting and lr) and read against d=256's reruns.
  BPE: the BPE testbed's post-norm HRM and Transformer at their best 400-iteration lr for 2000 iterations, and the
       Transformer at 1e-3 too (bpe_runs).
  S (first): sections 2-5's HRM (the sweep's hrm-post and hrm-pre at their best lr, 3 seeds) again, for readings;
     (last) sections 3, 4, 6 and 7's HRM again too: the HRM controls, the BPE sweep's, the long run's and
     beyond_paper.py's (earlier).
Readings: for every finished HRM run, alive.json beside its log (from its last checkpoint, 64 validation sequences
of 128 characters): alpha_L, alpha_H, val CE, and the CE cost of the Fast block off, the Slow block off, both off
(analyze.py's alive readings), of z_H frozen (H-frozen), val CE at 0.5x-4x the trained depth; for test-seed runs
also token-by-token decoding's CE under each KV cache policy (full, last, fired).
"""

import argparse
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
REACH = 4                        # the lr grid grows at most 2^4 = 16x from the centre either way
HRM_START = (-2, -3)             # HRM's selection starts at the centre lr / 4 and / 8 (phase_a says why)
WIDTH = ("hrm-nt8", -3)          # (arm, k): lr 1e-2 * 2^-3 = 1.25e-3, the paper's setting


def job(arm, remedy, k, seed, name=None, extra=()):
    """(out_dir, command) of one run: equalparam's arm at its centre lr times 2^k, with the remedy's overrides.
    A paper-setting run at a test seed that equalparam has committed (section 9's) counts here; every other run is
    this runner's (out-alive/<arm>-<remedy>/, or out-alive/<name>/), so that none changes section 9's selection."""
    if remedy == "paper" and seed in SEEDS and name is None and sweep.finished(ep.job(arm, k, seed)[0]):
        return ep.job(arm, k, seed)
    d, cmd = ep.job(arm, k, seed, REMEDIES[remedy] + list(extra), name=name or f"{arm}-{remedy}")
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
        if not sweep.finished(out_dir) or not sweep.last_ckpt(out_dir):
            return None
        import torch
        from tools.analyze import alive, decode_ce, depth_table, load, slow_module_frozen, step_stats, val_batches, val_ce
        torch.set_num_threads(1)
        model, ck = load(out_dir, sweep.last_ckpt(out_dir), "cpu")
        if ck["iter_num"] != sweep.max_iters_of(sweep.facts(out_dir)["command"].split()):
            return None   # cut off before its last iteration
        batches = val_batches(ck, os.path.join(sweep.ROOT, "data"), 16, 4, model.config.block_size)
        ce = val_ce(model, batches, "cpu")
        with slow_module_frozen(model):
            frozen = val_ce(model, batches, "cpu") - ce
        r = {"iter": ck["iter_num"], "ce": ce, "h_frozen": frozen, **alive(model, batches, "cpu", ce),
             "depth": depth_table(model, batches, "cpu", sweep.DEPTHS)}
        steps, r["fusion"] = step_stats(model, batches, "cpu")
        r["gate_L"] = sum(x["gate"] for x in steps) / len(steps)   # the Fast module's mean gate g over the steps
        if int(sweep.seed_of(out_dir)) in SEEDS and out_dir.split(os.sep)[1].startswith("hrm-nt"):   # decoding's CE
            # by policy too, for the headline arms' test runs (docs/RESULTS.md section 10's depth/KV table)
            r["kv"] = {kv: decode_ce(model, batches, "cpu", kv) for kv in ("full", "last", "fired")}
        from hrmlm.common import atomic_write
        with atomic_write(path) as f:
            json.dump(r, f, indent=1)
    return sweep.committed_json(path, (("off_both", (int, float)),))


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
    """The selection grid's start; then, for each remedy, one lr step outward where its best alive seed-7 run is at
    an edge of what was tried, or one step below the lowest lr tried where no run is alive yet (for HRM only
    alive runs compete: a lower lr keeps alpha from collapsing). HRM starts at a quarter and an eighth of the
    centre: NT=8 at d=128, which started at the centre and half of it, was switched off there under every remedy
    (experiments/logs/alive/hrm-nt8-*/lr1e-2, lr5e-3) and alive from a quarter down; the growth rule still brackets."""
    start = HRM_START if arm in HRM_ARMS else (0, -1, 1)
    rems = REMEDIES if arm in HRM_ARMS else ["paper"]
    jobs = [job(arm, r, k, SELECT[0]) for k in start for r in rems] + [job(arm, r, k, SELECT[0]) for r, k in tried(arm)]
    for r in rems:
        ks = [k for rr, k in tried(arm) if rr == r]
        live = {k: True if arm in TF_ARMS else is_alive(job(arm, r, k, SELECT[0])[0]) for k in ks}
        if not ks or not all(k in ks for k in start) or None in live.values():
            continue   # the start not through, or a run not read yet
        ok = [k for k in ks if live[k]]
        nxt = [min(ks) - 1] if not ok else [j for j in (min(ok, key=lambda k: val(arm, r, k, SELECT[0])) + d
                                                        for d in (-1, 1))]
        jobs += [job(arm, r, j, SELECT[0]) for j in nxt if abs(j) <= REACH]
    return jobs


def top_two(arm):
    """The best and the runner-up of the arm's selection (once bracketed: each has its lr neighbours tried)."""
    r = ranked(arm)
    if not r or any(not sweep.finished(d) for d, _ in phase_a(arm)):
        return []   # nothing alive yet, or the selection grid still growing
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


def phase_warm():
    """Section 9's warmup control (HRM NT=12 with the paper's warmup rule) again, as phase_r does for an arm."""
    name, arm, extra = ep.CONTROL
    k = ep.chosen_k(arm)
    return [] if k is None else [job(arm, "paper", k, s, name=f"{name}-rerun", extra=extra) for s in SEEDS]


SWEEP = ("hrm-post", "hrm-pre")   # sections 2-6's HRM: the character sweep's variants
CONTROLS = ("hrm_fast_only-post", "hrm_fast_only_wide-post", "hrm_clip1-post", "hrm_rdepth-post")   # section 3's


def earlier():
    """Sections 2-7's HRM runs again, for the checkpoints their logs lack, as [(section, variant, lr, seed, committed
    out_dir, (rerun out_dir, command))]: sections 2-5's character sweep and section 4's BPE sweep (hrm-post and
    hrm-pre at their best 400-iteration lr), section 3's HRM controls (the same), section 5's K ablation (post-norm
    HRM with K = 1 and K = 4 at its best lr), section 6's long run (4000 iterations at its chosen lr) and section
    7's variants (lr 3e-3, 300 iterations). A section is left out where its runner's logs are not here."""
    import long_run
    import beyond_paper as bp
    out = []
    char = lambda v: sweep.best_lr("char", v)   # noqa: E731
    for sec, tb, variants, pick, iters, root in (
            ("2-5", "char", SWEEP, char, None, OUT), ("3", "char", CONTROLS, char, None, f"{OUT}/s3"),
            ("4", "bpe", SWEEP, lambda v: sweep.best_lr("bpe", v), None, f"{OUT}/s4"),
            ("5", "char", sweep.K_ABLATION, char, None, f"{OUT}/s5"),   # K = 2 is sections 2-5's own run
            ("6", "char", SWEEP, long_run.chosen, long_run.ITERS, f"{OUT}/s6")):
        for v, args, extra in ((v, (), "") if isinstance(v, str) else v for v in variants):
            if (lr := pick(v)) is not None:
                out += [(sec, " ".join([v, *(a.lstrip("-") for a in args)]), lr, s, sweep.command(
                    tb, v, lr, s, args, extra, iters=iters, out=long_run.OUT if iters else sweep.OUT)[0],
                    sweep.command(tb, v, lr, s, args, extra, iters=iters, out=root)) for s in SEEDS]
    args = argparse.Namespace(out=bp.OUT, max_iters=300, data_dir="data")   # beyond_paper.py's defaults
    again = argparse.Namespace(**{**vars(args), "out": f"{OUT}/s7"})
    for v in bp.VARIANTS:
        for s in bp.SEEDS:
            if bp.finished(d := bp.command(args, v, s)[0]):
                out.append(("7", v, 3e-3, s, d, bp.command(again, v, s)))   # lr: config/char_testbed.py's
    return out


def phase_s(sections=("2-5",)):
    """The runs of earlier() in the given sections; sections 2-5's first (the first HRM section 10 read)."""
    return [rerun for sec, *_, rerun in earlier() if sec in sections]


BPE = ("hrm-post", "transformer-post")   # the BPE testbed's post-norm HRM and Transformer: a stall, or slow?
BPE_ITERS = 2000


BPE_LOW = {"transformer-post": 1e-3}   # also at 1e-3: see bpe_runs


def bpe_runs():
    """(variant, lr) of each BPE run: each at its best 400-iteration lr (experiments/sweep.py), and the post-norm
    Transformer at 1e-3 too, the low end of its flat 400-iteration curve (1e-3 to 3e-1 within 0.03, section 4) and
    HRM's best: at 1e-1 alone, a run that stays at the unigram line could be its lr's doing, not a stall."""
    runs = [(v, sweep.best_lr("bpe", v)) for v in BPE] + list(BPE_LOW.items())
    return [(v, lr) for v, lr in runs if sweep.best_lr("bpe", v) is not None]   # None: the sweep's logs are not here


def phase_bpe():
    """Each of bpe_runs for 2000 iterations, seed 1337: does the post-norm Transformer's 'stall' at the unigram line
    (section 4) end with 5x the training?"""
    return [sweep.command("bpe", v, lr, SEEDS[0], iters=BPE_ITERS, out=OUT) for v, lr in bpe_runs()]


def groups():
    """The jobs in the order they run, as groups: each arm's selection and test before the next arm's, so every
    session's work completes a comparison (NT=8 at d=128 and its Transformer first)."""
    return [phase_s(), phase_a("hrm-nt8"), phase_a("tf-d128"), phase_b("hrm-nt8") + phase_b("tf-d128"),
            phase_c("hrm-nt8") + phase_c("tf-d128"), phase_r("hrm-nt8"), phase_w(), phase_bpe(),
            *[f(arm) for arm in ("hrm-nt4", "hrm-nt12") for f in (phase_a, phase_b, phase_c, phase_r)],
            *[f(arm) for f in (phase_a, phase_b, phase_c) for arm in ("hrm-nt8-d256", "tf-d256")], phase_r("hrm-nt8-d256"),
            phase_s(("4", "7", "3")), phase_s(("6",)), phase_s(("5",)), phase_warm()]


def all_jobs():
    return list(dict(j for g in groups() for j in g).items())


def next_jobs(workers):
    """The unfinished jobs of the first group that has any, and from the groups after it just enough to make
    a multiple of `workers`, so no core idles beside a lone run (3 runs, 2 workers: the next group's first run
    comes along). The plan is made again after each batch, as finished runs unlock later phases."""
    todo = []
    for g in groups():
        new = [(d, c) for d, c in g if not sweep.finished(d) and (d, c) not in todo]
        todo += new[:-len(todo) % workers] if todo else new
        if todo and len(todo) % workers == 0:
            break
    return todo


def hrm_dirs():
    """Every finished HRM run of this runner's jobs."""
    return [d for d, _ in all_jobs() if "hrm" in d and sweep.finished(d)]


def read_finished():
    for d in hrm_dirs():
        if not os.path.exists(alive_path(d)) and sweep.last_ckpt(d):
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
                from hrmlm.common import fail
                fail(f"{len(left)} runs did not finish (see each out_dir's train.out), first: {left[0][0]}",
                     code=1, prog="alive.py")
            import time
            print(f"waiting for {len(held)} runs another runner holds", flush=True)
            time.sleep(60)


# --- tables, from the committed logs and readings alone -------------------------------------------

def ms(vals, fmt=".3f"):
    """'mean ± sd' of the values (one value: itself; '-' where there are none, as a Slow block a model lacks)."""
    if all(v is None for v in vals):
        return "-"
    m, sd, n = sweep.mean_sd(vals)
    return f"{m:{fmt}}" + (f" ± {sd:.3f}" if n > 1 else "")


def alive_cells(dirs):
    """'alpha_L / alpha_H | blocks off: Fast, Slow, both | H frozen' over the read runs (mean ± sd); '(off)' where a
    run's both-off cost is under ALIVE; the last logged alphas where no run was read."""
    rs = [r for r in map(reading, dirs) if r]
    if not rs:
        last = [sweep.run_log(d)[-1] for d in dirs]
        a = [(r.get("alpha_L"), r.get("alpha_H")) for r in last]
        cells = f"{ms([x for x, _ in a])} / {ms([y for _, y in a])}" if a and None not in a[0] else "-"
        return cells + " | not read | -"
    off = sum(r["off_both"] < ALIVE for r in rs)
    return (f"{ms([r['alpha_L'] for r in rs])} / {ms([r['alpha_H'] for r in rs])} | "
            f"{ms([r['off_L'] for r in rs], '+.3f')}, {ms([r['off_H'] for r in rs], '+.3f')}, "
            f"{ms([r['off_both'] for r in rs], '+.3f')}" + ("" if not off else " (off)" if len(rs) == 1 else
                                                  f" ({off} of {len(rs)} off)") +
            f" | {ms([r['h_frozen'] for r in rs], '+.3f')}")


LEGEND = (f"alpha: the final alpha_L / alpha_H (initialised at 0.1). Blocks off: val CE with the Fast block's alpha, the "
          f"Slow block's, and both set to 0 (the gates kept) minus val CE; (off): both cost under {ALIVE} nats, the "
          f"recurrence is switched off. H frozen: val CE with z_H held at z_H0 minus val CE. Readings from the last "
          f"checkpoint, 64 validation sequences of 128 characters.\n")


def selection_table():
    if not any(tried(arm) for arm in HRM_ARMS + TF_ARMS):
        return
    print(f"### Alive HRM: selection on seeds {SELECT[0]} and {SELECT[1]} (no test uses them), {ep.ITERS} iterations "
          f"(* = the arm's choice)\n")
    print(LEGEND)
    print(f"| arm | remedy | lr | val CE, seed {SELECT[0]} | seed {SELECT[1]} | alpha_L / alpha_H | blocks off: Fast, "
          f"Slow, both | H frozen |\n|---|---|---|---|---|---|---|---|")
    for arm in HRM_ARMS + TF_ARMS:
        for r, k in sorted(tried(arm), key=lambda rk: (list(REMEDIES).index(rk[0]), rk[1])):
            d, d8 = job(arm, r, k, SELECT[0])[0], job(arm, r, k, SELECT[1])[0]
            cells = alive_cells([d]) if arm in HRM_ARMS else "- | - | -"
            star = "*" if chosen(arm) == (r, k) else ""
            print(f"| {arm} | {r} | {ep.lr_text(ep.lr_of(arm, k))}{star} | {sweep.cell(d)} | "
                  f"{sweep.cell(d8) if sweep.finished(d8) else '-'} | {cells} |")
    print()


def read_on(arm, remedy, k, seed):
    """The run whose checkpoint a reading of (arm, remedy, k, seed) comes from: the run itself, or, for section 9's
    committed runs (logs only), their reruns (phase_r). Which is the case where an arm's choice is section 9's."""
    d = job(arm, remedy, k, seed)[0]
    return job(arm, "paper", k, seed, name=f"{arm}-rerun")[0] if arm in HRM_ARMS and d == ep.job(arm, k, seed)[0] \
        else d


def section9_dirs(arm):
    return [job(arm, "paper", ep.shown_k(arm)[0], s)[0] for s in SEEDS] if ep.shown_k(arm)[0] is not None else []


def test_rows():
    """{row: {seed: val CE}} at the test seeds: each arm's choice, section 9's HRM (the paper's setting at its
    lr), and the width control; finished runs only."""
    out = {}
    for arm in HRM_ARMS + TF_ARMS:
        if chosen(arm):
            out[arm] = sweep.by_seed([job(arm, *chosen(arm), s)[0] for s in SEEDS])
    for arm in HRM_ARMS:
        out[f"{arm} (section 9)"] = sweep.by_seed(section9_dirs(arm))
    out["hrm-nt8 at lr 1.25e-3"] = sweep.by_seed([d for d, _ in phase_w()])
    return {k: v for k, v in out.items() if v}


def test_table():
    table = test_rows()
    rows = [(a, TF_OF[a], f"alive HRM {a[4:].upper()} vs Transformer ({TF_OF[a]})") for a in HRM_ARMS] + \
           [(a, f"{a} (section 9)", f"alive HRM vs section 9's HRM ({a[4:].upper()})") for a in HRM_ARMS] + \
           [("hrm-nt8 at lr 1.25e-3", "hrm-nt8 (section 9)", "HRM NT=8 d=128: lr 1.25e-3 vs section 9's 1e-2"),
            ("hrm-nt8 at lr 1.25e-3", "tf-d128", "HRM NT=8 d=128 at lr 1.25e-3 vs Transformer"),
            ("hrm-nt8-d256 (section 9)", "hrm-nt8 at lr 1.25e-3", "the paper's setting at lr 1.25e-3: d=256 vs d=128")]
    same = [f"{a} (section 9)" for a in HRM_ARMS if chosen(a) == ("paper", ep.shown_k(a)[0])]   # the same runs
    rows = [(a, b, q) for a, b, q in rows if a in table and b in table and b not in same]
    if not table:
        return
    print(f"### Alive HRM at the test seeds ({', '.join(map(str, SEEDS))}): each arm's choice, {ep.ITERS} iterations\n")
    print("| row | remedy, lr | seeds | val CE (mean ± sd) | alpha_L / alpha_H | blocks off: Fast, Slow, both | "
          "H frozen |\n|---|---|---|---|---|---|---|")
    for name, vals in table.items():
        arm = name.split()[0]
        c = chosen(arm) if name in HRM_ARMS + TF_ARMS else ("paper", WIDTH[1]) if "1.25e-3" in name else \
            ("paper", ep.shown_k(arm)[0])
        dirs = [job(arm, *c, s, name="hrm-nt8-width")[0] if "1.25e-3" in name else read_on(arm, *c, s)
                for s in SEEDS]
        cells = alive_cells([d for d in dirs if sweep.finished(d)]) if "hrm" in name else "- | - | -"
        if "rerun" in dirs[0]:   # section 9's runs have no checkpoints: the readings are the reruns'
            cells += " (reruns)"
        print(f"| {name} | {c[0]}, {ep.lr_text(ep.lr_of(arm, c[1]))} | {len(vals)} | {ms(list(vals.values()))} | "
              f"{cells} |")
    print()
    if rows:
        print("### Alive HRM at the test seeds: differences (row minus column, paired by seed; 95% intervals; "
              "negative = row better)\n")
        print("| row | column | question | diff [95% CI], p | verdict |\n|---|---|---|---|---|")
        for a, b, q in rows:
            d = stats.paired(table[a], table[b])
            print(f"| {a} | {b} | {q} | {d or '-'} | {stats.verdict(d)} |")
        print()


def reruns_table():
    """Section 9's HRM runs trained again for their checkpoints: the committed CE, the rerun's, and what it reads."""
    got = [(arm, s, rerun, d) for arm in HRM_ARMS for s, (rerun, _), d in zip(SEEDS, phase_r(arm), section9_dirs(arm))]
    got += [(ep.CONTROL[0], s, rerun, ep.control_job(s)[0]) for s, (rerun, _) in zip(SEEDS, phase_warm())]
    got = [g for g in got if sweep.finished(g[2])]
    if not got:
        return
    print("### Section 9's HRM, trained again for its checkpoints: is its recurrence alive?\n")
    print("The same command as the committed run (this machine's float32 may differ from the one that made it in the "
          "last digits, which post-norm HRM at lr 1e-2 amplifies).\n")
    print("| arm | seed | val CE, committed | val CE, rerun | alpha_L / alpha_H | blocks off: Fast, Slow, both | "
          "H frozen |\n|---|---|---|---|---|---|---|")
    for arm, s, rerun, d in got:
        print(f"| {arm} | {s} | {sweep.cell(d)} | {sweep.cell(rerun)} | {alive_cells([rerun])} |")
    print()


def earlier_table():
    """Sections 2-7's HRM, trained again (earlier()): the committed and rerun CE, and what the rerun reads."""
    got = [g for g in earlier() if sweep.finished(g[5][0])]
    if not got:
        return
    print("### Sections 2-7's HRM, trained again for its checkpoints: is its recurrence alive?\n")
    print("Sections 2-5: the character sweep (400 iterations at the best lr); 3: its HRM controls (the same); 4: the BPE "
          "sweep (400 iterations); 5: the K ablation (the same, K = 1 and 4); 6: the long run (4000 iterations); 7: beyond "
          "the paper (N=4, T=2, 300 iterations).\n")
    print("| section | variant | lr | seed | val CE, committed | val CE, rerun | alpha_L / alpha_H | blocks off: Fast, "
          "Slow, both | H frozen |\n|---|---|---|---|---|---|---|---|---|")
    for sec, v, lr, s, d, (rerun, _) in got:
        print(f"| {sec} | {v} | {ep.lr_text(lr)} | {s} | {sweep.cell(d)} | {sweep.cell(rerun)} | {alive_cells([rerun])} |")
    print()


def readings_table():
    """Depth at inference and the KV cache policies on the test runs' checkpoints (mean over the seeds read)."""
    groups = [(a, [read_on(a, *chosen(a), s) for s in SEEDS]) for a in HRM_ARMS if chosen(a)] + \
             [(f"{a} (section 9, reruns)", [d for d, _ in phase_r(a)]) for a in HRM_ARMS if phase_r(a)] + \
             [("hrm-nt8 at lr 1.25e-3", [d for d, _ in phase_w()])]
    groups = [(n, [r for r in map(reading, ds) if r]) for n, ds in groups]
    groups = [(n, rs) for n, rs in groups if rs]
    if not groups:
        return
    print("### Alive HRM at the test seeds: depth at inference and KV cache policies (mean ± sd over the seeds read)\n")
    print("Depth: val CE with N' = f N Slow firings (T kept). KV: token-by-token decoding's val CE under each policy "
          "minus the exact cache's (docs/MODEL.md section 5).\n")
    print("| row | seeds | " + " | ".join(f"N' {f:g}x" for f in sweep.DEPTHS) + " | KV last - full | KV fired - full |")
    print("|---|---|" + "---|" * (len(sweep.DEPTHS) + 2))
    for name, rs in groups:
        depth = [ms([[x["ce"] for x in r["depth"] if x["varied"] == "N"][i] for r in rs])
                 for i in range(len(sweep.DEPTHS))]
        kv = [r["kv"] for r in rs if "kv" in r]
        kvc = [ms([k[p] - k["full"] for k in kv], "+.4f") if kv else "-" for p in ("last", "fired")]
        print(f"| {name} | {len(rs)} | " + " | ".join(depth) + f" | {kvc[0]} | {kvc[1]} |")
    print()


def bpe_table():
    done = [(v, lr, d) for (v, lr), (d, _) in zip(bpe_runs(), phase_bpe()) if sweep.finished(d)]
    if not done:
        return
    uni = sweep.unigrams()["bpe"]
    its = (400, 1000, 2000)
    print(f"### BPE testbed, post-norm, {BPE_ITERS} iterations at the best 400-iteration lr (the Transformer also at "
          f"1e-3), seed {SEEDS[0]} (unigram line {uni:.3f})\n")
    print("| variant | lr | " + " | ".join(f"val CE at {i}" for i in its) + " | below unigram at the end | "
          "alpha_L / alpha_H | blocks off: Fast, Slow, both | H frozen |\n|---|---|" + "---|" * (len(its) + 4))
    for v, lr, d in done:
        log = {r["iter"]: r for r in sweep.run_log(d) if "val_loss" in r}
        cells = " | ".join(f"{log[i]['val_loss']:.3f}" if i in log else "-" for i in its)
        alive = alive_cells([d]) if "hrm" in v else "- | - | -"
        print(f"| {v} | {ep.lr_text(lr)} | {cells} | {uni - sweep.final_val(d):+.3f} | {alive} |")
    print()


def tables():
    selection_table()
    test_table()
    readings_table()
    reruns_table()
    earlier_table()
    bpe_table()
    done = [d for d, _ in all_jobs() if sweep.finished(d)]
    from long_run import train_seconds
    hours = sum(train_seconds(sweep.run_log(d)) for d in done) / 3600
    print(f"{len(done)} runs committed ({hours:.1f} hours of training, one core each); {len(all_jobs()) - len(done)} "
          f"known still to run at this phase\n")


def main():
    sweep.runner_main(__doc__, all_jobs, lambda workers: (run(workers), read_finished()), tables,
                      [("shakespeare_char", "--dataset=shakespeare_char"), ("shakespeare", "")])


if __name__ == "__main__":
    from hrmlm.signals import exit_on_signals   # Ctrl-C, SIGTERM, SIGHUP: one line in every phase
    exit_on_signals()
    main()
