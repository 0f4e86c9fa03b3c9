"""docs/RESULTS.md against its data: every table in it is printed by experiments/sweep.py, experiments/long_run.py or
experiments/beyond_paper.py from the logs committed under experiments/logs/ alone, and nothing those scripts print is
missing from it; drawing the plots again draws the data of the committed plots; and the sweep's bookkeeping
(which runs are finished, which learning rate is best and settled, the standard errors) reads those logs.

The plots are compared by what they show, not by their bytes (which change with matplotlib's version):
tests/data/plots.json holds, for each committed PNG, its sha256 and the data of its figure (every line's
points, every band's corners, the titles, labels, scales and legends), recorded when the PNGs were drawn.
After drawing the plots again from new logs, record them with `python tests/test_results.py`."""

import hashlib
import json
import math
import os
import pickle
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, fresh_clone, md_tables, patched

sys.path.insert(0, os.path.join(ROOT, "experiments"))
import arms  # noqa: E402
import report  # noqa: E402
import runner  # noqa: E402
import sweep  # noqa: E402

SCRIPTS = ("sweep.py", "long_run.py", "beyond_paper.py", "kv_policies.py", "equalparam.py", "alive.py",
           "crossover.py")
PLOTS = ("sweep_lr.png", "bpe_lr.png", "sweep_curves.png", "depth.png", "long_run.png", "beyond_paper.png",
         "equalparam.png", "crossover.png")
PLOT_DATA = os.path.join(ROOT, "tests", "data", "plots.json")

# In the scripts' process: each figure they save is also pickled to $FIGURES/<name>.pickle, for figure_data.
RECORD_FIGURES = """
import os, pickle
import matplotlib
matplotlib.use("Agg")
from matplotlib.figure import Figure
_savefig = Figure.savefig
def savefig(fig, fname, *args, **kwargs):   # fname: a path, or the file object atomic_write made (PNG.tmp.<pid>)
    name = os.path.basename(str(getattr(fname, "name", fname))).split(".tmp.")[0]
    with open(os.path.join(os.environ["FIGURES"], name + ".pickle"), "wb") as f:
        pickle.dump(fig, f)
    return _savefig(fig, fname, *args, **kwargs)
Figure.savefig = savefig
"""


@pytest.fixture(scope="session")
def checkout(tmp_path_factory):
    """The repository's files as a fresh clone has them (tracked and not ignored): no out-*/ runs, no data/."""
    return fresh_clone(tmp_path_factory.mktemp("checkout"))


