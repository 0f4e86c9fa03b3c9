"""prepare.py, the configurator, train.py end to end, and every file in config/."""

import ast
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT, read_log, run_train
from configurator import ConfigError, apply_config
from model import ModelConfig, build_model
from plan import train_defaults


# --- prepare.py ------------------------------------------------------------------------------------

def test_tokenizer_is_gpt2_offline():
    from prepare import get_tokenizer
    enc = get_tokenizer()
    assert enc.n_vocab == 50257 and enc.eot_token == 50256
    assert enc.encode("Hello world") == [15496, 995]  # GPT-2's ids
    s = "To be, or not to be: that is the question.\n"
    assert enc.decode(enc.encode(s)) == s


def test_prepare_slice(data_dir):
    from prepare import get_tokenizer, shakespeare_plays, split_documents
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


def test_full_split_is_deterministic_and_disjoint():
    from prepare import shakespeare_plays, split_documents
    docs = shakespeare_plays()
    assert len(docs) == 38
    train, val = split_documents(docs)
    assert split_documents(docs) == (train, val)
    assert not set(train) & set(val)
    assert sum(map(len, val)) / sum(map(len, train + val)) >= 0.05


def test_prepare_local_text_and_missing_input(tmp_path):
    from prepare import main
    src = tmp_path / "texts"
    src.mkdir()
    for i in range(12):
        (src / f"doc{i:02d}.txt").write_text(f"Document number {i}. " * 50)
    counts = main([f"--data_dir={tmp_path}", "--dataset=mine", f"--input={src}", "--num_proc=1"])
    assert counts["val"] > 0 and counts["train"] > counts["val"]
    with pytest.raises(SystemExit, match="no .txt or .md files"):
        main([f"--data_dir={tmp_path}", "--dataset=x", f"--input={tmp_path / 'empty'}"])


def test_openwebtext_without_network_is_one_line(tmp_path, monkeypatch):
    import datasets
    import prepare

    def no_network(*a, **k):
        raise ConnectionError("Couldn't reach the Hugging Face Hub")
    monkeypatch.setattr(datasets, "load_dataset", no_network)
    with pytest.raises(SystemExit) as e:
        prepare.main([f"--data_dir={tmp_path}", "--dataset=openwebtext"])
    assert "could not load openwebtext" in str(e.value) and "\n" not in str(e.value)


# --- the configurator ---------------------------------------------------------------------------

def test_configurator(tmp_path):
    cfg = {"a": 1, "b": 0.5, "c": "x", "d": True, "e": None}
    f = tmp_path / "c.py"
    f.write_text("a = 3\nb = 2\n")
    apply_config([str(f), "--c=hello", "--d=False", "--e=7"], cfg)
    assert cfg == {"a": 3, "b": 2.0, "c": "hello", "d": False, "e": 7}
    with pytest.raises(ConfigError, match="unknown config key 'zz'; valid keys: a, b, c, d, e"):
        apply_config(["--zz=1"], cfg)
    with pytest.raises(ConfigError, match="must be of type int"):
        apply_config(["--a=1.5"], cfg)
    with pytest.raises(ConfigError, match="must be True or False"):
        apply_config(["--d=1"], cfg)
    with pytest.raises(ConfigError, match="not found; available"):
        apply_config([str(tmp_path / "missing.py")], cfg)
    f.write_text("typo_key = 1\n")
    with pytest.raises(ConfigError, match="unknown config key 'typo_key'"):
        apply_config([str(f)], cfg)


@pytest.mark.parametrize("args,msg", [
    (["--bogus=1"], "unknown config key 'bogus'; valid keys:"),
    (["--batch_size=two"], "must be of type int"),
    (["config/does_not_exist.py"], "not found; available: config/"),
    (["--K=0"], "ModelConfig.K"),
    (["--n_head=5"], "ModelConfig.n_embd"),
    (["--block_size=100000"], "block_size=100000 needs more than"),
    (["--dataset=nowhere"], "data/nowhere/train.bin not found; run `python prepare.py --dataset=nowhere`"),
])
def test_train_config_errors_stop_before_work(args, msg, data_dir, tmp_path):
    if args[0].startswith("--dataset"):
        p = run_train(args + ["--data_dir=data"], data_dir, str(tmp_path), check=False)
    else:
        p = run_train(args, data_dir, str(tmp_path), check=False)
    assert p.returncode == 2, p.stderr
    assert msg in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr   # one line, no traceback
    assert "step 0" not in p.stdout


