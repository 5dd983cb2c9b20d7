"""Per-device attention and MLP of one decode step under each layout of
:mod:`shardlab.serve.layouts`, run inside ``shardlab.shard_map``: each function is the book's
sequence of local work and collectives for its layout (the ledger records those collectives; the
closed forms of their bytes are :mod:`shardlab.serve.decode_bytes`).

An attention takes the new token's normed stream ``h [B, 1, D]``, its positions, this device's
keys and values of the cache and their lengths, and returns ``(out, k, v)``: the projected
output (summed over the layout's model axes) and the new token's own keys and values; with
``store`` it writes them into the cache first and attends over one softmax, as the unsharded
model does.
"""

from __future__ import annotations

import numpy as np

import shardlab.numpy as jnp
from shardlab import lax
from shardlab.models.expert_parallel import expert_parallel_mlp
from shardlab.models.layers import mlp
from shardlab.models.ops import activation

from .attention import finish, merge_partials, partial_attention
from .generate import qkv

__all__ = ["attn_megatron", "attn_batch_kv", "attn_seq_kv", "mlp_megatron", "mlp_2d", "ffw_2d", "moe_expert_sharded"]


def _self_partial(q, k, v):
    """The new token's own key: visible to its query."""
    B = q.shape[0]
    return partial_attention(q, k, v, np.zeros((B, 1), np.int64), np.ones(B, np.int64), np.zeros(1, np.int64))


def _out_proj(p, o, axes):
    B = o.shape[0]
    a = jnp.reshape(jnp.matmul(jnp.reshape(o, (B, o.shape[2] * o.shape[3])), p["wo"]), (B, 1, p["wo"].shape[1]))
    a = lax.psum(a, axes)
    return a + p["bo"] if "bo" in p else a


def _attend(q, k, v, ck, cv, pos, kv_len, store):
    """Attention of the new token over its cache and itself: with ``store`` (writes k, v into the
    cache and returns its updated keys and values) one softmax over all of them, as the
    unsharded model; without, the cache's partial merged with the token's own."""
    if store is not None:
        ck, cv = store(k, v)
        return partial_attention(q, ck, cv, pos, kv_len + 1, np.arange(ck.shape[1]))
    return merge_partials([partial_attention(q, ck, cv, pos, kv_len, np.arange(ck.shape[1])), _self_partial(q, k, v)])


