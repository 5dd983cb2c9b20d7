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

The layouts (axes, param and cache splits, checks) are :mod:`~shardlab.serve.layouts`, each
layout's per-device attention and MLP :mod:`~shardlab.serve.decode_blocks`, and ``comm_bytes``
(:mod:`~shardlab.serve.decode_bytes`) the closed forms of the bytes each device puts into every
collective per step; the tests compare them with the ledger of a real run.

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

import numpy as np

import shardlab as sl
from shardlab import P
from shardlab.models import ModelConfig
from shardlab.models.layers import norm
from shardlab.train import context

from .decode_blocks import (attn_batch_kv, attn_megatron, attn_seq_kv, ffw_2d, mlp_2d, mlp_megatron,
                            moe_expert_sharded)
from .decode_bytes import comm_bytes, ledger_comm_bytes
from .generate import embed, forward_cached, head
from .kv_cache import ContiguousKVCache, PagedKVCache
from .layouts import CACHE_AXES, STRATEGIES, axis_sizes, check_layout, param_specs
from .mesh_cache import MeshKVCache
from .sampling import Sampler

__all__ = ["STRATEGIES", "decode_step", "generate_sharded", "comm_bytes", "ledger_comm_bytes", "mlp_2d",
           "ring_attention", "check_layout"]


class _Decoder:
    """Decode steps of one batch on ``mesh``: the params are placed on the mesh once, the
    shard_map'd step is built once, and the cache stays on the devices between steps
    (:class:`~shardlab.serve.mesh_cache.MeshKVCache`); only the tokens go in and the logits come
    out each step."""

    def __init__(self, params: dict, cfg: ModelConfig, mesh, strategy: str, cache, seqs=None):
        s = axis_sizes(mesh, strategy)
        batch = len(seqs) if seqs is not None else cache.batch
        max_len = cache.max_len if isinstance(cache, ContiguousKVCache) else cache.num_blocks * cache.block_size
        check_layout(cfg, strategy, s, batch, max_len)
        b, q, k = CACHE_AXES[strategy]
        self.cache = MeshKVCache(cache, mesh, batch=b, seq=q, kv=k, seqs=seqs)
        specs = param_specs(params, strategy)
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
                a, k, v = attn_batch_kv(layer["attn"], h, pos, kc, vc, lengths, cfg, s, store)
            elif strategy == "seq_kv":
                a, k, v = attn_seq_kv(layer["attn"], h, pos, kc, vc, lengths, cfg, s["x"])
            elif strategy == "2d":
                a, k, v = attn_megatron(layer["attn"], h, pos, kc, vc, lengths, cfg, s["x"] * s["yz"], ("x", "yz"),
                                         store)
            else:
                a, k, v = attn_megatron(layer["attn"], h, pos, kc, vc, lengths, cfg, s["x"], "x", store)
            if store is None:                    # the host writes this layout's new token
                new_k.append(k)
                new_v.append(v)
            x = x + a
            h = norm(layer["mlp_norm"], x, cfg)
            if strategy == "2d":
                x = x + ffw_2d(layer["mlp"], h, cfg, s)
            elif strategy == "moe" and cfg.is_moe_layer(i):
                x = x + moe_expert_sharded(layer["moe"], h, cfg, s["x"])
            elif strategy == "batch_kv":
                x = x + mlp_megatron(layer["mlp"], h, cfg, ("y", "z"))
            else:
                x = x + mlp_megatron(layer["mlp"], h, cfg, "x")
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
    s = axis_sizes(mesh, strategy)
    seqs = list(range(B))
    if cache == "contiguous":
        n = mesh.size
        host = ContiguousKVCache(cfg, B, max_len or -(-(T0 + max_new_tokens) // n) * n)
    elif cache == "paged":
        batch_axis, seq_axis, _ = CACHE_AXES[strategy]
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


def ring_attention(q, k, v, axis: str = "x"):
    """Causal attention of a sequence-sharded prefill block (per device: q [B, S/X, N, H], k, v
    [B, S/X, K, H], device i holding block i) by passing K/V blocks around the ring with
    ``ppermute``: X - 1 shifts, each merged exactly into the running softmax. The ring is
    :func:`shardlab.train.context.ring_attention`'s, with the contiguous layout.

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
    return context.ring_attention(q, k, v, axis, is_causal=True, layout="contiguous")
