"""The dense pieces of a transformer block: norms, rotary positions, grouped-query attention
on the flash kernel, and the gated or plain MLP. Functional: each takes its params dict.

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
    (rows of :func:`rotary_tables`; per-device values inside ``shard_map`` work too)."""
    if 2 * cos.shape[-1] != cfg.rotary_dim:
        raise ValueError(f"[apply_rotary] tables of width {cos.shape[-1]} do not match rotary_dim "
                         f"{cfg.rotary_dim} (they hold rotary_dim / 2 angles per position)")
    return snn.rotary_embedding(x.astype(np.float32), cos, sin).astype(x.dtype)


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
    o = snn.dot_product_attention(q, k, v, is_causal=causal)
    return _proj(jnp.reshape(o, (B, T, N * H)), p["wo"], p.get("bo"))


def mlp(p: dict, x, cfg: ModelConfig):
    """Gated (``act(x W_gate) * (x W_up) W_down``) or plain (``act(x W_in) W_down``) MLP."""
    if cfg.gated_mlp:
        h = activation(cfg.activation, _proj(x, p["w_gate"], p.get("b_gate"))) * _proj(x, p["w_up"], p.get("b_up"))
    else:
        h = activation(cfg.activation, _proj(x, p["w_in"], p.get("b_in")))
    return _proj(h.astype(x.dtype), p["w_down"], p.get("b_down"))
