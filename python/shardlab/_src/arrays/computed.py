"""What every shardlab array answers about its buffers, as a ``jax.Array`` does.

shardlab computes each op when it is called and keeps every buffer in this process's memory,
so an array is always ready, never deleted and fully addressable: ``block_until_ready`` returns
it, ``copy_to_host_async`` has nothing to do.

Example:
    >>> import shardlab.numpy as jnp
    >>> x = jnp.ones(3)
    >>> x.block_until_ready() is x, x.is_ready(), x.is_deleted(), x.is_fully_addressable
    (True, True, False, True)
"""


class ComputedArray:
    """Mixin: the buffer-state methods of ``jax.Array`` for arrays computed eagerly in host memory."""

    __slots__ = ()

    def block_until_ready(self):
        """Returns the array: it is computed when the op returns."""
        return self

    def copy_to_host_async(self) -> None:
        """Nothing to do: the data lives in host memory already."""

    def is_ready(self) -> bool:
        """True: ops return computed arrays."""
        return True

    def is_deleted(self) -> bool:
        """False: shardlab does not delete (donate) buffers."""
        return False

    def delete(self) -> None:
        """Accepted for JAX's API; the memory is freed with the last reference."""

    @property
    def is_fully_addressable(self) -> bool:
        """True: every virtual device belongs to this one process."""
        return True
