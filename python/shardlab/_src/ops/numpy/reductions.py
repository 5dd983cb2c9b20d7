"""Reductions over local axes: sum, prod, max, min, any, all, mean, var, std, argmax / argmin,
cumsum, the NaN-aware ones, ptp, count_nonzero, average, and the whole-array tests
(``allclose``, ``array_equal``) built on them.
"""

from __future__ import annotations

import builtins
import math

import numpy as np

from ...arrays.local_array import HANDLED, lift, LocalArray, register_method
from ...arrays.sharded_array import ShardedArray
from ...core import dtypes as _dt
from ...primitives import broadcasting as bc, reductions as red
from ...primitives.primitive import bind
from .dispatch import _axes, _global, _implements, _is_local, _local, _method
from .conversion import _inexact, astype
from .manipulation import broadcast_to, reshape
from .creation import full_like
from .elementwise import divide, equal, isclose, isnan, multiply, register_ufunc_reduction, sqrt, subtract, where

__all__ = ["sum", "prod", "max", "min", "amax", "amin", "any", "all", "mean", "var", "std", "argmax", "argmin",
           "cumsum", "cumulative_sum", "nansum", "nanprod", "nanmax", "nanmin", "nanmean", "ptp", "count_nonzero",
           "average", "allclose", "array_equal", "array_equiv"]


def _reducer(prim, np_fn, *, takes_dtype=True):
    """``jnp.<np_fn>`` as primitive ``prim`` over the local axes; ``takes_dtype=False`` for the
    reductions numpy gives no ``dtype`` argument (max, min, any, all)."""
    name = np_fn.__name__

    def reduce(x, axis, dtype, keepdims, kw):
        extra = {"dtype": dtype} if dtype is not None else {}
        if isinstance(x, ShardedArray):
            return _global(np_fn, x, axis=axis, keepdims=keepdims, **({"dtype": dtype} if takes_dtype else {}), **kw)
        if not isinstance(x, LocalArray):
            return np_fn(x, axis=axis, keepdims=keepdims, **extra, **kw)
        if kw:
            raise TypeError(f"[{name}] keyword arguments {sorted(kw)} are not supported on per-device values")
        if dtype is not None:
            x = astype(x, dtype)
        return bind(prim, [x], x.mesh, axes=_axes(axis, x, name), keepdims=bool(keepdims))

    if takes_dtype:
        def fn(x, axis=None, dtype=None, keepdims=False, **kw):
            return reduce(x, axis, dtype, keepdims, kw)
    else:
        def fn(x, axis=None, keepdims=False, **kw):
            return reduce(x, axis, None, keepdims, kw)

    fn.__name__ = name
    fn.__doc__ = f"``numpy.{name}`` over the local axes."
    HANDLED[np_fn] = fn
    return fn


sum = _reducer(bc.REDUCE_SUM, np.sum)  # noqa: A001
prod = _reducer(red.REDUCE_PROD, np.prod)


max = _reducer(red.REDUCE_MAX, np.max, takes_dtype=False)  # noqa: A001
min = _reducer(red.REDUCE_MIN, np.min, takes_dtype=False)  # noqa: A001
amax, amin = max, min
any = _reducer(red.REDUCE_ANY, np.any, takes_dtype=False)  # noqa: A001
all = _reducer(red.REDUCE_ALL, np.all, takes_dtype=False)  # noqa: A001


def _no_kwargs(kw: dict, op: str) -> None:
    if kw:
        raise TypeError(f"[{op}] keyword arguments {sorted(kw)} are not supported on per-device values; "
                        f"use jnp.where to mask inside shard_map")


def _count(x: LocalArray, axes: tuple) -> int:
    return math.prod(x.shape[a] for a in axes)


@_implements(np.mean)
def mean(x, axis=None, dtype=None, keepdims=False, **kw):
    """Mean over the local axes (integers give float32, as jax.numpy with x64 off)."""
    if isinstance(x, ShardedArray):
        return _global(np.mean, x, axis=axis, dtype=dtype, keepdims=keepdims, **kw)
    if not isinstance(x, LocalArray):
        return np.mean(x, axis=axis, dtype=dtype, keepdims=keepdims, **kw)
    _no_kwargs(kw, "mean")
    x = _inexact(x) if dtype is None else astype(x, dtype)
    s = sum(x, axis=axis, keepdims=keepdims)
    return divide(s, x.dtype.type(builtins.max(_count(x, _axes(axis, x, "mean")), 1)))


@_implements(np.var)
def var(x, axis=None, dtype=None, ddof=0, keepdims=False, **kw):
    if isinstance(x, ShardedArray):
        return _global(np.var, x, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims, **kw)
    if not isinstance(x, LocalArray):
        return np.var(x, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims, **kw)
    _no_kwargs(kw, "var")
    x = _inexact(x) if dtype is None else astype(x, dtype)
    d = subtract(x, mean(x, axis=axis, keepdims=True))
    s = sum(multiply(d, d), axis=axis, keepdims=keepdims)
    return divide(s, x.dtype.type(builtins.max(_count(x, _axes(axis, x, "var")) - ddof, 0)))


@_implements(np.std)
def std(x, axis=None, dtype=None, ddof=0, keepdims=False, **kw):
    if isinstance(x, ShardedArray):
        return _global(np.std, x, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims, **kw)
    if not isinstance(x, LocalArray):
        return np.std(x, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims, **kw)
    _no_kwargs(kw, "std")
    return sqrt(var(x, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims))


