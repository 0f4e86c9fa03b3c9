"""prepare.py (the writer) and hrmlm/common.py (the reader): the GPT-2 tokenizer offline, the Shakespeare slices and
splits, local text, the character dataset and its unigram reference, check_dataset's corruptions, a prepare.py
stopped or killed mid-way, and train.py refusing data that contradicts its meta.json."""

import json
import math
import re
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from hrmlm.signals import UserError
from conftest import ENV, HRM, ROOT, one_error_line, run_script, run_train, snapshot, wait_for, write_docs

# --- the tokenizer, the Shakespeare plays and their split ----------------------------------------------

def test_tokenizer_is_gpt2_offline():
    from hrmlm.common import get_tokenizer
    enc = get_tokenizer()
    assert enc.n_vocab == 50257 and enc.eot_token == 50256
    assert enc.encode("Hello world") == [15496, 995]  # GPT-2's ids
    s = "To be, or not to be: that is the question.\n"
    assert enc.decode(enc.encode(s)) == s


def test_prepare_slice(data_dir):
    from hrmlm.common import get_tokenizer
    from prepare import shakespeare_plays, split_documents
    d = os.path.join(data_dir, "shakespeare")
    meta = json.load(open(os.path.join(d, "meta.json")))
    arrays = {s: np.memmap(os.path.join(d, f"{s}.bin"), dtype=np.uint16, mode="r") for s in ("train", "val")}
    assert {s: len(a) for s, a in arrays.items()} == meta["tokens"]
    docs = shakespeare_plays()[:5]
    train, val = split_documents(docs)
    assert len(train) == 4 and len(val) == 1 and not set(train) & set(val)
    enc = get_tokenizer()
    assert arrays["val"].tolist() == enc.encode_ordinary(val[0]) + [enc.eot_token]
    assert arrays["train"][-1] == enc.eot_token


def test_pieces_and_chunks_give_the_same_tokens(data_dir, tmp_path, monkeypatch):
    """tokenize_and_write cuts a long document into pieces where GPT-2's pre-tokenizer always parts, and encodes
    them a chunk at a time over threads: at tiny sizes (each play in hundreds of pieces, tens of chunks, 2
    threads) it writes the fixture's files byte for byte, from a list or a datasets.Dataset (openwebtext); and
    text built to trip a cut (whitespace runs, the separators Python counts as whitespace and tiktoken does not,
    CJK, contractions, a lone surrogate) encodes in pieces as it does whole."""
    import random
    import prepare
    from hrmlm.common import get_tokenizer
    from datasets import Dataset
    monkeypatch.setattr(prepare, "PIECE_CHARS", 1000)
    monkeypatch.setattr(prepare, "CHUNK_CHARS", 20000)
    prepare.prepare_documents(prepare.shakespeare_plays()[:5], str(tmp_path / "shakespeare"), num_threads=2)
    train, val = prepare.split_documents(prepare.shakespeare_plays()[:5])   # as openwebtext comes: a Dataset
    prepare.tokenize_and_write({"train": Dataset.from_dict({"text": train}), "val": Dataset.from_dict({"text": val})},
                               str(tmp_path / "from_dataset"), num_threads=2)
    for name in ("train.bin", "val.bin", "meta.json"):
        for d in ("shakespeare", "from_dataset"):
            assert (tmp_path / d / name).read_bytes() == \
                open(os.path.join(data_dir, "shakespeare", name), "rb").read(), (d, name)
    enc = get_tokenizer()
    rng = random.Random(0)
    alphabet = [*"ab '!.,:?09\n\r\t", "\x1c", "\x1d", "\x0b", "\u00a0", "\u3000", "\u2028", "\x85", "\u3002", "\u6f22",
                "\u00e9", "'s", "'ll", "  ", "\n\n", "\U0001F600", "\ud800"]
    text = "".join(rng.choice(alphabet) for _ in range(50000))
    for size in (1, 7, 100):
        parts = list(prepare.pieces(text, size))
        assert "".join(parts) == text and len(parts) > 100
        assert [t for p in parts for t in enc.encode_ordinary(p)] == enc.encode_ordinary(text), size


