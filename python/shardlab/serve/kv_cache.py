"""KV caches: one contiguous slab per sequence, or paged blocks with a block table.

Both hold, for every layer, the keys and values of the tokens a sequence has seen so far, and
expose the same three calls the decoding loop uses: ``reserve(seqs, n)`` (room for ``n`` more
tokens, or a clear error), ``write(layer, seqs, k, v)`` (at each sequence's current length) and
``view(layer, seqs)`` (keys and values as ``[B, S, K, H]`` with ``lengths``), then
``advance(seqs, n)`` once every layer is written.

* :class:`ContiguousKVCache`: ``[L, B, S_max, K, H]`` -- each sequence owns ``S_max`` slots
  whether it uses them or not (the padding the book's part 7 warns about).
* :class:`PagedKVCache`: a pool of ``num_blocks`` blocks of ``block_size`` tokens, a free list,
  and one block table per sequence (PagedAttention). Memory follows use; ``fork`` shares the
  blocks of a common prefix by reference count. With ``shards`` > 1 the pool is cut into that
  many equal ranges, each with its own free list, and a sequence takes blocks only from its own
  shard: the layout of a pool split over a batch mesh axis (``shardlab.serve.mesh_cache``).

Example:
    >>> import numpy as np
    >>> from shardlab.models import ModelConfig
    >>> from shardlab.serve import PagedKVCache
    >>> cfg = ModelConfig(num_layers=1, d_model=8, ffw_dim=16, num_heads=2, vocab_size=10)
    >>> c = PagedKVCache(cfg, num_blocks=4, block_size=2)
    >>> c.add_sequence("a"); c.reserve(["a"], 3)
    >>> c.block_table("a"), c.num_free_blocks
    ([0, 1], 2)
"""

from __future__ import annotations

from collections import deque

import numpy as np

import shardlab.numpy as jnp
from shardlab.models import ModelConfig

__all__ = ["ContiguousKVCache", "PagedKVCache", "CacheFullError"]


class CacheFullError(ValueError):
    """A sequence would outgrow its cache, or the block pool has too few free blocks."""


def _np_dtype(dtype):
    return np.dtype(jnp.bfloat16) if dtype in ("bfloat16", "bf16") else np.dtype(dtype)


class ContiguousKVCache:
    """``[L, B, max_len, K, H]`` keys and values plus a length per row.

    Args:
        cfg: the model (L, K, H).
        batch: rows (sequences).
        max_len: slots per row; a sequence longer than this raises :class:`CacheFullError`.
        dtype: element type of the cache arrays.
    """

    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, dtype="float32"):
        if batch < 1 or max_len < 1:
            raise ValueError(f"[ContiguousKVCache] batch {batch} and max_len {max_len} must be >= 1")
        self.cfg, self.batch, self.max_len = cfg, batch, max_len
        shape = (cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim)
        self.k = np.zeros(shape, _np_dtype(dtype))
        self.v = np.zeros(shape, _np_dtype(dtype))
        self.lengths = np.zeros(batch, np.int64)

    def reserve(self, seqs, n: int) -> None:
        rows = np.asarray(seqs)
        need = self.lengths[rows] + n
        if need.max(initial=0) > self.max_len:
            r = int(rows[np.argmax(need)])
            raise CacheFullError(
                f"[kv_cache] context {int(need.max())} tokens of row {r} is longer than the cache "
                f"(max_len {self.max_len}); allocate a cache with max_len >= {int(need.max())} or "
                f"generate fewer tokens")

    def write(self, layer: int, seqs, k, v) -> None:
        """Stores k, v [B, T, K, H] at positions ``lengths[seqs] ..``."""
        T = k.shape[1]
        for i, r in enumerate(np.asarray(seqs)):
            s = self.lengths[r]
            self.k[layer, r, s:s + T] = np.asarray(k[i])
            self.v[layer, r, s:s + T] = np.asarray(v[i])

    def advance(self, seqs, n: int) -> None:
        self.lengths[np.asarray(seqs)] += n

    def view(self, layer: int, seqs):
        """(k, v, lengths) of ``seqs``: ``[B, max_len, K, H]`` and ``[B]``."""
        rows = np.asarray(seqs)
        return self.k[layer, rows], self.v[layer, rows], self.lengths[rows].copy()

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def utilization(self) -> float:
        """Cached tokens over slots."""
        return float(self.lengths.sum()) / (self.batch * self.max_len)


