"""The rest of jax.numpy on per-device values: compositions of primitives (differentiable,
recorded, abstract-ready) for the functions ``numpy.py`` does not define itself.

The per-device fallback and the coverage table live in ``numpy_fallback``.

Example:
    >>> import numpy as np, shardlab as sl
    >>> import shardlab.numpy as jnp
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((2,), ("x",))
    >>> f = sl.shard_map(lambda v: jnp.sort(v, axis=-1), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    >>> np.asarray(f(np.array([[3.0, 1.0], [0.0, -1.0]], np.float32))).tolist()
    [[1.0, 3.0], [-1.0, 0.0]]
"""

from __future__ import annotations

import builtins
import functools

import numpy as np

from ..arrays.local_array import LocalArray, lift, mesh_of
from ..core import dtypes as _dt
from ..core.mesh import UNIT_MESH
from ..primitives import elementwise as ew
from ..primitives.fallback import FALLBACK
from ..primitives.primitive import bind
from . import numpy as _np_ops
from .numpy import (_axes, _implements, _is_local, abs, all, astype, concatenate,  # noqa: A004
                    cumsum, einsum, equal, isnan, max, mean, min, moveaxis, multiply,
                    reshape, split, sum, swapaxes, take_along_axis, transpose, where)

_is_local = _is_local


def _local(x):
    return isinstance(x, LocalArray)


# -- aliases (numpy 2 / array-API names) -------------------------------------------------------
_U = _np_ops.ufunc
acos, acosh, asin, asinh, atan, atan2, atanh = [_U(u) for u in (np.arccos, np.arccosh, np.arcsin, np.arcsinh,
                                                                np.arctan, np.arctan2, np.arctanh)]
arccosh, arctanh = acosh, atanh
bitwise_invert = bitwise_not = _np_ops.invert
bitwise_left_shift, bitwise_right_shift = _U(np.left_shift), _U(np.right_shift)
left_shift, right_shift = bitwise_left_shift, bitwise_right_shift
(cbrt, fabs, deg2rad, rad2deg, degrees, radians, logaddexp2, heaviside, spacing, nextafter, gcd, lcm,
 float_power, fmod, ldexp, bitwise_count, conj, conjugate) = [_U(u) for u in (
    np.cbrt, np.fabs, np.deg2rad, np.rad2deg, np.degrees, np.radians, np.logaddexp2, np.heaviside,
    np.spacing, np.nextafter, np.gcd, np.lcm, np.float_power, np.fmod, np.ldexp, np.bitwise_count,
    np.conj, np.conjugate)]
concat = concatenate
permute_dims = transpose
cumulative_sum = cumsum


def erf(x):
    """The error function (``jax.scipy.special.erf``), a primitive with derivative
    2/sqrt(pi)·exp(-x²); integers give float32 as in JAX.

    Example:
        >>> import numpy as np, shardlab.numpy as jnp
        >>> print(f"{float(jnp.erf(np.float32(0.5))):.4f}")
        0.5205
    """
    if _local(x):
        return bind(ew.ERF, [x], x.mesh)
    return bind(ew.ERF, [lift(x, UNIT_MESH)], UNIT_MESH).storage


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


# -- flips, rolls, differences (basic slicing: differentiable) ---------------------------------
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


# -- stacking and splitting ---------------------------------------------------------------------
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
    return [_np_ops.broadcast_to(x, shape) for x in xs]


# -- indexing: take, diagonal, trace, sort, top_k -------------------------------------------------
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
        flat = _np_ops.broadcast_to(flat, x.shape[:ax] + (idx.size,) + x.shape[ax + 1:])
        n = x.shape[ax]
        flat = _np_ops.clip(flat, 0, n - 1) if mode == "clip" else where(flat < 0, flat + n, flat)
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


def _argsort_local(x, axis, descending=False):
    src = -x if descending and x.dtype.kind != "b" else x
    fn = functools.partial(np.argsort, kind="stable")
    out = bind(FALLBACK, [src], x.mesh, fn=fn, kwargs=(("axis", axis - x.ndim),), vectorised=True)
    return astype(out, _dt.default_int_dtype())


