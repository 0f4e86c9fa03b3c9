"""docs/RESULTS.md against its data: every table in it is printed by docs/sweep.py, docs/long_run.py or
docs/beyond_paper.py from the logs committed under docs/logs/ alone, and nothing those scripts print is
missing from it; drawing the plots again changes no committed plot; and the sweep's bookkeeping (which
runs are finished, which learning rate is best and settled, the standard errors) reads those logs."""

import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "docs"))
import sweep  # noqa: E402

SCRIPTS = ("sweep.py", "long_run.py", "beyond_paper.py")
PLOTS = ("sweep_lr.png", "sweep_curves.png", "depth.png", "long_run.png", "beyond_paper.png")


def md_tables(text):
    """Every markdown table in text: runs of lines starting with '|', each run one string."""
    tables, cur = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cur.append(line.rstrip())
        elif cur:
            tables.append("\n".join(cur))
            cur = []
    return tables


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """The repository's files as a fresh clone has them (tracked and not ignored): no out-*/ runs, no data/."""
    dst = tmp_path_factory.mktemp("checkout")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split("\n")
    for f in filter(None, files):
        if os.path.exists(os.path.join(ROOT, f)):
            os.makedirs(os.path.dirname(os.path.join(dst, f)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, f), os.path.join(dst, f))
    return str(dst)


def tables_of(checkout, script):
    p = subprocess.run([sys.executable, f"docs/{script}", "--tables"], cwd=checkout, capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout, p.stderr


@pytest.fixture(scope="module")
def printed(checkout):
    return {s: tables_of(checkout, s) for s in SCRIPTS}


def test_every_results_table_is_printed_from_the_committed_logs(checkout, printed):
    with open(os.path.join(checkout, "docs", "RESULTS.md")) as f:
        page = md_tables(f.read())
    out = [t for s in SCRIPTS for t in md_tables(printed[s][0])]
    stale = [t for t in page if t not in out]
    assert not stale, "tables in docs/RESULTS.md that no script prints from docs/logs:\n\n" + "\n\n".join(stale)
    missing = [t for t in out if t not in page]
    assert not missing, "tables the scripts print that docs/RESULTS.md lacks:\n\n" + "\n\n".join(missing)


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


def test_redrawing_changes_no_committed_plot(checkout, printed):
    assert any("wrote docs/" in printed[s][0] for s in SCRIPTS), "no script drew its plots from the committed logs"
    for name in PLOTS:
        assert png(checkout, name) == png(ROOT, name), f"docs/{name} changed when drawn from the committed logs"


def test_missing_logs_keep_the_committed_plots(checkout, tmp_path):
    """With no logs, --tables prints empty tables and says so in one line; it does not draw empty plots."""
    bare = tmp_path / "bare"
    shutil.copytree(checkout, bare)
    shutil.rmtree(bare / "docs" / "logs")
    for script in SCRIPTS:
        out, err = tables_of(str(bare), script)
        assert "the committed plot" in err and len(err.strip().splitlines()) == 1, err
        assert "wrote docs/" not in out
    for name in PLOTS:
        assert png(str(bare), name) == png(ROOT, name)


def test_committed_runs_are_not_run_again(checkout):
    """The runners skip exactly the runs whose logs are committed: --dry-run marks each of them finished."""
    for script, folder in (("beyond_paper.py", "beyond"), ("long_run.py", "long")):
        p = subprocess.run([sys.executable, f"docs/{script}", "--dry-run"], cwd=checkout, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        done = [line for line in p.stdout.splitlines() if line.startswith("# finished")]
        committed = [r for r, _, files in os.walk(os.path.join(checkout, "docs", "logs", folder)) if "run.json" in files]
        assert len(done) == len(committed), (script, len(done), len(committed))
        assert "# rerun" not in p.stdout, f"{script}: checkpoint readings not committed:\n{p.stdout}"


# --- the bookkeeping, on made-up logs ------------------------------------------------------------------

def fake_run(monkeypatch, tmp_path, results):
    """Commit made-up finished runs {(variant, lr): final val} of the character testbed under tmp_path."""
    monkeypatch.setattr(sweep, "ROOT", str(tmp_path))
    for (v, lr), val in results.items():
        d = tmp_path / sweep.log_dir(sweep.run_dir("char", v, lr, sweep.SEEDS[0]))
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps({"diverged": val is None, "final_val": val}))


def test_best_lr_is_settled_only_when_bracketed(monkeypatch, tmp_path):
    grid = dict(zip(sweep.LRS, [2.6, 2.4, 2.3, 2.2]))   # best at the top edge: not settled, one step up to run
    fake_run(monkeypatch, tmp_path, {("hrm-post", lr): v for lr, v in grid.items()})
    assert sweep.best_lr("char", "hrm-post") == 1e-2 and not sweep.settled("char", "hrm-post")
    assert [cmd for _, cmd in sweep.edge_runs("char")][0][3] == "--learning_rate=0.03"   # the one job
    fake_run(monkeypatch, tmp_path, {("hrm-post", 3e-2): None})   # diverged: a worse lr above the best
    assert sweep.best_lr("char", "hrm-post") == 1e-2 and sweep.settled("char", "hrm-post")
    assert sweep.edge_runs("char") == []


def test_a_run_counts_as_finished_only_with_its_facts(monkeypatch, tmp_path):
    monkeypatch.setattr(sweep, "ROOT", str(tmp_path))
    out_dir = sweep.run_dir("char", "hrm-post", 1e-3, 1337)
    d = tmp_path / sweep.log_dir(out_dir)
    d.mkdir(parents=True)
    (d / "log.jsonl").write_text(json.dumps({"iter": 400, "val_loss": 2.0}) + "\n")
    assert not sweep.finished(out_dir) and sweep.final_val(out_dir) == math.inf
    (d / "run.json").write_text(json.dumps({"diverged": False, "final_val": 2.0}))
    assert sweep.finished(out_dir) and sweep.final_val(out_dir) == 2.0
    assert sweep.log_dir("out-sweep/char/a/b") == os.path.join("docs", "logs", "sweep", "char", "a", "b")
    assert sweep.log_dir("/elsewhere/runs/x") == "/elsewhere/runs/x"   # a user's own --out keeps its logs


def test_difference_standard_error():
    d, se = sweep.difference({"a": (2.0, 0.3, 3), "b": (2.5, 0.4, 3)}, "a", "b")
    assert d == pytest.approx(-0.5) and se == pytest.approx(math.sqrt(0.09 / 3 + 0.16 / 3))
    assert sweep.difference({"a": (2.0, 0.0, 1), "b": (2.5, 0.4, 3)}, "a", "b") is None   # one seed: no se


def test_a_rerun_is_checked_against_its_committed_log(monkeypatch, tmp_path, capsys):
    """long_run.py reruns finished runs for their checkpoints; each rerun must reproduce its committed log
    (every logged number but the time), or the readings taken from it are flagged as the rerun's."""
    monkeypatch.setattr(sweep, "log_dir", lambda d: str(tmp_path / "committed"))   # where its log is committed
    out_dir = tmp_path / "rerun"                                                    # where it reran
    rows = [{"iter": 0, "train_loss": 4.38, "val_loss": 4.384, "time_s": 4.7},
            {"iter": 200, "train_loss": 2.47, "val_loss": 2.496, "time_s": 51.0}]
    for folder in (tmp_path / "committed", out_dir):
        folder.mkdir()
        (folder / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    later = [dict(r, time_s=r["time_s"] * 2) for r in rows]          # slower, otherwise identical
    (out_dir / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in later))
    sweep.check_rerun(str(out_dir))
    assert "reproduces its committed log exactly (2 rows)" in capsys.readouterr().out
    later[1]["val_loss"] = 2.497                                        # one digit off at iteration 200
    (out_dir / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in later))
    sweep.check_rerun(str(out_dir))
    out = capsys.readouterr().out
    assert "WARNING" in out and "at iteration 200" in out, out


