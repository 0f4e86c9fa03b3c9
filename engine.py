"""
Cached decoding (docs/MODEL.md section 5), which the paper sizes (Eq. kv_hrm) but never built: a preallocated
KV cache and the sampling loop, in the manner of nanochat's engine.py and gpt-fast (positions passed explicitly).

A shared block sees a different input at every step, so every block *application* keeps its own keys and
values: 1 + S M + S N slots for HRM, L for the Transformer, M for UniTF. Each model numbers its
applications (model.py: n_cache_apps, HRM.fast_cache_slot, HRM.slow_cache_slot) and its attention writes
the slot it is given at the position it is given, pos (CausalSelfAttention.forward): the caller says where
its tokens are, model(idx, cache=cache, pos=pos), and nothing in the cache counts them. Since each step's
attention reads only the same step's keys at earlier positions, cached logits equal the full forward's.
"""

import torch
import torch.nn.functional as F


class KVCache:
    """Preallocated keys and values, one slot per block application: slot `slot` holds the keys and
    values of application number `slot`, position by position."""

    def __init__(self, n_apps, batch_size, n_head, max_len, head_dim, device, dtype):
        shape = (n_apps, batch_size, n_head, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.k_slots, self.v_slots = self.k.unbind(0), self.v.unbind(0)  # views, made once: decoding is op-bound
        self.max_len = max_len

    def update(self, slot, pos, k, v):
        """Write keys/values (B, H, t, hd) of positions pos..pos+t for one application, return its 0..pos+t."""
        t = k.size(2)
        if pos + t > self.max_len:
            raise ValueError(f"KV cache full: {pos} + {t} > {self.max_len}")
        k_slot, v_slot = self.k_slots[slot], self.v_slots[slot]
        k_slot.narrow(2, pos, t).copy_(k)  # copy_ converts to the cache's dtype
        v_slot.narrow(2, pos, t).copy_(v)
        return k_slot.narrow(2, 0, pos + t), v_slot.narrow(2, 0, pos + t)

    def nbytes(self):
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


def kv_cache_bytes(model, seq_len, batch_size=1, dtype=torch.float32):
    """Size of a full KV cache: 2 * applications * n * d * bytes per sequence (docs/MODEL.md section 5)."""
    nbytes = torch.tensor([], dtype=dtype).element_size()
    return 2 * model.n_cache_apps() * seq_len * model.config.n_embd * nbytes * batch_size


def new_cache(model, batch_size, max_len=None, dtype=None):
    """An empty cache, preallocated for max_len (default block_size) positions of every application."""
    c = model.config
    max_len = c.block_size if max_len is None else min(max_len, c.block_size)
    if dtype is None:
        dev = model.wte.weight.device.type
        dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else model.wte.weight.dtype
    return KVCache(model.n_cache_apps(), batch_size, c.n_head, max_len, c.n_embd // c.n_head,
                   model.wte.weight.device, dtype)


@torch.no_grad()
def stream(model, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True):
    """Sample max_new_tokens after idx (B, t), as nanoGPT does, yielding each new token (B, 1) as soon as it is
    drawn; temperature=0 is greedy.

    With use_cache, every block application decodes against its own preallocated cache (RoPE offset by the
    cache length). When the context outgrows block_size it is cropped to the last block_size tokens, which
    moves every position, so the cache is rebuilt from the cropped context: from then on each token costs a
    full forward, and the output stays identical to use_cache=False.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    bs = model.config.block_size
    cache = new_cache(model, idx.size(0), max_len=idx.size(1) + max_new_tokens) if use_cache else None
    next_input, pos = idx[:, -bs:], 0  # what the next forward must process, and its first position
    for _ in range(max_new_tokens):
        if cache is not None and pos + next_input.size(1) > cache.max_len:
            next_input, pos = idx[:, -bs:], 0   # rebuild from the cropped context
        logits, _ = model(next_input, cache=cache, pos=pos, last_only=True)
        pos = pos + next_input.size(1) if cache is not None else 0   # no cache: every forward starts at 0
        logits = logits[:, -1, :].float()
        if temperature == 0:
            idx_next = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
        idx = torch.cat((idx, idx_next), dim=1)
        next_input = idx_next if cache is not None else idx[:, -bs:]
        yield idx_next


def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True):
    """idx (B, t) followed by max_new_tokens sampled tokens (see stream)."""
    return torch.cat([idx, *stream(model, idx, max_new_tokens, temperature, top_k, use_cache)], dim=1)
