"""``shardlab.sharding``, as ``jax.sharding``: Mesh, AbstractMesh, AxisType, PartitionSpec,
NamedSharding, SingleDeviceSharding, Sharding and the mesh context."""

from ._src.core.errors import ShardingTypeError  # noqa: F401
from ._src.core.mesh import (  # noqa: F401
    AbstractMesh, AxisType, Mesh, get_abstract_mesh, set_mesh, use_abstract_mesh,
)
from ._src.core.mesh import context_mesh as get_mesh  # noqa: F401  (JAX's: the empty Mesh() when none is set)
from ._src.core.sharding import NamedSharding, PartitionSpec, Sharding, SingleDeviceSharding  # noqa: F401
from ._src.transforms.shard_map import Infer  # noqa: F401  (shard_map's default in_specs)
from ._src.planning.sharding_api import auto_axes, explicit_axes, reshard  # noqa: F401
from ._src.arrays.typeof import ManualAxisType  # noqa: F401,E402

__all__ = ["AbstractMesh", "AxisType", "Infer", "Mesh", "NamedSharding", "PartitionSpec", "Sharding", "ShardingTypeError",
           "SingleDeviceSharding", "get_abstract_mesh", "get_mesh", "set_mesh", "use_abstract_mesh"]
__all__ += ["auto_axes", "explicit_axes", "reshard"]
__all__ += ["ManualAxisType"]