def test_full_split_is_deterministic_and_disjoint():
    from prepare import shakespeare_plays, split_documents
    docs = shakespeare_plays()
    assert len(docs) == 38
    train, val = split_documents(docs)
    assert split_documents(docs) == (train, val)
    assert not set(train) & set(val)
    assert sum(map(len, val)) / sum(map(len, train + val)) >= 0.05


def test_plays_are_plain_text():
    from prepare import play_text, shakespeare_plays
    md = "# Title\n\n## ACT I\n\n_Enter ROMEO_\n\n**ROMEO**  \nO, she doth teach\\--the torches  \n*[Aside.]*\n"
    assert play_text(md) == "Title\n\nACT I\n\nEnter ROMEO\n\nROMEO:\nO, she doth teach--the torches\n[Aside.]\n"
    plays = shakespeare_plays()
    text = "".join(t for _, t in plays)
    assert len(plays) == 38 and "ROMEO:\n" in text and "HAMLET:\n" in text
    for mark in ("**", "  \n", "_", "#", "\\"):
        assert mark not in text, mark


def test_char_dataset_and_unigram(tmp_path):
    from hrmlm.common import get_codec, load_meta, unigram_ce
    from prepare import prepare_chars, shakespeare_plays, split_documents
    docs = shakespeare_plays()[:6]
    counts = prepare_chars(docs, str(tmp_path / "c"))
    meta = load_meta(str(tmp_path), "c")
    train, val = split_documents(docs)
    assert meta["tokenizer"] == "char" and meta["vocab_size"] == len(meta["chars"]) == len(set("".join(train + val)))
    encode, decode = get_codec(meta)
    ids = np.fromfile(tmp_path / "c" / "val.bin", dtype=np.uint16)
    assert counts["val"] == len(ids) and decode(ids.tolist()) == "".join(val)  # the same held-out plays
    assert encode("ROMEO:") == [meta["chars"].index(ch) for ch in "ROMEO:"]
    # the unigram CE, written out: add-one smoothed train frequencies scored on val
    tr = np.fromfile(tmp_path / "c" / "train.bin", dtype=np.uint16)
    p = (np.bincount(tr, minlength=meta["vocab_size"]) + 1) / (len(tr) + meta["vocab_size"])
    assert unigram_ce(str(tmp_path), "c") == pytest.approx(-np.log(p[ids]).mean(), rel=1e-12)
    assert 2.5 < unigram_ce(str(tmp_path), "c") < math.log(meta["vocab_size"])


# --- local text, openwebtext without a network ------------------------------------------------------

def test_prepare_local_text_and_missing_input(tmp_path):
    from prepare import main
    src = tmp_path / "texts"
    src.mkdir()
    for i in range(12):
        (src / f"doc{i:02d}.txt").write_text(f"Document number {i}. " * 50)
    counts = main([f"--data_dir={tmp_path}", "--dataset=mine", f"--input={src}", "--num_threads=1"])
    assert counts["val"] > 0 and counts["train"] > counts["val"]
    with pytest.raises(UserError, match="no .txt or .md files"):
        main([f"--data_dir={tmp_path}", "--dataset=x", f"--input={tmp_path / 'empty'}"])


