"""What follows from a value's ``shape`` and ``dtype``: ``ndim``, ``size``, ``itemsize``, ``nbytes``.

Example:
    >>> import numpy as np
    >>> from shardlab._src.arrays.storage import AbstractStorage
    >>> s = AbstractStorage((2, 3), np.float32)
    >>> s.ndim, s.size, s.itemsize, s.nbytes
    (2, 6, 4, 24)
"""

import math


class Shaped:
    """Mixin for anything with ``shape`` and ``dtype`` (arrays, storages, abstract values)."""

    __slots__ = ()

    @property
    def ndim(self) -> int:
        """The rank."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements."""
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of the whole value (global, for a sharded array)."""
        return self.size * self.itemsize