# --- train.py end to end ------------------------------------------------------------------------

@pytest.mark.parametrize("arch,extra", [("hrm", ["--N=1", "--T=2", "--K=1"]),   # CI: HRM; the others slow (CI time)
                                        pytest.param("transformer", ["--n_layer=2"], marks=pytest.mark.slow),
                                        pytest.param("unitf", ["--M=2", "--K=1"], marks=pytest.mark.slow)])
def test_few_iterations_lower_the_loss(arch, extra, data_dir, tmp_path):
    out = str(tmp_path / arch)
    # 1e-2: at d=32 the tied head starts near-uniform and the post-norm flat models need the larger
    # step to leave 10.8 nats in 30 iterations (at 3e-3 the Transformer drops only 0.24 on plain text)
    p = run_train([f"--arch={arch}", *extra, "--max_iters=30", "--eval_interval=30", "--learning_rate=1e-2",
                   "--min_lr=1e-3"], data_dir, out)
    log = read_log(out)
    assert [r["iter"] for r in log] == [0, 30]
    assert log[-1]["val_loss"] < log[0]["val_loss"] - 1.0, log
    for key in ("iter", "train_loss", "val_loss", "lr", "grad_norm", "time_s"):
        assert key in log[-1]
    assert "ms/iter" in p.stdout and "tok/s" in p.stdout
    import re   # the progress line: i/max_iters, percent, elapsed and time left
    assert re.search(r"^iter 15/30 \(50\.0%\): .* \d+ s elapsed, \d+ s left$", p.stdout, flags=re.M), p.stdout
    assert re.search(r"^step 30: train loss [\d.]+, val loss [\d.]+ \([\d.]+ s\)$", p.stdout, flags=re.M), p.stdout
    # ckpt.pt (for sampling) holds no optimiser state: at most half of ckpt_last.pt (AdamW keeps 2 moments)
    assert os.path.getsize(os.path.join(out, "ckpt.pt")) <= 0.5 * os.path.getsize(os.path.join(out, "ckpt_last.pt"))
    ck = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert not any(k.startswith("_orig_mod") for k in ck["model"])
    assert ck["iter_num"] == 30 and ck["model_args"]["arch"] == arch


def test_hrm_clip_is_K_over_M(data_dir, tmp_path):
    p = run_train(["--arch=hrm", "--N=2", "--T=2", "--K=1", "--grad_clip=2.0", "--max_iters=0"], data_dir, str(tmp_path))
    assert "clip 0.5" in p.stdout   # 2.0 * K / M = 2.0 * 1 / 4


# --- every config in config/ ---------------------------------------------------------------------

def paper_size(arch, d, n_layer, V=50257):
    if arch == "hrm":
        return V * d + 61 * d * d + 23 * d + 3   # SPEC section 2: 1,229,357,059 at d=4096
    if arch == "transformer":
        return n_layer * (16 * d * d + 2 * d) + V * d
    return 16 * d * d + 2 * d + V * d


PAPER_ROWS = {  # the paper's rounded sizes (millions), as a second check on the formula
    "equalparam_nt8": 1229, "equalparam_tf_l2": 743, "equalparam_tf_l4": 1280, "equalflops_tf_l12": 3427,
    "equalflops_hrm_d2048_nt36": 359, "equalflops_hrm_d5120_nt9": 1857, "unitf_d4096": 474,
    "unitf_d5760": 820, "unitf_d7296": 1218,
}
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "config", "*.py")))


def test_config_dir_covers_the_paper():
    names = {os.path.basename(p)[:-3] for p in CONFIGS}
    assert "equalparam_nt8" in names and len(names) >= 30
    assert set(PAPER_ROWS) <= names


