"""
Train HRM-LM, a Transformer or a UniTF. One process:

    python train.py config/shakespeare_hrm.py --max_iters=100

DDP on one node with 6 GPUs (NCCL on CUDA, gloo on CPU):

    torchrun --standalone --nproc_per_node=6 train.py config/equalparam_nt8.py

FSDP2 (--fsdp=True) shards weights, gradients and AdamW state over the ranks (plan.py says which configs need it).

gradient_accumulation_steps is the *global* number of micro-batches per iteration, as in
nanoGPT: each of W ranks runs 1/W of them. Micro-batch j of iteration i is drawn from its
own seeded generator, so a run gives the same numbers with 1 or W processes, and after a
resume (the sampler's whole state is the iteration number).
"""

import math
import os
import random
import sys
import time

import torch

import parallel
from checkpoint import (CKPT_BEST, CKPT_LAST, CKPT_LAST_DCP, append_log, check_resume, find_checkpoint, finished_run,
                        load_checkpoint, one_line, resume_path, save_checkpoint, save_sharded, take_out_dir, trim_log)
from common import DTYPES, auto_device, auto_dtype, check_device, fail, fmt_time, precision_context
from configurator import check_train_settings, configure
from flops import counted_train_flops, device_peak_tflops
from model import MODEL_FIELDS, ModelConfig, build_model
import prepare

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
init_from = "scratch"        # "scratch", "resume" (out_dir/ckpt_last.pt), or a checkpoint or out_dir to start from
overwrite = False            # a new run in an out_dir that holds one replaces its log and checkpoints
max_nonfinite = 10           # stop after this many non-finite iterations in a row
wandb_log = False            # also log each evaluation to Weights & Biases (pip install wandb; WANDB_MODE=offline works)
wandb_project = "hrm-lm"     # its project
wandb_run_name = ""          # its run name ("" = the out_dir's name)
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
# optimiser: AdamW, betas (0.9, 0.95), weight decay on matrices only (docs/MODEL.md section 6)
learning_rate = 1.5e-4       # peak learning rate (the paper's Ablation base)
min_lr = 1.5e-5              # cosine floor (learning_rate / 10; a config that changes learning_rate sets it too)
max_iters = 10000            # total iterations (the paper's 10k)
weight_decay = 0.1           # on 2-D parameters
beta1 = 0.9                  # AdamW first-moment decay
beta2 = 0.95                 # AdamW second-moment decay
grad_clip = 1.0              # clip norm; HRM/UniTF use grad_clip * K / M (0 = off)
decay_lr = True              # linear warmup then cosine; False = constant
random_depth = False         # hrm/unitf: train each iteration at N' (M') uniform on 1..2D-1, D the config's N (M)
warmup_iters = 1000          # linear warmup (HRM: max(1000, N*T*100), docs/MODEL.md section 6)
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
try:
    device = check_device(auto_device(device))
except ValueError as e:
    fail(str(e))
ranks = parallel.init_process_group(device)   # one process, or one rank of torchrun's (DDP/FSDP)
device, master, world_size = ranks.device, ranks.master, ranks.world_size
device_type = "cuda" if device.startswith("cuda") else "cpu"
dtype = auto_dtype(dtype, device_type)


def log(msg):
    if master:
        print(msg, flush=True)


# --- everything checkable before work: each problem is one line, and every rank stops on it --------
errors = check_train_settings(dict(config, dtype=dtype), ranks.ddp)   # ranges, choices, combinations
notes = []   # printed once every check has passed


def set_micro_batches(saved=None):
    """gradient_accumulation_steps and batch_size for this world size (parallel.micro_batches): a new run on
    more ranks than its config was written for splits its micro-batches; a resumed run keeps its checkpoint's."""
    try:
        accum, batch, note = parallel.micro_batches(config["gradient_accumulation_steps"], config["batch_size"],
                                                    world_size, saved)
    except ValueError as e:
        return errors.append(str(e))
    config.update(gradient_accumulation_steps=accum, batch_size=batch)
    notes.extend([note] if note else [])


if init_from != "resume":   # a resumed run decides once its checkpoint is loaded (below)
    set_micro_batches()
data, meta = {}, None
try:   # the files checked against meta.json, and each split long enough for block_size
    data, meta = prepare.open_dataset(data_dir, dataset, block_size, vocab_size)
except ValueError as e:
    errors.append(str(e))
