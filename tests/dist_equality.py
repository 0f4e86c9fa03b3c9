"""Run by tests/test_distributed.py under torchrun (2 gloo ranks): for each architecture and option, the same
10 AdamW iterations in one process (every rank, locally) and sharded (FSDP2) or replicated (DDP) over the
ranks, as train.py sets them up: parallel.fully_shard_model (its MixedPrecisionPolicy) / parallel.wrap,
precision_context (autocast's weight cache on), 4 global micro-batches (2 per rank, gradients reduced on the last). Rank 0 prints
one JSON line per case: the worst relative gradient error per parameter at iterations 0 and 1 (None: the
parameter got no gradient) and the largest train-loss difference over the 10 iterations.

    torchrun --standalone --nproc_per_node=2 tests/dist_equality.py bfloat16
"""

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hrmlm import parallel  # noqa: E402
from hrmlm.common import precision_context  # noqa: E402
from model import ModelConfig, build_model  # noqa: E402

CASES = {"hrm": dict(arch="hrm", N=2, T=2, K=2), "hrm_fast_only": dict(arch="hrm", N=2, T=2, K=2, fast_only=True),
         "hrm_K_slow": dict(arch="hrm", N=2, T=2, K=1, K_slow=2), "hrm_grad_ckpt": dict(arch="hrm", N=2, T=2, K=2, grad_ckpt=True),
         "unitf": dict(arch="unitf", M=4, K=2), "transformer": dict(arch="transformer", n_layer=2)}
ITERS, MICRO, B, n, V = 10, 4, 2, 32, 80


def optimizer(params):
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=3e-3,
                             betas=(0.9, 0.95))


def batch(it, j):
    g = torch.Generator().manual_seed(1000 * it + j)
    x = torch.randint(0, V, (B, n + 1), generator=g)
    return x[:, :-1], x[:, 1:]


def grads(model):
    """Each parameter's whole gradient under one process's name (FSDP: gathered from the shards)."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        out[name] = None if g is None else g.reshape(-1)
    return out


def run_one_process(cfg, dtype):
    """One process's run (every micro-batch): its train loss at each iteration, its gradients at iterations 0, 1."""
    torch.manual_seed(0)
    ref = build_model(cfg)
    opt, ctx, losses, first = optimizer(list(ref.parameters())), precision_context("cpu", dtype), [], []
    for it in range(ITERS):
        loss_ref = 0.0
        for j in range(MICRO):
            with ctx:
                _, loss = ref(*batch(it, j))
            (loss / MICRO).backward()
            loss_ref += loss.item() / MICRO
        losses.append(loss_ref)
        if it < 2:
            first.append(grads(ref))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses, first


def run_case(cfg, mode, dtype, rank, world, reference):
    losses, first = reference
    torch.manual_seed(0)
    raw = build_model(cfg)
    if mode == "fsdp":
        parallel.fully_shard_model(raw, getattr(torch, dtype))
    params = list(raw.parameters())
    model = parallel.wrap(raw, "cpu", mode == "fsdp")
    opt, ctx = optimizer(params), precision_context("cpu", dtype)
    worst, loss_diff = {}, 0.0
    for it in range(ITERS):
        mine = torch.zeros(())
        for k in range(MICRO // world):                        # rank r: micro-batches r, r + W, ...
            parallel.sync_gradients(model, mode == "fsdp", last=k == MICRO // world - 1)
            with ctx:
                _, loss = model(*batch(it, rank + k * world))
            (loss / (MICRO // world)).backward()
            mine += loss.detach().float() / MICRO
        dist.all_reduce(mine)
        loss_diff = max(loss_diff, abs(mine.item() - losses[it]))
        if it < 2:
            a, b = first[it], grads(raw)
            for name, g in a.items():
                err = None if b[name] is None else ((b[name] - g).norm() / g.norm().clamp_min(1e-12)).item()
                worst[name] = None if err is None or worst.get(name, 0.0) is None else max(worst.get(name, 0.0), err)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"grad_rel_err": worst, "max_loss_diff": loss_diff}


def main():
    dtype = sys.argv[1]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for name, kw in CASES.items():
        cfg = ModelConfig(vocab_size=V, block_size=n, n_embd=32, n_head=4, **kw)
        reference = run_one_process(cfg, dtype)   # every rank, locally: once for both modes
        for mode in ("fsdp", "ddp"):
            out = run_case(cfg, mode, dtype, rank, world, reference)
            if rank == 0:
                print(json.dumps({"case": name, "mode": mode, **out}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