@_implements(np.argsort)
def argsort(x, axis=-1, kind=None, order=None, *, stable=True, descending=False):
    """Indices that sort `x` along a local axis (stable, as jnp.argsort)."""
    if not _local(x):
        return np.argsort(x, axis=axis, kind="stable")
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    (ax,) = _axes(axis, x, "argsort")
    return _argsort_local(x, ax, descending)


@_implements(np.sort)
def sort(x, axis=-1, kind=None, order=None, *, stable=True, descending=False):
    """``x`` sorted along a local axis: the permutation from argsort applied with
    take_along_axis, so the values are differentiable (as jnp.sort's)."""
    if not _local(x):
        return np.sort(x, axis=axis)
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    (ax,) = _axes(axis, x, "sort")
    return take_along_axis(x, _argsort_local(x, ax, descending), ax)


def top_k(x, k: int):
    """The `k` largest entries along the last axis and their indices, as ``jax.lax.top_k``
    (values differentiable; ties keep the lower index first).

    Example:
        >>> import numpy as np, shardlab.numpy as jnp
        >>> v, i = jnp.top_k(np.array([1.0, 5.0, 3.0], np.float32), 2)
        >>> v.tolist(), i.tolist()
        ([5.0, 3.0], [1, 2])
    """
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 0:
        raise ValueError(f"[top_k] k must be a non-negative int, got {k!r}")
    if not _local(x):
        x = np.asarray(x)
        if k > x.shape[-1]:
            raise ValueError(f"[top_k] k={k} is more than the last axis' size {x.shape[-1]}")
        idx = np.argsort(-x, axis=-1, kind="stable")[..., :k].astype(_dt.default_int_dtype())
        return np.take_along_axis(x, idx, -1), idx
    if x.ndim == 0 or k > x.shape[-1]:
        raise ValueError(f"[top_k] k={k} is more than the last local axis of shape {x.shape}")
    idx = _argsort_local(x, x.ndim - 1, descending=True)[..., :k]
    return take_along_axis(x, idx, -1), idx


# -- NaN-aware and other reductions (compositions) -----------------------------------------------
def _nan_reducer(np_fn, base, fill):
    @_implements(np_fn)
    def fn(x, axis=None, dtype=None, keepdims=False, **kw):
        if not _local(x):
            return np_fn(x, axis=axis, keepdims=keepdims, **({"dtype": dtype} if dtype else {}), **kw)
        filled = where(isnan(x), fill, x) if x.dtype.kind == "f" or x.dtype == _dt.bfloat16 else x
        return base(filled, axis=axis, keepdims=keepdims) if base in (max, min) else \
            base(filled, axis=axis, dtype=dtype, keepdims=keepdims)

    fn.__name__ = np_fn.__name__
    fn.__doc__ = f"``numpy.{np_fn.__name__}``: NaNs replaced, then the reduction (differentiable)."
    return fn


nansum = _nan_reducer(np.nansum, sum, 0.0)
nanprod = _nan_reducer(np.nanprod, _np_ops.prod, 1.0)
nanmax = _nan_reducer(np.nanmax, max, -np.inf)
nanmin = _nan_reducer(np.nanmin, min, np.inf)


@_implements(np.nanmean)
def nanmean(x, axis=None, dtype=None, keepdims=False):
    if not _local(x):
        return np.nanmean(x, axis=axis, dtype=dtype, keepdims=keepdims)
    x = _np_ops._inexact(x)
    ok = astype(~isnan(x), x.dtype)
    return nansum(x, axis=axis, keepdims=keepdims) / sum(ok, axis=axis, keepdims=keepdims)


@_implements(np.ptp)
def ptp(x, axis=None, keepdims=False):
    if not _local(x):
        return np.ptp(x, axis=axis, keepdims=keepdims)
    return max(x, axis=axis, keepdims=keepdims) - min(x, axis=axis, keepdims=keepdims)


@_implements(np.count_nonzero)
def count_nonzero(x, axis=None, *, keepdims=False):
    if not _local(x):
        return np.count_nonzero(x, axis=axis, keepdims=keepdims)
    return sum(x != 0, axis=axis, keepdims=keepdims)