vocab_size = config["vocab_size"] = meta["vocab_size"] if meta else vocab_size or 50257   # the dataset's
model_args = {k: config[k] for k in MODEL_FIELDS}   # the settings of the model, as checkpoints keep them
try:
    model_config = ModelConfig.from_settings(config)
except ValueError as e:
    errors.append(str(e))
if wandb_log and master:
    try:
        import wandb
    except ImportError:
        errors.append("wandb_log=True needs the wandb package: pip install wandb (or leave wandb_log off)")
ckpt_last, ckpt_best = os.path.join(out_dir, CKPT_LAST), os.path.join(out_dir, CKPT_BEST)
resume = init_from == "resume"
finished = not resume and not overwrite and not eval_only and not errors and finished_run(out_dir, config)
if finished:   # the same command again: say so, touch nothing
    log(f"{out_dir} holds this run, finished ({finished}): nothing to do; sample it with "
        f"python sample.py --out_dir={out_dir}, or train it again with --overwrite=True")
    sys.exit(parallel.end_process_group(ranks))
lock = None   # held (flock) for the whole run: one run per out_dir; the OS drops it when we die
if master and not errors:
    lock, problem = take_out_dir(out_dir, "resume" if resume else "scratch", overwrite, eval_only)
    if problem:
        errors.append(problem)
parallel.stop_on_errors(errors, ranks)
checkpoint = None
if init_from != "scratch":   # every rank loads it: ckpt_last.pt to resume, or the weights a new run starts from
    try:
        source = resume_path(out_dir) if resume else find_checkpoint(init_from)   # where these weights come from
        checkpoint = load_checkpoint(source)
    except ValueError as e:
        errors.append(str(e))
if resume and checkpoint is not None:
    saved = tuple(checkpoint.get("config", {}).get(k, config[k]) for k in ("gradient_accumulation_steps", "batch_size"))
    set_micro_batches(saved)
    problems, changed = check_resume(checkpoint, source, model_args, config, meta)
    errors += problems
    if changed:
        notes.append("note: resuming with changed settings (the schedule, not the data): " + ", ".join(changed))
parallel.stop_on_errors(errors, ranks)

# --- data: micro-batch j of iteration i is a pure function of (seed, stream, i, j) ----------------------
gradient_accumulation_steps, batch_size = config["gradient_accumulation_steps"], config["batch_size"]
torch.manual_seed(seed)  # the model's init: identical on every rank
tokens_per_iter = gradient_accumulation_steps * batch_size * block_size
micro_per_rank = gradient_accumulation_steps // world_size


def get_batch(split, stream, i, j):   # micro-batch j of iteration i of a stream (0: training, 1-2: evaluation)
    return prepare.get_batch(data, split, seed, stream, i, j, batch_size, block_size, device)


# --- model and optimiser ------------------------------------------------------------------------
# best_val_loss starts at the step-0 evaluation: a model is "good" (ckpt.pt, the stop message) only if it
# beats the initial one, so a diverged model with finite but huge weights never becomes the best
iter_num, best_val_loss, best_iter, skipped_total, eval_pending, losses = 0, float("inf"), None, 0, False, {}
model = build_model(model_config)
if checkpoint is not None and "model" in checkpoint:   # a single file: loaded whole, then dropped (its memory too)
    try:
        model.load_state_dict(checkpoint.pop("model"))
    except RuntimeError as e:   # a missing key, a tensor of another shape: named in the one line
        errors.append(f"{source} does not fit this model: {one_line(e)}")
