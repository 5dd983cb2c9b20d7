"""``shardlab.numpy``: the jax.numpy subset sharded programs use (import as ``jnp``).

Each function takes numpy arrays, scalars or LocalArrays (per-device values inside
shard_map); axes refer to the LOCAL shape. matmul / einsum / dot on float32 and bfloat16 run
on shardlab's GEMM and are recorded in the ledger as compute events.

Example:
    >>> import shardlab.numpy as jnp
    >>> jnp.einsum("ij,jk->ik", jnp.ones((2, 3)), jnp.ones((3, 4))).shape
    (2, 4)
"""

from __future__ import annotations

import builtins
import math
import string

import numpy as np

from . import _core
from .dtypes import bfloat16, float32, float64, int8, int32  # noqa: F401  (jnp.float32, ...)
from .local_array import HANDLED, LocalArray, aligned, lift, local_axes, mesh_of

bool_ = np.bool_
ndarray = np.ndarray

# Elementwise functions are numpy's ufuncs: they dispatch on LocalArray themselves.
(abs, absolute, add, subtract, multiply, divide, true_divide, negative, exp, exp2, expm1, log,
 log1p, log2, sqrt, square, tanh, sin, cos, tan, arctan, sinh, cosh, maximum, minimum, power,
 sign, floor, ceil, round_, equal, not_equal, less, less_equal, greater, greater_equal,
 logical_and, logical_or, logical_not, isnan, isfinite, reciprocal, floor_divide, mod,
 rsqrt_) = (np.abs, np.absolute, np.add, np.subtract, np.multiply, np.divide, np.true_divide,
            np.negative, np.exp, np.exp2, np.expm1, np.log, np.log1p, np.log2, np.sqrt, np.square,
            np.tanh, np.sin, np.cos, np.tan, np.arctan, np.sinh, np.cosh, np.maximum, np.minimum,
            np.power, np.sign, np.floor, np.ceil, np.round, np.equal, np.not_equal, np.less,
            np.less_equal, np.greater, np.greater_equal, np.logical_and, np.logical_or,
            np.logical_not, np.isnan, np.isfinite, np.reciprocal, np.floor_divide, np.mod, None)
del rsqrt_
pi, inf, nan, newaxis = np.pi, np.inf, np.nan, np.newaxis


def _implements(*np_funcs):
    def register(fn):
        for f in np_funcs:
            HANDLED[f] = fn
        return fn

    return register


def _is_local(*values) -> bool:
    return builtins.any(isinstance(v, LocalArray) for v in values)


# -- creation (always invariant constants) -------------------------------------------------
array, asarray, zeros, ones, full, empty, arange, linspace, eye = (
    np.array, np.asarray, np.zeros, np.ones, np.full, np.zeros, np.arange, np.linspace, np.eye)


@_implements(np.zeros_like)
def zeros_like(x, dtype=None):
    if isinstance(x, LocalArray):
        return LocalArray(np.zeros_like(x.storage, dtype=dtype), x.mesh)
    return np.zeros_like(x, dtype=dtype)


@_implements(np.ones_like)
def ones_like(x, dtype=None):
    if isinstance(x, LocalArray):
        return LocalArray(np.ones_like(x.storage, dtype=dtype), x.mesh)
    return np.ones_like(x, dtype=dtype)


@_implements(np.full_like)
def full_like(x, fill_value, dtype=None):
    if isinstance(x, LocalArray):
        return LocalArray(np.full_like(x.storage, fill_value, dtype=dtype), x.mesh)
    return np.full_like(x, fill_value, dtype=dtype)


@_implements(np.ndim)
def ndim(x) -> int:
    """Rank (the LOCAL rank of a per-device value)."""
    return x.ndim if isinstance(x, LocalArray) else np.ndim(x)


@_implements(np.shape)
def shape(x) -> tuple:
    """Shape (the LOCAL shape of a per-device value)."""
    return x.shape if isinstance(x, LocalArray) else np.shape(x)