def test_training_time_adds_up_across_a_resume():
    """train.py's time_s restarts at 0 on a resume; the long run's total counts both stretches."""
    import long_run   # docs/ is on the path (above)
    log = [{"iter": 0, "time_s": 5.0}, {"iter": 200, "time_s": 50.0},      # cut off after 50 s
           {"iter": 400, "time_s": 45.0}, {"iter": 600, "time_s": 90.0}]   # resumed: 90 s more
    assert long_run.train_seconds(log) == 140.0
    assert long_run.train_seconds(log[:2]) == 50.0


def test_runners_stop_before_any_run_without_data(checkout):
    """A fresh clone has no data/: the runners say which dataset to prepare, in one line, and run nothing."""
    for script in ("sweep.py", "long_run.py"):
        p = subprocess.run([sys.executable, f"docs/{script}"], cwd=checkout, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 1 and p.stderr.strip() == (f"{script}: error: data/shakespeare_char not found; "
                                                          "run python prepare.py --dataset=shakespeare_char"), p.stderr
        assert not os.path.exists(os.path.join(checkout, "out-long")) and not os.path.exists(os.path.join(checkout, "out-sweep"))


def test_a_cut_off_checkpoint_is_not_read(monkeypatch, tmp_path):
    """A rerun cut off mid-way leaves a ckpt_last.pt from before the last iteration: analysis() must not read
    it (nor cache a reading of it) as the finished run's."""
    import analyze
    monkeypatch.setattr(sweep, "ROOT", str(tmp_path))
    out_dir = tmp_path / "out-long" / "run"
    out_dir.mkdir(parents=True)
    (out_dir / "ckpt_last.pt").write_bytes(b"")
    monkeypatch.setattr(sweep, "log_dir", lambda d: str(tmp_path / "committed"))
    (tmp_path / "committed").mkdir()
    (tmp_path / "committed" / "run.json").write_text(json.dumps(
        {"command": "python train.py config/char_hrm.py --max_iters=4000", "diverged": False, "final_val": 1.7}))
    monkeypatch.setattr(analyze, "load", lambda *a, **k: (None, {"iter_num": 2200}))   # cut off at 2200 of 4000
    assert sweep.analysis(str(out_dir)) is None
    assert not os.path.exists(sweep.analysis_path(str(out_dir)))
