"""Issue 11: one clear line for every bad input to the tools (configurator, prepare, plot, bench, analyze,
sample): `<script>.py: error: ...` on stderr, exit status 2, no traceback, and no file of the user's lost."""

import hashlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from conftest import ROOT, run_train

ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_DATASETS_DISABLE_PROGRESS_BARS="1")


def run(script, *args, env=None):
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *args], capture_output=True, text=True,
                          cwd=ROOT, env=env or ENV, timeout=300)


def assert_one_line(p, word, code=2):
    """Exit status `code`, and stderr exactly one line: an error naming the problem, no traceback."""
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == code, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert len(lines) == 1 and "error:" in lines[0] and word in lines[0], p.stderr[-2000:]


def snapshot(folder):
    """{relative path: md5} of every file under folder."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            out[os.path.relpath(path, folder)] = hashlib.md5(open(path, "rb").read()).hexdigest()
    return out


def write_docs(folder, n, words="Some words of document"):
    os.makedirs(folder, exist_ok=True)
    for i in range(n):
        with open(os.path.join(folder, f"doc{i}.txt"), "w") as f:
            f.write(f"{words} {i}.\n" * 40)
    return folder


class Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


# --- every case of the issue ----------------------------------------------------------------------
# (id, script, args, word in the error line); {name} is filled from the `world` fixture's paths.
# CASES run as subprocesses of the real entry points: exit status, stderr, no traceback. Every script has
# some there; the rest (IN_PROCESS) call the script's main() and read the SystemExit, which carries the
# same line, because each subprocess that imports torch costs 3 s on a 2-core machine.

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
    ("analyze_pickled_code", "analyze.py", ["--out_dir={evil}"], "not loaded"),
    ("bench_no_models", "bench.py", ["--preset=tiny", "--models=,"], "names no model; choose from tf_l2"),
    # prepare.py (each aimed at the prepared dataset `mine`, which must come through untouched)
    ("prepare_num_proc_0", "prepare.py", ["--data_dir={data}", "--dataset=mine", "--input={docs}", "--num_proc=0"],
     "--num_proc must be >= 1"),
    ("prepare_num_proc_neg", "prepare.py", ["--data_dir={data}", "--dataset=mine", "--input={docs}", "--num_proc=-1"],
     "--num_proc must be >= 1"),
    ("prepare_data_dir_is_a_file", "prepare.py", ["--data_dir={binary}", "--dataset=mine"], "not a folder"),
    ("prepare_input_missing", "prepare.py", ["--data_dir={data}", "--dataset=mine", "--input={missing}"], "not found"),
    ("prepare_input_too_short", "prepare.py", ["--data_dir={data}", "--dataset=mine", "--input={one_char}"],
     "too little"),
    ("prepare_dataset_not_a_name", "prepare.py", ["--data_dir={data}", "--dataset=../mine"], "plain folder name"),
    # plot.py
    ("plot_empty_log", "plot.py", ["{empty_run}", "--out={tmp}/c.png"], "is empty"),
    ("plot_only_malformed_lines", "plot.py", ["{garbage_run}", "--out={tmp}/c.png"], "2 malformed"),
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
    ("plot_missing_log", "plot", ["{missing}", "--out={tmp}/c.png"], "not found"),
]


@pytest.fixture(scope="module")
def world(data_dir, tmp_path_factory):
    """A tiny checkpoint and every bad input the CASES name; then all CASES run, two at a time."""
    tmp = tmp_path_factory.mktemp("faults")
    p = {"tmp": str(tmp), "missing": str(tmp / "no_such_thing"), "ckpt": str(tmp / "ckpt")}
    run_train(["--arch=hrm", "--N=2", "--T=2", "--K=2", "--max_iters=2", "--eval_interval=2"], data_dir, p["ckpt"])
    ck = torch.load(os.path.join(p["ckpt"], "ckpt.pt"), weights_only=True)
    p["evil"], p["nan"] = str(tmp / "evil"), str(tmp / "nan")
    for name in ("evil", "nan"):
        os.makedirs(p[name])
    p["pwned"] = str(tmp / "pwned")
    torch.save({**ck, "payload": Evil(p["pwned"])}, os.path.join(p["evil"], "ckpt.pt"))
    bad = {**ck, "model": dict(ck["model"])}
    bad["model"]["z_H0"] = torch.full_like(bad["model"]["z_H0"], float("nan"))
    torch.save(bad, os.path.join(p["nan"], "ckpt.pt"))

    p["cfg_raises"] = str(tmp / "raises.py")
    (tmp / "raises.py").write_text("import math\nnum_samples = 1\ntemperature = 1 / 0\n")
    p["binary"] = str(tmp / "binary.dat")
    (tmp / "binary.dat").write_bytes(b"ROMEO\xff\xfe\x00\x80 binary")
    p["one_char"] = str(tmp / "one_char.txt")
    (tmp / "one_char.txt").write_text("x")

    # a prepared dataset with a file of the user's in it: failed prepare.py runs must leave all of it alone
    from prepare import main as prepare_main
    p["data"], p["docs"] = str(tmp / "data"), write_docs(str(tmp / "docs"), 3)
    prepare_main([f"--data_dir={p['data']}", "--dataset=mine", f"--input={p['docs']}", "--num_proc=1"])
    (tmp / "data" / "mine" / "notes.txt").write_text("mine, not prepare.py's")

    p["empty_run"], p["garbage_run"] = str(tmp / "empty_run"), str(tmp / "garbage_run")
    os.makedirs(p["empty_run"])
    (tmp / "empty_run" / "log.jsonl").write_text("")
    os.makedirs(p["garbage_run"])
    (tmp / "garbage_run" / "log.jsonl").write_text('{"iter": \nnot json\n\n')

    before = {name: snapshot(p[name]) for name in ("data", "ckpt")}
    cmds = {case: (script, [a.format(**p) for a in args]) for case, script, args, _ in CASES}
    with ThreadPoolExecutor(2) as pool:   # two at a time: most of each is importing torch
        done = dict(zip(cmds, pool.map(lambda c: run(c[0], *c[1]), cmds.values())))
    return p, done, before


@pytest.mark.parametrize("case,word", [(c[0], c[3]) for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line(world, case, word):
    p, done, _ = world
    assert_one_line(done[case], word.format(**p))


@pytest.mark.parametrize("module,args,word", [c[1:] for c in IN_PROCESS], ids=[c[0] for c in IN_PROCESS])
def test_bad_input_stops_in_process(world, module, args, word):
    import importlib
    p = world[0]
    if "--device=cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit) as e:
        importlib.import_module(module).main([a.format(**p) for a in args])
    msg = str(e.value)
    assert msg.startswith(f"{module}.py: error: ") and word.format(**p) in msg and "\n" not in msg, msg


def test_failed_runs_left_every_file_alone(world):
    p, _, before = world
    assert {name: snapshot(p[name]) for name in ("data", "ckpt")} == before
    assert not os.path.exists(p["pwned"])   # the pickled payload never ran
    assert not os.path.exists(p["missing"])
    assert sorted(os.listdir(p["data"])) == ["mine"]   # no temporary folder left beside the dataset


# --- configurator.py -------------------------------------------------------------------------------

def test_configurator_cases(tmp_path):
    from configurator import ConfigError, apply_config
    f = tmp_path / "c.py"
    f.write_text("import math\nfrom math import sqrt\n\ndef half(x):\n    return x / 2\n\n"
                 "class Box:\n    pass\n\nb = half(math.pi)\na = int(sqrt(16))\nc = [s for s in ('p', 'q')][1]\n")
    cfg = apply_config([str(f)], {"a": 1, "b": 0.5, "c": "x", "e": None})
    assert cfg == {"a": 4, "b": 3.141592653589793 / 2, "c": "q", "e": None}
    # None: only where the default is None, also after a config file has set the key
    f.write_text("e = 3\n")
    assert apply_config([str(f), "--e=None"], {"a": 1, "e": None}) == {"a": 1, "e": None}
    with pytest.raises(ConfigError, match="--a cannot be None"):
        apply_config(["--a=None"], {"a": 1, "e": None})
    f.write_text("a = None\n")
    with pytest.raises(ConfigError, match=f"{f}: --a cannot be None"):
        apply_config([str(f)], {"a": 1})
    with pytest.raises(ConfigError, match="--seed cannot be None: its type is int"):
        apply_config(["--seed=None"], {"seed": 1337})
    f.write_text("a = 2\nb = (\n")
    with pytest.raises(ConfigError, match=f"^{f}:2: SyntaxError"):
        apply_config([str(f)], {"a": 1, "b": 0.5})
    with pytest.raises(ConfigError, match="is a directory, not a .py file; in it: .*c.py"):
        apply_config([str(tmp_path)], {"a": 1})


# --- prepare.py ------------------------------------------------------------------------------------

def test_check_dataset_accepts_prepared_data(data_dir, tmp_path):
    from prepare import check_dataset
    meta = check_dataset(data_dir, "shakespeare")
    assert meta["tokenizer"] == "gpt2" and set(meta["tokens"]) == {"train", "val"}
    old = tmp_path / "old"   # a dataset from before meta.json: no meta, nothing to compare
    old.mkdir()
    for split in ("train", "val"):
        np.arange(100, dtype=np.uint16).tofile(old / f"{split}.bin")
    assert check_dataset(str(tmp_path), "old") is None


def _corrupt(kind, d):
    """Break the dataset in folder d in one way."""
    meta = json.loads((d / "meta.json").read_text())
    if kind == "missing":
        (d / "val.bin").unlink()
    elif kind == "folder":
        (d / "val.bin").unlink()
        (d / "val.bin").mkdir()
    elif kind == "empty":
        (d / "train.bin").write_bytes(b"")
    elif kind == "odd":
        (d / "val.bin").write_bytes((d / "val.bin").read_bytes() + b"\x00")
    elif kind == "count":   # val.bin of another run beside this meta.json
        (d / "val.bin").write_bytes((d / "val.bin").read_bytes()[:-20])
    elif kind == "vocab":
        meta["vocab_size"] = 100
    elif kind == "tokenizer":
        meta["tokenizer"] = "sentencepiece"
    (d / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("kind,word", [
    ("missing", "val.bin not found; run `python prepare.py --dataset=mine` first"),
    ("folder", "is a folder"), ("empty", "is empty"), ("odd", "odd number"),
    ("count", "tokens but"), ("vocab", "token id"), ("tokenizer", "unknown tokenizer 'sentencepiece'"),
])
def test_check_dataset_names_the_problem(data_dir, tmp_path, kind, word):
    import shutil
    from prepare import check_dataset
    d = tmp_path / "mine"
    shutil.copytree(os.path.join(data_dir, "shakespeare"), d)
    _corrupt(kind, d)
    with pytest.raises(ValueError) as e:
        check_dataset(str(tmp_path), "mine")
    assert word in str(e.value) and "\n" not in str(e.value)


def test_prepare_one_file_with_bad_bytes(tmp_path):
    """--input=FILE (a single document: split by its text) works; bytes that are not UTF-8 get a note."""
    from prepare import check_dataset
    f = tmp_path / "corpus.txt"
    f.write_bytes(b"".join(b"line %d of the only document\n" % i for i in range(200)) + b"caf\xe9 \xff\xfe\n")
    p = run("prepare.py", f"--data_dir={tmp_path}", "--dataset=single", f"--input={f}", "--num_proc=1")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert [line for line in p.stderr.splitlines() if line.strip()] == [
        "note: 3 byte(s) that are not UTF-8 were replaced by U+FFFD in 1 of 1 file(s)"]
    meta = check_dataset(str(tmp_path), "single")
    assert meta["tokens"]["train"] > 5 * meta["tokens"]["val"] > 0


def test_prepare_folder_of_one_document(tmp_path):
    from prepare import check_dataset, main
    src = write_docs(str(tmp_path / "src"), 1)
    counts = main([f"--data_dir={tmp_path}", "--dataset=one", f"--input={src}", "--num_proc=1"])
    assert counts["train"] > counts["val"] > 0
    assert check_dataset(str(tmp_path), "one")["tokens"] == counts


# A kill in the middle of prepare.py: np.memmap is where it starts writing val.bin, after train.bin
DIE_IN_VAL = r"""
import os, runpy, sys
import numpy as np
real_memmap = np.memmap
def memmap(path, *a, **k):
    if os.path.basename(str(path)) == "val.bin" and k.get("mode") == "w+":
        if os.environ["HOW"] == "interrupt":
            raise KeyboardInterrupt         # Ctrl-C
        os._exit(9)                         # as SIGKILL: no cleanup runs at all
    return real_memmap(path, *a, **k)
