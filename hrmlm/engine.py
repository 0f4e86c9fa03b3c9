"""
Cached decoding (docs/MODEL.md section 5), which the paper sizes (Eq. kv_hrm) but never built: a preallocated
KV cache and the sampling loop, in the manner of nanochat's engine.py and gpt-fast (positions passed explicitly).
A shared block sees a different input at every step, so each block *application* (applications()) keeps its own
keys and values, written at the position its caller gives (model(idx, cache=cache, pos=pos)): cached logits equal
the full forward's.
"""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from hrmlm.signals import UserError

# Cache policies (--kv of sample.py, bench.py and analyze.py). Only `full` is exact: the others let applications
# share a slot, where a past token's keys and values are the last writer's (Huginn's "latest" lookup), not its own
# step's. The new token's own are always its step's: a prompt's prefill is exact under every policy.
KV_POLICIES = {
    "full": "one slot per block application (exact: equals the full forward)",
    "last": "HRM: 3 slots (input block, every Fast step, every Slow firing); UniTF: 1 slot (approximate)",
    "fired": "HRM: N + 2 slots (input block, the Fast steps of each Slow firing, every Slow firing) (approximate)",
}


# Every decoding forward here attends without cuDNN's kernel, scoped (nothing global changes): it builds a graph per
# new sequence length, i.e. per decoded token (a 6.3x slower first pass on an H200, docs/BENCHMARKS.md)
DECODE_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def applications(model):
    """Every attending block application of one forward, in order, named as the model's forward names its slot:
    HRM's ("I",), ("L", s, i), ("H", s, j) (1 + S k + S N, Eq. kv_hrm), the L layers, UniTF's M steps."""
    c = model.config
    if c.arch != "hrm":
        return list(range(c.n_layer if c.arch == "transformer" else c.M))
    slow = [] if c.fast_only else [("H", s, j) for s in range(c.S) for j in range(1, c.N + 1)]
    return [("I",)] + [("L", s, i) for s in range(c.S) for i in model.attending] + slow


