"""
Train HRM-LM, a Transformer or a UniTF. One process:

    python train.py config/shakespeare_hrm.py --max_iters=100

DDP on one node with 6 GPUs (NCCL on CUDA, gloo on CPU):

    torchrun --standalone --nproc_per_node=6 train.py config/equalparam_nt8.py

FSDP2 (--fsdp=True) instead of DDP shards the weights, gradients and AdamW state over the ranks, for the
configs whose state one GPU cannot hold (python plan.py config/X.py says which, and the micro-batch).

gradient_accumulation_steps is the *global* number of micro-batches per iteration, as in
nanoGPT: each of W ranks runs 1/W of them. Micro-batch j of iteration i is drawn from its
own seeded generator, so a run gives the same numbers with 1 or W processes, and after a
resume (the sampler's whole state is the iteration number).
"""

import fcntl
import json
import math
import os
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from configurator import DTYPES, auto_device, auto_dtype, configure, precision_context
from model import MODEL_FIELDS, ModelConfig, build_model, load_checkpoint, shard_units
from prepare import check_dataset

# -----------------------------------------------------------------------------
# Defaults: the paper's OpenWebText setup (section "Setup"; Table "Ablation" base: HRM d=4096,
# N=4, T=3, K=2, S=1, lr 1.5e-4, warmup 1000, 10k iterations; 12 x 1024 tokens per GPU on 6 GPUs, bf16),
# as nanoGPT's defaults are its GPT-2 run: each config/ file sets only what its experiment changes.
# I/O
out_dir = "out"              # checkpoints and log.jsonl go here
eval_interval = 500          # evaluate (and checkpoint) every this many iterations
log_interval = 10            # print a progress line every this many iterations
eval_iters = 200             # batches per split in an evaluation
eval_only = False            # evaluate once and exit
always_save_checkpoint = False  # save ckpt.pt at every eval, not only when val improves
init_from = "scratch"        # "scratch" or "resume" (from out_dir/ckpt_last.pt)
overwrite = False            # a new run in an out_dir that holds one replaces its log and checkpoints
max_nonfinite = 10           # stop after this many non-finite iterations in a row
# data
dataset = "openwebtext"      # data/<dataset>/{train,val}.bin from prepare.py (the paper's corpus)
data_dir = "data"            # where prepare.py wrote the datasets
gradient_accumulation_steps = 6  # global micro-batches per iteration (divisible by the world size): the paper's 6 GPUs x 1
batch_size = 12              # sequences per micro-batch (the paper: 12 per GPU)
block_size = 1024            # tokens per sequence (the paper's 1,024)
# model (ModelConfig fields; see model.py)
arch = "hrm"                 # "hrm" | "transformer" | "unitf"
vocab_size = 0               # 0 = from data/<dataset>/meta.json (50257, GPT-2 BPE, where there is none)
n_embd = 4096                # d
n_head = 16                  # attention heads
n_layer = 4                  # transformer: independent blocks L
N = 4                        # hrm: Slow-module firings per pass
T = 3                        # hrm: Fast steps per Slow firing
M = None                     # unitf: steps (None = 12); hrm: leave None, M = N*T
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
learning_rate = 1.5e-4       # peak learning rate (the paper's Ablation base)
min_lr = 1.5e-5              # cosine floor (learning_rate / 10; a config that changes learning_rate sets it too)
max_iters = 10000            # total iterations (the paper's 10k)
weight_decay = 0.1           # on 2-D parameters
beta1 = 0.9                  # AdamW first-moment decay
beta2 = 0.95                 # AdamW second-moment decay
grad_clip = 1.0              # clip norm; HRM/UniTF use grad_clip * K / M (0 = off)
decay_lr = True              # linear warmup then cosine; False = constant
warmup_iters = 1000          # linear warmup (HRM: max(1000, N*T*100), SPEC section 6)
lr_decay_iters = 0           # cosine reaches min_lr here (0 = max_iters)
# system
device = "auto"              # "auto" (cuda if present, else cpu), "cpu", "cuda", "cuda:1", ...
dtype = "auto"               # "auto" (bfloat16 on CUDA, float32 on CPU), "float32", "bfloat16", "float16"
compile = False              # torch.compile the model (the uncompiled weights are what is saved)
fsdp = False                 # with torchrun: FSDP2 instead of DDP (shards weights, grads, AdamW state; see plan.py)
seed = 1337                  # everything random derives from this
# -----------------------------------------------------------------------------
config = configure(globals(), prog="train.py")

