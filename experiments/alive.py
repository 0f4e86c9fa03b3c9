"""
Is HRM's recurrence alive in the runs we compare? (docs/RESULTS.md section 10.) At the learning rates that tune best,
AdamW moves a scalar up to ~lr a step, and HRM's injection scales alpha_L, alpha_H (initialised at 0.1) can collapse
to ~0: the model is then its input block and output fusion. This study measures it (alive.json beside each HRM run's
log) and tries remedies (REMEDIES, off by default) at section 9's arms and schedule (equalparam.py).

    python experiments/alive.py               # the runs still missing, their readings, then the tables
    python experiments/alive.py --dry-run     # the train.py commands still to run (at this phase); run nothing
    python experiments/alive.py --tables      # tables only, from the committed logs (experiments/logs/alive/, equalparam/)

Phases (groups(), in run order): A, B: each arm's (remedy, lr) chosen on seeds 7 and 8, alive runs only; C: the choice
at the test seeds; W: the width control; BPE: the BPE pair for 2000 iterations; R, S: sections 2-9's HRM trained
again for the checkpoints their committed logs lack.
"""

import os

import arms
import report
import runner
from arms import SEEDS, by_seed, command, lr_of, lr_text
from hrmlm import signals
from report import ALIVE, ALIVE_COLS, heading, ms
from tools import analyze

OUT = "out-alive"
SELECT = (7, 8)                  # selection seeds: never in a test
REMEDIES = {"paper": [], "fixed": ["--learn_alpha=False"], "mult0.1": ["--scalar_lr_mult=0.1"],
            "mult0.01": ["--scalar_lr_mult=0.01"]}
HRM_ARMS = ("hrm-nt8", "hrm-nt4", "hrm-nt12", "hrm-nt8-d256")
TF_OF = {"hrm-nt4": "tf-d128", "hrm-nt8": "tf-d128", "hrm-nt12": "tf-d128", "hrm-nt8-d256": "tf-d256"}
TF_ARMS = ("tf-d128", "tf-d256")
REACH = 4                        # the lr grid grows at most 2^4 = 16x from the centre either way
# HRM's selection starts at the centre lr / 4 and / 8: NT=8 at d=128, which started at the centre and half of it, was
# switched off there under every remedy (experiments/logs/alive/hrm-nt8-*/lr1e-2, lr5e-3), alive from a quarter down
HRM_START = (-2, -3)
WIDTH = ("hrm-nt8", -3)          # (arm, k): lr 1e-2 * 2^-3 = 1.25e-3, the paper's setting
SWEEP = ("hrm-post", "hrm-pre")   # sections 2-6's HRM: the character sweep's variants
CONTROLS = ("hrm_fast_only-post", "hrm_fast_only_wide-post", "hrm_clip1-post", "hrm_rdepth-post")   # section 3's
BPE = ("hrm-post", "transformer-post")   # the BPE testbed's post-norm HRM and Transformer: a stall, or slow?
BPE_ITERS = 2000


def job(arm, remedy, k, seed, name=None, extra=()):
    """(out_dir, command): equalparam's arm at its centre lr times 2^k with the remedy's overrides, under out-alive/ so
    that none changes section 9's selection; a paper-setting run at a test seed that section 9 committed is its."""
    if remedy == "paper" and seed in SEEDS and name is None and runner.finished(arms.arm_job(arm, k, seed)[0]):
        return arms.arm_job(arm, k, seed)
    return arms.arm_job(arm, k, seed, REMEDIES[remedy] + list(extra), name=name or f"{arm}-{remedy}", out=OUT)


def val(arm, remedy, k, seed):
    return runner.final_val(job(arm, remedy, k, seed)[0])


def reading(out_dir):
    """The committed alive.json of a run (report.alive_reading), with depth at inference, the fusion's weights and the
    Fast module's gate too."""
    def more(model, batches):
        r = {"depth": analyze.depth_table(model, batches, "cpu", report.DEPTHS)}
        steps, r["fusion"] = analyze.step_stats(model, batches, "cpu")
        r["gate_L"] = sum(x["gate"] for x in steps) / len(steps)   # the Fast module's mean gate g over the steps
        if int(runner.seed_of(out_dir)) in SEEDS and out_dir.split(os.sep)[1].startswith("hrm-nt"):   # decoding's CE
            # by policy too, for the headline arms' test runs (docs/RESULTS.md section 10's depth/KV table)
            r["kv"] = {kv: analyze.decode_ce(model, batches, "cpu", kv) for kv in ("full", "last", "fired")}
        return r
    return report.alive_reading(out_dir, more)


