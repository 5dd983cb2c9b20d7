"""The dense pieces of a transformer block: norms, rotary positions, grouped-query attention
on the flash kernel, and the gated or plain MLP. Functional: each takes its params dict.

On global arrays (``shardlab.ShardedArray``s: a global-view program, what ``shardlab.jit`` and
``shardlab.autoshard`` trace) rotary and attention are written with einsums and elementwise ops
instead of the fused kernels, so every step has a sharding rule: rotary's "rotate half" is an
einsum of the head's two halves with ``[[0, 1], [-1, 0]]`` (exact: one term per output), and
attention is ``softmax(q k^T) v`` with the causal mask as a ``where``. Plain and per-device
arrays take the kernels as before.

Example:
    >>> import numpy as np
    >>> from shardlab.models import ModelConfig, transformer
    >>> from shardlab.models.layers import attention
    >>> cfg = ModelConfig(num_layers=1, d_model=32, ffw_dim=64, num_heads=4, num_kv_heads=2,
    ...                   vocab_size=16)
    >>> p = transformer.init_params(cfg, seed=0)
    >>> x = np.ones((2, 8, 32), np.float32)
    >>> attention(p["layers"][0]["attn"], x, cfg).shape
    (2, 8, 32)
"""

from __future__ import annotations

import numpy as np

import shardlab.nn as snn
import shardlab.numpy as jnp
from shardlab import ShardedArray

from .config import ModelConfig
from .ops import activation

__all__ = ["norm", "rotary", "rotary_tables", "apply_rotary", "attention", "mlp"]


def norm(p: dict, x, cfg: ModelConfig):
    """RMSNorm (``x / rms(x) * scale``) or LayerNorm (``(x - mean) / std * scale + bias``),
    computed in float32 and returned in x's dtype."""
    xf = x.astype(np.float32)
    if cfg.norm == "rmsnorm" and "bias" not in p:
        return snn.rms_norm(xf, p["scale"].astype(np.float32), eps=cfg.norm_eps).astype(x.dtype)
    if cfg.norm == "layernorm":
        xf = xf - jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(xf * xf, axis=-1, keepdims=True)
    y = xf / jnp.sqrt(var + np.float32(cfg.norm_eps)) * p["scale"].astype(np.float32)
    if "bias" in p:
        y = y + p["bias"].astype(np.float32)
    return y.astype(x.dtype)