# --- process group -----------------------------------------------------------
ddp = int(os.environ.get("RANK", -1)) != -1
rank, local_rank, world_size = 0, 0, 1
device = auto_device(device)
try:
    torch.device(device)
except (RuntimeError, TypeError):
    print(f"train.py: error: device={device!r} is not a device; use auto, cpu, cuda or cuda:<index>", file=sys.stderr)
    sys.exit(2)
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
if fsdp and not ddp:
    fail("fsdp=True shards the model over torchrun's processes: run it with torchrun --nproc_per_node=<GPUs> "
         "(one process holds the whole model anyway)")
if fsdp and dtype == "float16":
    fail("fsdp=True trains in bfloat16 or float32 (float16 needs a sharded loss scaler); use --dtype=bfloat16")
if gradient_accumulation_steps >= 1 and gradient_accumulation_steps % world_size:
    # a config written for fewer ranks (the Shakespeare ones: 1 micro-batch of 8): split each micro-batch so
    # every rank gets whole ones and the global batch stays gradient_accumulation_steps * batch_size sequences
    f = world_size // math.gcd(gradient_accumulation_steps, world_size)
    if batch_size % f == 0:
        log(f"note: {world_size} ranks: gradient_accumulation_steps {gradient_accumulation_steps} -> "
            f"{gradient_accumulation_steps * f}, batch_size {batch_size} -> {batch_size // f} (the same global batch)")
        gradient_accumulation_steps, batch_size = gradient_accumulation_steps * f, batch_size // f
        config.update(gradient_accumulation_steps=gradient_accumulation_steps, batch_size=batch_size)
if gradient_accumulation_steps < 1 or gradient_accumulation_steps % world_size:
    fail(f"gradient_accumulation_steps={gradient_accumulation_steps} must be a positive multiple of "
         f"the world size {world_size} (it counts global micro-batches)")
for key in ("batch_size", "max_iters", "eval_iters", "eval_interval", "log_interval", "max_nonfinite"):
    least = 0 if key == "max_iters" else 1
    if config[key] < least:
        fail(f"{key} must be >= {least}, got {config[key]}")
for key in ("min_lr", "weight_decay", "grad_clip", "warmup_iters", "lr_decay_iters", "seed", "vocab_size"):
    if config[key] < 0:
        fail(f"{key} must be >= 0, got {config[key]}")
if not learning_rate > 0:
    fail(f"learning_rate must be > 0, got {learning_rate}")
for key in ("beta1", "beta2"):
    if not 0 <= config[key] < 1:
        fail(f"{key} must be in [0, 1), got {config[key]}")
data, meta = {}, None
try:
    meta = check_dataset(data_dir, dataset)   # files present, whole uint16 tokens, sizes and ids as meta.json says
except ValueError as e:
    fail(str(e))
else:
    for split in ("train", "val"):
        path = os.path.join(data_dir, dataset, f"{split}.bin")
        data[split] = np.memmap(path, dtype=np.uint16, mode="r")
        if len(data[split]) <= block_size + 1:
            fail(f"block_size={block_size} needs more than {block_size + 1} tokens, but {path} holds {len(data[split])}")
# the vocabulary is the dataset's: a config may leave vocab_size at 0 or repeat it, never contradict it
data_vocab = meta["vocab_size"] if meta else 50257
if vocab_size and vocab_size != data_vocab:
    fail(f"vocab_size={vocab_size}, but {os.path.join(data_dir, dataset, 'meta.json')} says the dataset has "
         f"{data_vocab} ({meta['tokenizer'] if meta else 'gpt2'}); leave vocab_size at 0 to take it from the data")
vocab_size = config["vocab_size"] = data_vocab
model_args = {k: config[k] for k in MODEL_FIELDS}
model_args["M"] = M if arch == "unitf" else None
try:
    model_config = ModelConfig(**model_args)
except ValueError as e:
    fail(str(e))
ckpt_last, ckpt_best = os.path.join(out_dir, "ckpt_last.pt"), os.path.join(out_dir, "ckpt.pt")
log_path = os.path.join(out_dir, "log.jsonl")
lock_file = None  # held (flock) for the whole run: one run per out_dir; the OS drops it when we die