@_implements(np.average)
def average(x, axis=None, weights=None, returned=False, *, keepdims=False):
    if not _is_local(x, weights):
        return np.average(x, axis=axis, weights=weights, returned=returned, keepdims=keepdims)
    if weights is None:
        avg = mean(x, axis=axis, keepdims=keepdims)
        return (avg, _np_ops.full_like(avg, _count_of(x, axis))) if returned else avg
    w = weights
    den = sum(_np_ops.broadcast_to(w, x.shape) if np.ndim(w) == x.ndim else w, axis=axis, keepdims=keepdims) \
        if axis is None or np.ndim(w) == x.ndim else sum(w)
    if np.ndim(w) != x.ndim and axis is not None:
        (ax,) = _axes(axis, x, "average")
        w = reshape(lift(w, x.mesh), (1,) * ax + (-1,) + (1,) * (x.ndim - ax - 1))
    avg = sum(x * w, axis=axis, keepdims=keepdims) / den
    return (avg, den) if returned else avg


def _count_of(x, axis):
    return x.size if axis is None else int(np.prod([x.shape[a] for a in _axes(axis, x, "average")]))


# -- comparisons and cleaning --------------------------------------------------------------------
@_implements(np.isclose)
def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    if not _is_local(a, b):
        return np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)
    close = abs(a - b) <= atol + rtol * abs(b)
    close = close | equal(a, b)
    return close | (isnan(a) & isnan(b)) if equal_nan else close


@_implements(np.allclose)
def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    if not _is_local(a, b):
        return np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)
    return all(isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan))


@_implements(np.array_equal)
def array_equal(a1, a2, equal_nan=False):
    if not _is_local(a1, a2):
        return np.array_equal(a1, a2, equal_nan=equal_nan)
    if np.shape(a1) != np.shape(a2) if not (_local(a1) and _local(a2)) else a1.shape != a2.shape:
        return False
    eq = equal(a1, a2)
    return all(eq | (isnan(a1) & isnan(a2)) if equal_nan else eq)


@_implements(np.array_equiv)
def array_equiv(a1, a2):
    if not _is_local(a1, a2):
        return np.array_equiv(a1, a2)
    return all(equal(a1, a2))


@_implements(np.nan_to_num)
def nan_to_num(x, copy=True, nan=0.0, posinf=None, neginf=None):
    if not _local(x):
        return np.nan_to_num(x, copy=copy, nan=nan, posinf=posinf, neginf=neginf)
    if x.dtype.kind not in "f" and x.dtype != _dt.bfloat16:
        return x
    info = np.finfo(x.dtype)
    x = where(isnan(x), nan, x)
    x = where(x == np.inf, float(info.max) if posinf is None else posinf, x)
    return where(x == -np.inf, float(info.min) if neginf is None else neginf, x)


@_implements(np.isposinf)
def isposinf(x):
    return x == np.inf if _local(x) else np.isposinf(x)


@_implements(np.isneginf)
def isneginf(x):
    return x == -np.inf if _local(x) else np.isneginf(x)


@_implements(np.real)
def real(x):
    return x if _local(x) else np.real(x)


@_implements(np.imag)
def imag(x):
    return _np_ops.zeros_like(x) if _local(x) else np.imag(x)


@_implements(np.isreal)
def isreal(x):
    return _np_ops.ones_like(x, dtype=bool) if _local(x) else np.isreal(x)


@_implements(np.iscomplex)
def iscomplex(x):
    return _np_ops.zeros_like(x, dtype=bool) if _local(x) else np.iscomplex(x)


@_implements(np.copy)
def copy(x, order="K", subok=False):
    return x if _local(x) else np.copy(x, order=order, subok=subok)


@_implements(np.sinc)
def sinc(x):
    if not _local(x):
        return np.sinc(x)
    x = _np_ops._inexact(x)
    safe = where(x == 0, 1.0, x)
    return where(x == 0, 1.0, np.sin(np.pi * safe) / (np.pi * safe))


@_implements(np.divmod)
def divmod(x, y):  # noqa: A001
    return (np.floor_divide(x, y), np.mod(x, y))


