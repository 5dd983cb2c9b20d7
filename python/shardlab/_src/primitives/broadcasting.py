"""Sum over local axes and broadcast, each the other's transpose, and ``unbroadcast`` (how
every elementwise rule returns a cotangent to its input's shape).

Example:
    >>> from shardlab._src.primitives.broadcasting import BROADCAST, REDUCE_SUM
    >>> BROADCAST.name, REDUCE_SUM.name
    ('broadcast_to', 'reduce_sum')
"""

from __future__ import annotations

import numpy as np

from ..arrays.local_array import LocalArray
from ..core import dtypes
from .primitive import Primitive, bind
from .structural import RESHAPE


def _reduced_local(x_local: tuple, axes: tuple, keepdims: bool) -> tuple:
    if keepdims:
        return tuple(1 if i in axes else s for i, s in enumerate(x_local))
    return tuple(s for i, s in enumerate(x_local) if i not in axes)


def _reduce_shape_for(dtype_rule):
    """A reduction's shape rule; its memoized dtype rule is ``shape_rule.dtype_of`` (the
    backends read the result dtype from it without building the shape)."""
    memo: dict = {}

    def dtype_of(dtype):
        key = (dtype, dtypes.x64_enabled())
        out = memo.get(key)
        if out is None:
            out = memo[key] = dtype_rule(dtype)
        return out

    def shape_rule(avals, mesh, *, axes, keepdims=False, **_):
        x = avals[0]
        k = mesh.ndim
        return [(tuple(x.shape[:k]) + _reduced_local(tuple(x.shape[k:]), axes, keepdims), dtype_of(x.dtype))]

    shape_rule.dtype_of = dtype_of
    return shape_rule


def _sum_dtype(dt):
    """Sums of booleans and integers accumulate in the default integer type (int32, or int64
    with x64 on; uint32 / uint64 for unsigned), as jax.numpy's; floats keep their type."""
    dt = np.dtype(dt)
    if dt.kind in "bi":
        return dtypes.default_int_dtype()
    if dt.kind == "u":
        return dtypes.default_uint_dtype()
    return dtypes.canonicalize_dtype(dt)


def _expand(ct: LocalArray, x: LocalArray, axes: tuple, keepdims: bool) -> LocalArray:
    """`ct` reshaped so it broadcasts against `x` (reduced axes back as size 1)."""
    if keepdims:
        return ct
    return bind(RESHAPE, [ct], ct.mesh, local_shape=_reduced_local(x.shape, axes, True))


def _sum_vjp(cts, ins, outs, mesh, *, axes, keepdims=False, dtype=None):
    x = ins[0]
    ct = _expand(cts[0], x, axes, keepdims)
    return [bind(BROADCAST, [ct], mesh, local_shape=x.shape)]


REDUCE_SUM = Primitive("reduce_sum", shape_rule=_reduce_shape_for(_sum_dtype), vjp=_sum_vjp)


# -- broadcast_to and its transpose ----------------------------------------------------------
def _broadcast_shape(avals, mesh, *, local_shape):
    x = avals[0]
    k = mesh.ndim
    return [(tuple(x.shape[:k]) + tuple(local_shape), x.dtype)]


def _broadcast_vjp(cts, ins, outs, mesh, *, local_shape):
    return [unbroadcast(cts[0], ins[0])]


BROADCAST = Primitive("broadcast_to", shape_rule=_broadcast_shape, vjp=_broadcast_vjp)


def unbroadcast(ct: LocalArray, x: LocalArray) -> LocalArray:
    """Sums `ct` over the local dims that broadcasting added to `x`'s local shape. Mesh dims
    are left as they are: where `x` is invariant and `ct` varies, `ct` holds per-device
    partial sums (reduced by a psum only where an exact value is needed)."""
    target = x.shape
    if ct.shape == target:
        return ct
    extra = ct.ndim - len(target)
    axes = tuple(range(extra)) + tuple(extra + i for i, s in enumerate(target)
                                       if s == 1 and ct.shape[extra + i] != 1)
    out = bind(REDUCE_SUM, [ct], ct.mesh, axes=axes) if axes else ct
    if out.shape != target:
        out = bind(RESHAPE, [out], ct.mesh, local_shape=target)
    return out
