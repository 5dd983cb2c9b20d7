"""``shardlab.sharding``, as ``jax.sharding``: Mesh, PartitionSpec, NamedSharding."""

from ._src.core.mesh import Mesh  # noqa: F401
from ._src.core.sharding import NamedSharding, PartitionSpec  # noqa: F401

__all__ = ["Mesh", "NamedSharding", "PartitionSpec"]
