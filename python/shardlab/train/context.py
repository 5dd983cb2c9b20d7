"""Context parallelism: ring attention over a ``context`` mesh axis, with the zig-zag layout
that balances causal attention.

The sequence of ``T`` tokens is cut into ``2C`` chunks of ``c = T / 2C`` for a context axis of
size ``C``; device ``i`` holds chunks ``i`` and ``2C-1-i`` (:func:`zigzag_order`), so under a
causal mask every device has the same amount of work. :func:`ring_attention` runs inside
``shard_map``: each of the ``C`` steps attends the local queries to the K/V block the device
holds, merges the result into the running ``(out, logsumexp)`` exactly (online softmax), and
``ppermute``-s K and V to the next device (``C-1`` hops of each per forward). Its gradient is
``shardlab.grad``'s: the transposes of the ppermutes run the ring backwards.

With the zig-zag layout, on step ``s`` device ``i`` holds the K/V of device ``j = i - s mod C``:

========  =====================================================  ==================
step      blocks computed (q chunk x kv chunk, c x c each)       skipped (future)
========  =====================================================  ==================
s = 0     (i, i) diagonal, (2C-1-i, i), (2C-1-i, 2C-1-i) diag.    (i, 2C-1-i)
j < i     (i, j), (2C-1-i, j)                                    (·, 2C-1-j)
j > i     (2C-1-i, j), (2C-1-i, 2C-1-j)                          (i, ·)
========  =====================================================  ==================

so a causal ring computes ``2C + 1`` of the ``4C`` blocks a non-causal one does
(:func:`causal_block_fraction`), and each K/V hop moves :func:`kv_hop_bytes`.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> from shardlab.train import context
    >>> context.zigzag_order(8, 2).tolist()
    [0, 1, 6, 7, 2, 3, 4, 5]
    >>> mesh = sl.make_mesh((2,), ("context",))
    >>> q = np.random.default_rng(0).standard_normal((1, 8, 2, 4)).astype(np.float32)
    >>> f = sl.shard_map(lambda q, k, v: context.ring_attention(q, k, v, "context", is_causal=True),
    ...                  mesh=mesh, in_specs=P(None, "context"), out_specs=P(None, "context"))
    >>> zq = sl.device_put(context.to_zigzag(q, 2), sl.NamedSharding(mesh, P(None, "context")))
    >>> out = context.from_zigzag(np.asarray(f(zq, zq, zq)), 2)
    >>> ref = sl.nn.dot_product_attention(q, q, q, is_causal=True)
    >>> bool(np.allclose(out, ref, atol=1e-5))
    True
"""

from __future__ import annotations

import numpy as np

import shardlab.numpy as jnp
from shardlab import LocalArray, lax
from shardlab.models.layers import apply_rotary, rotary_tables

__all__ = ["zigzag_order", "to_zigzag", "from_zigzag", "check_context", "ring_attention", "kv_hop_bytes",
           "ring_forward_bytes", "causal_block_fraction", "ring_attention_flops", "zigzag_positions",
           "rotary_zigzag"]

_NEG = np.float32(-1e30)  # the logsumexp of "no keys": exp(_NEG - finite) is exactly 0


def check_context(seq_len: int, n: int, axis="context", op: str = "ring_attention") -> int:
    """The chunk length ``seq_len / (2n)``; raises ValueError naming the sequence and the axis
    when the zig-zag layout cannot cut it."""
    if n < 1:
        raise ValueError(f"[{op}] the context axis {axis!r} has size {n}; it must be >= 1")
    if seq_len % (2 * n):
        raise ValueError(f"[{op}] sequence length {seq_len} is not divisible by 2 x the context axis {axis!r} "
                         f"of size {n} (= {2 * n}: the zig-zag layout cuts it into {2 * n} chunks); "
                         f"use a multiple of {2 * n}")
    return seq_len // (2 * n)


def zigzag_order(seq_len: int, n: int) -> np.ndarray:
    """Global token positions in the order the devices of a context axis of size ``n`` hold
    them: device ``i`` gets chunks ``i`` and ``2n-1-i`` of ``2n``.

    Example:
        >>> zigzag_order(12, 3).tolist()
        [0, 1, 10, 11, 2, 3, 8, 9, 4, 5, 6, 7]
    """
    c = check_context(seq_len, n, op="zigzag_order")
    chunks = [j for i in range(n) for j in (i, 2 * n - 1 - i)]
    return np.concatenate([np.arange(j * c, (j + 1) * c) for j in chunks]).astype(np.int32)


def to_zigzag(x, n: int, axis: int = 1) -> np.ndarray:
    """``x`` (numpy) with its sequence ``axis`` put in zig-zag order for ``n`` devices."""
    x = np.asarray(x)
    return np.take(x, zigzag_order(x.shape[axis], n), axis=axis)


