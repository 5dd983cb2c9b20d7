"""The emulated backend's structural primitives: reshape, transpose, concatenate, split,
indexing, scatter-add, take/put along an axis, dynamic slices, zeros."""

from __future__ import annotations

import math

import numpy as np

import shardlab._core as _core

from ...core.dtypes import float32, float64
from ...primitives import structural as st
from ...primitives.fallback import mesh_dims
from .common import _impl, _src


@_impl(st.RESHAPE)
def _reshape(storages, mesh, *, local_shape):
    x = storages[0]
    return [x.reshape(tuple(x.shape[:mesh.ndim]) + tuple(local_shape))]


@_impl(st.TRANSPOSE)
def _transpose(storages, mesh, *, perm):
    k = mesh.ndim
    return [storages[0].transpose(tuple(range(k)) + tuple(k + p for p in perm))]


_CORE_CONCAT_SIZE = 1 << 16  # elements: below, numpy's single-threaded copy is as fast


@_impl(st.CONCATENATE)
def _concatenate(storages, mesh, *, axis):
    k = mesh.ndim
    dims = mesh_dims(storages, k)
    pieces = [np.broadcast_to(s, dims + tuple(s.shape[k:])) for s in storages]
    if all(p.dtype == np.float32 for p in pieces) and sum(p.size for p in pieces) >= _CORE_CONCAT_SIZE:
        return [_core.concatenate(pieces, k + axis)]  # the core's strided copies, on every core
    return [np.concatenate(pieces, axis=k + axis)]


@_impl(st.SPLIT)
def _split(storages, mesh, *, axis, sizes):
    x, lead = storages[0], (slice(None),) * (mesh.ndim + axis)
    bounds = np.cumsum((0,) + tuple(sizes))
    return [x[lead + (slice(int(a), int(b)),)] for a, b in zip(bounds[:-1], bounds[1:])]


@_impl(st.GETITEM)
def _getitem(storages, mesh, *, key):
    return [np.asarray(storages[0][(slice(None),) * mesh.ndim + tuple(key)])]


def _is_basic(key) -> bool:
    return all(isinstance(i, (slice, int, np.integer, type(None), type(Ellipsis))) for i in key)


@_impl(st.SCATTER_ADD)
def _scatter_add(storages, mesh, *, key, local_shape):
    ct = storages[0]
    k = mesh.ndim
    out = np.zeros(tuple(ct.shape[:k]) + tuple(local_shape), ct.dtype)
    idx = (slice(None),) * k + tuple(key)
    if _is_basic(key):
        out[idx] += ct
    else:
        np.add.at(out, idx, ct)
    return [out]


@_impl(st.TAKE_ALONG_AXIS)
def _take(storages, mesh, *, axis):
    x, i = storages
    k = mesh.ndim
    dims = mesh_dims(storages, k)
    a = k + axis
    if i.ndim == x.ndim and all(n == 1 for n in i.shape[a + 1:]) and all(
            n == 1 for n in i.shape[k:a]) and all(n == 1 for n in x.shape[k:a]):
        # A row gather (an embedding lookup: a [V, D] table, an [N, 1] index): whole rows per
        # device with np.take, where take_along_axis builds an index for every element.
        out = np.empty(dims + x.shape[k:a] + (i.shape[a],) + x.shape[a + 1:], x.dtype)
        xb, ib = np.broadcast_to(x, dims + x.shape[k:]), np.broadcast_to(i, dims + i.shape[k:])
        for d in np.ndindex(*dims):
            out[d] = np.take(xb[d], ib[d].reshape(-1), axis=axis)
        return [out]
    x = np.broadcast_to(x, dims + tuple(x.shape[k:]))
    i = np.broadcast_to(i, dims + tuple(i.shape[k:]))
    return [np.take_along_axis(x, i, axis=a)]


@_impl(st.PUT_ALONG_ADD)
def _put_add(storages, mesh, *, axis, local_shape):
    ct, i = storages
    k = mesh.ndim
    dims = mesh_dims(storages, k)
    # The index may broadcast against the table (take_along_axis's rule): both to one shape.
    full = np.broadcast_shapes(dims + tuple(i.shape[k:]), tuple(ct.shape))
    out = np.zeros(dims + tuple(local_shape), ct.dtype)
    a = k + axis
    if (ct.dtype in (float32, float64) and all(n == 1 for n in i.shape[a + 1:])
            and out.shape[:a] == full[:a] and out.shape[a + 1:] == full[a + 1:]):
        # A row gather's gradient (an embedding table's): whole rows add at once, in C++ on
        # every core, where np.add.at adds one element at a time.
        p, c = math.prod(full[:a]), math.prod(full[a + 1:])
        rows = np.broadcast_to(i, full[:a + 1] + (1,) * (len(full) - a - 1)).reshape(p, full[a])
        rows = np.where(rows < 0, rows + out.shape[a], rows).astype(np.int32)
        _core.scatter_add_rows(out.reshape(p, out.shape[a], c), rows, np.broadcast_to(ct, full).reshape(p, full[a], c))
        return [out]
    i, ct = np.broadcast_to(i, full), np.broadcast_to(ct, full)
    grid = list(np.ogrid[tuple(slice(n) for n in i.shape)])
    grid[k + axis] = i
    np.add.at(out, tuple(grid), ct)
    return [out]


def _per_device(x_shape, starts, sizes, k):
    """Per device coordinate: the clamped slices of a dynamic slice (as JAX clamps)."""
    dims = tuple(np.broadcast_shapes(tuple(x_shape[:k]), *(np.shape(s)[:k] for s in starts if np.ndim(s))))
    local = x_shape[k:]
    starts = [np.broadcast_to(np.asarray(s).reshape(np.shape(s)[:k] or (1,) * k), dims) for s in starts]
    for coords in np.ndindex(*dims):
        yield coords, tuple(slice(b, b + n) for b, n in
                            ((int(min(max(int(s[coords]), 0), dim - n)), n)
                             for s, n, dim in zip(starts, sizes, local)))



@_impl(st.DYNAMIC_SLICE)
def _dynamic_slice(storages, mesh, *, sizes):
    x, *starts = storages
    k = mesh.ndim
    dims = mesh_dims(storages, k)
    out = np.empty(dims + tuple(sizes), dtype=x.dtype)
    for coords, idx in _per_device(x.shape, starts, sizes, k):
        out[coords] = x[_src(coords, x.shape, k)][idx]
    return [out]


@_impl(st.DYNAMIC_UPDATE_SLICE)
def _dynamic_update_slice(storages, mesh):
    x, u, *starts = storages
    k = mesh.ndim
    dims = mesh_dims(storages, k)
    out = np.array(np.broadcast_to(x, dims + tuple(x.shape[k:])))
    for coords, idx in _per_device(out.shape, starts, u.shape[k:], k):
        out[coords][idx] = u[_src(coords, u.shape, k)]
    return [out]


@_impl(st.ZEROS)
def _zeros(storages, mesh):
    x = storages[0]
    return [np.broadcast_to(np.zeros((), x.dtype), x.shape)]