@pytest.mark.parametrize("path", CONFIGS, ids=[os.path.basename(p) for p in CONFIGS])
def test_config_loads_and_builds(path):
    cfg = apply_config([path], train_defaults())
    cfg["vocab_size"] = cfg["vocab_size"] or {"shakespeare_char": 80}.get(cfg["dataset"], 50257)  # 0: from meta.json
    with torch.device("meta"):
        model = build_model(ModelConfig.from_settings(cfg))
    n = model.num_params()
    H_net = 21 * cfg["n_embd"] ** 2 + 4 * cfg["n_embd"] + 1 if cfg["fast_only"] else 0  # the control has none
    extra = cfg["n_embd"] if cfg["norm"] == "pre" and cfg["arch"] != "hrm" else 0      # pre-norm's final norm
    assert n == paper_size(cfg["arch"], cfg["n_embd"], cfg["n_layer"], V=cfg["vocab_size"]) - H_net + extra
    name = os.path.basename(path)[:-3]
    if name in PAPER_ROWS:
        assert round(n / 1e6) == PAPER_ROWS[name]
    if not name.startswith(("shakespeare", "char_")):
        assert cfg["dataset"] == "openwebtext" and cfg["block_size"] == 1024 and cfg["batch_size"] == 12
        assert cfg["batch_size"] * cfg["gradient_accumulation_steps"] == 72  # 12 x 6 GPUs
        assert cfg["min_lr"] < cfg["learning_rate"] and cfg["max_iters"] in (10000, 20000, 60000)


def test_paper_config_shape_smoke(tmp_path):
    """The issue's smoke test of config/equalparam_nt8.py, on a local stand-in for OpenWebText
    (prepare.py --input writes any local text under the dataset name asked for)."""
    import subprocess
    import sys
    from prepare import main as prepare_main, shakespeare_plays
    src = tmp_path / "texts"
    src.mkdir()
    for name, text in shakespeare_plays()[:3]:
        (src / (name.replace("/", "_") + ".txt")).write_text(text)
    prepare_main([f"--data_dir={tmp_path}", "--dataset=openwebtext", f"--input={src}", "--num_proc=1"])
    cmd = [sys.executable, "train.py", "config/equalparam_nt8.py", "--device=cpu", "--max_iters=2", "--eval_iters=1",
           "--batch_size=1", "--block_size=64", "--n_embd=64", "--n_head=4", "--eval_interval=1",
           f"--data_dir={tmp_path}", f"--out_dir={tmp_path / 'out'}"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "hrm:" in p.stdout and "6 x 1 x 64" in p.stdout and "step 2:" in p.stdout
    log = read_log(str(tmp_path / "out"))
    assert [r["iter"] for r in log] == [0, 1, 2]


@pytest.mark.parametrize("script", ["train", "sample", "bench", "analyze", "prepare", "plot"])
def test_help_lists_every_setting_with_its_default(script):
    """--help exits 0 and names every setting the script reads, with its default."""
    import re
    p = subprocess.run([sys.executable, os.path.join(ROOT, f"{script}.py"), "--help"], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0 and not p.stderr, p.stderr
    if script in ("train", "sample"):  # configurator scripts: every global of the settings block
        src = open(os.path.join(ROOT, f"{script}.py")).read()
        block = src.split("# " + "-" * 77)[1]
        keys = re.findall(r"^(\w+) = ", block, flags=re.M)
        assert len(keys) > 10
        for k in keys:
            assert re.search(rf"^  --{k}=\S", p.stdout, flags=re.M), k
    else:              # argparse scripts: every option shows its default
        opts = [o for o in re.findall(r"^  (--\w+)", p.stdout, flags=re.M) if o != "--help"]
        assert opts
        for o in opts:
            assert re.search(rf"{o}.*?\(default: ", p.stdout, flags=re.S), o


def test_configs_set_only_what_differs():
    """config/ says only what each experiment changes: train.py's defaults are the paper's OpenWebText
    setup, so no assignment in a config file may repeat train.py's default for its key (issue 13), or,
    in a file that include()s another, the value the included file gives it."""
    from configurator import apply_config
    same = []
    for path in CONFIGS:
        defaults = train_defaults()
        tree = ast.parse(open(path).read())
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "include"):
            apply_config([os.path.join(os.path.dirname(path), call.args[0].value)], defaults)
        for node in tree.body:
            if not isinstance(node, ast.Assign):
                continue
            try:
                value = ast.literal_eval(node.value)
            except ValueError:  # not a literal (a config may compute a value): not compared
                continue
            for target in node.targets:
                if not isinstance(target, ast.Name) or target.id not in defaults:
                    continue
                default = defaults[target.id]
                if target.id == "M" and value == 0:  # M = 0 is an old spelling of None
                    value = None
                if value == default and isinstance(value, bool) == isinstance(default, bool):
                    same.append(f"{os.path.basename(path)}:{node.lineno}: {target.id} = {value!r} changes nothing")
    assert not same, "\n".join(same)