def tables_of(checkout, script, figures=None):
    """python experiments/<script> --tables in checkout: (stdout, stderr); with figures (a folder), each figure it saves
    is pickled there too."""
    cmd = [sys.executable, f"experiments/{script}", "--tables"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if figures:
        cmd, env["FIGURES"] = patched(RECORD_FIGURES, figures, cmd), str(figures)
    p = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout, p.stderr


@pytest.fixture(scope="session")
def figures(tmp_path_factory):
    """The folder where the scripts' figures, drawn from the committed logs, are pickled."""
    return tmp_path_factory.mktemp("figures")


@pytest.fixture(scope="session")
def printed(checkout, figures):
    return {s: tables_of(checkout, s, figures) for s in SCRIPTS}


def test_every_results_table_is_printed_from_the_committed_logs(checkout, printed):
    with open(os.path.join(checkout, "docs", "RESULTS.md")) as f:
        page = md_tables(f.read())
    out = [t for s in SCRIPTS for t in md_tables(printed[s][0])]
    stale = [t for t in page if t not in out]
    assert not stale, "tables in docs/RESULTS.md that no script prints from experiments/logs:\n\n" + "\n\n".join(stale)
    missing = [t for t in out if t not in page]
    assert not missing, "tables the scripts print that docs/RESULTS.md lacks:\n\n" + "\n\n".join(missing)


def test_benchmarks_decoding_tables_are_printed_from_the_committed_measurements(checkout):
    """docs/BENCHMARKS.md's speculative and cache-warming tables are experiments/decoding.py --tables' output, from
    experiments/logs/decoding/*.json (timings are not rerun in CI: the committed measurement is the figure)."""
    out = md_tables(tables_of(checkout, "decoding.py")[0])
    with open(os.path.join(checkout, "docs", "BENCHMARKS.md")) as f:
        page = md_tables(f.read())
    assert len(out) == 2 and all(t in page for t in out), out


def test_every_signed_difference_in_results_is_printed(printed):
    """The verdicts quote differences (+0.123); each must be a number the scripts printed."""
    with open(os.path.join(ROOT, "docs", "RESULTS.md")) as f:
        prose = "\n".join(line for line in f if not line.startswith("|"))
    out = "".join(printed[s][0] for s in SCRIPTS)
    quoted = set(re.findall(r"[+-]\d\.\d{3}\b", prose))
    assert quoted, "the verdicts quote no difference"
    assert not [q for q in quoted if q not in out], f"quoted but not printed: {sorted(q for q in quoted if q not in out)}"


def png(folder, name):
    """The bytes of docs/<name> under folder, None where there is none (yet)."""
    path = os.path.join(folder, "docs", name)
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return f.read()


def figure_data(fig):
    """What a matplotlib Figure shows, as JSON-able data that does not depend on matplotlib's version: per axes
    its title, labels, scales and legend, each line's label, style and points, each collection's (a band's, an
    error bar's) colour and corners. Floats to 10 significant digits; lines and collections sorted."""
    import numpy as np
    from matplotlib.colors import to_hex

    def num(v):
        v = float(v)
        return float(f"{v:.10g}") if math.isfinite(v) else repr(v)   # NaN as "nan": JSON's NaN != NaN

    def label(artist):
        text = artist.get_label()
        return None if text.startswith("_") else text   # "_child3": matplotlib's own name, not drawn

    def colours(c):   # a collection's colours: an N x 4 array, N = 0 where it has none
        return [to_hex(rgba, keep_alpha=True) for rgba in np.atleast_2d(c) if len(rgba)]

    axes = []
    for ax in fig.axes:
        lines = [{"label": label(l), "color": to_hex(l.get_color(), keep_alpha=True), "linestyle": l.get_linestyle(),
                  "marker": str(l.get_marker()), "points": [[num(x), num(y)] for x, y in l.get_xydata()]}
                 for l in ax.get_lines()]
        collections = [{"label": label(c), "facecolors": colours(c.get_facecolor()),
                        "edgecolors": colours(c.get_edgecolor()),
                        "corners": sorted({(num(x), num(y)) for path in c.get_paths() for x, y in path.vertices},
                                          key=repr)}
                       for c in ax.collections]
        legend = ax.get_legend()
        axes.append({"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                     "xscale": ax.get_xscale(), "yscale": ax.get_yscale(),
                     "legend": [t.get_text() for t in legend.get_texts()] if legend else [],
                     "lines": sorted(lines, key=json.dumps), "collections": sorted(collections, key=json.dumps)})
    return json.loads(json.dumps(axes))   # tuples to lists: as read back from plots.json


def drawn_figures(folder):
    """{png name: figure_data} of every figure pickled in folder."""
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".png.pickle"):
            with open(os.path.join(folder, name), "rb") as f:
                out[name[:-len(".pickle")]] = figure_data(pickle.load(f))
    return out


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def first_difference(a, b, where=""):
    """Where two JSON values first differ, in words (for the failure message)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return first_difference(a.get(k), b.get(k), f"{where}.{k}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return first_difference(x, y, f"{where}[{i}]")
    return f"{where}: recorded {json.dumps(a)[:300]}, drawn now {json.dumps(b)[:300]}"


def test_redrawing_draws_the_committed_plots(checkout, printed, figures):
    """Each plot drawn again from the committed logs shows what the committed PNG was drawn from (its data as
    recorded in tests/data/plots.json), whatever matplotlib's version."""
    assert any("wrote docs/" in printed[s][0] for s in SCRIPTS), "no script drew its plots from the committed logs"
    with open(PLOT_DATA) as f:
        recorded = json.load(f)
    drawn = drawn_figures(figures)
    assert sorted(drawn) == sorted(recorded) == sorted(PLOTS), (sorted(drawn), sorted(recorded))
    for name in PLOTS:
        assert drawn[name] == recorded[name]["figure"], (
            f"docs/{name} drawn from the committed logs differs from the data recorded for the committed plot, at "
            f"{first_difference(recorded[name]['figure'], drawn[name], 'axes')}; if the logs or the drawing changed "
            "on purpose, run python tests/test_results.py (it draws the plots again and records them)")


