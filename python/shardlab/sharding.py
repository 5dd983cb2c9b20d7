"""``shardlab.sharding``, as ``jax.sharding``: Mesh, AxisType, PartitionSpec, NamedSharding."""

from ._src.core.errors import ShardingTypeError  # noqa: F401
from ._src.core.mesh import AxisType, Mesh, get_mesh, set_mesh  # noqa: F401
from ._src.core.sharding import NamedSharding, PartitionSpec  # noqa: F401
from ._src.transforms.shard_map import Infer  # noqa: F401  (shard_map's default in_specs)

__all__ = ["AxisType", "Infer", "Mesh", "NamedSharding", "PartitionSpec", "ShardingTypeError", "get_mesh", "set_mesh"]