def from_zigzag(x, n: int, axis: int = 1) -> np.ndarray:
    """The inverse of :func:`to_zigzag`."""
    x = np.asarray(x)
    return np.take(x, np.argsort(zigzag_order(x.shape[axis], n)), axis=axis)


def kv_hop_bytes(batch: int, seq_len: int, n: int, kv_heads: int, head_dim: int, itemsize: int) -> int:
    """Bytes one ppermute of a K (or V) block sends per device: ``B·(T/n)·K·H·bytes``."""
    return batch * (seq_len // n) * kv_heads * head_dim * itemsize


def ring_forward_bytes(batch: int, seq_len: int, n: int, kv_heads: int, head_dim: int, itemsize: int) -> int:
    """Bytes a device sends in one layer's forward ring: ``2·(n-1)`` hops of a K/V block
    (the backward pass sends the same again, around the reverse ring)."""
    return 2 * (n - 1) * kv_hop_bytes(batch, seq_len, n, kv_heads, head_dim, itemsize)


def causal_block_fraction(n: int) -> float:
    """Attention FLOPs of the causal zig-zag ring over the non-causal one: ``(2n+1) / 4n``
    (the diagonal blocks are computed whole, the future ones skipped)."""
    return (2 * n + 1) / (4 * n)


def ring_attention_flops(batch: int, seq_len: int, n: int, heads: int, head_dim: int, causal: bool = True) -> float:
    """Forward FLOPs of one device's ring (``QK^T`` and ``PV``): ``4·B·N·(T/n)·T·H``, times
    :func:`causal_block_fraction` when causal.

    Example:
        >>> ring_attention_flops(1, 8, 2, 1, 4, causal=False), ring_attention_flops(1, 8, 2, 1, 4)
        (512.0, 320.0)
    """
    full = 4.0 * batch * heads * (seq_len // n) * seq_len * head_dim
    return full * causal_block_fraction(n) if causal else full


# -- positions of tokens that are not contiguous -------------------------------------------------
def zigzag_positions(axis_name, local_len: int):
    """Inside ``shard_map``: the global positions ``[local_len]`` (int32) of this device's
    tokens under the zig-zag layout over ``axis_name``, from the device's axis index (no
    input array, so nothing for the backward pass to reduce)."""
    n = lax.axis_size(axis_name)
    c = local_len // 2
    me = lax.axis_index(axis_name)
    offsets = np.arange(c, dtype=np.int32)
    return jnp.concatenate([offsets + me * np.int32(c), offsets + (np.int32(2 * n - 1) - me) * np.int32(c)])


def rotary_zigzag(xs, cfg, axis_name) -> list:
    """Inside ``shard_map``: rotary embedding of each local x ``[B, T/C, heads, H]`` in ``xs``
    (e.g. ``(q, k)``, which share the tables) at the global positions of the zig-zag layout
    over ``axis_name``: the values ``shardlab.models.layers.rotary`` gives the whole sequence."""
    t = xs[0].shape[1]
    pos = zigzag_positions(axis_name, t)
    cos, sin = (jnp.take(lax.pcast(tab, axis_name, to="varying"), pos, axis=0)
                for tab in rotary_tables(cfg, np.arange(t * lax.axis_size(axis_name))))
    return [apply_rotary(x, cos, sin, cfg) for x in xs]


# -- the ring --------------------------------------------------------------------------------------
def _stop(x):
    """A constant for the gradient (the max shift of a softmax cancels exactly)."""
    return LocalArray(x.storage, x.mesh) if isinstance(x, LocalArray) else x


def _block(q, k, v, scale, mask=None):
    """Attention of q ``[B, cq, K, G, H]`` to k, v ``[B, ck, K, H]``: (out ``[B, K, G, cq, H]``
    float32 normalized over this block, logsumexp ``[B, K, G, cq, 1]``)."""
    s = jnp.einsum("bqkgh,bskh->bkgqs", q, k, preferred_element_type=np.float32) * np.float32(scale)
    if mask is not None:
        s = jnp.where(mask, s, _NEG)
    m = _stop(jnp.max(s, axis=-1, keepdims=True))
    p = jnp.exp(s - m)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    o = jnp.einsum("bkgqs,bskh->bkgqh", p.astype(v.dtype), v, preferred_element_type=np.float32)
    return o / denom, jnp.log(denom) + m


def _merge(a, b):
    """Two partial softmaxes over disjoint keys -> the softmax over both (exact)."""
    (oa, la), (ob, lb) = a, b
    m = _stop(jnp.maximum(la, lb))
    ea, eb = jnp.exp(la - m), jnp.exp(lb - m)
    total = ea + eb
    return (oa * ea + ob * eb) / total, jnp.log(total) + m


def _only_where(cond, part):
    """``part`` where ``cond`` holds, else a block with no keys (merging it changes nothing)."""
    o, lse = part
    return o, jnp.where(cond, lse, _NEG)


def _rotations(k, v, axis_name, n: int):
    """``(step, k, v)`` for each of the ``n`` steps of the ring: the K/V block this device holds
    at that step (``n - 1`` ppermutes of each, to the next device)."""
    ring = [(j, (j + 1) % n) for j in range(n)]
    yield 0, k, v
    for s in range(1, n):
        k, v = lax.ppermute(k, axis_name, ring), lax.ppermute(v, axis_name, ring)
        yield s, k, v


def ring_attention(q, k, v, axis_name, *, is_causal: bool = False, scale=None, layout: str = "zigzag"):
    """Attention of the local queries to the whole sequence split over ``axis_name``.

    Call inside ``shard_map``. Local shapes are JAX's: q ``[B, T/C, N, H]``, k and v
    ``[B, T/C, K, H]`` with ``N % K == 0`` (grouped-query attention). With ``is_causal`` the
    mask is the causal one of the global positions, which ``layout`` says: ``"zigzag"`` (the
    sequence in :func:`to_zigzag` order, balanced: future blocks are skipped) or
    ``"contiguous"`` (device ``i`` holds block ``i``, as a sequence-sharded prefill does:
    ``shardlab.serve.sharded.ring_attention``). Without it the order does not matter. Scores,
    softmax statistics and the merge are float32; the output has q's dtype.

    Args:
        q, k, v: the local blocks.
        axis_name: the context mesh axis.
        is_causal: query at position t attends to keys at positions <= t.
        scale: the score scale (default ``1/sqrt(H)``).
        layout: where the global positions sit, for ``is_causal``: "zigzag" or "contiguous".

    Returns:
        The local attention output ``[B, T/C, N, H]``.
    """
    op = "ring_attention"
    if layout not in ("zigzag", "contiguous"):
        raise ValueError(f"[{op}] layout {layout!r} must be 'zigzag' or 'contiguous'")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            raise ValueError(f"[{op}] {name} must be [batch, seq, heads, head_dim] locally, got shape "
                             f"{tuple(x.shape)}")
    B, T, N, H = q.shape
    K = k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[1] != T or k.shape[3] != H or N % K:
        raise ValueError(f"[{op}] local shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not "
                         f"fit: k and v must be [{B}, {T}, K, {H}] with K dividing {N}")
    try:
        n = lax.axis_size(axis_name)
    except NameError as e:  # say which call named the axis
        raise NameError(f"[ring_attention] {e}") from None
    scale = float(scale) if scale is not None else 1.0 / float(np.sqrt(H))
    qg = jnp.reshape(q, (B, T, K, N // K, H))
    if not is_causal:
        acc = None
        for _, kb, vb in _rotations(k, v, axis_name, n):
            y = _block(qg, kb, vb, scale)
            acc = y if acc is None else _merge(acc, y)
        o = acc[0]
    elif layout == "contiguous":
        me = lax.axis_index(axis_name)
        for s, kb, vb in _rotations(k, v, axis_name, n):
            if s == 0:   # the own block: the diagonal
                acc = _block(qg, kb, vb, scale, np.tril(np.ones((T, T), bool)))
            else:        # block i - s: in the past where i >= s, else in the future (wrapped round)
                acc = _merge(acc, _only_where(me >= s, _block(qg, kb, vb, scale)))
        o = acc[0]
    else:
        c = T // 2
        if T % 2:
            raise ValueError(f"[{op}] causal ring attention needs the zig-zag layout: the local sequence {T} "
                             f"must be two chunks of equal length")
        tril = np.tril(np.ones((c, c), bool))
        q1, q2 = qg[:, :c], qg[:, c:]
        me = lax.axis_index(axis_name)
        for s, kb, vb in _rotations(k, v, axis_name, n):
            if s == 0:   # own chunks i and 2C-1-i; (i, 2C-1-i) is in the future
                acc1 = _block(q1, kb[:, :c], vb[:, :c], scale, tril)
                acc2 = _block(q2, kb, vb, scale, np.concatenate([np.ones((c, c), bool), tril], axis=1))
                continue
            k1, v1 = kb[:, :c], vb[:, :c]
            acc2 = _merge(acc2, _block(q2, k1, v1, scale))  # chunk 2C-1-i sees chunk j in both cases
            early = me >= s  # the K/V came from j = i - s < i: chunk i sees chunk j, not 2C-1-j
            y = _block(jnp.where(early, q1, q2), jnp.where(early, k1, kb[:, c:]), jnp.where(early, v1, vb[:, c:]),
                       scale)
            acc1 = _merge(acc1, _only_where(early, y))
            acc2 = _merge(acc2, _only_where(jnp.logical_not(early), y))
        o = jnp.concatenate([acc1[0], acc2[0]], axis=3)
    o = jnp.transpose(o, (0, 3, 1, 2, 4))  # [B, T, K, G, H]
    return jnp.reshape(o, (B, T, N, H)).astype(q.dtype)