class PagedKVCache:
    """A pool of fixed-size blocks shared by all sequences (PagedAttention).

    Args:
        cfg: the model.
        num_blocks: blocks in the pool.
        block_size: tokens per block.
        dtype: element type.
        shards: ranges the pool is cut into (blocks ``[g n, (g + 1) n)`` form shard g, n =
            ``num_blocks / shards``); a sequence allocates from the shard given to
            :meth:`add_sequence`.

    A sequence's tokens live in the blocks its ``block_table`` lists, in order; position ``p``
    is slot ``p % block_size`` of block ``table[p // block_size]``. Blocks are reference
    counted so a forked sequence shares its parent's full blocks (a prefix) without copying.
    """

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int = 16, dtype="float32", *,
                 shards: int = 1):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"[PagedKVCache] num_blocks {num_blocks} and block_size {block_size} "
                             f"must be >= 1")
        if shards < 1 or num_blocks % shards:
            raise ValueError(f"[PagedKVCache] shards {shards} must be >= 1 and divide num_blocks {num_blocks}")
        self.cfg, self.num_blocks, self.block_size = cfg, num_blocks, block_size
        self.shards, self.shard_blocks = shards, num_blocks // shards
        shape = (cfg.num_layers, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.k = np.zeros(shape, _np_dtype(dtype))
        self.v = np.zeros(shape, _np_dtype(dtype))
        self.free_lists = [deque(range(g * self.shard_blocks, (g + 1) * self.shard_blocks)) for g in range(shards)]
        self.refs = np.zeros(num_blocks, np.int64)
        self.tables: dict = {}
        self.lengths: dict = {}
        self.shard_of: dict = {}

    # -- bookkeeping ----------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return sum(len(f) for f in self.free_lists)

    def block_table(self, seq) -> list[int]:
        return list(self.tables[seq])

    def add_sequence(self, seq, shard: int = 0) -> None:
        """A new empty sequence whose blocks come from ``shard``."""
        if seq in self.tables:
            raise ValueError(f"[PagedKVCache] sequence {seq!r} already exists")
        if not 0 <= shard < self.shards:
            raise ValueError(f"[PagedKVCache] shard {shard} of sequence {seq!r} is not in [0, {self.shards})")
        self.tables[seq], self.lengths[seq], self.shard_of[seq] = [], 0, shard

    def fork(self, parent, child, tokens: int | None = None) -> None:
        """``child`` starts with the first ``tokens`` (default: all full blocks) of ``parent``,
        sharing whole blocks by reference; a partial last block is copied."""
        n = self.lengths[parent] if tokens is None else tokens
        full = n // self.block_size
        self.add_sequence(child, self.shard_of[parent])
        shared = self.tables[parent][:full]
        self.refs[shared] += 1
        self.tables[child] = list(shared)
        self.lengths[child] = full * self.block_size
        rest = n - full * self.block_size
        if rest:
            self.reserve([child], rest)
            src, dst = self.tables[parent][full], self.tables[child][full]
            self.k[:, dst, :rest] = self.k[:, src, :rest]
            self.v[:, dst, :rest] = self.v[:, src, :rest]
            self.lengths[child] = n

    def release(self, seq) -> None:
        """Frees the blocks of ``seq`` no other sequence references."""
        for b in self.tables.pop(seq):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free_lists[b // self.shard_blocks].append(b)
        del self.lengths[seq], self.shard_of[seq]

    def blocks_needed(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def reserve(self, seqs, n: int) -> None:
        """Allocates blocks so every sequence in ``seqs`` has room for ``n`` more tokens."""
        need = {s: self.blocks_needed(self.lengths[s] + n) - len(self.tables[s]) for s in seqs}
        for g, free in enumerate(self.free_lists):
            mine = [s for s in need if self.shard_of[s] == g]
            total = sum(max(0, need[s]) for s in mine)
            if total > len(free):
                have = (f"only {len(free)} of {self.num_blocks} are free" if self.shards == 1 else
                        f"shard {g} has only {len(free)} free of its {self.shard_blocks}")
                raise CacheFullError(
                    f"[kv_cache] {len(mine)} sequence(s) need {total} more blocks of {self.block_size} tokens "
                    f"but {have} (short by {total - len(free)}); release finished sequences or grow num_blocks")
        for s, x in need.items():
            free = self.free_lists[self.shard_of[s]]
            for _ in range(max(0, x)):
                b = free.popleft()
                self.refs[b] = 1
                self.tables[s].append(b)

    # -- data -----------------------------------------------------------------------------------
    def _slots(self, seq, start: int, n: int):
        pos = np.arange(start, start + n)
        table = np.asarray(self.tables[seq])
        return table[pos // self.block_size], pos % self.block_size

    def write(self, layer: int, seqs, k, v) -> None:
        for i, s in enumerate(seqs):
            T = k.shape[1]
            blk, off = self._slots(s, self.lengths[s], T)
            self.k[layer, blk, off] = np.asarray(k[i])
            self.v[layer, blk, off] = np.asarray(v[i])

    def advance(self, seqs, n: int) -> None:
        for s in seqs:
            self.lengths[s] += n

    def view(self, layer: int, seqs):
        """Keys and values gathered through the block tables into ``[B, S, K, H]`` (S = the
        longest table, padded), with the lengths."""
        width = max((len(self.tables[s]) for s in seqs), default=0) or 1
        idx = np.zeros((len(seqs), width), np.int64)
        for i, s in enumerate(seqs):
            t = self.tables[s]
            idx[i, :len(t)] = t
        B = len(seqs)
        shape = (B, width * self.block_size, self.cfg.num_kv_heads, self.cfg.head_dim)
        k = self.k[layer, idx].reshape(shape)
        v = self.v[layer, idx].reshape(shape)
        return k, v, np.array([self.lengths[s] for s in seqs], np.int64)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def utilization(self) -> float:
        """Blocks in use over blocks in the pool."""
        return 1.0 - self.num_free_blocks / self.num_blocks
