"""
Train HRM-LM, a Transformer or a UniTF, in one process or under torchrun (DDP; FSDP2 with --fsdp=True):

    python train.py config/shakespeare_hrm.py --max_iters=100
    torchrun --standalone --nproc_per_node=6 train.py config/equalparam_nt8.py
"""

import os
from hrmlm import signals   # first of all (torch takes seconds to import): a signal is one line, at once
signals.guard("train.py", " before training started; nothing was saved", speak=os.environ.get("RANK", "0") == "0")

import math  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from configurator import configure  # noqa: E402
from hrmlm.checkpoint import (CKPT_BEST, append_log, claim_out_dir, find_checkpoint, finished,  # noqa: E402
                              load_checkpoint, load_resume, load_weights, resume_path, save_checkpoint, save_resume)
from hrmlm.common import (DTYPES, auto_dtype, counted_train_flops, device_peak_tflops, fmt_time,  # noqa: E402
                          get_batch, open_dataset, precision_context, torch_line, usable_device)
from hrmlm.signals import DIVERGED, SIGNALLED, UserError  # noqa: E402
from model import MODEL_FIELDS, ModelConfig, build_model  # noqa: E402

# -----------------------------------------------------------------------------
# Defaults: the paper's OpenWebText setup (Table "Ablation" base); each config/ file sets only what it changes.
out_dir = "out"              # checkpoints and log.jsonl go here
eval_interval = 500          # evaluate (and checkpoint) every this many iterations
log_interval = 10            # print a progress line every this many iterations
eval_iters = 200             # batches per split in an evaluation
eval_only = False            # evaluate once and exit
init_from = "scratch"        # "scratch", "resume" (out_dir/ckpt_last.dcp), or a checkpoint or out_dir to start from
overwrite = False            # a new run in an out_dir that holds one replaces its log and checkpoints
max_nonfinite = 10           # stop after this many non-finite iterations in a row
wandb_log = False            # also log each evaluation to Weights & Biases (pip install wandb; WANDB_MODE=offline works)
wandb_project = "hrm-lm"     # its project
wandb_run_name = ""          # its run name ("" = the out_dir's name)
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
device = "auto"              # "auto" (cuda if present, else cpu), "cpu", "cuda", "cuda:1", ...
dtype = "auto"               # "auto" (bfloat16 on CUDA, float32 on CPU), "float32", "bfloat16", "float16"
compile = None               # torch.compile per block application (None: on CUDA, not on CPU; the weights saved eager)
fsdp = False                 # with torchrun: FSDP2 instead of DDP (shards weights, grads, AdamW state; see tools/plan.py)
seed = 1337                  # everything random derives from this
# -----------------------------------------------------------------------------
# a resume keeps these of its checkpoint (nanoGPT its model's): the model, the tokens, AdamW's groups; not the schedule
RESUME_KEYS = (*MODEL_FIELDS, "dataset", "batch_size", "block_size", "seed", "gradient_accumulation_steps",
               "eval_iters", "scalar_lr_mult")


def setting_errors(c, ddp):
    """The settings no run can use, one line each (a NaN or Inf was refused when set; ModelConfig checks its own)."""
    kv, arch, least = c["train_kv"], c["arch"], dict(batch_size=1, max_iters=0, eval_iters=1, eval_interval=1, seed=0,
        log_interval=1, max_nonfinite=1, min_lr=0, weight_decay=0, grad_clip=0, warmup_iters=0, lr_decay_iters=0)
    return [line for line, bad in {
        **{f"{k} must be >= {v}, got {c[k]}": c[k] < v for k, v in least.items()},
        **{f"{k} must be > 0, got {c[k]}": not c[k] > 0 for k in ("learning_rate", "scalar_lr_mult")},
        **{f"{k} must be in [0, 1), got {c[k]}": not 0 <= c[k] < 1 for k in ("beta1", "beta2")},
        f"compile must be True, False or None (on CUDA only), got {c['compile']!r}": c["compile"] not in (True, False),
        "fsdp=True shards the model over torchrun's processes: run it with torchrun": c["fsdp"] and not ddp,
        "fsdp=True trains in bfloat16 or float32: use --dtype=bfloat16": c["fsdp"] and c["dtype"] == "float16",
        "random_depth=True varies the recurrence of hrm/unitf, with K_slow=0 and fast_attn_steps=None": c[
            "random_depth"] and (arch == "transformer" or c["K_slow"] or c["fast_attn_steps"] is not None),
        f"train_kv={kv!r}: only 'full' (the default) or, for arch='unitf' in one process without compile, 'last' "
        f"(section 8 of docs/RESULTS.md); got arch={arch!r}" + ", under torchrun" * ddp + ", compile=True" * (c[
            "compile"] is True): kv != "full" and (arch != "unitf" or kv != "last" or ddp or c["compile"] is True),
        f"min_lr={c['min_lr']:g} is above learning_rate={c['learning_rate']:g}: the cosine 'decay' would climb to it":
            c["decay_lr"] and c["min_lr"] > c["learning_rate"] > 0}.items() if bad]


