"""The KV cache on a mesh: contiguous rows or a paged block pool, split over the devices as a
decode layout requires, and updated on the devices step after step (the cache never goes back
to the host between tokens).

=====================  ==========================  ===============================================
layout (strategy)      contiguous, per layer       paged, per layer
=====================  ==========================  ===============================================
megatron, moe          KV[B, S, K_X, H]            pool[NB, bs, K_X, H], tables [B, n]
2d                     KV[B, S, K_XYZ, H]          pool[NB, bs, K_XYZ, H], tables [B, n]
batch_kv               KV[B_Z, S, K_Y, H]          pool[NB_Z, bs, K_Y, H], tables [B_Z, n]
seq_kv                 KV[B, S_X, K, H]            not paged (the sequence itself is split)
=====================  ==========================  ===============================================

With the sequence split (seq_kv) the new token's keys and values come out split by heads, and
the device owning position ``len`` needs all of them: that would be an AllGather_X of
``[B, K/X, H]`` per layer, which the layout's closed form leaves out. So this one layout writes
the new token on the host and places the cache again each step (``out_spec`` says how the new
values leave the step).

A paged pool is split over the batch axis by blocks: shard g of the host
:class:`~shardlab.serve.PagedKVCache` (``shards`` = the batch axis size) is the blocks of the
devices that hold batch rows ``[g B/Z, (g + 1) B/Z)``, so a sequence's block table only names
blocks of its own devices and no block ever crosses a link. Each step every device gathers its
sequences' blocks through the (local) block tables into ``[B_local, n bs, K_local, H]`` for
attention, and writes the new token's key and value into slot ``(table[len // bs], len % bs)``
(a one-hot product places each row's new values on its slot, a select keeps the rest). Both are
local: the step's collectives are the layout's, byte for byte. The host cache keeps the
bookkeeping (lengths, block tables, free lists, the :class:`CacheFullError` when a context
outgrows the blocks); :meth:`MeshKVCache.to_host` copies the values back.

Example:
    >>> import numpy as np
    >>> import shardlab as sl
    >>> from shardlab.models import ModelConfig
    >>> from shardlab.serve import PagedKVCache
    >>> from shardlab.serve.mesh_cache import MeshKVCache
    >>> cfg = ModelConfig(num_layers=1, d_model=32, ffw_dim=64, num_heads=4, vocab_size=16)
    >>> host = PagedKVCache(cfg, num_blocks=8, block_size=4, shards=2)
    >>> for b in range(4):
    ...     host.add_sequence(b, shard=b // 2)
    >>> c = MeshKVCache(host, sl.make_mesh((2, 2), ("y", "z")), batch="z", kv="y", seqs=range(4))
    >>> c.k[0].sharding.spec, c.nbytes == host.nbytes
    (P('z', None, 'y'), True)
"""

from __future__ import annotations

import numpy as np

import shardlab as sl
import shardlab.numpy as jnp
from shardlab import P

from .kv_cache import ContiguousKVCache, PagedKVCache

__all__ = ["MeshKVCache"]


def _size(mesh, axes) -> int:
    if axes is None:
        return 1
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    return int(np.prod([dict(mesh.shape)[a] for a in names]))


