"""A prefix cache: an LRU over KV blocks of shared prompt prefixes, with its hit rate.

Block ``j`` of prefix ``p`` holds that prefix's tokens ``[j * block_size, (j + 1) * block_size)``.
A lookup hits the longest run of cached blocks from the start (a later block is useless
without the earlier ones, as in a prefix tree); the blocks a request then computes are inserted,
evicting the least recently used.

Every lookup and insert touches blocks ``0 .. m-1`` of one prefix in order, so the LRU order is
kept as segments ``(prefix, lo, hi)`` -- runs of blocks last touched together, least recent
first -- rather than one entry per block: an operation costs the number of segments of its
prefix (a handful), not the number of blocks. Eviction still removes one block at a time, the
least recent, exactly as a per-block LRU would (a test replays random operations against one).

Example:
    >>> from shardlab.serve.prefix_cache import PrefixCache
    >>> c = PrefixCache(capacity_blocks=4)
    >>> c.lookup("sys", 3), c.insert("sys", 3), c.lookup("sys", 3)
    (0, None, 3)
    >>> round(c.hit_rate, 2), len(c)
    (0.5, 3)
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["PrefixCache"]


class PrefixCache:
    """LRU of ``capacity_blocks`` blocks keyed by (prefix id, block index)."""

    def __init__(self, capacity_blocks: int):
        if capacity_blocks < 0:
            raise ValueError(f"[PrefixCache] capacity_blocks {capacity_blocks} must be >= 0")
        self.capacity = capacity_blocks
        self.lookups = 0
        self.hits = 0
        self._size = 0
        self._order: OrderedDict = OrderedDict()     # segment id -> [prefix, lo, hi], least recent first
        self._segs: dict = {}                        # prefix -> {segment id: segment}
        self._ids = 0

    def __len__(self) -> int:
        """Blocks cached."""
        return self._size

    def __contains__(self, key) -> bool:
        """``(prefix, j) in cache``: block j of prefix is cached."""
        prefix, j = key
        return any(s[1] <= j < s[2] for s in self._segs.get(prefix, {}).values())

    def keys(self) -> list:
        """Cached ``(prefix, block)`` keys, least recently used first."""
        return [(s[0], j) for s in self._order.values() for j in range(s[1], s[2])]

    # -- segments -------------------------------------------------------------------------------
    def _leading(self, prefix) -> int:
        """How many blocks from block 0 of ``prefix`` are cached without a gap."""
        h = 0
        for lo, hi in sorted((s[1], s[2]) for s in self._segs.get(prefix, {}).values()):
            if lo > h:
                break
            h = hi
        return h

    def _take(self, prefix, j: int, m: int) -> int:
        """Detaches the cached run of ``prefix`` that starts at block ``j`` (up to ``m``) from
        its old segment; returns where the run ends (``j`` when block j is not cached)."""
        segs = self._segs.get(prefix, {})
        for sid, s in segs.items():
            if s[1] <= j < s[2]:
                end = min(s[2], m)
                if end == s[2]:
                    del segs[sid]
                    del self._order[sid]
                else:
                    s[1] = end
                return end
        return j

    def _append(self, prefix, m: int) -> None:
        """Blocks ``0 .. m-1`` of ``prefix`` become the most recent, in order."""
        seg = [prefix, 0, m]
        self._ids += 1
        self._order[self._ids] = seg
        self._segs.setdefault(prefix, {})[self._ids] = seg

    def _evict_one(self) -> None:
        sid, s = next(iter(self._order.items()))
        s[1] += 1
        self._size -= 1
        if s[1] == s[2]:
            del self._order[sid]
            del self._segs[s[0]][sid]

    # -- API ------------------------------------------------------------------------------------
    def lookup(self, prefix, n_blocks: int) -> int:
        """How many leading blocks of ``prefix`` are cached (they become most recent)."""
        self.lookups += n_blocks
        hit = min(self._leading(prefix), max(n_blocks, 0))
        if hit:
            j = 0
            while j < hit:
                j = self._take(prefix, j, hit)
            self._append(prefix, hit)
        self.hits += hit
        return hit

    def insert(self, prefix, n_blocks: int) -> None:
        """Caches blocks ``0..n_blocks-1`` of ``prefix``, evicting least recently used ones."""
        m = min(n_blocks, self.capacity)
        if m <= 0:
            return
        j = 0
        while j < m:
            end = self._take(prefix, j, m)
            if end > j:                      # a cached run moves to the most recent end
                j = end
                continue
            j += 1                           # block j is new: it may push the oldest block out
            self._size += 1
            if self._size > self.capacity:
                self._evict_one()
        self._append(prefix, m)

    @property
    def hit_rate(self) -> float:
        """Blocks found over blocks looked up (0 when nothing was looked up)."""
        return self.hits / self.lookups if self.lookups else 0.0
