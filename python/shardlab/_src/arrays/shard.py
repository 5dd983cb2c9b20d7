"""Shard: one device's piece of an array, as ``jax.Shard``.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> a = sl.device_put(np.arange(4.0), sl.NamedSharding(sl.make_mesh((2,), ("x",)), P("x")))
    >>> s = a.addressable_shards[1]
    >>> s.device.id, s.index, s.data.tolist()
    (1, (slice(2, 4, None),), [2.0, 3.0])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.mesh import Device


@dataclass(frozen=True)
class Shard:
    """One device's piece of a ShardedArray, as ``jax.Shard`` (its data an array on that device)."""

    device: Device
    index: tuple
    data: np.ndarray
    replica_id: int

    def __repr__(self):  # JAX's
        return f"Shard(device={self.device!r}, index={self.index}, replica_id={self.replica_id}, data={self.data})"
