"""Sharded decoding inside ``shardlab.shard_map``: the book's part 7 layouts, each checked
against the unsharded model and against closed-form communication bytes.

One decode step (one new token per sequence) of ``shardlab.models`` params, with the KV cache
laid out per strategy:

=================  ===================  ==================================================
strategy           mesh axes            layout (book notation)
=================  ===================  ==================================================
``megatron``       ``x``                W_Q[D, N_X H], KV[B, S, K_X, H], W_in[D, F_X]:
                                        one AllReduce of [B, D] after attention, one after
                                        the MLP
``batch_kv``       ``y``, ``z``         KV[B_Z, S, K_Y, H]: Q AllToAll_Z (heads -> batch),
                                        local attention, AllToAll_Z back, AllReduce_YZ
``seq_kv``         ``x``                KV[B, S_X, K, H]: Q AllGather_X, partial softmax on
                                        the local keys, AllToAll_X (sequence partials ->
                                        heads), exact merge; ring attention by ppermute for
                                        a sequence-sharded prefill (``ring_attention``)
``2d``             ``x``, ``yz``        the MLP 2-D weight-stationary: AllGather_YZ,
                                        W_in[D_X, F_YZ], AllReduce_X, W_out[F_YZ, D_X],
                                        ReduceScatter_YZ (problem 7)
``moe``            ``x``                experts E_X (GShard): device i routes batch rows
                                        B_X, AllToAll_X dispatch to the experts' devices,
                                        local experts, AllToAll_X combine, AllGather_X of
                                        the B_X outputs (``models.expert_parallel``)
=================  ===================  ==================================================

``comm_bytes`` gives the closed forms (bytes each device puts into every collective per step);
the tests compare them with the ledger of a real run.

``generate_sharded`` places the params on the mesh once, builds the shard_map'd step once and
keeps the KV cache on the devices between tokens (``shardlab.serve.mesh_cache``): contiguous, or
paged (``cache="paged"``: a block pool split over the layout's batch and KV-head axes, with
block tables) for every layout but ``seq_kv``. Per token only the sampled ids go in and the
logits come out. ``decode_step`` is one such step on a host cache (placed, run, copied back).

Example:
    >>> import numpy as np
    >>> import shardlab as sl
    >>> from shardlab.models import ModelConfig, transformer
    >>> from shardlab.serve import ContiguousKVCache, forward_cached
    >>> from shardlab.serve.sharded import decode_step
    >>> cfg = ModelConfig(num_layers=1, d_model=64, ffw_dim=128, num_heads=8, vocab_size=32)
    >>> params = transformer.init_params(cfg, seed=0)
    >>> cache = ContiguousKVCache(cfg, 2, 16)
    >>> _ = forward_cached(params, np.ones((2, 4), int), cfg, cache)
    >>> mesh = sl.make_mesh((8,), ("x",))
    >>> decode_step(params, np.array([3, 5]), cfg, cache, mesh, "megatron").shape
    (2, 32)
"""

from __future__ import annotations

import math

import numpy as np

import shardlab as sl
import shardlab.numpy as jnp
from shardlab import P
from shardlab import lax
from shardlab.models import ModelConfig
from shardlab.models.layers import mlp, norm
from shardlab.models.expert_parallel import alltoall_bytes, expert_parallel_mlp
from shardlab.models.ops import activation

from .attention import finish, merge_partials, partial_attention
from .generate import embed, forward_cached, head, qkv
from .kv_cache import ContiguousKVCache, PagedKVCache
from .mesh_cache import MeshKVCache
from .sampling import Sampler

__all__ = ["STRATEGIES", "decode_step", "generate_sharded", "comm_bytes", "ledger_comm_bytes", "mlp_2d",
           "ring_attention", "check_layout"]

STRATEGIES = {"megatron": ("x",), "batch_kv": ("y", "z"), "seq_kv": ("x",), "2d": ("x", "yz"),
              "moe": ("x",)}


# ---------------------------------------------------------------------------------------------
# validation