# -- reductions ----------------------------------------------------------------------------
def _reduction(np_fn):
    def fn(x, axis=None, dtype=None, keepdims=False, **kw):
        if not isinstance(x, LocalArray):
            extra = {"dtype": dtype} if dtype is not None else {}
            return np_fn(x, axis=axis, keepdims=keepdims, **extra, **kw)
        extra = {"dtype": dtype} if dtype is not None else {}
        return LocalArray(np_fn(x.storage, axis=local_axes(axis, x), keepdims=keepdims, **extra, **kw),
                          x.mesh)

    fn.__name__ = np_fn.__name__
    fn.__doc__ = f"``numpy.{np_fn.__name__}`` over the local axes."
    HANDLED[np_fn] = fn
    return fn


sum = _reduction(np.sum)  # noqa: A001
mean = _reduction(np.mean)
prod = _reduction(np.prod)
var = _reduction(np.var)
std = _reduction(np.std)


def _reduction_nodtype(np_fn):
    def fn(x, axis=None, keepdims=False):
        if not isinstance(x, LocalArray):
            return np_fn(x, axis=axis, keepdims=keepdims)
        return LocalArray(np_fn(x.storage, axis=local_axes(axis, x), keepdims=keepdims), x.mesh)

    fn.__name__ = np_fn.__name__
    HANDLED[np_fn] = fn
    return fn


max = _reduction_nodtype(np.max)  # noqa: A001
min = _reduction_nodtype(np.min)  # noqa: A001
amax, amin = max, min
any = _reduction_nodtype(np.any)  # noqa: A001
all = _reduction_nodtype(np.all)  # noqa: A001


@_implements(np.argmax)
def argmax(x, axis=None, keepdims=False):
    if not isinstance(x, LocalArray):
        return np.argmax(x, axis=axis, keepdims=keepdims)
    if axis is None:
        x = reshape(x, (-1,))
        axis = 0
    return LocalArray(np.argmax(x.storage, axis=local_axes(axis, x), keepdims=keepdims).astype(np.int32),
                      x.mesh)


@_implements(np.argmin)
def argmin(x, axis=None, keepdims=False):
    return argmax(negative(x), axis=axis, keepdims=keepdims)


# -- shape ---------------------------------------------------------------------------------
@_implements(np.reshape)
def reshape(x, shape, order="C"):
    if not isinstance(x, LocalArray):
        return np.reshape(x, shape, order=order)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    k = x.mesh.ndim
    return LocalArray(x.storage.reshape(x.storage.shape[:k] + shape, order=order), x.mesh)


@_implements(np.transpose)
def transpose(x, axes=None):
    if not isinstance(x, LocalArray):
        return np.transpose(x, axes)
    k, r = x.mesh.ndim, x.ndim
    axes = tuple(range(r))[::-1] if axes is None else tuple(a % r if r else a for a in axes)
    return LocalArray(x.storage.transpose(tuple(range(k)) + tuple(k + a for a in axes)), x.mesh)


@_implements(np.swapaxes)
def swapaxes(x, a, b):
    if not isinstance(x, LocalArray):
        return np.swapaxes(x, a, b)
    return LocalArray(np.swapaxes(x.storage, local_axes(a, x), local_axes(b, x)), x.mesh)


@_implements(np.moveaxis)
def moveaxis(x, source, destination):
    if not isinstance(x, LocalArray):
        return np.moveaxis(x, source, destination)
    return LocalArray(np.moveaxis(x.storage, local_axes(source, x), local_axes(destination, x)), x.mesh)


@_implements(np.expand_dims)
def expand_dims(x, axis):
    if not isinstance(x, LocalArray):
        return np.expand_dims(x, axis)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    r = x.ndim + len(axes)
    k = x.mesh.ndim
    return LocalArray(np.expand_dims(x.storage, tuple(k + (a % r) for a in axes)), x.mesh)


@_implements(np.squeeze)
def squeeze(x, axis=None):
    if not isinstance(x, LocalArray):
        return np.squeeze(x, axis)
    if axis is None:
        axis = tuple(i for i, s in enumerate(x.shape) if s == 1)
    return LocalArray(np.squeeze(x.storage, local_axes(axis, x)), x.mesh)


@_implements(np.broadcast_to)
def broadcast_to(x, shape):
    if not isinstance(x, LocalArray):
        return np.broadcast_to(x, shape)
    k = x.mesh.ndim
    s = aligned([x, np.empty(shape, dtype=np.bool_)], x.mesh)[0]
    return LocalArray(np.broadcast_to(s, s.shape[:k] + tuple(shape)), x.mesh)


