"""One clear line for every bad input to the tools (configurator, prepare, plot, bench, analyze, sample):
`<script>.py: error: ...` on stderr, exit status 2, no traceback, and no file of the user's lost.
(train.py's own bad input is in test_checkpoints.py and test_training.py.)"""

import ast
import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conftest import (ENV, ROOT, Evil, copy_run, error_in_process, in_process, one_error_line, patched, read_until,
                      run_script, save_ckpt, snapshot, train_cmd, wait_for, write_docs)

# --- every case of the issue ----------------------------------------------------------------------
# (id, script, args, word in the error line); {name} is filled from the `world` fixture's paths.
# CASES run as subprocesses of the real entry points: exit status, stderr, no traceback. Every script has
# some there; the rest (IN_PROCESS) run the script in this process (conftest.in_process: its entry point,
# the same line), because each subprocess that imports torch costs 3 s on a 2-core machine.

CASES = [
    # configurator.py, through sample.py (more cases in test_configurator_cases)
    ("config_none", "sample.py", ["--out_dir=None"], "cannot be None"),
    ("config_file_raises", "sample.py", ["{cfg_raises}", "--out_dir={ckpt}"], "{cfg_raises}:3: ZeroDivisionError"),
    # sample.py
    ("sample_pickled_code", "sample.py", ["--out_dir={evil}"], "not loaded"),
    ("sample_non_finite", "sample.py", ["--out_dir={nan}"], "non-finite"),
    ("sample_binary_prompt", "sample.py", ["--out_dir={ckpt}", "--start=FILE:{binary}"], "not UTF-8"),
    ("sample_tiny_temperature", "sample.py", ["--out_dir={ckpt}", "--temperature=1e-45"], "too small"),
    # analyze.py, bench.py
    ("analyze_pickled_code", "tools/analyze.py", ["--out_dir={evil}"], "not loaded"),
    ("bench_no_models", "bench.py", ["--preset=tiny", "--models=,"], "names no model; choose from tf_l2"),
    # prepare.py (each aimed at the prepared dataset `mine`, which must come through untouched)
    ("prepare_num_threads_0", "prepare.py", ["--data_dir={data}", "--dataset=mine", "--input={docs}",
                                             "--num_threads=0"], "--num_threads must be >= 1"),
    ("prepare_num_proc_neg", "prepare.py", ["--data_dir={data}", "--dataset=mine", "--input={docs}", "--num_proc=-1"],
     "--num_threads must be >= 1"),   # --num_proc: --num_threads's former name
    ("prepare_data_dir_is_a_file", "prepare.py", ["--data_dir={binary}", "--dataset=mine"], "not a folder"),
    ("prepare_input_missing", "prepare.py", ["--data_dir={data}", "--dataset=mine", "--input={missing}"], "not found"),
    ("prepare_input_too_short", "prepare.py", ["--data_dir={data}", "--dataset=mine", "--input={one_char}"],
     "too little"),
    ("prepare_dataset_not_a_name", "prepare.py", ["--data_dir={data}", "--dataset=../mine"], "plain folder name"),
    # plot.py
    ("plot_empty_log", "tools/plot.py", ["{empty_run}", "--out={tmp}/c.png"], "is empty"),
    ("plot_only_malformed_lines", "tools/plot.py", ["{garbage_run}", "--out={tmp}/c.png"], "2 malformed"),
]