def is_alive(arm, remedy, k):
    """Whether the seed-7 run is alive (a Transformer always is); None where it is not read yet."""
    r = None if arm in TF_ARMS else reading(job(arm, remedy, k, SELECT[0])[0])
    return arm in TF_ARMS or (None if r is None else r["off_both"] >= ALIVE)


def tried(arm):
    """The (remedy, k) of the arm's finished seed-7 runs."""
    rems = REMEDIES if arm in HRM_ARMS else ["paper"]
    return [(r, k) for r in rems for k in range(-REACH, REACH + 1) if runner.finished(job(arm, r, k, SELECT[0])[0])]


def phase_a(arm):
    """The selection grid's start; then, per remedy, one lr step outward where its best alive seed-7 run is at an edge
    of what was tried, or one below the lowest where none is alive yet (a lower lr keeps alpha from collapsing)."""
    start = HRM_START if arm in HRM_ARMS else (0, -1, 1)
    rems = REMEDIES if arm in HRM_ARMS else ["paper"]
    jobs = [job(arm, r, k, SELECT[0]) for k in start for r in rems] + [job(arm, r, k, SELECT[0]) for r, k in tried(arm)]
    for r in rems:
        ks = [k for rr, k in tried(arm) if rr == r]
        live = {k: is_alive(arm, r, k) for k in ks}
        if not ks or not all(k in ks for k in start) or None in live.values():
            continue   # the start not through, or a run not read yet
        ok = [k for k in ks if live[k]]
        nxt = [min(ks) - 1] if not ok else [min(ok, key=lambda k: val(arm, r, k, SELECT[0])) + d for d in (-1, 1)]
        jobs += [job(arm, r, j, SELECT[0]) for j in nxt if abs(j) <= REACH]
    return jobs


def top_two(arm):
    """The best and the runner-up of the arm's alive seed-7 runs, once the selection grid is through and the best is
    bracketed (its lr neighbours tried); else []."""
    ranked = sorted([rk for rk in tried(arm) if is_alive(arm, *rk)], key=lambda rk: val(arm, *rk, SELECT[0]))
    if not ranked or any(not runner.finished(d) for d, _ in phase_a(arm)):
        return []   # nothing alive yet, or the selection grid still growing
    rem, k = ranked[0]
    if not all((rem, j) in tried(arm) or abs(j) > REACH for j in (k - 1, k + 1)):
        return []
    return ranked[:2]


def phase_b(arm):
    return [job(arm, r, k, SELECT[1]) for r, k in top_two(arm)]


def chosen(arm):
    """(remedy, k) with the lower 2-seed selection mean among the top two, once both have both seeds; else None."""
    two = top_two(arm)
    if not two or any(not runner.finished(job(arm, *rk, s)[0]) for rk in two for s in SELECT):
        return None
    return min(two, key=lambda rk: sum(val(arm, *rk, s) for s in SELECT))


def phase_c(arm):
    return [job(arm, *chosen(arm), s) for s in SEEDS] if chosen(arm) else []


def phase_w():
    return [job(WIDTH[0], "paper", WIDTH[1], s, name="hrm-nt8-width") for s in SEEDS]


def phase_r(arm, rerun=True):
    """Section 9's runs of the arm at its chosen lr; rerun: again, for the checkpoints their committed logs lack (the
    alive readings of the HRM that section 9 compared; a rerun's CE is shown beside the committed one)."""
    k = arms.shown_k(arm)[0]
    return [] if k is None else [job(arm, "paper", k, s, name=f"{arm}-rerun" if rerun else None) for s in SEEDS]


def phase_warm():
    """Section 9's warmup control (HRM NT=12 with the paper's warmup rule) again, as phase_r does for an arm."""
    name, arm, extra = arms.CONTROL
    k = arms.chosen_k(arm)
    return [] if k is None else [job(arm, "paper", k, s, name=f"{name}-rerun", extra=extra) for s in SEEDS]


