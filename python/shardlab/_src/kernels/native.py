"""The C++ core moves six dtypes (float32, float64, bfloat16, int32, int8, bool); JAX has more.
These helpers hand it any other dtype: data movement sees the same bits under a core dtype of
the same size, reductions run in a wider core dtype and convert back (integers wrap as JAX's
do).

Example:
    >>> import numpy as np
    >>> from shardlab._src.kernels.native import copy
    >>> copy(np.arange(6, dtype=np.uint16).reshape(2, 3).T).tolist()
    [[0, 3], [1, 4], [2, 5]]
"""

from __future__ import annotations

import numpy as np

import shardlab._core as _core

from ..core.dtypes import bfloat16

CORE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), bfloat16, np.dtype(np.int32), np.dtype(np.int8),
               np.dtype(np.bool_))
_SAME_SIZE = {1: np.dtype(np.int8), 2: bfloat16, 4: np.dtype(np.int32), 8: np.dtype(np.float64)}


def as_bits(x: np.ndarray) -> np.ndarray:
    """`x` viewed as a core dtype of the same item size (no copy), for pure data movement."""
    return x if x.dtype in CORE_DTYPES else x.view(_SAME_SIZE[x.dtype.itemsize])


def wide(dtype) -> np.dtype:
    """The core dtype a reduction of `dtype` runs in: exact for every value of `dtype`."""
    dtype = np.dtype(dtype)
    if dtype in CORE_DTYPES:
        return dtype
    if dtype.kind == "f":
        return np.dtype(np.float32) if dtype.itemsize <= 4 else np.dtype(np.float64)
    if dtype.itemsize <= 2:
        return np.dtype(np.int32)
    return np.dtype(np.float64)


def narrow(x: np.ndarray, dtype) -> np.ndarray:
    """A reduction's result back in `dtype`; integers wrap modulo 2**bits, as JAX's do."""
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    if dtype.kind in "iu" and x.dtype.kind == "f":
        bits = 8 * dtype.itemsize
        x = np.mod(np.rint(x), 2.0 ** bits)
        if dtype.kind == "i":
            x = np.where(x >= 2.0 ** (bits - 1), x - 2.0 ** bits, x)
    return x.astype(dtype)


def copy(x: np.ndarray) -> np.ndarray:
    """A contiguous copy of any strided view, by the core's parallel copy."""
    return _core.copy(as_bits(x)).view(x.dtype)