@_implements(np.concatenate)
def concatenate(arrays, axis=0):
    arrays = list(arrays)
    if not _is_local(*arrays):
        return np.concatenate(arrays, axis=axis)
    mesh = mesh_of(arrays)
    storages = aligned(arrays, mesh)
    k = mesh.ndim
    shape = np.broadcast_shapes(*(s.shape[:k] for s in storages))
    storages = [np.broadcast_to(s, shape + s.shape[k:]) for s in storages]
    ref = LocalArray(storages[0], mesh)
    return LocalArray(np.concatenate(storages, axis=local_axes(axis, ref)), mesh)


@_implements(np.stack)
def stack(arrays, axis=0):
    arrays = list(arrays)
    if not _is_local(*arrays):
        return np.stack(arrays, axis=axis)
    return concatenate([expand_dims(lift(a, mesh_of(arrays)), axis) for a in arrays], axis=axis)


@_implements(np.split)
def split(x, indices_or_sections, axis=0):
    if not isinstance(x, LocalArray):
        return np.split(x, indices_or_sections, axis=axis)
    return [LocalArray(p, x.mesh) for p in np.split(x.storage, indices_or_sections, axis=local_axes(axis, x))]


@_implements(np.tril)
def tril(x, k=0):
    return LocalArray(np.tril(x.storage, k), x.mesh) if isinstance(x, LocalArray) else np.tril(x, k)


@_implements(np.triu)
def triu(x, k=0):
    return LocalArray(np.triu(x.storage, k), x.mesh) if isinstance(x, LocalArray) else np.triu(x, k)


@_implements(np.where)
def where(condition, x, y):
    if not _is_local(condition, x, y):
        return np.where(condition, x, y)
    mesh = mesh_of((condition, x, y))
    c, a, b = aligned([condition, x, y], mesh)
    dt = np.result_type(a, b)
    shape = np.broadcast_shapes(np.shape(c), np.shape(a), np.shape(b))
    if dt in _SELECT_DTYPES and math.prod(shape) >= 4096:
        # Branchless C++ select: numpy's where branches per element (5x slower on random masks).
        views = [np.broadcast_to(np.asarray(v, dtype=t), shape) for v, t in ((c, np.bool_), (a, dt), (b, dt))]
        return LocalArray(_core.select(*views), mesh)
    return LocalArray(np.where(c, a, b), mesh)


_SELECT_DTYPES = (float32, float64, bfloat16, int32, int8)


@_implements(np.clip)
def clip(x, a_min=None, a_max=None):
    if not _is_local(x, a_min, a_max):
        return np.clip(x, a_min, a_max)
    mesh = mesh_of((x, a_min, a_max))
    args = aligned([v for v in (x, a_min, a_max)], mesh) if a_min is not None and a_max is not None else None
    if args is None:
        return maximum(x, a_min) if a_max is None else minimum(x, a_max)
    return LocalArray(np.clip(*args), mesh)


@_implements(np.take_along_axis)
def take_along_axis(x, indices, axis):
    if not _is_local(x, indices):
        return np.take_along_axis(x, indices, axis)
    mesh = mesh_of((x, indices))
    a, i = aligned([x, indices], mesh)
    k = mesh.ndim
    shape = np.broadcast_shapes(a.shape[:k], i.shape[:k])
    a = np.broadcast_to(a, shape + a.shape[k:])
    i = np.broadcast_to(i, shape + i.shape[k:])
    return LocalArray(np.take_along_axis(a, i, axis=local_axes(axis, LocalArray(a, mesh))), mesh)


# -- contractions --------------------------------------------------------------------------
def _gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Batched a @ b on storages (numpy batch broadcasting) with shardlab's GEMM when it can."""
    dt = np.result_type(a.dtype, b.dtype)
    if dt not in (float32, bfloat16):
        return np.matmul(a, b)
    from .kernels import gemm

    a, b = a.astype(dt, copy=False), b.astype(dt, copy=False)
    if a.ndim > 2 and b.ndim == a.ndim and math.prod(b.shape[:-2]) == 1:
        # b is the same for every batch (e.g. a replicated weight): fold a's batch dims into M,
        # one large GEMM instead of many thin ones.
        out = gemm(a.reshape(-1, a.shape[-1]), b.reshape(b.shape[-2:]))
        return out.reshape(a.shape[:-1] + (b.shape[-1],))
    return gemm(a, b)


