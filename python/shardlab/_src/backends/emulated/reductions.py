"""The emulated backend's reductions over local axes (sum, prod, max, min, any, all, argmax,
argmin, cumsum) and broadcast."""

from __future__ import annotations

import numpy as np

from ...core.dtypes import default_int_dtype
from ...primitives import broadcasting as bc
from ...primitives import reductions as red
from .common import _impl


def _reduction_impl(prim, ufunc, accumulate=False):
    """`ufunc.reduce` over the local axes (what np.sum / np.max call, without their wrappers)."""
    dtype_of = prim.shape_rule.dtype_of

    def impl(storages, mesh, *, axes, keepdims=False, **_):
        x = storages[0]
        dt = dtype_of(x.dtype)
        k = mesh.ndim
        axis = tuple(k + a for a in axes)
        if accumulate:
            out = np.asarray(ufunc.reduce(x, axis=axis, dtype=dt, keepdims=keepdims))
        else:
            out = np.asarray(ufunc.reduce(x, axis=axis, keepdims=keepdims))
        return [out if out.dtype == dt else out.astype(dt)]

    prim.impl["emulated"] = impl


_reduction_impl(bc.REDUCE_SUM, np.add, accumulate=True)
_reduction_impl(red.REDUCE_PROD, np.multiply, accumulate=True)
_reduction_impl(red.REDUCE_MAX, np.maximum)
_reduction_impl(red.REDUCE_MIN, np.minimum)
_reduction_impl(red.REDUCE_ANY, np.logical_or)
_reduction_impl(red.REDUCE_ALL, np.logical_and)


def _arg_impl(np_fn):
    def impl(storages, mesh, *, axes, keepdims=False):
        (axis,) = axes
        return [np_fn(storages[0], axis=mesh.ndim + axis, keepdims=keepdims).astype(default_int_dtype())]

    return impl


red.ARGMAX.impl["emulated"] = _arg_impl(np.argmax)
red.ARGMIN.impl["emulated"] = _arg_impl(np.argmin)


@_impl(red.CUMSUM)
def _cumsum(storages, mesh, *, axis, reverse=False):
    x = storages[0]
    ax = mesh.ndim + axis
    dt = red.cumsum_dtype(x.dtype)
    if reverse:
        return [np.flip(np.cumsum(np.flip(x, ax), axis=ax, dtype=dt), ax)]
    return [np.cumsum(x, axis=ax, dtype=dt)]


@_impl(bc.BROADCAST)
def _broadcast(storages, mesh, *, local_shape):
    k = mesh.ndim
    x = storages[0]
    r = len(local_shape)
    x = x.reshape(tuple(x.shape[:k]) + (1,) * (r - (x.ndim - k)) + tuple(x.shape[k:]))
    return [np.broadcast_to(x, tuple(x.shape[:k]) + tuple(local_shape))]
