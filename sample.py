"""
Sample text from a checkpoint written by train.py.

    python sample.py --out_dir=out-shakespeare-hrm --start="ROMEO:" --max_new_tokens=100
    python sample.py --out_dir=out-shakespeare-hrm --temperature=0 --use_cache=False   # greedy, full recompute
    python sample.py --out_dir=out-shakespeare-hrm --compile=True   # fixed-shape cache, compiled (CUDA graphs on a GPU)

Decoding uses the per-application KV cache (engine.py, docs/MODEL.md section 5) unless --use_cache=False.
"""

from hrmlm import signals
signals.guard("sample.py")   # first of all (torch takes seconds to import): a signal is one line, at once

import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from configurator import configure  # noqa: E402
from hrmlm.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from hrmlm.common import DTYPES, auto_dtype, get_codec, load_meta, usable_device  # noqa: E402
from hrmlm.engine import KV_POLICIES, cache_slots, check_draft, stream  # noqa: E402
from hrmlm.signals import SIGNALLED, UserError  # noqa: E402

# -----------------------------------------------------------------------------
out_dir = "out"              # where train.py wrote ckpt.pt / ckpt_last.dcp
ckpt = "ckpt.pt"             # which checkpoint in out_dir: ckpt.pt (best val) or ckpt_last.dcp (the last)
start = "\n"                 # the prompt, or "FILE:path" to read it from a file
num_samples = 3              # samples to draw
max_new_tokens = 200         # tokens per sample
temperature = 0.8            # 0 = greedy; < 1 sharper, > 1 more random
top_k = 200                  # keep the top_k most likely tokens (0 = all)
seed = 1337                  # the sampling generator's seed
device = "auto"              # "auto", "cpu", "cuda", ...
dtype = "auto"               # "auto" (bfloat16 on CUDA, float32 on CPU), "float32", "bfloat16", "float16"
use_cache = True             # cached decoding; False re-runs the whole context for every token
kv = "full"                  # KV cache policy: full (exact); last, fired share slots and CHANGE the output (engine.py)
draft_depth = 0              # > 0: self-speculative decoding, drafted at this depth (HRM: Slow firings; UniTF: steps)
draft_tokens = 4             # tokens drafted per check at the trained depth (the same text greedy; engine.speculate)
compile = False              # torch.compile the forward, fixed-shape cache (mode reduce-overhead: CUDA graphs on GPU)
# -----------------------------------------------------------------------------


