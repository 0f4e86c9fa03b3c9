"""
Train HRM-LM, a Transformer or a UniTF. One process:

    python train.py config/shakespeare_hrm.py --max_iters=100

DDP on one node with 6 GPUs (NCCL on CUDA, gloo on CPU):

    torchrun --standalone --nproc_per_node=6 train.py config/equalparam_nt8.py

FSDP2 (--fsdp=True) shards weights, gradients and AdamW state over the ranks (tools/plan.py says which configs need it).

gradient_accumulation_steps is the *global* number of micro-batches per iteration, as in
nanoGPT: each of W ranks runs 1/W of them. Micro-batch j of iteration i is drawn from its
own seeded generator, so a run gives the same numbers with 1 or W processes, and after a
resume (the sampler's whole state is the iteration number).

It reads top to bottom, in nanoGPT's order: the settings; the process group, device and precision; one call that
checks the rest, one line per problem (checkpoint.start_run); the data; the model and optimiser; the loop.
"""

import math
import os
import random
import time

from hrmlm.signals import exit_at_once  # the standard library only: before torch's import (seconds)
exit_at_once("train.py", " before training started; nothing was saved", speak=os.environ.get("RANK", "0") == "0")

import torch  # noqa: E402

from hrmlm import data  # noqa: E402
from hrmlm import engine  # noqa: E402
from hrmlm import parallel  # noqa: E402
from hrmlm.checkpoint import CKPT_BEST, CKPT_LAST, append_log, finish_sharded, start_run  # noqa: E402
from hrmlm.common import (DIVERGED, DTYPES, auto_dtype, fail, fmt_time, precision_context, torch_line,  # noqa: E402
                          usable_device)
from configurator import configure  # noqa: E402
from hrmlm.flops import counted_train_flops, device_peak_tflops  # noqa: E402
from model import ModelConfig  # noqa: E402

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
init_from = "scratch"        # "scratch", "resume" (out_dir/ckpt_last.dcp), or a checkpoint or out_dir to start from
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
out_proj = False             # transformer/unitf: HRM's untied d x d matrix before the tied logits (a control)
learn_alpha = True           # hrm: False holds alpha_L, alpha_H at 0.1 (a remedy for their collapse, not the paper)
# optimiser: AdamW, betas (0.9, 0.95), weight decay on matrices only (docs/MODEL.md section 6)
learning_rate = 1.5e-4       # peak learning rate (the paper's Ablation base)
min_lr = 1.5e-5              # cosine floor (learning_rate / 10; a config that changes learning_rate sets it too)
max_iters = 10000            # total iterations (the paper's 10k)
weight_decay = 0.1           # on 2-D parameters
scalar_lr_mult = 1.0         # hrm: alpha_L, alpha_H and tau learn at this multiple of the lr (1 = the paper; a remedy)
beta1 = 0.9                  # AdamW first-moment decay
beta2 = 0.95                 # AdamW second-moment decay
grad_clip = 1.0              # clip norm; HRM/UniTF use grad_clip * K / M (0 = off)
decay_lr = True              # linear warmup then cosine; False = constant
random_depth = False         # hrm/unitf: train each iteration at N' (M') uniform on 1..2D-1, D the config's N (M)
train_kv = "full"            # unitf: "last" trains and evaluates token by token through decoding's shared cache (engine.py)
warmup_iters = 1000          # linear warmup (HRM: max(1000, N*T*100), docs/MODEL.md section 6)
lr_decay_iters = 0           # cosine reaches min_lr here (0 = max_iters)
# system
device = "auto"              # "auto" (cuda if present, else cpu), "cpu", "cuda", "cuda:1", ...
dtype = "auto"               # "auto" (bfloat16 on CUDA, float32 on CPU), "float32", "bfloat16", "float16"
compile = False              # torch.compile the model (the uncompiled weights are what is saved)
fsdp = False                 # with torchrun: FSDP2 instead of DDP (shards weights, grads, AdamW state; see tools/plan.py)
seed = 1337                  # everything random derives from this
# -----------------------------------------------------------------------------
config = configure(globals(), prog="train.py")

