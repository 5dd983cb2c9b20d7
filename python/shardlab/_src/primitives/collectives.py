"""Collective primitives. Shapes and validation come from the C++ core's shape rules (the
same ones its data movement checks), bytes from ``cost.formulas``, and the transposes are
JAX's: psum ↔ pvary, all_gather ↔ psum_scatter, all_to_all ↔ all_to_all (split and concat
swapped), ppermute ↔ the inverse permutation, broadcast ↔ reduce, gather ↔ scatter.

Cotangents and varying axes: a cotangent may vary along an axis where its primal is
invariant. It then holds per-device *partial sums* whose total is the true cotangent (each
device's use of a shared value contributes). Rules consume such partials where they can
(an all_gather's transpose is then a reduce-scatter, as in FSDP); elsewhere a psum makes
them exact, and that psum is a real, recorded collective (data parallelism's gradient
all-reduce).

Example:
    >>> from shardlab._src.primitives.collectives import PSUM
    >>> PSUM.name
    'psum'
"""

from __future__ import annotations

import math

import numpy as np

import shardlab._core as _core

from ..cost import formulas
from ..ledger.event import Event, dtype_name
from .elementwise import PRIMS as EW, SELECT
from .primitive import Primitive, bind
from .structural import DYNAMIC_SLICE, RESHAPE

_REDUCE_OPS = {"sum": "psum", "mean": "pmean", "max": "pmax", "min": "pmin"}


def axis_indices(mesh, axes) -> list[int]:
    return [mesh.axis_names.index(a) for a in axes]


def group_size(mesh, axes) -> int:
    return math.prod(mesh.shape[a] for a in axes)


def _local_bytes(aval, k) -> float:
    shape = aval.shape
    n = 1
    for s in shape[k:]:
        n *= s
    return float(n * aval.dtype.itemsize)


_EVENT_FIELDS: dict = {}  # (op, mesh axes and sizes, axes, shapes, dtype, perm) -> Event.collective's fields


