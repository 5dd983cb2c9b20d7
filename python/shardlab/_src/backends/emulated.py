"""The emulated backend: every primitive on real mesh-factorized storage, with the C++ core
for collectives, GEMM and flash attention and numpy for the rest.

An implementation takes storages (numpy arrays, or Python scalars where a primitive allows
constants) and returns the list of output storages. Work on an invariant value is done once:
mesh dims of size 1 broadcast like any other dim.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

import shardlab._core as _core

from ..core import memory
from ..core.dtypes import bfloat16, default_int_dtype, float32, float64, int8, int32
from ..core.einsum_spec import free_letters
from ..kernels.attention import run_backward, run_forward
from ..kernels.einsum import einsum_arrays
from ..kernels.native import CORE_DTYPES, as_bits, narrow, wide
from ..primitives import attention as att
from ..primitives import broadcasting as bc
from ..primitives import collectives as col
from ..primitives import contractions as con
from ..primitives import elementwise as ew
from ..primitives import reductions as red
from ..primitives import structural as st
from ..primitives.fallback import FALLBACK, mesh_dims
from ..primitives.shapes import align

try:  # scipy is optional: its erf is vectorised; math.erf per element otherwise
    from scipy.special import erf as _erf
except ImportError:  # pragma: no cover - exercised only without scipy
    _erf = np.vectorize(math.erf, otypes=[np.float64])

# JAX computes log(0), 1/0 and overflow quietly (inf, nan); numpy would warn from this module's
# ufunc calls. A filter costs nothing until a warning happens, unlike np.errstate per call.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"shardlab\._src\.backends\.emulated")

_SELECT_DTYPES = (float32, float64, bfloat16, int32, int8)


def _impl(prim):
    def register(fn):
        prim.impl["emulated"] = fn
        return fn

    return register


def _local(k, axes):
    return tuple(k + a for a in axes)


# -- elementwise -----------------------------------------------------------------------------
def _cast_operand(v, target):
    """An operand converted to the rule's operand dtype (Python scalars as numpy scalars of
    it, so ``bfloat16 * 2.0`` stays bfloat16 as in JAX)."""
    if target is None:
        return v
    if isinstance(v, np.ndarray):
        return v if v.dtype == target else v.astype(target)
    if isinstance(v, np.generic):
        return v if v.dtype == target else v.astype(target)
    return target.type(v)


def _ufunc_impl(ufunc):
    if not isinstance(ufunc, np.ufunc):
        return lambda storages, mesh: [np.asarray(ufunc(*align(storages, mesh.ndim)))]

    def impl(storages, mesh):
        target, out_dtype = ew.dtype_rule(ufunc, storages)
        args = [_cast_operand(v, target) for v in align(storages, mesh.ndim)]
        out = np.asarray(ufunc(*args))  # floating-point warnings are silenced above, as JAX raises none
        return [out if out.dtype == out_dtype else out.astype(out_dtype)]

    return impl


for _name, _prim in ew.PRIMS.items():
    _prim.impl["emulated"] = _ufunc_impl(ew.UFUNC_OF[_name])


@_impl(ew.SELECT)
def _select(storages, mesh):
    c, a, b = align(storages, mesh.ndim)
    dt = ew.SELECT.shape_rule(storages, mesh)[0][1]
    a, b = _cast_operand(a, dt), _cast_operand(b, dt)
    shape = np.broadcast_shapes(np.shape(c), np.shape(a), np.shape(b))
    if dt in _SELECT_DTYPES and math.prod(shape) >= 4096:
        # Branchless C++ select: numpy's where branches per element (5x slower on random masks).
        views = [np.broadcast_to(np.asarray(v, dtype=t), shape) for v, t in ((c, np.bool_), (a, dt), (b, dt))]
        return [_core.select(*views)]
    return [np.asarray(np.where(c, a, b), dtype=dt)]


@_impl(ew.ERF)
def _erf_impl(storages, mesh):
    x = storages[0]
    dt = ew.ERF.shape_rule(storages, mesh)[0][1]
    return [np.asarray(_erf(x.astype(np.float64)), dtype=dt)]


@_impl(ew.CONVERT)
def _convert(storages, mesh, *, dtype):
    return [storages[0].astype(dtype)]


# -- reductions ------------------------------------------------------------------------------
def _reduction_impl(prim, ufunc, accumulate=False):
    """`ufunc.reduce` over the local axes (what np.sum / np.max call, without their wrappers)."""
    dtype_of = prim.shape_rule.dtype_of

    def impl(storages, mesh, *, axes, keepdims=False, **_):
        x = storages[0]
        dt = dtype_of(x.dtype)
        k = mesh.ndim
        axis = tuple(k + a for a in axes)
        if accumulate:
            out = np.asarray(ufunc.reduce(x, axis=axis, dtype=dt, keepdims=keepdims))
        else:
            out = np.asarray(ufunc.reduce(x, axis=axis, keepdims=keepdims))
        return [out if out.dtype == dt else out.astype(dt)]

    prim.impl["emulated"] = impl


_reduction_impl(bc.REDUCE_SUM, np.add, accumulate=True)
_reduction_impl(red.REDUCE_PROD, np.multiply, accumulate=True)
_reduction_impl(red.REDUCE_MAX, np.maximum)
_reduction_impl(red.REDUCE_MIN, np.minimum)
_reduction_impl(red.REDUCE_ANY, np.logical_or)
_reduction_impl(red.REDUCE_ALL, np.logical_and)


def _arg_impl(np_fn):
    def impl(storages, mesh, *, axes, keepdims=False):
        (axis,) = axes
        return [np_fn(storages[0], axis=mesh.ndim + axis, keepdims=keepdims).astype(default_int_dtype())]

    return impl


red.ARGMAX.impl["emulated"] = _arg_impl(np.argmax)
red.ARGMIN.impl["emulated"] = _arg_impl(np.argmin)


@_impl(red.CUMSUM)
def _cumsum(storages, mesh, *, axis, reverse=False):
    x = storages[0]
    ax = mesh.ndim + axis
    dt = red.cumsum_dtype(x.dtype)
    if reverse:
        return [np.flip(np.cumsum(np.flip(x, ax), axis=ax, dtype=dt), ax)]
    return [np.cumsum(x, axis=ax, dtype=dt)]


@_impl(bc.BROADCAST)
def _broadcast(storages, mesh, *, local_shape):
    k = mesh.ndim
    x = storages[0]
    r = len(local_shape)
    x = x.reshape(tuple(x.shape[:k]) + (1,) * (r - (x.ndim - k)) + tuple(x.shape[k:]))
    return [np.broadcast_to(x, tuple(x.shape[:k]) + tuple(local_shape))]


# -- structural ------------------------------------------------------------------------------
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


def _src(coords, shape, k):
    return tuple(c if d != 1 else 0 for c, d in zip(coords, shape[:k]))


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


# -- contractions ----------------------------------------------------------------------------
@_impl(con.EINSUM)
def _einsum(storages, mesh, *, terms, out, op_name="einsum", preferred_element_type=None):
    k = mesh.ndim
    mesh_letters = free_letters("".join(terms) + out, k)
    arrays, full_terms, varying = [], [], [False] * k
    for s, t in zip(storages, terms):
        keep = [j for j in range(k) if s.shape[j] != 1]
        for j in keep:
            varying[j] = True
        arrays.append(s.reshape(tuple(s.shape[j] for j in keep) + tuple(s.shape[k:])))
        full_terms.append("".join(mesh_letters[j] for j in keep) + t)
    out_mesh = "".join(mesh_letters[j] for j in range(k) if varying[j])
    res = einsum_arrays(full_terms, out_mesh + out, arrays)
    res = res.reshape(tuple(mesh.axis_sizes[j] if varying[j] else 1 for j in range(k)) + res.shape[len(out_mesh):])
    if preferred_element_type is not None:
        res = res.astype(preferred_element_type)
    return [res]


# -- attention -------------------------------------------------------------------------------
def _fold(storages, k):
    """Mesh dims broadcast to one shape and folded into the batch dim, so one kernel call
    serves every device's block."""
    dims = mesh_dims(storages, k)
    n = math.prod(dims)
    out = []
    for s in storages:
        s = np.broadcast_to(s, dims + tuple(s.shape[k:]))
        out.append(s.reshape((n * s.shape[k],) + tuple(s.shape[k + 1:])))
    return dims, out


