"""Storage of a per-device value: a real numpy array, or an abstract one (shape and dtype, no
data) for shape-only programs.

Mesh-factorized storage has shape ``mesh dims + local shape``, where a mesh dim is 1 if the
value is the same on every device along that axis (see DESIGN.md).

Example:
    >>> import numpy as np
    >>> from shardlab._src.arrays.storage import AbstractStorage
    >>> s = AbstractStorage((16, 1, 4096, 8192), np.float32)
    >>> s.shape, s.dtype, s.nbytes
    ((16, 1, 4096, 8192), dtype('float32'), 2147483648)
"""

from __future__ import annotations

import math

import numpy as np

from .shaped import Shaped


class AbstractStorage(Shaped):
    """A storage with shape and dtype but no buffer (abstract mode)."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)




    def __repr__(self):
        return f"AbstractStorage(shape={self.shape}, dtype={self.dtype})"

    def __array__(self, dtype=None, copy=None):
        raise TypeError("[abstract] this value has a shape and dtype but no data (it comes from an "
                        "abstract mesh or eval_shape); run the program on a real mesh to get values")


def is_abstract(storage) -> bool:
    return type(storage) is AbstractStorage


def host_nbytes(storage) -> int:
    """Bytes of host memory behind a (possibly broadcast) view: stride-0 dims count once;
    0 for abstract storage."""
    if is_abstract(storage):
        return 0
    n = math.prod(s for s, st in zip(storage.shape, storage.strides) if st != 0)
    return int(n) * storage.dtype.itemsize if storage.size else 0
