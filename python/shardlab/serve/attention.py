"""Attention against a KV cache: rotary at arbitrary positions and grouped-query attention of a
few new queries over a fixed-size cache with a per-sequence length.

Everything is ``shardlab.numpy`` or numpy ufuncs, so the same functions run on plain arrays and
on per-device values inside ``shardlab.shard_map`` (where the two einsums land in the ledger).
``partial_attention`` returns the un-normalised output with its softmax statistics, so shards of
the key sequence can be merged exactly (``merge_partials``): sequence-sharded decoding and ring
attention are built from it.

Example:
    >>> import numpy as np
    >>> from shardlab.serve.attention import cached_attention
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((1, 1, 4, 8)).astype(np.float32)     # [B, T, N, H]
    >>> k = rng.standard_normal((1, 16, 2, 8)).astype(np.float32)    # [B, S, K, H]
    >>> o = cached_attention(q, k, k, q_pos=np.array([[5]]), kv_len=np.array([6]))
    >>> o.shape
    (1, 1, 4, 8)
"""

from __future__ import annotations

import numpy as np

import shardlab.numpy as jnp

__all__ = ["rotary_at", "cached_attention", "partial_attention", "merge_partials"]

_NEG = np.float32(-1e30)


def rotary_at(x, positions, rotary_dim: int, theta: float):
    """Rotary embedding ("rotate half", as ``shardlab.models.layers.rotary``) of x [B, T, heads, H]
    at integer ``positions`` [B, T] (each sequence may sit at a different offset)."""
    half = rotary_dim // 2
    inv = 1.0 / (theta ** (np.arange(half, dtype=np.float64) * 2.0 / rotary_dim))
    ang = np.asarray(positions, dtype=np.float64)[..., None] * inv  # [B, T, half]
    cos = np.cos(ang).astype(np.float32)[:, :, None, :]
    sin = np.sin(ang).astype(np.float32)[:, :, None, :]
    xf = x.astype(np.float32)
    x1, x2 = xf[..., :half], xf[..., half:rotary_dim]
    parts = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
    if rotary_dim < x.shape[-1]:
        parts.append(xf[..., rotary_dim:])
    return jnp.concatenate(parts, axis=-1).astype(x.dtype)


def _mask(q_pos, kv_len, key_pos):
    """[B, 1, 1, T, S] True where key s is visible to query t: s < kv_len and s <= q_pos."""
    kp = key_pos[None, None, :]                                  # [1, 1, S]
    ok = jnp.logical_and(kp < kv_len[:, None, None], kp <= q_pos[:, :, None])  # [B, T, S]
    return ok[:, None, None, :, :]


def partial_attention(q, k, v, q_pos, kv_len, key_pos):
    """Un-normalised attention of q [B, T, N, H] over keys k, v [B, S, K, H] at ``key_pos`` [S].

    Returns ``(num, m, l)``: ``num`` [B, K, G, T, H] = sum_s exp(score - m) v, the running max
    ``m`` and sum ``l`` [B, K, G, T, 1] (float32). A shard with no visible key has m = -1e30,
    l = 0 and contributes nothing to :func:`merge_partials`.
    """
    B, T, N, H = q.shape
    K = k.shape[2]
    qg = jnp.reshape(q.astype(np.float32) * np.float32(1.0 / np.sqrt(H)), (B, T, K, N // K, H))
    s = jnp.einsum("btkgh,bskh->bkgts", qg, k.astype(np.float32))
    s = jnp.where(_mask(q_pos, kv_len, key_pos), s, _NEG)
    m = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.where(s > np.float32(-1e29), jnp.exp(s - m), np.float32(0.0))
    l = jnp.sum(p, axis=-1, keepdims=True)
    num = jnp.einsum("bkgts,bskh->bkgth", p, v.astype(np.float32))
    return num, m, l


def merge_partials(parts):
    """Exact softmax merge of partials ``[(num, m, l), ...]`` over disjoint key sets; returns
    ``(num, m, l)`` of their union."""
    num, m, l = parts[0]
    for n2, m2, l2 in parts[1:]:
        mm = jnp.maximum(m, m2)
        a, b = jnp.exp(m - mm), jnp.exp(m2 - mm)
        num, l, m = num * a + n2 * b, l * a + l2 * b, mm
    return num, m, l


def finish(num, l, dtype):
    """[B, K, G, T, H] partial -> attention output [B, T, N, H] (zeros where nothing is visible)."""
    B, K, G, T, H = num.shape
    o = num / jnp.maximum(l, np.float32(1e-30))
    return jnp.reshape(jnp.transpose(o, (0, 3, 1, 2, 4)), (B, T, K * G, H)).astype(dtype)


def cached_attention(q, k, v, q_pos, kv_len):
    """softmax(q k^T / sqrt(H)) v for queries at ``q_pos`` [B, T] over the first ``kv_len`` [B]
    entries of the cache k, v [B, S, K, H], causal by position. Returns [B, T, N, H]."""
    key_pos = np.arange(k.shape[1], dtype=np.int64)
    num, _, l = partial_attention(q, k, v, q_pos, kv_len, key_pos)
    return finish(num, l, q.dtype)