def stop(lines, status=2):
    """'train.py: error: <line>' (rank 0's), exit status 2, 1 (a write), 3 (diverged) or 128 + n (signal n): os._exit."""
    sys.stdout.flush()
    for line in lines if isinstance(lines, list) else [lines]:
        print(f"train.py: error: {line}", file=sys.stderr, flush=True) if rank == 0 else None
    os._exit(status)


log = lambda msg: print(msg, flush=True) if rank == 0 else None   # noqa: E731  (every rank runs; rank 0 speaks)
# --- setup: every check before any work; a problem is a UserError raised where it is found, one line here ----------
ddp, rank = "RANK" in os.environ, int(os.environ.get("RANK", 0))   # under torchrun?
try:
    config = configure(globals())   # config/*.py, then --key=value (configurator.py)
    device = usable_device(device)   # "auto": cuda if torch can use a GPU, else cpu
    config["compile"] = compile = device != "cpu" if compile is None else compile   # CPU: docs/BENCHMARKS.md
    if errors := setting_errors(config, ddp):
        stop(errors)
    if ddp or compile or device != "cpu":
        from hrmlm import parallel   # here: one process on the CPU without compile needs none of it
    if train_kv != "full":
        from hrmlm import engine   # here: only train_kv="last" (training through decoding's cache) needs it
    rank, world_size, device = parallel.init_process_group(device) if ddp else (0, 1, device)   # torchrun: GPU a rank
    master, device_type = rank == 0, "cuda" if device.startswith("cuda") else "cpu"
    dtype = auto_dtype(dtype, device_type)   # "auto": bfloat16 on CUDA, float32 on CPU
    # out_dir: one train.py at a time, one run (a new run's made once every check passed); the weights to start from
    resume, claim = init_from == "resume", master and not eval_only
    lock, last = claim_out_dir(out_dir, True, overwrite, claim) if resume else (None, None)
    source = last if resume else None if init_from == "scratch" else find_checkpoint(init_from, out_dir)
    ckpt = load_checkpoint(source) if source else {}
    if resume:   # the checkpoint's model and data, this command's schedule
        changed = [f"{k} {v!r} -> {config[k]!r}" + " (kept the checkpoint's)" * (k in RESUME_KEYS) for k, v in ckpt[
            "config"].items() if config.get(k, v) != v and k not in ("init_from", "out_dir", "data_dir", "vocab_size")]
        log(f"note: resuming with changed settings (the schedule, not the data): {', '.join(changed)}") if changed else 0
        config.update({k: ckpt["config"][k] for k in RESUME_KEYS if k in ckpt["config"]})
        globals().update(config)
    if ddp:   # a new run splits its micro-batches over the ranks; a resumed one keeps the checkpoint's
        gradient_accumulation_steps, batch_size = parallel.micro_batches(
            gradient_accumulation_steps, batch_size, world_size, resume, log)
    # meta.json and each split checked; a resume's, against the token counts the checkpoint was trained on
    splits, meta = open_dataset(data_dir, dataset, block_size, vocab_size, (ckpt.get("meta") or {}).get("tokens"))
    config["vocab_size"] = vocab_size = meta["vocab_size"]
    model_config = ModelConfig(**{k: config[k] for k in MODEL_FIELDS})   # a ValueError names the field
    if wandb_log and master:
        import wandb   # here: an optional dependency (an ImportError below)
    if not resume and not overwrite and (done := finished(out_dir, config)):
        log(f"{out_dir} holds this run, finished (iter {done}): nothing to do (--overwrite=True trains it again)")
        sys.exit(0)   # the same command again (the README's, pasted twice)
    lock = lock if resume else claim_out_dir(out_dir, False, overwrite, claim)[0]
    torch.manual_seed(seed)   # the init, every rank's: a CPU build's bit for bit (on a GPU, parallel.build_on_device
    # draws it a weight at a time and moves or shards it: the host never holds the whole model)
    model = build_model(model_config) if device == "cpu" and not ddp else parallel.build_on_device(
        model_config, device, rank, world_size, fsdp, DTYPES[dtype])
    if source and "sharded" not in ckpt:   # a ckpt.pt's weights (a new run from them)
        load_weights(model, ckpt.pop("model"), source)
    # AdamW: matrices and embedding decayed; with scalar_lr_mult != 1 alpha and tau (one element each) at that multiple
    params = list(model.parameters())
    scalars = [p for p in params if p.numel() == 1] if scalar_lr_mult != 1 else []
    groups = [[p for p in params if p.dim() >= 2], [p for p in params if p.dim() < 2 and all(p is not q for q in scalars)]]
    optimizer = torch.optim.AdamW([{"params": ps, "weight_decay": wd, "lr_mult": m} for ps, wd, m in zip(
        groups + [scalars] * bool(scalars), (weight_decay, 0.0, 0.0), (1.0, 1.0, scalar_lr_mult))],
        lr=learning_rate, betas=(beta1, beta2), fused=device_type == "cuda")
    if "sharded" in ckpt:   # a resume state's weights and (to resume) AdamW's state: each rank reads its pieces
        load_resume(ckpt["sharded"], model, optimizer if resume else None, ckpt["param_groups"])
    if wandb_log and master:   # WANDB_MODE=offline needs no account
        wandb.init(project=wandb_project, config=config, dir=out_dir, name=wandb_run_name or os.path.basename(out_dir))
