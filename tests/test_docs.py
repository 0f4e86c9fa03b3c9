"""Every command in the README's code blocks, run as written at tiny sizes.

The commands run verbatim in bash, in a copy of the repository, with two shell functions in front:
`python train.py ...` and `torchrun ...` get tiny model and run sizes appended (the configurator lets
the last --key=value win), and torchrun starts 2 ranks instead of the README's 6. The pip install that
opens the two quick-start commands is left out (CI runs it); the test command is .ci/run itself.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, snapshot

TINY = ("--device=cpu --dtype=float32 --n_embd=32 --n_head=4 --block_size=32 --batch_size=2 --max_iters=2 "
        "--eval_interval=2 --eval_iters=1 --log_interval=1 --warmup_iters=1")
PRELUDE = f"""
set -e
python() {{ if [ "$1" = train.py ]; then command "$PY" "$@" {TINY}; else command "$PY" "$@"; fi; }}
torchrun() {{ shift 2; "$PY" -m torch.distributed.run --standalone --nproc_per_node=2 "$@" {TINY}; }}
"""


DOCS = ["README.md", "docs/TRAINING.md", "docs/MEMORY.md", "docs/EXPERIMENTS.md"]   # pages with commands to run


def readme_commands():
    """The ```sh blocks of the README and the docs pages, one command per entry (continuation lines and loops
    kept whole; a command two pages show is one entry)."""
    text = "".join(open(os.path.join(ROOT, page)).read() for page in DOCS)
    cmds = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        current = []
        for line in block.splitlines():
            current.append(line)
            code = " ".join(l.split("#")[0] for l in current)
            depth = len(re.findall(r"\bdo\b", code)) - len(re.findall(r"\bdone\b", code))
            if not line.rstrip().endswith("\\") and depth <= 0:
                cmds.append("\n".join(current))
                current = []
    return list(dict.fromkeys(cmds))


def strip_pip(cmd):
    return re.sub(r"^python -m pip install [^&]*&& ", "", cmd)


QUICK_START = "shakespeare_char && python train.py config/char_hrm.py"
FAST = [QUICK_START,                                            # first: the commands after it use its data and run
        "--init_from=out-char-hrm --out_dir=out-char-hrm-ft", "--learning_rate=1e-3 --out_dir=out-hrm-lr1e-3",
        "nproc_per_node=6 train.py config/equalparam_nt8.py", "config/equalparam_nt8.py --device=cpu"]
SLOW = ["out-hps-hrm", "out-hps-tf", "out-ms-hrm",   # the HPSearch and MultiSeed loops: 22 torchrun runs
        "tfbaseline_tf_l12.py --batch_size=4",            # plain DDP, which the paper-config line in FAST runs
        "tfbaseline_tf_l12.py --fsdp=True",               # CI time: tests/test_distributed.py runs FSDP in CI
        "--markdown=80,96",                                          # docs/MEMORY.md's table: 32 configs planned
        "ckpt_memory.py --label=after",                   # a 144M-parameter model on 2 ranks, twice (2 min)
        "config/shakespeare_hrm.py && python sample.py",   # CI time: the BPE data and HRM train in other CI tests
        "--nproc_per_node=2 train.py config/char_hrm.py"]  # CI time: test_distributed runs 2 gloo ranks in CI


def test_every_readme_command_is_covered():
    """A command added to the README fails here until a test below runs it."""
    for cmd in readme_commands():
        if strip_pip(cmd) == "python -m pytest":
            assert open(os.path.join(ROOT, ".ci", "run")).read().count("python -m pytest") == 1
            continue
        assert sum(key in cmd for key in FAST + SLOW) == 1, cmd


@pytest.fixture(scope="module")
def repo(tmp_path_factory, data_dir):
    """A copy of the repository's code with the session's BPE Shakespeare slice (the commands that use it run
    at tiny sizes) and an OpenWebText stand-in; the quick start prepares its own character data."""
    d = tmp_path_factory.mktemp("readme") / "repo"
    shutil.copytree(ROOT, d, ignore=shutil.ignore_patterns(".git", "data", "out*", "__pycache__", "docs", "*.png"))
    shutil.copytree(os.path.join(data_dir, "shakespeare"), d / "data" / "shakespeare")
    texts = d / "owt_standin"
    texts.mkdir()
    from prepare import shakespeare_plays
    for i, play in enumerate(shakespeare_plays()[:12]):
        (texts / f"p{i}.txt").write_text(play[-1] if isinstance(play, tuple) else play)
    subprocess.run([sys.executable, "prepare.py", "--dataset=openwebtext", f"--input={texts}", "--num_proc=1"],
                   cwd=d, check=True, capture_output=True)
    return d


def run(cmd, repo):
    env = dict(os.environ, PY=sys.executable, OMP_NUM_THREADS="1")
    p = subprocess.run(["bash", "-c", PRELUDE + strip_pip(cmd)], cwd=repo, env=env, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, (cmd, p.stdout[-2000:], p.stderr[-3000:])
    return p


@pytest.mark.parametrize("key", FAST)
def test_readme_command_runs(key, repo):
    (cmd,) = [c for c in readme_commands() if key in c]
    p = run(cmd, repo)
    if "sample.py" in cmd:   # it trained and sampled: text came out
        assert "tok/s" in p.stderr and len(p.stdout.strip()) > 20, p.stdout
    if key == QUICK_START:   # pasted again: nothing is prepared or trained again, and it samples again
        run_dir = repo / "out-char-hrm"
        before = snapshot(str(run_dir)), snapshot(str(repo / "data" / "shakespeare_char"))
        again = run(cmd, repo)
        assert "is up to date" in again.stdout and "finished" in again.stdout and "nothing to do" in again.stdout
        assert "tok/s" in again.stderr and again.stdout.count("ROMEO:") >= 1, again.stdout
        assert (snapshot(str(run_dir)), snapshot(str(repo / "data" / "shakespeare_char"))) == before


@pytest.mark.slow
@pytest.mark.parametrize("key", SLOW)
def test_readme_loops_run(key, repo):
    (cmd,) = [c for c in readme_commands() if key in c]
    if "config/char_hrm.py" in cmd:   # the README runs these after the quick start, which prepares the data
        run("python prepare.py --dataset=shakespeare_char", repo)
    run(cmd, repo)


# --- the quick start's figures: checked within what other CPUs and thread counts measured ----------------

# float32 on a CPU is bit-identical for one machine and one thread count (tests/test_determinism.py), not across
# them, and post-norm HRM at its tuned lr amplifies the last-digit differences. Largest |val loss - README| over
# this repository's 2-core AVX-512 machine at 1 thread, under ATEN_CPU_CAPABILITY=avx2 or =default and
# MKL_ENABLE_INSTRUCTIONS=AVX2, and another AVX-512 machine (issue #32): iteration 0 2e-8, 100 0.0003, 200 0.030,
# 300 0.031, 400 0.034. Tolerances: iteration 0 rounds to the README (nothing trained yet); 100 six times its
# spread, still 12 and 21 times below what --learning_rate x2 and /2 move it (0.024, 0.042); 200-400 twice
# theirs, which catch lr x2 (0.17-0.20) but not /2 (0.015-0.038): iteration 100 is the sharp check.
TOLERANCE = {0: 0.00005, 100: 0.002, 200: 0.06, 300: 0.06, 400: 0.07}


def quick_start_losses():
    """{iteration: val loss} from the README's quick-start table."""
    text = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"^\| iteration \|(.+)\|\n\|[-| ]+\|\n\| val loss \|(.+)\|$", text, flags=re.M)
    assert m, "the README's quick-start table is missing"
    its, vals = ([c.strip() for c in row.split("|")] for row in m.groups())
    return {int(i): float(v) for i, v in zip(its, vals)}


@pytest.fixture(scope="module")
def all_plays_char(tmp_path_factory):
    """The quick start's dataset: every play, one token per character (python prepare.py --dataset=shakespeare_char)."""
    from prepare import prepare_chars, shakespeare_plays
    d = tmp_path_factory.mktemp("quickstart")
    prepare_chars(shakespeare_plays(), str(d / "shakespeare_char"))
    return str(d)


def run_quick_start(data, out, max_iters):
    """train.py config/char_hrm.py as the quick start runs it; with max_iters < 400 and lr_decay_iters=400 its
    first iterations are exactly the quick start's (the same schedule, the same batches)."""
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "config/char_hrm.py", f"--data_dir={data}",
           f"--out_dir={out}", f"--max_iters={max_iters}", "--lr_decay_iters=400"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stderr[-3000:]
    return {r["iter"]: r["val_loss"] for r in map(json.loads, open(os.path.join(out, "log.jsonl")))}


def assert_close_to_readme(got, quoted, iters):
    """Each iteration's val loss within TOLERANCE of the README's (iteration 0: rounds to it)."""
    assert set(quoted) == set(TOLERANCE) and set(iters) <= set(got), (got, quoted)
    off = {i: (got[i], quoted[i]) for i in iters if abs(got[i] - quoted[i]) > TOLERANCE[i]}
    assert not off, f"{{iteration: (measured, README)}} beyond TOLERANCE {TOLERANCE}: {off}"


def test_quick_start_first_losses_are_the_readmes(all_plays_char, tmp_path):
    quoted = quick_start_losses()
    got = run_quick_start(all_plays_char, str(tmp_path / "qs"), 100)
    assert_close_to_readme(got, quoted, (0, 100))


@pytest.mark.slow   # the whole quick start (400 iterations); CI checks its first 100 above
def test_quick_start_losses_are_the_readmes(all_plays_char, tmp_path):
    quoted = quick_start_losses()
    got = run_quick_start(all_plays_char, str(tmp_path / "qs"), 400)
    assert_close_to_readme(got, quoted, sorted(quoted))