def attn_megatron(p, h, pos, ck, cv, kv_len, cfg, n, axes, store=None):
    """Megatron attention: this device's N/n query heads and K/n KV heads (W_Q[D, N_X H],
    KV[B, S, K_X, H]) over its cache, then one AllReduce of [B, D] over ``axes`` in the output
    projection."""
    q, k, v = qkv(p, h, pos, cfg, cfg.num_heads // n, cfg.num_kv_heads // n)
    num, _, l = _attend(q, k, v, ck, cv, pos, kv_len, store)
    return _out_proj(p, finish(num, l, q.dtype), axes), k, v


def attn_batch_kv(p, h, pos, ck, cv, kv_len, cfg, s, store=None):
    """The book's 12-step algorithm: Q heads over (y, z), KV batch over z and heads over y."""
    Y, Z = s["y"], s["z"]
    B = h.shape[0]
    q, k, v = qkv(p, h, pos, cfg, cfg.num_heads // (Y * Z), cfg.num_kv_heads // Y)
    q = lax.all_to_all(q, "z", 0, 2, tiled=True)                     # Q[B_Z, N_Y, H]
    zi = lax.axis_index("z")
    bl = B // Z
    rows = jnp.reshape(zi * bl + np.arange(bl), (bl, 1, 1, 1))
    take = lambda a: jnp.take_along_axis(a, rows, axis=0)  # noqa: E731  (this device's batch rows)
    kl, vl = take(k), take(v)
    pos_l = jnp.take_along_axis(pos, jnp.reshape(zi * bl + np.arange(bl), (bl, 1)), axis=0)
    len_l = jnp.take_along_axis(kv_len, zi * bl + np.arange(bl), axis=0)
    num, _, l = _attend(q, kl, vl, ck, cv, pos_l, len_l, store)
    o = finish(num, l, q.dtype)                                      # O[B_Z, N_Y, H]
    o = lax.all_to_all(o, "z", 2, 0, tiled=True)                     # O[B, N_YZ, H]
    return _out_proj(p, o, ("y", "z")), k, v


def attn_seq_kv(p, h, pos, ck, cv, kv_len, cfg, n):
    """KV[B, S_X, K, H]: every device scores all heads on its slice of the keys; AllToAll_X
    turns sequence partials into head partials, merged exactly."""
    B = h.shape[0]
    Nl, Kl, H = cfg.num_heads // n, cfg.num_kv_heads // n, cfg.head_dim
    q, k, v = qkv(p, h, pos, cfg, Nl, Kl)
    q_all = lax.all_gather(q, "x", axis=2, tiled=True)               # Q[B, 1, N, H]
    S_l = ck.shape[1]
    key_pos = lax.axis_index("x") * S_l + np.arange(S_l)
    num, m, l = partial_attention(q_all, ck, cv, pos, kv_len, key_pos)   # [B, K, G, 1, *]
    G = cfg.group_size
    packed = jnp.concatenate([jnp.reshape(num, (B, 1, cfg.num_heads, H)), jnp.reshape(m, (B, 1, cfg.num_heads, 1)),
                              jnp.reshape(l, (B, 1, cfg.num_heads, 1))], axis=-1)
    got = lax.all_to_all(packed, "x", 2, 1, tiled=True)             # [B, X (sequence shard), N_X, H + 2]
    parts = []
    for j in range(n):
        g = jnp.reshape(got[:, j], (B, Kl, G, 1, H + 2))
        parts.append((g[..., :H], g[..., H:H + 1], g[..., H + 1:]))
    parts.append(_self_partial(q, k, v))
    num, _, l = merge_partials(parts)
    return _out_proj(p, finish(num, l, q.dtype), "x"), k, v


def mlp_megatron(p, x, cfg, axes):
    """Megatron MLP: W_in[D, F_X] column-split, W_out[F_X, D] row-split, one AllReduce of
    [B, D] over ``axes``."""
    B, T, D = x.shape                                  # 2-D rows: one GEMM per weight (see generate.qkv)
    y = jnp.reshape(mlp({k: w for k, w in p.items() if k != "b_down"}, jnp.reshape(x, (B * T, D)), cfg), (B, T, D))
    y = lax.psum(y, axes)
    return y + p["b_down"] if "b_down" in p else y


def mlp_2d(p, x, cfg, s):
    """The book's problem 7 on In[B, D_XYZ] (per device): returns Out[B, D_XYZ].

    1. In[B, D_X] = AllGather_YZ(In[B, D_XYZ]); 2. Tmp[B, F_YZ]{U_X} = In W_in[D_X, F_YZ];
    3. AllReduce_X; 4. Out[B, D_X]{U_YZ} = Tmp W_out[F_YZ, D_X]; 5. ReduceScatter_YZ.
    """
    xin = lax.all_gather(x, "yz", axis=x.ndim - 1, tiled=True)
    g = lax.psum(jnp.matmul(xin, p["w_gate"]), "x")
    u = lax.psum(jnp.matmul(xin, p["w_up"]), "x")
    hmid = (activation(cfg.activation, g) * u).astype(x.dtype)
    out = jnp.matmul(hmid, p["w_down"])
    return lax.psum_scatter(out, "yz", scatter_dimension=out.ndim - 1, tiled=True)


def ffw_2d(p, h, cfg, s):
    """The residual stream stays replicated: take this device's D_XYZ slice, run the 2-D MLP,
    AllGather the result back (the one collective outside the book's five steps)."""
    B, T, D = h.shape
    n = s["x"] * s["yz"]
    idx = lax.axis_index(("x", "yz"))
    parts = jnp.reshape(h, (B, T, n, D // n))
    mine = jnp.take_along_axis(parts, jnp.reshape(idx, (1, 1, 1, 1)) + np.zeros((B, T, 1, 1), np.int32), axis=2)
    out = jnp.reshape(mlp_2d(p, jnp.reshape(mine, (B * T, D // n)), cfg, s), (B, T, D // n))
    return lax.all_gather(out, ("x", "yz"), axis=2, tiled=True)


def moe_expert_sharded(p, x, cfg, n):
    """Routed experts E_X with AllToAll dispatch (GShard): the stream is replicated over x, so
    device i takes batch rows B_X (its tokens), routes them, AllToAll_X sends their capacity
    slots to the experts' devices and back (``models.expert_parallel``), and AllGather_X
    returns every row to every device. Shared experts run on the device's own rows."""
    B = x.shape[0]
    bl = B // n
    mine = lax.dynamic_slice_in_dim(x, lax.axis_index("x") * np.int32(bl), bl, axis=0)
    y = expert_parallel_mlp(p, mine, cfg, "x")
    return lax.all_gather(y, "x", axis=0, tiled=True)