def _event(op, mesh, axes, x, out, *, perm=None) -> Event:
    key = (op, mesh.axis_names, mesh.axis_sizes, axes if type(axes) is tuple else tuple(axes), x.shape, out.shape,
           x.dtype, perm)
    fields = _EVENT_FIELDS.get(key)
    if fields is None:
        k = mesh.ndim
        n = group_size(mesh, axes)
        b_in, b_out = _local_bytes(x, k), _local_bytes(out, k)
        v = b_out if op in ("all_gather", "gather") else b_in
        sent = formulas.ring_bytes_sent(op, n, v)
        if op == "ppermute" and not perm:
            sent = 0.0
        fields = (op, tuple(axes), int(n), int(mesh.size // n), dtype_name(x.dtype), b_in, b_out, float(sent), perm)
        if len(_EVENT_FIELDS) > 4096:  # a long sweep over shapes: start over rather than grow
            _EVENT_FIELDS.clear()
        _EVENT_FIELDS[key] = fields
    return Event.collective(*fields)


def _collective(name, shape_fn, op_of=lambda p: None, vjp=None):
    """A collective primitive whose shape rule is the core's `shape_fn(mesh, shape, axes, *args)`."""

    def shape_rule(avals, mesh, *, axes, **params):
        x = avals[0]
        dtype = x.dtype
        if params.get("reduction") == "mean" and np.dtype(dtype).kind in "iub":
            dtype = np.dtype(np.float32)  # a mean of integers is a float, as JAX's pmean
        return [(tuple(shape_fn(mesh, list(x.shape), list(axes), params)), dtype)]

    def cost(ins, outs, mesh, *, axes, **params):
        op = op_of(params) or name
        return _event(op, mesh, axes, ins[0], outs[0], perm=params.get("perm"))

    return Primitive(name, shape_rule=shape_rule, cost=cost, vjp=vjp)


# -- helpers for the rules -------------------------------------------------------------------
def partial_axes(ct, primal, axes) -> tuple:
    """Axes of `axes` along which `ct` holds partial sums (it varies, its primal does not)."""
    k = ct.mesh.ndim
    return tuple(a for a in axes if ct.storage.shape[ct.mesh.axis_names.index(a)] != 1
                 and primal.storage.shape[:k][ct.mesh.axis_names.index(a)] == 1)


def invariant_axes(x, axes) -> tuple:
    return tuple(a for a in axes if x.storage.shape[x.mesh.axis_names.index(a)] == 1)


def _scale(x, factor):
    return x if factor == 1 else bind(EW["multiply"], [x, x.dtype.type(factor)], x.mesh)


def _index_is(mesh, axes, value):
    idx = bind(AXIS_INDEX, [], mesh, axes=tuple(axes))
    return bind(EW["equal"], [idx, np.int32(value)], mesh)


def _only_on(mesh, axes, value, ct):
    """`ct` on the device whose index along `axes` is `value`, zeros elsewhere."""
    return bind(SELECT, [_index_is(mesh, axes, value), ct, ct.dtype.type(0)], mesh)


def to_partial(ct, axes):
    """An exact cotangent written as partial sums along `axes` (it sits on index 0)."""
    exact = tuple(a for a in axes if ct.storage.shape[ct.mesh.axis_names.index(a)] == 1)
    return _only_on(ct.mesh, exact, 0, ct) if exact else ct


# -- psum / pmean / pmax / pmin --------------------------------------------------------------
def _all_reduce_vjp(cts, ins, outs, mesh, *, axes, reduction):
    x, ct = ins[0], cts[0]
    if reduction in ("max", "min"):
        raise NotImplementedError(f"[grad] p{reduction} has no transpose (as in JAX); "
                                  f"differentiate through psum of a one-hot selection instead")
    partial = tuple(a for a in partial_axes(ct, outs[0], axes) if a not in invariant_axes(x, axes))
    g = bind(PSUM, [ct], mesh, axes=partial, reduction="sum") if partial else ct
    # psum of a value invariant along an axis multiplies it by the axis size
    g = _scale(g, group_size(mesh, invariant_axes(x, axes)))
    if reduction == "mean":
        g = bind(EW["divide"], [g, g.dtype.type(group_size(mesh, axes))], mesh)
    return [g]


PSUM = _collective("psum", lambda m, s, a, p: _core.all_reduce_shape(m._core, s, a),
                   op_of=lambda p: _REDUCE_OPS[p["reduction"]], vjp=_all_reduce_vjp)


# -- all_gather ↔ psum_scatter ---------------------------------------------------------------
def _all_gather_vjp(cts, ins, outs, mesh, *, axes, axis, tiled):
    x, ct = ins[0], cts[0]
    if partial_axes(ct, outs[0], axes):
        g = bind(PSUM_SCATTER, [to_partial(ct, axes)], mesh, axes=axes, dim=axis, tiled=tiled)
        return [g]
    # exact cotangent: each device takes its own chunk, no communication
    idx = bind(AXIS_INDEX, [], mesh, axes=tuple(axes))
    size = x.shape[axis] if tiled else 1
    starts = [np.int32(0)] * ct.ndim
    starts[axis] = bind(EW["multiply"], [idx, np.int32(size)], mesh)
    sizes = list(ct.shape)
    sizes[axis] = size
    g = bind(DYNAMIC_SLICE, [ct, *starts], mesh, sizes=tuple(sizes))
    if not tiled:
        g = bind(RESHAPE, [g], mesh, local_shape=x.shape)
    return [g]


ALL_GATHER = _collective("all_gather", lambda m, s, a, p: _core.all_gather_shape(m._core, s, a, p["axis"], p["tiled"]),
                         vjp=_all_gather_vjp)


def _psum_scatter_vjp(cts, ins, outs, mesh, *, axes, dim, tiled):
    x, ct = ins[0], cts[0]
    g = bind(ALL_GATHER, [ct], mesh, axes=axes, axis=dim, tiled=tiled)
    return [_scale(g, group_size(mesh, invariant_axes(x, axes)))]


PSUM_SCATTER = _collective("psum_scatter",
                           lambda m, s, a, p: _core.psum_scatter_shape(m._core, s, a, p["dim"], p["tiled"]),
                           vjp=_psum_scatter_vjp)


# -- all_to_all, ppermute --------------------------------------------------------------------
def _all_to_all_vjp(cts, ins, outs, mesh, *, axes, split, concat, tiled):
    return [bind(ALL_TO_ALL, [cts[0]], mesh, axes=axes, split=concat, concat=split, tiled=tiled)]


ALL_TO_ALL = _collective(
    "all_to_all", lambda m, s, a, p: _core.all_to_all_shape(m._core, s, a, p["split"], p["concat"], p["tiled"]),
    vjp=_all_to_all_vjp)


def _ppermute_vjp(cts, ins, outs, mesh, *, axes, perm):
    return [bind(PPERMUTE, [cts[0]], mesh, axes=axes, perm=tuple((d, s) for s, d in perm))]


PPERMUTE = _collective("ppermute", lambda m, s, a, p: _core.ppermute_shape(m._core, s, a, list(p["perm"])),
                       vjp=_ppermute_vjp)


# -- axis_index, pcast -----------------------------------------------------------------------
AXIS_INDEX = Primitive("axis_index", shape_rule=lambda avals, mesh, *, axes: [
    (tuple(_core.axis_index_shape(mesh._core, list(axes))), np.dtype(np.int32))])


def _pcast_shape(avals, mesh, *, axes, to):
    x = avals[0]
    k = mesh.ndim
    idx = set(axis_indices(mesh, axes))
    dims = tuple((mesh.axis_sizes[a] if to == "varying" else 1) if a in idx else d
                 for a, d in enumerate(x.shape[:k]))
    return [(dims + tuple(x.shape[k:]), x.dtype)]


def _pcast_vjp(cts, ins, outs, mesh, *, axes, to):
    ct = cts[0]
    if to == "varying":
        return [ct]  # a varying cotangent of an invariant value: partial sums
    partial = partial_axes(ct, outs[0], axes)
    if partial:
        ct = bind(PSUM, [ct], mesh, axes=partial, reduction="sum")
    return [_only_on(mesh, axes, 0, ct)]


PCAST = Primitive("pcast", shape_rule=_pcast_shape, vjp=_pcast_vjp)


# -- MPI-style rooted collectives ------------------------------------------------------------
def _broadcast_vjp(cts, ins, outs, mesh, *, axes, root):
    ct = cts[0]
    if partial_axes(ct, outs[0], axes):
        return [bind(REDUCE, [to_partial(ct, axes)], mesh, axes=axes, root=root, reduction="sum")]
    return [_only_on(mesh, axes, root, ct)]


PBROADCAST = _collective("broadcast", lambda m, s, a, p: _core.broadcast_shape(m._core, s, a, p["root"]),
                         vjp=_broadcast_vjp)


def _reduce_vjp(cts, ins, outs, mesh, *, axes, root, reduction):
    if reduction not in ("sum", "mean"):
        raise NotImplementedError(f"[grad] reduce with op={reduction!r} has no transpose; use sum or mean")
    g = bind(PBROADCAST, [cts[0]], mesh, axes=axes, root=root)
    if reduction == "mean":
        g = bind(EW["divide"], [g, g.dtype.type(group_size(mesh, axes))], mesh)
    return [g]


REDUCE = _collective("reduce", lambda m, s, a, p: _core.reduce_shape(m._core, s, a, p["root"]),
                     vjp=_reduce_vjp)


def _gather_vjp(cts, ins, outs, mesh, *, axes, root, axis, tiled):
    return [bind(SCATTER, [cts[0]], mesh, axes=axes, root=root, dim=axis, tiled=tiled)]


GATHER = _collective("gather", lambda m, s, a, p: _core.gather_shape(m._core, s, a, p["root"], p["axis"], p["tiled"]),
                     vjp=_gather_vjp)


def _scatter_vjp(cts, ins, outs, mesh, *, axes, root, dim, tiled):
    return [bind(GATHER, [cts[0]], mesh, axes=axes, root=root, axis=dim, tiled=tiled)]


SCATTER = _collective("scatter", lambda m, s, a, p: _core.scatter_shape(m._core, s, a, p["root"], p["dim"], p["tiled"]),
                      vjp=_scatter_vjp)
