"""experiments/report.py's statistics (the tests every study reports a difference with) against published t-table
values, and experiments/equalparam.py's phases (which runs it asks for, given which have finished) on made-up
results."""

import math
import os
import statistics
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "experiments"))
import equalparam  # noqa: E402
import report  # noqa: E402
from report import paired, verdict, welch  # noqa: E402
import runner  # noqa: E402


@pytest.mark.parametrize("df,t975", [(1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (30, 2.042)])
def test_t_quantiles_match_the_table(df, t975):
    """A paired difference of df + 1 pairs: its 95% interval is t975 standard errors wide on each side, and a mean
    t975 standard errors from 0 has p = 0.05."""
    spread = [i - df / 2 for i in range(df + 1)]   # mean 0
    se = statistics.stdev(spread) / math.sqrt(df + 1)
    d = report.paired({i: x + t975 * se for i, x in enumerate(spread)}, {i: 0.0 for i in range(df + 1)})
    assert (d.hi - d.diff) / se == pytest.approx(t975, abs=1e-3) and d.df == df
    assert d.p == pytest.approx(0.05, abs=1e-4)


def test_welch_and_paired_by_hand():
    a, b = [2.26, 2.13, 2.28], [1.95, 1.99, 1.98]
    w = report.welch(a, b)   # se^2 = var(a)/3 + var(b)/3; Welch-Satterthwaite df
    assert w.diff == pytest.approx(0.25) and w.df == pytest.approx(2.2602, abs=1e-4)
    assert w.p == pytest.approx(0.02745, abs=1e-4) and (w.lo, w.hi) == pytest.approx((0.0626, 0.4374), abs=1e-3)
    p = report.paired(dict(zip((1, 2, 3), a)), dict(zip((1, 2, 3), b)))
    assert p.df == 2 and p.p == pytest.approx(0.04526, abs=1e-4)
    assert report.paired({1: 1.0}, {1: 2.0}) is None and report.welch([1.0], [2.0, 3.0]) is None
    assert report.paired({1: 1.0, 2: 2.0}, {3: 1.5, 4: 2.5}) is None   # no shared seeds: no paired test


def test_a_wide_interval_is_never_read_as_zero():
    d = report.welch([2.0, 2.3, 1.9], [2.1, 2.0, 2.2])
    assert d.lo < 0 < d.hi
    v = report.verdict(d, effect=0.25)
    assert "cannot tell" in v and "inside" in v and "no effect" not in v
    assert "lower" in report.verdict(report.welch([1.0, 1.01, 0.99], [2.0, 2.01, 1.99]))


@pytest.fixture
def results(monkeypatch):
    """A made-up table of finished runs: {out_dir: final val}; runner.finished/final_val read it."""
    vals = {}
    monkeypatch.setattr(runner, "facts", lambda d: {"final_val": vals[d], "diverged": False} if d in vals else None)
    return vals


def finish(vals, arm, k, seed, v):
    vals[equalparam.job(arm, k, seed)[0]] = v


def test_phases_bracket_then_seed_then_runner_up(results):
    arm, s0 = "hrm-nt8", equalparam.SEEDS[0]
    assert equalparam.job(arm, 0, s0)[0] in dict(equalparam.phase_a())
    for k, v in ((-1, 2.0), (0, 1.9), (1, 1.8)):    # best at the upper edge: grow upward
        finish(results, arm, k, s0, v)
    grow = [d for d, _ in equalparam.phase_a() if arm + os.sep in d and d not in results]
    assert grow == [equalparam.job(arm, 2, s0)[0]], grow
    finish(results, arm, 2, s0, 1.85)                # now bracketed at k=1: its seeds next
    assert equalparam.bracketed(arm) and equalparam.best_k(arm) == 1
    seeds = [d for d, _ in equalparam.phase_bc() if arm + os.sep in d]
    assert seeds == [equalparam.job(arm, 1, s)[0] for s in equalparam.SEEDS[1:]]
    assert equalparam.chosen_k(arm) is None
    finish(results, arm, 1, 42, 1.70)                # seed sd 0.1: the runner-up (k=2, 0.05 behind) gets seeds
    finish(results, arm, 1, 2024, 1.90)
    more = [d for d, _ in equalparam.phase_bc() if arm + os.sep in d]
    assert equalparam.job(arm, 2, 42)[0] in more and equalparam.chosen_k(arm) is None
    finish(results, arm, 2, 42, 1.60)
    finish(results, arm, 2, 2024, 1.70)
    assert equalparam.chosen_k(arm) == 2              # the lower 3-seed mean, not the seed-1337 best


def test_the_control_follows_nt12s_chosen_lr(results):
    assert equalparam.phase_d() == []
    arm = "hrm-nt12"
    for k, v in ((-1, 2.0), (0, 1.5), (1, 2.1)):
        finish(results, arm, k, equalparam.SEEDS[0], v)
    for s in equalparam.SEEDS[1:]:
        finish(results, arm, 0, s, 1.5)              # sd 0: no runner-up
    d, cmd = equalparam.phase_d()[0]
    assert "hrm-nt12-warm240" in d and "--warmup_iters=240" in cmd and "--learning_rate=0.01" in cmd
    # the control's 240 replaces the runner's 10%: one warmup in the command, so its log says which ran
    assert [c for c in cmd if c.startswith("--warmup_iters=")] == ["--warmup_iters=240"]


def test_runners_never_take_the_same_run(tmp_path):
    a = runner.claim_run(str(tmp_path))
    assert a is not None and runner.claim_run(str(tmp_path)) is None
    a.close()
    assert runner.claim_run(str(tmp_path)) is not None


def test_a_diverged_run_is_left_out_not_averaged_in():
    inf = float("inf")
    assert report.welch([1.0, 1.1, inf], [1.2, 1.3]).n == 2
    assert report.paired({1: 1.0, 2: 1.1, 3: inf}, {1: 1.2, 2: 1.4, 3: 1.3}).n == 2
    assert report.welch([1.0, inf], [1.2, 1.3]) is None


@pytest.mark.parametrize("text", ["0", "-1", "two"])
def test_workers_below_one_are_refused(text):
    """--workers=0 once waited for ever with nothing running."""
    import argparse
    with pytest.raises(argparse.ArgumentTypeError, match="integer >= 1"):
        runner.workers_arg(text)


def test_a_damaged_committed_log_is_one_line(tmp_path):
    """A truncated run.json stops the tables (and the runner) with one line naming it, not a JSON traceback."""
    (tmp_path / "run.json").write_text('{"command": "python tr')
    with pytest.raises(runner.UserError, match=r"run.json cannot be read \(Unterminated string.*\); restore it"):
        runner.facts(str(tmp_path))


def test_kv_policy_table_pairs_each_policy_with_full_by_seed(monkeypatch):
    """experiments/kv_policies.py's table on made-up readings of the committed 400-iteration runs: each shared policy's
    CE against the exact cache's, paired by seed (the same model, read two ways)."""
    import kv_policies
    extra = {"1337": 0.02, "42": 0.03, "2024": 0.025}   # last's CE above full's, seed by seed
    base = {"1337": 1.50, "42": 1.60, "2024": 1.55}      # seeds differ far more than the policies do

    def made_up(out_dir):
        if "hrm-post" not in out_dir or "out-sweep" not in out_dir:
            return None
        s = runner.seed_of(out_dir)
        row = dict(greedy_agree=1.0, kv_bytes_per_token=1, cached_tok_s=100.0)
        return {"iter": 400, "rows": [dict(row, kv="full", ce=base[s]),
                                      dict(row, kv="last", ce=base[s] + extra[s], greedy_agree=0.5)]}
    monkeypatch.setattr(kv_policies, "reading", made_up)
    table = kv_policies.table()
    full, last = [line for line in table.splitlines() if line.startswith("| hrm-post | 400 |")]
    assert full.startswith("| hrm-post | 400 | full | 3 | 1.5500 ± 0.0500 | - | 1.000 |"), full
    # paired: +0.025 with sd 0.005 over 3 seeds, t = 8.66 on 2 df; Welch on the raw CEs could not tell
    assert last.startswith("| hrm-post | 400 | last | 3 | 1.5750 ± 0.0550 | +0.0250 [+0.0126, +0.0374], p = 0.013 | "
                           "0.500 |"), last


def test_kv_speed_times_every_variant_and_policy_and_the_table_quotes_it(tmp_path, monkeypatch):
    """--speed builds each variant's shape from its runs' command and times every policy it has; the table's
    tok/s column is that file's (not the readings' own timings, taken beside other work)."""
    import json
    import kv_policies
    monkeypatch.setattr(kv_policies, "SPEED", str(tmp_path / "kv_speed.json"))
    kv_policies.speed(reps=1, tokens=2)
    with pytest.raises(ValueError, match="outgrow block_size 128"):   # past it each token is a full forward
        kv_policies.speed(reps=1, tokens=113)
    rows = json.loads((tmp_path / "kv_speed.json").read_text())["tok_s"]
    assert {v: sorted(r) for v, r in rows.items()} == \
        {v: sorted(kv_policies.POLICIES["hrm" if v.startswith("hrm") else "unitf"]) for v in kv_policies.VARIANTS}
    assert all(t > 0 for r in rows.values() for t in r.values())
    rows["hrm-post"]["last"] = 123.4

    def made_up(out_dir):
        if "hrm-post" not in out_dir or "out-sweep" not in out_dir:
            return None
        row = dict(ce=1.5, greedy_agree=1.0, kv_bytes_per_token=1, cached_tok_s=5.0)
        return {"iter": 400, "rows": [dict(row, kv="full"), dict(row, kv="last")]}
    (tmp_path / "kv_speed.json").write_text(json.dumps({"tok_s": rows}))
    monkeypatch.setattr(kv_policies, "reading", made_up)
    last = [line for line in kv_policies.table().splitlines() if line.startswith("| hrm-post | 400 | last |")]
    assert last and last[0].endswith("| 1 | 123 |"), last


def test_kv_long_runs_are_read_seed_by_seed(monkeypatch):
    """The long runs (hours each) are rerun every variant's first seed before any variant's second, so a session
    stopped part way leaves the variants read at equal seed counts; the 400-iteration ones (minutes) go first."""
    import kv_policies
    monkeypatch.setattr(kv_policies.runner, "finished", lambda d: True)
    monkeypatch.setattr(kv_policies, "reading", lambda d: None)
    order = [(d.split("/")[0], d.split("/")[-2], runner.seed_of(d)) for d, _ in kv_policies.missing()]
    long = [(v, s) for out, v, s in order if out == "out-long"]
    assert order.index(next(o for o in order if o[0] == "out-long")) == len(order) - len(long)
    assert [s for _, s in long] == [str(s) for s in kv_policies.SEEDS for _ in kv_policies.LONG], long
    assert [v for v, _ in long[:len(kv_policies.LONG)]] == kv_policies.LONG, long


def test_kv_remedy_line_pairs_the_remedy_with_the_standard_runs_exact_decoding(monkeypatch):
    """The remedy line: each train_kv=last run's CE decoded under `last` against the standard run of the same
    seed decoded exactly (two models, paired by seed), and the lr probes' readings below it."""
    import kv_policies
    std = {"1337": 1.95, "42": 1.97, "2024": 1.96}
    remedy = {"1337": 3.43, "42": 3.42, "2024": 3.44}
    monkeypatch.setattr(kv_policies.runner, "finished", lambda d: True)

    def made_up(out_dir):
        if "unitf-post" not in out_dir or ("out-trainkv" not in out_dir and "out-sweep" not in out_dir):
            return None
        s = runner.seed_of(out_dir)
        ce = (remedy if "out-trainkv" in out_dir else std)[s]
        return {"iter": 400, "rows": [{"kv": "full", "ce": ce - 1.0}, {"kv": "last", "ce": ce}]}
    monkeypatch.setattr(kv_policies, "reading", made_up)
    line = kv_policies.remedy_line()
    # last-decoded remedy minus full-decoded standard: 3.43 - 0.95 ... per seed 2.48, 2.45, 2.48
    assert "- unitf-post train_kv=last decoded under `last`, against unitf-post decoded exactly" in line, line
    assert "+2.4700 [" in line and "(3 seeds)" in line, line
    assert line.count("at 3x its lr") == 1 and "decoding CE under `last` 3.4300" in line, line


@pytest.mark.parametrize("a,b", [
    ({1: 2.0, 2: 3.0, 3: 4.0}, {1: 1.0, 2: 2.0, 3: 3.0}),             # a constant per-seed difference
    ({1: 1.9, 2: 1.9, 3: 1.9}, {1: 1.9, 2: 1.9, 3: 1.9}),             # identical groups
    ({1: 1e300, 2: -1e300, 3: 1e300}, {1: 1.0, 2: 2.0, 3: 3.0}),      # a spread that overflows
])
def test_degenerate_input_claims_no_certainty(a, b):
    """No spread (or an overflowed one): no interval and no p-value, said so, never p ~ 0 with a zero-width
    interval and 'a higher CE', nor '[0, 0] spans both signs', nor an OverflowError."""
    tests = [paired(a, b)] + ([welch(list(a.values()), list(b.values()))] if a[1] != 2.0 else [])   # groups that vary
    for d in tests:
        assert d.degenerate and math.isnan(d.p) and math.isnan(d.lo) and math.isnan(d.hi)
        assert "no spread" in str(d) and verdict(d).startswith("no test: no spread among the 3 runs"), (str(d), verdict(d))
    assert not welch([2.26, 2.13, 2.28], [1.95, 1.99, 1.98]).degenerate   # runs that vary: a test as before