def take_out_dir():
    """Create out_dir, lock it, and refuse to mix two runs in it. Master only; returns an error or None."""
    global lock_file
    if not out_dir:
        return "out_dir is empty; give a folder, e.g. --out_dir=out"
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        return f"out_dir {out_dir!r} is a file, not a folder"
    try:
        os.makedirs(out_dir, exist_ok=True)
        lock_file = open(os.path.join(out_dir, ".lock"), "a+")
        probe = os.path.join(out_dir, f".write_test.{os.getpid()}")
        open(probe, "w").close()
        os.remove(probe)
    except OSError as e:
        return f"cannot use out_dir {out_dir!r}: {e.strerror or e} (a file in its path, or not writable)"
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock_file.seek(0)
        holder = lock_file.read().strip() or "another process"
        return f"out_dir {out_dir!r} is in use by another train.py run ({holder}); wait for it or use another out_dir"
    lock_file.seek(0)
    lock_file.truncate()
    lock_file.write(f"pid {os.getpid()} on {os.uname().nodename}, since {time.strftime('%Y-%m-%d %H:%M:%S')}")
    lock_file.flush()
    for name in os.listdir(out_dir):  # temporaries of a save that crashed or was killed: we hold the lock
        if name.startswith(("ckpt.pt.tmp.", "ckpt_last.pt.tmp.", "log.jsonl.tmp.")):
            os.remove(os.path.join(out_dir, name))
    held = [n for n in ("log.jsonl", "ckpt.pt", "ckpt_last.pt") if os.path.exists(os.path.join(out_dir, n))]
    if init_from == "scratch" and held and not eval_only:
        if not overwrite:
            return (f"out_dir {out_dir!r} already holds a run ({', '.join(held)}); resume it with "
                    f"--init_from=resume, replace it with --overwrite=True, or choose another --out_dir")
        for n in held:
            os.remove(os.path.join(out_dir, n))
    if init_from == "resume" and not os.path.exists(ckpt_last):
        return f"init_from='resume' but {ckpt_last} does not exist"
    return None


if master and not errors:
    problem = take_out_dir()
    if problem:
        fail(problem)
stop_on_errors()

# --- seeding and data ----------------------------------------------------------
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
# best_val_loss starts at the step-0 evaluation: a model is "good" (ckpt.pt, the stop message) only if it
# beats the initial one, so a diverged model with finite but huge weights never becomes the best
iter_num, best_val_loss, best_iter, skipped_total = 0, float("inf"), None, 0
checkpoint = None
# Settings a resume must keep: they decide which tokens each iteration sees and how val is measured, so
# changing them breaks exact resume. The others (max_iters, the learning-rate schedule, ...) may change.
DATA_KEYS = ("dataset", "batch_size", "block_size", "seed", "gradient_accumulation_steps", "eval_iters")
SILENT_KEYS = ("init_from", "out_dir", "data_dir", "overwrite", "device", "compile", "log_interval", "fsdp")
if init_from == "resume":
    try:
        checkpoint = load_checkpoint(ckpt_last)
    except ValueError as e:
        fail(str(e))
    else:
        saved = checkpoint.get("model_args", {})
        diff = {k: (saved.get(k, getattr(ModelConfig, k)), model_args[k]) for k in model_args
                if saved.get(k, getattr(ModelConfig, k)) != model_args[k]}  # a key older than the file: its default
        if diff:
            fail(f"{ckpt_last} holds a different model: " +
                 ", ".join(f"{k}={a!r} in the checkpoint vs {b!r} now" for k, (a, b) in diff.items()))
        old = checkpoint.get("config", {})
        changed = {k: (old[k], config[k]) for k in config if k in old and old[k] != config[k] and k not in MODEL_FIELDS}
        data_diff = [f"{k}={a!r} in the checkpoint vs {b!r} now" for k, (a, b) in changed.items() if k in DATA_KEYS]
        if (checkpoint.get("meta") or {}).get("tokens") and meta and meta.get("tokens") != checkpoint["meta"]["tokens"]:
            data_diff.append(f"the dataset's token counts {checkpoint['meta']['tokens']} in the checkpoint vs "
                             f"{meta.get('tokens')} now (prepared again?)")
        if data_diff:
            fail(f"cannot resume {ckpt_last} exactly: " + ", ".join(data_diff) +
                 "; use the checkpoint's settings, or start a new run in another out_dir")
        if "optimizer" not in checkpoint:
            fail(f"{ckpt_last} holds no optimizer state, so training cannot resume from it exactly "
                 f"(ckpt.pt is the weights-only copy for sampling; resume from ckpt_last.pt)")
        bad = [k for k, v in checkpoint["model"].items() if v.is_floating_point() and not torch.isfinite(v).all()]
        if bad:
            fail(f"{ckpt_last} has non-finite weights ({', '.join(bad[:3])}); it cannot train; use an earlier "
                 f"checkpoint or start again")
        notes = [f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items() if k not in DATA_KEYS + SILENT_KEYS]
        if notes and not errors:
            log("note: resuming with changed settings (the schedule, not the data): " + ", ".join(notes))