except ValueError as e:   # a UserError (exit status 2, or 1 where a write failed), or ModelConfig's
    stop(str(e), getattr(e, "status", 2))
except ImportError:
    stop("wandb_log=True needs the wandb package: pip install wandb (or leave wandb_log off)")
log(f"starting from the weights of {source} (iter {ckpt['iter_num']})") if source and not resume else None
# the counters a resume continues (no RNG state: after the init nothing draws from a global generator)
iter_num, best_val_loss, best_iter, skipped_total, eval_pending, grad_norm = (ckpt.get(k, v) if resume else v for k, v
    in zip(("iter_num", "best_val_loss", "best_iter", "skipped_total", "eval_pending", "grad_norm"),
           (0, math.inf, None, 0, False, math.nan)))
for m in [m for m in (getattr(model, "L_net", None), getattr(model, "H_net", None)) if m and not learn_alpha]:
    m.alpha.fill_(0.1)   # held at 0.1 (docs/MODEL.md section 8), also where the weights came with a learned alpha
scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
ctx = precision_context(device_type, dtype)   # autocast to bf16/fp16 (its weight cache on), nothing for float32
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True   # GPU float32 matmuls in TF32
# raw_model: what is saved and evaluated, uncompiled and unwrapped; compiled per block-application unit (every step)
raw_model, model = model, parallel.compile_model(model) if compile else model
model = parallel.wrap(model, device, fsdp) if ddp else model   # DDP (FSDP is already in place)
steps, depth = model_config.M, model_config.N if arch == "hrm" else model_config.M   # D: random_depth's 1..2D-1
clip = grad_clip * min(K, steps) / steps if arch != "transformer" else grad_clip   # HRM, UniTF: grad_clip * K/M
tokens_per_iter, micro_per_rank = gradient_accumulation_steps * batch_size * block_size, gradient_accumulation_steps \
    // world_size
# MFU: one iteration's FLOPs, counted once on the meta device, against the peak of every rank's device
flops_per_iter = counted_train_flops(model_config, batch_size, block_size) * gradient_accumulation_steps
peak_flops = device_peak_tflops(device, DTYPES[dtype]) * 1e12 * world_size