class MeshKVCache:
    """A host cache's keys and values placed on ``mesh``, split over ``batch`` (rows or pool
    blocks), ``seq`` (contiguous only) and ``kv`` (KV heads) mesh axes.

    Args:
        host: a ContiguousKVCache (rows = sequences 0..B-1) or a PagedKVCache whose ``shards``
            equals the size of ``batch``, sequence ``seqs[i]`` in shard ``i // (B / shards)``.
        mesh: the mesh.
        batch, seq, kv: mesh axis name(s) or None.
        seqs: the sequences decoded together, in batch order (default: every row).

    Per step: :meth:`begin` (host bookkeeping: room for one more token, the index arrays),
    inside ``shard_map`` :meth:`view` and :meth:`write` on the per-device values, then
    :meth:`commit` with the written arrays.
    """

    def __init__(self, host, mesh, *, batch=None, seq=None, kv=None, seqs=None):
        self.host, self.mesh, self.batch_axes, self.seq_axes = host, mesh, batch, seq
        self.paged = isinstance(host, PagedKVCache)
        if not self.paged and not isinstance(host, ContiguousKVCache):
            raise TypeError(f"[MeshKVCache] expected a ContiguousKVCache or PagedKVCache, got {type(host).__name__}")
        self.seqs = list(range(host.batch) if seqs is None else seqs)
        self.B = len(self.seqs)
        self.Z = _size(mesh, batch)
        if self.paged:
            if seq is not None:
                raise ValueError("[generate_sharded] a paged cache cannot split the sequence over the mesh "
                                 "(strategy 'seq_kv'); use a ContiguousKVCache there")
            if host.shards != self.Z:
                raise ValueError(f"[generate_sharded] the paged cache has {host.shards} shard(s) but the batch axis "
                                 f"{batch!r} has {self.Z} devices; build PagedKVCache(..., shards={self.Z})")
            bl = self.B // self.Z
            wrong = [s for i, s in enumerate(self.seqs) if host.shard_of[s] != i // bl]
            if wrong:
                w = wrong[0]
                raise ValueError(f"[generate_sharded] sequence {w!r} is in shard {host.shard_of[w]} of the "
                                 f"paged cache, but its batch row lives on shard {self.seqs.index(w) // bl}; "
                                 f"add row i with shard=i // {bl}")
            self.spec = P(batch, None, kv)
        elif self.seqs != list(range(host.batch)):
            raise ValueError("[generate_sharded] a ContiguousKVCache is decoded with all its rows, in order")
        else:
            self.spec = P(batch, seq, kv)
        self.host_writes = seq is not None
        self.out_spec = P(None, None, seq) if self.host_writes else self.spec
        L = host.cfg.num_layers
        self.k = [self._put(host.k[i]) for i in range(L)]
        self.v = [self._put(host.v[i]) for i in range(L)]

    def _put(self, a):
        return sl.device_put(np.ascontiguousarray(a), sl.NamedSharding(self.mesh, self.spec))

    @property
    def nbytes(self) -> int:
        """Bytes of every key and value array (all devices together)."""
        return sum(a.size * a.dtype.itemsize for a in self.k + self.v)

    # -- host side ------------------------------------------------------------------------------
    def begin(self):
        """Makes room for one more token per sequence (:class:`CacheFullError` when the rows or
        the blocks are too short) and returns ``(lengths [B], index arrays, their specs)``."""
        h = self.host
        h.reserve(self.seqs, 1)
        if not self.paged:
            lengths = h.lengths.copy()
            return lengths, {"pos": lengths}, {"pos": P(self.batch_axes)}
        lengths = np.array([h.lengths[s] for s in self.seqs], np.int64)
        bs, nbl, bl = h.block_size, h.shard_blocks, self.B // self.Z
        width = max(len(h.tables[s]) for s in self.seqs)
        tables = np.zeros((self.B, width), np.int32)
        owner = np.zeros((h.num_blocks, bs, bl), np.float32)
        for i, s in enumerate(self.seqs):
            t = np.asarray(h.tables[s])
            tables[i, :len(t)] = t - h.shard_of[s] * nbl          # block numbers within the shard
            owner[t[lengths[i] // bs], lengths[i] % bs, i % bl] = 1.0   # the row (on its devices) writing there
        return lengths, {"tables": tables, "owner": owner}, {"tables": P(self.batch_axes), "owner": P(self.batch_axes)}

    def commit(self, k: list, v: list) -> None:
        """Keeps the written arrays and advances every sequence by one token."""
        if self.host_writes:
            for i in range(len(k)):
                self.host.write(i, self.seqs, np.asarray(k[i]), np.asarray(v[i]))
                self.k[i], self.v[i] = self._put(self.host.k[i]), self._put(self.host.v[i])
        else:
            self.k, self.v = list(k), list(v)
        self.host.advance(self.seqs, 1)

    def to_host(self) -> None:
        """Copies the keys and values back into the host cache's arrays."""
        for i in range(len(self.k)):
            self.host.k[i] = np.asarray(self.k[i])
            self.host.v[i] = np.asarray(self.v[i])

    # -- per device (inside shard_map) ----------------------------------------------------------
    def view(self, cache, idx):
        """Keys (or values) of this device's sequences as ``[B_local, S, K_local, H]``."""
        if not self.paged:
            return cache
        nb, bs, K, H = cache.shape
        tables = idx["tables"]
        bl, w = tables.shape
        got = jnp.take_along_axis(jnp.reshape(cache, (1, nb, bs * K * H)), jnp.reshape(tables, (bl, w, 1)), axis=1)
        return jnp.reshape(got, (bl, w * bs, K, H))

    def write(self, cache, new, idx):
        """``cache`` with ``new`` [B_local, 1, K_local, H] stored at each sequence's length
        (``new`` itself when the host writes it)."""
        if self.host_writes:
            return new
        if not self.paged:
            bl, S = cache.shape[0], cache.shape[1]
            hit = jnp.equal(jnp.reshape(np.arange(S), (1, S)), jnp.reshape(idx["pos"], (bl, 1)))
            return jnp.where(jnp.reshape(hit, (bl, S, 1, 1)), new, cache)
        nb, bs, K, H = cache.shape
        onehot = idx["owner"]                               # [NB_local, bs, B_local]: 1 where row b writes
        vals = jnp.einsum("nsb,bx->nsx", onehot, jnp.reshape(new, (new.shape[0], K * H)))
        hit = jnp.reshape(jnp.sum(onehot, axis=2), (nb, bs, 1, 1)) > 0
        return jnp.where(hit, jnp.reshape(vals, (nb, bs, K, H)), cache)
