"""The planning layer: the global view (einsum, matmul, reshard, jnp on ShardedArrays)."""

from . import global_numpy, global_ops  # noqa: F401  (registers the global-view handlers)
