"""tools/export_hf.py: a run as a transformers model folder (requirements-hf.txt), loaded offline in a fresh Python
with the same logits as model.py for every architecture, greedy generate() giving sample.py's tokens, both
tokenizers, the way back to a ckpt.pt with the same weights, and one line for each bad input."""

import errno
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import ENV, ROOT, one_error_line, patched, run_script
from hrmlm.checkpoint import load_checkpoint, save_checkpoint
from hrmlm.signals import UserError
from model import ModelConfig, build_model

ARCHS = {"hrm": dict(N=2, T=2, K=2), "transformer": dict(n_layer=2), "unitf": dict(M=3, K=1)}
CHARS = list("\n !',-.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


def make_run(folder, arch, tokenizer="char", **over):
    """An out_dir holding a ckpt.pt as train.py writes it, of a tiny random model."""
    vocab = len(CHARS) if tokenizer == "char" else 50257
    args = dict(arch=arch, vocab_size=vocab, block_size=32, n_embd=16, n_head=2, **ARCHS[arch], **over)
    torch.manual_seed(0)
    model = build_model(ModelConfig(**args))
    meta = {"tokenizer": "char", "chars": CHARS, "vocab_size": vocab} if tokenizer == "char" else \
        {"tokenizer": "gpt2", "vocab_size": vocab}
    os.makedirs(folder)
    save_checkpoint(os.path.join(folder, "ckpt.pt"), {
        "model": model.state_dict(), "model_args": args, "config": {"dataset": "shakespeare_char", "arch": arch},
        "meta": meta, "iter_num": 4, "best_val_loss": 4.0, "best_iter": 4})
    return str(folder)


# what a fresh Python gets from each folder, offline: logits of a fixed batch, greedy tokens, the tokenizer's ids
LOAD = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
for folder, out in zip(sys.argv[1::2], sys.argv[2::2]):
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    with torch.no_grad():
        logits = model(ids).logits
    greedy = {str(c): model.generate(ids, max_new_tokens=12, do_sample=False, use_cache=c)[0].tolist()
              for c in (True, False)}
    torch.save({"logits": logits, "greedy": greedy, "encoded": tok("ROMEO: well.")["input_ids"],
                "decoded": tok.decode(tok("ROMEO: well.")["input_ids"])}, out)
"""


@pytest.fixture(scope="module")
def hf():
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")


@pytest.fixture(scope="module")
def loaded(hf, tmp_path_factory):
    """{arch: (run, hf folder, what a fresh Python got from it)}: each architecture's tiny run exported, and all
    three loaded offline in one fresh Python (nothing of this repository on its path)."""
    tmp = tmp_path_factory.mktemp("export")
    folders = {arch: (make_run(tmp / arch / "run", arch), tmp / arch / f"hf_{arch}", tmp / arch / "got.pt")
               for arch in ARCHS}   # a folder name each: transformers caches remote code by it
    for run, hf_dir, _ in folders.values():
        p = run_script("tools/export_hf.py", f"--out_dir={run}", f"--to={hf_dir}")
        assert p.returncode == 0, p.stderr
    env = dict(ENV, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH="")
    p = subprocess.run([sys.executable, "-c", LOAD, *(str(x) for _, hf_dir, got in folders.values() for x in (hf_dir, got))],
                       capture_output=True, text=True, cwd=tmp, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return {arch: (run, hf_dir, torch.load(got, weights_only=True)) for arch, (run, hf_dir, got) in folders.items()}


@pytest.mark.parametrize("arch", list(ARCHS))
def test_export_loads_offline_with_model_py_logits_and_greedy_tokens(loaded, arch):
    from hrmlm import engine
    run, hf_dir, r = loaded[arch]
    assert {"config.json", "model.safetensors", "modeling_hrmlm.py", "model.py", "README.md", "chars.json"} <= \
        set(os.listdir(hf_dir))
    assert open(os.path.join(ROOT, "model.py")).read() == (hf_dir / "model.py").read_text()   # reused as is
    model = build_model(ModelConfig(**load_checkpoint(os.path.join(run, "ckpt.pt"))["model_args"]))
    model.load_state_dict(load_checkpoint(os.path.join(run, "ckpt.pt"))["model"])
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    with torch.no_grad():
        assert torch.allclose(r["logits"], model.eval()(ids)[0], atol=1e-5, rtol=0)
    ours = engine.generate(model, ids, 12, temperature=0)[0].tolist()   # sample.py's greedy decoding (cached)
    assert r["greedy"] == {"True": ours, "False": ours}
    assert r["encoded"] == [CHARS.index(c) for c in "ROMEO: well."] and r["decoded"] == "ROMEO: well."
    card = (hf_dir / "README.md").read_text()
    assert "iteration 4" in card and "trust_remote_code=True" in card and "commit" in card


def test_gpt2_tokenizer_is_tiktokens(hf, tmp_path):
    """A BPE run's folder carries GPT-2's vocab.json and merges.txt: AutoTokenizer gives tiktoken's ids."""
    from transformers import AutoTokenizer
    from hrmlm.common import get_tokenizer
    run = make_run(tmp_path / "run", "transformer", tokenizer="gpt2")
    assert run_script("tools/export_hf.py", f"--out_dir={run}", f"--to={tmp_path / 'hf'}").returncode == 0
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    text = "ROMEO: But soft, what light through yonder window breaks?\n  It is the east."
    assert tok(text)["input_ids"] == get_tokenizer().encode_ordinary(text)


def test_round_trip_gives_the_same_weights(hf, tmp_path):
    """The folder back to a ckpt.pt: every tensor equal, and sample.py reads it."""
    run = make_run(tmp_path / "run", "hrm")
    hf_dir = tmp_path / "exports" / "v1" / "hf"   # its parents are made too
    assert run_script("tools/export_hf.py", f"--out_dir={run}", f"--to={hf_dir}").returncode == 0
    p = run_script("tools/export_hf.py", f"--from_hf={hf_dir}", f"--to={tmp_path / 'back'}")
    assert p.returncode == 0, p.stderr
    a, b = (load_checkpoint(os.path.join(d, "ckpt.pt")) for d in (run, tmp_path / "back"))
    assert a["model"].keys() == b["model"].keys() and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert a["model_args"] == b["model_args"] and a["meta"] == b["meta"]
    s = run_script("sample.py", f"--out_dir={tmp_path / 'back'}", "--num_samples=1", "--max_new_tokens=5", "--start=A")
    assert s.returncode == 0, s.stderr


def test_bad_input_is_one_line(hf, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    line = one_error_line(run_script("tools/export_hf.py", f"--out_dir={empty}", f"--to={tmp_path / 'x'}"),
                          prog="export_hf.py")
    assert "ckpt.pt does not exist" in line, line
    run = make_run(tmp_path / "run", "hrm")
    line = one_error_line(run_script("tools/export_hf.py", f"--out_dir={run}", f"--to={run}"), prog="export_hf.py")
    assert "already exists" in line, line
    ck = torch.load(os.path.join(run, "ckpt.pt"), weights_only=True)
    bad = make_run(tmp_path / "bad", "hrm")
    save_checkpoint(os.path.join(bad, "ckpt.pt"), dict(ck, model_args=dict(ck["model_args"], arch="mamba")))
    line = one_error_line(run_script("tools/export_hf.py", f"--out_dir={bad}", f"--to={tmp_path / 'y'}"),
                          prog="export_hf.py")
    assert "does not build a model" in line and "mamba" in line, line
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_missing_transformers_is_one_line(tmp_path, monkeypatch):
    """Without the optional packages: one line naming what to install (the core never imports them)."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import export_hf
    monkeypatch.setitem(sys.modules, "transformers", None)   # import transformers: ImportError, as where it is absent
    with pytest.raises(UserError) as e:
        export_hf.main([f"--out_dir={tmp_path}", f"--to={tmp_path / 'x'}"])
    assert str(e.value) == "tools/export_hf.py needs transformers: pip install -r requirements-hf.txt"
    assert not (tmp_path / "x").exists()


def test_lm_eval_perplexity_agrees_with_analyze(hf, char_data, tmp_path):
    """The folder's lm_eval task, run offline by lm-evaluation-harness on the held-out split: its byte perplexity (a
    character per byte here) is exp of analyze.py's val CE, within 0.05 nats (other windows of the same text: the
    quick start's model gives 2.231 against 2.238)."""
    pytest.importorskip("lm_eval")
    pytest.importorskip("accelerate")
    import math
    from conftest import char_tiny, run_train
    out = str(tmp_path / "run")
    run_train(char_tiny(out, "--max_iters=40", "--eval_interval=40", "--learning_rate=1e-2"), char_data, out)
    hf_dir = tmp_path / "hf"
    p = run_script("tools/export_hf.py", f"--out_dir={out}", f"--to={hf_dir}", f"--data_dir={char_data}")
    assert p.returncode == 0 and (hf_dir / "lm_eval" / "hrmlm_val.yaml").exists(), p.stderr
    res = tmp_path / "res"
    p = subprocess.run(["lm_eval", "--model", "hf", "--model_args", f"pretrained={hf_dir},trust_remote_code=True",
                        "--tasks", str(hf_dir / "lm_eval" / "hrmlm_val.yaml"), "--device", "cpu", "--batch_size", "8",
                        "--limit", "20", "--output_path", str(res)], capture_output=True, text=True, cwd=tmp_path,
                       env=dict(ENV, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"), timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    found = [os.path.join(d, f) for d, _, fs in os.walk(res) for f in fs if f.endswith(".json")]
    import json
    ppl = json.load(open(found[0]))["results"]["hrmlm_val"]["byte_perplexity,none"]
    a = run_script("tools/analyze.py", f"--out_dir={out}", f"--data_dir={char_data}", "--batches=64",
                   f"--json={tmp_path / 'a.json'}")
    assert a.returncode == 0, a.stderr
    ce = json.load(open(tmp_path / "a.json"))["ce"]
    assert ce < math.log(len(CHARS)) - 0.5, ce   # the model learned something (else any agreement is trivial)
    assert abs(math.log(ppl) - ce) < 0.05, (math.log(ppl), ce)


# --- the way back refuses a damaged or foreign folder, and a destination it cannot write, in one line ---------------

@pytest.fixture(scope="module")
def exported(hf, tmp_path_factory):
    """{arch: an exported folder} for HRM and the Transformer, to copy and damage (never change them in place)."""
    tmp = tmp_path_factory.mktemp("exported")
    for arch in ("hrm", "transformer"):
        p = run_script("tools/export_hf.py", f"--out_dir={make_run(tmp / arch, arch)}", f"--to={tmp / f'hf_{arch}'}")
        assert p.returncode == 0, p.stderr
    return {arch: tmp / f"hf_{arch}" for arch in ("hrm", "transformer")}


def import_refused(hf_dir, to, code=2):
    """--from_hf=hf_dir --to=to stopped with one line and wrote nothing: not `to`, not its temporary sibling."""
    line = one_error_line(run_script("tools/export_hf.py", f"--from_hf={hf_dir}", f"--to={to}"), code, "export_hf.py")
    assert not os.path.lexists(to) and not [f for f in os.listdir(os.path.dirname(to)) if f.startswith("back")]
    return line


def no_sum(b):   # hrmlm.json as an export from before the checksum wrote it
    return json.dumps({k: v for k, v in json.loads(b).items() if k != "safetensors_sha256"}).encode()


DAMAGE = {   # {file: its new bytes from the old ones, None: removed}, what the line says
    "config_missing": ({"config.json": None}, "config.json: No such file or directory"),
    "config_not_json": ({"config.json": lambda b: b[:20]}, "config.json: JSONDecodeError"),
    "foreign_model_type": ({"config.json": lambda b: b'{"model_type": "gpt2", "n_embd": 768}'}, "model_type 'gpt2'"),
    "n_embd_does_not_fit": ({"config.json": lambda b: b.replace(b'"n_embd": 16', b'"n_embd": 32')},
                            "tensor 'z_H0' of shape [16], the model's is [32]"),
    "weights_missing": ({"model.safetensors": None}, "model.safetensors: No such file or directory"),
    "weights_truncated": ({"model.safetensors": lambda b: b[:len(b) // 2]}, "model.safetensors is damaged"),
    "weights_byte_flipped": ({"model.safetensors": lambda b: b[:-9] + bytes([b[-9] ^ 1]) + b[-8:]},
                             "model.safetensors is damaged"),
    "weights_truncated_unverified": ({"model.safetensors": lambda b: b[:len(b) // 2], "hrmlm.json": no_sum},
                                     "cannot read"),
    "hrmlm_json_not_json": ({"hrmlm.json": lambda b: b[:20]}, "hrmlm.json: JSONDecodeError"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_folder_is_one_line_and_writes_nothing(exported, tmp_path, damage):
    changes, says = DAMAGE[damage]
    hf_dir = shutil.copytree(exported["hrm"], tmp_path / "hf")
    for name, change in changes.items():
        f = hf_dir / name
        f.unlink() if change is None else f.write_bytes(change(f.read_bytes()))
    line = import_refused(hf_dir, tmp_path / "back")
    assert says in line, line


def test_another_models_weights_are_refused_by_name(exported, tmp_path):
    """The Transformer's model.safetensors (its checksum with it) in the HRM's folder: the first tensor it lacks."""
    hf_dir = shutil.copytree(exported["hrm"], tmp_path / "hf")
    for name in ("model.safetensors", "hrmlm.json"):
        shutil.copy(exported["transformer"] / name, hf_dir)
    line = import_refused(hf_dir, tmp_path / "back")
    assert "does not fit config.json's model: tensor 'z_H0' missing" in line, line


def test_folder_without_a_checksum_imports_with_a_note(exported, tmp_path):
    """An export from before the checksum: imported, its weights as they are, and one line saying they are
    unverified."""
    hf_dir = shutil.copytree(exported["hrm"], tmp_path / "hf")
    (hf_dir / "hrmlm.json").write_bytes(no_sum((hf_dir / "hrmlm.json").read_bytes()))
    p = run_script("tools/export_hf.py", f"--from_hf={hf_dir}", f"--to={tmp_path / 'back'}")
    assert p.returncode == 0 and not p.stderr, p.stderr
    assert [line for line in p.stdout.splitlines() if line.startswith("note:")] == \
        [f"note: {hf_dir}/hrmlm.json holds no checksum of model.safetensors (an older export): its weights are "
         f"unverified"], p.stdout
    assert load_checkpoint(str(tmp_path / "back" / "ckpt.pt"))["model_args"]["arch"] == "hrm"


@pytest.mark.parametrize("dest", ["exists", "under_a_file", "read_only", "empty"])
def test_bad_destination_is_one_line_before_any_work(hf, tmp_path, dest):
    """Said before the folder is read (here there is none: its line would come first) and nothing is written."""
    if dest == "read_only" and os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    (tmp_path / "file").write_text("x")
    (tmp_path / "existing").mkdir()
    (tmp_path / "ro").mkdir(mode=0o555)
    to, says = {"exists": (tmp_path / "existing", "already exists"), "empty": ("", "--to is empty"),
                "under_a_file": (tmp_path / "file" / "out", "a file, not a folder"),
                "read_only": (tmp_path / "ro" / "out", "not writable")}[dest]
    p = run_script("tools/export_hf.py", f"--from_hf={tmp_path / 'no_folder'}", f"--to={to}")
    assert says in one_error_line(p, prog="export_hf.py")
    assert sorted(os.listdir(tmp_path)) == ["existing", "file", "ro"] and not os.listdir(tmp_path / "existing")
    assert not os.listdir(tmp_path / "ro") and (tmp_path / "file").read_text() == "x"


@pytest.mark.parametrize("fault, code", [(OSError(errno.ENOSPC, "No space left on device"), 1),
                                         (KeyboardInterrupt(), 130)])
def test_failed_write_is_one_line_and_leaves_nothing(exported, tmp_path, monkeypatch, fault, code):
    """A full disk (exit status 1, naming no other script) or a signal (128 + SIGINT) while ckpt.pt is written: the
    temporary folder goes."""
    def faulty_save(obj, f, *a, **k):
        open(f, "wb").write(b"part of a checkpoint")
        raise fault
    monkeypatch.setattr(torch, "save", faulty_save)   # run_script runs the script in this process
    line = import_refused(exported["hrm"], tmp_path / "back", code)
    assert line == (f"export_hf.py: error: cannot write {tmp_path / 'back'}: No space left on device; nothing was "
                    f"written" if code == 1 else "export_hf.py: error: interrupted by SIGINT"), line


def test_a_full_disk_during_export_is_one_line_and_leaves_nothing(hf, tmp_path, monkeypatch):
    """model.safetensors cannot be written (safetensors says a full disk in its own error): one line, exit status 1,
    and neither --to nor its temporary folder (it was a traceback)."""
    import safetensors.torch
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    monkeypatch.setattr(safetensors.torch, "save_file", full)   # run_script runs the script in this process
    run = make_run(tmp_path / "run", "hrm")
    p = run_script("tools/export_hf.py", f"--out_dir={run}", f"--to={tmp_path / 'hf'}")
    line = one_error_line(p, 1, "export_hf.py")
    assert "cannot write" in line and "No space left on device" in line and "nothing was written" in line, line
    assert os.listdir(tmp_path) == ["run"]


# a SIGTERM as the work writes its first file, then a second one in the cleanup the first's KeyboardInterrupt runs
SIGNALS_IN_CLEANUP = """
import os, shutil, signal, time, torch
sent = []
def kill_and_wait():   # a SIGTERM, and a second for its handler to run (between two short sleeps)
    sent.append(signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(100):
        time.sleep(0.01)
def first(write):
    return lambda *args, **kwargs: (write(*args, **kwargs), kill_and_wait())
shutil.copy, torch.save, _rmtree = first(shutil.copy), first(torch.save), shutil.rmtree
def rmtree(path, *args, **kwargs):   # the cleanup: the second signal lands before it removes anything
    kill_and_wait() if sent else None
    return _rmtree(path, *args, **kwargs)
shutil.rmtree = rmtree
"""


@pytest.mark.parametrize("way", ["export", "import"])
def test_a_second_signal_waits_for_the_cleanup(exported, tmp_path, way):
    """SIGTERM while export_hf.py writes its folder (export) or ckpt.pt (--from_hf), and again while the first's
    KeyboardInterrupt removes the temporary folder: the removal finishes (the second once quit at once and left
    DEST.tmp behind), then one line naming both, and 143."""
    src = [f"--out_dir={make_run(tmp_path / 'run', 'hrm')}"] if way == "export" else [f"--from_hf={exported['hrm']}"]
    cmd = patched(SIGNALS_IN_CLEANUP, tmp_path, [sys.executable, os.path.join(ROOT, "tools", "export_hf.py"), *src,
                                                 f"--to={tmp_path / 'dest'}"])
    p = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert (p.returncode, p.stderr) == (143, "export_hf.py: error: interrupted by SIGTERM (then by SIGTERM)\n"), p.stderr
    assert not [f for f in os.listdir(tmp_path) if f.startswith("dest")], os.listdir(tmp_path)
