"""
Cached decoding (docs/MODEL.md section 5), which the paper sizes (Eq. kv_hrm) but never built: a preallocated
KV cache and the sampling loop, in the manner of nanochat's engine.py and gpt-fast (positions passed explicitly).

A shared block sees a different input at every step, so every block *application* keeps its own keys and
values: 1 + S M + S N slots for HRM, L for the Transformer, M for UniTF. Each model names the application its
attention runs in (model.py: the layer l, UniTF's step i - 1, HRM's ("I",), ("L", s, i), ("H", s, j);
applications() lists them) and the attention writes that slot at the position it is given, pos
(CausalSelfAttention.forward): the caller says where
its tokens are, model(idx, cache=cache, pos=pos), and nothing in the cache counts them. Since each step's
attention reads only the same step's keys at earlier positions, cached logits equal the full forward's.
"""

import torch
import torch.nn.functional as F

# Cache policies (--kv of sample.py, bench.py and analyze.py; docs/MODEL.md section 5). Only `full` is exact: the
# others let several applications share one slot, so a past token's keys and values there are those of the
# last application that wrote them (Huginn's "latest" lookup), where the full forward would use its own step's.
# The new token's own keys and values are always its step's: a prompt's prefill is exact under every policy.
KV_POLICIES = {
    "full": "one slot per block application (exact: equals the full forward)",
    "last": "HRM: 3 slots (input block, every Fast step, every Slow firing); UniTF: 1 slot (approximate)",
    "fired": "HRM: N + 2 slots (input block, the Fast steps of each Slow firing, every Slow firing) (approximate)",
}


def applications(model):
    """Every attending block application of one forward, in their numbered order, by the name the model's forward
    gives its cache slot: the input block, each pass's attending Fast steps, each pass's Slow firings for HRM
    (1 + S k + S N, Eq. kv_hrm, k = M attending Fast steps in the paper), the L layers, UniTF's M steps."""
    c = model.config
    if c.arch != "hrm":
        return list(range(c.n_layer if c.arch == "transformer" else c.M))
    slow = [] if c.fast_only else [("H", s, j) for s in range(c.S) for j in range(1, c.N + 1)]
    return [("I",)] + [("L", s, i) for s in range(c.S) for i in model.attending] + slow


def n_cache_apps(model):
    """How many attending block applications one forward makes (the exact cache's slots)."""
    return len(applications(model))