def test_input_folder_with_links_reads_each_file_once(tmp_path):
    """A symlink back up the tree (a loop) and a second link to a folder: every file once, in path order;
    hidden folders skipped. (glob's ** followed the loop and read the same files over and over.)"""
    src = tmp_path / "texts"
    (src / "sub").mkdir(parents=True)
    (src / ".git").mkdir()
    (src / "a.txt").write_text("first")
    (src / "sub" / "b.md").write_text("second")
    (src / ".git" / "c.txt").write_text("hidden")
    (src / "sub" / "loop").symlink_to(src)
    (src / "alias").symlink_to(src / "sub")
    read = subprocess.run([sys.executable, "-c", "import json, sys; from prepare import text_files; "
                           "print(json.dumps([t for _, t in text_files(sys.argv[1])]))", str(src)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)   # a deadline: a loop hung here
    assert json.loads(read.stdout) == ["first", "second"], read.stderr


def test_openwebtext_without_network_is_one_line(tmp_path, monkeypatch):
    import datasets
    import prepare

    def no_network(*a, **k):
        raise ConnectionError("Couldn't reach the Hugging Face Hub")
    monkeypatch.setattr(datasets, "load_dataset", no_network)
    with pytest.raises(UserError) as e:
        prepare.main([f"--data_dir={tmp_path}", "--dataset=openwebtext"])
    assert "could not load openwebtext" in str(e.value) and "\n" not in str(e.value)
    assert "--dataset=openwebtext --input=DIR" in str(e.value)   # the offline way to a stand-in


def test_prepare_one_file_with_bad_bytes(tmp_path):
    """--input=FILE (a single document: split by its text) works; bytes that are not UTF-8 get a note."""
    from hrmlm.common import check_dataset
    f = tmp_path / "corpus.txt"
    f.write_bytes(b"".join(b"line %d of the only document\n" % i for i in range(200)) + b"caf\xe9 \xff\xfe\n")
    p = run_script("prepare.py", f"--data_dir={tmp_path}", "--dataset=single", f"--input={f}", "--num_threads=1",
                   env=ENV)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert [line for line in p.stderr.splitlines() if line.strip()] == [
        "note: 3 byte(s) that are not UTF-8 were replaced by U+FFFD in 1 of 1 file(s)"]
    meta = check_dataset(str(tmp_path), "single")
    assert meta["tokens"]["train"] > 5 * meta["tokens"]["val"] > 0


def test_prepare_folder_of_one_document(tmp_path):
    from hrmlm.common import check_dataset
    from prepare import main
    src = write_docs(str(tmp_path / "src"), 1)
    counts = main([f"--data_dir={tmp_path}", "--dataset=one", f"--input={src}", "--num_threads=1"])
    assert counts["train"] > counts["val"] > 0
    assert check_dataset(str(tmp_path), "one")["tokens"] == counts


# --- check_dataset: a prepared dataset passes, each corruption is named in one line ------------------

def test_check_dataset_accepts_prepared_data(data_dir, tmp_path):
    from hrmlm.common import check_dataset
    meta = check_dataset(data_dir, "shakespeare")
    assert meta["tokenizer"] == "gpt2" and set(meta["tokens"]) == {"train", "val"}


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
    from hrmlm.common import check_dataset
    d = tmp_path / "mine"
    shutil.copytree(os.path.join(data_dir, "shakespeare"), d)
    _corrupt(kind, d)
    with pytest.raises(ValueError) as e:
        check_dataset(str(tmp_path), "mine")
    assert word in str(e.value) and "\n" not in str(e.value)


def test_mixed_dataset_is_refused(data_dir, tmp_path):
    d = tmp_path / "data"
    shutil.copytree(os.path.join(data_dir, "shakespeare"), d / "shakespeare")
    with open(d / "shakespeare" / "train.bin", "ab") as f:   # train.bin from another preparation
        f.write(b"\x01\x00" * 1000)
    p = run_train(HRM + ["--max_iters=2"], str(d), str(tmp_path / "out"), check=False)
    line = one_error_line(p)
    assert "train.bin" in line and "meta.json" in line, line
    assert "step 0" not in p.stdout


# --- prepare.py stopped mid-way: the previous dataset stays whole ------------------------------------

# A kill in the middle of prepare.py: opening val.bin for writing, after train.bin is written
DIE_IN_VAL = r"""
import builtins, os, runpy, sys
real_open = builtins.open
def open_(path, mode="r", *a, **k):
    if os.path.basename(str(path)) == "val.bin" and "w" in mode:
        if os.environ["HOW"] == "interrupt":
            raise KeyboardInterrupt         # Ctrl-C
        os._exit(9)                         # as SIGKILL: no cleanup runs at all
    return real_open(path, mode, *a, **k)
builtins.open = open_
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("how", ["interrupt", "kill"])
def test_prepare_stopped_mid_way_keeps_previous_dataset(tmp_path, how):
    from hrmlm.common import check_dataset
    from prepare import main
    data = str(tmp_path / "data")
    main([f"--data_dir={data}", "--dataset=mine", f"--input={write_docs(str(tmp_path / 'old'), 3)}", "--num_threads=1"])
    with open(os.path.join(data, "mine", "notes.txt"), "w") as f:
        f.write("mine")
    before = snapshot(os.path.join(data, "mine"))
    script = tmp_path / "die.py"
    script.write_text(DIE_IN_VAL)
    new = write_docs(str(tmp_path / "new"), 4, words="Other, longer words of a new document")
    p = subprocess.run([sys.executable, str(script), os.path.join(ROOT, "prepare.py"), f"--data_dir={data}",
                        "--dataset=mine", f"--input={new}", "--num_threads=1"], capture_output=True, text=True,
                       cwd=ROOT, env=dict(ENV, HOW=how), timeout=300)
    assert snapshot(os.path.join(data, "mine")) == before   # the old dataset, whole
    check_dataset(data, "mine")
    if how == "interrupt":
        assert "interrupted" in one_error_line(p, code=130, prog="prepare.py")
        assert os.listdir(data) == ["mine"]
    else:
        assert p.returncode == 9
        assert len(os.listdir(data)) == 2   # the dead process's temporary folder...
    counts = main([f"--data_dir={data}", "--dataset=mine", f"--input={new}", "--num_threads=1"])
    assert os.listdir(data) == ["mine"]     # ...goes with the next run
    assert check_dataset(data, "mine")["tokens"] == counts
    assert open(os.path.join(data, "mine", "notes.txt")).read() == "mine"


@pytest.mark.parametrize("where", ["between_renames", "after_renames"])
def test_prepare_settles_a_swap_cut_short(tmp_path, where):
    """A prepare.py killed inside the swap itself: the next run puts the previous dataset back (or keeps the
    new one) and carries the user's files over; check_dataset says where the old dataset went meanwhile."""
    from hrmlm.common import check_dataset
    from prepare import main
    data = str(tmp_path / "data")
    docs = write_docs(str(tmp_path / "docs"), 3)
    main([f"--data_dir={data}", "--dataset=mine", f"--input={docs}", "--num_threads=1"])
    with open(os.path.join(data, "mine", "notes.txt"), "w") as f:
        f.write("mine")
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=60)
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
    main([f"--data_dir={data}", "--dataset=mine", f"--input={docs}", "--num_threads=1"])
    assert sorted(os.listdir(data)) == ["mine"]
    assert sorted(os.listdir(mine)) == ["meta.json", "notes.txt", "train.bin", "val.bin"]
    check_dataset(data, "mine")



