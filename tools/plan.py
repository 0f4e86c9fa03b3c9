"""
Will it fit? The per-GPU memory of one training iteration of a train.py config, computed on any machine
without allocating it, before anyone spends GPU hours (docs/MEMORY.md):

    python tools/plan.py config/equalparam_nt12.py config/tfbaseline_tf_l12.py --gpu_mem_gb=80
    python tools/plan.py config/equalparam_nt12.py --gpu_mem_gb=96 --world_size=8

Each config at its own sizes (train.py's defaults plus the file), on the paper's 6 GPUs unless --world_size
says otherwise, under DDP and FSDP, per GPU: the state (float32 weights, gradients and AdamW's two moments,
16 bytes a parameter; FSDP: its shards plus what it gathers), the activations autograd saves, of which logits,
autocast's bf16 weight copies, the iteration's peak beyond the state, the total against --gpu_mem_gb, what each
rank holds on the host; and the largest micro-batch that fits, with a command line that keeps the global batch.

How it counts: the real model runs forward and backward on the `meta` device (shapes and dtypes, no memory).
A saved-tensor hook records what autograd saves (unique storages, the weights' own excluded); a dispatch mode
follows every storage the iteration creates until it is freed: the live total and its peak. What a GPU does and
the CPU does not is applied by hand: CUDA autocast's bf16 policy (AutocastOnMeta) and the fused attention kernel
(FusedAttention). Not counted: the CUDA context and kernels' workspaces (--reserve_gb), allocator fragmentation,
torch.compile's buffers. tests/test_plan.py checks the method against one real float32 iteration on the CPU.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repo root: train.py, model.py, hrmlm/
sys.path.insert(0, ROOT)
from hrmlm import signals  # noqa: E402

if __name__ == "__main__":   # first of all (torch takes seconds to import): a signal is one line, at once
    signals.guard("plan.py")

import argparse  # noqa: E402
import ast  # noqa: E402
import math  # noqa: E402
import weakref  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

from configurator import RULE, apply_config  # noqa: E402
from hrmlm.common import HelpFormatter, UserError, load_meta, meta_path  # noqa: E402
from hrmlm.parallel import shard_units  # noqa: E402
from model import MODEL_FIELDS, ModelConfig, build_model  # noqa: E402

GB = 1e9


def read_settings(path):
    """A script's settings, read from its source without running it: {name: (default, comment)} for each
    `name = <literal>  # comment` of its settings block, in order."""
    with open(path, encoding="utf-8") as f:
        block = f.read().split(RULE)[1]   # between the two rules, as nanoGPT's scripts have
    lines, settings = block.splitlines(), {}
    for node in ast.parse(block).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                default = ast.literal_eval(node.value)
            except ValueError:
                continue
            rest = lines[node.end_lineno - 1][node.end_col_offset:].strip()
            settings[node.targets[0].id] = (default, rest[1:].strip() if rest.startswith("#") else "")
    return settings


def model_config(settings):
    """The model.ModelConfig in a dict of train.py settings: every field is a setting of the same name."""
    return ModelConfig(**{f: settings[f] for f in MODEL_FIELDS})


def train_defaults():
    """train.py's settings and their defaults, read without running it."""
    return {k: default for k, (default, _) in read_settings(os.path.join(ROOT, "train.py")).items()}


def train_settings(argv):
    """train.py's settings for argv (config files and --key=value), read as train.py reads them."""
    config = apply_config(list(argv), train_defaults())
    if not config["vocab_size"]:   # the dataset's, from its meta.json; GPT-2's 50257 where it is not here
        here = os.path.exists(meta_path(config["data_dir"], config["dataset"]))
        config["vocab_size"] = load_meta(config["data_dir"], config["dataset"])["vocab_size"] if here else 50257
    return config


