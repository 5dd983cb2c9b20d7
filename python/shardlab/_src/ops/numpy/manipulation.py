"""Shape manipulation: reshape, transpose and axis moves, expand / squeeze, broadcast, join
(concatenate, stack, hstack, ...), split, tile / repeat, flips and rolls, differences. Each
is a composition of structural primitives on per-device values, so it is differentiable.
"""

from __future__ import annotations

import builtins
import math

import numpy as np

from ...arrays.local_array import lift, LocalArray, mesh_of, register_method
from ...arrays.sharded_array import ShardedArray
from ...core import dtypes as _dt
from ...primitives import broadcasting as bc, structural as st
from ...primitives.primitive import bind
from .dispatch import _axes, _global, _implements, _is_local, _local, _method, GLOBAL
from .conversion import astype

__all__ = ["reshape", "ravel", "transpose", "swapaxes", "moveaxis", "expand_dims", "squeeze", "broadcast_to",
           "concatenate", "stack", "split", "tile", "repeat", "concat", "permute_dims", "matrix_transpose", "rollaxis",
           "flip", "fliplr", "flipud", "roll", "rot90", "diff", "atleast_1d", "atleast_2d", "atleast_3d", "hstack",
           "vstack", "dstack", "column_stack", "array_split", "dsplit", "hsplit", "vsplit", "unstack", "append",
           "broadcast_arrays"]


