"""Indexing: ``x[...]`` (basic, advanced and dynamic), ``x.at[...]`` updates, ``take``,
``take_along_axis``, ``diagonal`` and ``trace`` on per-device values.
"""

from __future__ import annotations

import builtins

import numpy as np

from ...arrays.index_update import at_property, IndexOps
from ...arrays.local_array import lift, LocalArray, mesh_of, register_method
from ...primitives import structural as st
from ...primitives.primitive import bind
from .dispatch import _axes, _implements, _is_local, _local
from .conversion import astype
from .manipulation import broadcast_to, moveaxis, reshape
from .creation import ones_like
from .elementwise import clip, where
from .reductions import sum

__all__ = ["take_along_axis", "take", "diagonal", "trace"]


@_implements(np.take_along_axis)
def take_along_axis(x, indices, axis):
    if not _is_local(x, indices):
        return np.take_along_axis(x, indices, axis)
    mesh = mesh_of((x, indices))
    x, indices = lift(x, mesh), lift(indices, mesh)
    (ax,) = _axes(axis, x, "take_along_axis")
    st.take_local_shape(x.shape, indices.shape, ax)  # raises on shapes that do not fit, in local terms
    return bind(st.TAKE_ALONG_AXIS, [x, astype(indices, np.int32)], mesh, axis=ax)


def _dynamic_index(x: LocalArray, key: tuple):
    """``x[key]`` where some indices are per-device integer values (``x[lax.axis_index('i')]``),
    as JAX: a negative index counts from the end, then it is clamped into range (JAX's
    dynamic_slice for scalar indices, its gather's clamping for index arrays); the steps are
    primitives (dynamic_slice, take_along_axis, getitem), so they are recorded and differentiable.
    Returns (x, key) with every per-device index applied and the rest of ``key`` left to do."""
    n_dims = builtins.sum(1 for k in key if k is not None and k is not Ellipsis and
                          not (isinstance(k, (np.ndarray, LocalArray)) and k.dtype == np.bool_))
    if builtins.sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("[getitem] an index can only have a single ellipsis ('...')")
    if Ellipsis in [k for k in key if not isinstance(k, (np.ndarray, LocalArray))]:
        i = [j for j, k in enumerate(key) if k is Ellipsis and not isinstance(k, (np.ndarray, LocalArray))][0]
        key = key[:i] + (slice(None),) * builtins.max(0, x.ndim - n_dims) + key[i + 1:]
    key = key + (slice(None),) * builtins.max(0, x.ndim - builtins.sum(1 for k in key if k is not None))
    dims, d = [], 0  # the dim of x each entry of key consumes (None: inserts one)
    for k in key:
        dims.append(None if k is None else d)
        d += k is not None
    if d > x.ndim:
        raise IndexError(f"[getitem] too many indices for a per-device value of local rank {x.ndim}: {d} were "
                         f"given (local shape {x.shape})")
    dyn = [j for j, k in enumerate(key) if isinstance(k, LocalArray)]
    for j in dyn:
        k = key[j]
        if k.dtype == np.bool_:
            raise IndexError(f"[getitem] a per-device boolean index gives a data-dependent shape (JAX's "
                             f"NonConcreteBooleanIndexError; local shape {k.shape}); use jnp.where")
        if k.dtype.kind not in "iu":
            raise TypeError(f"[getitem] Indexer must have integer or boolean type, got indexer with type {k.dtype} "
                            f"at position {j}, indexer value {k!r:.60}")
    if builtins.any(isinstance(key[j], np.ndarray) for j in range(len(key))):
        raise NotImplementedError("[getitem] per-device indices mixed with constant index arrays; index in two "
                                  "steps, or make the constant a per-device array too")
    key = list(key)
    scalars = [j for j in dyn if key[j].ndim == 0]
    if scalars:  # JAX's dynamic_slice of size 1 on each such dim, then the (static) int index 0
        starts, sizes = [0] * x.ndim, list(x.shape)
        for j in scalars:
            n = x.shape[dims[j]]
            if n == 0:
                raise IndexError(f"[getitem] index is out of bounds for local axis {dims[j]} with size 0")
            i = astype(key[j], np.int32)
            starts[dims[j]] = where(i < 0, i + n, i)
            sizes[dims[j]] = 1
            key[j] = 0
        starts = [lift(np.int32(v), x.mesh) if not isinstance(v, LocalArray) else v for v in starts]
        x = bind(st.DYNAMIC_SLICE, [x, *starts], x.mesh, sizes=tuple(sizes))
    arrays = [j for j in dyn if isinstance(key[j], LocalArray)]
    if len(arrays) > 1:
        raise NotImplementedError("[getitem] more than one per-device index array; index in several steps")
    if arrays:
        (j,) = arrays
        ints = [i for i, k in enumerate(key) if isinstance(k, (int, np.integer)) and not isinstance(k, bool)]
        adv = sorted(ints + [j])
        if adv != list(range(adv[0], adv[-1] + 1)):
            raise NotImplementedError("[getitem] a per-device index array separated from integer indices by "
                                      "slices; index in two steps")
        idx, ax = key[j], dims[j]
        n = x.shape[ax]
        idx = astype(idx, np.int32)
        idx = clip(where(idx < 0, idx + n, idx), 0, builtins.max(n - 1, 0))  # JAX's gather clamps
        flat = reshape(idx, (1,) * ax + (-1,) + (1,) * (x.ndim - ax - 1))
        flat = broadcast_to(flat, x.shape[:ax] + (idx.size,) + x.shape[ax + 1:])
        x = reshape(bind(st.TAKE_ALONG_AXIS, [x, flat], x.mesh, axis=ax),
                    x.shape[:ax] + idx.shape + x.shape[ax + 1:])
        key[j:j + 1] = [slice(None)] * idx.ndim
    return x, tuple(key)