IN_PROCESS = [
    ("analyze_no_batches", "analyze", ["--out_dir={ckpt}", "--batches=0"], "--batches must be >= 1"),
    ("analyze_no_batch_size", "analyze", ["--out_dir={ckpt}", "--batch_size=0"], "--batch_size must be >= 1"),
    ("analyze_no_cuda", "analyze", ["--out_dir={ckpt}", "--device=cuda"], "CUDA is not available"),
    ("analyze_json_folder_missing", "analyze", ["--out_dir={ckpt}", "--json={missing}/a.json"], "does not exist"),
    ("analyze_non_finite", "analyze", ["--out_dir={nan}"], "non-finite"),
    ("bench_empty_models", "bench", ["--preset=tiny", "--models="], "names no model"),
    ("bench_json_folder_missing", "bench", ["--preset=tiny", "--models=tf_l2", "--json={missing}/b.json"],
     "does not exist"),
    ("bench_no_cuda", "bench", ["--preset=tiny", "--models=tf_l2", "--device=cuda"], "CUDA is not available"),
    ("bench_static_without_profile", "bench", ["--preset=tiny", "--models=tf_l2", "--static_cache"], "add --profile"),
    ("bench_kv_a_unitf_lacks", "bench", ["--preset=tiny", "--models=unitf_m12", "--kv=fired"],   # once measured "full"
     "--kv=fired does not apply to unitf_m12"),
    ("plot_missing_log", "plot", ["{missing}", "--out={tmp}/c.png"], "not found"),
    ("analyze_depth_beyond_fast_attn", "analyze", ["--out_dir={fast_attn}", "--depth=0.5,1"],   # once a traceback
     "--depth=0.5,1 asks for a depth this checkpoint cannot run (ModelConfig.fast_attn_steps"),
    ("analyze_another_vocabulary", "analyze", ["--out_dir={ckpt}", "--data_dir={foreign}"],   # once an IndexError
     "holds another vocabulary (gpt2, 60000 tokens) than the checkpoint's (50257 tokens)"),
]


@pytest.fixture(scope="session")
def world(trained, tmp_path_factory):
    """A tiny checkpoint and every bad input the CASES name; then all CASES run, two at a time."""
    tmp = tmp_path_factory.mktemp("faults")
    p = {"tmp": str(tmp), "missing": str(tmp / "no_such_thing"), "ckpt": copy_run(trained, tmp, "ckpt")}
    ck = torch.load(os.path.join(p["ckpt"], "ckpt.pt"), weights_only=True)
    p["evil"], p["nan"] = str(tmp / "evil"), str(tmp / "nan")
    for name in ("evil", "nan"):
        os.makedirs(p[name])
    p["pwned"] = str(tmp / "pwned")
    torch.save({**ck, "payload": Evil(p["pwned"])}, os.path.join(p["evil"], "ckpt.pt"))
    bad = {**ck, "model": dict(ck["model"])}
    bad["model"]["z_H0"] = torch.full_like(bad["model"]["z_H0"], float("nan"))
    save_ckpt(bad, os.path.join(p["nan"], "ckpt.pt"))

    fast = {**ck, "model_args": {**ck["model_args"], "fast_attn_steps": 3}}   # 3 of M = 4 steps attend: same weights
    p["fast_attn"] = str(tmp / "fast_attn")
    os.makedirs(p["fast_attn"])
    save_ckpt(fast, os.path.join(p["fast_attn"], "ckpt.pt"))
    p["foreign"] = str(tmp / "foreign")   # a dataset of the run's name with token ids past its vocabulary
    os.makedirs(tmp / "foreign" / "shakespeare")
    for split in ("train", "val"):
        (tmp / "foreign" / "shakespeare" / f"{split}.bin").write_bytes((59999).to_bytes(2, "little") * 200)
    (tmp / "foreign" / "shakespeare" / "meta.json").write_text('{"vocab_size": 60000, "tokenizer": "gpt2"}')

    p["cfg_raises"] = str(tmp / "raises.py")
    (tmp / "raises.py").write_text("import math\nnum_samples = 1\ntemperature = 1 / 0\n")
    p["binary"] = str(tmp / "binary.dat")
    (tmp / "binary.dat").write_bytes(b"ROMEO\xff\xfe\x00\x80 binary")
    p["one_char"] = str(tmp / "one_char.txt")
    (tmp / "one_char.txt").write_text("x")

    # a prepared dataset with a file of the user's in it: failed prepare.py runs must leave all of it alone
    from prepare import main as prepare_main
    p["data"], p["docs"] = str(tmp / "data"), write_docs(str(tmp / "docs"), 3)
    prepare_main([f"--data_dir={p['data']}", "--dataset=mine", f"--input={p['docs']}", "--num_threads=1"])
    (tmp / "data" / "mine" / "notes.txt").write_text("mine, not prepare.py's")

    p["empty_run"], p["garbage_run"] = str(tmp / "empty_run"), str(tmp / "garbage_run")
    os.makedirs(p["empty_run"])
    (tmp / "empty_run" / "log.jsonl").write_text("")
    os.makedirs(p["garbage_run"])
    (tmp / "garbage_run" / "log.jsonl").write_text('{"iter": \nnot json\n\n')

    before = {name: snapshot(p[name]) for name in ("data", "ckpt")}
    cmds = {case: (script, [a.format(**p) for a in args]) for case, script, args, _ in CASES}
    with ThreadPoolExecutor(2) as pool:   # two at a time: most of each is importing torch
        done = dict(zip(SUBPROCESS, pool.map(lambda c: run_script(cmds[c][0], *cmds[c][1], env=ENV), SUBPROCESS)))
    done |= {c: error_in_process(cmds[c][0], *cmds[c][1]) for c in cmds if c not in SUBPROCESS}   # the line only
    return p, done, before


