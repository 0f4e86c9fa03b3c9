"""
Train HRM-LM, a Transformer or a UniTF. One process:

    python train.py config/shakespeare_hrm.py --max_iters=100

DDP on one node with 6 GPUs (NCCL on CUDA, gloo on CPU):

    torchrun --standalone --nproc_per_node=6 train.py config/equalparam_nt8.py

gradient_accumulation_steps is the *global* number of micro-batches per iteration, as in
nanoGPT: each of W ranks runs 1/W of them. Micro-batch j of iteration i is drawn from its
own seeded generator, so a run gives the same numbers with 1 or W processes, and after a
resume (the sampler's whole state is the iteration number).
"""

import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from configurator import DTYPES, auto_device, auto_dtype, configure, precision_context
from model import MODEL_FIELDS, ModelConfig, build_model
from prepare import load_meta

# -----------------------------------------------------------------------------
# I/O
out_dir = "out"              # checkpoints and log.jsonl go here
eval_interval = 500          # evaluate (and checkpoint) every this many iterations
log_interval = 10            # print a progress line every this many iterations
eval_iters = 50              # batches per split in an evaluation
eval_only = False            # evaluate once and exit
always_save_checkpoint = False  # save ckpt.pt at every eval, not only when val improves
init_from = "scratch"        # "scratch" or "resume" (from out_dir/ckpt_last.pt)
max_nonfinite = 10           # stop after this many non-finite iterations in a row
# data
dataset = "shakespeare"      # data/<dataset>/{train,val}.bin from prepare.py
data_dir = "data"            # where prepare.py wrote the datasets
gradient_accumulation_steps = 1  # global micro-batches per iteration (divisible by the world size)
batch_size = 12              # sequences per micro-batch
block_size = 1024            # tokens per sequence
# model (ModelConfig fields; see model.py)
arch = "hrm"                 # "hrm" | "transformer" | "unitf"
vocab_size = 0               # 0 = from data/<dataset>/meta.json (50257, GPT-2 BPE, where there is none)
n_embd = 4096                # d
n_head = 16                  # attention heads
n_layer = 4                  # transformer: independent blocks L
N = 4                        # hrm: Slow-module firings per pass
T = 3                        # hrm: Fast steps per Slow firing
M = 0                        # unitf: steps (0 = default 12); hrm: ignored, M = N*T
K = 2                        # hrm/unitf: gradient window (last K steps)
S = 1                        # hrm: supervision passes
ent_lambda = 0.01            # hrm: fusion-entropy weight
unitf_init_c = 2.0           # unitf: init std 0.02/sqrt(c*M*d/4096)
norm = "post"                # "post" (the paper) or "pre" (x + f(RMSNorm(x)); a trainability control)
fast_only = False            # hrm: the Fast module alone, no Slow module (a control for the hierarchy)
K_slow = 0                   # hrm: the last K_slow Slow firings also carry gradient (0 = the paper; "hierarchical BPTT")
grad_ckpt = False            # hrm/unitf: recompute the steps with gradient in backward (same gradients, flat memory)
fast_attn_steps = None       # hrm: Fast steps that attend (None = all M, the paper; 0 = position-wise, RNN-style)
# optimiser: AdamW, betas (0.9, 0.95), weight decay on matrices only (SPEC section 6)
learning_rate = 1.5e-4       # peak learning rate
min_lr = 1.5e-5              # cosine floor
max_iters = 10000            # total iterations
weight_decay = 0.1           # on 2-D parameters
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0              # clip norm; HRM/UniTF use grad_clip * K / M (0 = off)
decay_lr = True              # linear warmup then cosine; False = constant
warmup_iters = 1000          # linear warmup
lr_decay_iters = 0           # cosine reaches min_lr here (0 = max_iters)
# system
device = "auto"              # "auto" (cuda if present, else cpu), "cpu", "cuda", "cuda:1", ...
dtype = "auto"               # "auto" (bfloat16 on CUDA, float32 on CPU), "float32", "bfloat16", "float16"
compile = False              # torch.compile the model (the uncompiled weights are what is saved)
seed = 1337                  # everything random derives from this
# -----------------------------------------------------------------------------
config = configure(globals(), prog="train.py")