def _getitem(x: LocalArray, key):
    key = key if isinstance(key, tuple) else (key,)
    if builtins.any(isinstance(k, LocalArray) for k in key):
        key = tuple(np.asarray(k) if isinstance(k, list) else k for k in key)
        x, key = _dynamic_index(x, key)
        if builtins.all(isinstance(k, slice) and k == slice(None) for k in key):
            return x
    key = tuple(np.asarray(k) if isinstance(k, list) else k for k in key)
    probe = np.broadcast_to(np.zeros((), np.int8), x.shape)
    try:
        probe[key]
    except IndexError as e:
        raise IndexError(f"[getitem] {e} (local shape {x.shape})") from None
    adv = [i for i, k in enumerate(key) if isinstance(k, np.ndarray)]
    if adv and adv != list(range(adv[0], adv[-1] + 1)):
        raise NotImplementedError("[getitem] array indices separated by slices are not supported on "
                                  "per-device values; index in two steps")
    return bind(st.GETITEM, [x], x.mesh, key=key)


register_method("__getitem__", _getitem)


def _scatter(x: LocalArray, key, values, how: str) -> LocalArray:
    """``x.at[key].<how>(values)`` on a per-device value, as JAX's scatter: the positions
    ``x[key]`` selects (per-device indices allowed, see :func:`_dynamic_index`) get the updates
    (cast to x's dtype, broadcast to ``x[key]``'s shape); a per-device scalar index out of
    range drops its update (JAX's FILL_OR_DROP). Built from primitives (take_along_axis's
    transpose put_along_axis_add, select), so it is recorded and differentiable. Repeated
    positions accumulate for ``add``; for the other updates they are unspecified, as in JAX."""
    mesh = x.mesh
    key = key if isinstance(key, tuple) else (key,)
    n = x.size
    sel = _getitem(lift(np.arange(n, dtype=np.int32).reshape(x.shape), mesh), key)
    sel = lift(sel, mesh)
    upd = values if isinstance(values, LocalArray) else lift(np.asarray(values, x.dtype), mesh)
    upd = reshape(broadcast_to(astype(upd, x.dtype), sel.shape), (-1,))
    idx = reshape(sel, (-1,))
    weight = None
    if not builtins.any(k is None or k is Ellipsis for k in key if not isinstance(k, (np.ndarray, LocalArray))):
        for d, k in enumerate(key):
            if isinstance(k, LocalArray) and k.ndim == 0 and d < x.ndim:
                ok = (k >= -x.shape[d]) & (k < x.shape[d])
                weight = ok if weight is None else weight & ok
    if weight is not None:
        upd = upd * astype(weight, x.dtype)

    def put(v):
        return bind(st.PUT_ALONG_ADD, [v, idx], mesh, axis=0, local_shape=(n,))

    flat = reshape(x, (-1,))
    if how == "add":
        return reshape(flat + put(upd), x.shape)
    ones = ones_like(upd) if weight is None else broadcast_to(astype(weight, x.dtype), upd.shape)
    hit = put(ones) > 0
    new = put(upd)
    out = {"set": lambda: new, "multiply": lambda: flat * new, "min": lambda: np.minimum(flat, new),
           "max": lambda: np.maximum(flat, new)}[how]()
    return reshape(where(hit, out, flat), x.shape)