@_impl(att.ATTENTION)
def _attention(storages, mesh, *, is_causal, scale, has_mask):
    k = mesh.ndim
    dims, (q, kk, v) = _fold(storages[:3], k)
    mask = None
    if has_mask:
        mask = _fold_mask(storages[3], dims, storages[0].shape[k], k)
    out, lse = run_forward("dot_product_attention", q, kk, v, is_causal, scale, mask)
    b = storages[0].shape[k]
    return [out.reshape(dims + (b,) + out.shape[1:]), lse.reshape(dims + (b,) + lse.shape[1:])]


def _fold_mask(m, dims, batch, k):
    m = np.broadcast_to(m, dims + tuple(m.shape[k:]))
    if m.shape[k] == 1 and batch != 1:
        m = np.broadcast_to(m, dims + (batch,) + tuple(m.shape[k + 1:]))
    return m.reshape((math.prod(dims) * m.shape[k],) + tuple(m.shape[k + 1:]))


@_impl(att.ATTENTION_BWD)
def _attention_bwd(storages, mesh, *, is_causal, scale, has_mask, recompute):
    k = mesh.ndim
    n = 4 if recompute else 6
    op = "dot_product_attention_vjp" if recompute else "dot_product_attention"
    dims, folded = _fold(storages[:n], k)
    mask = _fold_mask(storages[n], dims, storages[0].shape[k], k) if has_mask else None
    if recompute:
        q, kk, v, do = folded
        o, lse = run_forward(op, q, kk, v, is_causal, scale, mask)
    else:
        q, kk, v, o, lse, do = folded
    grads = run_backward(op, q, kk, v, o, lse, do, is_causal, scale, mask)
    b = storages[0].shape[k]
    return [g.reshape(dims + (b,) + g.shape[1:]) for g in grads]