def test_dataset_without_meta_json_is_refused_with_the_rebuild_command(data_dir, tmp_path):
    from hrmlm.common import check_dataset
    old = tmp_path / "old"   # token files without their meta.json: no tokenizer to read them with
    old.mkdir()
    for split in ("train", "val"):
        np.arange(100, dtype=np.uint16).tofile(old / f"{split}.bin")
    with pytest.raises(ValueError, match=r"meta.json not found.*python prepare.py --dataset=old"):
        check_dataset(str(tmp_path), "old")
    p = run_train(["--dataset=old", "--block_size=16"], str(tmp_path), str(tmp_path / "out"), check=False)
    assert "run `python prepare.py --dataset=old` to rebuild the dataset" in one_error_line(p)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow   # CI time: the README quick start's second paste (test_docs, CI) finds its dataset up to date
def test_prepare_again_is_up_to_date(tmp_path):
    from prepare import main
    data = str(tmp_path / "data")
    docs = write_docs(str(tmp_path / "docs"), 3)
    args = [f"--data_dir={data}", "--dataset=mine", f"--input={docs}", "--num_threads=1"]
    counts = main(args)
    before = snapshot(os.path.join(data, "mine"))
    p = run_script("prepare.py", *args)
    assert p.returncode == 0 and "is up to date" in p.stdout and "nothing to do" in p.stdout, p.stdout + p.stderr
    assert snapshot(os.path.join(data, "mine")) == before and main(args) == counts
    with open(os.path.join(docs, "d0.txt"), "a") as f:   # other input: prepared again
        f.write(" More words.")
    assert main(args)["train"] != counts["train"] or main(args)["val"] != counts["val"]
    assert "up to date" not in run_script("prepare.py", *args, "--force").stdout