def test_each_committed_plot_is_the_one_recorded():
    """The committed PNGs are the ones whose data tests/data/plots.json holds (drawn and recorded together)."""
    with open(PLOT_DATA) as f:
        recorded = json.load(f)
    for name in PLOTS:
        assert sha256(os.path.join(ROOT, "docs", name)) == recorded[name]["sha256"], (
            f"docs/{name} is not the plot tests/data/plots.json records: draw the plots and record them with "
            "python tests/test_results.py")


def record_plots():
    """Draw the plots from the committed logs into docs/ (the scripts' --tables) and record each one's data and
    sha256 in tests/data/plots.json."""
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        for script in SCRIPTS:
            tables_of(ROOT, script, folder)
        drawn = drawn_figures(folder)
    missing = sorted(set(PLOTS) - set(drawn))
    if missing:
        sys.exit(f"test_results.py: error: not drawn (unsettled or missing runs): {', '.join(missing)}")
    data = {name: {"sha256": sha256(os.path.join(ROOT, "docs", name)), "figure": drawn[name]} for name in PLOTS}
    text = json.dumps(data, indent=1, sort_keys=True)
    text = re.sub(r"\[\s+([^\s\[\]{},]+),\s+([^\s\[\]{},]+)\s+\]", r"[\1, \2]", text)   # a point on one line
    with open(PLOT_DATA, "w") as f:
        f.write(text + "\n")
    print(f"recorded {len(data)} plots in {os.path.relpath(PLOT_DATA, ROOT)}")


def test_missing_logs_keep_the_committed_plots(checkout, tmp_path):
    """With no logs, --tables prints empty tables and says so in one line; it does not draw empty plots."""
    bare = tmp_path / "bare"
    shutil.copytree(checkout, bare)
    shutil.rmtree(bare / "experiments" / "logs")
    for script in SCRIPTS:
        out, err = tables_of(str(bare), script)
        if script == "kv_policies.py":   # draws no plot: its table says there is nothing to show
            assert "no readings yet" in out and not err.strip(), (out, err)
            continue
        if script in ("equalparam.py", "alive.py"):   # no run at all: empty tables, no run counted, no plot
            assert "0 runs committed" in out and not err.strip() and "wrote docs/" not in out, (out, err)
            continue
        if script == "crossover.py":   # its figure waits for every test run of a series: none drawn, none kept
            assert not out.strip() and not err.strip(), (out, err)
            continue
        assert "the committed plot" in err and len(err.strip().splitlines()) == 1, err
        assert "wrote docs/" not in out
    for name in PLOTS:
        assert png(str(bare), name) == png(ROOT, name)


def test_committed_runs_are_not_run_again(checkout):
    """The runners skip exactly the runs whose logs are committed: --dry-run marks each of them finished."""
    for script, folder in (("beyond_paper.py", "beyond"), ("long_run.py", "long")):
        p = subprocess.run([sys.executable, f"experiments/{script}", "--dry-run"], cwd=checkout, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        done = [line for line in p.stdout.splitlines() if line.startswith("# finished")]
        committed = [r for r, _, files in os.walk(os.path.join(checkout, "experiments", "logs", folder)) if "run.json" in files]
        assert len(done) == len(committed), (script, len(done), len(committed))
        assert "# rerun" not in p.stdout, f"{script}: checkpoint readings not committed:\n{p.stdout}"


# --- the bookkeeping, on made-up logs ------------------------------------------------------------------

def fake_run(monkeypatch, tmp_path, results):
    """Commit made-up finished runs {(variant, lr): final val} of the character testbed under tmp_path."""
    monkeypatch.setattr(runner, "ROOT", str(tmp_path))
    for (v, lr), val in results.items():
        d = tmp_path / runner.log_dir(arms.run_dir("char", v, lr, arms.SEEDS[0]))
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps({"diverged": val is None, "final_val": val}))


def test_best_lr_is_settled_only_when_bracketed(monkeypatch, tmp_path):
    grid = dict(zip(arms.LRS, [2.6, 2.4, 2.3, 2.2]))   # best at the top edge: not settled, one step up to run
    fake_run(monkeypatch, tmp_path, {("hrm-post", lr): v for lr, v in grid.items()})
    assert arms.best_lr("char", "hrm-post") == 1e-2 and not arms.settled("char", "hrm-post")
    assert [cmd for _, cmd in sweep.edge_runs("char")][0][3] == "--learning_rate=0.03"   # the one job
    fake_run(monkeypatch, tmp_path, {("hrm-post", 3e-2): None})   # diverged: a worse lr above the best
    assert arms.best_lr("char", "hrm-post") == 1e-2 and arms.settled("char", "hrm-post")
    assert sweep.edge_runs("char") == []


