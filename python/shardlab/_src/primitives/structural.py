"""Structural primitives: reshape, transpose, broadcast, concatenate, indexing, dynamic
slices. Parameters are in LOCAL terms (local shapes, local axes); mesh dims pass through.

Example:
    >>> from shardlab._src.primitives.structural import RESHAPE
    >>> RESHAPE.name
    'reshape'
"""

from __future__ import annotations

import numpy as np

from .primitive import Primitive, bind


def _mesh_dims(*avals, k: int) -> tuple:
    dims = [tuple(a.shape[:k]) for a in avals if hasattr(a, "shape") and len(a.shape) >= k]
    return tuple(np.broadcast_shapes(*dims)) if dims else (1,) * k


# -- reshape ---------------------------------------------------------------------------------
def _reshape_shape(avals, mesh, *, local_shape):
    x = avals[0]
    k = mesh.ndim
    return [(tuple(x.shape[:k]) + tuple(local_shape), x.dtype)]


def _reshape_vjp(cts, ins, outs, mesh, *, local_shape):
    return [bind(RESHAPE, [cts[0]], mesh, local_shape=ins[0].shape)]


RESHAPE = Primitive("reshape", shape_rule=_reshape_shape, vjp=_reshape_vjp)


# -- transpose -------------------------------------------------------------------------------
def _transpose_shape(avals, mesh, *, perm):
    x = avals[0]
    k = mesh.ndim
    return [(tuple(x.shape[:k]) + tuple(x.shape[k + p] for p in perm), x.dtype)]


def _transpose_vjp(cts, ins, outs, mesh, *, perm):
    inv = tuple(int(i) for i in np.argsort(perm))
    return [bind(TRANSPOSE, [cts[0]], mesh, perm=inv)]


TRANSPOSE = Primitive("transpose", shape_rule=_transpose_shape, vjp=_transpose_vjp)


# -- concatenate -----------------------------------------------------------------------------
def _concat_shape(avals, mesh, *, axis):
    k = mesh.ndim
    dims = _mesh_dims(*avals, k=k)
    first = avals[0]
    local = list(first.shape[k:])
    local[axis] = sum(a.shape[k + axis] for a in avals)
    return [(dims + tuple(local), np.result_type(*[a.dtype for a in avals]))]


def _concat_vjp(cts, ins, outs, mesh, *, axis):
    out, start = [], 0
    ct = cts[0]
    for x in ins:
        n = x.shape[axis]
        key = (slice(None),) * axis + (slice(start, start + n),)
        out.append(bind(GETITEM, [ct], mesh, key=key))
        start += n
    return out


CONCATENATE = Primitive("concatenate", shape_rule=_concat_shape, vjp=_concat_vjp)


# -- split -----------------------------------------------------------------------------------
def _split_shape(avals, mesh, *, axis, sizes):
    x = avals[0]
    k = mesh.ndim
    n = x.shape[k + axis]
    if sum(sizes) != n or any(s < 0 for s in sizes):
        raise ValueError(f"[split] sizes {list(sizes)} do not add up to local axis {axis} of size {n}")
    return [(tuple(x.shape[:k + axis]) + (s,) + tuple(x.shape[k + axis + 1:]), x.dtype) for s in sizes]


def _split_vjp(cts, ins, outs, mesh, *, axis, sizes):
    """The transpose of a split is the concatenation of the pieces' cotangents."""
    return [bind(CONCATENATE, list(cts), mesh, axis=axis)]


SPLIT = Primitive("split", shape_rule=_split_shape, vjp=_split_vjp, multiple_results=True)


# -- indexing --------------------------------------------------------------------------------
def _getitem_shape(avals, mesh, *, key):
    x = avals[0]
    k = mesh.ndim
    probe = np.broadcast_to(np.zeros((), x.dtype), x.shape[k:])
    local = probe[key].shape
    return [(tuple(x.shape[:k]) + tuple(local), x.dtype)]


def _getitem_vjp(cts, ins, outs, mesh, *, key):
    return [bind(SCATTER_ADD, [cts[0]], mesh, key=key, local_shape=ins[0].shape)]


GETITEM = Primitive("getitem", shape_rule=_getitem_shape, vjp=_getitem_vjp)


