"""The planning layer: the global view (einsum, matmul, reshard, jnp on ShardedArrays)."""

from . import global_index, global_numpy, global_ops, sharding_api  # noqa: F401  (registers the global-view handlers)