def test_a_run_counts_as_finished_only_with_its_facts(monkeypatch, tmp_path):
    monkeypatch.setattr(runner, "ROOT", str(tmp_path))
    out_dir = arms.run_dir("char", "hrm-post", 1e-3, 1337)
    d = tmp_path / runner.log_dir(out_dir)
    d.mkdir(parents=True)
    (d / "log.jsonl").write_text(json.dumps({"iter": 400, "val_loss": 2.0}) + "\n")
    assert not runner.finished(out_dir) and runner.final_val(out_dir) == math.inf
    (d / "run.json").write_text(json.dumps({"diverged": False, "final_val": 2.0}))
    assert runner.finished(out_dir) and runner.final_val(out_dir) == 2.0
    assert runner.log_dir("out-sweep/char/a/b") == os.path.join("experiments", "logs", "sweep", "char", "a", "b")
    assert runner.log_dir("/elsewhere/runs/x") == "/elsewhere/runs/x"   # a user's own --out keeps its logs


def test_difference_standard_error():
    d, se = report.difference({"a": (2.0, 0.3, 3), "b": (2.5, 0.4, 3)}, "a", "b")
    assert d == pytest.approx(-0.5) and se == pytest.approx(math.sqrt(0.09 / 3 + 0.16 / 3))
    assert report.difference({"a": (2.0, 0.0, 1), "b": (2.5, 0.4, 3)}, "a", "b") is None   # one seed: no se


def test_a_rerun_is_checked_against_its_committed_log(monkeypatch, tmp_path, capsys):
    """long_run.py reruns finished runs for their checkpoints; each rerun must reproduce its committed log
    (every logged number but the time), or the readings taken from it are flagged as the rerun's."""
    monkeypatch.setattr(runner, "log_dir", lambda d: str(tmp_path / "committed"))   # where its log is committed
    out_dir = tmp_path / "rerun"                                                    # where it reran
    rows = [{"iter": 0, "train_loss": 4.38, "val_loss": 4.384, "time_s": 4.7},
            {"iter": 200, "train_loss": 2.47, "val_loss": 2.496, "time_s": 51.0}]
    for folder in (tmp_path / "committed", out_dir):
        folder.mkdir()
        (folder / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    later = [dict(r, time_s=r["time_s"] * 2) for r in rows]          # slower, otherwise identical
    (out_dir / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in later))
    runner.check_rerun(str(out_dir))
    assert "reproduces its committed log exactly (2 rows)" in capsys.readouterr().out
    later[1]["val_loss"] = 2.497                                        # one digit off at iteration 200
    (out_dir / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in later))
    runner.check_rerun(str(out_dir))
    out = capsys.readouterr().out
    assert "WARNING" in out and "at iteration 200" in out, out


def test_a_rerun_that_is_still_here_is_not_run_a_third_time(monkeypatch, tmp_path, capsys):
    """A runner stopped while reading a rerun's checkpoint leaves it behind; the next one uses it (kept_rerun)
    instead of training the run again, but only where it is the last iteration's and the log reproduces."""
    import torch
    monkeypatch.setattr(runner, "log_dir", lambda d: str(tmp_path / "committed"))
    out_dir = tmp_path / "rerun"
    rows = "".join(json.dumps({"iter": i, "val_loss": 2.0 - i / 1000, "time_s": i}) + "\n" for i in (0, 400))
    for folder in (tmp_path / "committed", out_dir):
        folder.mkdir()
        (folder / "log.jsonl").write_text(rows)
    cmd = ["python", "train.py", "--max_iters=400"]
    assert not runner.kept_rerun(str(out_dir), cmd)                                # no checkpoint
    (out_dir / "ckpt_last.dcp").mkdir()
    torch.save({"iter_num": 200}, out_dir / "ckpt_last.dcp" / "meta.pt")
    assert not runner.kept_rerun(str(out_dir), cmd)                                # cut off at 200
    torch.save({"iter_num": 400}, out_dir / "ckpt_last.dcp" / "meta.pt")
    assert runner.kept_rerun(str(out_dir), cmd)
    assert runner.run_all([(str(out_dir), cmd)], 1, rerun=True) == [str(out_dir)]   # read as is, nothing run
    assert "rerunning 0 finished runs" in capsys.readouterr().out
    (out_dir / "log.jsonl").write_text(rows.replace("1.6", "1.7"))                 # a log that differs
    assert not runner.kept_rerun(str(out_dir), cmd)