def test_prepare_tokenizes_in_threads_that_die_with_it(tmp_path):
    """kill -9 of prepare.py mid-tokenizing leaves nothing running: its tokenizer runs in threads (tiktoken's batch
    encoder), not in worker processes (a pool's workers used to live on, 300 MB each, until they were made to die
    with it). Formerly: two workers were found, then seen to die; now no child process may exist at all."""
    data = str(tmp_path / "data")
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "prepare.py"), f"--data_dir={data}", "--num_threads=2"],
                            cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def children():
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True, text=True,
                             timeout=60).stdout
        return [int(p) for p in out.split()]
    staged = os.path.join(data, f"shakespeare.tmp.{proc.pid}", "train.bin")
    wait_for(lambda: os.path.exists(staged) or proc.poll() is not None, 120, "prepare.py to start tokenizing")
    workers = children()   # mid-tokenizing
    assert proc.poll() is None, "prepare.py finished before it could be killed mid-tokenizing"
    assert workers == [], f"prepare.py started worker processes {workers}"
    proc.kill()
    proc.wait()
    deadline = time.time() + 30
    while any(os.path.exists(f"/proc/{w}") and open(f"/proc/{w}/stat").read().split()[2] != "Z" for w in workers) \
            and time.time() < deadline:
        time.sleep(0.2)
    alive = [w for w in workers if os.path.exists(f"/proc/{w}") and open(f"/proc/{w}/stat").read().split()[2] != "Z"]
    assert not alive, f"workers {alive} outlived prepare.py"
    assert not os.path.exists(f"/proc/{proc.pid}"), "prepare.py outlived its kill -9"


# --- prepare.py stopped by a signal at any moment: it ends, names the signal, and loses nothing ----------------

# (moment, how to wait for it): from launch, as the tokenizer's threads start (the staging folder made), mid-tokenizing,
# with tokens written, just before the swap. SIGINT goes to the whole process group, as a terminal's Ctrl-C does;
# SIGTERM to prepare.py alone, as `kill` and a scheduler do. (With a process pool, once hung forever: the workers
# inherited its handler; "threads" was "pool", the moment the workers were forked.)
MOMENTS = ["launch", "imports", "threads", "tokenizing", "writing", "swap"]


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


