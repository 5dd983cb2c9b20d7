"""A functional decoder-only transformer built from a ``ModelConfig``.

Params are a pytree of dicts and lists of arrays (``init_params``); ``forward`` maps token ids
``[B, T]`` to logits ``[B, T, V]`` and ``loss`` gives the mean cross-entropy. Everything is
written with ``shardlab.numpy`` / ``shardlab.nn`` / numpy ufuncs, so the same code runs on
plain numpy arrays and on per-device values inside ``shardlab.shard_map`` (where the ledger
records every matmul and attention call; their FLOPs are what
:func:`shardlab.models.flops_per_token` predicts). Sharding is the caller's business.

Example:
    >>> import numpy as np
    >>> from shardlab.models import ModelConfig, param_count, transformer
    >>> cfg = ModelConfig(num_layers=2, d_model=64, ffw_dim=128, num_heads=4, num_kv_heads=2,
    ...                   vocab_size=100)
    >>> params = transformer.init_params(cfg, seed=0)
    >>> transformer.num_elements(params) == param_count(cfg).total
    True
    >>> tokens = np.random.default_rng(0).integers(0, 100, (2, 16))
    >>> transformer.forward(params, tokens, cfg).shape
    (2, 16, 100)
"""

from __future__ import annotations

import numpy as np

import shardlab.numpy as jnp
from shardlab import LocalArray, ShardedArray

from .config import ModelConfig
from .layers import attention, mlp, norm
from .moe import moe_mlp
from .ops import log_softmax

__all__ = ["embedding_lookup", "init_params", "embed", "block", "output_logits", "forward", "cross_entropy", "loss",
           "num_elements"]

_DTYPES = {"float32": np.float32, "bfloat16": jnp.bfloat16}


def _norm_params(cfg: ModelConfig, dtype) -> dict:
    p = {"scale": np.ones(cfg.d_model, dtype)}
    if cfg.norm == "layernorm":
        p["bias"] = np.zeros(cfg.d_model, dtype)
    return p


def _mlp_params(rng, cfg: ModelConfig, F: int, dtype, lead: tuple = ()) -> dict:
    D = cfg.d_model
    w = lambda *s: (rng.standard_normal(lead + s, dtype=np.float32) * 0.02).astype(dtype)  # noqa: E731
    names = ("w_gate", "w_up") if cfg.gated_mlp else ("w_in",)
    p = {n: w(D, F) for n in names}
    p["w_down"] = w(F, D)
    if cfg.mlp_bias:
        p.update({n.replace("w_", "b_"): np.zeros(lead + (F,), dtype) for n in names})
        p["b_down"] = np.zeros(lead + (D,), dtype)
    return p


def init_params(cfg: ModelConfig, seed: int = 0, dtype="float32") -> dict:
    """Random params for ``cfg``: N(0, 0.02) matrices, unit norm scales, zero biases.

    Args:
        cfg: the model.
        seed: numpy Generator seed.
        dtype: "float32" or "bfloat16" (every leaf).

    Returns:
        ``{"embed": [V, D], ("pos_embed": [T_max, D]), "layers": [per-layer dict], "final_norm",
        ("head": [D, V])}``; a layer holds ``attn_norm``, ``attn`` (wq [D, NH], wk/wv [D, KH],
        wo [NH, D], biases), ``mlp_norm`` and ``mlp`` or ``moe`` (router [D, E], stacked expert
        matrices [E, D, F_e] / [E, F_e, D], ``shared`` [S, ...]).
    """
    if dtype not in _DTYPES and np.dtype(dtype) not in (np.float32, jnp.bfloat16):
        raise ValueError(f"[init_params] dtype {dtype!r} must be 'float32' or 'bfloat16'")
    dt = _DTYPES.get(dtype, dtype)
    rng = np.random.default_rng(seed)
    D, N, K, H, V = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size
    w = lambda *s: (rng.standard_normal(s, dtype=np.float32) * 0.02).astype(dt)  # noqa: E731
    params = {"embed": w(V, D)}
    if cfg.positions == "learned":
        params["pos_embed"] = w(cfg.max_seq_len, D)
    layers = []
    for i in range(cfg.num_layers):
        attn = {"wq": w(D, N * H), "wk": w(D, K * H), "wv": w(D, K * H), "wo": w(N * H, D)}
        if cfg.qkv_bias:
            attn.update(bq=np.zeros(N * H, dt), bk=np.zeros(K * H, dt), bv=np.zeros(K * H, dt))
        if cfg.out_bias:
            attn["bo"] = np.zeros(D, dt)
        layer = {"attn_norm": _norm_params(cfg, dt), "attn": attn, "mlp_norm": _norm_params(cfg, dt)}
        if cfg.is_moe_layer(i):
            moe = {"router": w(D, cfg.num_experts)}
            if cfg.router_bias:
                moe["router_bias"] = np.zeros(cfg.num_experts, np.float32).astype(dt)
            moe.update(_mlp_params(rng, cfg, cfg.moe_ffw_dim, dt, (cfg.num_experts,)))
            if cfg.num_shared_experts:
                moe["shared"] = _mlp_params(rng, cfg, cfg.moe_ffw_dim, dt, (cfg.num_shared_experts,))
            layer["moe"] = moe
        else:
            layer["mlp"] = _mlp_params(rng, cfg, cfg.ffw_dim, dt)
        layers.append(layer)
    params["layers"] = layers
    params["final_norm"] = _norm_params(cfg, dt)
    if not cfg.tie_embeddings:
        params["head"] = w(D, V)
    return params