def get_lr(it):   # linear warmup, then cosine from learning_rate to min_lr at lr_decay_iters (0: max_iters)
    decay_iters = lr_decay_iters or max_iters
    if not decay_lr:
        return learning_rate
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it >= decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / max(1, decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def forward(m, X, Y=None):   # (logits, loss); train_kv: as it decodes, token by token (docs/MODEL.md section 5)
    return m(X, Y) if train_kv == "full" else engine.teacher_forced(m, X, train_kv, Y)


@torch.no_grad()
def estimate_loss():
    """Final-pass CE on eval_iters fixed batches per split, shared by the ranks, on the model as it trains (it has no
    dropout: no eval mode to switch to). A signal ends it (None) in one process: its save comes first."""
    out = {}
    for s, split in enumerate(("train", "val")):
        total = torch.zeros(2, dtype=torch.float64, device=device)   # the losses' sum, their count
        for r in range(-(-eval_iters // world_size)):   # as many rounds on every rank (FSDP gathers in each)
            if signals.received and not ddp:
                return None
            k = r * world_size + rank
            if k < eval_iters or fsdp:
                X, Y = get_batch(splits, split, seed, 1 + s, 0, k % eval_iters, batch_size, block_size, device)
                with ctx:
                    logits = forward(raw_model, X)[0]
                loss = raw_model.cross_entropy(logits, Y).double()
                total += torch.stack([loss, torch.ones_like(loss)]) * (k < eval_iters)
        dist.all_reduce(total) if ddp else None
        out[split] = (total[0] / total[1]).item()
    return out


def state():   # what a save keeps beside the weights: the settings, and the counters a resume continues
    return dict(model_args=model_config.__dict__, config=config, meta=meta, iter_num=iter_num, best_iter=best_iter,
                best_val_loss=best_val_loss, skipped_total=skipped_total, eval_pending=eval_pending, grad_norm=grad_norm)


def save(write, *args):   # a write of the run folder; one that fails (a full disk) ends the run, naming what is intact
    try:
        write(*args)
    except UserError as e:
        stop(str(e), e.status)


def evaluate(lr):
    """Evaluate, log, save: ckpt.pt when val beats the best so far, the resume state always (every rank: same best)."""
    global best_val_loss, best_iter, eval_pending
    t_eval, losses = time.time(), estimate_loss()
    eval_pending = losses is None   # a signal stopped it: its save comes first, and the resumed run evaluates
    if losses is None:
        return
    log(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f} ({time.time() - t_eval:.1f} s)")
    scales = {k: getattr(m.alpha, "full_tensor", lambda: m.alpha)().item() for k, m in (   # HRM's: near 0, its block
        ("alpha_L", getattr(raw_model, "L_net", None)), ("alpha_H", getattr(raw_model, "H_net", None))) if m}   # is off
    row = {"iter": iter_num, "train_loss": losses["train"], "val_loss": losses["val"], "lr": lr,
           "grad_norm": grad_norm, "time_s": round(time.time() - t_start, 3), "tokens": iter_num * tokens_per_iter,
           "skipped": skipped_total, **scales}
    if master and not eval_only:
        save(append_log, out_dir, row)
        wandb.log(row, step=iter_num) if wandb_log else None
    if eval_only or not (math.isfinite(losses["train"]) and math.isfinite(losses["val"])):
        return   # a non-finite model never reaches a checkpoint
    if iter_num == 0 and best_iter is None:
        best_val_loss = losses["val"]   # the bar every saved "best" model must clear
        return
    if losses["val"] < best_val_loss:
        best_val_loss, best_iter = losses["val"], iter_num
    if best_iter == iter_num:   # ckpt.pt: gathered whole to rank 0 (FSDP: a collective)
        weights = parallel.full_state_dict(raw_model) if fsdp else raw_model.state_dict()
        save(save_checkpoint, os.path.join(out_dir, CKPT_BEST), dict(state(), model=weights)) if master else None
    save(save_resume, out_dir, raw_model, optimizer, state())   # every rank writes its shards


def diverged(why):   # exit status 3, naming the last good model: a run that diverged never says "done"
    good = os.path.join(out_dir, CKPT_BEST)
    stop(f"{why}; last good checkpoint: " + (f"{good} (iter {best_iter}, val loss {best_val_loss:.4f})" if best_iter
         is not None and os.path.exists(good) else "none (no evaluation beat the initial model)"), DIVERGED)


# --- the loop: Algorithm 1 (the model's forward is Algorithms 2-3, with the last-K window) ---------------------
log(f"{arch}: {raw_model.num_params():,} parameters | {tokens_per_iter:,} tokens/iter ({gradient_accumulation_steps} "
    f"x {batch_size} x {block_size}, {world_size} rank(s)) | {dtype} | clip {clip:.4g} | {torch_line(device)}")
start_iter, t_start, bad_in_row, stop_vote, t0, t0_iter = iter_num, time.time(), 0, 0, time.time(), iter_num
signals.guard("train.py", "; quitting without saving", master, first="saving at the end of this iteration (send it "
              "again to quit without saving)")   # the loop reads signals.received at the iteration's end
while True:
    lr = get_lr(iter_num)
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_mult"]
    # the iteration a resumed run starts at was evaluated before its save, unless a signal stopped that evaluation
    if (iter_num % eval_interval == 0 or iter_num == max_iters) and (iter_num > start_iter or not resume or
                                                                      eval_pending or eval_only):
        t_eval = time.time()
        evaluate(lr)
        t0 += time.time() - t_eval   # keep evaluation out of ms/iter
    if (eval_only or iter_num >= max_iters) and not eval_pending:
        break
    if stop_vote or signals.received and not ddp:   # a signal on any rank (torchrun: the last iteration's sync)
        save(save_resume, out_dir, raw_model, optimizer, state()) if not eval_only else None
        n = signals.received[0] if signals.received else signal.SIGTERM   # another rank's: SIGTERM's exit status
        stop(f"stopped by {signal.Signals(n).name if signals.received else 'a signal'} at iter {iter_num}" + "; saved "
             f"{resume_path(out_dir)}; continue with --init_from=resume" * (not eval_only), SIGNALLED + n)

    # Loop 2: forward/backward over this rank's share of the global micro-batches (rank r: r, r+W, r+2W, ...); micro-
    # batch j of iteration i of a stream (0: training; 1, 2: evaluation) is a pure function of (seed, stream, i, j)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    if random_depth:   # Huginn's recipe (docs/MODEL.md section 8): this iteration's depth 1..2D-1, from (seed, iter)
        raw_model.set_depth(random.Random(seed * 1_000_003 + iter_num).randint(1, 2 * depth - 1))
    for m_i in range(micro_per_rank):
        X, Y = get_batch(splits, "train", seed, 0, iter_num, rank + m_i * world_size, batch_size, block_size, device)
        parallel.sync_gradients(model, fsdp, m_i == micro_per_rank - 1) if ddp else None   # on the last one only
        with ctx:
            _, loss = forward(model, X, Y)
        loss_sum += loss.detach().double()
        scaler.scale(loss / micro_per_rank).backward()   # DDP averages over the ranks: the global mean
    raw_model.set_depth(None) if random_depth else None   # evaluation, saves and clipping: the trained depth
    scaler.unscale_(optimizer)
    total_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), clip if clip > 0 else math.inf)
    total_norm = total_norm.full_tensor() if fsdp else total_norm   # FSDP: the norm over every rank's shards
    summed = torch.stack([loss_sum, torch.full_like(loss_sum, float(bool(signals.received)))])   # a fill: no copy
    dist.all_reduce(summed) if ddp else None   # from the host, no sync; every rank's loss and any rank's stop signal
    train_loss, stop_vote, norm = torch.stack([summed[0] / gradient_accumulation_steps, summed[1],   # the one host
                                               total_norm.double()]).tolist()   # sync: mean loss, stop vote, grad norm
    if math.isfinite(train_loss) and math.isfinite(norm):
        scaler.step(optimizer)
        grad_norm, bad_in_row = norm, 0
    else:   # never let a NaN/Inf reach the optimiser
        skipped_total, bad_in_row = skipped_total + 1, bad_in_row + 1
        log(f"iter {iter_num}: non-finite loss {train_loss} or grad norm {norm}; step skipped ({bad_in_row} in a row, "
            f"{skipped_total} in all)")
        if bad_in_row >= max_nonfinite:
            diverged(f"stopping at iter {iter_num}: {bad_in_row} non-finite iterations in a row (max_nonfinite="
                     f"{max_nonfinite})")
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    if iter_num % log_interval == 0:
        dt = (time.time() - t0) / (iter_num - t0_iter)   # a resumed run's first line covers fewer iterations
        t0, t0_iter, elapsed = time.time(), iter_num, time.time() - t_start   # evaluations included in elapsed
        log(f"iter {iter_num}/{max_iters} ({100 * iter_num / max(1, max_iters):.1f}%): loss {train_loss:.4f}, lr "
            f"{lr:.3e}, grad norm {norm:.3f}, {dt * 1000:.1f} ms/iter, {tokens_per_iter / dt:,.0f} tok/s, MFU "
            f"{flops_per_iter / dt / peak_flops:.1%} | {fmt_time(elapsed)} elapsed, "
            f"{fmt_time(elapsed / (iter_num - start_iter) * (max_iters - iter_num))} left")

if bad_in_row:   # fewer than max_nonfinite iterations were left: the run still did not do what it was asked
    diverged(f"the last {bad_in_row} iteration(s) up to iter {iter_num} were all non-finite (steps skipped)")
signals.install(signal.SIG_IGN)   # done: from here a signal changes nothing
log(f"done: {iter_num} iterations, best val loss {best_val_loss:.4f}, {time.time() - t_start:.1f} s" +
    (f", peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB allocated, "
     f"{torch.cuda.max_memory_reserved(device) / 2**30:.1f} GiB reserved" if device_type == "cuda" else ""))
wandb.finish() if wandb_log and master else None
dist.destroy_process_group() if ddp else None
