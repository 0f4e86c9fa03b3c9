"""
The paper's HLRole analyses on a trained HRM checkpoint and real validation text.

    python tools/analyze.py --out_dir=out-shakespeare-hrm [--json=hlrole.json] [--batches=8]

(A) Slow-module ablation (Table "HLRole(A)"): val CE normally, and with the Slow module frozen at
    z_H0 for the whole forward (H_net's update replaced by the identity), and the difference.
(B, C) Step statistics for the first supervision pass (Table "HLRole(B-C)"): whether H fired, the mean
    Fast gate g, ||z_L||, ||z_H|| before and after the step, cos(z_H, z_L) after it, and how far z_H moved
    from its prototype, ||z_H - z_H0|| / ||z_H0||; per token vector, averaged over tokens. Plus the mean
    output-fusion weights (w_H, w_L, w_I). Steps are i = 1..M as in model.py (H fires when i % T == 0); the
    paper's table counts from 0.
(Alive) Is the recurrence working? The learned injection scales alpha_L, alpha_H and the val CE cost of switching
    the shared blocks off (alpha = 0, gates kept: each update keeps only g * z), the Fast block, the Slow block
    and both. alpha near 0 and a cost near 0: the model computes with its input block and fusion alone.

    python tools/analyze.py --out_dir=out-char-hrm --depth=0.5,1,2,4 [--json=depth.json]

--depth: depth at inference, for an HRM or a UniTF (not in the paper; recurrent models promise more depth at
test time than they were trained with). The same weights evaluated with each multiple of the trained depth:
for HRM with N' = f N Slow firings (T kept) and with T' = f T Fast steps per firing (N kept), for UniTF
with M' = f M steps; val CE for each.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repo root: model.py, hrmlm/
from hrmlm import signals  # noqa: E402

if __name__ == "__main__":   # first of all (torch takes seconds to import): a signal is one line, at once
    signals.guard("analyze.py")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from contextlib import contextmanager, nullcontext  # noqa: E402
from dataclasses import replace  # noqa: E402
from unittest import mock  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from hrmlm import engine  # noqa: E402
from hrmlm.checkpoint import CKPT_BEST, load_checkpoint, model_from_checkpoint  # noqa: E402
from hrmlm.common import (HelpFormatter, UserError, check_dataset, check_output_path, usable_device,  # noqa: E402
                          write_result)
from model import build_model  # noqa: E402


def load(out_dir, ckpt, device, archs=("hrm",), need="the HLRole analyses need an HRM"):
    """The model of out_dir's checkpoint `ckpt` (ckpt_last.dcp: the newest resume state) and its checkpoint dict;
    a UserError for a missing, truncated, unsafe or foreign file, for non-finite weights, and for another arch."""
    path = os.path.join(out_dir, ckpt)
    ck = load_checkpoint(path)
    model = model_from_checkpoint(ck, path)
    if model.config.arch not in archs:
        raise UserError(f"{path} is a {model.config.arch!r} model; {need}")
    return model.to(device).eval(), ck


def depth_table(model, batches, device, factors):
    """Val CE at each multiple of the trained depth: rows (what changed, N, T, M, CE). The same weights load into a
    model with other step counts (N, T for HRM; M for UniTF): nothing the state dict holds depends on them."""
    c, rows, hrm = model.config, [], model.config.arch == "hrm"
    variants = [(k, f) for k in ("N", "T") for f in factors if k == "N" or f != 1] if hrm else \
        [("M", f) for f in factors]
    try:   # every depth checked before any is run: fast_attn_steps beyond a smaller depth's M cannot be
        cfgs = [(w, replace(c, **{w: max(1, round(getattr(c, w) * f))}, **({"M": None} if hrm else {})))
                for w, f in variants]
    except ValueError as e:
        raise UserError(f"--depth={','.join(f'{f:g}' for f in factors)} asks for a depth this checkpoint cannot run "
                        f"({e})") from None
    for what, cfg in cfgs:
        m = build_model(cfg).to(next(model.parameters()).device).eval()
        m.load_state_dict(model.state_dict())
        rows.append({"varied": what, "N": m.config.N if hrm else None, "T": m.config.T if hrm else None,
                     "M": m.config.M, "depth": m.config.M / c.M, "ce": val_ce(m, batches, device)})
    return rows


@torch.no_grad()
def val_ce(model, batches, device, kv=None):
    """Val CE; under a cache policy kv, of token-by-token decoding: each position's logits from a one-token step
    against the cache (engine.py), as a sampler would compute them (under kv="full" the full forward's)."""
    losses = []
    for x, y in batches:
        x = x.to(device)
        logits = model(x)[0] if kv is None else \
            engine.token_by_token(model, x, engine.new_cache(model, x.size(0), max_len=x.size(1), kv=kv))
        losses.append(model.cross_entropy(logits, y.to(device)).item())
    return float(np.mean(losses))


decode_ce = val_ce   # decoding's val CE, with a kv (experiments/alive.py)


def kv_table(model, batches, device, policies, n_greedy=200, prompt=16):
    """For each cache policy: decoding's val CE, the greedy agreement with the exact cache (the share of
    n_greedy greedy tokens after each batch's first sequence's first `prompt` tokens that equal exact
    decoding's, position by position), the cache bytes per token, and cached greedy tok/s (batch 1)."""
    prompts = [x[:1, :prompt].to(device) for x, _ in batches]

    @torch.no_grad()
    def greedy(kv):
        return [engine.generate(model, p, n_greedy, temperature=0, kv=kv)[0, prompt:] for p in prompts]

    exact, rows = greedy("full"), []
    for kv in policies:
        t0 = time.perf_counter()
        tokens = greedy(kv)
        tok_s = n_greedy * len(prompts) / (time.perf_counter() - t0)
        rows.append({"kv": kv, "ce": val_ce(model, batches, device, kv),
                     "greedy_agree": float(np.mean([(a == b).float().mean().item() for a, b in zip(tokens, exact)])),
                     "kv_bytes_per_token": engine.kv_cache_bytes(model, 1, dtype=next(model.parameters()).dtype, kv=kv),
                     "cached_tok_s": tok_s})
    return rows


def val_batches(ck, data_dir, n_batches, batch_size, block_size):
    cfg = ck.get("config") or {}   # train.py's defaults where a checkpoint does not say
    data_dir, dataset = data_dir or cfg.get("data_dir", "data"), cfg.get("dataset", "shakespeare")
    try:   # present, whole uint16 tokens, as meta.json says
        meta = check_dataset(data_dir, dataset)
    except ValueError as e:
        raise UserError(f"{e} (or pass --data_dir)") from None
    path, trained = os.path.join(data_dir, dataset, "val.bin"), ck.get("meta") or {}   # older checkpoints: none
    vocab = lambda m: (m.get("tokenizer", "gpt2"), m.get("vocab_size"), m.get("chars"))  # noqa: E731
    if meta["vocab_size"] > ck["model_args"]["vocab_size"] or trained and vocab(trained) != vocab(meta):
        raise UserError(f"{os.path.dirname(path)} holds another vocabulary ({vocab(meta)[0]}, {meta['vocab_size']} "
                        f"tokens) than the checkpoint's ({ck['model_args']['vocab_size']} tokens): pass --data_dir "
                        f"with the dataset it was trained on")
    data = np.memmap(path, dtype=np.uint16, mode="r")
    if len(data) <= block_size + 1:
        raise UserError(f"{path} holds {len(data)} tokens, fewer than block_size {block_size}")
    starts = np.linspace(0, len(data) - block_size - 1, n_batches * batch_size).astype(np.int64)   # evenly spread
    w = torch.from_numpy(np.stack([data[s:s + block_size + 1] for s in starts]).astype(np.int64))
    return list(zip(w[:, :-1].split(batch_size), w[:, 1:].split(batch_size)))


@contextmanager
def slow_module_frozen(model):
    """z_H keeps its initial value z_H0 for the whole forward: H_net's update becomes the identity (fast_only has
    no H_net: z_H is z_H0 already)."""
    with nullcontext() if model.H_net is None else mock.patch.object(model.H_net, "forward", lambda z_H, *_: z_H):
        yield


@contextmanager
def blocks_off(model, modules=("L_net", "H_net")):
    """The shared blocks of the named modules switched off: alpha = 0 in Eq. lgate, so z <- g * z (the gate runs,
    the block's output is multiplied away). Restores each alpha after."""
    alphas = [getattr(model, n).alpha.detach() for n in modules if getattr(model, n) is not None]
    kept = [a.clone() for a in alphas]
    try:
        for a in alphas:
            a.zero_()
        yield
    finally:
        for a, k in zip(alphas, kept):
            a.copy_(k)


def alive(model, batches, device, ce):
    """alpha_L, alpha_H, and the val CE cost of each shared block off and of both (None: no Slow module)."""
    slow = model.H_net is not None
    r = {"alpha_L": model.L_net.alpha.item(), "alpha_H": model.H_net.alpha.item() if slow else None}
    for key, mods in (("off_L", ("L_net",)), ("off_H", ("H_net",)), ("off_both", ("L_net", "H_net"))):
        with blocks_off(model, mods):
            r[key] = val_ce(model, batches, device) - ce if slow or key != "off_H" else None
    return r


@contextmanager
def record_steps(model):
    """Every step of every pass, in order, as [i, fired, z_L, z_H_before, z_H_after], from forward hooks (the model
    carries no analysis code): L_net(z_L, z_H, x~, ...) of step i has z_H before the step as its second input;
    H_net's output, when it fires right after, is z_H after it."""
    steps, M = [], model.config.M

    def on_fast(module, args, z_L):
        steps.append([len(steps) % M + 1, False, z_L, args[1], args[1]])

    def on_slow(module, args, z_H):
        steps[-1][1], steps[-1][4] = True, z_H

    hooks = [model.L_net.register_forward_hook(on_fast)]
    if model.H_net is not None:
        hooks.append(model.H_net.register_forward_hook(on_slow))
    try:
        yield steps
    finally:
        for h in hooks:
            h.remove()


@torch.no_grad()
def step_stats(model, batches, device):
    """Per-step statistics of the first pass, averaged over the batches; and the mean fusion weights."""
    M, T, z_H0 = model.config.M, model.config.T, model.z_H0.float()
    keys = ("gate", "z_L_norm", "z_H_norm_before", "z_H_norm_after", "cos_zH_zL", "z_H_drift")
    norm = lambda z: z.float().norm(dim=-1).mean().item()  # noqa: E731   per token vector, averaged over tokens
    acc = np.zeros((M, len(keys)))
    gates, fusion_w = [], []   # this batch's L_net gate means; the fusion weights
    hooks = [model.L_net.gate.register_forward_hook(
                 lambda m, i, out: gates.append(torch.sigmoid(out.float()).mean().item())),
             model.fusion.register_forward_hook(
                 lambda m, i, out: fusion_w.append(out[1].float().mean(dim=(0, 1)).tolist()))]
    try:
        for x, _ in batches:
            gates.clear()
            with record_steps(model) as steps:
                model(x.to(device))
            for i, (g, (_, _, z_L, zb, za)) in enumerate(zip(gates, steps[:M])):   # pass 1
                z_L, za = z_L.float(), za.float()
                acc[i] += (g, norm(z_L), norm(zb), norm(za), F.cosine_similarity(za, z_L, dim=-1).mean().item(),
                           ((za - z_H0).norm(dim=-1) / z_H0.norm()).mean().item())
    finally:
        for h in hooks:
            h.remove()
    rows = [dict(step=i, h_fired=i % T == 0, **{k: float(acc[i - 1, j] / len(batches)) for j, k in enumerate(keys)})
            for i in range(1, M + 1)]
    w = np.mean(fusion_w, axis=0).tolist()
    return rows, {"w_H": w[0], "w_L": w[1], "w_I": w[2]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--out_dir", required=True, help="a train.py out_dir holding an HRM checkpoint")
    ap.add_argument("--ckpt", default=CKPT_BEST, help="which checkpoint in out_dir: ckpt.pt or ckpt_last.dcp")
    ap.add_argument("--data_dir", default=None, help="default: the data_dir the model was trained with")
    ap.add_argument("--batches", type=int, default=8, help="validation batches")
    ap.add_argument("--batch_size", type=int, default=1, help="sequences per batch (the paper: 8 x 1)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, ...")
    ap.add_argument("--json", default=None, help="write the numbers here")
    ap.add_argument("--depth", default=None, help="comma-separated multiples of the trained depth (e.g. "
                    "0.5,1,2,4): val CE at each, for an HRM or a UniTF, instead of the HLRole analyses")
    ap.add_argument("--kv", default=None, help="comma-separated KV cache policies (" + ", ".join(engine.KV_POLICIES) +
                    "; engine.py): token-by-token decoding's val CE under each, greedy agreement with the exact "
                    "cache, bytes per token and cached tok/s, for an HRM or a UniTF, instead of the HLRole analyses. "
                    "Every policy but full changes the output")
    args = ap.parse_args(argv)
    policies = [k.strip() for k in args.kv.split(",") if k.strip()] if args.kv is not None else None
    if policies is not None and (not policies or set(policies) - set(engine.KV_POLICIES)):
        raise UserError(f"--kv={args.kv!r}: give policies from {', '.join(engine.KV_POLICIES)}, e.g. full,last,fired")
    if policies is not None and args.depth:
        raise UserError("--kv and --depth are separate analyses; give one")
    try:
        factors = [float(f) for f in args.depth.split(",")] if args.depth else None
    except ValueError:
        factors = []
    if factors is not None and (not factors or not all(0 < f < 100 for f in factors)):
        raise UserError(f"--depth={args.depth!r}: give positive multiples of the trained depth, e.g. 0.5,1,2,4")
    # everything checkable before the work
    for key in ("batches", "batch_size"):
        if getattr(args, key) < 1:
            raise UserError(f"--{key} must be >= 1, got {getattr(args, key)}")
    args.device = usable_device(args.device)
    if args.json:   # a missing folder would lose the results at the very end
        check_output_path(args.json, "--json")
    table = policies or factors   # the row analyses of a recurrence: a table, and the rows as --json
    recurrent = ("hrm", "unitf"), ("cache policies are a recurrence's" if policies else
                                   "depth at inference needs a recurrent model, HRM or UniTF")
    model, ck = load(args.out_dir, args.ckpt, args.device, *(recurrent if table else ()))
    for kv in policies or []:
        try:
            engine.cache_slots(model, kv)
        except ValueError as e:   # the policy is not this model's
            raise UserError(str(e)) from None
    c, name, n_seq = model.config, os.path.basename(os.path.normpath(args.out_dir)), args.batches * args.batch_size
    batches = val_batches(ck, args.data_dir, args.batches, args.batch_size, c.block_size)
    if policies:
        rows = kv_table(model, batches, args.device, policies)
        print(f"## KV cache policies: {name} ({c.arch}, iter {ck['iter_num']}), {n_seq} validation sequences\n")
        print("| kv | decoding val CE | greedy agreement | KV bytes/token | cached tok/s |\n|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['kv']} | {r['ce']:.4f} | {r['greedy_agree']:.3f} | {r['kv_bytes_per_token']} | "
                  f"{r['cached_tok_s']:.0f} |")
    elif factors:
        rows = depth_table(model, batches, args.device, factors)
        print(f"## Depth at inference: {name} ({c.arch}, trained at M={c.M}), {n_seq} validation sequences\n")
        print("| varied | N | T | M | depth / trained | val CE |\n|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['varied']} | {r['N'] or '-'} | {r['T'] or '-'} | {r['M']} | {r['depth']:.2f} | "
                  f"{r['ce']:.4f} |")
    else:
        ce = val_ce(model, batches, args.device)
        with slow_module_frozen(model):
            ce_frozen = val_ce(model, batches, args.device)
        rows, fusion = step_stats(model, batches, args.device)
        live = alive(model, batches, args.device, ce)
        name, n_tok = f"HRM N={c.N}, T={c.T}, K={c.K}, S={c.S}, d={c.n_embd} ({name})", n_seq * c.block_size
        print(f"## HLRole(A): Slow-module ablation, {n_seq} validation sequences of {c.block_size} tokens ({n_tok} "
              f"tokens)\n")
        print("| model | CE (normal) | CE (H frozen) | ΔCE |\n|---|---|---|---|")
        print(f"| {name} | {ce:.3f} | {ce_frozen:.3f} | {ce_frozen - ce:+.3f} |\n")
        opt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731   None: no Slow module
        print(f"## Is the recurrence alive? (shared block off: its alpha = 0, the gates kept)\n\nalpha_L "
              f"{opt(live['alpha_L'], '.3f')}, alpha_H {opt(live['alpha_H'], '.3f')}; val CE with the Fast block off "
              f"{opt(live['off_L'], '+.4f')}, the Slow block off {opt(live['off_H'], '+.4f')}, both off "
              f"{opt(live['off_both'], '+.4f')}\n")
        print(f"## HLRole(B-C): step statistics, first pass (i = 1..{c.M}; H fires when i % {c.T} == 0)\n")
        print("| step | H? | gate | ‖z_L‖ | ‖z_H‖ before | ‖z_H‖ after | cos(z_H, z_L) | ‖z_H - z_H0‖/‖z_H0‖ |\n"
              "|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['step']} | {'✓' if r['h_fired'] else ''} | {r['gate']:.3f} | {r['z_L_norm']:.2f} | "
                  f"{r['z_H_norm_before']:.2f} | {r['z_H_norm_after']:.2f} | {r['cos_zH_zL']:.3f} | "
                  f"{r['z_H_drift']:.3f} |")
        print(f"\nmean output-fusion weights: w_H {fusion['w_H']:.3f}, w_L {fusion['w_L']:.3f}, "
              f"w_I {fusion['w_I']:.3f}")
    if args.json:
        out = {"model_args": ck["model_args"], "iter": ck["iter_num"], "rows": rows} if table else \
            {"model": name, "model_args": ck["model_args"], "iter": ck["iter_num"], "tokens": n_tok, "ce": ce,
             "ce_h_frozen": ce_frozen, "delta_ce": ce_frozen - ce, "steps": rows, "fusion": fusion, "alive": live}
        write_result(args.json, lambda f: json.dump(out, f, indent=1))   # whole or not at all
        print(f"wrote {args.json}")
    return rows


if __name__ == "__main__":
    signals.main(main)