def _record_compute(op: str, mesh, flops: float, nbytes: float, dtype) -> None:
    from .ledger import record

    e = _core.Event()
    e.op = op
    e.axes = []
    e.group_size = 1
    e.num_groups = mesh.size
    e.dtype = str(np.dtype(dtype)) if np.dtype(dtype) in (float32, float64, bfloat16, int32, int8) else "float32"
    e.flops = float(flops)
    e.hbm_bytes = float(nbytes)
    e.bytes_sent = 0.0
    e.algorithm = "local"
    record(e, mesh)


@_implements(np.matmul)
def matmul(a, b, *, preferred_element_type=None):
    """``a @ b`` with numpy's rules (1-D operands, broadcast batch dims) on local shapes."""
    if not _is_local(a, b):
        out = _gemm(np.asarray(a), np.asarray(b)) if np.ndim(a) >= 2 and np.ndim(b) >= 2 else np.matmul(a, b)
        return out if preferred_element_type is None else out.astype(preferred_element_type)
    mesh = mesh_of((a, b))
    A, B = lift(a, mesh), lift(b, mesh)
    if A.ndim == 0 or B.ndim == 0:
        raise ValueError(f"[matmul] operands must have rank >= 1, got local shapes {A.shape} and {B.shape}")
    if A.shape[-1] != B.shape[-2 if B.ndim > 1 else 0]:
        raise ValueError(f"[matmul] local shapes {A.shape} and {B.shape}: contracting dims "
                         f"{A.shape[-1]} and {B.shape[-2 if B.ndim > 1 else 0]} differ")
    va, vb = A.ndim == 1, B.ndim == 1
    A2 = expand_dims(A, 0) if va else A
    B2 = expand_dims(B, -1) if vb else B
    sa, sb = aligned([A2, B2], mesh)
    out = _gemm(sa, sb)
    if va:
        out = out.squeeze(-2)
    if vb:
        out = out.squeeze(-1)
    if preferred_element_type is not None:
        out = out.astype(preferred_element_type)
    m, kdim = A2.shape[-2], A2.shape[-1]
    n = B2.shape[-1]
    batch = math.prod(np.broadcast_shapes(A2.shape[:-2], B2.shape[:-2]))
    _record_compute("matmul", mesh, 2.0 * batch * m * n * kdim,
                    (A.size + B.size) * A.dtype.itemsize + math.prod(out.shape[mesh.ndim:]) * out.dtype.itemsize,
                    out.dtype)
    return LocalArray(out, mesh)


@_implements(np.dot)
def dot(a, b, *, preferred_element_type=None):
    """``numpy.dot`` for rank <= 2 operands (the cases sharded programs use)."""
    if np.ndim(a) > 2 or np.ndim(b) > 2 or (isinstance(a, LocalArray) and a.ndim > 2) or (
            isinstance(b, LocalArray) and b.ndim > 2):
        raise NotImplementedError("[dot] operands of rank > 2: use einsum or matmul")
    if (isinstance(a, LocalArray) and a.ndim == 0) or (isinstance(b, LocalArray) and b.ndim == 0) \
            or np.ndim(a) == 0 and not isinstance(a, LocalArray) or np.ndim(b) == 0 and not isinstance(b, LocalArray):
        return multiply(a, b)
    return matmul(a, b, preferred_element_type=preferred_element_type)


def _parse(subscripts: str, shapes: list) -> tuple[list[str], str]:
    """Explicit subscripts with '...' expanded and the implicit output made explicit."""
    sub = subscripts.replace(" ", "")
    ins, _, out = sub.partition("->")
    terms = ins.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"[einsum] {subscripts!r} names {len(terms)} operands but {len(shapes)} were given")
    used = set(c for c in sub if c.isalpha())
    pool = [c for c in string.ascii_letters if c not in used]
    ell_rank = 0
    for t, s in zip(terms, shapes):
        if "..." in t:
            ell_rank = builtins.max(ell_rank, len(s) - (len(t) - 3))
    ell = "".join(pool[:ell_rank])
    del pool[:ell_rank]
    expanded = []
    for t, s in zip(terms, shapes):
        if "..." in t:
            n = len(s) - (len(t) - 3)
            t = t.replace("...", ell[ell_rank - n:] if n else "")
        if len(t) != len(s):
            raise ValueError(f"[einsum] term {t!r} has {len(t)} letters for an operand of rank {len(s)}")
        expanded.append(t)
    if "->" in sub:
        out = out.replace("...", ell)
    else:
        counts = {}
        for t in expanded:
            for c in t:
                counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c in counts if counts[c] == 1 and c not in ell))
    return expanded, out, pool