def cache_slots(model, kv="full"):
    """The storage slot of each block application (in applications()' order) under policy kv: a list, slots
    numbered from 0 in order of first use. ValueError where the policy does not apply."""
    if kv not in KV_POLICIES:
        raise ValueError(f"--kv={kv!r}: choose from {', '.join(KV_POLICIES)}")
    apps, arch = applications(model), model.config.arch
    n = len(apps)
    if kv == "full":
        return list(range(n))
    if arch == "transformer" or (kv == "fired" and arch != "hrm"):
        raise ValueError(f"--kv={kv} does not apply to {arch} (its policies: "
                         f"{'full' if arch == 'transformer' else 'full, last'}): "
                         f"{'its blocks have their own weights' if arch == 'transformer' else 'it has no Slow firings'}")
    if arch == "unitf":
        return [0] * n
    # HRM: a key per application (under fired, a Fast step's is its Slow period), then keys numbered in order
    key = [("L", (a[2] - 1) // model.config.T) if a[0] == "L" and kv == "fired" else a[0] for a in apps]
    order = list(dict.fromkeys(key))
    return [order.index(k) for k in key]


class KVCache:
    """Preallocated keys and values: the application named `slot` writes and reads storage slot slots[slot]
    ({application: slot}, cache_slots: one each under the exact policy, shared under the others), position by
    position."""

    def __init__(self, slots, batch_size, n_head, max_len, head_dim, device, dtype):
        self.slots = slots
        shape = (max(slots.values()) + 1, batch_size, n_head, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.k_slots, self.v_slots = self.k.unbind(0), self.v.unbind(0)  # views, made once: decoding is op-bound
        self.max_len = max_len

    def update(self, slot, pos, k, v):
        """Write keys/values (B, H, t, hd) of positions pos..pos+t for one application; return what attention reads
        (attend): at pos 0 the new ones themselves, else its positions 0..pos+t, in the new ones' dtype."""
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
    """KVCache with fixed shapes, for CUDA graphs (compile's "reduce-overhead"; gpt-fast's decoding): the positions
    are a tensor on the device (position()), so nothing in a step reads them on the host, and attention reads every slot's whole
    preallocated length with a mask where KVCache reads its written prefix. The same logits, up to the order
    of float sums over the masked length (tests/test_decoding.py)."""

    def __init__(self, *args):
        super().__init__(*args)
        dev = self.k.device
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)   # a one-token step's position, set in place
        self.steps = torch.arange(self.max_len, device=dev)         # a forward's offsets; the keys' positions
        self.mask1 = torch.zeros(1, self.max_len, dtype=torch.bool, device=dev)   # that step's mask, in place
        self.at, self.mask = self.pos, self.mask1   # position()'s positions (t,) and (t, max_len) mask for the
        # forward at hand: made once per forward, not once per block application (17 of them a token for HRM NT=12)
        import torch._dynamo as dynamo   # here, not at the top: only a fixed-shape cache pays for importing it
        for t in (self.k, self.v, *self.k_slots, *self.v_slots, self.pos, self.mask1):
            # a CUDA graph may write in place only inputs whose address never changes (as with module buffers,
            # where gpt-fast keeps its cache); else Inductor skips the graph ("mutated inputs")
            dynamo.mark_static_address(t)

    def update(self, slot, at, k, v):
        """Write keys/values (B, H, t, hd) at positions at (t,) for one application; return its whole length and
        the (t, max_len) mask of what each of the t positions may see: itself and every earlier position (made
        by position(), which gave at)."""
        if at is not self.at:   # the mask is the latest position()'s: another forward's positions would misread it
            raise ValueError("pass the positions engine.position() made for this forward, last (the mask is theirs)")
        k_slot, v_slot = self.k_slots[self.slots[slot]], self.v_slots[self.slots[slot]]
        k_slot.index_copy_(2, at, k.to(k_slot.dtype))
        v_slot.index_copy_(2, at, v.to(v_slot.dtype))
        return k_slot.to(k.dtype), v_slot.to(k.dtype), self.mask


class GrowingCache:
    """A policy's cache for training through it (teacher_forced): every write makes new tensors (torch.cat) where
    KVCache writes in place, which autograd cannot differentiate through once the slot is read again. What it
    holds, and so what attention reads, is KVCache's under the same policy."""

    max_len = float("inf")

    def __init__(self, slots):
        self.slots, self.k, self.v = slots, {}, {}

    def update(self, slot, pos, k, v):
        s, new_k, new_v = self.slots[slot], k, v
        if pos:   # positions 0..pos-1 as last written; the new ones replace whatever stood at pos.. before
            k, v = torch.cat([self.k[s][:, :, :pos], k], 2), torch.cat([self.v[s][:, :, :pos], v], 2)
        self.k[s], self.v[s] = k, v
        return attend(k, v, pos, new_k, new_v)


def attend(k, v, pos, new_k, new_v):
    """What an attention over t new tokens at positions pos.. reads from a cache holding k, v (positions 0..pos+t),
    as (keys, values, mask): at pos 0 the new keys and values alone, causal among themselves (mask None); one new
    token sees every position (mask None); a chunk of t sees positions up to its own (the offset causal mask)."""
    t = new_k.size(2)
    if pos == 0:
        return new_k, new_v, None
    if k.dtype != new_k.dtype:
        k, v = k.to(new_k.dtype), v.to(new_k.dtype)
    return k, v, None if t == 1 else torch.ones(t, pos + t, dtype=torch.bool, device=k.device).tril(pos)


def token_by_token(model, idx, cache):
    """Logits (B, n, vocab) of idx (B, n) fed one token at a time against an empty cache, positions 0..n-1: what
    a sampler computes for each position."""
    return torch.cat([model(idx[:, t:t + 1], cache=cache, pos=t)[0] for t in range(idx.size(1))], dim=1)


def teacher_forced(model, idx, kv):
    """Logits (B, n, vocab) of idx (B, n) decoded token by token under cache policy kv, with gradients: training
    with the attention pattern the model will decode with (train.py's train_kv; Huginn's remedy for a shared
    cache). Under kv="full" it equals model(idx), gradients included, at n times the Python overhead."""
    return token_by_token(model, idx, GrowingCache(slot_of(model, kv)))


def kv_cache_bytes(model, seq_len, batch_size=1, dtype=torch.float32, kv="full"):
    """Size of a KV cache: 2 * slots * n * d * bytes per sequence (docs/MODEL.md section 5); under the exact
    policy the slots are the applications (Eq. kv_hrm)."""
    nbytes = torch.tensor([], dtype=dtype).element_size()
    return 2 * (max(cache_slots(model, kv)) + 1) * seq_len * model.config.n_embd * nbytes * batch_size


def new_cache(model, batch_size, max_len=None, dtype=None, kv="full", static=False):
    """An empty cache under policy kv, preallocated for max_len (default block_size) positions of every slot;
    static: a StaticKVCache, which the model reads when pos is a tensor (see position)."""
    c = model.config
    max_len = c.block_size if max_len is None else min(max_len, c.block_size)
    if dtype is None:
        dev = model.wte.weight.device.type
        dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else model.wte.weight.dtype
    return (StaticKVCache if static else KVCache)(slot_of(model, kv), batch_size, c.n_head, max_len,
                                                  c.n_embd // c.n_head, model.wte.weight.device, dtype)


def slot_of(model, kv="full"):
    """{application name: storage slot} under policy kv (what a cache looks each attention's slot up in)."""
    return dict(zip(applications(model), cache_slots(model, kv)))


def position(cache, pos, t=1):
    """The pos argument of a forward of t tokens against cache: for a StaticKVCache, the t positions as a tensor
    on the device, and beside them on the cache the mask its attention reads, made here once for the whole
    forward. A one-token step sets both in place (kernels with pos as their argument: no copy from the host to
    wait for, no new address), after the check KVCache.update makes, which the device could not make without a
    sync. Else the int."""
    if not isinstance(cache, StaticKVCache):
        return pos
    if pos + t > cache.max_len:
        raise ValueError(f"KV cache full: {pos} + {t} > {cache.max_len}")
    cache.at = cache.pos.fill_(pos) if t == 1 else pos + cache.steps[:t]   # a prefill or chunk: new tensors, once
    cache.mask = torch.le(cache.steps, cache.at[:, None], out=cache.mask1 if t == 1 else None)
    return cache.at


@torch.no_grad()
def stream(model, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, kv="full", static=False):
    """Sample max_new_tokens after idx (B, t), as nanoGPT does, yielding each new token (B, 1) as soon as it is
    drawn; temperature=0 is greedy.

    With use_cache, every block application decodes against its own preallocated cache (RoPE offset by the
    cache length). When the context outgrows block_size it is cropped to the last block_size tokens, which
    moves every position, so the cache is rebuilt from the cropped context: from then on each token costs a
    full forward, and the output stays identical to use_cache=False. static: decode with a StaticKVCache
    (fixed shapes, positions on the device: what CUDA graphs need).
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    bs = model.config.block_size
    cache = new_cache(model, idx.size(0), idx.size(1) + max_new_tokens, kv=kv, static=static) if use_cache else None
    next_input, pos = idx[:, -bs:], 0  # what the next forward must process, and its first position
    for _ in range(max_new_tokens):
        if cache is not None and pos + next_input.size(1) > cache.max_len:
            next_input, pos = idx[:, -bs:], 0   # rebuild from the cropped context
        logits, _ = model(next_input, cache=cache, pos=position(cache, pos, next_input.size(1)), last_only=True)
        pos = pos + next_input.size(1) if cache is not None else 0   # no cache: every forward starts at 0
        logits = logits[:, -1, :].float()
        if temperature == 0:
            idx_next = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))   # no boolean index, no host index:
                logits = logits.masked_fill(logits < v[:, -1:], -float("inf"))   # nothing waits for the GPU
            idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
        idx = torch.cat((idx, idx_next), dim=1)
        next_input = idx_next if cache is not None else idx[:, -bs:]
        yield idx_next


def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, kv="full", static=False):
    """idx (B, t) followed by max_new_tokens sampled tokens (see stream)."""
    return torch.cat([idx, *stream(model, idx, max_new_tokens, temperature, top_k, use_cache, kv, static)], dim=1)