def rotary_tables(cfg: ModelConfig, positions) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) ``[len(positions), rotary_dim/2]`` float32 of the rotary embedding at
    ``positions`` (angles in float64, as the model computes them).

    Example:
        >>> import numpy as np
        >>> cfg = ModelConfig(num_layers=1, d_model=32, ffw_dim=64, num_heads=4, vocab_size=16)
        >>> x = np.random.default_rng(0).standard_normal((1, 5, 4, 8)).astype(np.float32)
        >>> cos, sin = rotary_tables(cfg, np.arange(2, 7))
        >>> cos.shape, bool(np.allclose(apply_rotary(x, cos, sin, cfg), rotary(x, cfg, offset=2)))
        ((5, 4), True)
    """
    half = cfg.rotary_dim // 2
    inv = 1.0 / (cfg.rope_theta ** (np.arange(half, dtype=np.float64) * 2.0 / cfg.rotary_dim))
    ang = np.outer(np.asarray(positions, np.float64), inv)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def apply_rotary(x, cos, sin, cfg: ModelConfig):
    """Rotary embedding of x ``[B, T, heads, H]`` with per-token tables ``[T, rotary_dim/2]``
    (rows of :func:`rotary_tables`; per-device values inside ``shard_map`` and global arrays
    work too)."""
    if 2 * cos.shape[-1] != cfg.rotary_dim:
        raise ValueError(f"[apply_rotary] tables of width {cos.shape[-1]} do not match rotary_dim "
                         f"{cfg.rotary_dim} (they hold rotary_dim / 2 angles per position)")
    if isinstance(x, ShardedArray):
        return _global_rotary(x.astype(np.float32), np.asarray(cos), np.asarray(sin)).astype(x.dtype)
    return snn.rotary_embedding(x.astype(np.float32), cos, sin).astype(x.dtype)


def _global_rotary(x, cos, sin):
    """``x·cos + rotate_half(x)·sin`` on a global x ``[B, T, heads, H]`` from einsums and
    elementwise ops: the head is viewed as ``[.., 2, H/2]`` (or, with a partial rotary, rotated
    by an ``[H, H]`` signed permutation), so each output is one exact product, as the kernel."""
    B, T, N, H = x.shape
    half = cos.shape[-1]
    if 2 * half == H:  # the whole head rotates: [x1, x2] -> [-x2, x1] on a [.., 2, half] view
        xs = jnp.reshape(x, (B, T, N, 2, half))
        rot = jnp.einsum("btnih,ij->btnjh", xs, np.array([[0.0, 1.0], [-1.0, 0.0]], np.float32))
        c = np.stack([cos, cos], axis=1)[:, None]  # [T, 1, 2, half]
        s = np.stack([sin, sin], axis=1)[:, None]
        return jnp.reshape(xs * c + rot * s, (B, T, N, H))
    r = np.zeros((H, H), np.float32)  # rotate_half on the first 2·half dims, zero on the rest
    r[half:2 * half, :half] = -np.eye(half, dtype=np.float32)
    r[:half, half:2 * half] = np.eye(half, dtype=np.float32)
    rest = H - 2 * half
    c = np.concatenate([cos, cos, np.ones((T, rest), np.float32)], axis=1)[:, None]  # [T, 1, H]
    s = np.concatenate([sin, sin, np.zeros((T, rest), np.float32)], axis=1)[:, None]
    return x * c + jnp.einsum("btnh,hg->btng", x, r) * s


def rotary(x, cfg: ModelConfig, offset: int = 0):
    """Rotary position embedding on x [B, T, heads, H] (the "rotate half" layout of LLaMA and
    GPT-NeoX), on the first ``cfg.rotary_dim`` dims of each head, at positions offset..offset+T."""
    return apply_rotary(x, *rotary_tables(cfg, np.arange(offset, offset + x.shape[1])), cfg)


def _proj(x, w, b=None):
    y = jnp.matmul(x, w)
    return y if b is None else y + b


def attention(p: dict, x, cfg: ModelConfig, *, causal: bool = True):
    """Self-attention on x [B, T, D]: Q/K/V projections, rotary, grouped-query attention through
    ``shardlab.nn.dot_product_attention`` (the flash kernel), output projection."""
    B, T, _ = x.shape
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q = jnp.reshape(_proj(x, p["wq"], p.get("bq")), (B, T, N, H))
    k = jnp.reshape(_proj(x, p["wk"], p.get("bk")), (B, T, K, H))
    v = jnp.reshape(_proj(x, p["wv"], p.get("bv")), (B, T, K, H))
    if cfg.positions == "rotary":
        q, k = rotary(q, cfg), rotary(k, cfg)
    if isinstance(q, ShardedArray):
        o = _global_attention(q, k, v, causal)
    else:
        o = snn.dot_product_attention(q, k, v, is_causal=causal)
    return _proj(jnp.reshape(o, (B, T, N * H)), p["wo"], p.get("bo"))


def _global_attention(q, k, v, causal: bool):
    """``softmax(q k^T / sqrt(H)) v`` on global arrays q ``[B, T, N, H]``, k and v
    ``[B, S, K, H]``: query head ``n`` reads key/value head ``n // (N / K)``, as the kernel;
    the causal mask (query ``i`` sees keys ``j <= i``) is a ``where`` with float32's lowest."""
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    grouped = K != N  # grouped-query: the query heads as [kv head, group] (rank 5; plain MHA stays rank 4)
    qg = jnp.reshape(q, (B, T, K, N // K, H)) if grouped else q
    s = jnp.einsum("btkgh,bskh->bkgts" if grouped else "btnh,bsnh->bnts", qg, k) * np.float32(1.0 / np.sqrt(H))
    if causal:
        s = jnp.where(np.tril(np.ones((T, S), bool)), s, np.finfo(np.float32).min)
    s = s - jnp.max(s, axis=-1, keepdims=True)
    e = jnp.exp(s)
    a = e / jnp.sum(e, axis=-1, keepdims=True)
    o = jnp.einsum("bkgts,bskh->btkgh" if grouped else "bnts,bsnh->btnh", a.astype(v.dtype), v)
    return jnp.reshape(o, (B, T, N, H)) if grouped else o


def mlp(p: dict, x, cfg: ModelConfig):
    """Gated (``act(x W_gate) * (x W_up) W_down``) or plain (``act(x W_in) W_down``) MLP."""
    if cfg.gated_mlp:
        h = activation(cfg.activation, _proj(x, p["w_gate"], p.get("b_gate"))) * _proj(x, p["w_up"], p.get("b_up"))
    else:
        h = activation(cfg.activation, _proj(x, p["w_in"], p.get("b_in")))
    return _proj(h.astype(x.dtype), p["w_down"], p.get("b_down"))