@_implements(np.einsum)
def einsum(subscripts, *operands, optimize=True, preferred_element_type=None):
    """``numpy.einsum`` on local shapes; two-operand contractions run as one batched GEMM."""
    if not _is_local(*operands):
        arrays = [np.asarray(o) for o in operands]
        terms, out_term, _ = _parse(subscripts, [a.shape for a in arrays])
        res = _einsum_arrays(terms, out_term, arrays)
        return res if preferred_element_type is None else res.astype(preferred_element_type)
    mesh = mesh_of(operands)
    ops = [lift(o, mesh) for o in operands]
    terms, out_term, pool = _parse(subscripts, [o.shape for o in ops])
    k = mesh.ndim
    mesh_letters = pool[:k]
    arrays, full_terms, varying = [], [], [False] * k
    sizes = {}
    for o, t in zip(ops, terms):
        keep = [j for j in range(k) if o.storage.shape[j] != 1]
        for j in keep:
            varying[j] = True
        arrays.append(o.storage.reshape(tuple(o.storage.shape[j] for j in keep) + o.shape))
        full_terms.append("".join(mesh_letters[j] for j in keep) + t)
        for c, s in zip(t, o.shape):
            if sizes.setdefault(c, s) != s:
                raise ValueError(f"[einsum] letter {c!r} has sizes {sizes[c]} and {s} in {subscripts!r}")
    out_mesh = "".join(mesh_letters[j] for j in range(k) if varying[j])
    res = _einsum_arrays(full_terms, out_mesh + out_term, arrays)
    res = res.reshape(tuple(mesh.axis_sizes[j] if varying[j] else 1 for j in range(k)) + res.shape[len(out_mesh):])
    if preferred_element_type is not None:
        res = res.astype(preferred_element_type)
    flops = 2.0 * math.prod(sizes.values())
    nbytes = builtins.sum(o.size * o.dtype.itemsize for o in ops) + math.prod(res.shape[k:]) * res.dtype.itemsize
    _record_compute("einsum", mesh, flops, nbytes, res.dtype)
    return LocalArray(res, mesh)




def _einsum_arrays(terms: list[str], out: str, arrays: list) -> np.ndarray:
    """einsum over plain arrays; a two-operand contraction without repeated letters is lowered
    to one batched GEMM (transpose, reshape, gemm, reshape, transpose)."""
    if len(arrays) != 2 or builtins.any(len(set(t)) != len(t) for t in terms) or len(set(out)) != len(out):
        return np.einsum(",".join(terms) + "->" + out, *arrays, optimize=True)
    (ta, tb), (a, b) = terms, arrays
    # letters in one operand only and not in the output are summed away first
    only_a = [c for c in ta if c not in tb and c not in out]
    only_b = [c for c in tb if c not in ta and c not in out]
    if only_a:
        a = a.sum(axis=tuple(ta.index(c) for c in only_a))
        ta = "".join(c for c in ta if c not in only_a)
    if only_b:
        b = b.sum(axis=tuple(tb.index(c) for c in only_b))
        tb = "".join(c for c in tb if c not in only_b)
    batch = [c for c in ta if c in tb and c in out]
    contract = [c for c in ta if c in tb and c not in out]
    fa = [c for c in ta if c not in tb]
    fb = [c for c in tb if c not in ta]
    size = {c: s for t, x in ((ta, a), (tb, b)) for c, s in zip(t, x.shape)}
    nb = math.prod(size[c] for c in batch)
    m = math.prod(size[c] for c in fa)
    n = math.prod(size[c] for c in fb)
    kk = math.prod(size[c] for c in contract)
    a3 = a.transpose([ta.index(c) for c in batch + fa + contract]).reshape(nb, m, kk)
    b3 = b.transpose([tb.index(c) for c in batch + contract + fb]).reshape(nb, kk, n)
    c3 = _gemm(a3, b3)
    order = batch + fa + fb
    c = c3.reshape(tuple(size[x] for x in order))
    return c.transpose([order.index(x) for x in out])