def main():
    """The settings checked before the (slower) checkpoint, then the model and its tokenizer, then the samples."""
    configure(globals())   # --key=value: a mistake is a UserError (configurator.py)
    if temperature < 0:   # a NaN or Inf: refused by the configurator
        raise UserError(f"temperature must be >= 0 and finite, got {temperature}")
    if 0 < temperature < 1e-4:   # logits / temperature would overflow to inf, and softmax give NaN
        raise UserError(f"temperature={temperature} is too small to sample with; use 0 for greedy decoding, or >= 1e-4")
    if top_k < 0:
        raise UserError(f"top_k must be >= 1 (or 0 for no limit), got {top_k}")
    if kv not in KV_POLICIES or (kv != "full" and not use_cache):
        raise UserError(f"kv must be one of {', '.join(KV_POLICIES)}" + (", with use_cache=True" if kv in KV_POLICIES
                        else "") + f", got kv={kv!r}" + ("" if use_cache else " and use_cache=False"))
    if (compile or draft_depth) and (not use_cache or kv != "full"):
        raise UserError("compile=True and draft_depth decode against the exact cache: use_cache=True, kv=full")
    if num_samples < 1 or max_new_tokens < 0:
        raise UserError("num_samples must be >= 1 and max_new_tokens >= 0")
    dev = usable_device(device)
    precision = auto_dtype(dtype, "cuda" if dev.startswith("cuda") else "cpu")
    prompt = start
    if start.startswith("FILE:"):   # read the prompt before the (slower) checkpoint, so its errors come first
        try:
            with open(start[5:], encoding="utf-8") as f:
                prompt = f.read()
        except OSError as e:
            raise UserError(f"cannot read the prompt file {start[5:]!r}: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise UserError(f"the prompt file {start[5:]!r} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
                            f"{e.start}); give a text file") from None

    path = os.path.join(out_dir, ckpt)
    if not os.path.exists(path):
        raise UserError(f"no checkpoint at {path}; train one first (python train.py config/shakespeare_hrm.py)")
    checkpoint = load_checkpoint(path)   # one line for a truncated, damaged, unsafe or foreign file
    model = model_from_checkpoint(checkpoint, path)   # and for non-finite weights
    # the tokenizer the model was trained with: the copy of meta.json in the checkpoint (older checkpoints: the
    # dataset's, where load_meta says how to rebuild it if it cannot be read; decoding through a guess prints garbage)
    run = checkpoint.get("config") or {}
    meta = checkpoint.get("meta") or load_meta(run.get("data_dir", "data"), run.get("dataset", "shakespeare"))
    if meta.get("vocab_size", model.config.vocab_size) != model.config.vocab_size:
        raise UserError(f"the model has vocab_size={model.config.vocab_size} but its dataset's meta.json says "
                        f"{meta['vocab_size']}")
    encode, decode = get_codec(meta)   # UserError: the GPT-2 tokenizer's package is missing
    cache_slots(model, kv)   # UserError: a recurrence's policy asked of a Transformer
    check_draft(model, draft_depth, draft_tokens) if draft_depth else None   # and a draft depth
    del checkpoint
    model.eval().to(dev, DTYPES[precision])   # the weights in the run's dtype (bfloat16 on CUDA): half the bytes read
    if compile:   # one graph per shape: the prompt's prefill, then every token's step (a graph break is an error)
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True, dynamic=False)
    torch.manual_seed(seed)

    if meta.get("tokenizer") == "char" and set(prompt) - set(meta["chars"]):   # encode reads them as spaces
        print(f"note: the prompt's characters {''.join(sorted(set(prompt) - set(meta['chars'])))!r} are not in the "
              f"model's {len(meta['chars'])}-character vocabulary; each is read as a space", file=sys.stderr)
    ids = encode(prompt) or [0 if meta.get("tokenizer") == "char" else 50256]  # "" -> <|endoftext|> (BPE)
    bs = model.config.block_size
    if len(ids) > bs:
        print(f"note: the prompt is {len(ids)} tokens, over block_size={bs}; keeping its last {bs} tokens",
              file=sys.stderr)
        ids = ids[-bs:]
    x = torch.tensor(ids, dtype=torch.long, device=dev)[None, ...]
    try:
        for _ in range(num_samples):
            t0, pending, t1 = time.time(), [], None
            sys.stdout.write(decode(ids))
            for t in stream(model, x, max_new_tokens, temperature, top_k or None, use_cache, kv, compile, draft_depth,
                            draft_tokens):
                pending.append(t[0, 0].item())
                t1 = t1 or time.time()
                text = decode(pending)   # a token may end inside a character (BPE splits bytes): it decodes as
                if not text.endswith("\ufffd"):   # U+FFFD until the next token completes it, so it waits for them
                    print(text, end="", flush=True)
                    pending = []
            print(decode(pending), flush=True)
            n, t2 = max_new_tokens, time.time()   # the first token carries the prefill and a first call's warm-up
            then = f"; after the first, {(n - 1) / max(t2 - t1, 1e-9):.1f} tok/s" if n > 1 else ""
            how = f"cached, kv={kv}" if use_cache else "full recompute"
            print(f"--------------- ({n} tokens in {t2 - t0:.2f} s, {n / max(t2 - t0, 1e-9):.1f} tok/s{then}; {how}"
                  f"{', compiled' * compile}{f', drafted at depth {draft_depth}' * bool(draft_depth)})", file=sys.stderr)
    except KeyboardInterrupt:   # what was printed stays printed
        print(flush=True)
        n = signals.received[0] if signals.received else signal.SIGINT
        raise UserError(f"interrupted by {signal.Signals(n).name}; the text above is what was generated",
                        SIGNALLED + n) from None


if __name__ == "__main__":
    signals.main(main)