# -- collectives -----------------------------------------------------------------------------
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


# -- fallback --------------------------------------------------------------------------------
def _fallback_name(fn) -> str:
    return getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", "numpy_fallback")


@_impl(FALLBACK)
def _fallback(storages, mesh, *, fn, kwargs, vectorised=False):
    k = mesh.ndim
    dims = mesh_dims(storages, k)
    kw = dict(kwargs)
    ((want, want_dtype),) = FALLBACK.shape_rule(storages, mesh, fn=fn, kwargs=kwargs)
    if vectorised:
        arrays = align(storages, k)
        out = np.asarray(fn(*arrays, **kw))
        if out.shape[k:] == tuple(want[k:]) and out.ndim == len(want):
            return [out.astype(want_dtype, copy=False)]
    blocks = {}
    results = None
    for coords in np.ndindex(*dims):
        args = [s[_src(coords, s.shape, k)] if hasattr(s, "shape") and np.ndim(s) >= k else s for s in storages]
        key = tuple(_src(coords, s.shape, k) if hasattr(s, "shape") else None for s in storages)
        r = blocks.get(key)
        if r is None:
            r = blocks[key] = np.asarray(fn(*args, **kw))
        if results is None:
            results = np.empty(dims + r.shape, want_dtype)
        elif r.shape != results.shape[k:]:
            raise ValueError(f"[{_fallback_name(fn)}] gives local shape {results.shape[k:]} on one device and "
                             f"{r.shape} on another; shardlab needs one local shape (as JAX does: pass a "
                             f"fixed size, e.g. jnp.nonzero(x, size=n) in JAX)")
        results[coords] = r
    return [results]
