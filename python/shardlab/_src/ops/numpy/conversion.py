"""Dtypes, constants and conversions of ``shardlab.numpy``: ``astype``, ``result_type``,
``promote_types``, ``copy``, ``ndim`` / ``shape`` / ``size``, and the dtype and constant names
(``jnp.float32``, ``jnp.pi``, ...).
"""

from __future__ import annotations

import numpy as np

from ...arrays.local_array import LocalArray, register_method
from ...arrays.sharded_array import ShardedArray
from ...core import dtypes as _dt
from ...core.dtypes import bfloat16, float32, float64, int8, int32
from ...primitives import elementwise as ew
from ...primitives.primitive import bind
from .dispatch import _implements, _local, _method, _on_mesh, GLOBAL

__all__ = ["bfloat16", "float32", "float64", "int8", "int32", "bool_", "ndarray", "float16", "int16", "int64",
           "uint16", "uint32", "uint64", "uint8", "e", "inf", "nan", "newaxis", "pi", "ndim", "shape", "size",
           "astype", "copy", "result_type", "promote_types"]


bool_ = np.bool_
ndarray = np.ndarray
int16, int64, uint8, uint16, uint32, uint64, float16 = (np.int16, np.int64, np.uint8, np.uint16, np.uint32,
                                                       np.uint64, np.float16)
pi, e, inf, nan, newaxis = np.pi, np.e, np.inf, np.nan, np.newaxis


@_implements(np.ndim)
def ndim(x) -> int:
    """Rank (the LOCAL rank of a per-device value)."""
    return x.ndim if isinstance(x, LocalArray) else np.ndim(x)


@_implements(np.shape)
def shape(x) -> tuple:
    """Shape (the LOCAL shape of a per-device value)."""
    return x.shape if isinstance(x, LocalArray) else np.shape(x)


@_implements(np.size)
def size(x, axis=None) -> int:
    if isinstance(x, LocalArray):
        return x.size if axis is None else x.shape[axis]
    return np.size(x, axis)


def astype(x, dtype, copy=False):
    """``x`` converted to `dtype` (a primitive: differentiable for float to float)."""
    if isinstance(x, ShardedArray):
        return GLOBAL["astype"](x, dtype)
    if not isinstance(x, LocalArray):
        return _on_mesh(np.asarray(x).astype(_dt.canonicalize_dtype(dtype)))
    dtype = _dt.canonicalize_dtype(dtype)
    return x if dtype == x.dtype else bind(ew.CONVERT, [x], x.mesh, dtype=dtype)


def _inexact(x: LocalArray) -> LocalArray:
    """`x` in dtypes.to_inexact_dtype (int32 -> float32, float64 -> float32 with x64 off)."""
    return astype(x, _dt.to_inexact_dtype(x.dtype))


@_implements(np.copy)
def copy(x, order="K", subok=False):
    return x if _local(x) else np.copy(x, order=order, subok=subok)


def result_type(*args):
    """``jax.numpy.result_type`` (see shardlab.dtypes)."""
    return _dt.result_type(*args)


def promote_types(a, b):
    """``jax.numpy.promote_types`` (see shardlab.dtypes)."""
    return _dt.promote_types(a, b)


register_method("astype", _method(astype))