# one or two cases of each script as a subprocess (exit status 2, one line on stderr, no traceback); the rest in
# this process (conftest.error_in_process: the same line, 3 s less each)
SUBPROCESS = ("config_none", "sample_pickled_code", "analyze_pickled_code", "bench_no_models", "prepare_num_threads_0",
              "prepare_input_missing", "plot_empty_log")


@pytest.mark.parametrize("case,script,word", [(c[0], c[1], c[3]) for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line(world, case, script, word):
    p, done, _ = world
    line = one_error_line(done[case], prog=os.path.basename(script)) if case in SUBPROCESS else done[case]
    assert word.format(**p) in line, line


TOOLS = ("analyze", "plan", "plot")   # tools/<name>.py; the rest are the root's scripts


@pytest.mark.parametrize("module,args,word", [c[1:] for c in IN_PROCESS], ids=[c[0] for c in IN_PROCESS])
def test_bad_input_stops_in_process(world, module, args, word):
    p = world[0]
    if "--device=cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    done = in_process(f"tools/{module}.py" if module in TOOLS else f"{module}.py", *[a.format(**p) for a in args])
    line = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    assert done.returncode == 2 and line.startswith(f"{module}.py: error: ") and word.format(**p) in line, done


def test_failed_runs_left_every_file_alone(world):
    p, _, before = world
    assert {name: snapshot(p[name]) for name in ("data", "ckpt")} == before
    assert not os.path.exists(p["pwned"])   # the pickled payload never ran
    assert not os.path.exists(p["missing"])
    assert sorted(os.listdir(p["data"])) == ["mine"]   # no temporary folder left beside the dataset



# --- a signal: one line and 128 + n from every script, at any moment (hrmlm/signals.py) --------------------------

SIGNALLED_RUNS = [   # (script, args): each still importing torch, or working, half a second after it starts
    ("sample.py", ["--out_dir={ckpt}", "--max_new_tokens=100000"]),
    ("tools/analyze.py", ["--out_dir={ckpt}"]),
    ("tools/plan.py", ["config/equalparam_nt8.py", "config/equalparam_nt12.py", "config/m48_unitf.py",
                       "config/tfbaseline_tf_l12.py", "config/ablation_k8.py"]),   # seconds each
    ("tools/plot.py", ["{ckpt}", "--out={tmp}/sig.png"]),
    ("bench.py", ["--preset=tiny", "--models=hrm_nt4"]),
    ("experiments/kv_policies.py", ["--tables"]),   # its printing slowed to 30 s a line (SLOW_PRINT): in a phase
]
SLOW_PRINT = """
import builtins, os, time
_print = builtins.print
builtins.print = lambda *a, **k: (open(os.environ["MARKER"], "w").close(), time.sleep(30), _print(*a, **k))
"""


# SIGINT, SIGHUP slow (CI time): the same handler as SIGTERM's, which CI runs
@pytest.mark.parametrize("sig", [signal.SIGTERM] + [pytest.param(s, marks=pytest.mark.slow) for s in (signal.SIGHUP,
                                                                                                     signal.SIGINT)])
def test_every_script_stops_on_a_signal_with_one_line(world, sig):
    """Ctrl-C, SIGTERM or SIGHUP during start-up (torch's import) ends every script with exactly one line,
    '<script>: error: interrupted by <signal>', and 128 + n: once a traceback (sample.py while loading,
    analyze.py, plan.py, bench.py, the runners) or no line at all (SIGTERM, SIGHUP)."""
    p = world[0]
    cmds = [[sys.executable, os.path.join(ROOT, script), *[a.format(**p) for a in args]] for script, args in SIGNALLED_RUNS]
    cmds = [patched(SLOW_PRINT, p["tmp"], c) if "experiments/" in c[1] else c for c in cmds]
    marker = os.path.join(p["tmp"], f"printing{sig}")
    procs = [(script, subprocess.Popen(cmd, cwd=ROOT, env=dict(ENV, MARKER=marker), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)) for (script, _), cmd in zip(SIGNALLED_RUNS, cmds)]
    time.sleep(1.0)   # every script past the interpreter's start (its handler in place), most in torch's import
    for script, proc in procs:
        if "experiments/" not in script:
            proc.send_signal(sig)
    wait_for(lambda: os.path.exists(marker), 60, "the runner's first line")
    for script, proc in procs:
        if "experiments/" in script:
            proc.send_signal(sig)
    for script, proc in procs:
        _, err = proc.communicate(timeout=60)
        lines = [l for l in err.splitlines() if l.strip()]
        assert proc.returncode == 128 + sig and len(lines) == 1 and lines[0].startswith(   # sample.py, if it got to
            f"{os.path.basename(script)}: error: interrupted by {signal.Signals(sig).name}"), (script, proc.returncode, err)   # sampling, adds that the text stays


def test_a_signal_inside_an_import_leaves_at_once(tmp_path):
    """An exception raised through torch's import (pybind11 code) can abort the process: SIGABRT and no line (CI
    caught it ~1 run in 5 of the test above). Under signals.guard (a script's start, its imports) a signal ends the
    script at once with the one line: no KeyboardInterrupt is raised, so neither the import's own `finally` runs
    (where CI once caught numpy's "reloaded" warning, its import cut by SIGTERM inside torch's) nor the importer's."""
    (tmp_path / "slow_import.py").write_text("import os, signal, time, warnings\ntry:\n"
                                             "    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(5)\n"
                                             "finally:\n    warnings.warn('noise')\n")
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); from hrmlm import signals; signals.guard('w')\n"
            "try:\n    import slow_import\nfinally:\n    print('finally ran')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (128 + signal.SIGTERM, "",
                                                           "w: error: interrupted by SIGTERM\n")