def _local_at_get(x: LocalArray, key, *, mode=None, fill_value=None, out_sharding=None):
    return x[key]


def _local_at_scatter(x: LocalArray, key, values, how, *, mode=None, out_sharding=None):
    """``.at[key].<how>`` of a per-device value: set, add, subtract, multiply, min, max."""
    if how == "subtract":
        values, how = (-lift(values, x.mesh) if isinstance(values, LocalArray) else -np.asarray(values)), "add"
    if how not in ("set", "add", "multiply", "min", "max"):
        name = how if isinstance(how, str) else "apply"
        raise NotImplementedError(f"[.at[].{name}] on a per-device value (inside shard_map) is not supported; "
                                  f"use set, add, subtract, multiply, min or max, or jnp.where with a mask")
    return _scatter(x, key, values, how)


register_method("at", at_property(IndexOps(get=_local_at_get, scatter=_local_at_scatter)))


@_implements(np.take)
def take(x, indices, axis=None, mode=None):
    """``numpy.take`` with constant indices (gather; differentiable): indices are clipped,
    as ``jnp.take(mode='clip')``; per-device indices go through ``take_along_axis``."""
    if not _is_local(x, indices):
        return np.take(x, indices, axis=axis, mode=mode)
    if not isinstance(x, LocalArray):  # a constant table indexed by per-device indices
        x = lift(x, mesh_of([indices]))
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    (ax,) = _axes(axis, x, "take")
    if _local(indices):
        idx = indices
        shape = x.shape[:ax] + idx.shape + x.shape[ax + 1:]
        flat = reshape(idx, (1,) * ax + (-1,) + (1,) * (x.ndim - ax - 1))
        flat = broadcast_to(flat, x.shape[:ax] + (idx.size,) + x.shape[ax + 1:])
        n = x.shape[ax]
        flat = clip(flat, 0, n - 1) if mode == "clip" else where(flat < 0, flat + n, flat)
        return reshape(take_along_axis(x, flat, ax), shape)
    idx = np.asarray(indices)
    n = x.shape[ax]
    idx = np.clip(idx, 0, n - 1) if mode == "clip" else np.where(idx < 0, idx + n, idx)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"[take] index out of range for local axis {ax} of size {n}; pass mode='clip'")
    return x[(slice(None),) * ax + (idx,)]


@_implements(np.diagonal)
def diagonal(x, offset=0, axis1=0, axis2=1):
    if not _local(x):
        return np.diagonal(x, offset, axis1, axis2)
    (a,), (b,) = _axes(axis1, x, "diagonal"), _axes(axis2, x, "diagonal")
    x = moveaxis(x, (a, b), (-2, -1))
    n, m = x.shape[-2:]
    i = np.arange(builtins.max(0, builtins.min(n - builtins.max(-offset, 0), m - builtins.max(offset, 0))))
    rows, cols = i + builtins.max(-offset, 0), i + builtins.max(offset, 0)
    return x[(Ellipsis, rows, cols)]


@_implements(np.trace)
def trace(x, offset=0, axis1=0, axis2=1, dtype=None):
    if not _local(x):
        return np.trace(x, offset, axis1, axis2, dtype)
    return sum(diagonal(x, offset, axis1, axis2), axis=-1, dtype=dtype)