# SIGTERM, SIGHUP slow (CI time): the handler is SIGINT's, which CI runs
@pytest.mark.parametrize("sig", ["SIGINT"] + [pytest.param(s, marks=pytest.mark.slow) for s in ("SIGTERM", "SIGHUP")])
def test_prepare_stops_on_a_signal_at_any_moment(data_dir, tmp_path, sig):
    import signal
    from hrmlm.common import check_dataset
    signum = getattr(signal, sig)
    data = str(tmp_path / "data")
    shutil.copytree(os.path.join(data_dir, "shakespeare"), os.path.join(data, "shakespeare"))
    before = snapshot(os.path.join(data, "shakespeare"))
    handler_line = next(i for i, l in enumerate(open(os.path.join(ROOT, "prepare.py")), 1) if "signals.guard(" in l)
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])   # under load: a core taken
    outcomes = []
    try:
        for moment in MOMENTS:
            proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "prepare.py"), f"--data_dir={data}",
                                     "--num_threads=2"], cwd=ROOT, env=ENV, start_new_session=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            workers, launched = [], time.monotonic()

            def children():
                out = subprocess.run(["ps", "-o", "pid=", "-g", str(proc.pid)], capture_output=True, text=True,
                                     timeout=60).stdout
                return [int(p) for p in out.split() if int(p) != proc.pid]
            tmp = os.path.join(data, f"shakespeare.tmp.{proc.pid}")
            ready = {"launch": lambda: True, "imports": lambda: time.monotonic() - launched > 0.3,
                     "threads": lambda: os.path.isdir(tmp),
                     "tokenizing": lambda: os.path.exists(f"{tmp}/train.bin"),
                     "writing": lambda: _size(f"{tmp}/train.bin") > 0,
                     "swap": lambda: os.path.exists(f"{tmp}/meta.json")}[moment]
            wait_for(lambda: ready() or proc.poll() is not None, 120, f"prepare.py to reach {moment}")
            if moment == "tokenizing":
                time.sleep(0.05)   # threaded tokenizing takes about 0.5 s here: a longer wait lands after the work
            workers = children()
            assert workers == [], (moment, workers)   # the tokenizer runs in threads: no worker processes
            t0 = time.monotonic()
            try:
                (os.killpg if sig == "SIGINT" else os.kill)(proc.pid, signum)
            except ProcessLookupError:   # it had finished (and been reaped) first
                pass
            try:
                out, err = proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                pytest.fail(f"prepare.py hung after {sig} at {moment} (pid {proc.pid}, workers {workers})")
            took = time.monotonic() - t0
            outcomes.append((moment, proc.returncode, round(took, 1)))
            wait_for(lambda: not [w for w in workers if os.path.exists(f"/proc/{w}")
                                  and open(f"/proc/{w}/stat").read().split()[2] != "Z"], 10,
                     f"the workers {workers} to die with prepare.py ({sig} at {moment})")
            assert sorted(os.listdir(data)) == ["shakespeare"], (moment, os.listdir(data))   # nothing left beside it
            if proc.returncode == 0:                    # the signal came after it had finished its work
                assert moment in ("tokenizing", "writing", "swap"), (moment, out, err)
                check_dataset(data, "shakespeare")
                shutil.rmtree(os.path.join(data, "shakespeare"))
                shutil.copytree(os.path.join(data_dir, "shakespeare"), os.path.join(data, "shakespeare"))
                continue
            if moment == "launch" and proc.returncode in (-signum, 1):   # before prepare.py's handler existed:
                # the signal's own death, or Python's KeyboardInterrupt in its startup or in prepare.py's lines
                # before the handler's (line 0: Python checks for signals as the module starts, source compiled)
                lines = [int(n) for n in re.findall(r'prepare\.py", line (\d+)', err)]
                assert all(n <= handler_line for n in lines) and (proc.returncode != 1 or
                                                                 err.strip().endswith("KeyboardInterrupt")), err
            else:
                assert proc.returncode == 128 + signum and "Traceback" not in err, (sig, moment, proc.returncode, err)
                line = err.strip().splitlines()[-1]     # after the progress bars: one line that names the signal
                if moment in ("launch", "imports") and "before any work" in line:   # torch and datasets importing
                    assert line == f"prepare.py: error: interrupted by {sig} before any work; nothing was written"
                else:
                    assert line.startswith(f"prepare.py: error: interrupted by {sig}; "), line
                assert took < 5, f"{sig} at {moment}: took {took:.1f} s to stop"   # where the signal landed
                if "holds the new dataset" in line:
                    check_dataset(data, "shakespeare")
                    shutil.rmtree(os.path.join(data, "shakespeare"))
                    shutil.copytree(os.path.join(data_dir, "shakespeare"), os.path.join(data, "shakespeare"))
                    continue
            assert snapshot(os.path.join(data, "shakespeare")) == before, (sig, moment)   # the old dataset, whole
    finally:
        burner.kill()
        burner.wait()
    print(outcomes)