# --- setup, in nanoGPT's order: the process group on its device, the precision, then one call that checks the rest
# before any work (settings, dataset, out_dir, the checkpoint to start from): each problem is one line and every
# rank stops on it (exit status 2), or it hands back the run ----------------------------------------------------
ranks = parallel.init_process_group(usable_device(device))   # one process, or a rank of torchrun's (DDP/FSDP)
device, master, world_size = ranks.device, ranks.master, ranks.world_size
device_type = "cuda" if device.startswith("cuda") else "cpu"
dtype = auto_dtype(dtype, device_type)   # "auto": bfloat16 on CUDA, float32 on CPU
run = start_run(config, ranks, dtype)   # checkpoint.Run: the checked settings, the dataset, the checkpoint, the counters
gradient_accumulation_steps, batch_size = config["gradient_accumulation_steps"], config["batch_size"]  # fitted to W


def log(msg):
    if master:
        print(msg, flush=True)


# --- data: micro-batch j of iteration i is a pure function of (seed, stream, i, j) ----------------------
tokens_per_iter = gradient_accumulation_steps * batch_size * block_size
micro_per_rank = gradient_accumulation_steps // world_size


def get_batch(split, stream, i, j):   # micro-batch j of iteration i of a stream (0: training, 1-2: evaluation)
    return data.get_batch(run.splits, split, seed, stream, i, j, batch_size, block_size, device)


# --- model and optimiser ------------------------------------------------------------------------
torch.manual_seed(seed)  # the model's init: identical on every rank
model_config = ModelConfig(**run.model_args)
# built on the meta device, then each rank's tensors on its device with the init a CPU build draws, bit for bit;
# fsdp: FSDP2, weights, gradients and AdamW state sharded (each rank materialises only its shards)
model = parallel.build_on_device(model_config, device, ranks, fsdp, DTYPES[dtype])
errors = run.load_weights(model)   # a single-file checkpoint's weights (init_from=<file>, an older run's resume)
params = list(model.parameters())
# AdamW groups: matrices and the embedding (decayed); norms (and alpha, tau); with scalar_lr_mult != 1, alpha and
# tau (one element each, also under FSDP) on their own, at that multiple of the lr
scalars = [p for p in params if p.numel() == 1] if scalar_lr_mult != 1 else []
groups = [[p for p in params if p.dim() >= 2], [p for p in params if p.dim() < 2 and not any(p is q for q in scalars)]]
optimizer = torch.optim.AdamW(
    [{"params": ps, "weight_decay": wd} for ps, wd in zip(groups + [scalars] * bool(scalars), (weight_decay, 0.0, 0.0))],
    lr=learning_rate, betas=(beta1, beta2), fused=device_type == "cuda")
lr_mults = (1.0, 1.0, scalar_lr_mult)   # each group's lr: the schedule's, times this
run.restore(model, optimizer, errors)   # AdamW's state and the counters to resume; every rank stops on an error
for m in [getattr(model, n, None) for n in ("L_net", "H_net")] if not learn_alpha else []:
    if m is not None:   # held at 0.1 (docs/MODEL.md section 8), also when init_from's checkpoint learned its alpha
        m.alpha.fill_(0.1)
# No RNG state is saved: after the initialisation nothing draws from a global generator (no dropout; each
# batch comes from its own generator), so a resume is exact without it.
scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
ctx = precision_context(device_type, dtype)   # autocast, its weight cache on under DDP and FSDP alike
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True   # GPU float32 matmuls in TF32 (nanoGPT)
raw_model = model   # what is saved: uncompiled, unwrapped
loop_depth = model_config.N if arch == "hrm" else model_config.M   # D: random_depth draws 1..2D-1 (train_depth)
if compile:
    model = parallel.compile_model(model)   # each block application unit: one graph for every step and depth
model = parallel.wrap(model, ranks, fsdp)   # DDP under torchrun (FSDP is already in place)
steps = model_config.M
clip = grad_clip * min(K, steps) / steps if arch in ("hrm", "unitf") else grad_clip  # K/M-proportional
decay_iters = lr_decay_iters or max_iters
# MFU: the FLOPs of one iteration, counted once on the meta device, against the device's peak over all ranks
flops_per_iter = counted_train_flops(model_config, batch_size, block_size) * gradient_accumulation_steps
peak_flops = device_peak_tflops(device, DTYPES[dtype]) * 1e12 * world_size
ckpt_last, ckpt_best = os.path.join(out_dir, CKPT_LAST), os.path.join(out_dir, CKPT_BEST)


def train_depth(it):
    """random_depth (Huginn's recipe for depth at inference; docs/MODEL.md section 8): iteration it's depth,
    uniform on 1..2D-1, from (seed, it) alone, so every rank draws the same and a resume continues exactly."""
    return random.Random(seed * 1_000_003 + it).randint(1, 2 * loop_depth - 1)


