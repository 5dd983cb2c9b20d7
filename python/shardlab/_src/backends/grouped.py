"""The emulated implementations of the grouped collectives and ragged_all_to_all
(``primitives/grouped.py``): numpy on the mesh-factorized storage, one group at a time.

Each implementation brings the devices along the named axes to dim 0 (``to_front``), runs
the collective among the devices of every group, and puts the mesh dims back.
"""

from __future__ import annotations

import numpy as np

from ..core.dtypes import bfloat16
from ..primitives import grouped as gp
from ..primitives.grouped import from_front, to_front


def _impl(prim):
    def register(fn):
        prim.impl["emulated"] = fn
        return fn

    return register


def _wide(x):
    """The dtype a reduction runs in (bfloat16/float16 in float32, small ints in int32...)."""
    if x.dtype == bfloat16 or x.dtype == np.float16:
        return x.astype(np.float32)
    if x.dtype.kind == "b":
        return x.astype(np.int32)
    return x


@_impl(gp.GROUPED_PSUM)
def _psum(storages, mesh, *, axes, groups, reduction):
    (shape, dtype), = gp.GROUPED_PSUM.shape_rule(storages, mesh, axes=axes, groups=groups, reduction=reduction)
    v, undo = to_front(storages[0], mesh, axes)
    out = np.empty(v.shape, dtype)
    for grp in groups:
        block = _wide(v[list(grp)])
        if reduction == "sum":
            r = block.sum(axis=0, dtype=block.dtype)
        elif reduction == "mean":
            r = block.astype(np.float32 if block.dtype.kind in "iub" else block.dtype).mean(axis=0)
        elif reduction == "max":
            r = block.max(axis=0)
        else:
            r = block.min(axis=0)
        out[list(grp)] = r.astype(dtype)
    return [np.ascontiguousarray(from_front(out, undo))]


@_impl(gp.GROUPED_ALL_GATHER)
def _all_gather(storages, mesh, *, axes, groups, axis, tiled):
    v, undo = to_front(storages[0], mesh, axes)
    km = v.ndim - 1 - (storages[0].ndim - mesh.ndim)  # other mesh dims after the front one
    g = gp.group_len(groups)
    local = gp.gather_local_shape(v.shape[1 + km:], g, axis, tiled)
    out = np.empty((v.shape[0],) + v.shape[1:1 + km] + local, v.dtype)
    for grp in groups:
        block = v[list(grp)]  # (g, other..., local...)
        if tiled:
            r = np.concatenate(list(block), axis=km + axis % len(local))
        else:
            r = np.stack(list(block), axis=km + (axis % len(local)))
        out[list(grp)] = r
    return [np.ascontiguousarray(from_front(out, undo))]


@_impl(gp.GROUPED_PSUM_SCATTER)
def _psum_scatter(storages, mesh, *, axes, groups, dim, tiled):
    (shape, dtype), = gp.GROUPED_PSUM_SCATTER.shape_rule(storages, mesh, axes=axes, groups=groups, dim=dim,
                                                         tiled=tiled)
    v, undo = to_front(storages[0], mesh, axes)
    km = v.ndim - 1 - (storages[0].ndim - mesh.ndim)
    g = gp.group_len(groups)
    rank = storages[0].ndim - mesh.ndim
    d = km + dim % rank  # the scatter dim in a block without the front dim
    out = np.empty((v.shape[0],) + v.shape[1:1 + km] + tuple(shape[mesh.ndim:]), dtype)
    for grp in groups:
        total = _wide(v[list(grp)]).sum(axis=0, dtype=_wide(v[list(grp)]).dtype)
        chunks = np.split(total, g, axis=d)
        for j, dev in enumerate(grp):
            c = chunks[j] if tiled else np.squeeze(chunks[j], axis=d)
            out[dev] = c.astype(dtype)
    return [np.ascontiguousarray(from_front(out, undo))]


@_impl(gp.GROUPED_ALL_TO_ALL)
def _all_to_all(storages, mesh, *, axes, groups, split, concat, tiled):
    v, undo = to_front(storages[0], mesh, axes)
    rank = storages[0].ndim - mesh.ndim
    km = v.ndim - 1 - rank
    g = gp.group_len(groups)
    local = gp.a2a_local_shape(v.shape[1 + km:], g, split, concat, tiled)
    out = np.empty((v.shape[0],) + v.shape[1:1 + km] + local, v.dtype)
    s = km + split % rank
    for grp in groups:
        parts = [np.split(v[src], g, axis=s) for src in grp]  # parts[i][j]: from member i to member j
        for j, dst in enumerate(grp):
            got = [parts[i][j] for i in range(g)]
            if tiled:
                r = np.concatenate(got, axis=km + concat % rank)
            else:
                got = [np.squeeze(c, axis=s) for c in got]
                r = np.stack(got, axis=km + concat % rank)
            out[dst] = r
    return [np.ascontiguousarray(from_front(out, undo))]


@_impl(gp.RAGGED_ALL_TO_ALL)
def _ragged_all_to_all(storages, mesh, *, axes, groups):
    (shape, dtype), = gp.RAGGED_ALL_TO_ALL.shape_rule(storages, mesh, axes=axes, groups=groups)
    k = mesh.ndim
    dims = tuple(max(int(s.shape[a]) for s in storages) for a in range(k))
    full = [np.broadcast_to(s, dims + tuple(s.shape[k:])) for s in storages]
    fronts = [to_front(s, mesh, axes) for s in full]
    operand, output, in_off, send, out_off = (f[0] for f in fronts[:5])
    undo = fronts[1][1]
    other = operand.shape[1:1 + k - len(axes)]
    result = np.array(output, dtype=dtype)
    g = gp.group_len(groups)
    spd = in_off.shape[-1] // g
    rows_out = result.shape[1 + len(other)]
    rows_in = operand.shape[1 + len(other)]
    for grp in groups:
        for p, src in enumerate(grp):
            for o in np.ndindex(*other):
                for i in range(in_off.shape[-1]):
                    dst = grp[i // spd]
                    a, size, b = int(in_off[(src,) + o][i]), int(send[(src,) + o][i]), int(out_off[(src,) + o][i])
                    if size == 0:
                        continue
                    if a < 0 or size < 0 or a + size > rows_in or b < 0 or b + size > rows_out:
                        raise ValueError(f"[ragged_all_to_all] slice {i} of device {src} along {axes}: rows "
                                         f"[{a}, {a + size}) of an operand with {rows_in} rows written at "
                                         f"[{b}, {b + size}) of an output with {rows_out} rows is out of bounds")
                    result[(dst,) + o][b:b + size] = operand[(src,) + o][a:a + size]
    return [np.ascontiguousarray(from_front(result, undo))]


@_impl(gp.RAGGED_KEEP)
def _ragged_keep(storages, mesh):
    (shape, dtype), = gp.RAGGED_KEEP.shape_rule(storages, mesh)
    k = mesh.ndim
    x, off, sizes = (np.broadcast_to(s, tuple(shape[:k]) + tuple(s.shape[k:])) for s in storages)
    out = np.array(x, dtype=dtype)
    for coords in np.ndindex(*shape[:k]):
        for a, size in zip(off[coords], sizes[coords]):
            out[coords][int(a):int(a) + int(size)] = 0
    return [out]