def num_elements(params) -> int:
    """Total elements of the arrays in a params pytree."""
    if isinstance(params, dict):
        return sum(num_elements(v) for v in params.values())
    if isinstance(params, (list, tuple)):
        return sum(num_elements(v) for v in params)
    return int(np.prod(np.shape(params), dtype=np.int64))


def _ids(x):
    return x if isinstance(x, (LocalArray, ShardedArray)) else np.asarray(x)


def _one_hot(ids, n: int, dtype):
    """``[..., n]`` 0/1 of `dtype` from integer ids (elementwise: an equality with ``arange``)."""
    return jnp.equal(jnp.expand_dims(ids, -1), np.arange(n, dtype=np.int32)).astype(dtype)


def embed(params: dict, tokens, cfg: ModelConfig):
    """The residual stream ``[B, T, D]`` entering the first block: rows of the embedding table
    (a gather, no FLOPs) plus learned positions."""
    x = embedding_lookup(params["embed"], _ids(tokens))
    if cfg.positions == "learned":
        T = x.shape[1]
        if T > cfg.max_seq_len:
            raise ValueError(f"[forward] sequence length {T} exceeds max_seq_len {cfg.max_seq_len} "
                             f"of the learned position table")
        x = x + params["pos_embed"][:T][None]
    return x


def embedding_lookup(table, ids):
    """Rows ``table[ids]`` ([B, T] ids → [B, T, D]) as a differentiable gather (no FLOPs).

    One ``take_along_axis`` of the [V, D] table with a [B·T, 1] index that broadcasts along
    D: its gradient is a row scatter-add into a [V, D] table, not into B copies of it.

    On global arrays (``shardlab.ShardedArray``: a global-view program, what ``autoshard``
    traces) it is the TPU way, ``one_hot(ids, V) @ table``: exact (one nonzero per row), and an
    einsum every sharding rule covers; the cost model prices it as the matmul it is
    (``2·B·T·V·D`` FLOPs, like the head).
    """
    B, T = ids.shape[0], ids.shape[1]
    if isinstance(ids, ShardedArray) or isinstance(table, ShardedArray):
        return jnp.einsum("btv,vd->btd", _one_hot(ids, table.shape[0], table.dtype), table)
    idx = jnp.reshape(ids.astype(np.int32), (B * T, 1))
    return jnp.reshape(jnp.take_along_axis(table, idx, axis=0), (B, T, table.shape[1]))


def block(layer: dict, x, cfg: ModelConfig, index: int = 0, *, causal: bool = True):
    """One decoder block (layer ``index`` of ``cfg``, which says whether it is MoE) on the
    residual stream x ``[B, T, D]``: pre-norm ``x + attn(norm(x))`` then ``x + mlp(norm(x))``,
    or with ``parallel_residual`` ``x + attn(norm1(x)) + mlp(norm2(x))``."""
    a = attention(layer["attn"], norm(layer["attn_norm"], x, cfg), cfg, causal=causal)
    ff = moe_mlp if cfg.is_moe_layer(index) else mlp
    fp = layer["moe"] if cfg.is_moe_layer(index) else layer["mlp"]
    if cfg.parallel_residual:
        return x + a + ff(fp, norm(layer["mlp_norm"], x, cfg), cfg)
    x = x + a
    return x + ff(fp, norm(layer["mlp_norm"], x, cfg), cfg)


def forward(params: dict, tokens, cfg: ModelConfig, *, causal: bool = True):
    """Logits ``[B, T, V]`` for token ids ``[B, T]`` (ints in ``[0, V)``).

    The block is pre-norm: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``, or with
    ``parallel_residual`` ``x + attn(norm1(x)) + mlp(norm2(x))``. The head is ``x @ head`` or,
    tied, ``x @ embed.T``.
    """
    if len(_ids(tokens).shape) != 2:
        raise ValueError(f"[forward] tokens must be [batch, seq] ids, got shape {np.shape(tokens)}")
    x = embed(params, tokens, cfg)
    for i, layer in enumerate(params["layers"]):
        x = block(layer, x, cfg, i, causal=causal)
    return output_logits(params, x, cfg)


def output_logits(params: dict, x, cfg: ModelConfig):
    """Logits ``[B, T, V]`` from the last block's stream: the final norm, then ``x @ head`` (or,
    tied, ``x @ embed.T``)."""
    x = norm(params["final_norm"], x, cfg)
    head = params["head"] if "head" in params else params["embed"].T
    return jnp.matmul(x, head)


def cross_entropy(logits, targets):
    """Mean cross-entropy of ``targets`` [B, T] under ``logits`` [B, T, V] (taken in float32)."""
    logp = log_softmax(logits.astype(np.float32), axis=-1)
    if isinstance(logp, ShardedArray):  # global arrays: the target's entry by a one-hot mask (exact)
        return -jnp.mean(jnp.sum(logp * _one_hot(_ids(targets), logp.shape[-1], np.float32), axis=-1))
    t = jnp.expand_dims(_ids(targets), -1)
    picked = jnp.take_along_axis(logp, t.astype(np.int32), axis=-1)
    return -jnp.mean(picked)


def loss(params: dict, tokens, targets, cfg: ModelConfig, *, causal: bool = True):
    """Mean cross-entropy of ``targets`` [B, T] under ``forward(params, tokens)``, in float32.

    Inside ``shard_map`` with a batch-sharded input this is the mean over the local batch;
    average over devices with ``shardlab.lax.pmean``.
    """
    return cross_entropy(forward(params, tokens, cfg, causal=causal), targets)