def test_training_time_adds_up_across_a_resume():
    """train.py's time_s restarts at 0 on a resume; a study's total counts both stretches."""
    log = [{"iter": 0, "time_s": 5.0}, {"iter": 200, "time_s": 50.0},      # cut off after 50 s
           {"iter": 400, "time_s": 45.0}, {"iter": 600, "time_s": 90.0}]   # resumed: 90 s more
    assert report.train_seconds(log) == 140.0
    assert report.train_seconds(log[:2]) == 50.0


def test_runners_stop_before_any_run_without_data(checkout):
    """A fresh clone has no data/: the runners say which dataset to prepare, in one line, and run nothing."""
    for script in ("sweep.py", "long_run.py"):
        p = subprocess.run([sys.executable, f"experiments/{script}"], cwd=checkout, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 2 and p.stderr.strip() == (f"{script}: error: data/shakespeare_char not found; "
                                                          "run python prepare.py --dataset=shakespeare_char"), p.stderr
        assert not os.path.exists(os.path.join(checkout, "out-long")) and not os.path.exists(os.path.join(checkout, "out-sweep"))


def test_a_cut_off_checkpoint_is_not_read(monkeypatch, tmp_path):
    """A rerun cut off mid-way leaves a ckpt_last.dcp from before the last iteration: analysis() must not read
    it (nor cache a reading of it) as the finished run's."""
    from tools import analyze
    monkeypatch.setattr(runner, "ROOT", str(tmp_path))
    out_dir = tmp_path / "out-long" / "run"
    out_dir.mkdir(parents=True)
    (out_dir / "ckpt_last.dcp").mkdir()
    monkeypatch.setattr(runner, "log_dir", lambda d: str(tmp_path / "committed"))
    (tmp_path / "committed").mkdir()
    (tmp_path / "committed" / "run.json").write_text(json.dumps(
        {"command": "python train.py config/char_hrm.py --max_iters=4000", "diverged": False, "final_val": 1.7}))
    monkeypatch.setattr(analyze, "load", lambda *a, **k: (None, {"iter_num": 2200}))   # cut off at 2200 of 4000
    monkeypatch.setattr(analyze.torch, "set_num_threads", lambda n: None)   # the tests after it keep their threads
    assert report.analysis(str(out_dir)) is None
    assert not os.path.exists(report.reading_path(str(out_dir), "analysis.json"))


if __name__ == "__main__":
    record_plots()


def test_flat_curve_is_read_backwards():
    """equalparam's P_flat: the flat curve read backwards (interpolated, and extrapolated past its ends), on numbers
    worked by hand. (phi's magnitudes, which solved N_once + sum r^phi N_rec = P_flat for phi, are withdrawn.)"""
    import equalparam as ep
    curve = [(math.log(1e5), 2.0), (math.log(4e5), 1.8), (math.log(1.6e6), 1.7)]
    assert math.isclose(ep.flat_ln_params(1.9, curve), math.log(2e5))             # inside the first segment
    assert math.isclose(ep.flat_ln_params(1.75, curve), math.log(8e5))            # inside the second
    assert math.isclose(ep.flat_ln_params(2.1, curve), math.log(5e4))             # below the curve: extended
    assert math.isclose(ep.flat_ln_params(1.65, curve), math.log(3.2e6))          # above it


def test_phi_counts_each_hrm_module_where_it_runs():
    """The split of a committed HRM arm's parameters adds up to its stored count: the Fast module runs M times a
    pass, the Slow module N times."""
    import equalparam as ep
    once, rec = ep.param_split("hrm-nt4")
    facts = next(runner.facts(d) for d in ep.chosen_dirs("hrm-nt4"))
    assert once + sum(n for _, n in rec) == facts["params"]
    assert [r for r, _ in rec] == [4, 2] and all(n > 0.2 * once for _, n in rec)


def test_equalparam_shows_a_provisional_best_until_the_runner_up_has_its_seeds(monkeypatch, tmp_path):
    import equalparam as ep
    monkeypatch.setattr(runner, "ROOT", str(tmp_path))

    def commit(k, seed, val):
        d = tmp_path / runner.log_dir(ep.job("tf-d64", k, seed)[0])
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps({"diverged": False, "final_val": val}))

    for k, v in ((-1, 1.80), (0, 1.70), (1, 1.71)):      # bracketed at k = 0, k = 1 a close runner-up
        commit(k, 1337, v)
    assert ep.shown_k("tf-d64") == (None, False)        # the best alone: nothing to show
    commit(0, 42, 1.60)
    commit(0, 2024, 1.72)                               # sd 0.064: k = 1 is within one sd, phase C runs it
    assert ep.runner_up("tf-d64") == 1 and ep.chosen_k("tf-d64") is None
    assert ep.shown_k("tf-d64") == (0, False) and ep.label("tf-d64") == "tf-d64 (provisional)"
    commit(1, 42, 1.55)
    commit(1, 2024, 1.65)                               # the runner-up's mean is lower: it becomes the choice
    assert ep.shown_k("tf-d64") == (1, True) and ep.label("tf-d64") == "tf-d64"


