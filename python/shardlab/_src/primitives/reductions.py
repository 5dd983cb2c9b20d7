"""Reductions over local axes besides sum (max, min, prod, argmax, any, all) and cumsum.
Axes are storage axes of the local dims (mesh dims are never reduced here: that is what
collectives do).

Example:
    >>> from shardlab._src.primitives.reductions import REDUCE_MAX
    >>> REDUCE_MAX.name
    'reduce_max'
"""

from __future__ import annotations

import numpy as np

from ..core import dtypes
from .broadcasting import REDUCE_SUM, _expand, _reduce_shape_for, _sum_dtype
from .elementwise import CONVERT, PRIMS as EW
from .primitive import Primitive, bind


def _make_extremum_vjp():
    def vjp(cts, ins, outs, mesh, *, axes, keepdims=False):
        x = ins[0]
        ct = _expand(cts[0], x, axes, keepdims)
        out = _expand(outs[0], x, axes, keepdims)
        hit = bind(EW["equal"], [x, out], mesh)
        hitf = bind(CONVERT, [hit], mesh, dtype=x.dtype)
        count = bind(REDUCE_SUM, [hitf], mesh, axes=axes, keepdims=True)
        share = bind(EW["divide"], [ct, count], mesh)
        return [bind(EW["multiply"], [hitf, share], mesh)]

    return vjp


REDUCE_MAX = Primitive("reduce_max", shape_rule=_reduce_shape_for(dtypes.canonicalize_dtype), vjp=_make_extremum_vjp())
REDUCE_MIN = Primitive("reduce_min", shape_rule=_reduce_shape_for(dtypes.canonicalize_dtype), vjp=_make_extremum_vjp())


def _prod_vjp(cts, ins, outs, mesh, *, axes, keepdims=False, dtype=None):
    x = ins[0]
    ct = _expand(cts[0], x, axes, keepdims)
    out = _expand(outs[0], x, axes, keepdims)
    return [bind(EW["divide"], [bind(EW["multiply"], [ct, out], mesh), x], mesh)]


REDUCE_PROD = Primitive("reduce_prod", shape_rule=_reduce_shape_for(_sum_dtype), vjp=_prod_vjp)
REDUCE_ANY = Primitive("reduce_any", shape_rule=_reduce_shape_for(lambda d: np.dtype(np.bool_)))
REDUCE_ALL = Primitive("reduce_all", shape_rule=_reduce_shape_for(lambda d: np.dtype(np.bool_)))
ARGMAX = Primitive("argmax", shape_rule=_reduce_shape_for(lambda d: dtypes.default_int_dtype()))
ARGMIN = Primitive("argmin", shape_rule=_reduce_shape_for(lambda d: dtypes.default_int_dtype()))


def cumsum_dtype(dt):
    """jnp.cumsum keeps integer types (int8 stays int8) and sums booleans in the default int."""
    dt = np.dtype(dt)
    return dtypes.default_int_dtype() if dt.kind == "b" else dtypes.canonicalize_dtype(dt)


def _cumsum_shape(avals, mesh, *, axis, reverse=False):
    x = avals[0]
    return [(tuple(x.shape), cumsum_dtype(x.dtype))]


def _cumsum_vjp(cts, ins, outs, mesh, *, axis, reverse=False):
    return [bind(CUMSUM, [cts[0]], mesh, axis=axis, reverse=not reverse)]


CUMSUM = Primitive("cumsum", shape_rule=_cumsum_shape, vjp=_cumsum_vjp)