def test_a_second_signal_ends_a_script_whose_library_swallows_the_first():
    """Under signals.main a signal raises KeyboardInterrupt, which a library may swallow (here: it retries each
    second); a second signal, with no exception in hand (no cleanup running), ends the script at once all the same,
    with one line naming both."""
    code = ("import os, signal, threading, time; from hrmlm import signals\n"
            "def send():\n    time.sleep(0.2); os.kill(os.getpid(), signal.SIGTERM); time.sleep(2.0)\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "def work():\n    threading.Thread(target=send, daemon=True).start()\n"
            "    while True:\n        try:\n            time.sleep(1)\n        except KeyboardInterrupt:\n"
            "            pass\n"
            "signals.main(work, 'w')\n")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr.strip()) == (128 + signal.SIGTERM, "w: error: interrupted by SIGTERM (then by "
                                                      "SIGTERM)"), proc.stderr
    assert 2.2 < time.monotonic() - t0 < 8, time.monotonic() - t0   # at the second: not at the first


def test_bench_stopped_leaves_no_worker(world):
    """SIGTERM to bench.py while its worker measures: one line, 143, and the worker is gone (it ran on)."""
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench.py"), "--preset=tiny", "--models=hrm_nt4"],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    children = f"/proc/{proc.pid}/task/{proc.pid}/children"
    deadline = time.time() + 60
    while time.time() < deadline and not open(children).read().split():
        time.sleep(0.1)
    worker = int(open(children).read().split()[0])
    time.sleep(1.0)   # the worker past its own start
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and err.strip().splitlines()[-1] == \
        "bench.py: error: interrupted by SIGTERM", err
    time.sleep(0.5)
    assert not os.path.exists(f"/proc/{worker}") or "zombie" in open(f"/proc/{worker}/status").read().lower()


# --- a repeated signal, and a signal after the work or with its line (hrmlm/signals.main) --------------------------

def run_c(code, **kw):
    """python -c code in the repository: the finished process."""
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60,
                          **kw)


