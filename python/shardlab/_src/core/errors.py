"""The error classes shardlab shares with JAX.

``ShardingTypeError`` is what JAX raises when an op's output sharding, under explicit
sharding, is ambiguous or illegal (``jax.sharding.ShardingTypeError``). shardlab's is also a
ValueError, so code written against shardlab's earlier ValueErrors for the same conflicts
still catches it.

Example:
    >>> from shardlab.sharding import ShardingTypeError
    >>> issubclass(ShardingTypeError, ValueError)
    True
"""


class ShardingTypeError(ValueError):
    """An op's output sharding is ambiguous or illegal under explicit sharding (as JAX's)."""
