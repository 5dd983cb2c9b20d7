"""The planning layer: the global view (einsum, matmul, reshard, jnp on ShardedArrays)."""

# importing the modules registers the global-view handlers
from . import global_index, global_numpy, global_ops, global_shapes, sharding_api  # noqa: F401