def _arg(prim, np_fn):
    def fn(x, axis=None, keepdims=False):
        if not isinstance(x, LocalArray):
            return np_fn(x, axis=axis, keepdims=keepdims)
        if axis is None:
            x = reshape(x, (-1,))
            axis = 0
        return bind(prim, [x], x.mesh, axes=_axes(axis, x, np_fn.__name__), keepdims=bool(keepdims))

    fn.__name__ = np_fn.__name__
    HANDLED[np_fn] = fn
    return fn


argmax = _arg(red.ARGMAX, np.argmax)
argmin = _arg(red.ARGMIN, np.argmin)


@_implements(np.cumsum)
def cumsum(x, axis=None, dtype=None):
    if not isinstance(x, LocalArray):
        return np.cumsum(x, axis=axis, dtype=dtype)
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    if dtype is not None:
        x = astype(x, dtype)
    (ax,) = _axes(axis, x, "cumsum")
    return bind(red.CUMSUM, [x], x.mesh, axis=ax)
cumulative_sum = cumsum


def _nan_reducer(np_fn, base, fill):
    @_implements(np_fn)
    def fn(x, axis=None, dtype=None, keepdims=False, **kw):
        if not _local(x):
            return np_fn(x, axis=axis, keepdims=keepdims, **({"dtype": dtype} if dtype else {}), **kw)
        filled = where(isnan(x), fill, x) if x.dtype.kind == "f" or x.dtype == _dt.bfloat16 else x
        return base(filled, axis=axis, keepdims=keepdims) if base in (max, min) else \
            base(filled, axis=axis, dtype=dtype, keepdims=keepdims)

    fn.__name__ = np_fn.__name__
    fn.__doc__ = f"``numpy.{np_fn.__name__}``: NaNs replaced, then the reduction (differentiable)."
    return fn


nansum = _nan_reducer(np.nansum, sum, 0.0)
nanprod = _nan_reducer(np.nanprod, prod, 1.0)
nanmax = _nan_reducer(np.nanmax, max, -np.inf)
nanmin = _nan_reducer(np.nanmin, min, np.inf)


@_implements(np.nanmean)
def nanmean(x, axis=None, dtype=None, keepdims=False):
    if not _local(x):
        return np.nanmean(x, axis=axis, dtype=dtype, keepdims=keepdims)
    x = _inexact(x)
    ok = astype(~isnan(x), x.dtype)
    return nansum(x, axis=axis, keepdims=keepdims) / sum(ok, axis=axis, keepdims=keepdims)


@_implements(np.ptp)
def ptp(x, axis=None, keepdims=False):
    if not _local(x):
        return np.ptp(x, axis=axis, keepdims=keepdims)
    return max(x, axis=axis, keepdims=keepdims) - min(x, axis=axis, keepdims=keepdims)


@_implements(np.count_nonzero)
def count_nonzero(x, axis=None, *, keepdims=False):
    if not _local(x):
        return np.count_nonzero(x, axis=axis, keepdims=keepdims)
    return sum(x != 0, axis=axis, keepdims=keepdims)


@_implements(np.average)
def average(x, axis=None, weights=None, returned=False, *, keepdims=False):
    if not _is_local(x, weights):
        return np.average(x, axis=axis, weights=weights, returned=returned, keepdims=keepdims)
    if weights is None:
        avg = mean(x, axis=axis, keepdims=keepdims)
        return (avg, full_like(avg, _count_of(x, axis))) if returned else avg
    w = weights
    den = sum(broadcast_to(w, x.shape) if np.ndim(w) == x.ndim else w, axis=axis, keepdims=keepdims) \
        if axis is None or np.ndim(w) == x.ndim else sum(w)
    if np.ndim(w) != x.ndim and axis is not None:
        (ax,) = _axes(axis, x, "average")
        w = reshape(lift(w, x.mesh), (1,) * ax + (-1,) + (1,) * (x.ndim - ax - 1))
    avg = sum(x * w, axis=axis, keepdims=keepdims) / den
    return (avg, den) if returned else avg


def _count_of(x, axis):
    return x.size if axis is None else int(np.prod([x.shape[a] for a in _axes(axis, x, "average")]))


@_implements(np.allclose)
def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    if not _is_local(a, b):
        return np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)
    return all(isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan))


@_implements(np.array_equal)
def array_equal(a1, a2, equal_nan=False):
    if not _is_local(a1, a2):
        return np.array_equal(a1, a2, equal_nan=equal_nan)
    if np.shape(a1) != np.shape(a2) if not (_local(a1) and _local(a2)) else a1.shape != a2.shape:
        return False
    eq = equal(a1, a2)
    return all(eq | (isnan(a1) & isnan(a2)) if equal_nan else eq)


@_implements(np.array_equiv)
def array_equiv(a1, a2):
    if not _is_local(a1, a2):
        return np.array_equiv(a1, a2)
    return all(equal(a1, a2))


for _name, _fn in (("sum", sum), ("mean", mean), ("max", max), ("min", min), ("prod", prod), ("var", var),
                   ("std", std), ("any", any), ("all", all), ("argmax", argmax), ("argmin", argmin),
                   ("cumsum", cumsum)):
    register_method(_name, _method(_fn))
# ``ufunc.reduce`` (``jnp.add.reduce``, ``np.add.reduce`` on a per-device value) is the matching reduction
for _name, _fn in (("add", sum), ("multiply", prod), ("maximum", max), ("minimum", min), ("logical_and", all),
                   ("logical_or", any)):
    register_ufunc_reduction(_name, _fn)