def _new_shape(x: LocalArray, shape, op: str) -> tuple:
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    for s in shape:
        if not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s < -1:
            raise ValueError(f"[{op}] shape {shape} must hold non-negative ints (and at most one -1)")
    if list(shape).count(-1) > 1:
        raise ValueError(f"[{op}] shape {shape} has more than one -1")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if known == 0 or x.size % known:
            raise ValueError(f"[{op}] cannot reshape local shape {x.shape} ({x.size} elements) into {shape}")
        shape = tuple(x.size // known if s == -1 else int(s) for s in shape)
    if math.prod(shape) != x.size:
        raise ValueError(f"[{op}] cannot reshape local shape {x.shape} ({x.size} elements) into "
                         f"{tuple(shape)} ({math.prod(shape)} elements)")
    return tuple(int(s) for s in shape)


@_implements(np.reshape)
def reshape(x, shape, order="C"):
    if isinstance(x, ShardedArray):
        return _global(np.reshape, x, shape=shape, order=order)
    if not isinstance(x, LocalArray):
        return np.reshape(x, shape, order=order)
    if order != "C":
        raise NotImplementedError(f"[reshape] order={order!r}: per-device values reshape in C order only")
    shape = _new_shape(x, shape, "reshape")
    return x if shape == x.shape else bind(st.RESHAPE, [x], x.mesh, local_shape=shape)


@_implements(np.ravel)
def ravel(x, order="C"):
    return reshape(x, (-1,), order=order)


@_implements(np.transpose)
def transpose(x, axes=None):
    if isinstance(x, ShardedArray):
        return _global(np.transpose, x, axes=axes)
    if not isinstance(x, LocalArray):
        return np.transpose(x, axes)
    r = x.ndim
    if axes is None:
        perm = tuple(range(r))[::-1]
    else:
        perm = tuple(a for a in axes)
        if sorted(p % r if r else p for p in perm) != list(range(r)) or len(perm) != r:
            raise ValueError(f"[transpose] axes {tuple(axes)} are not a permutation of the local rank {r}")
        perm = tuple(p % r for p in perm)
    return x if perm == tuple(range(r)) else bind(st.TRANSPOSE, [x], x.mesh, perm=perm)


@_implements(np.swapaxes)
def swapaxes(x, a, b):
    if not isinstance(x, LocalArray):
        return np.swapaxes(x, a, b)
    (a,), (b,) = _axes(a, x, "swapaxes"), _axes(b, x, "swapaxes")
    perm = list(range(x.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(x, perm)


@_implements(np.moveaxis)
def moveaxis(x, source, destination):
    if not isinstance(x, LocalArray):
        return np.moveaxis(x, source, destination)
    src = source if isinstance(source, (tuple, list)) else (source,)
    dst = destination if isinstance(destination, (tuple, list)) else (destination,)
    src = [_axes(s, x, "moveaxis")[0] for s in src]
    dst = [d % x.ndim for d in dst]
    order = [n for n in range(x.ndim) if n not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return transpose(x, order)


@_implements(np.expand_dims)
def expand_dims(x, axis):
    if not isinstance(x, LocalArray):
        return np.expand_dims(x, axis)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    r = x.ndim + len(axes)
    axes = sorted(a % r for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return reshape(x, shape)


@_implements(np.squeeze)
def squeeze(x, axis=None):
    if not isinstance(x, LocalArray):
        return np.squeeze(x, axis)
    axes = tuple(i for i, s in enumerate(x.shape) if s == 1) if axis is None else _axes(axis, x, "squeeze")
    for a in axes:
        if x.shape[a] != 1:
            raise ValueError(f"[squeeze] local axis {a} has size {x.shape[a]}, not 1 (local shape {x.shape})")
    return reshape(x, tuple(s for i, s in enumerate(x.shape) if i not in axes))


@_implements(np.broadcast_to)
def broadcast_to(x, shape):
    if not isinstance(x, LocalArray):
        return np.broadcast_to(x, shape)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    try:
        np.broadcast_shapes(x.shape, shape)
        ok = len(shape) >= x.ndim and np.broadcast_shapes(x.shape, shape) == shape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"[broadcast_to] cannot broadcast local shape {x.shape} to {shape}")
    return x if shape == x.shape else bind(bc.BROADCAST, [x], x.mesh, local_shape=shape)


@_implements(np.concatenate)
def concatenate(arrays, axis=0, dtype=None):
    arrays = list(arrays)
    if builtins.any(isinstance(a, ShardedArray) for a in arrays):
        return GLOBAL[np.concatenate](arrays, axis=axis, dtype=dtype)
    if not _is_local(*arrays):
        return np.concatenate(arrays, axis=axis, dtype=dtype)
    mesh = mesh_of(arrays)
    xs = [lift(a, mesh) for a in arrays]
    r = xs[0].ndim
    if r == 0:
        raise ValueError("[concatenate] zero-dimensional values cannot be concatenated")
    (ax,) = _axes(axis, xs[0], "concatenate")
    for i, x in enumerate(xs):
        if x.ndim != r or builtins.any(a != b for d, (a, b) in enumerate(zip(x.shape, xs[0].shape)) if d != ax):
            raise ValueError(f"[concatenate] local shapes {[v.shape for v in xs]} differ outside axis {ax}")
    dt = _dt.result_type(*[x.dtype for x in xs]) if dtype is None else _dt.canonicalize_dtype(dtype)
    xs = [astype(x, dt) for x in xs]
    return bind(st.CONCATENATE, xs, mesh, axis=ax)


@_implements(np.stack)
def stack(arrays, axis=0):
    arrays = list(arrays)
    if not _is_local(*arrays):
        return np.stack(arrays, axis=axis)
    mesh = mesh_of(arrays)
    return concatenate([expand_dims(lift(a, mesh), axis) for a in arrays], axis=axis)


@_implements(np.split)
def split(x, indices_or_sections, axis=0):
    if not isinstance(x, LocalArray):
        return np.split(x, indices_or_sections, axis=axis)
    (ax,) = _axes(axis, x, "split")
    n = x.shape[ax]
    if isinstance(indices_or_sections, (int, np.integer)):
        if indices_or_sections <= 0 or n % indices_or_sections:
            raise ValueError(f"[split] local axis {ax} of size {n} does not split into {indices_or_sections} "
                             f"equal parts")
        step = n // indices_or_sections
        bounds = list(range(0, n + 1, step))
    else:
        bounds = [0] + [builtins.min(int(i), n) for i in indices_or_sections] + [n]
    if builtins.any(a > b for a, b in zip(bounds[:-1], bounds[1:])):
        raise ValueError(f"[split] indices {list(indices_or_sections)} along local axis {ax} of size {n} decrease; "
                         f"give increasing split points (JAX refuses them too)")
    return bind(st.SPLIT, [x], x.mesh, axis=ax, sizes=tuple(b - a for a, b in zip(bounds[:-1], bounds[1:])))


@_implements(np.tile)
def tile(x, reps):
    """``numpy.tile`` on the local value (the JAX docs' collective matmul uses it)."""
    if not isinstance(x, LocalArray):
        return np.tile(x, reps)
    reps = (reps,) if isinstance(reps, (int, np.integer)) else tuple(reps)
    r = builtins.max(x.ndim, len(reps))
    x = reshape(x, (1,) * (r - x.ndim) + x.shape)
    reps = (1,) * (r - len(reps)) + reps
    for d, n in enumerate(reps):
        if n != 1:
            x = concatenate([x] * int(n), axis=d)
    return x


@_implements(np.repeat)
def repeat(x, repeats, axis=None, *, total_repeat_length=None, out_sharding=None):
    """``jnp.repeat`` (JAX's signature). ``total_repeat_length`` fixes the result's length along
    the axis (padded with the last value, or cut); ``out_sharding`` places a global array's
    result (see the global rule)."""
    if out_sharding is not None:
        raise TypeError("[repeat] out_sharding= places a global array's result; device_put the input onto a "
                        "mesh first (here it is a host or per-device value)")
    if not isinstance(x, LocalArray):
        out = np.repeat(x, repeats, axis=axis)
        if total_repeat_length is None:
            return out
        ax = 0 if axis is None else axis
        n = out.shape[ax]
        if total_repeat_length <= n:
            return np.take(out, np.arange(total_repeat_length), axis=ax)
        last = np.take(out, [n - 1], axis=ax)
        return np.concatenate([out] + [last] * (total_repeat_length - n), axis=ax)
    if total_repeat_length is not None:
        raise NotImplementedError("[repeat] total_repeat_length= is not supported on per-device values")
    if not isinstance(repeats, (int, np.integer)):
        raise NotImplementedError("[repeat] per-element repeat counts are not supported on per-device values")
    if axis is None:
        x, axis = ravel(x), 0
    (ax,) = _axes(axis, x, "repeat")
    y = expand_dims(x, ax + 1)
    y = broadcast_to(y, x.shape[:ax + 1] + (int(repeats),) + x.shape[ax + 1:])
    return reshape(y, x.shape[:ax] + (x.shape[ax] * int(repeats),) + x.shape[ax + 1:])
concat = concatenate
permute_dims = transpose


@_implements(np.matrix_transpose)
def matrix_transpose(x):
    if not _local(x):
        return np.matrix_transpose(x)
    return swapaxes(x, -1, -2)


@_implements(np.rollaxis)
def rollaxis(x, axis, start=0):
    if not _local(x):
        return np.rollaxis(x, axis, start)
    (a,) = _axes(axis, x, "rollaxis")
    start = start % (x.ndim + 1)
    return moveaxis(x, a, start - 1 if start > a else start)


def _slice(x, ax, sl):
    return x[(slice(None),) * ax + (sl,)]


@_implements(np.flip)
def flip(x, axis=None):
    if not _local(x):
        return np.flip(x, axis)
    axes = range(x.ndim) if axis is None else _axes(axis, x, "flip")
    return x[tuple(slice(None, None, -1) if d in axes else slice(None) for d in range(x.ndim))]


@_implements(np.fliplr)
def fliplr(x):
    return flip(x, 1) if _local(x) else np.fliplr(x)


@_implements(np.flipud)
def flipud(x):
    return flip(x, 0) if _local(x) else np.flipud(x)


@_implements(np.roll)
def roll(x, shift, axis=None):
    if not _local(x):
        return np.roll(x, shift, axis)
    if axis is None:
        return reshape(roll(reshape(x, (-1,)), shift, 0), x.shape)
    shifts = (shift,) if isinstance(shift, (int, np.integer)) else tuple(shift)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    for s, a in zip(shifts, axes):
        (ax,) = _axes(a, x, "roll")
        n = x.shape[ax]
        s = int(s) % n if n else 0
        if s:
            x = concatenate([_slice(x, ax, slice(n - s, None)), _slice(x, ax, slice(0, n - s))], axis=ax)
    return x


@_implements(np.rot90)
def rot90(x, k=1, axes=(0, 1)):
    if not _local(x):
        return np.rot90(x, k, axes)
    a, b = axes
    k %= 4
    if k == 0:
        return x
    if k == 2:
        return flip(flip(x, a), b)
    return swapaxes(flip(x, b), a, b) if k == 1 else flip(swapaxes(x, a, b), b)


@_implements(np.diff)
def diff(x, n=1, axis=-1):
    if not _local(x):
        return np.diff(x, n=n, axis=axis)
    (ax,) = _axes(axis, x, "diff")
    for _ in range(n):
        x = _slice(x, ax, slice(1, None)) - _slice(x, ax, slice(None, -1))
    return x


def _atleast(x, r):
    x = lift(x, x.mesh) if _local(x) else x
    if x.ndim >= r:
        return x
    if r == 3 and x.ndim == 2:
        return reshape(x, x.shape + (1,))
    if r == 3 and x.ndim == 1:
        return reshape(x, (1,) + x.shape + (1,))
    return reshape(x, (1,) * (r - x.ndim) + x.shape)


def _atleast_fn(r, np_fn):
    @_implements(np_fn)
    def fn(*arys):
        if not _is_local(*arys):
            return np_fn(*arys)
        mesh = mesh_of(arys)
        out = [_atleast(lift(a, mesh), r) for a in arys]
        return out[0] if len(out) == 1 else out

    fn.__name__ = np_fn.__name__
    fn.__doc__ = f"``numpy.{np_fn.__name__}`` on local shapes."
    return fn


atleast_1d = _atleast_fn(1, np.atleast_1d)
atleast_2d = _atleast_fn(2, np.atleast_2d)
atleast_3d = _atleast_fn(3, np.atleast_3d)


@_implements(np.hstack)
def hstack(tup, dtype=None):
    tup = list(tup)
    if not _is_local(*tup):
        return np.hstack(tup, dtype=dtype)
    arrs = atleast_1d(*tup)
    arrs = arrs if isinstance(arrs, list) else [arrs]
    return concatenate(arrs, axis=0 if arrs[0].ndim == 1 else 1, dtype=dtype)


@_implements(np.vstack)
def vstack(tup, dtype=None):
    tup = list(tup)
    if not _is_local(*tup):
        return np.vstack(tup, dtype=dtype)
    arrs = atleast_2d(*tup)
    return concatenate(arrs if isinstance(arrs, list) else [arrs], axis=0, dtype=dtype)


@_implements(np.dstack)
def dstack(tup, dtype=None):
    tup = list(tup)
    if not _is_local(*tup):
        return np.dstack(tup, dtype=dtype)
    arrs = atleast_3d(*tup)
    return concatenate(arrs if isinstance(arrs, list) else [arrs], axis=2, dtype=dtype)


@_implements(np.column_stack)
def column_stack(tup):
    tup = list(tup)
    if not _is_local(*tup):
        return np.column_stack(tup)
    mesh = mesh_of(tup)
    cols = [lift(a, mesh) for a in tup]
    return concatenate([reshape(c, c.shape + (1,)) if c.ndim < 2 else c for c in cols], axis=1)


@_implements(np.array_split)
def array_split(x, indices_or_sections, axis=0):
    if not _local(x):
        return np.array_split(x, indices_or_sections, axis=axis)
    if isinstance(indices_or_sections, (int, np.integer)):
        (ax,) = _axes(axis, x, "array_split")
        n, k = x.shape[ax], int(indices_or_sections)
        sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
        indices_or_sections = list(np.cumsum(sizes)[:-1])
    return split(x, indices_or_sections, axis=axis)


def _split_fn(np_fn, axis):
    @_implements(np_fn)
    def fn(x, indices_or_sections):
        if not _local(x):
            return np_fn(x, indices_or_sections)
        return split(x, indices_or_sections, axis=axis if x.ndim > 1 or axis == 0 else 0)

    fn.__name__ = np_fn.__name__
    return fn


hsplit, vsplit, dsplit = _split_fn(np.hsplit, 1), _split_fn(np.vsplit, 0), _split_fn(np.dsplit, 2)


@_implements(np.unstack)
def unstack(x, *, axis=0):
    if not _local(x):
        return np.unstack(x, axis=axis)
    (ax,) = _axes(axis, x, "unstack")
    return tuple(x[(slice(None),) * ax + (i,)] for i in range(x.shape[ax]))


@_implements(np.append)
def append(arr, values, axis=None):
    if not _is_local(arr, values):
        return np.append(arr, values, axis=axis)
    mesh = mesh_of((arr, values))
    a, v = lift(arr, mesh), lift(values, mesh)
    if axis is None:
        return concatenate([reshape(a, (-1,)), reshape(v, (-1,))])
    return concatenate([a, v], axis=axis)


@_implements(np.broadcast_arrays)
def broadcast_arrays(*args):
    if not _is_local(*args):
        return np.broadcast_arrays(*args)
    mesh = mesh_of(args)
    xs = [lift(a, mesh) for a in args]
    shape = np.broadcast_shapes(*[x.shape for x in xs])
    return [broadcast_to(x, shape) for x in xs]


register_method("reshape", lambda self, *shape, order="C": reshape(
    self, shape[0] if len(shape) == 1 else shape, order=order))
register_method("transpose", lambda self, *axes: transpose(self, axes[0] if len(axes) == 1 else (axes or None)))
for _name, _fn in (("squeeze", squeeze), ("swapaxes", swapaxes), ("ravel", ravel), ("flatten", ravel),
                   ("repeat", repeat)):
    register_method(_name, _method(_fn))