# --- process group -----------------------------------------------------------
ddp = int(os.environ.get("RANK", -1)) != -1
rank, local_rank, world_size = 0, 0, 1
device = auto_device(device)
if device.startswith("cuda") and not torch.cuda.is_available():
    print(f"train.py: error: device={device!r} but CUDA is not available", file=sys.stderr)
    sys.exit(2)
if ddp:
    rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
master = rank == 0
device_type = "cuda" if device.startswith("cuda") else "cpu"
dtype = auto_dtype(dtype, device_type)


errors = []  # config and data errors found before any work; see stop_on_errors()


def fail(msg):
    """Record an error found before work; stop_on_errors() stops every rank on it."""
    errors.append(msg)


def stop_on_errors():
    """All ranks learn whether any rank found an error; each prints its own, one line each, and all
    exit together (a rank that exited alone would be killed by torchrun with its siblings mid-print)."""
    any_error = bool(errors)
    if ddp:
        everyone = [None] * world_size
        dist.all_gather_object(everyone, errors)
        any_error = any(everyone)
    if not any_error:
        return
    for msg in errors:  # one write per line, so that lines from several ranks never interleave
        sys.stderr.write(f"train.py: error{f' (rank {rank})' if ddp else ''}: {msg}\n")
        sys.stderr.flush()
    if ddp:
        dist.barrier()
        dist.destroy_process_group()
    sys.exit(2)


def log(msg):
    if master:
        print(msg, flush=True)