def forward(m, X, Y=None):
    """(logits, loss) of the model m; with train_kv, as it decodes under that cache policy, token by token
    (engine.teacher_forced: Huginn's remedy for a cache shared across steps, docs/MODEL.md section 5)."""
    if train_kv == "full":
        return m(X, Y)
    logits = engine.teacher_forced(m, X, train_kv)
    return logits, None if Y is None else raw_model.cross_entropy(logits, Y)


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
def estimate_loss(stop):
    """Final-pass CE (no entropy term) on eval_iters fixed batches per split, shared out over ranks. A signal
    (stop(): true) ends it between batches (returns None): a long evaluation never delays the save it asks for."""
    model.eval()
    out = {}
    for s, split in enumerate(("train", "val")):
        batch_losses = []
        for r in range(-(-eval_iters // world_size)):   # as many rounds on every rank (FSDP gathers in each)
            if stop():
                model.train()
                return None
            k = r * world_size + ranks.rank                # the same batches at every eval, on any world size
            if k < eval_iters or fsdp:
                X, Y = get_batch(split, 1 + s, 0, k % eval_iters)
                with ctx:
                    logits, _ = forward(raw_model, X)
                if k < eval_iters:
                    batch_losses.append(raw_model.cross_entropy(logits, Y).item())
        out[split] = parallel.all_mean(batch_losses, ranks)
    model.train()
    return out


def injection_scales():
    """HRM's alpha_L and alpha_H, logged at every evaluation: near 0, a shared block adds nothing to its state and
    the recurrence is off (tools/analyze.py measures what switching each block off costs; docs/RESULTS.md section 10).
    Every rank calls it: under FSDP each alpha is sharded (a DTensor), gathered here."""
    out = {}
    for key, m in (("alpha_L", getattr(raw_model, "L_net", None)), ("alpha_H", getattr(raw_model, "H_net", None))):
        if m is not None:
            out[key] = (m.alpha.full_tensor() if hasattr(m.alpha, "full_tensor") else m.alpha).item()
    return out


def evaluate(lr, grad_norm, t_start, stop):
    """Evaluate, log (log.jsonl, wandb) and checkpoint at run.iter_num: ckpt.pt when val improves on the best
    so far, ckpt_last.dcp always. Every rank keeps the same best (the losses are global means) and takes part in
    the saves. A signal stops the evaluation (run.eval_pending): the save it asks for then comes first."""
    it, t_eval = run.iter_num, time.time()
    losses = estimate_loss(stop)
    run.eval_pending = losses is None
    if losses is None:
        return
    log(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f} ({time.time() - t_eval:.1f} s)")
    if eval_only:
        return
    scales = injection_scales()
    if master:   # the log line first: trim_log() undoes it if no save follows
        row = {"iter": it, "train_loss": losses["train"], "val_loss": losses["val"], "lr": lr,
               "grad_norm": grad_norm if math.isfinite(grad_norm) else None, "time_s": round(time.time() - t_start, 3),
               "tokens": it * tokens_per_iter, "skipped": run.skipped_total, **scales}
        append_log(out_dir, row)
        if run.wandb:
            run.wandb.log(row, step=it)
    if not (math.isfinite(losses["train"]) and math.isfinite(losses["val"])):
        return   # a non-finite model never reaches a checkpoint
    if it == 0 and run.best_iter is None:
        run.best_val_loss = losses["val"]   # the bar every "good" checkpoint must clear
        return
    if losses["val"] < run.best_val_loss or always_save_checkpoint:
        if losses["val"] < run.best_val_loss:
            run.best_val_loss, run.best_iter = losses["val"], it
        run.save(ckpt_best, raw_model, optimizer)
    run.save(ckpt_last, raw_model, optimizer, wait=False)   # written in the background, made whole by finish_sharded


def diverged(why):
    """Stop with exit status 3, naming the last good checkpoint: a run that diverged never says "done"."""
    good = (f"{ckpt_best} (iter {run.best_iter}, val loss {run.best_val_loss:.4f})" if run.best_iter is not None
            and os.path.exists(ckpt_best) else "none (no evaluation beat the initial model)")
    finish_sharded()
    parallel.end_process_group(ranks)
    fail(f"{why}; last good checkpoint: {good}", DIVERGED, show=master)


# --- training loop: Algorithm 1 (the model's forward is Algorithms 2-3, with the last-K window) ---------
log(f"{arch}: {raw_model.num_params():,} parameters | {tokens_per_iter:,} tokens/iter "
    f"({gradient_accumulation_steps} x {batch_size} x {block_size}, {world_size} rank(s)) | "
    f"{dtype} | clip {clip:.4g} | {torch_line(device)}")
signals = parallel.StopSignals(ranks)   # Ctrl-C / SIGTERM: save ckpt_last.dcp at the end of the iteration
start_iter, t_start = run.iter_num, time.time()
t0, t0_iter, bad_in_row = time.time(), run.iter_num, 0   # t0: the last progress line
while True:  # Loop 1
    lr = get_lr(run.iter_num)
    for group, mult in zip(optimizer.param_groups, lr_mults):
        group["lr"] = lr * mult
    # the iteration a resumed run starts at was evaluated before the stop, unless a signal stopped that evaluation
    resumed_here = run.resume and run.iter_num == start_iter and not eval_only and not run.eval_pending
    if (run.iter_num % eval_interval == 0 or run.iter_num == max_iters) and not resumed_here:
        t_eval = time.time()
        evaluate(lr, run.grad_norm, t_start, signals.requested)
        t0 += time.time() - t_eval  # keep evaluation out of ms/iter
    if (eval_only or run.iter_num >= max_iters) and not run.eval_pending:
        break
    if signals.requested():  # after (or during) the due evaluation, so a resume from here skips nothing
        if not eval_only:
            run.save(ckpt_last, raw_model, optimizer)
        signals.exit(run.iter_num, saved=None if eval_only else ckpt_last)

    # Loop 2: forward/backward over this rank's share of the global micro-batches (rank r: r, r+W, r+2W, ...)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    if random_depth:   # this iteration only; evaluation, checkpoints and clipping keep the trained depth
        raw_model.set_depth(train_depth(run.iter_num))
    for m_i in range(micro_per_rank):
        X, Y = get_batch("train", 0, run.iter_num, ranks.rank + m_i * world_size)
        parallel.no_sync_unless(model, ranks, fsdp, last=m_i == micro_per_rank - 1)
        with ctx:
            _, loss = forward(model, X, Y)
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
        run.grad_norm, bad_in_row = grad_norm, 0
    else:  # never let a NaN/Inf reach the optimiser
        run.skipped_total += 1
        bad_in_row += 1
        log(f"iter {run.iter_num}: non-finite loss {train_loss} or grad norm {grad_norm}; step skipped "
            f"({bad_in_row} in a row, {run.skipped_total} in all)")
        if bad_in_row >= max_nonfinite:
            diverged(f"stopping at iter {run.iter_num}: {bad_in_row} non-finite iterations in a row "
                     f"(max_nonfinite={max_nonfinite})")
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

    run.iter_num += 1
    if run.iter_num % log_interval == 0:
        dt = (time.time() - t0) / (run.iter_num - t0_iter)   # a resumed run's first line covers fewer iterations
        t0, t0_iter = time.time(), run.iter_num
        elapsed = time.time() - t_start  # evaluations included, so the time left includes them too
        left = elapsed / (run.iter_num - start_iter) * (max_iters - run.iter_num)
        log(f"iter {run.iter_num}/{max_iters} ({100 * run.iter_num / max(1, max_iters):.1f}%): loss {train_loss:.4f}, "
            f"lr {lr:.3e}, grad norm {grad_norm:.3f}, {dt * 1000:.1f} ms/iter, {tokens_per_iter / dt:,.0f} tok/s, "
            f"MFU {flops_per_iter / dt / peak_flops:.1%} | {fmt_time(elapsed)} elapsed, {fmt_time(left)} left")

finish_sharded()   # the last resume state, made whole (every exit that saves does it: a signal's, a divergence's)
if bad_in_row:   # fewer than max_nonfinite iterations were left: the run still did not do what it was asked
    diverged(f"the last {bad_in_row} iteration(s) up to iter {run.iter_num} were all non-finite (steps skipped)")
log(f"done: {run.iter_num} iterations, best val loss {run.best_val_loss:.4f}, {time.time() - t_start:.1f} s" +
    (f", peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB" if device_type == "cuda" else ""))
if run.wandb:
    run.wandb.finish()
parallel.end_process_group(ranks)