def _scatter_add_shape(avals, mesh, *, key, local_shape):
    ct = avals[0]
    k = mesh.ndim
    return [(tuple(ct.shape[:k]) + tuple(local_shape), ct.dtype)]


def _scatter_add_vjp(cts, ins, outs, mesh, *, key, local_shape):
    return [bind(GETITEM, [cts[0]], mesh, key=key)]


SCATTER_ADD = Primitive("scatter_add", shape_rule=_scatter_add_shape, vjp=_scatter_add_vjp)


# -- take_along_axis -------------------------------------------------------------------------
def take_local_shape(xl: tuple, il: tuple, axis: int) -> tuple:
    """The local shape of take_along_axis: the index's length along `axis`; elsewhere the
    index and the array broadcast (numpy's and JAX's rule: a [V, D] table with a [N, 1] index
    gives [N, D]). Raises, in local shapes, where they cannot."""
    if len(il) != len(xl):
        raise ValueError(f"[take_along_axis] indices of local rank {len(il)} for a value of local rank {len(xl)}")
    local = []
    for d, (a, b) in enumerate(zip(xl, il)):
        if d != axis and a != b and a != 1 and b != 1:
            raise ValueError(f"[take_along_axis] index local shape {il} does not broadcast against the array's "
                             f"local shape {xl} in dim {d} ({b} vs {a}); make them equal or 1 there")
        local.append(b if d == axis or a == 1 else a)
    return tuple(local)


def _take_shape(avals, mesh, *, axis):
    x, idx = avals
    k = mesh.ndim
    local = take_local_shape(tuple(x.shape[k:]), tuple(idx.shape[k:]), axis)
    return [(_mesh_dims(x, idx, k=k) + local, x.dtype)]


def _take_vjp(cts, ins, outs, mesh, *, axis):
    x, idx = ins
    return [bind(PUT_ALONG_ADD, [cts[0], idx], mesh, axis=axis, local_shape=x.shape), None]


TAKE_ALONG_AXIS = Primitive("take_along_axis", shape_rule=_take_shape, vjp=_take_vjp)


def _put_shape(avals, mesh, *, axis, local_shape):
    ct, idx = avals
    k = mesh.ndim
    return [(_mesh_dims(ct, idx, k=k) + tuple(local_shape), ct.dtype)]


def _put_vjp(cts, ins, outs, mesh, *, axis, local_shape):
    return [bind(TAKE_ALONG_AXIS, [cts[0], ins[1]], mesh, axis=axis), None]


PUT_ALONG_ADD = Primitive("put_along_axis_add", shape_rule=_put_shape, vjp=_put_vjp)


# -- dynamic slices (per-device start indices) -----------------------------------------------
def _ds_shape(avals, mesh, *, sizes):
    x, *starts = avals
    k = mesh.ndim
    return [(_mesh_dims(x, *starts, k=k) + tuple(sizes), x.dtype)]


def _ds_vjp(cts, ins, outs, mesh, *, sizes):
    x, *starts = ins
    ct = cts[0]
    zeros = bind(ZEROS, [x], mesh)
    return [bind(DYNAMIC_UPDATE_SLICE, [zeros, ct, *starts], mesh)] + [None] * len(starts)


DYNAMIC_SLICE = Primitive("dynamic_slice", shape_rule=_ds_shape, vjp=_ds_vjp)


def _dus_shape(avals, mesh):
    x, u, *starts = avals
    k = mesh.ndim
    return [(_mesh_dims(x, u, *starts, k=k) + tuple(x.shape[k:]), x.dtype)]


def _dus_vjp(cts, ins, outs, mesh):
    x, u, *starts = ins
    ct = cts[0]
    gx = bind(DYNAMIC_UPDATE_SLICE, [ct, bind(ZEROS, [u], mesh), *starts], mesh)
    gu = bind(DYNAMIC_SLICE, [ct, *starts], mesh, sizes=u.shape)
    return [gx, gu] + [None] * len(starts)


DYNAMIC_UPDATE_SLICE = Primitive("dynamic_update_slice", shape_rule=_dus_shape, vjp=_dus_vjp)


# -- zeros_like (for cotangents) -------------------------------------------------------------
ZEROS = Primitive("zeros_like", shape_rule=lambda avals, mesh: [(tuple(avals[0].shape), avals[0].dtype)])
