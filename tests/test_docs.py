"""Every command in the README's code blocks, run as written at tiny sizes.

The commands run verbatim in bash, in a fresh clone of the repository (conftest.fresh_clone), with two
shell functions in front: `python train.py ...` and `torchrun ...` get tiny model and run sizes appended
(conftest.TINY_README; the configurator lets the last --key=value win), and torchrun starts 2 ranks instead
of the README's 6. Each test checks what its command printed and wrote (EXPECT), not only its exit status. The pip install that
opens the two quick-start commands is left out (CI runs it); the test command is .ci/run itself.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, TINY_README, fresh_clone, raw_log, sh_commands, snapshot

PRELUDE = f"""
set -e
python() {{ if [ "$1" = train.py ]; then command "$PY" "$@" {" ".join(TINY_README)}; else command "$PY" "$@"; fi; }}
torchrun() {{ shift 2; "$PY" -m torch.distributed.run --standalone --nproc_per_node=2 "$@" {" ".join(TINY_README)}; }}
"""


DOCS = ["README.md", "docs/TRAINING.md", "docs/MEMORY.md", "docs/EXPERIMENTS.md"]   # pages with commands to run


def readme_commands():
    """The ```sh blocks of the README and the docs pages, one command per entry (continuation lines and loops
    kept whole; a command two pages show is one entry)."""
    return list(dict.fromkeys(sh_commands("".join(open(os.path.join(ROOT, page)).read() for page in DOCS))))


def strip_pip(cmd):
    return re.sub(r"^python -m pip install [^&]*&& ", "", cmd)


QUICK_START = "shakespeare_char && python train.py config/char_hrm.py"
INIT_FROM = "--init_from=out-char-hrm --out_dir=out-char-hrm-ft"   # starts from the quick start's run
FAST = [QUICK_START, INIT_FROM, "--learning_rate=1e-3 --out_dir=out-hrm-lr1e-3",
        "nproc_per_node=6 train.py config/equalparam_nt8.py", "config/equalparam_nt8.py --device=cpu"]
SLOW = ["out-hps-hrm", "out-hps-tf", "out-ms-hrm",   # the HPSearch and MultiSeed loops: 22 torchrun runs
        "tfbaseline_tf_l12.py --batch_size=4",            # plain DDP, which the paper-config line in FAST runs
        "tfbaseline_tf_l12.py --fsdp=True",               # CI time: tests/test_distributed.py runs FSDP in CI
        "ckpt_memory.py --label=after",                   # a 144M-parameter model on 2 ranks, twice (2 min)
        "config/shakespeare_hrm.py && python sample.py",   # CI time: the BPE data and HRM train in other CI tests
        "--nproc_per_node=2 train.py config/char_hrm.py"]  # CI time: test_distributed runs 2 gloo ranks in CI
ELSEWHERE = {"--markdown=80,96": ("tests/test_plan.py", "test_memory_table_is_plans_output"),   # run, output checked
             "hrmlm_val.yaml": ("tests/test_export.py", "test_lm_eval_perplexity_agrees_with_analyze")}   # needs lm-eval
# (that one is slow; in CI, test_memory_table_rows_are_plans_output_for_one_config_of_each_kind runs four configs)


def test_every_readme_command_is_covered():
    """A command added to the README fails here until a test below (or the one ELSEWHERE names) runs it."""
    for cmd in readme_commands():
        if strip_pip(cmd) == "python -m pytest":
            assert open(os.path.join(ROOT, ".ci", "run")).read().count("python -m pytest") == 1
            continue
        assert sum(key in cmd for key in FAST + SLOW + list(ELSEWHERE)) == 1, cmd
    for path, test in ELSEWHERE.values():
        assert f"def {test}(" in open(os.path.join(ROOT, path)).read(), (path, test)


def command(key):
    (cmd,) = [c for c in readme_commands() if key in c]
    return cmd


@pytest.fixture(scope="session")
def repo(tmp_path_factory, data_dir):
    """A fresh clone of the repository with the session's BPE Shakespeare slice (the commands that use it run
    at tiny sizes) and an OpenWebText stand-in; the quick start prepares its own character data."""
    d = tmp_path_factory.mktemp("readme") / "repo"
    fresh_clone(d)
    shutil.copytree(os.path.join(data_dir, "shakespeare"), d / "data" / "shakespeare")
    texts = d / "owt_standin"
    texts.mkdir()
    from prepare import shakespeare_plays
    for i, play in enumerate(shakespeare_plays()[:12]):
        (texts / f"p{i}.txt").write_text(play[-1] if isinstance(play, tuple) else play)
    subprocess.run([sys.executable, "prepare.py", "--dataset=openwebtext", f"--input={texts}", "--num_proc=1"],
                   cwd=d, check=True, capture_output=True, timeout=300)
    return d


def run(cmd, repo):
    env = dict(os.environ, PY=sys.executable, OMP_NUM_THREADS="1")
    p = subprocess.run(["bash", "-c", PRELUDE + strip_pip(cmd)], cwd=repo, env=env, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, (cmd, p.stdout[-2000:], p.stderr[-3000:])
    return p


@pytest.fixture(scope="session")
def quick_start(repo):
    """The quick start pasted once into the fresh clone: its output. The commands that go on from its run
    (INIT_FROM) ask for this fixture, so each test runs alone and in any order."""
    return run(command(QUICK_START), repo)


# What each command prints and writes, at TINY_README's sizes (2 iterations, evaluations at 0 and 2)

def trained(p, repo, out_dir, ranks=1):
    """train.py ran to its end in repo/out_dir: the step-2 evaluation printed and logged, the checkpoints written;
    returns the checkpoint's config."""
    assert re.search(rf"^\w+: [\d,]+ parameters \| .*, {ranks} rank\(s\)\)", p.stdout, flags=re.M), p.stdout[-2000:]
    m = re.search(r"^step 2: train loss ([\d.]+), val loss ([\d.]+)", p.stdout, flags=re.M)
    assert m and re.search(r"^done: 2 iterations, best val loss", p.stdout, flags=re.M), p.stdout[-2000:]
    log = raw_log(str(repo / out_dir))
    assert [r["iter"] for r in log] == [0, 2] and f"{log[-1]['val_loss']:.4f}" == m[2], (log, m[0])
    import torch
    from hrmlm.checkpoint import resume_path
    ck = torch.load(os.path.join(resume_path(str(repo / out_dir)), "meta.pt"), weights_only=True)
    assert ck["iter_num"] == 2 and (repo / out_dir / "ckpt.pt").exists()
    return ck["config"]


def sampled(p, repo, start, new_tokens):
    """sample.py's text, the last line(s) of stdout: the prompt, then new_tokens characters of the run's vocabulary
    (one token each), then a newline."""
    n = len(start) + new_tokens + 1
    before, text = p.stdout[:-n], p.stdout[-n:]
    chars = json.load(open(repo / "data" / "shakespeare_char" / "meta.json"))["chars"]
    assert before.endswith("\n") and text.startswith(start) and text.endswith("\n"), p.stdout[-2000:]
    assert set(text[len(start):-1]) <= set(chars), text
    assert f"--------------- ({new_tokens} tokens in" in p.stderr and "cached" in p.stderr, p.stderr[-2000:]
    return text


def check_quick_start(p, repo):
    assert re.search(r"^vocabulary: \d+ characters; val holds", p.stdout, flags=re.M), p.stdout[:2000]
    for name in ("train.bin", "val.bin", "meta.json"):
        assert (repo / "data" / "shakespeare_char" / name).exists(), name
    assert trained(p, repo, "out-char-hrm")["dataset"] == "shakespeare_char"
    text = sampled(p, repo, "ROMEO:", 300)
    # pasted again: nothing is prepared or trained again, and the same scene comes out (sample.py's seed)
    run_dir = repo / "out-char-hrm"
    before = snapshot(str(run_dir)), snapshot(str(repo / "data" / "shakespeare_char"))
    again = run(command(QUICK_START), repo)
    assert "is up to date" in again.stdout and "finished" in again.stdout and "nothing to do" in again.stdout
    assert "vocabulary:" not in again.stdout and "step 0:" not in again.stdout, again.stdout
    assert sampled(again, repo, "ROMEO:", 300) == text
    assert (snapshot(str(run_dir)), snapshot(str(repo / "data" / "shakespeare_char"))) == before


def check_init_from(p, repo):
    assert "starting from the weights of out-char-hrm/ckpt.pt (iter 2)" in p.stdout, p.stdout[-2000:]
    config = trained(p, repo, "out-char-hrm-ft")
    assert (config["learning_rate"], config["min_lr"]) == (3e-4, 3e-5), config


def check_lr_override(p, repo):
    config = trained(p, repo, "out-hrm-lr1e-3")
    assert config["learning_rate"] == 1e-3 and config["dataset"] == "shakespeare", config   # the file, then overrides


def check_paper_config_ddp(p, repo):
    config = trained(p, repo, "out-equalparam_nt8", ranks=2)
    assert config["dataset"] == "openwebtext" and config["gradient_accumulation_steps"] == 6, config
    assert "6 x 2 x 32, 2 rank(s)" in p.stdout, p.stdout[-2000:]


def check_paper_config_smoke(p, repo):
    config = trained(p, repo, "out-smoke")
    assert config["dataset"] == "openwebtext" and config["device"] == "cpu", config


EXPECT = dict(zip(FAST, [check_quick_start, check_init_from, check_lr_override, check_paper_config_ddp,
                         check_paper_config_smoke]))


@pytest.mark.parametrize("key", FAST)
def test_readme_command_runs(key, repo, request):
    """Each command, run as written, prints and writes what shows it did its job (EXPECT), not only exit 0."""
    if key == QUICK_START:
        p = request.getfixturevalue("quick_start")
    else:
        if key == INIT_FROM:
            request.getfixturevalue("quick_start")   # the run it starts from
        p = run(command(key), repo)
    EXPECT[key](p, repo)


@pytest.mark.slow
@pytest.mark.timeout(900)   # the HPSearch loop: 8 torchrun runs; ckpt_memory.py: 2 minutes
@pytest.mark.parametrize("key", SLOW)
def test_readme_loops_run(key, repo):
    cmd = command(key)
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


@pytest.fixture(scope="session")
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
    return {r["iter"]: r["val_loss"] for r in raw_log(out)}


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
@pytest.mark.timeout(1800)
def test_quick_start_losses_are_the_readmes(all_plays_char, tmp_path):
    quoted = quick_start_losses()
    got = run_quick_start(all_plays_char, str(tmp_path / "qs"), 400)
    assert_close_to_readme(got, quoted, sorted(quoted))


# --- the layout README's reading path names -------------------------------------------------------------------

def project_imports(path):
    """The project modules a file imports, anywhere in it (a function's own imports too), as dotted names."""
    import ast
    tree = ast.parse(open(path).read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    local = {f[:-3] for f in os.listdir(ROOT) if f.endswith(".py")}
    local |= {f"{d}.{f[:-3]}" for d in ("hrmlm", "tools") for f in os.listdir(os.path.join(ROOT, d)) if f.endswith(".py")}
    return {n for n in names if n in local and not n.endswith("__init__")}


def test_the_root_holds_six_scripts_and_hrmlm_imports_have_no_circle():
    assert sorted(f for f in os.listdir(ROOT) if f.endswith(".py")) == [
        "bench.py", "configurator.py", "model.py", "prepare.py", "sample.py", "train.py"]
    assert project_imports(os.path.join(ROOT, "model.py")) == set()   # the paper alone: torch and the stdlib
    pkg = {f"hrmlm.{f[:-3]}" for f in os.listdir(os.path.join(ROOT, "hrmlm")) if f.endswith(".py") and f != "__init__.py"}
    graph = {m: project_imports(os.path.join(ROOT, *m.split(".")) + ".py") & pkg for m in pkg}
    done, stack = set(), []

    def visit(m):   # depth first: a module met again while on the stack closes a circle
        assert m not in stack, "import circle: " + " -> ".join(stack[stack.index(m):] + [m])
        if m not in done:
            stack.append(m)
            for n in sorted(graph[m]):
                visit(n)
            stack.pop()
            done.add(m)
    for m in sorted(pkg):
        visit(m)


def test_size_aims_that_hold():
    """DEVELOPERS' size aims: model.py <= 450 lines, train.py <= 360, the root's Python plus the package <= 3,000,
    tools/ <= 1,200, README <= 15 KB. experiments/' aim, 2,400, is not met (issue 63: 3,037 cut to 2,536 in three
    layers, every table the same; then issue 64's crossover study, 279, and a later cut to 2,785; then issue 65's
    decoding.py, 198, and issue 66's vs_nanogpt.py, 117): a ratchet at 3,100 keeps it from growing unnoticed."""
    def count(*paths):
        return sum(sum(1 for _ in open(os.path.join(ROOT, f))) for f in paths)
    assert count("model.py") <= 450 and count("train.py") <= 360, (count("model.py"), count("train.py"))
    py = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    core = [f for f in py if "/" not in f or f.startswith("hrmlm/")]
    assert count(*core) <= 3_000, count(*core)
    assert count(*[f for f in py if f.startswith("tools/")]) <= 1_200
    assert count(*[f for f in py if f.startswith("experiments/")]) <= 3_100
    assert os.path.getsize(os.path.join(ROOT, "README.md")) <= 15_000


def test_readme_reading_path_counts_are_the_files():
    """The README's reading path quotes each file's length ("`model.py` (449 lines"): it must be the file's."""
    quoted = re.findall(r"`([\w/]+\.py)` \((\d+)[ :]", open(os.path.join(ROOT, "README.md")).read())
    assert len(quoted) >= 3, quoted
    for name, n in quoted:
        assert sum(1 for _ in open(os.path.join(ROOT, name))) == int(n), (name, n)


def test_every_relative_link_in_the_docs_exists():
    """A Markdown link to a file of the repository ([log](../experiments/logs/x.log)) resolves from the page that
    holds it: a page moved, or a log linked from the wrong folder, fails here rather than on a reader's click."""
    tracked = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    broken = [(page, target) for page in tracked.split()
              for target in re.findall(r"\]\(([^)#\s]+)", open(os.path.join(ROOT, page)).read())
              if not re.match(r"[a-z]+:", target)
              and not os.path.exists(os.path.join(ROOT, os.path.dirname(page), target))]
    assert not broken, broken


def test_readme_test_count_is_what_pytest_collects():
    """The README quotes how many tests run outside `slow`: it must be what pytest collects today."""
    quoted = int(re.search(r"Run the tests \((\d+) outside `slow`", open(os.path.join(ROOT, "README.md")).read())[1])
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    collected = re.search(r"(\d+)(?:/\d+)? tests? collected", p.stdout)
    assert collected and int(collected[1]) == quoted, p.stdout[-500:]


def test_the_learners_path_stays_short():
    """tools/learner_path.py's measure: the project lines a tiny training run touches, model.py included, in at most 6
    files, and a sampled text's. Issue 63's aims are 1,100 and 700; counted with decorated functions (estimate_loss,
    atomic_write, engine.stream), which the issue's first measure skipped, they are 1,114 and 894 today: ratchets
    there keep them from growing back unnoticed (model.py alone is 349 and 345 of them)."""
    from tools.learner_path import measure
    got = measure()
    assert got["train"]["lines"] <= 1_114 and got["train"]["files"] <= 6, got["train"]
    assert got["sample"]["lines"] <= 894, got["sample"]