def _axis_sizes(mesh, strategy: str) -> dict:
    if strategy not in STRATEGIES:
        raise ValueError(f"[decode_step] unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    want = STRATEGIES[strategy]
    shape = dict(mesh.shape)
    if tuple(shape) != want:
        raise ValueError(f"[decode_step] strategy {strategy!r} needs a mesh with axes {want}, got "
                         f"{tuple(shape)}; e.g. shardlab.make_mesh({tuple(2 if len(want) > 1 and i == 0 else 4 if len(want) > 1 else 8 for i in range(len(want)))}, {want})")
    return shape


def check_layout(cfg: ModelConfig, strategy: str, mesh_shape: dict, batch: int, max_len: int) -> None:
    """Raises ValueError when heads, KV heads, F, experts, batch or cache length do not divide
    the mesh axes the strategy shards them over."""
    s = mesh_shape
    checks = []
    if strategy in ("megatron", "seq_kv", "moe"):
        n = s["x"]
        checks += [("num_heads", cfg.num_heads, n, "x"), ("num_kv_heads", cfg.num_kv_heads, n, "x")]
        if strategy == "megatron":
            checks.append(("ffw_dim", cfg.ffw_dim, n, "x"))
        if strategy == "seq_kv":
            checks += [("ffw_dim", cfg.ffw_dim, n, "x"), ("cache length", max_len, n, "x")]
        if strategy == "moe":
            if not cfg.is_moe:
                raise ValueError("[decode_step] strategy 'moe' needs a model with num_experts > 0")
            checks += [("num_experts", cfg.num_experts, n, "x"), ("batch", batch, n, "x")]
    elif strategy == "batch_kv":
        yz = s["y"] * s["z"]
        checks += [("num_heads", cfg.num_heads, yz, "(y, z)"), ("num_kv_heads", cfg.num_kv_heads, s["y"], "y"),
                   ("ffw_dim", cfg.ffw_dim, yz, "(y, z)"), ("batch", batch, s["z"], "z")]
    elif strategy == "2d":
        n = s["x"] * s["yz"]
        checks += [("num_heads", cfg.num_heads, n, "(x, yz)"), ("num_kv_heads", cfg.num_kv_heads, n, "(x, yz)"),
                   ("d_model", cfg.d_model, n, "(x, yz)"), ("ffw_dim", cfg.ffw_dim, s["yz"], "yz")]
    for name, v, k, ax in checks:
        if v % k:
            raise ValueError(f"[decode_step] {name} {v} is not divisible by mesh axis {ax} of size {k} "
                             f"(strategy {strategy!r}); choose a mesh whose {ax} size divides {v}"
                             + ("; with fewer KV heads than devices use strategy 'batch_kv'"
                                if name == "num_kv_heads" else ""))
    if cfg.is_moe and strategy != "moe":
        raise ValueError(f"[decode_step] {cfg.name or 'the model'} is a mixture of experts; use strategy 'moe'")
    if not cfg.gated_mlp and strategy == "2d":
        raise ValueError("[decode_step] strategy '2d' is written for a gated MLP")


# ---------------------------------------------------------------------------------------------
# param specs


def _mlp_specs(p: dict, col, row) -> dict:
    out = {}
    for name in p:
        if name in ("w_gate", "w_up", "w_in"):
            out[name] = P(None, col)
        elif name == "w_down":
            out[name] = P(row, None)
        elif name in ("b_gate", "b_up", "b_in"):
            out[name] = P(col)
        else:
            out[name] = P()
    return out


def _attn_specs(p: dict, heads, kv) -> dict:
    spec = {"wq": P(None, heads), "wk": P(None, kv), "wv": P(None, kv), "wo": P(heads, None),
            "bq": P(heads), "bk": P(kv), "bv": P(kv), "bo": P()}
    return {k: spec[k] for k in p}


def _param_specs(params: dict, strategy: str) -> dict:
    heads = {"megatron": "x", "seq_kv": "x", "moe": "x", "batch_kv": ("y", "z"), "2d": ("x", "yz")}[strategy]
    kv = {"batch_kv": "y"}.get(strategy, heads)
    specs = {k: P() for k in params if k != "layers"}
    layers = []
    for layer in params["layers"]:
        ls = {"attn_norm": {k: P() for k in layer["attn_norm"]}, "mlp_norm": {k: P() for k in layer["mlp_norm"]},
              "attn": _attn_specs(layer["attn"], heads, kv)}
        if "moe" in layer:
            ls["moe"] = {k: (P() if k in ("router", "router_bias", "shared") else P("x")) for k in layer["moe"]}
            if "shared" in layer["moe"]:
                ls["moe"]["shared"] = {k: P() for k in layer["moe"]["shared"]}
        elif strategy == "2d":
            ls["mlp"] = {k: (P("x", "yz") if k in ("w_gate", "w_up") else P("yz", "x")) for k in layer["mlp"]}
        else:
            col = heads
            ls["mlp"] = _mlp_specs(layer["mlp"], col, col)
        layers.append(ls)
    specs["layers"] = layers
    return specs


# ---------------------------------------------------------------------------------------------
# per-device blocks


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


def _attn_megatron(p, h, pos, ck, cv, kv_len, cfg, n, axes, store=None):
    q, k, v = qkv(p, h, pos, cfg, cfg.num_heads // n, cfg.num_kv_heads // n)
    num, _, l = _attend(q, k, v, ck, cv, pos, kv_len, store)
    return _out_proj(p, finish(num, l, q.dtype), axes), k, v


def _attn_batch_kv(p, h, pos, ck, cv, kv_len, cfg, s, store=None):
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


def _attn_seq_kv(p, h, pos, ck, cv, kv_len, cfg, n):
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


def _mlp_megatron(p, x, cfg, axes):
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


def _ffw_2d(p, h, cfg, s):
    """The residual stream stays replicated: take this device's D_XYZ slice, run the 2-D MLP,
    AllGather the result back (the one collective outside the book's five steps)."""
    B, T, D = h.shape
    n = s["x"] * s["yz"]
    idx = lax.axis_index(("x", "yz"))
    parts = jnp.reshape(h, (B, T, n, D // n))
    mine = jnp.take_along_axis(parts, jnp.reshape(idx, (1, 1, 1, 1)) + np.zeros((B, T, 1, 1), np.int32), axis=2)
    out = jnp.reshape(mlp_2d(p, jnp.reshape(mine, (B * T, D // n)), cfg, s), (B, T, D // n))
    return lax.all_gather(out, ("x", "yz"), axis=2, tiled=True)


def _moe_expert_sharded(p, x, cfg, n):
    """Routed experts E_X with AllToAll dispatch (GShard): the stream is replicated over x, so
    device i takes batch rows B_X (its tokens), routes them, AllToAll_X sends their capacity
    slots to the experts' devices and back (``models.expert_parallel``), and AllGather_X
    returns every row to every device. Shared experts run on the device's own rows."""
    B = x.shape[0]
    bl = B // n
    mine = lax.dynamic_slice_in_dim(x, lax.axis_index("x") * np.int32(bl), bl, axis=0)
    y = expert_parallel_mlp(p, mine, cfg, "x")
    return lax.all_gather(y, "x", axis=0, tiled=True)


# ---------------------------------------------------------------------------------------------
# the step


# the KV cache's mesh axes per strategy: (batch, sequence, KV heads)
_CACHE_AXES = {"megatron": (None, None, "x"), "moe": (None, None, "x"), "2d": (None, None, ("x", "yz")),
               "batch_kv": ("z", None, "y"), "seq_kv": (None, "x", None)}


class _Decoder:
    """Decode steps of one batch on ``mesh``: the params are placed on the mesh once, the
    shard_map'd step is built once, and the cache stays on the devices between steps
    (:class:`~shardlab.serve.mesh_cache.MeshKVCache`); only the tokens go in and the logits come
    out each step."""

    def __init__(self, params: dict, cfg: ModelConfig, mesh, strategy: str, cache, seqs=None):
        s = _axis_sizes(mesh, strategy)
        batch = len(seqs) if seqs is not None else cache.batch
        max_len = cache.max_len if isinstance(cache, ContiguousKVCache) else cache.num_blocks * cache.block_size
        check_layout(cfg, strategy, s, batch, max_len)
        b, q, k = _CACHE_AXES[strategy]
        self.cache = MeshKVCache(cache, mesh, batch=b, seq=q, kv=k, seqs=seqs)
        specs = _param_specs(params, strategy)
        self.params = _place(params, specs, mesh)
        self.cfg, self.strategy, self.s = cfg, strategy, s
        self.now: dict = {}                               # this step's tokens, positions, lengths
        L = cfg.num_layers
        cs, out = self.cache.spec, self.cache.out_spec
        self.in_specs = (specs, [cs] * L, [cs] * L)
        self.out_specs = (P(), [out] * L, [out] * L)
        self.mesh = mesh
        self.f = None

    def _body(self, p, ck, cv, idx):
        cfg, strategy, s, cache = self.cfg, self.strategy, self.s, self.cache
        tokens, pos, lengths = self.now["tokens"], self.now["pos"], self.now["lengths"]
        x = embed(p, tokens[:, None], pos, cfg)
        new_k, new_v = [], []
        for i, layer in enumerate(p["layers"]):
            h = norm(layer["attn_norm"], x, cfg)
            store = None if cache.host_writes else self._store(ck[i], cv[i], idx, new_k, new_v)
            kc, vc = (cache.view(ck[i], idx), cache.view(cv[i], idx)) if store is None else (ck[i], cv[i])
            if strategy == "batch_kv":
                a, k, v = _attn_batch_kv(layer["attn"], h, pos, kc, vc, lengths, cfg, s, store)
            elif strategy == "seq_kv":
                a, k, v = _attn_seq_kv(layer["attn"], h, pos, kc, vc, lengths, cfg, s["x"])
            elif strategy == "2d":
                a, k, v = _attn_megatron(layer["attn"], h, pos, kc, vc, lengths, cfg, s["x"] * s["yz"], ("x", "yz"),
                                         store)
            else:
                a, k, v = _attn_megatron(layer["attn"], h, pos, kc, vc, lengths, cfg, s["x"], "x", store)
            if store is None:                    # the host writes this layout's new token
                new_k.append(k)
                new_v.append(v)
            x = x + a
            h = norm(layer["mlp_norm"], x, cfg)
            if strategy == "2d":
                x = x + _ffw_2d(layer["mlp"], h, cfg, s)
            elif strategy == "moe" and cfg.is_moe_layer(i):
                x = x + _moe_expert_sharded(layer["moe"], h, cfg, s["x"])
            elif strategy == "batch_kv":
                x = x + _mlp_megatron(layer["mlp"], h, cfg, ("y", "z"))
            else:
                x = x + _mlp_megatron(layer["mlp"], h, cfg, "x")
        return head(p, x, cfg)[:, 0], new_k, new_v

    def _store(self, ck, cv, idx, new_k: list, new_v: list):
        """A function writing this device's rows of the new token's k, v into the layer's cache
        (kept in ``new_k``, ``new_v`` for the step's output) and returning the updated keys and
        values as attention reads them."""
        cache = self.cache

        def store(k, v):
            new_k.append(cache.write(ck, k, idx))
            new_v.append(cache.write(cv, v, idx))
            return cache.view(new_k[-1], idx), cache.view(new_v[-1], idx)

        return store

    def step(self, tokens, ledger=None) -> np.ndarray:
        """Logits [B, V] of one new token per sequence; the cache grows by that token."""
        tokens = np.asarray(tokens).reshape(-1)
        if tokens.shape[0] != self.cache.B:
            raise ValueError(f"[decode_step] {tokens.shape[0]} tokens for a cache of {self.cache.B} rows")
        lengths, idx, idx_specs = self.cache.begin()
        self.now = {"tokens": tokens, "pos": lengths[:, None].astype(np.int64), "lengths": lengths}
        if self.f is None:
            self.f = sl.shard_map(self._body, mesh=self.mesh, in_specs=self.in_specs + (idx_specs,),
                                  out_specs=self.out_specs)
        if ledger is not None:
            with ledger:
                logits, nk, nv = self.f(self.params, self.cache.k, self.cache.v, idx)
        else:
            logits, nk, nv = self.f(self.params, self.cache.k, self.cache.v, idx)
        self.cache.commit(nk, nv)
        return np.asarray(logits)


def _place(tree, specs, mesh):
    """``tree`` (dicts and lists of arrays) put on ``mesh`` with the matching PartitionSpecs (a
    spec standing for a whole subtree applies to each of its arrays)."""
    if isinstance(specs, P) and isinstance(tree, (dict, list, tuple)):
        specs = {k: specs for k in tree} if isinstance(tree, dict) else [specs] * len(tree)
    if isinstance(tree, dict):
        return {k: _place(v, specs[k], mesh) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_place(v, sp, mesh) for v, sp in zip(tree, specs))
    return sl.device_put(tree, sl.NamedSharding(mesh, specs))


def decode_step(params: dict, tokens, cfg: ModelConfig, cache, mesh, strategy: str = "megatron",
                *, ledger=None, seqs=None):
    """One decode step of ``tokens`` [B] on ``mesh``: logits [B, V] (replicated), with the new
    keys and values written into ``cache``.

    Args:
        params: ``shardlab.models.transformer`` params (unsharded; laid out per strategy).
        tokens: the last token of each sequence.
        cfg: the model.
        cache: a ContiguousKVCache of B rows, or a PagedKVCache split as the strategy's batch
            axis (``shards``; see ``shardlab.serve.mesh_cache``).
        mesh: a shardlab Mesh with the strategy's axes (``STRATEGIES``).
        strategy: one of ``STRATEGIES``.
        seqs: the paged cache's sequences in batch order (default ``range(B)``).

    Each call places the params and the cache on the mesh and copies the cache back;
    :func:`generate_sharded` keeps both on the mesh across steps.
    """
    tokens = np.asarray(tokens).reshape(-1)
    if seqs is None and isinstance(cache, PagedKVCache):
        seqs = range(tokens.shape[0])
    dec = _Decoder(params, cfg, mesh, strategy, cache, seqs)
    logits = dec.step(tokens, ledger)
    dec.cache.to_host()
    return logits


def generate_sharded(params: dict, cfg: ModelConfig, prompt, max_new_tokens: int, mesh,
                     strategy: str = "megatron", sampler=None, *, max_len: int | None = None, ledger=None,
                     cache: str = "contiguous", block_size: int = 16, num_blocks: int | None = None):
    """Prefill ``prompt`` [B, T0] (unsharded), then decode ``max_new_tokens`` tokens on ``mesh``
    with the params and the KV cache kept on the devices. Returns the tokens [B, n].

    Args:
        cache: "contiguous" (``max_len`` slots per row, default ``T0 + max_new_tokens``
            rounded up to the mesh size: the sequence-sharded cache splits it) or "paged"
            (``num_blocks`` blocks of ``block_size`` tokens, default just enough for every
            sequence, split over the strategy's batch axis).
        ledger: records every decode step's collectives.

    Raises:
        CacheFullError: before decoding, when a sequence's context would outgrow the rows or
            the blocks of the cache.
    """
    prompt = np.asarray(prompt)
    B, T0 = prompt.shape
    sampler = sampler or Sampler()
    s = _axis_sizes(mesh, strategy)
    seqs = list(range(B))
    if cache == "contiguous":
        n = mesh.size
        host = ContiguousKVCache(cfg, B, max_len or -(-(T0 + max_new_tokens) // n) * n)
    elif cache == "paged":
        batch_axis, seq_axis, _ = _CACHE_AXES[strategy]
        if seq_axis is not None:
            raise ValueError(f"[generate_sharded] strategy {strategy!r} splits the sequence over the mesh; a paged "
                             f"cache keeps a sequence's blocks together: use cache='contiguous'")
        if num_blocks is None:
            num_blocks = B * -(-(T0 + max_new_tokens) // block_size)
        check_layout(cfg, strategy, s, B, num_blocks * block_size)
        Z = s[batch_axis] if batch_axis else 1
        host = PagedKVCache(cfg, num_blocks, block_size, shards=Z)
        for b in seqs:
            host.add_sequence(b, shard=b // (B // Z))
    else:
        raise ValueError(f"[generate_sharded] cache {cache!r} must be 'contiguous' or 'paged'")
    host.reserve(seqs, T0 + max_new_tokens - 1)              # a context too long fails here, not mid-way
    logits = np.asarray(forward_cached(params, prompt, cfg, host, seqs))[:, -1]
    dec = _Decoder(params, cfg, mesh, strategy, host, seqs if cache == "paged" else None)
    out = []
    for step in range(max_new_tokens):
        tok = sampler.sample(np.asarray(logits, np.float32))
        out.append(tok)
        if step + 1 < max_new_tokens:
            logits = dec.step(tok, ledger)
    return np.stack(out, axis=1) if out else np.zeros((B, 0), np.int64)


# ---------------------------------------------------------------------------------------------
# closed forms


def _ring_sent(op: str, n: int, v_in: float) -> float:
    """Bytes one device sends for ``op`` on a ring of n, given its input bytes."""
    if op == "psum":
        return 2 * (n - 1) / n * v_in
    if op == "all_gather":
        return (n - 1) * v_in
    return (n - 1) / n * v_in                     # psum_scatter, all_to_all


def comm_bytes(cfg: ModelConfig, strategy: str, mesh_shape: dict, batch: int, dtype_bytes: float = 4,
               tokens: int = 1) -> dict:
    """Closed forms of one decode step's collectives, per device, in the book's letters.

    Returns ``{(op, axes): {"calls", "bytes_each", "bytes_in", "bytes_sent"}}`` summed over the
    L layers (``bytes_in`` = what one device puts into the collective, ``bytes_sent`` = what it
    sends under the ring algorithm). With B' = batch x tokens:

    * megatron: 2 AllReduce of [B', D] per layer over the model axes (every mesh axis);
    * moe: 1 AllReduce of [B', D] per layer (attention; 2 in a dense layer), and per MoE layer
      2 AllToAll of the capacity slots E·C·D (``models.expert_parallel.alltoall_bytes`` with
      B/X sequences of ``tokens``) and 1 AllGather of [B'/X, D];
    * batch_kv: 2 AllToAll_Z of Q/O [B', N/(YZ), H] and 2 AllReduce_YZ of [B', D] per layer;
    * seq_kv: AllGather_X of Q [B', N/X, H], AllToAll_X of the packed partials
      [B', N, H + 2] (float32), 2 AllReduce_X of [B', D] per layer;
    * 2d: the AllReduce of attention over (x, yz), then the MLP's AllGather_YZ of
      [B', D/(XYZ)], (matrices - 1) AllReduce_X of [B', F/YZ], ReduceScatter_YZ of [B', D/X],
      and the AllGather over (x, yz) of [B', D/(XYZ)] that gives back the replicated stream.
    """
    s = dict(mesh_shape)
    if strategy == "moe":
        return _moe_comm_bytes(cfg, s, batch, tokens, dtype_bytes)
    B, D, F, N, H, L = batch * tokens, cfg.d_model, cfg.ffw_dim, cfg.num_heads, cfg.head_dim, cfg.num_layers
    b = dtype_bytes
    rows = []  # (op, axes, group size, bytes in per call, calls per layer)
    if strategy == "megatron":
        axes = tuple(s)
        rows += [("psum", axes, math.prod(s.values()), B * D * b, 2)]
    elif strategy == "batch_kv":
        Y, Z = s["y"], s["z"]
        rows += [("all_to_all", ("z",), Z, B * N / (Y * Z) * H * b, 2), ("psum", ("y", "z"), Y * Z, B * D * b, 2)]
    elif strategy == "seq_kv":
        X = s["x"]
        rows += [("all_gather", ("x",), X, B * N / X * H * b, 1), ("all_to_all", ("x",), X, B * N * (H + 2) * 4, 1),
                 ("psum", ("x",), X, B * D * b, 2)]
    elif strategy == "2d":
        X, YZ = s["x"], s["yz"]
        rows += [("psum", ("x", "yz"), X * YZ, B * D * b, 1), ("all_gather", ("yz",), YZ, B * D / (X * YZ) * b, 1),
                 ("psum", ("x",), X, B * F / YZ * b, cfg.mlp_matrices - 1),
                 ("psum_scatter", ("yz",), YZ, B * D / X * b, 1),
                 ("all_gather", ("x", "yz"), X * YZ, B * D / (X * YZ) * b, 1)]
    else:
        raise ValueError(f"[comm_bytes] unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    out = {}
    for op, axes, n, v, calls in rows:
        out[(op, axes)] = {"calls": L * calls, "group_size": n, "bytes_each": v, "bytes_in": L * calls * v,
                           "bytes_sent": L * calls * _ring_sent(op, n, v)}
    return out


def _moe_comm_bytes(cfg: ModelConfig, s: dict, batch: int, tokens: int, b: float) -> dict:
    """moe: per layer the attention's AllReduce of [B', D] (and a dense layer's MLP one); per
    MoE layer 2 AllToAll of the slot grid E·C·D (C = B/X · capacity(tokens)) and the
    AllGather of [B/X, tokens, D]."""
    axes, n = tuple(s), math.prod(s.values())
    L, L_moe, D = cfg.num_layers, cfg.num_moe_layers, cfg.d_model
    a2a = alltoall_bytes(cfg, batch / n, tokens, n, b)
    rows = [("psum", n, batch * tokens * D * b, L + (L - L_moe)), ("all_to_all", n, a2a["bytes_in"], 2 * L_moe),
            ("all_gather", n, batch / n * tokens * D * b, L_moe)]
    return {(op, axes): {"calls": calls, "group_size": n, "bytes_each": v, "bytes_in": calls * v,
                         "bytes_sent": calls * _ring_sent(op, n, v)} for op, n, v, calls in rows if calls}


def ledger_comm_bytes(ledger) -> dict:
    """``{(op, axes): {"calls", "bytes_in", "bytes_sent"}}`` summed over a ledger's collectives."""
    out: dict = {}
    for e in ledger.events:
        if e.get("flops") or not e["axes"]:
            continue
        key = (e["op"], tuple(e["axes"]))
        d = out.setdefault(key, {"calls": 0, "bytes_in": 0.0, "bytes_sent": 0.0})
        d["calls"] += 1
        d["bytes_in"] += e["bytes_in"]
        d["bytes_sent"] += e["bytes_sent"]
    return out


# ---------------------------------------------------------------------------------------------
# ring attention (sequence-sharded prefill)


def ring_attention(q, k, v, axis: str = "x"):
    """Causal attention of a sequence-sharded block (per device: q [B, S/X, N, H], k, v
    [B, S/X, K, H], device i holding block i) by passing K/V blocks around the ring with
    ``ppermute``: X - 1 shifts, each merged exactly into the running softmax.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> rng = np.random.default_rng(0)
        >>> q, k = rng.standard_normal((2, 2, 16, 4, 8)).astype(np.float32)
        >>> f = sl.shard_map(ring_attention, mesh=sl.make_mesh((4,), ("x",)),
        ...                  in_specs=P(None, "x"), out_specs=P(None, "x"))
        >>> ref = sl.nn.dot_product_attention(q, k, k, is_causal=True)
        >>> bool(np.abs(np.asarray(f(q, k, k)) - ref).max() < 1e-5)
        True
    """
    B, S_l = q.shape[0], q.shape[1]
    n = lax.axis_size(axis)
    me = lax.axis_index(axis)
    q_pos = jnp.reshape(me * S_l + np.arange(S_l), (1, S_l)) + np.zeros((B, 1), np.int64)
    big = np.full(B, 2**30, np.int32)                # every key is within the cache
    parts = []
    perm = [(i, (i + 1) % n) for i in range(n)]
    for step in range(n):
        src = (me - step) % n                      # whose block this device holds now
        key_pos = src * S_l + np.arange(S_l)
        parts.append(partial_attention(q, k, v, q_pos, big, key_pos))
        if step + 1 < n:
            k, v = lax.ppermute(k, axis, perm), lax.ppermute(v, axis, perm)
    num, _, l = merge_partials(parts)
    return finish(num, l, q.dtype)