@_implements(np.select)
def select(condlist, choicelist, default=0):
    if not _is_local(*condlist, *choicelist, default):
        return np.select(condlist, choicelist, default)
    out = default
    for c, v in zip(reversed(list(condlist)), reversed(list(choicelist))):
        out = where(c, v, out)
    return out


# -- contractions written with einsum -------------------------------------------------------------
@_implements(np.vecdot)
def vecdot(x1, x2, /, *, axis=-1, precision=None, preferred_element_type=None):
    if not _is_local(x1, x2) and not _np_ops._has_global((x1, x2)):
        return _np_ops._on_mesh(_np_ops._host_result(np.vecdot(x1, x2, axis=axis), preferred_element_type, (x1, x2)))
    return sum(multiply(x1, x2), axis=axis)


@_implements(np.matvec)
def matvec(x1, x2, /):
    if not _is_local(x1, x2) and not _np_ops._has_global((x1, x2)):
        return _np_ops._on_mesh(_np_ops._host_result(np.matvec(x1, x2), None, (x1, x2)))
    return einsum("...ij,...j->...i", x1, x2)


@_implements(np.vecmat)
def vecmat(x1, x2, /):
    if not _is_local(x1, x2) and not _np_ops._has_global((x1, x2)):
        return _np_ops._on_mesh(_np_ops._host_result(np.vecmat(x1, x2), None, (x1, x2)))
    return einsum("...i,...ij->...j", x1, x2)


@_implements(np.tensordot)
def tensordot(a, b, axes=2, *, precision=None, preferred_element_type=None, out_sharding=None):
    """``jnp.tensordot``; on global arrays JAX's dot_general sharding rule and the planner."""
    ra, rb = _np_ops.ndim(a), _np_ops.ndim(b)
    if isinstance(axes, (int, np.integer)):
        ax_a, ax_b = list(range(ra - axes, ra)), list(range(int(axes)))
    else:
        ax_a, ax_b = ([axes[0]] if np.ndim(axes[0]) == 0 else list(axes[0]),
                      [axes[1]] if np.ndim(axes[1]) == 0 else list(axes[1]))
    ax_a, ax_b = [a_ % ra for a_ in ax_a], [b_ % rb for b_ in ax_b]
    letters = "abcdefghijklmnopqrstuvwxyz"
    ta = list(letters[:ra])
    tb = list(letters[ra:ra + rb])
    for i, j in zip(ax_a, ax_b):
        tb[j] = ta[i]
    out = [c for i, c in enumerate(ta) if i not in ax_a] + [c for j, c in enumerate(tb) if j not in ax_b]
    return einsum(f"{''.join(ta)},{''.join(tb)}->{''.join(out)}", a, b, out_sharding=out_sharding,
                  preferred_element_type=preferred_element_type)


@_implements(np.kron)
def kron(a, b):
    if not _is_local(a, b):
        return np.kron(a, b)
    mesh = mesh_of((a, b))
    a, b = lift(a, mesh), lift(b, mesh)
    r = builtins.max(a.ndim, b.ndim)
    a, b = reshape(a, (1,) * (r - a.ndim) + a.shape), reshape(b, (1,) * (r - b.ndim) + b.shape)
    la, lb = "abcdefgh"[:r], "ijklmnop"[:r]
    out = einsum(f"{la},{lb}->{''.join(x + y for x, y in zip(la, lb))}", a, b)
    return reshape(out, tuple(p * q for p, q in zip(a.shape, b.shape)))


# -- dtype utilities: JAX's rules -----------------------------------------------------------------
def result_type(*args):
    """``jax.numpy.result_type`` (see shardlab.dtypes)."""
    return _dt.result_type(*args)


def promote_types(a, b):
    """``jax.numpy.promote_types`` (see shardlab.dtypes)."""
    return _dt.promote_types(a, b)


__all__ = [n for n in list(globals()) if not n.startswith("_") and n not in (
    "annotations", "builtins", "functools", "np", "HANDLED", "LocalArray", "lift", "mesh_of", "ew",
    "FALLBACK", "bind")]