# --- everything checkable before work ----------------------------------------
if dtype not in DTYPES:
    fail(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
if init_from not in ("scratch", "resume"):
    fail(f"init_from must be 'scratch' or 'resume', got {init_from!r}")
if gradient_accumulation_steps < 1 or gradient_accumulation_steps % world_size:
    fail(f"gradient_accumulation_steps={gradient_accumulation_steps} must be a positive multiple of "
         f"the world size {world_size} (it counts global micro-batches)")
for key in ("batch_size", "max_iters", "eval_iters", "eval_interval", "log_interval", "max_nonfinite"):
    least = 0 if key == "max_iters" else 1
    if config[key] < least:
        fail(f"{key} must be >= {least}, got {config[key]}")
data = {}
for split in ("train", "val"):
    path = os.path.join(data_dir, dataset, f"{split}.bin")
    if not os.path.exists(path):
        hint = "python prepare.py" if dataset == "shakespeare" else f"python prepare.py --dataset={dataset}"
        fail(f"{path} not found; run `{hint}` first")
        break
    data[split] = np.memmap(path, dtype=np.uint16, mode="r")
    if len(data[split]) <= block_size + 1:
        fail(f"block_size={block_size} needs more than {block_size + 1} tokens, but {path} holds {len(data[split])}")
# the vocabulary is the dataset's: a config may leave vocab_size at 0 or repeat it, never contradict it
meta = load_meta(data_dir, dataset)
data_vocab = meta["vocab_size"] if meta else 50257
if vocab_size and vocab_size != data_vocab:
    fail(f"vocab_size={vocab_size}, but {os.path.join(data_dir, dataset, 'meta.json')} says the dataset has "
         f"{data_vocab} ({meta['tokenizer'] if meta else 'gpt2'}); leave vocab_size at 0 to take it from the data")
vocab_size = config["vocab_size"] = data_vocab
model_args = {k: config[k] for k in MODEL_FIELDS}
model_args["M"] = (M or None) if arch == "unitf" else None
try:
    model_config = ModelConfig(**model_args)
except ValueError as e:
    fail(str(e))
ckpt_last, ckpt_best = os.path.join(out_dir, "ckpt_last.pt"), os.path.join(out_dir, "ckpt.pt")
if init_from == "resume" and not os.path.exists(ckpt_last):
    fail(f"init_from='resume' but {ckpt_last} does not exist")
stop_on_errors()

# --- seeding and data ----------------------------------------------------------
random.seed(seed)
np.random.seed(seed)
torch.manual_seed(seed)  # the model's init: identical on every rank
tokens_per_iter = gradient_accumulation_steps * batch_size * block_size
micro_per_rank = gradient_accumulation_steps // world_size


def get_batch(split, stream, i, j):
    """Micro-batch j of iteration i of a stream: a pure function of (seed, stream, i, j)."""
    rng = np.random.default_rng([seed, stream, i, j])
    d = data[split]
    ix = rng.integers(0, len(d) - block_size - 1, size=batch_size)
    x = torch.from_numpy(np.stack([d[k:k + block_size] for k in ix]).astype(np.int64))
    y = torch.from_numpy(np.stack([d[k + 1:k + 1 + block_size] for k in ix]).astype(np.int64))
    if device_type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x, y


# --- model, optimiser, checkpoint -----------------------------------------------
iter_num, best_val_loss, skipped_total = 0, float("inf"), 0
checkpoint = None
if init_from == "resume":
    try:
        checkpoint = torch.load(ckpt_last, map_location="cpu", weights_only=True)
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        fail(f"cannot load {ckpt_last}: {type(e).__name__}: {first} (truncated, not a checkpoint, or unsafe)")
    else:
        saved = checkpoint.get("model_args", {})
        diff = {k: (saved.get(k, getattr(ModelConfig, k)), model_args[k]) for k in model_args
                if saved.get(k, getattr(ModelConfig, k)) != model_args[k]}  # a key older than the file: its default
        if diff:
            fail(f"{ckpt_last} holds a different model: " +
                 ", ".join(f"{k}={a!r} in the checkpoint vs {b!r} now" for k, (a, b) in diff.items()))
stop_on_errors()
model = build_model(model_config)
if checkpoint is not None:
    model.load_state_dict(checkpoint["model"])
model.to(device)

decay = [p for p in model.parameters() if p.dim() >= 2]      # matrices and the embedding
no_decay = [p for p in model.parameters() if p.dim() < 2]    # norms, alpha, tau
optimizer = torch.optim.AdamW(
    [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
    lr=learning_rate, betas=(beta1, beta2), fused=device_type == "cuda")
if checkpoint is not None:
    optimizer.load_state_dict(checkpoint["optimizer"])
    iter_num, best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
    skipped_total = checkpoint.get("skipped_total", 0)
scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
ctx = precision_context(device_type, dtype)

raw_model = model
if compile:
    model = torch.compile(model)
if ddp:
    model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None)

steps = model_config.M
clip = grad_clip * min(K, steps) / steps if arch in ("hrm", "unitf") else grad_clip  # K/M-proportional
decay_iters = lr_decay_iters or max_iters


def get_lr(it):
    """Linear warmup, then cosine from learning_rate to min_lr at decay_iters."""
    if not decay_lr:
        return learning_rate
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it >= decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / max(1, decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def rng_state():
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if device_type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state):
    """Inverse of rng_state() after a to_plain() round trip through the checkpoint."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy(), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device_type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def gather_rng_states():
    states = [None] * world_size
    if ddp:
        dist.all_gather_object(states, rng_state())
    else:
        states[0] = rng_state()
    return states


if checkpoint is not None:
    states = checkpoint.get("rng", [])
    if len(states) != world_size:
        log(f"note: checkpoint has RNG states of {len(states)} ranks, this run has {world_size}; reseeding")
    else:
        set_rng_state(states[rank])


def to_plain(obj):
    """RNG states hold tuples and numpy arrays; make them loadable with weights_only=True."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    if isinstance(obj, (list, tuple)):
        return [to_plain(o) for o in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def save_checkpoint(path, rng_states):
    """Atomic: write a temporary file beside the target, fsync, then os.replace."""
    ckpt = {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(), "model_args": model_args,
            "config": config, "iter_num": iter_num, "best_val_loss": best_val_loss,
            "skipped_total": skipped_total, "rng": to_plain(rng_states), "meta": meta}
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(ckpt, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


del checkpoint


def all_mean(values):
    """Mean of a list of floats over the micro-batches of every rank."""
    t = torch.tensor([sum(values), len(values)], dtype=torch.float64, device=device)
    if ddp:
        dist.all_reduce(t)
    return (t[0] / t[1]).item()


@torch.no_grad()
def estimate_loss():
    """Final-pass CE (no entropy term) on eval_iters fixed batches per split, shared out over ranks."""
    model.eval()
    out = {}
    for s, split in enumerate(("train", "val")):
        losses = []
        for k in range(rank, eval_iters, world_size):
            X, Y = get_batch(split, 1 + s, 0, k)  # the same batches at every eval, on any world size
            with ctx:
                logits, _ = raw_model(X)
            losses.append(raw_model.cross_entropy(logits, Y).item())
        out[split] = all_mean(losses)
    model.train()
    return out


# --- training loop -------------------------------------------------------------
if master:
    os.makedirs(out_dir, exist_ok=True)
log(f"{arch}: {raw_model.num_params():,} parameters | {tokens_per_iter:,} tokens/iter "
    f"({gradient_accumulation_steps} x {batch_size} x {block_size}, {world_size} rank(s)) | "
    f"{device} {dtype} | clip {clip:.4g}")
start_iter, t_start = iter_num, time.time()
t0, last_grad_norm, bad_in_row = time.time(), float("nan"), 0
while True:
    lr = get_lr(iter_num)
    for group in optimizer.param_groups:
        group["lr"] = lr

    # the iteration a resumed run starts at was evaluated and logged before the stop
    resumed_here = init_from == "resume" and iter_num == start_iter and not eval_only
    if (iter_num % eval_interval == 0 or iter_num == max_iters) and not resumed_here:
        t_eval = time.time()
        losses = estimate_loss()
        states = gather_rng_states()
        finite = math.isfinite(losses["train"]) and math.isfinite(losses["val"])
        if master:
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}", flush=True)
            with open(os.path.join(out_dir, "log.jsonl"), "a") as f:
                f.write(json.dumps({"iter": iter_num, "train_loss": losses["train"], "val_loss": losses["val"],
                                    "lr": lr, "grad_norm": last_grad_norm if math.isfinite(last_grad_norm) else None,
                                    "time_s": round(time.time() - t_start, 3), "tokens": iter_num * tokens_per_iter,
                                    "skipped": skipped_total}) + "\n")
            if finite and iter_num > 0:  # a non-finite model never reaches a checkpoint
                if losses["val"] < best_val_loss or always_save_checkpoint:
                    best_val_loss = min(best_val_loss, losses["val"])
                    save_checkpoint(ckpt_best, states)
                save_checkpoint(ckpt_last, states)
        t0 += time.time() - t_eval  # keep evaluation out of ms/iter
    if eval_only or iter_num >= max_iters:
        break

    # forward/backward over this rank's share of the global micro-batches
    micro_losses = []
    for m_i in range(micro_per_rank):
        j = rank + m_i * world_size  # rank r takes micro-batches r, r+W, r+2W, ...
        X, Y = get_batch("train", 0, iter_num, j)
        if ddp:
            model.require_backward_grad_sync = m_i == micro_per_rank - 1
        with ctx:
            _, loss = model(X, Y)
        micro_losses.append(loss.item())
        scaler.scale(loss / micro_per_rank).backward()  # DDP averages over ranks: the global mean
    train_loss = all_mean(micro_losses)
    scaler.unscale_(optimizer)
    total_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), clip if clip > 0 else float("inf"))
    grad_norm = total_norm.item()
    if math.isfinite(train_loss) and math.isfinite(grad_norm):
        scaler.step(optimizer)
        last_grad_norm, bad_in_row = grad_norm, 0
    else:  # never let a NaN/Inf reach the optimiser
        skipped_total += 1
        bad_in_row += 1
        log(f"iter {iter_num}: non-finite loss {train_loss} or grad norm {grad_norm}; step skipped "
            f"({bad_in_row} in a row, {skipped_total} in all)")
        if bad_in_row >= max_nonfinite:
            good = ckpt_last if os.path.exists(ckpt_last) else "none saved yet"
            log(f"stopping at iter {iter_num}: {bad_in_row} non-finite iterations in a row "
                f"(max_nonfinite={max_nonfinite}); last good checkpoint: {good}")
            if ddp:
                dist.destroy_process_group()
            sys.exit(3)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

    iter_num += 1
    if iter_num % log_interval == 0:
        dt = (time.time() - t0) / log_interval
        t0 = time.time()
        log(f"iter {iter_num}: loss {train_loss:.4f}, lr {lr:.3e}, grad norm {grad_norm:.3f}, "
            f"{dt * 1000:.1f} ms/iter, {tokens_per_iter / dt:,.0f} tok/s")

log(f"done: {iter_num} iterations, best val loss {best_val_loss:.4f}, {time.time() - t_start:.1f} s")
if ddp:
    dist.destroy_process_group()
