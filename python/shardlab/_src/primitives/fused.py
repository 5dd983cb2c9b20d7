"""Fused elementwise primitives: one pass over memory where the composite expression takes
several. Each equals a composite of elementwise primitives (the docstring of each says which)
and has the same rules; the emulated backend runs the C++ kernels of ``shardlab/fused.hpp``.

- ``silu(x) = x * sigmoid(x)``, and its vjp ``silu_vjp(x, dy) = dy * s * (1 + x * (1 - s))``
  (itself differentiable, so second derivatives work);
- ``adamw_update(param, grad, m, v)``: one AdamW step (new param, m, v), not differentiable.

They take float32 operands of one local shape; callers (``shardlab.nn.silu``,
``shardlab.experimental.adamw_update``) use the composite for anything else.

Example:
    >>> from shardlab._src.primitives.fused import SILU, SILU_VJP, ADAMW_UPDATE
    >>> SILU.name, SILU_VJP.name, ADAMW_UPDATE.name
    ('silu', 'silu_vjp', 'adamw_update')
"""

from __future__ import annotations

import numpy as np

from ..arrays.local_array import LocalArray
from .broadcasting import unbroadcast
from .elementwise import PRIMS
from .primitive import Primitive, bind
from .shapes import broadcast_avals

_F32 = np.dtype(np.float32)


def _check_float32(op: str, avals) -> None:
    for a in avals:
        if a.dtype != _F32:
            raise TypeError(f"[{op}] takes float32 operands; got {a.dtype} (use the composite expression)")


def _same_local_shapes(op: str, avals, mesh) -> tuple:
    k = mesh.ndim
    local = tuple(avals[0].shape[k:])
    for a in avals[1:]:
        if tuple(a.shape[k:]) != local:
            raise ValueError(f"[{op}] operands have local shapes {local} and {tuple(a.shape[k:])}; "
                             f"they must be equal")
    return broadcast_avals(avals, k)


def _ew(name, *args):
    mesh = next(a.mesh for a in args if isinstance(a, LocalArray))
    return bind(PRIMS[name], list(args), mesh)


# -- silu ------------------------------------------------------------------------------------
def _silu_shape(avals, mesh):
    _check_float32("silu", avals)
    return [(tuple(avals[0].shape), _F32)]


def _silu_vjp(cts, ins, outs, mesh):
    ct = cts[0]
    return [None if ct is None else bind(SILU_VJP, [ins[0], ct], mesh)]


SILU = Primitive("silu", shape_rule=_silu_shape, vjp=_silu_vjp)


def _silu_vjp_shape(avals, mesh):
    _check_float32("silu_vjp", avals)
    return [(_same_local_shapes("silu_vjp", avals, mesh), _F32)]


def _silu_vjp_vjp(cts, ins, outs, mesh):
    """d/d(x, dy) of dy * h(x), h = s (1 + x (1 - s)): (ct dy h'(x), ct h(x)), with
    h'(x) = s (1 - s) (2 + x (1 - 2 s))."""
    ct = cts[0]
    if ct is None:
        return [None, None]
    x, dy = ins
    s = _ew("reciprocal", _ew("add", 1.0, _ew("exp", _ew("negative", x))))
    one_minus = _ew("subtract", 1.0, s)
    h_prime = _ew("multiply", _ew("multiply", s, one_minus),
                  _ew("add", 2.0, _ew("multiply", x, _ew("subtract", one_minus, s))))
    gx = _ew("multiply", _ew("multiply", ct, dy), h_prime)
    gdy = bind(SILU_VJP, [x, ct], mesh)
    return [unbroadcast(gx, x), unbroadcast(gdy, dy)]


SILU_VJP = Primitive("silu_vjp", shape_rule=_silu_vjp_shape, vjp=_silu_vjp_vjp)


# -- adamw -----------------------------------------------------------------------------------
def _adamw_shape(avals, mesh, **_):
    _check_float32("adamw_update", avals)
    shape = _same_local_shapes("adamw_update", avals, mesh)
    return [(shape, _F32)] * 3


ADAMW_UPDATE = Primitive("adamw_update", shape_rule=_adamw_shape, multiple_results=True)