def test_a_repeated_signal_waits_for_the_cleanup():
    """The first signal raises KeyboardInterrupt; a second during the `finally` it runs waits for it (it once quit at
    once, leaving what the cleanup was removing); then one line, naming both, and 128 + the first's number."""
    proc = run_c("import os, signal, time; from hrmlm import signals\n"
                 "def work():\n    try:\n        os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)\n"
                 "    finally:\n        os.kill(os.getpid(), signal.SIGINT)\n"
                 "        for _ in range(50):\n            time.sleep(0.01)\n        print('cleaned up')\n"
                 "signals.main(work, 'w')\n")
    assert (proc.returncode, proc.stdout, proc.stderr) == (128 + signal.SIGTERM, "cleaned up\n",
                                                           "w: error: interrupted by SIGTERM (then by SIGINT)\n")


def test_a_signal_after_the_work_or_with_its_error_line_changes_nothing():
    """After signals.main's work a signal changes nothing (here: during the interpreter's exit); one that lands while
    a UserError's line is printed leaves that line alone (it was once a KeyboardInterrupt traceback), and one while a
    signal's line is printed adds no second line."""
    done = run_c("import atexit, os, signal, time; from hrmlm import signals\n"
                 "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(0.3)))\n"
                 "signals.main(lambda: print('done'), 'w')\n")
    assert (done.returncode, done.stdout, done.stderr) == (0, "done\n", "")
    said = run_c("import os, signal; from hrmlm import signals\n"
                 "class Late(signals.UserError):\n"
                 "    def __str__(self):\n        os.kill(os.getpid(), signal.SIGINT); return 'bad input'\n"
                 "def work():\n    raise Late('')\n"
                 "signals.main(work, 'w')\n")
    assert (said.returncode, said.stderr) == (2, "w: error: bad input\n")
    stopping = run_c("import os, signal, sys; from hrmlm import signals\n"   # a second as the first one's line goes
                     "class Err:\n    def write(self, s):\n        os.kill(os.getpid(), signal.SIGINT)\n"
                     "        return sys.__stderr__.write(s)\n    def flush(self):\n        sys.__stderr__.flush()\n"
                     "signals.guard('w'); sys.stderr = Err(); os.kill(os.getpid(), signal.SIGTERM)\n")
    assert (stopping.returncode, stopping.stderr) == (128 + signal.SIGTERM, "w: error: interrupted by SIGTERM\n")


def test_an_ignored_sighup_stays_ignored():
    """Under nohup (SIGHUP ignored) neither guard() nor main() takes SIGHUP over: the work runs on through one."""
    proc = run_c("import os, signal, time; from hrmlm import signals\n"
                 "signal.signal(signal.SIGHUP, signal.SIG_IGN); signals.guard('w')\n"
                 "def work():\n    os.kill(os.getpid(), signal.SIGHUP); time.sleep(0.2); print('ran on')\n"
                 "signals.main(work, 'w')\n")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ran on\n", "")


# --- a signal in the first instants of every script, and just after train.py's done: ----------------------------

FIRST_RUNS = {   # every script, with arguments of a real run (a missing input, found after torch's import: seconds)
    "train.py": ["--device=cpu", "--max_iters=1", "--data_dir={missing}", "--out_dir={tmp}/train"],
    "sample.py": ["--out_dir={missing}"],
    "bench.py": ["--preset=tiny", "--models=hrm_nt4"],
    "prepare.py": ["--data_dir={tmp}/data", "--dataset=mine", "--input={missing}"],
    "tools/analyze.py": ["--out_dir={missing}"],
    "tools/plan.py": ["{missing}.py"],
    "tools/plot.py": ["{missing}", "--out={tmp}/c.png"],
    "tools/export_hf.py": ["--out_dir={missing}", "--to={tmp}/hf"],
}
BEFORE_GUARD = re.compile(r"import (os|sys)|from hrmlm import signals|sys\.path\.insert\(0, .*\)|[A-Z_]+ = .*")
NOT_YET = ()   # every script's guard comes first


@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.xfail(strict=True, reason="imports before its "
                                    "guard")) if s in NOT_YET else s for s in FIRST_RUNS])
def test_every_script_sets_its_guard_first(script):
    """Before a script's signals.guard() runs nothing but what the interpreter has loaded already (os, sys), constant
    names and the path to hrmlm/: no other module's code, where a signal would meet Python's default (a
    KeyboardInterrupt traceback; SIGTERM: killed without a word)."""
    body = ast.parse(open(os.path.join(ROOT, script)).read()).body
    first = next(i for i, node in enumerate(body) if "signals.guard(" in ast.unparse(node))
    before = [ast.unparse(node) for node in body[1:first]]   # body[0]: the docstring
    assert isinstance(body[0].value.value, str) and all(BEFORE_GUARD.fullmatch(s) for s in before), before


