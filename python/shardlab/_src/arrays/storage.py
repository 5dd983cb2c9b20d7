"""Storage of a per-device value: a real numpy array, or an abstract one (shape and dtype, no
data) for shape-only programs.

Mesh-factorized storage has shape ``mesh dims + local shape``, where a mesh dim is 1 if the
value is the same on every device along that axis (see docs/concepts.md).

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

from ..core import memory
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
    0 for abstract storage; a storage that holds only part of its values in this process (a
    backend's, e.g. MPI's rank block) says how much itself (``storage.held_nbytes()``)."""
    if is_abstract(storage):
        return 0
    held = getattr(storage, "held_nbytes", None)
    if held is not None:
        return held()
    n = math.prod(s for s, st in zip(storage.shape, storage.strides) if st != 0)
    return int(n) * storage.dtype.itemsize if storage.size else 0


def storage_bytes(shapes) -> int:
    """Bytes of storages of `shapes` ((shape, dtype) pairs), in Python ints (no overflow)."""
    return sum(math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize for shape, dtype in shapes)


def check_outputs(op: str, shapes, hint: str = "") -> None:
    """The one allocation check for storages: MemoryError ``[op] needs N GiB, more than the M
    GiB this machine has; <hint>`` when storages of `shapes` ((shape, dtype) pairs) together
    exceed this machine's memory. device_put, every primitive's outputs (``bind``) and the
    global functions call it; the C++ core's allocator checks its own buffers the same way.

    Example:
        >>> import numpy as np
        >>> check_outputs("broadcast", [((2, 4, 16), np.float32)])   # 512 bytes: nothing happens
        >>> try:
        ...     check_outputs("broadcast", [((1, 1, 2**31, 2**31), np.float32)], "shard it")
        ... except MemoryError as e:
        ...     print(str(e).split(",")[0])
        [broadcast] needs 17179869184 GiB
    """
    memory.check_alloc(op, storage_bytes(shapes), hint)


def refused(op: str, shapes, hint: str, cause: BaseException):
    """Raises the MemoryError for outputs of `shapes` that numpy or the system refused to make
    (`cause`, see ``memory.is_refusal``)."""
    memory.refused(op, storage_bytes(shapes), hint, cause)
