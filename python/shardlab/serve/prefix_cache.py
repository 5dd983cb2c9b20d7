"""A prefix cache: an LRU over KV blocks of shared prompt prefixes, with its hit rate.

Block ``j`` of prefix ``p`` holds that prefix's tokens ``[j * block_size, (j + 1) * block_size)``.
A lookup hits the longest run of cached blocks from the start (a later block is useless
without the earlier ones, as in a prefix tree); the blocks a request then computes are inserted,
evicting the least recently used.

Example:
    >>> from shardlab.serve.prefix_cache import PrefixCache
    >>> c = PrefixCache(capacity_blocks=4)
    >>> c.lookup("sys", 3), c.insert("sys", 3), c.lookup("sys", 3)
    (0, None, 3)
    >>> round(c.hit_rate, 2)
    0.5
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
        self.blocks: OrderedDict = OrderedDict()
        self.lookups = 0
        self.hits = 0

    def lookup(self, prefix, n_blocks: int) -> int:
        """How many leading blocks of ``prefix`` are cached (they become most recent)."""
        self.lookups += n_blocks
        hit = 0
        while hit < n_blocks and (prefix, hit) in self.blocks:
            self.blocks.move_to_end((prefix, hit))
            hit += 1
        self.hits += hit
        return hit

    def insert(self, prefix, n_blocks: int) -> None:
        """Caches blocks ``0..n_blocks-1`` of ``prefix``, evicting least recently used ones."""
        if self.capacity == 0:
            return
        for j in range(min(n_blocks, self.capacity)):
            key = (prefix, j)
            if key in self.blocks:
                self.blocks.move_to_end(key)
            else:
                self.blocks[key] = True
                if len(self.blocks) > self.capacity:
                    self.blocks.popitem(last=False)

    @property
    def hit_rate(self) -> float:
        """Blocks found over blocks looked up (0 when nothing was looked up)."""
        return self.hits / self.lookups if self.lookups else 0.0