def sig_caught(pid, sig):
    """Whether process pid has a handler for sig (its own; /proc's SigCgt mask): its guard is in place."""
    try:
        mask = next(line for line in open(f"/proc/{pid}/status") if line.startswith("SigCgt:")).split()[1]
    except (OSError, StopIteration):
        return False
    return bool(int(mask, 16) >> (sig - 1) & 1)


# SIGINT and SIGTERM at 0.05, 0.1 and 0.2 s after each script starts, and as soon as its guard is in place; run with
# PYTHONPROFILEIMPORTTIME, whose 'import time:' lines on stderr say which modules the process had imported. A signal
# that lands before the script's first line ran (the interpreter's own start: site, or compiling the script) meets
# Python's default, which no project code can change: SIGTERM kills it without a word, SIGINT is a
# KeyboardInterrupt traceback ('Fatal Python error: init_import_site' inside site). That is accepted only where no
# module was imported after site but the guard's own (hrmlm, hrmlm.signals, signal); any later one is a failure.
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_in_the_first_instants_is_one_line_or_pythons_own(tmp_path, sig):
    p = {"tmp": str(tmp_path), "missing": str(tmp_path / "no_such_thing")}

    def run(script_when):
        script, when = script_when
        args = [a.format(**p) for a in FIRST_RUNS[script]]
        proc = subprocess.Popen([sys.executable, os.path.join(ROOT, script), *args], cwd=ROOT, text=True,
                                env=dict(ENV, PYTHONPROFILEIMPORTTIME="1"), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        if when == "guard":
            wait_for(lambda: sig_caught(proc.pid, signal.SIGTERM) or proc.poll() is not None, 60, f"{script}'s guard")
        else:
            time.sleep(when)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        return script, when, proc.returncode, err
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(run, [(s, when) for s in FIRST_RUNS for when in (0.05, 0.1, 0.2, "guard")]))
    for script, when, code, err in done:
        imported = [line.split("|")[-1].strip() for line in err.splitlines() if line.startswith("import time:")]
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith("import time:")]
        name, prog = signal.Signals(sig).name, os.path.basename(script)
        if code == 128 + sig:
            assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: interrupted by {name}"), (script, when, err)
            continue
        pythons = code == -sig and (not lines or sig == signal.SIGINT and lines[-1] == "KeyboardInterrupt") or \
            code == 1 and sig == signal.SIGINT and lines[0].startswith("Fatal Python error: init_import_site")
        after_site = imported[imported.index("site") + 1:] if "site" in imported else []
        assert when != "guard" and pythons and set(after_site) <= {"hrmlm", "signal", "hrmlm.signals"}, \
            (script, when, code, lines, after_site)


def test_a_signal_after_train_py_is_done_changes_nothing(data_dir, tmp_path):
    """train.py prints `done:`, then SIGTERM while the interpreter exits (an exit hook holds it there): the run is
    complete, so exit status 0 and no line (it once killed it without one)."""
    cmd = patched("import atexit, time\natexit.register(time.sleep, 1.0)\n", tmp_path,
                  train_cmd(["--max_iters=1", "--eval_interval=1"], data_dir, str(tmp_path / "run")))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    read_until(proc, "done:", 180)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and not err.strip(), err


# --- result files: whole or not at all ---------------------------------------------------------------------------

WRITERS = {   # script, its arguments writing {dest}, the file's name
    "plot": ("tools/plot.py", ["{ckpt}", "--out={dest}"], "c.png"),
    "analyze": ("tools/analyze.py", ["--out_dir={ckpt}", "--batches=1", "--json={dest}"], "a.json"),
    "bench": ("bench.py", ["--preset=tiny", "--models=tf_l2", "--profile", "--json={dest}"], "b.json"),
}


