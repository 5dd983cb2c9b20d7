"""The emulated backend's collectives: the C++ core moves the data between the virtual
devices of the storage (any dtype: moved as bits of a core dtype of the same size, reduced
in a wider one)."""

from __future__ import annotations

import math

import numpy as np

import shardlab._core as _core

from ...core import memory
from ...kernels.native import CORE_DTYPES, as_bits, narrow, wide
from ...primitives import collectives as col
from .common import _impl


_SMALL_OUTPUT = 1 << 30


def _check_output(prim, storages, mesh, **params):
    """MemoryError naming the collective before the core allocates an output larger than this
    machine's memory (an all_gather's output is every device's input together)."""
    (shape, dtype), = prim.shape_rule(storages[:1], mesh, **params)
    memory.check_alloc(prim.name, math.prod(shape) * np.dtype(dtype).itemsize,
                       f"its output of local shape {tuple(shape[mesh.ndim:])} is held for every device "
                       f"of the mesh; use an abstract mesh (make_mesh(..., abstract=True)) to cost it")


def _collective_impl(prim):
    """Registers a collective's implementation behind the output-size check."""
    def register(fn):
        def impl(storages, mesh, **params):
            if storages[0].nbytes * mesh.size >= _SMALL_OUTPUT:
                _check_output(prim, storages, mesh, **params)
            return fn(storages, mesh, **params)

        prim.impl["emulated"] = impl
        return fn

    return register


def _move(core_fn, x, mesh, axes, *args):
    """A data-movement collective on any dtype: the core moves its bits under a core dtype of
    the same size."""
    if x.dtype in CORE_DTYPES:
        return [core_fn(mesh._core, x, axes, *args)]
    return [core_fn(mesh._core, as_bits(x), axes, *args).view(x.dtype)]


def _reduce_wide(core_fn, x, mesh, axes, *args, mean=False):
    """A reducing collective on any dtype: run in a wider core dtype, back with JAX's wrap."""
    if x.dtype in CORE_DTYPES and not (mean and x.dtype.kind in "iub"):
        return [core_fn(mesh._core, x, axes, *args)]
    if mean and x.dtype.kind in "iub":
        x = x.astype(np.float32)  # a mean of integers is a float, as JAX's
    return [narrow(core_fn(mesh._core, x.astype(wide(x.dtype), copy=False), axes, *args), x.dtype)]


@_collective_impl(col.PSUM)
def _psum(storages, mesh, *, axes, reduction):
    return _reduce_wide(_core.all_reduce, storages[0], mesh, axes, reduction, mean=reduction == "mean")


@_collective_impl(col.ALL_GATHER)
def _all_gather(storages, mesh, *, axes, axis, tiled):
    return _move(_core.all_gather, storages[0], mesh, axes, axis, tiled)


@_collective_impl(col.PSUM_SCATTER)
def _psum_scatter(storages, mesh, *, axes, dim, tiled):
    return _reduce_wide(_core.psum_scatter, storages[0], mesh, axes, dim, tiled)


@_collective_impl(col.ALL_TO_ALL)
def _all_to_all(storages, mesh, *, axes, split, concat, tiled):
    return _move(_core.all_to_all, storages[0], mesh, axes, split, concat, tiled)


@_collective_impl(col.PPERMUTE)
def _ppermute(storages, mesh, *, axes, perm):
    return _move(_core.ppermute, storages[0], mesh, axes, perm)


@_impl(col.AXIS_INDEX)
def _axis_index(storages, mesh, *, axes):
    return [_core.axis_index(mesh._core, list(axes))]


@_collective_impl(col.PBROADCAST)
def _pbroadcast(storages, mesh, *, axes, root):
    return _move(_core.broadcast, storages[0], mesh, axes, root)


@_collective_impl(col.REDUCE)
def _reduce(storages, mesh, *, axes, root, reduction):
    return _reduce_wide(_core.reduce, storages[0], mesh, axes, root, reduction, mean=reduction == "mean")


@_collective_impl(col.GATHER)
def _gather(storages, mesh, *, axes, root, axis, tiled):
    return _move(_core.gather, storages[0], mesh, axes, root, axis, tiled)


@_collective_impl(col.SCATTER)
def _scatter(storages, mesh, *, axes, root, dim, tiled):
    return _move(_core.scatter, storages[0], mesh, axes, root, dim, tiled)


@_impl(col.PCAST)
def _pcast(storages, mesh, *, axes, to):
    s = storages[0]
    k = mesh.ndim
    idx = col.axis_indices(mesh, axes)
    if to == "varying":
        shape = tuple(mesh.axis_sizes[a] if a in idx else d for a, d in enumerate(s.shape[:k]))
        return [np.broadcast_to(s, shape + tuple(s.shape[k:]))]
    for a in idx:
        first = s[(slice(None),) * a + (slice(0, 1),)]
        if s.shape[a] != 1 and not (s.strides[a] == 0 or (s == first).all()):
            raise ValueError(f"[pcast] the value differs between devices along "
                             f"{mesh.axis_names[a]!r}; psum or all_gather it first")
        s = first
    return [s]