np.memmap = memmap
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("how", ["interrupt", "kill"])
def test_prepare_stopped_mid_way_keeps_previous_dataset(tmp_path, how):
    from prepare import check_dataset, main
    data = str(tmp_path / "data")
    main([f"--data_dir={data}", "--dataset=mine", f"--input={write_docs(str(tmp_path / 'old'), 3)}", "--num_proc=1"])
    with open(os.path.join(data, "mine", "notes.txt"), "w") as f:
        f.write("mine")
    before = snapshot(os.path.join(data, "mine"))
    script = tmp_path / "die.py"
    script.write_text(DIE_IN_VAL)
    new = write_docs(str(tmp_path / "new"), 4, words="Other, longer words of a new document")
    p = subprocess.run([sys.executable, str(script), os.path.join(ROOT, "prepare.py"), f"--data_dir={data}",
                        "--dataset=mine", f"--input={new}", "--num_proc=1"], capture_output=True, text=True,
                       cwd=ROOT, env=dict(ENV, HOW=how), timeout=300)
    assert snapshot(os.path.join(data, "mine")) == before   # the old dataset, whole
    check_dataset(data, "mine")
    if how == "interrupt":
        assert_one_line(p, "interrupted", code=130)
        assert os.listdir(data) == ["mine"]
    else:
        assert p.returncode == 9
        assert len(os.listdir(data)) == 2   # the dead process's temporary folder...
    counts = main([f"--data_dir={data}", "--dataset=mine", f"--input={new}", "--num_proc=1"])
    assert os.listdir(data) == ["mine"]     # ...goes with the next run
    assert check_dataset(data, "mine")["tokens"] == counts
    assert open(os.path.join(data, "mine", "notes.txt")).read() == "mine"