def cache_slots(model, kv="full"):
    """The storage slot of each application under policy kv, numbered in order of first use; ValueError where the
    policy does not apply."""
    if kv not in KV_POLICIES:
        raise UserError(f"--kv={kv!r}: choose from {', '.join(KV_POLICIES)}")
    apps, arch = applications(model), model.config.arch
    if kv == "full":
        return list(range(len(apps)))
    if arch == "transformer" or (kv == "fired" and arch != "hrm"):
        ok, why = (("full", "its blocks have their own weights") if arch == "transformer"
                   else ("full, last", "it has no Slow firings"))
        raise UserError(f"--kv={kv} does not apply to {arch} (its policies: {ok}): {why}")
    # UniTF: one slot; HRM: a slot per kind of application (under fired, a Fast step's is its Slow period)
    key = [0 if arch == "unitf" else ("L", (a[2] - 1) // model.config.T) if a[0] == "L" and kv == "fired" else a[0]
           for a in apps]
    order = list(dict.fromkeys(key))
    return [order.index(k) for k in key]


class KVCache:
    """Preallocated keys and values: application `slot` writes and reads storage slot slots[slot]."""

    def __init__(self, slots, batch_size, n_head, max_len, head_dim, device, dtype):
        self.slots, self.max_len = slots, max_len
        shape = (max(slots.values()) + 1, batch_size, n_head, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.k_slots, self.v_slots = self.k.unbind(0), self.v.unbind(0)  # views, made once: decoding is op-bound

    def update(self, slot, pos, k, v):
        """Write keys/values (B, H, t, hd) at positions pos..pos+t; return what attention reads (attend)."""
        t = k.size(2)
        if pos + t > self.max_len:
            raise ValueError(f"KV cache full: {pos} + {t} > {self.max_len}")
        k_slot, v_slot = self.k_slots[self.slots[slot]], self.v_slots[self.slots[slot]]
        k_slot.narrow(2, pos, t).copy_(k)  # copy_ converts to the cache's dtype
        v_slot.narrow(2, pos, t).copy_(v)
        return attend(k_slot.narrow(2, 0, pos + t), v_slot.narrow(2, 0, pos + t), pos, k, v)

    def nbytes(self):
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


class StaticKVCache(KVCache):
    """KVCache with fixed shapes, for CUDA graphs (compile's "reduce-overhead"; gpt-fast's decoding): positions are
    a tensor on the device (position()), so no step reads them on the host, and attention reads every slot's whole
    length under a mask. The same logits, up to the order of float sums (tests/test_decoding.py)."""

    def __init__(self, *args):
        super().__init__(*args)
        dev = self.k.device
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)   # a one-token step's position, set in place
        self.steps = torch.arange(self.max_len, device=dev)         # a forward's offsets; the keys' positions
        self.mask1 = torch.zeros(1, self.max_len, dtype=torch.bool, device=dev)   # that step's mask, in place
        # position()'s positions and mask: made once per forward, not per application (17 a token for HRM NT=12)
        self.at, self.mask = self.pos, self.mask1
        import torch._dynamo as dynamo   # here, not at the top: only a fixed-shape cache pays for importing it
        for t in (self.k, self.v, *self.k_slots, *self.v_slots, self.pos, self.mask1):
            # CUDA graphs write in place only at fixed addresses (gpt-fast's cache is a buffer), else Inductor skips
            dynamo.mark_static_address(t)

    def update(self, slot, at, k, v):
        """Write keys/values at positions at (t,); return the slot's whole length and position()'s mask."""
        if at is not self.at:   # the mask is the latest position()'s: another forward's positions would misread it
            raise ValueError("pass the positions engine.position() made for this forward, last (the mask is theirs)")
        k_slot, v_slot = self.k_slots[self.slots[slot]], self.v_slots[self.slots[slot]]
        k_slot.index_copy_(2, at, k.to(k_slot.dtype))
        v_slot.index_copy_(2, at, v.to(v_slot.dtype))
        return k_slot.to(k.dtype), v_slot.to(k.dtype), self.mask


class GrowingCache:
    """KVCache's contents under a policy, for training through it (teacher_forced): every write makes new tensors
    (torch.cat), since autograd cannot differentiate through an in-place write to a slot read again."""

    def __init__(self, slots):
        self.slots, self.k, self.v = slots, {}, {}

    def update(self, slot, pos, k, v):
        s, new_k, new_v = self.slots[slot], k, v
        if pos:   # positions 0..pos-1 as last written; the new ones replace whatever stood at pos.. before
            k, v = torch.cat([self.k[s][:, :, :pos], k], 2), torch.cat([self.v[s][:, :, :pos], v], 2)
        self.k[s], self.v[s] = k, v
        return attend(k, v, pos, new_k, new_v)


def attend(k, v, pos, new_k, new_v):
    """(keys, values, mask) for t new tokens at pos.. against a cache holding positions 0..pos+t: at pos 0 the new
    ones alone, causal (mask None); one new token sees every position; a chunk, the offset causal mask."""
    t = new_k.size(2)
    if pos == 0:
        return new_k, new_v, None
    k, v = k.to(new_k.dtype), v.to(new_k.dtype)
    return k, v, None if t == 1 else torch.ones(t, pos + t, dtype=torch.bool, device=k.device).tril(pos)


def token_by_token(model, idx, cache):
    """Logits (B, n, vocab) of idx fed one token at a time against an empty cache: what a sampler computes."""
    with sdpa_kernel(DECODE_ATTENTION):
        return torch.cat([model(idx[:, t:t + 1], cache=cache, pos=t)[0] for t in range(idx.size(1))], dim=1)


def teacher_forced(model, idx, kv, targets=None):
    """token_by_token under policy kv, with gradients: training with the attention the model will decode with
    (train.py's train_kv; Huginn's remedy for a shared cache). kv="full" equals model(idx), gradients included.
    (logits, the final pass's CE or None without targets), as model(idx, targets) returns them."""
    logits = token_by_token(model, idx, GrowingCache(dict(zip(applications(model), cache_slots(model, kv)))))
    return logits, None if targets is None else model.cross_entropy(logits, targets)


def kv_cache_bytes(model, seq_len, batch_size=1, dtype=torch.float32, kv="full"):
    """2 * slots * n * d * bytes per sequence (docs/MODEL.md section 5; Eq. kv_hrm under the exact policy)."""
    nbytes = torch.tensor([], dtype=dtype).element_size()
    return 2 * (max(cache_slots(model, kv)) + 1) * seq_len * model.config.n_embd * nbytes * batch_size


def new_cache(model, batch_size, max_len=None, dtype=None, kv="full", static=False):
    """An empty cache under policy kv for max_len (at most block_size) positions; static: a StaticKVCache."""
    c, w = model.config, model.wte.weight
    max_len = c.block_size if max_len is None else min(max_len, c.block_size)
    if dtype is None:
        dtype = torch.get_autocast_dtype(w.device.type) if torch.is_autocast_enabled(w.device.type) else w.dtype
    return (StaticKVCache if static else KVCache)(dict(zip(applications(model), cache_slots(model, kv))), batch_size,
                                                  c.n_head, max_len, c.n_embd // c.n_head, w.device, dtype)


def position(cache, pos, t=1):
    """The pos argument of a forward of t tokens: for a StaticKVCache, the positions as a device tensor, with the
    mask its attention reads set on the cache, once per forward. A one-token step sets both in place (no host copy
    to wait for, no new address), after KVCache.update's check, which the device could not make without a sync."""
    if not isinstance(cache, StaticKVCache):
        return pos
    if pos + t > cache.max_len:
        raise ValueError(f"KV cache full: {pos} + {t} > {cache.max_len}")
    cache.at = cache.pos.fill_(pos) if t == 1 else pos + cache.steps[:t]   # a prefill or chunk: new tensors, once
    cache.mask = torch.le(cache.steps, cache.at[:, None], out=cache.mask1 if t == 1 else None)
    return cache.at


def probs(logits, temperature, top_k):
    """The distribution a token is drawn from (B, vocab): softmax(logits / temperature) over the top_k logits."""
    logits = logits.float() / temperature
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))   # no boolean index, no host index:
        logits = logits.masked_fill(logits < v[:, -1:], -float("inf"))   # nothing waits for the GPU
    return F.softmax(logits, dim=-1)