class FusedAttention(torch.autograd.Function):
    """Causal attention as the fused GPU kernels (flash, memory-efficient) keep it for backward: q, k, v, the
    output and a float32 log-sum-exp per query row; never the n x n matrix the meta device's math kernel saves."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)
        ctx.save_for_backward(q, k, v, out, torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device))
        return out

    @staticmethod
    def backward(ctx, g):
        return tuple(torch.empty_like(t) for t in ctx.saved_tensors[:3])


class AutocastOnMeta(TorchFunctionMode):
    """CUDA autocast's policy (aten/src/ATen/autocast_mode.cpp) for the ops model.py calls, on meta tensors, which
    torch.autocast leaves alone: matmuls and attention in bf16, these in float32, the rest by type promotion."""
    LOWER = {F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.bmm,
             torch.addmm, torch.baddbmm, F.scaled_dot_product_attention}
    FP32 = {torch.rsqrt, torch.Tensor.rsqrt, torch.pow, torch.Tensor.pow, torch.Tensor.__pow__, torch.softmax,
            torch.Tensor.softmax, F.softmax, torch.log_softmax, torch.Tensor.log_softmax, F.log_softmax,
            F.cross_entropy, F.rms_norm, torch.exp, torch.Tensor.exp, torch.log, torch.Tensor.log,
            torch.sum, torch.Tensor.sum}

    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype       # None: no autocast (float32 training), only the fused attention
        self.cache = {}          # id(weight) -> (weight, its cast): autocast casts each leaf once per region

    def cast(self, t, dtype):
        if not (isinstance(t, torch.Tensor) and t.is_floating_point()) or t.dtype == dtype:
            return t
        if not (t.is_leaf and t.requires_grad):
            return t.to(dtype)
        if id(t) not in self.cache:
            with torch.enable_grad():   # as torch's autocast: a copy first made under no_grad still carries
                c = t.to(dtype)         # the gradient of the steps that reuse it (pytorch#158232)
            c.weight_cast = True   # what count_iteration reports as weight casts when autograd saves it
            self.cache[id(t)] = (t, c)
        return self.cache[id(t)][1]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.dtype is not None and (func in self.LOWER or func in self.FP32):
            to = self.dtype if func in self.LOWER else torch.float32
            args = tuple(self.cast(a, to) for a in args)
            kwargs = {k: self.cast(v, to) for k, v in kwargs.items()}
        if func is F.scaled_dot_product_attention:
            assert kwargs.get("is_causal") and kwargs.get("attn_mask") is None, "training attention is causal"
            return FusedAttention.apply(*args[:3])
        return func(*args, **kwargs)


class LiveBytes(TorchDispatchMode):
    """Live bytes and their peak: every storage an op creates counts until it is freed (a weak reference).
    `before`: the storages that exist already (weights, gradients, inputs), which a view of them must not count."""

    def __init__(self, before=()):
        super().__init__()
        self.live = self.peak = 0
        self.seen = set(before)   # before's, and those counted and not yet freed

    def _free(self, key, nbytes):
        self.seen.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                if st._cdata not in self.seen:
                    self.seen.add(st._cdata)
                    self.live += st.nbytes()
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(st, self._free, st._cdata, st.nbytes())
        return out


def count_iteration(cfg, batch, dtype=torch.bfloat16, grads_persistent=True, seq=None):
    """Bytes of one iteration (forward, loss, backward) of build_model(cfg) on `batch` x `seq` (block_size) tokens:
    saved activations, of which logits and weight casts, and the peak beyond the persistent state.
    grads_persistent: the gradients exist before it (DDP's buckets, FSDP's shards), else they count in the peak."""
    with torch.device("meta"):
        model = build_model(cfg)
    model.train()
    if grads_persistent:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
    x = torch.zeros(batch, seq or cfg.block_size, dtype=torch.long, device="meta")
    own = {t.untyped_storage()._cdata for t in [*model.parameters(), *model.buffers(), x] +
           [p.grad for p in model.parameters() if p.grad is not None]}
    saved = {}

    def pack(t):
        key = t.untyped_storage()._cdata
        if key not in own and key not in saved:
            cast = getattr(t, "weight_cast", False) or getattr(t._base, "weight_cast", False)
            saved[key] = (t.untyped_storage().nbytes(), t.dim() >= 2 and t.shape[-1] == cfg.vocab_size, cast)
        return t

    autocast = AutocastOnMeta(None if dtype == torch.float32 else dtype)
    live = LiveBytes(own)
    with live, autocast, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, loss = model(x, x)      # train.py keeps only the loss
        acts = sum(n for n, _, cast in saved.values() if not cast)
        logits = sum(n for n, is_logits, _ in saved.values() if is_logits)
        cast_bytes = sum(n for n, _, cast in saved.values() if cast)
        loss.backward()
    return {"activations": acts, "logits": logits, "weight_casts": cast_bytes, "iteration_peak": live.peak}


def plan(settings, world_size, gpu_bytes, reserve_bytes, micro_batch=None, fsdp=False):
    """The per-GPU memory of one iteration of these train.py settings (see the module docstring)."""
    cfg = model_config(settings)
    dtype = torch.float32 if settings["dtype"] == "float32" else torch.bfloat16   # "auto" is bf16 on CUDA
    with torch.device("meta"):
        model = build_model(cfg)
    sizes = [p.numel() for p in model.parameters()]
    P = sum(sizes)
    it = count_iteration(cfg, micro_batch or settings["batch_size"], dtype)
    state = 16 * P
    if fsdp:   # train.py's sharding: the state sharded, plus what is held unsharded at once: the root, and HRM's and
        # UniTF's shared blocks (they run M times) or a Transformer's running block and the next, prefetched, in bf16
        # (MixedPrecisionPolicy: these replace autocast's copies in the peak); and the largest unit's float32
        # gradient, whole until it is reduce-scattered
        units = [sum(p.numel() for p in u.parameters()) for u in shard_units(model)]
        root = P - sum(units)
        held = root + (2 * max(units) if cfg.arch == "transformer" else sum(units))
        state = state / world_size + held * (4 if dtype == torch.float32 else 2) + max(units + [root]) * 4
        it["iteration_peak"] -= it["weight_casts"]
    total = state + it["iteration_peak"] + reserve_bytes
    # the host, per rank: a save of the resume state writes each tensor of the rank's shards in turn (the largest, a
    # float32 weight or AdamW moment, at a time); the meta-device build draws the largest weight on the CPU at start-up
    return {"params": P, "state": state, **it, "total": total, "fits": total <= gpu_bytes,
            "host_save": 4 * max(sizes) / (world_size if fsdp else 1), "host_start": 4 * max(sizes)}


def largest_fit(settings, world_size, gpu, reserve, fsdp, rows):
    """The largest micro-batch that fits and keeps the global batch (a divisor of the sequences each GPU sees per
    iteration), or None; and those sequences. rows caches plan() by (mode, micro-batch)."""
    seqs = settings["batch_size"] * settings["gradient_accumulation_steps"]
    per_gpu = seqs // world_size
    if seqs % world_size or not per_gpu:
        raise UserError(f"batch_size x gradient_accumulation_steps = {seqs} is not divisible by "
                        f"world_size={world_size}")
    for b in (b for b in range(per_gpu, 0, -1) if per_gpu % b == 0):
        key = ("fsdp" if fsdp else "ddp", b)
        rows[key] = rows.get(key) or plan(settings, world_size, gpu, reserve, b, fsdp)
        if rows[key]["total"] <= gpu:
            return b, per_gpu
    return None, per_gpu


def report(path, settings, world_size, gpu_gb, reserve_gb):
    gpu, reserve = gpu_gb * GB, reserve_gb * GB
    b = settings["batch_size"]
    rows = {(mode, b): plan(settings, world_size, gpu, reserve, b, mode == "fsdp") for mode in ("ddp", "fsdp")}
    ddp, fsdp = rows["ddp", b], rows["fsdp", b]
    print(f"{path}: {settings['arch']} d={settings['n_embd']}, {ddp['params'] / 1e6:.0f}M params, micro-batch {b} x "
          f"{settings['block_size']} tokens, {'bfloat16' if settings['dtype'] == 'auto' else settings['dtype']}, "
          f"world size {world_size}, {gpu_gb:g} GB per GPU ({reserve_gb:g} reserved)")
    print(f"  {'':5} {'state':>7} {'activ.':>7} {'logits':>7} {'casts':>7} {'peak':>7} {'total':>7}  GB")
    for mode, r in (("ddp", ddp), ("fsdp", fsdp)):
        cols = ("state", "activations", "logits", "weight_casts", "iteration_peak", "total")
        print(f"  {mode:5} " + " ".join(f"{r[c] / GB:7.1f}" for c in cols) +
              f"  {'fits' if r['total'] <= gpu else 'DOES NOT FIT'}")
    print(f"  host per rank: {ddp['host_save'] / GB:.1f} GB (ddp), {fsdp['host_save'] / GB:.1f} GB (fsdp) by each "
          f"save of the resume state (a tensor at a time); {ddp['host_start'] / GB:.1f} GB at start-up (the largest "
          f"weight, drawn on the CPU)")
    print("  (state: weights, grads, AdamW; activ.: saved for backward, logits the part of it that is logits; casts: "
          "autocast's bf16 weight copies; peak: the most the iteration holds at once beyond state, activations "
          "included; total = state + peak + reserved. It predicts allocated memory: torch.cuda.max_memory_allocated)")
    for mode in ("ddp", "fsdp"):
        best, per_gpu = largest_fit(settings, world_size, gpu, reserve, mode == "fsdp", rows)
        if best is None:
            print(f"  {mode}: no micro-batch fits")
            continue
        flags = (" --fsdp=True" if mode == "fsdp" else "") + (
            "" if best == b else f" --batch_size={best} --gradient_accumulation_steps={per_gpu // best * world_size}")
        print(f"  {mode}: largest micro-batch that fits: {best}   "
              f"torchrun --standalone --nproc_per_node={world_size} train.py {path}{flags}")


def markdown(paths, world_size, gpu_gbs, reserve_gb):
    """README's "Will it fit?" table: one row per config, per GPU size what runs: "DDP" (the config as it is),
    "DDP micro-batch b" (--batch_size=b, gradient_accumulation_steps raised to keep the global batch), "FSDP"."""
    print("| config | params | DDP GB/GPU | FSDP GB/GPU | " + " | ".join(f"{g:g} GB" for g in gpu_gbs) + " |")
    print("|---|---|---|---|" + "---|" * len(gpu_gbs))
    for path in paths:
        settings = train_settings([path])
        b, rows, cells = settings["batch_size"], {}, []
        for gpu_gb in gpu_gbs:
            opts = []
            for fsdp in (False, True):
                best, _ = largest_fit(settings, world_size, gpu_gb * GB, reserve_gb * GB, fsdp, rows)
                if best is not None:
                    opts.append(("FSDP" if fsdp else "DDP") + ("" if best == b else f" micro-batch {best}"))
                if best == b:
                    break   # the plain run fits: nothing more to say
            cells.append(" or ".join(opts) or "no fit")
        ddp, fsdp = (rows.get((m, b)) or plan(settings, world_size, 0, reserve_gb * GB, b, m == "fsdp")
                     for m in ("ddp", "fsdp"))   # b is not planned where a larger micro-batch fits
        print(f"| {os.path.basename(path)} | {ddp['params'] / 1e6:.0f}M | {ddp['total'] / GB:.1f} | "
              f"{fsdp['total'] / GB:.1f} | " + " | ".join(cells) + " |", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="plan.py", description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("configs", nargs="+", help="train.py config files (each planned at its own sizes)")
    ap.add_argument("--gpu_mem_gb", type=float, default=80.0, help="memory of one GPU, GB (1e9 bytes)")
    ap.add_argument("--reserve_gb", type=float, default=2.0, help="kept back for the CUDA context and workspaces")
    ap.add_argument("--world_size", type=int, default=6, help="GPUs (the paper: 6)")
    ap.add_argument("--markdown", default=None, help="comma-separated GPU sizes in GB (e.g. 80,96): one table row "
                    "per config instead (README's 'Will it fit?')")
    args, overrides = ap.parse_known_args(argv)
    if bad := [o for o in overrides if not o.startswith("--")]:
        raise UserError(f"unexpected arguments {bad}")
    if args.world_size < 1 or not 0 < args.gpu_mem_gb < math.inf or not 0 <= args.reserve_gb < math.inf:
        raise UserError("--world_size >= 1, --gpu_mem_gb > 0 and --reserve_gb >= 0, each finite")
    try:   # a UserError (a config's), or a ValueError of model.py's checks or of --markdown's numbers
        if args.markdown:
            gpu_gbs = [float(g) for g in args.markdown.split(",")]
            return markdown(args.configs, args.world_size, gpu_gbs, args.reserve_gb)
        for path in args.configs:
            report(path, train_settings([path] + overrides), args.world_size, args.gpu_mem_gb, args.reserve_gb)
    except ValueError as e:
        raise UserError(str(e)) from None


if __name__ == "__main__":
    signals.main(main)