model.to(device)
params = parallel.fully_shard_model(model) if fsdp else list(model.parameters())   # FSDP2: all state sharded
decay = [p for p in params if p.dim() >= 2]      # matrices and the embedding
no_decay = [p for p in params if p.dim() < 2]    # norms, alpha, tau
optimizer = torch.optim.AdamW(
    [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
    lr=learning_rate, betas=(beta1, beta2), fused=device_type == "cuda")
if checkpoint is not None and not errors:
    try:   # the rest of the checkpoint (AdamW's state; a sharded one's weights); drop what a killed run logged after it
        parallel.restore(model, optimizer, checkpoint, source, resume, fsdp)
        if resume and master:
            trim_log(out_dir, checkpoint["iter_num"])
    except ValueError as e:
        errors.append(str(e))
try:
    run = wandb.init(project=wandb_project, name=wandb_run_name or os.path.basename(os.path.abspath(out_dir)),
                     config=config, dir=out_dir) if wandb_log and master and not errors else None   # out_dir/wandb
except Exception as e:   # e.g. not logged in: one line (WANDB_MODE=offline needs no account)
    errors.append(f"wandb_log=True but wandb.init failed: {one_line(e)}")
parallel.stop_on_errors(errors, ranks)
for note in notes:
    log(note)
if checkpoint is not None and not resume:   # a new run from these weights: a fresh optimizer and schedule
    log(f"starting from the weights of {source} (iter {checkpoint['iter_num']})")
elif checkpoint is not None:   # where the run stopped
    iter_num, best_val_loss, best_iter, skipped_total, eval_pending = (checkpoint.get(k, d) for k, d in (
        ("iter_num", 0), ("best_val_loss", float("inf")), ("best_iter", None), ("skipped_total", 0), ("eval_pending", False)))
del checkpoint
# No RNG state is saved: after the initialisation nothing draws from a global generator (no dropout; each
# batch comes from its own generator), so a resume is exact without it.
scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
ctx = precision_context(device_type, dtype, weight_cache=not fsdp)   # why not under FSDP: parallel.fully_shard_model
raw_model = model   # what is saved: uncompiled, unwrapped
loop_depth = model_config.N if arch == "hrm" else model_config.M   # D: random_depth draws 1..2D-1 (train_depth)
if compile:
    model = parallel.compile_model(model, 2 * loop_depth - 1 if random_depth else 1)   # a graph per depth
model = parallel.wrap(model, ranks, fsdp)   # DDP under torchrun (FSDP is already in place)
steps = model_config.M
clip = grad_clip * min(K, steps) / steps if arch in ("hrm", "unitf") else grad_clip  # K/M-proportional
decay_iters = lr_decay_iters or max_iters
# MFU: the FLOPs of one iteration, counted once on the meta device, against the device's peak over all ranks
flops_per_iter = counted_train_flops(model_config, batch_size, block_size) * gradient_accumulation_steps
peak_flops = device_peak_tflops(device, DTYPES[dtype]) * 1e12 * world_size


def train_depth(it):
    """random_depth (Huginn's recipe for depth at inference; docs/MODEL.md section 8): iteration it's depth,
    uniform on 1..2D-1, from (seed, it) alone, so every rank draws the same and a resume continues exactly."""
    return random.Random(seed * 1_000_003 + it).randint(1, 2 * loop_depth - 1)


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


@torch.no_grad()
def estimate_loss():
    """Final-pass CE (no entropy term) on eval_iters fixed batches per split, shared out over ranks. A signal
    stops it between batches (returns None), so a long evaluation never delays the save a signal asks for."""
    model.eval()
    out = {}
    for s, split in enumerate(("train", "val")):
        losses = []
        for r in range(-(-eval_iters // world_size)):   # as many rounds on every rank (FSDP gathers in each)
            if signals.requested():
                model.train()
                return None
            k = r * world_size + ranks.rank                # the same batches at every eval, on any world size
            if k < eval_iters or fsdp:
                X, Y = get_batch(split, 1 + s, 0, k % eval_iters)
                with ctx:
                    logits, _ = raw_model(X)
                if k < eval_iters:
                    losses.append(raw_model.cross_entropy(logits, Y).item())
        out[split] = parallel.all_mean(losses, ranks)
    model.train()
    return out


def save(path):
    """ckpt.pt (the best model, for sampling) holds the weights and settings; ckpt_last.pt (for resume) also
    the AdamW state: one file the master writes atomically, or under FSDP ckpt_last.dcp, the shards every rank
    writes at once. Every rank calls it (FSDP gathers ckpt.pt's weights to the master)."""
    info = {"model_args": model_args, "config": config, "iter_num": iter_num, "best_val_loss": best_val_loss,
            "best_iter": best_iter, "meta": meta}
    if path == ckpt_last:   # eval_pending: a signal stopped the evaluation of iter_num; the resume does it
        info.update(skipped_total=skipped_total, eval_pending=losses is None)
        if fsdp:
            return save_sharded(os.path.join(out_dir, CKPT_LAST_DCP), raw_model, optimizer, info, master)
    model_sd = parallel.full_weights(raw_model, ranks, fsdp) if master or fsdp else None   # FSDP: a collective
    if master:
        save_checkpoint(path, dict(info, model=model_sd, **({"optimizer": optimizer.state_dict()}
                                                             if path == ckpt_last else {})))


# --- training loop: Algorithm 1 (the model's forward is Algorithms 2-3, with the last-K window) ---------
signals = parallel.StopSignals(ranks)   # Ctrl-C / SIGTERM: save ckpt_last.pt at the end of the iteration
log(f"{arch}: {raw_model.num_params():,} parameters | {tokens_per_iter:,} tokens/iter "
    f"({gradient_accumulation_steps} x {batch_size} x {block_size}, {world_size} rank(s)) | "
    f"{device} {dtype} | clip {clip:.4g}")
start_iter, t_start = iter_num, time.time()
t0, t0_iter, last_grad_norm, bad_in_row = time.time(), iter_num, float("nan"), 0   # t0: the last progress line
while True:
    lr = get_lr(iter_num)
    for group in optimizer.param_groups:
        group["lr"] = lr

    # evaluate, log, checkpoint (the iteration a resumed run starts at was evaluated before the stop, unless a
    # signal stopped that evaluation)
    resumed_here = resume and iter_num == start_iter and not eval_only and not eval_pending
    if (iter_num % eval_interval == 0 or iter_num == max_iters) and not resumed_here:
        t_eval = time.time()
        losses = estimate_loss()   # None: stopped by a signal, which saves below
        finite = losses is not None and math.isfinite(losses["train"]) and math.isfinite(losses["val"])
        if losses is not None:
            log(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f} "
                f"({time.time() - t_eval:.1f} s)")
        if master and not eval_only and losses is not None:   # the log line first: trim_log() undoes it if no save
            row = {"iter": iter_num, "train_loss": losses["train"], "val_loss": losses["val"], "lr": lr,
                   "grad_norm": last_grad_norm if math.isfinite(last_grad_norm) else None,
                   "time_s": round(time.time() - t_start, 3), "tokens": iter_num * tokens_per_iter,
                   "skipped": skipped_total}
            append_log(out_dir, row)
            if run:
                run.log(row, step=iter_num)
        # every rank keeps the same best (the losses are global means) and takes part in the saves
        if not eval_only and finite and iter_num == 0 and best_iter is None:
            best_val_loss = losses["val"]  # the bar every "good" checkpoint must clear
        elif not eval_only and finite:  # a non-finite model never reaches a checkpoint
            if losses["val"] < best_val_loss or always_save_checkpoint:
                if losses["val"] < best_val_loss:
                    best_val_loss, best_iter = losses["val"], iter_num
                save(ckpt_best)
            save(ckpt_last)
        t0 += time.time() - t_eval  # keep evaluation out of ms/iter
    if (eval_only or iter_num >= max_iters) and losses is not None:
        break
    if signals.requested():  # after (or during) the due evaluation, so a resume from here skips nothing
        if not eval_only:
            save(ckpt_last)
        signals.exit(iter_num, saved=None if eval_only else resume_path(out_dir))

    # forward/backward over this rank's share of the global micro-batches (rank r: r, r+W, r+2W, ...)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    if random_depth:   # this iteration only; evaluation, checkpoints and clipping keep the trained depth
        raw_model.set_depth(train_depth(iter_num))
    for m_i in range(micro_per_rank):
        X, Y = get_batch("train", 0, iter_num, ranks.rank + m_i * world_size)
        parallel.no_sync_unless(model, ranks, fsdp, last=m_i == micro_per_rank - 1)
        with ctx:
            _, loss = model(X, Y)
        loss_sum += loss.detach().double()
        scaler.scale(loss / micro_per_rank).backward()  # DDP averages over ranks: the global mean
    if random_depth:
        raw_model.set_depth(None)
    if ranks.ddp:
        torch.distributed.all_reduce(loss_sum)
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
            parallel.end_process_group(ranks)
            sys.exit(3)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

    iter_num += 1
    if iter_num % log_interval == 0:
        dt = (time.time() - t0) / (iter_num - t0_iter)   # a resumed run's first line covers fewer iterations
        t0, t0_iter = time.time(), iter_num
        elapsed = time.time() - t_start  # evaluations included, so the time left includes them too
        left = elapsed / (iter_num - start_iter) * (max_iters - iter_num)
        log(f"iter {iter_num}/{max_iters} ({100 * iter_num / max(1, max_iters):.1f}%): loss {train_loss:.4f}, "
            f"lr {lr:.3e}, grad norm {grad_norm:.3f}, {dt * 1000:.1f} ms/iter, {tokens_per_iter / dt:,.0f} tok/s, "
            f"MFU {flops_per_iter / dt / peak_flops:.1%} | {fmt_time(elapsed)} elapsed, {fmt_time(left)} left")

log(f"done: {iter_num} iterations, best val loss {best_val_loss:.4f}, {time.time() - t_start:.1f} s")
if run:
    run.finish()
parallel.end_process_group(ranks)