def earlier():
    """Phase S (the module's docstring) as [(section, variant, lr, seed, committed out_dir, (rerun out_dir, command))];
    a section is left out where its study's logs are not here."""
    out = []
    char = lambda v: arms.best_lr("char", v)   # noqa: E731
    for sec, tb, variants, pick, iters, root in (
            ("2-5", "char", SWEEP, char, None, OUT), ("3", "char", CONTROLS, char, None, f"{OUT}/s3"),
            ("4", "bpe", SWEEP, lambda v: arms.best_lr("bpe", v), None, f"{OUT}/s4"),
            ("5", "char", arms.K_ABLATION, char, None, f"{OUT}/s5"),   # K = 2 is sections 2-5's own run
            ("6", "char", SWEEP, arms.long_chosen, arms.LONG_ITERS, f"{OUT}/s6")):
        for v, args, extra in ((v, (), "") if isinstance(v, str) else v for v in variants):
            if (lr := pick(v)) is not None:
                out += [(sec, " ".join([v, *(a.lstrip("-") for a in args)]), lr, s, command(
                    tb, v, lr, s, args, extra, iters=iters, out=arms.LONG_OUT if iters else arms.SWEEP_OUT)[0],
                    command(tb, v, lr, s, args, extra, iters=iters, out=root)) for s in SEEDS]
    # section 7 at beyond_paper.py's defaults (lr: config/char_hrm.py's)
    return out + [("7", v, 3e-3, s, d, arms.beyond_command(v, s, f"{OUT}/s7")) for v in arms.BEYOND for s in SEEDS
                  if runner.finished(d := arms.beyond_command(v, s)[0])]


def phase_s(sections=("2-5",)):
    """The runs of earlier() in the given sections; sections 2-5's first (the first HRM section 10 read)."""
    return [rerun for sec, *_, rerun in earlier() if sec in sections]


def bpe_runs():
    """(variant, lr) of each BPE run: each at its best 400-iteration lr, and the post-norm Transformer at 1e-3 too (the
    low end of its flat curve, and HRM's best): at 1e-1 alone, a stall at the unigram line could be the lr's doing."""
    runs = [(v, arms.best_lr("bpe", v)) for v in BPE] + [("transformer-post", 1e-3)]
    return [(v, lr) for v, lr in runs if arms.best_lr("bpe", v) is not None]   # None: the sweep's logs are not here


def phase_bpe():
    """Each of bpe_runs, seed 1337: does the post-norm Transformer's stall at the unigram line end with 5x training?"""
    return [command("bpe", v, lr, SEEDS[0], iters=BPE_ITERS, out=OUT) for v, lr in bpe_runs()]


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


# --- tables, from the committed logs and readings alone -------------------------------------------

LEGEND = (f"alpha: the final alpha_L / alpha_H (initialised at 0.1). Blocks off: val CE with the Fast block's alpha, the "
          f"Slow block's, and both set to 0 (the gates kept) minus val CE; (off): both cost under {ALIVE} nats, the "
          f"recurrence is switched off. H frozen: val CE with z_H held at z_H0 minus val CE. Readings from the last "
          f"checkpoint, 64 validation sequences of 128 characters.\n")


def alive_cells(dirs):
    """report.alive_cells, on this study's readings."""
    return report.alive_cells(dirs, reading)


def selection_table():
    if not any(tried(arm) for arm in HRM_ARMS + TF_ARMS):
        return
    heading(f"Alive HRM: selection on seeds {SELECT[0]} and {SELECT[1]} (no test uses them), {arms.EP_ITERS} "
            "iterations (* = the arm's choice)", "arm", "remedy", "lr", f"val CE, seed {SELECT[0]}",
            f"seed {SELECT[1]}", *ALIVE_COLS, note=LEGEND)
    for arm in HRM_ARMS + TF_ARMS:
        for r, k in sorted(tried(arm), key=lambda rk: (list(REMEDIES).index(rk[0]), rk[1])):
            d, d8 = job(arm, r, k, SELECT[0])[0], job(arm, r, k, SELECT[1])[0]
            cells = alive_cells([d]) if arm in HRM_ARMS else "- | - | -"
            star = "*" if chosen(arm) == (r, k) else ""
            print(f"| {arm} | {r} | {lr_text(lr_of(arm, k))}{star} | {report.cell(d)} | {report.cell(d8)} | {cells} |")
    print()