def test_a_signal_python_drops_still_stops_prepare(tmp_path, monkeypatch, capsys):
    """A signal that lands in a finaliser: Python drops its KeyboardInterrupt there (sys.unraisablehook), and
    prepare.py stops at its next chunk of tokenizing all the same (it reads signals.received), its staging folder
    removed, with the one line and 128 + n (signals.main, run here with its os._exit a SystemExit)."""
    import signal
    from hrmlm import signals
    from prepare import StopNote, tokenize_and_write
    mine, dropped = str(tmp_path / "mine"), []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)
    monkeypatch.setattr(signals, "received", [])   # this test's signals alone
    monkeypatch.setattr(os, "_exit", lambda n: (_ for _ in ()).throw(SystemExit(n)))   # not this process's end
    old = {s: signal.getsignal(s) for s in signals.STOP_SIGNALS}

    class Finalised:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)   # handled here, inside __del__: its exception is dropped
            for _ in range(1000):
                pass

    def work():
        Finalised()                                # the KeyboardInterrupt is dropped in __del__...
        assert signals.received == [signal.SIGTERM] and [type(d.exc_value) for d in dropped] == [KeyboardInterrupt]
        tokenize_and_write({"train": ["Some words."] * 3, "val": ["More words."]}, mine)   # ...and this stops
    note = StopNote()
    note.out_dir = mine
    try:
        with pytest.raises(SystemExit) as e:
            signals.main(work, "prepare.py", note)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    assert e.value.code == 128 + signal.SIGTERM and os.listdir(tmp_path) == []
    assert capsys.readouterr().err == f"prepare.py: error: interrupted by SIGTERM; {mine} was left as it was\n"


# prepare.py's tokenizer stuck where a KeyboardInterrupt cannot stop it: it swallows every one
STUCK = r"""
import sys, time
sys.path.insert(0, {root!r})
from hrmlm import common
class Stuck:   # tiktoken's encoder, stuck in its first batch: the staging folder is there, half-written
    def __init__(self):
        self.enc = real()
    def __getattr__(self, name):
        return getattr(self.enc, name)
    def encode_ordinary_batch(self, *a, **k):
        open({mark!r}, "w").close()   # in the loop from here on
        while True:
            try:
                time.sleep(0.05)
            except KeyboardInterrupt:
                pass
real, common.get_tokenizer = common.get_tokenizer, Stuck
"""


def test_prepare_ends_even_when_its_work_ignores_the_signal(data_dir, tmp_path):
    """A second signal ends prepare.py at once, whatever its work is stuck in, with exit status 128 + n of the first
    and one line naming both: the old dataset stays whole, and the staging folder left beside it is settled by the
    next run (settle_leftovers, the first thing it does)."""
    import signal
    from conftest import patched
    from prepare import settle_leftovers
    data = str(tmp_path / "data")
    shutil.copytree(os.path.join(data_dir, "shakespeare"), os.path.join(data, "shakespeare"))
    before = snapshot(os.path.join(data, "shakespeare"))
    mark = str(tmp_path / "stuck")
    cmd = patched(STUCK.format(root=ROOT, mark=mark), tmp_path, [sys.executable, os.path.join(ROOT, "prepare.py"),
                                                                f"--data_dir={data}", "--num_threads=1"])
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: os.path.exists(mark) or proc.poll() is not None, 120, "the tokenizer to be stuck")
    assert [n for n in os.listdir(data) if ".tmp." in n], os.listdir(data)   # its staging folder
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("prepare.py hung: its work ignored the signals and nothing ended it")
    assert proc.returncode == 128 + signal.SIGTERM and time.monotonic() - t0 < 2, (proc.returncode, err)
    assert err.endswith(f"prepare.py: error: interrupted by SIGTERM (then by SIGINT); "   # (after the progress
                        f"{os.path.join(data, 'shakespeare')} was left as it was\n"), err   # bar, half-drawn)
    assert sorted(os.listdir(data)) == ["shakespeare", f"shakespeare.tmp.{proc.pid}"]
    settle_leftovers(os.path.join(data, "shakespeare"))
    assert sorted(os.listdir(data)) == ["shakespeare"] and snapshot(os.path.join(data, "shakespeare")) == before