def draw(logits, temperature, top_k):
    """The next token (B, 1): the argmax at temperature 0, else a draw from probs()."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    return torch.multinomial(probs(logits, temperature, top_k), num_samples=1)


@torch.no_grad()
def stream(model, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, kv="full", static=False,
           draft_depth=0, draft_tokens=4, stats=None):
    """Sample max_new_tokens after idx (B, t) as nanoGPT does, yielding each token (B, 1) as it is drawn;
    temperature=0 is greedy. A context that outgrows block_size is cropped, which moves every position: the cache
    is rebuilt from it, each token then costs a full forward, and the output stays use_cache=False's.
    draft_depth > 0: self-speculative decoding (speculate()), the same tokens (greedy) or distribution (sampled)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if draft_depth:
        yield from speculate(model, idx, max_new_tokens, temperature, top_k, draft_depth, draft_tokens, stats)
        return
    bs = model.config.block_size
    cache = new_cache(model, idx.size(0), idx.size(1) + max_new_tokens, kv=kv, static=static) if use_cache else None
    next_input, pos = idx[:, -bs:], 0  # what the next forward must process, and its first position
    for _ in range(max_new_tokens):
        if cache is None or pos + next_input.size(1) > cache.max_len:
            next_input, pos = idx[:, -bs:], 0   # no cache, or rebuild it: the whole cropped context from 0
        with sdpa_kernel(DECODE_ATTENTION):   # per forward: the caller runs between tokens with its own
            logits, _ = model(next_input, cache=cache, pos=position(cache, pos, next_input.size(1)), last_only=True)
        pos += next_input.size(1)
        idx_next = draw(logits[:, -1, :], temperature, top_k)
        idx = torch.cat((idx, idx_next), dim=1)
        next_input = idx_next
        yield idx_next