def read_on(arm, remedy, k, seed):
    """The run whose checkpoint a reading of (arm, remedy, k, seed) comes from: the run itself, or, for section 9's
    committed runs (logs only), their reruns (phase_r). Which is the case where an arm's choice is section 9's."""
    d = job(arm, remedy, k, seed)[0]
    section9 = arm in HRM_ARMS and d == arms.arm_job(arm, k, seed)[0]
    return job(arm, "paper", k, seed, name=f"{arm}-rerun")[0] if section9 else d


def test_table():
    """Each arm's choice, section 9's HRM and the width control (phase W) at the test seeds; then their differences."""
    table = {arm: by_seed([job(arm, *chosen(arm), s)[0] for s in SEEDS]) for arm in HRM_ARMS + TF_ARMS if chosen(arm)}
    table.update({f"{arm} (section 9)": by_seed([d for d, _ in phase_r(arm, False)]) for arm in HRM_ARMS})
    table["hrm-nt8 at lr 1.25e-3"] = by_seed([d for d, _ in phase_w()])
    table = {k: v for k, v in table.items() if v}
    rows = [(a, TF_OF[a], f"alive HRM {a[4:].upper()} vs Transformer ({TF_OF[a]})") for a in HRM_ARMS] + \
           [(a, f"{a} (section 9)", f"alive HRM vs section 9's HRM ({a[4:].upper()})") for a in HRM_ARMS] + \
           [("hrm-nt8 at lr 1.25e-3", "hrm-nt8 (section 9)", "HRM NT=8 d=128: lr 1.25e-3 vs section 9's 1e-2"),
            ("hrm-nt8 at lr 1.25e-3", "tf-d128", "HRM NT=8 d=128 at lr 1.25e-3 vs Transformer"),
            ("hrm-nt8-d256 (section 9)", "hrm-nt8 at lr 1.25e-3", "the paper's setting at lr 1.25e-3: d=256 vs d=128")]
    same = [f"{a} (section 9)" for a in HRM_ARMS if chosen(a) == ("paper", arms.shown_k(a)[0])]   # the same runs
    rows = [(a, b, q) for a, b, q in rows if a in table and b in table and b not in same]
    if not table:
        return
    heading(f"Alive HRM at the test seeds ({', '.join(map(str, SEEDS))}): each arm's choice, {arms.EP_ITERS} "
            "iterations", "row", "remedy, lr", "seeds", "val CE (mean ± sd)", *ALIVE_COLS)
    for name, vals in table.items():
        arm = name.split()[0]
        c = chosen(arm) if name in HRM_ARMS + TF_ARMS else ("paper", WIDTH[1]) if "1.25e-3" in name else \
            ("paper", arms.shown_k(arm)[0])
        dirs = [job(arm, *c, s, name="hrm-nt8-width")[0] if "1.25e-3" in name else read_on(arm, *c, s)
                for s in SEEDS]
        cells = alive_cells([d for d in dirs if runner.finished(d)]) if "hrm" in name else "- | - | -"
        if "rerun" in dirs[0]:   # section 9's runs have no checkpoints: the readings are the reruns'
            cells += " (reruns)"
        print(f"| {name} | {c[0]}, {lr_text(lr_of(arm, c[1]))} | {len(vals)} | {ms(list(vals.values()))} | {cells} |")
    print()
    if rows:
        heading("Alive HRM at the test seeds: differences (row minus column, paired by seed; 95% intervals; "
                "negative = row better)", "row", "column", "question", "diff [95% CI], p", "verdict")
        for a, b, q in rows:
            d = report.paired(table[a], table[b])
            print(f"| {a} | {b} | {q} | {d or '-'} | {report.verdict(d)} |")
        print()