@pytest.mark.parametrize("writer,fault", [(w, "full") for w in WRITERS] + [("plot", "signal"), ("analyze", "signal")])
def test_a_failed_write_leaves_the_previous_result_whole(world, tmp_path, monkeypatch, writer, fault):
    """The result's last step fails: a full disk (fsync's ENOSPC, as a delayed write reports it) is one line and exit
    status 1, a signal its line and 128 + n; the previous file stays as it was and no temporary is left beside it
    (the file was once written in place: left at 0 bytes)."""
    script, args, name = WRITERS[writer]
    dest = tmp_path / name
    dest.write_bytes(b"the previous result")

    def failing(fd):
        raise OSError(errno.ENOSPC, "No space left on device") if fault == "full" else KeyboardInterrupt
    monkeypatch.setattr(os, "fsync", failing)
    if writer == "bench":   # its worker's result, as printed (a worker's seconds are not what this is about)
        row = dict(step_ms=1.0, floor_ms=0.5, steps=1, clock="CPU", profiled_ms=1.0, ops=1, mm_ms=0.5,
                   top=[])
        monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, json.dumps(row)))
    p = in_process(script, *[a.format(**world[0], dest=dest) for a in args])
    line = (p.stderr.strip().splitlines() or [""])[-1]
    assert (p.returncode, line) == ((1, f"{os.path.basename(script)}: error: cannot write {dest}: No space left on "
                                     f"device; it was left as it was") if fault == "full" else
                                    (130, f"{os.path.basename(script)}: error: interrupted by SIGINT")), p.stderr
    assert os.listdir(tmp_path) == [name] and dest.read_bytes() == b"the previous result"


# --- the tools' inputs: one line each ----------------------------------------------------------------------------

def test_bench_threads_are_checked_with_the_other_settings(monkeypatch):
    """BENCH_THREADS=0 (the workers' torch threads) is one line before any work, not a worker's nested traceback."""
    monkeypatch.setenv("BENCH_THREADS", "0")
    line = error_in_process("bench.py", "--preset=tiny", "--models=tf_l2", "--profile")
    assert "BENCH_THREADS='0'" in line and ">= 1" in line, line


# --- bench.py's worker, tools/device_check.sh -------------------------------------------------------------------

def test_bench_worker_ends_with_its_killed_parent(tmp_path):
    """SIGKILL to bench.py as its worker starts (here one that would compile for a minute): nothing is left to kill the
    worker, which ends by itself once it sees its parent gone (it once ran to its end, for nobody)."""
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench.py"), "--preset=tiny", "--models=tf_l2",
                             "--compile"], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children = f"/proc/{proc.pid}/task/{proc.pid}/children"
    wait_for(lambda: open(children).read().split(), 120, "bench.py's worker")
    worker = int(open(children).read().split()[0])
    proc.kill()
    proc.wait(timeout=60)
    try:
        wait_for(lambda: not os.path.exists(f"/proc/{worker}") or "zombie" in open(f"/proc/{worker}/status").read(),
                 60, "the orphaned worker to end")
    finally:
        subprocess.run(["kill", "-9", str(worker)], capture_output=True)   # where it ran on


def test_device_check_without_a_gpu_stops_at_once(tmp_path):
    """tools/device_check.sh without DRY_RUN where torch sees no GPU: one line after its first step, exit status 1,
    and no other step (it once built the 1.2B model on the CPU). Its first line is its own estimate at the paper's
    size, the sum of its steps' timeouts: under 6 minutes (issue 66)."""
    log = tmp_path / "dc.log"
    env = {**{k: v for k, v in ENV.items() if k != "DRY_RUN"}, "CUDA_VISIBLE_DEVICES": "", "LOG": str(log),
           "OUT": str(tmp_path / "out"), "BENCH_STEPS": "1"}
    p = subprocess.Popen(["bash", os.path.join(ROOT, "tools", "device_check.sh")], cwd=ROOT, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:   # it went on to the GPU steps: they and their children go
        os.killpg(p.pid, signal.SIGKILL)
        pytest.fail(f"device_check.sh went on past its first step:\n{log.read_text()[-2000:]}")
    assert p.returncode == 1 and err.splitlines() == [
        f"device_check.sh: error: torch cannot use a GPU on this machine (see {log}); run it on the GPU machine, or "
        f"DRY_RUN=1 for the same steps at toy sizes on the CPU"], err
    assert log.read_text().count("## ") == 1 and not os.path.exists(tmp_path / "out")
    estimate = re.match(r"# device_check.sh: 8 steps; their timeouts sum to (\d+) s", log.read_text())
    assert estimate and int(estimate[1]) < 360, log.read_text()