stop_on_errors()
model = build_model(model_config)
if checkpoint is not None:
    model.load_state_dict(checkpoint["model"])
model.to(device)
if fsdp:
    # FSDP2: each block (with its projections) is a unit gathered when it runs, the rest is the root. HRM's
    # and UniTF's shared blocks run M times a pass, so they stay gathered through the forward (one all-gather,
    # not M); a Transformer's blocks run once and are freed after their forward. The weights are gathered in
    # float32 and autocast (ctx below) casts them, as under DDP: the same numbers as DDP, not bf16 states.
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict, set_optimizer_state_dict)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp = MixedPrecisionPolicy(reduce_dtype=torch.float32)
    # fully_shard takes no 0-d parameter: alpha and tau become 1-element vectors for this run (they only
    # broadcast, so every number is the same); checkpoints keep them 0-d, in the one format for all runs
    scalars = [n for n, p in model.named_parameters() if p.dim() == 0]
    for name in scalars:
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, torch.nn.Parameter(model.get_parameter(name).detach().reshape(1)))
    for unit in shard_units(model):
        fully_shard(unit, mp_policy=mp, reshard_after_forward=arch == "transformer")
    fully_shard(model, mp_policy=mp)
    FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)   # checkpoints: one file, as without FSDP

decay = [p for p in model.parameters() if p.dim() >= 2]      # matrices and the embedding
no_decay = [p for p in model.parameters() if p.dim() < 2]    # norms, alpha, tau
# the checkpoint's optimizer state is keyed by position in this order (torch's own format), under FSDP too
param_order = [n for n, p in model.named_parameters() if p.dim() >= 2] + \
              [n for n, p in model.named_parameters() if p.dim() < 2]


def rekey(osd, key, scalar_shape):
    """An optimizer state dict with each parameter key p replaced by key(p) (positions <-> FSDP's names), the
    AdamW moments of the 0-d parameters reshaped to scalar_shape ((1,) in an FSDP run, () in checkpoints)."""
    def moments(name, v):
        return {k: t.reshape(scalar_shape) if name in scalars and k != "step" else t for k, t in v.items()}
    return {"state": {key(p): moments(p if isinstance(p, str) else key(p), v) for p, v in osd["state"].items()},
            "param_groups": [dict(g, params=[key(p) for p in g["params"]]) for g in osd["param_groups"]]}


optimizer = torch.optim.AdamW(
    [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
    lr=learning_rate, betas=(beta1, beta2), fused=device_type == "cuda")
if checkpoint is not None:
    if fsdp:   # positions -> parameter names, which set_optimizer_state_dict shards to each rank
        set_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True),
                                 optim_state_dict=rekey(checkpoint["optimizer"], param_order.__getitem__, (1,)))
    else:
        optimizer.load_state_dict(checkpoint["optimizer"])
    iter_num, best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
    best_iter, skipped_total = checkpoint.get("best_iter"), checkpoint.get("skipped_total", 0)
scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
ctx = precision_context(device_type, dtype)

raw_model = model
if compile:
    model = torch.compile(model)
if ddp and not fsdp:   # gradients as views of DDP's buckets: one copy of them, not two
    model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None, gradient_as_bucket_view=True)

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


# No RNG state is saved: after the initialisation nothing draws from a global generator (no dropout; each
# batch comes from its own generator seeded with (seed, stream, i, j)), so a resume is exact without it.


def full_state(with_optimizer):
    """The model's (and optimizer's) whole state, as one process holds it. Under FSDP every rank must call
    this (it gathers the shards); the optimizer state goes back to torch's positional keys."""
    if not fsdp:
        return raw_model.state_dict(), optimizer.state_dict() if with_optimizer else None
    model_sd = get_model_state_dict(raw_model, options=FULL)   # full on rank 0, empty on the others
    osd = get_optimizer_state_dict(raw_model, optimizer, options=FULL) if with_optimizer else None
    if not master:
        return None, None
    model_sd.update({n: model_sd[n].reshape(()) for n in scalars if n in model_sd})   # 0-d again
    if not with_optimizer:
        return model_sd, None
    return model_sd, rekey(osd, param_order.index, ())