@pytest.mark.parametrize("where", ["between_renames", "after_renames"])
def test_prepare_settles_a_swap_cut_short(tmp_path, where):
    """A prepare.py killed inside the swap itself: the next run puts the previous dataset back (or keeps the
    new one) and carries the user's files over; check_dataset says where the old dataset went meanwhile."""
    from prepare import check_dataset, main
    data = str(tmp_path / "data")
    docs = write_docs(str(tmp_path / "docs"), 3)
    main([f"--data_dir={data}", "--dataset=mine", f"--input={docs}", "--num_proc=1"])
    with open(os.path.join(data, "mine", "notes.txt"), "w") as f:
        f.write("mine")
    dead = subprocess.Popen(["true"])
    dead.wait()
    mine, old, tmp = (os.path.join(data, n) for n in ("mine", f"mine.old.{dead.pid}", f"mine.tmp.{dead.pid}"))
    os.rename(mine, old)                     # the first rename happened...
    if where == "between_renames":
        os.makedirs(tmp)                     # ...the second did not
        with pytest.raises(ValueError, match=f"killed left the previous dataset in .*mine.old.{dead.pid}"):
            check_dataset(data, "mine")
    else:
        os.makedirs(mine)                    # ...the second did too, the user's files are not yet over
        for name in ("train.bin", "val.bin", "meta.json"):
            os.link(os.path.join(old, name), os.path.join(mine, name))
    main([f"--data_dir={data}", "--dataset=mine", f"--input={docs}", "--num_proc=1"])
    assert sorted(os.listdir(data)) == ["mine"]
    assert sorted(os.listdir(mine)) == ["meta.json", "notes.txt", "train.bin", "val.bin"]
    check_dataset(data, "mine")


# --- plot.py ---------------------------------------------------------------------------------------

def test_read_log_skips_malformed_lines(tmp_path, capsys):
    from plot import load_log as read_log
    (tmp_path / "log.jsonl").write_text('{"iter": 4, "val_loss": 2.0}\n{"iter": 0, "val_loss": 5.0}\n'
                                        '{"iter": 2, "val_l\n[1, 2]\n\n{"iter": 2, "val_loss": 3.0}\n')
    assert [r["iter"] for r in read_log(str(tmp_path))] == [0, 2, 4]
    assert capsys.readouterr().err.strip() == f"note: skipped 2 malformed line(s) in {tmp_path / 'log.jsonl'}"
