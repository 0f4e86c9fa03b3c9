"""The experiments' runner (experiments/runner.py's run_all, which every study shares): a signal to the runner, or to
one of its runs, leaves every run saved and stopped and the runner's one line; a runner started while a train.py still
holds a run's folder (one a killed runner left) skips that run. Each case runs the real runner, under a study's entry
point (hrmlm.signals.main), on real (tiny) train.py runs, with deadlines."""

import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import ENV, HRM, ROOT, train_cmd, wait_for
from hrmlm.checkpoint import read_info, resume_path

RUNNER = f"""
import json, sys
sys.path.insert(0, {os.path.join(ROOT, "experiments")!r})
import runner
from hrmlm.signals import main
main(lambda: runner.run_all([tuple(job) for job in json.loads(sys.argv[1])], 1))
"""


@pytest.fixture(autouse=True)
def reap(tmp_path):
    """After each case, however it ended (a failed assertion, a deadline), no runner or train.py of it is left:
    a break under test must not leave processes burning the cores the rest of the suite needs."""
    yield
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(tmp_path).encode() in f.read() and int(pid) != os.getpid():
                    os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def start_runner(tmp_path, data_dir, names):
    """A runner (in its own session, as in a terminal) over one long train.py run per name; it and the jobs."""
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    # batch 48: an iteration of about a second, so a run is still going when a second signal could reach it
    jobs = [(str(tmp_path / n), train_cmd(HRM + ["--max_iters=100000", "--eval_interval=100000", "--batch_size=48"], data_dir,
                                          str(tmp_path / n))) for n in names]
    proc = subprocess.Popen([sys.executable, str(script), json.dumps(jobs)], cwd=ROOT, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    return proc, jobs


def training(out_dir):
    """The pid of the train.py running in out_dir, once it has logged an iteration (else None)."""
    try:
        with open(os.path.join(out_dir, "train.out")) as f:
            if "iter 2/" not in f.read():
                return None
        with open(os.path.join(out_dir, ".lock")) as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:   # a zombie is dead, waiting for its parent to read its status
        return f.read().split(")")[-1].split()[0] != "Z"


def saved_at(out_dir):
    """The iteration the run's signal save wrote (its only save: eval_interval is beyond the run)."""
    return read_info(resume_path(out_dir))["iter_num"]


# SIGINT slow (CI time): the same handler as the SIGTERM case
@pytest.mark.parametrize("sig", [pytest.param(signal.SIGINT, marks=pytest.mark.slow), signal.SIGTERM])
def test_a_signal_to_the_runner_stops_its_run_and_it_saves(sig, data_dir, tmp_path):
    """Ctrl-C in the runner's terminal (its process group; the run is in a session of its own), or SIGTERM: the run
    gets one SIGTERM from the runner, saves, and the runner exits 128 + n without starting the next run."""
    proc, jobs = start_runner(tmp_path, data_dir, ["a", "b"])
    wait_for(lambda: training(jobs[0][0]), 180, "the first run's second iteration")
    pid = training(jobs[0][0])
    os.killpg(proc.pid, sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, (proc.returncode, out, err)
    assert err.strip().splitlines()[-1] == f"runner.py: error: interrupted by {signal.Signals(sig).name}; run the " \
        "same command to resume", err
    assert f"stopped: {jobs[0][0]}; the same command resumes it" in out, out
    assert not alive(pid) and saved_at(jobs[0][0]) >= 2
    assert not os.path.exists(jobs[1][0])   # the next run never started


@pytest.mark.slow   # CI time (16 s): CI runs the runner's signal handling through the SIGTERM case above
def test_a_run_stopped_by_a_signal_stops_the_runner(data_dir, tmp_path):
    """SIGTERM to one run (not to the runner): it saves and the runner stops as if it had the signal, instead
    of counting the run as failed and starting the next one."""
    proc, jobs = start_runner(tmp_path, data_dir, ["a", "b"])
    wait_for(lambda: training(jobs[0][0]), 180, "the first run's second iteration")
    os.kill(training(jobs[0][0]), signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "FAILED" not in out, (proc.returncode, out, err)
    assert f"{jobs[0][0]} was stopped by SIGTERM" in out and saved_at(jobs[0][0]) >= 2
    assert not os.path.exists(jobs[1][0])


def test_a_new_runner_skips_a_run_a_killed_runner_left_going(data_dir, tmp_path):
    """SIGKILL to the runner leaves its train.py running (in a session of its own, nothing stops it); a runner started
    while that train.py still runs skips the run (its out_dir lock is held), instead of failing it."""
    proc, jobs = start_runner(tmp_path, data_dir, ["a"])
    wait_for(lambda: training(jobs[0][0]), 180, "the run's second iteration")
    pid = training(jobs[0][0])
    proc.kill()
    proc.communicate(timeout=30)
    again, _ = start_runner(tmp_path, data_dir, ["a"])
    out, err = again.communicate(timeout=60)
    assert alive(pid)
    os.kill(pid, signal.SIGKILL)   # the run the killed runner left: nobody is left to store it
    assert again.returncode == 0 and f"skipping {jobs[0][0]}: a train.py is still running in it" in out, (out, err)
    assert "FAILED" not in out