def test_a_run_another_runner_finished_meanwhile_is_not_run_again(monkeypatch, tmp_path, capsys):
    """Two runners share the work; one plans a round, the other finishes a run of it first: the first skips it
    (before, it trained the run a second time and stored the same log over the committed one)."""
    out_dir = str(tmp_path / "run")
    cmd = [sys.executable, "-c", "raise SystemExit('trained again')"]
    calls = []
    monkeypatch.setattr(runner, "finished", lambda d: calls.append(d) or len(calls) > 1)   # unfinished when planned
    runner.run_all([(out_dir, cmd)], 1)
    out = capsys.readouterr().out
    assert "another runner finished it" in out and "FAILED" not in out, out
    assert not os.path.exists(os.path.join(out_dir, "train.out")), "the run was launched"


SLOW = pytest.mark.slow   # CI time: CI runs one damage of each kind (truncated, a wrong type, deleted); one reader
DAMAGED = [   # (runner, committed file, what is done to it)
    ("kv_policies.py", "trainkv/char/unitf-post/lr3e-3-s1337/kv.json", "truncate"),
    pytest.param("kv_policies.py", "kv_speed.json", "truncate", marks=SLOW),
    pytest.param("equalparam.py", "equalparam/hrm-nt4/lr1e-2-s42/analysis.json", "truncate", marks=SLOW),
    pytest.param("sweep.py", "sweep/unigram.json", "garbage", marks=SLOW),
    ("sweep.py", "sweep/char/hrm-post/lr1e-2-s1337/run.json", '{"final_val": "low", "diverged": false}'),
    pytest.param("sweep.py", "sweep/char/hrm-post/lr1e-2-s42/log.jsonl", '{"iter": 0, "val_loss": "x"}\n', marks=SLOW),
    ("sweep.py", "sweep/char/hrm-post/lr1e-2-s2024/log.jsonl", "delete"),
]


@pytest.mark.parametrize("runner,name,damage", DAMAGED)
def test_tables_on_a_damaged_committed_file_is_one_line(checkout, runner, name, damage):
    """--tables on a committed file truncated, garbage, deleted, or with a field of the wrong type: one line naming
    the file, exit 2 (bad input), from the runner (once tracebacks, or plot.py's line with exit 1)."""
    path = os.path.join(checkout, "experiments", "logs", name)
    kept = open(path, "rb").read()
    try:
        if damage == "delete":
            os.remove(path)
        else:
            open(path, "wb").write(kept[: len(kept) // 2] if damage == "truncate" else
                                   b"\x00garbage" if damage == "garbage" else damage.encode())
        p = subprocess.run([sys.executable, f"experiments/{runner}", "--tables"], cwd=checkout, capture_output=True,
                           text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    finally:
        open(path, "wb").write(kept)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr[-2000:])
    assert lines[0].startswith(f"{runner}: error: experiments/logs/{os.path.dirname(name)}") and \
        "cannot be read" in lines[0] and "git checkout" in lines[0], lines