def check_draft(model, draft_depth, draft_tokens, batch_size=1):
    """A UserError where speculate() cannot draft (a Transformer has no shallower self)."""
    c = model.trained_config
    full = c.N if c.arch == "hrm" else c.M
    if c.arch == "transformer" or not 1 <= draft_depth < full or draft_tokens < 1 or batch_size != 1:
        raise UserError("draft_depth: a Transformer has no shallower self (its blocks have their own weights)" if
                        c.arch == "transformer" else f"draft_depth must be 1..{full - 1} (below the trained depth "
                        f"{full}), draft_tokens >= 1, one sequence; got {draft_depth}, {draft_tokens}, {batch_size}")


def speculate(model, idx, max_new_tokens, temperature=1.0, top_k=None, draft_depth=1, draft_tokens=4, stats=None):
    """Self-speculative decoding of one sequence (docs/MODEL.md section 5): the model at draft_depth drafts up to
    draft_tokens tokens against the one exact cache, the trained depth checks them in one forward and keeps the
    longest prefix it agrees with (accept()) plus its own next token; a refused position is written over later.
    stats: the checks, drafted and accepted tokens are added to it."""
    check_draft(model, draft_depth, draft_tokens, idx.size(0))
    bs, stats = model.config.block_size, {} if stats is None else stats
    cache, out = new_cache(model, 1, bs), idx[:, -bs:]
    with sdpa_kernel(DECODE_ATTENTION):
        logits, _ = model(out, cache=cache, pos=0, last_only=True)
    pos, nxt, left = out.size(1), draw(logits[:, -1], temperature, top_k), max_new_tokens
    while left > 1 and pos < bs:   # nxt: drawn, not yet in the cache; the check's k + 1 positions fit from pos
        k, drafted, qs = min(draft_tokens, left - 1, bs - pos - 1), [], []
        with sdpa_kernel(DECODE_ATTENTION):
            model.set_depth(draft_depth)
            try:
                for j in range(k):
                    logits, _ = model(drafted[-1] if drafted else nxt, cache=cache, pos=pos + j, last_only=True)
                    qs.append(None if temperature == 0 else probs(logits[:, -1], temperature, top_k))
                    drafted.append(draw(logits[:, -1], temperature, top_k) if qs[-1] is None else
                                   torch.multinomial(qs[-1], num_samples=1))
            finally:
                model.set_depth(None)
            logits, _ = model(torch.cat([nxt, *drafted], dim=1), cache=cache, pos=pos)   # the check, full depth
        m, fix = accept(logits[0], drafted, qs, temperature, top_k)
        yield from (kept := [nxt, *drafted[:m]])
        out, left, pos, nxt = torch.cat([out, *kept], dim=1), left - m - 1, pos + m + 1, fix
        stats.update({key: stats.get(key, 0) + n for key, n in (("verifies", 1), ("drafted", k), ("accepted", m))})
    if left:   # one token left, or the cache is full: the rest as stream() makes it (cropped: a forward per token)
        yield nxt
        if left > 1:
            yield from stream(model, torch.cat([out, nxt], dim=1), left - 1, temperature, top_k)


def accept(logits, drafted, qs, temperature, top_k):
    """(how many drafts the trained depth keeps, its own next token (1, 1)) from its logits (k + 1, vocab). Greedy:
    the drafts that are its argmax. Sampled (Leviathan et al.): a draft x of q is kept with probability
    min(1, p(x) / q(x)), the first refused replaced by a draw from max(p - q, 0): every token is distributed as p."""
    for j, x in enumerate(drafted):
        if temperature == 0:
            if logits[j].argmax() != x[0, 0]:
                return j, logits[j].argmax().view(1, 1)
            continue
        p = probs(logits[j:j + 1], temperature, top_k)[0]
        q = qs[j][0]
        if torch.rand(()) * q[x[0, 0]] > p[x[0, 0]]:   # refused: u > p(x) / q(x)
            return j, torch.multinomial((p - q).clamp_min(0) + 1e-20 * (p > 0), num_samples=1).view(1, 1)
    return len(drafted), draw(logits[-1:], temperature, top_k)


def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, kv="full", static=False,
             draft_depth=0, draft_tokens=4, stats=None):
    """idx (B, t) followed by max_new_tokens sampled tokens (see stream)."""
    return torch.cat([idx, *stream(model, idx, max_new_tokens, temperature, top_k, use_cache, kv, static,
                                   draft_depth, draft_tokens, stats)], dim=1)