def save_checkpoint(path):
    """Atomic: write a temporary file beside the target, fsync, then os.replace. A failed save (disk full)
    removes its temporary and stops the run with one line naming the checkpoints still intact.
    ckpt.pt (the best model, for sampling) holds the weights only; ckpt_last.pt (for resume) everything.
    Every rank calls it (FSDP gathers the shards); the master writes."""
    if not master and not fsdp:
        return
    model_sd, optim_sd = full_state(path == ckpt_last)
    if not master:
        return
    ckpt = {"model": model_sd, "model_args": model_args, "config": config, "iter_num": iter_num,
            "best_val_loss": best_val_loss, "best_iter": best_iter, "meta": meta}
    if path == ckpt_last:
        ckpt.update(optimizer=optim_sd, skipped_total=skipped_total)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            torch.save(ckpt, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        intact = [p for p in (ckpt_best, ckpt_last) if os.path.exists(p)]
        sys.stderr.write(f"train.py: error: cannot save {path} at iter {iter_num}: {e.strerror or e}; "
                         f"intact: {', '.join(intact) or 'no checkpoint'}\n")
        os._exit(1)  # no cleanup that could block on a collective: the other ranks die with us under torchrun


def trim_log(upto):
    """On resume, drop log lines after the checkpoint's iteration (written before a kill that came ahead of
    the checkpoint, so the resumed run logs them again) and any half-written line: one line per iteration."""
    if not os.path.exists(log_path):
        return
    keep = []
    with open(log_path) as f:
        for line in f:
            try:
                if json.loads(line)["iter"] <= upto:
                    keep.append(line if line.endswith("\n") else line + "\n")
            except (ValueError, KeyError, TypeError):
                pass
    tmp = f"{log_path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.writelines(keep)
    os.replace(tmp, log_path)


if master and init_from == "resume":
    trim_log(iter_num)


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
    rounds = -(-eval_iters // world_size)  # FSDP: every rank runs as many forwards (each one gathers)
    for s, split in enumerate(("train", "val")):
        losses = []
        for k in range(rank, rounds * world_size if fsdp else eval_iters, world_size):
            X, Y = get_batch(split, 1 + s, 0, k % eval_iters)  # the same batches at every eval, on any world size
            with ctx:
                logits, _ = raw_model(X)
            if k < eval_iters:
                losses.append(raw_model.cross_entropy(logits, Y).item())
        out[split] = all_mean(losses)
    model.train()
    return out


# --- signals: Ctrl-C (SIGINT) and SIGTERM save ckpt_last.pt at the current iteration, then exit ----------
stop_signal = []


def on_signal(signum, frame):
    if stop_signal:  # a second one: quit now, without saving
        sys.stderr.write(f"train.py: {signal.Signals(signum).name} again: quitting without saving\n")
        os._exit(128 + signum)
    stop_signal.append(signum)
    if master:
        sys.stderr.write(f"train.py: {signal.Signals(signum).name}: saving at the end of this iteration "
                         f"(send it again to quit without saving)\n")


signal.signal(signal.SIGINT, on_signal)
signal.signal(signal.SIGTERM, on_signal)


def should_stop():
    """Whether any rank got a signal (every rank must stop at the same iteration to save together)."""
    if not ddp:
        return bool(stop_signal)
    flag = torch.tensor([len(stop_signal)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() > 0


# MFU: the FLOPs of one iteration counted once by torch's FLOP counter on the meta device (bench.py), against
# the device's peak (a GPU's datasheet bf16 figure, else a matmul peak measured now), over all ranks
from bench import counted_train_flops, device_peak_tflops  # noqa: E402
flops_per_iter = counted_train_flops(model_config, batch_size, block_size) * gradient_accumulation_steps
peak_flops = device_peak_tflops(device, DTYPES[dtype]) * 1e12 * world_size


def fmt_time(sec):
    return f"{sec:.0f} s" if sec < 90 else f"{sec / 60:.1f} min" if sec < 5400 else f"{sec / 3600:.1f} h"


# --- training loop -------------------------------------------------------------
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
        finite = math.isfinite(losses["train"]) and math.isfinite(losses["val"])
        if master:
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f} "
                  f"({time.time() - t_eval:.1f} s)", flush=True)
        if master and not eval_only:
            # the log line goes first; a kill before the checkpoints is undone by trim_log() on resume
            with open(log_path, "a") as f:
                f.write(json.dumps({"iter": iter_num, "train_loss": losses["train"], "val_loss": losses["val"],
                                    "lr": lr, "grad_norm": last_grad_norm if math.isfinite(last_grad_norm) else None,
                                    "time_s": round(time.time() - t_start, 3), "tokens": iter_num * tokens_per_iter,
                                    "skipped": skipped_total}) + "\n")
        # every rank keeps the same best (the losses are global means) and takes part in the saves
        if not eval_only and finite and iter_num == 0 and best_iter is None:
            best_val_loss = losses["val"]  # the bar every "good" checkpoint must clear
        elif not eval_only and finite:  # a non-finite model never reaches a checkpoint
            if losses["val"] < best_val_loss or always_save_checkpoint:
                if losses["val"] < best_val_loss:
                    best_val_loss, best_iter = losses["val"], iter_num
                save_checkpoint(ckpt_best)
            save_checkpoint(ckpt_last)
        t0 += time.time() - t_eval  # keep evaluation out of ms/iter
    if eval_only or iter_num >= max_iters:
        break
    if should_stop():  # after the due evaluation, so a resume from here skips nothing
        save_checkpoint(ckpt_last)
        if master:
            sys.stderr.write(f"train.py: stopped by {signal.Signals(stop_signal[0]).name if stop_signal else 'a signal'} "
                             f"at iter {iter_num}; saved {ckpt_last}; continue with --init_from=resume\n")
        if ddp:
            dist.destroy_process_group()
        sys.exit(128 + (stop_signal[0] if stop_signal else signal.SIGTERM))

    # forward/backward over this rank's share of the global micro-batches
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for m_i in range(micro_per_rank):
        j = rank + m_i * world_size  # rank r takes micro-batches r, r+W, r+2W, ...
        X, Y = get_batch("train", 0, iter_num, j)
        if fsdp:   # reduce the gradients once, after the last micro-batch
            model.set_requires_gradient_sync(m_i == micro_per_rank - 1)
        elif ddp:
            model.require_backward_grad_sync = m_i == micro_per_rank - 1
        with ctx:
            _, loss = model(X, Y)
        loss_sum += loss.detach().double()
        scaler.scale(loss / micro_per_rank).backward()  # DDP averages over ranks: the global mean
    if ddp:
        dist.all_reduce(loss_sum)
    scaler.unscale_(optimizer)
    total_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), clip if clip > 0 else float("inf"))
    if fsdp:
        total_norm = total_norm.full_tensor()   # a DTensor: the norm over every rank's shards
    # the iteration's one host sync: the mean loss over every rank's micro-batches, and the grad norm
    train_loss, grad_norm = torch.stack([loss_sum / gradient_accumulation_steps, total_norm.double()]).tolist()
    if math.isfinite(train_loss) and math.isfinite(grad_norm):
        scaler.step(optimizer)
        last_grad_norm, bad_in_row = grad_norm, 0
    else:  # never let a NaN/Inf reach the optimiser
        skipped_total += 1
        bad_in_row += 1
        log(f"iter {iter_num}: non-finite loss {train_loss} or grad norm {grad_norm}; step skipped "
            f"({bad_in_row} in a row, {skipped_total} in all)")
        if bad_in_row >= max_nonfinite:
            good = (f"{ckpt_best} (iter {best_iter}, val loss {best_val_loss:.4f})" if best_iter is not None
                    and os.path.exists(ckpt_best) else "none (no evaluation beat the initial model)")
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
        elapsed = time.time() - t_start  # evaluations included, so the time left includes them too
        left = elapsed / (iter_num - start_iter) * (max_iters - iter_num)
        log(f"iter {iter_num}/{max_iters} ({100 * iter_num / max(1, max_iters):.1f}%): loss {train_loss:.4f}, "
            f"lr {lr:.3e}, grad norm {grad_norm:.3f}, {dt * 1000:.1f} ms/iter, {tokens_per_iter / dt:,.0f} tok/s, "
            f"MFU {flops_per_iter / dt / peak_flops:.1%} | "
            f"{fmt_time(elapsed)} elapsed, {fmt_time(left)} left")

log(f"done: {iter_num} iterations, best val loss {best_val_loss:.4f}, {time.time() - t_start:.1f} s")
if ddp:
    dist.destroy_process_group()