def reruns_tables():
    """Phases R and S: the committed CE, the rerun's, and what the rerun reads."""
    got = [(arm, s, rerun, d) for arm in HRM_ARMS
           for s, (rerun, _), (d, _) in zip(SEEDS, phase_r(arm), phase_r(arm, False))]
    got += [(arms.CONTROL[0], s, rerun, arms.control_job(s)[0]) for s, (rerun, _) in zip(SEEDS, phase_warm())]
    got = [g for g in got if runner.finished(g[2])]
    if got:
        heading("Section 9's HRM, trained again for its checkpoints: is its recurrence alive?", "arm", "seed",
                "val CE, committed", "val CE, rerun", *ALIVE_COLS, note="The same command as the committed run (this "
                "machine's float32 may differ from the one that made it in the last digits, which post-norm HRM at "
                "lr 1e-2 amplifies).\n")
        for arm, s, rerun, d in got:
            print(f"| {arm} | {s} | {report.cell(d)} | {report.cell(rerun)} | {alive_cells([rerun])} |")
        print()
    got = [g for g in earlier() if runner.finished(g[5][0])]
    if got:
        heading("Sections 2-7's HRM, trained again for its checkpoints: is its recurrence alive?", "section",
                "variant", "lr", "seed", "val CE, committed", "val CE, rerun", *ALIVE_COLS, note="Sections 2-5: the "
                "character sweep (400 iterations at the best lr); 3: its HRM controls (the same); 4: the BPE sweep "
                "(400 iterations); 5: the K ablation (the same, K = 1 and 4); 6: the long run (4000 iterations); 7: "
                "beyond the paper (N=4, T=2, 300 iterations).\n")
        for sec, v, lr, s, d, (rerun, _) in got:
            print(f"| {sec} | {v} | {lr_text(lr)} | {s} | {report.cell(d)} | {report.cell(rerun)} | "
                  f"{alive_cells([rerun])} |")
        print()


def readings_table():
    """Depth at inference and the KV cache policies on the test runs' checkpoints (mean over the seeds read)."""
    groups = [(a, [read_on(a, *chosen(a), s) for s in SEEDS]) for a in HRM_ARMS if chosen(a)] + \
             [(f"{a} (section 9, reruns)", [d for d, _ in phase_r(a)]) for a in HRM_ARMS if phase_r(a)] + \
             [("hrm-nt8 at lr 1.25e-3", [d for d, _ in phase_w()])]
    groups = [(n, rs) for n, rs in ((n, [r for r in map(reading, ds) if r]) for n, ds in groups) if rs]
    if not groups:
        return
    heading("Alive HRM at the test seeds: depth at inference and KV cache policies (mean ± sd over the seeds read)",
            "row", "seeds", *[f"N' {f:g}x" for f in report.DEPTHS], "KV last - full", "KV fired - full",
            note="Depth: val CE with N' = f N Slow firings (T kept). KV: token-by-token decoding's val CE under each "
            "policy minus the exact cache's (docs/MODEL.md section 5).\n")
    for name, rs in groups:
        depth = [ms([[x["ce"] for x in r["depth"] if x["varied"] == "N"][i] for r in rs])
                 for i in range(len(report.DEPTHS))]
        kv = [r["kv"] for r in rs if "kv" in r]
        kvc = [ms([k[p] - k["full"] for k in kv], "+.4f") if kv else "-" for p in ("last", "fired")]
        print(f"| {name} | {len(rs)} | " + " | ".join(depth) + f" | {kvc[0]} | {kvc[1]} |")
    print()


def bpe_table():
    done = [(v, lr, d) for (v, lr), (d, _) in zip(bpe_runs(), phase_bpe()) if runner.finished(d)]
    if not done:
        return
    uni = report.unigrams()["bpe"]
    its = (400, 1000, 2000)
    heading(f"BPE testbed, post-norm, {BPE_ITERS} iterations at the best 400-iteration lr (the Transformer also at "
            f"1e-3), seed {SEEDS[0]} (unigram line {uni:.3f})", "variant", "lr", *[f"val CE at {i}" for i in its],
            "below unigram at the end", *ALIVE_COLS)
    for v, lr, d in done:
        log = {r["iter"]: r for r in runner.run_log(d) if "val_loss" in r}
        cells = " | ".join(f"{log[i]['val_loss']:.3f}" if i in log else "-" for i in its)
        alive = alive_cells([d]) if "hrm" in v else "- | - | -"
        print(f"| {v} | {lr_text(lr)} | {cells} | {uni - runner.final_val(d):+.3f} | {alive} |")
    print()


def tables():
    selection_table()
    test_table()
    readings_table()
    reruns_tables()
    bpe_table()
    done = [d for d, _ in all_jobs() if runner.finished(d)]
    print(f"{len(done)} runs committed ({report.hours(done):.1f} hours of training, one core each); "
          f"{len(all_jobs()) - len(done)} known still to run at this phase\n")


def main():   # phase by phase, each round's finished HRM runs read (phase B depends on it)
    runner.runner_main(__doc__, all_jobs, report.phased(groups, all_jobs, "alive.json", reading), tables,
                       [("shakespeare_char", "--dataset=shakespeare_char"), ("shakespeare", "")])


if __name__ == "__main__":
    signals.main(main)
