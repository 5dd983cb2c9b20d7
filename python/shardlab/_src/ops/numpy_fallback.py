"""The per-device fallback for the jax.numpy functions without a composition of their own,
the functions with no per-device operand, the refusals, and :func:`coverage`, the table
``docs/numpy_coverage.md`` is generated from.

The fallback runs numpy's own function on the local block. Where the function allows it,
it runs once on the whole mesh-factorized storage (elementwise functions, and functions of
one array along an ``axis``: the axis is passed as a negative index, so the mesh dims ride
along as batch dims); otherwise once per distinct device block. It is not differentiable.

Example:
    >>> import numpy as np, shardlab as sl
    >>> import shardlab.numpy as jnp
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((2,), ("x",))
    >>> f = sl.shard_map(lambda v: jnp.median(v, axis=1), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    >>> np.asarray(f(np.array([[3.0, 1.0, 2.0], [0.0, -1.0, 5.0]], np.float32))).tolist()
    [2.0, 0.0]
"""

from __future__ import annotations

import builtins
import inspect

import numpy as np

from ..arrays.local_array import HANDLED, LocalArray, lift, mesh_of
from ..arrays.sharded_array import ShardedArray
from ..arrays.storage import refused
from ..core.context import CTX
from ..core import memory
from ..primitives import elementwise as ew
from ..primitives.fallback import FALLBACK
from ..primitives.primitive import bind
from ..core import dtypes as _dt
from .numpy import GLOBAL as _GLOBAL, broadcast_to as _broadcast_to, reshape, ufunc as _ufunc
from .numpy.dispatch import _axes, _implements, _is_local, _on_mesh


def fallback(np_fn, mode: str = "device"):
    """``np_fn`` applied to each device's local block (not differentiable).

    Args:
        np_fn: the numpy function.
        mode: "elementwise" (one call on the whole storage), "axis" (one call with the
            local ``axis`` keyword as a negative index, when it is an int), or "device"
            (one call per distinct device block).
    """

    def fn(*args, **kwargs):
        if not _is_local(*args, *kwargs.values()):
            return np_fn(*args, **kwargs)
        if _is_local(*kwargs.values()):
            raise TypeError(f"[{np_fn.__name__}] per-device values as keyword arguments are not supported")
        mesh = mesh_of(args)
        ops = [lift(a, mesh) if isinstance(a, (LocalArray, np.ndarray)) else a for a in args]
        vectorised = mode == "elementwise"
        if mode == "axis" and isinstance(kwargs.get("axis"), (int, np.integer)):
            x = next(a for a in ops if isinstance(a, LocalArray))
            if builtins.sum(isinstance(a, LocalArray) for a in ops) == 1:
                (ax,) = _axes(kwargs["axis"], x, np_fn.__name__)
                kwargs = {**kwargs, "axis": ax - x.ndim}
                vectorised = True
        return bind(FALLBACK, ops, mesh, fn=np_fn, kwargs=tuple(sorted(kwargs.items())), vectorised=vectorised)

    fn.__name__ = np_fn.__name__
    fn.__doc__ = f"``numpy.{np_fn.__name__}`` on each device's local block (a per-device fallback)."
    return fn


_ELEMENTWISE_FALLBACK = ("round", "around", "i0", "angle", "modf", "frexp", "unwrap", "isin", "digitize",
                         "searchsorted", "interp", "polyval", "fix")
_AXIS_FALLBACK = ("cumprod", "nancumprod", "nancumsum", "cumulative_prod", "median", "nanmedian", "nanargmax",
                  "nanargmin", "nanstd", "nanvar", "partition", "argpartition", "gradient", "trapezoid",
                  "percentile", "nanpercentile", "quantile", "nanquantile", "apply_along_axis", "insert",
                  "delete", "resize", "repeat_interleave")
# Functions whose result depends on the values in shape: each device must get the same shape.
_SHAPE_DEPENDS = ("nonzero", "argwhere", "flatnonzero", "unique", "unique_all", "unique_counts",
                  "unique_inverse", "unique_values", "extract", "compress", "intersect1d", "setdiff1d",
                  "setxor1d", "union1d", "trim_zeros", "bincount", "histogram", "histogram2d", "histogramdd",
                  "histogram_bin_edges", "roots", "polyfit", "polyadd", "polysub", "polymul", "polydiv",
                  "polyder", "polyint", "poly", "ediff1d")
_DEVICE_FALLBACK = ("convolve", "correlate", "cross", "cov", "corrcoef", "pad", "diag", "diagflat", "lexsort",
                    "piecewise", "apply_over_axes", "vander", "choose", "block", "packbits", "unpackbits",
                    "put_along_axis", "tril_indices_from", "triu_indices_from", "diag_indices_from",
                    "ravel_multi_index", "unravel_index", "array_repr", "array_str", "resize",
                    "sort_complex")

UNSUPPORTED = {
    "load": "file I/O, not an array operation",
    "save": "file I/O, not an array operation",
    "savez": "file I/O, not an array operation",
    "fromfile": "file I/O, not an array operation",
    "frombuffer": "builds an array from host bytes; use np.frombuffer and pass the result in",
    "fromstring": "builds an array from a host string; use numpy and pass the result in",
    "fromiter": "builds an array from a Python iterator; use numpy and pass the result in",
    "from_dlpack": "shardlab values have no DLPack device buffers",
    "frompyfunc": "wraps a Python function per element; write it with jnp functions",
    "vectorize": "wraps a Python function per element; write it with jnp functions",
    "put": "mutates its argument in numpy; per-device values are immutable (use jnp.where)",
    "place": "mutates its argument in numpy; per-device values are immutable (use jnp.where)",
    "fill_diagonal": "mutates its argument in numpy; per-device values are immutable (use jnp.where)",
}

# Functions of shapes, dtypes and Python values (no per-device operand): numpy's own.
(bartlett, blackman, hamming, hanning, kaiser, broadcast_shapes, can_cast, diag_indices, einsum_path,
 fromfunction, geomspace, logspace, get_printoptions, printoptions, set_printoptions, indices, iscomplexobj,
 isrealobj, isscalar, issubdtype, isdtype, iterable, ix_, mask_indices, tril_indices, triu_indices) = (
    np.bartlett, np.blackman, np.hamming, np.hanning, np.kaiser, np.broadcast_shapes, np.can_cast,
    np.diag_indices, np.einsum_path, np.fromfunction, np.geomspace, np.logspace, np.get_printoptions,
    np.printoptions, np.set_printoptions, np.indices, np.iscomplexobj, np.isrealobj, np.isscalar,
    np.issubdtype, np.isdtype, np.iterable, np.ix_, np.mask_indices, np.tril_indices, np.triu_indices)


@_implements(np.meshgrid)
def meshgrid(*xi, indexing="xy", copy=True, sparse=False):
    if not _is_local(*xi):
        return np.meshgrid(*xi, indexing=indexing, copy=copy, sparse=sparse)
    mesh = mesh_of(xi)
    xs = [reshape(lift(v, mesh), (-1,)) for v in xi]
    n = len(xs)
    shape = [x.shape[0] for x in xs]
    if indexing == "xy" and n > 1:
        shape[0], shape[1] = shape[1], shape[0]
    out = []
    for i, x in enumerate(xs):
        d = (1 if i == 0 else 0 if i == 1 else i) if indexing == "xy" and n > 1 else i
        v = reshape(x, tuple(-1 if j == d else 1 for j in range(n)))
        out.append(v if sparse else _broadcast_to(v, tuple(shape)))
    return out


def _refuse(np_fn, reason):
    def fn(*args, **kwargs):
        if _is_local(*args, *kwargs.values()):
            raise TypeError(f"[{np_fn.__name__}] is not supported on per-device values: {reason}")
        return np_fn(*args, **kwargs)

    fn.__name__ = np_fn.__name__
    fn.__doc__ = f"``numpy.{np_fn.__name__}`` on numpy values; on per-device values it raises ({reason})."
    return fn


for _name, _why in UNSUPPORTED.items():
    globals()[_name] = _refuse(getattr(np, _name), _why)
    HANDLED[getattr(np, _name)] = globals()[_name]

for _name in _ELEMENTWISE_FALLBACK + _AXIS_FALLBACK + _SHAPE_DEPENDS + _DEVICE_FALLBACK:
    _np_fn = getattr(np, _name, None)
    if _np_fn is None or _name in globals():
        continue
    _mode = "elementwise" if _name in _ELEMENTWISE_FALLBACK else "axis" if _name in _AXIS_FALLBACK else "device"
    globals()[_name] = fallback(_np_fn, _mode)
    if not isinstance(_np_fn, np.ufunc):
        HANDLED[_np_fn] = globals()[_name]
round_ = globals()["round"]

_FALLBACKS = frozenset(n for n in _ELEMENTWISE_FALLBACK + _AXIS_FALLBACK + _SHAPE_DEPENDS + _DEVICE_FALLBACK
                       if hasattr(np, n))


def coverage(name: str) -> tuple:
    """(status, note) of the jax.numpy function `name` on per-device values: status is
    "fast" (primitives: runs on every backend; differentiable where the math is),
    "fallback" (numpy per device block, not differentiable) or "unsupported".

    Example:
        >>> from shardlab._src.ops.numpy_fallback import coverage
        >>> coverage("sort")[0], coverage("median")[0], coverage("save")[0]
        ('fast', 'fallback', 'unsupported')
    """
    if name in UNSUPPORTED:
        return "unsupported", UNSUPPORTED[name]
    if name in _FALLBACKS:
        mode = ("vectorised (elementwise)" if name in _ELEMENTWISE_FALLBACK else
                "vectorised over the mesh when `axis` is an int" if name in _AXIS_FALLBACK else "per device block")
        if name in _SHAPE_DEPENDS:
            mode += "; the result shape depends on values, so every device must get the same shape"
        return "fallback", mode
    fn = getattr(np, name, None)
    if name in ("matmul", "matvec", "vecdot", "vecmat"):
        return "fast", "contraction on shardlab's GEMM (einsum primitive), differentiable"
    if isinstance(fn, np.ufunc):
        if fn.nout > 1:
            return "fast", "composition of primitives"
        diff = fn.__name__ in ew._RULES or fn.__name__ in ew._ZERO_GRAD
        nodiff = fn.__name__ in ew._NO_GRAD
        return "fast", "elementwise primitive" + (", differentiable" if diff else
                                                   " (integer or boolean valued)" if nodiff else
                                                   ", not differentiable")
    if fn is not None and fn in HANDLED:
        return "fast", "composition of primitives"
    return "fast", "no per-device operand (numpy array, dtype or shape utility)"




__all__ = [n for n in list(globals()) if not n.startswith("_") and n not in (
    "annotations", "builtins", "np", "HANDLED", "LocalArray", "lift", "mesh_of", "ew", "FALLBACK", "bind",
    "reshape", "ShardedArray", "global_dispatch", "guard_namespace")]


# -- global arrays: a rule, the recorded fallback, or a refusal ---------------------------------------
# Public functions that take global ShardedArrays themselves (a sharded rule inside, or via GLOBAL).
_GLOBAL_AWARE = frozenset((
    "einsum", "dot", "matmul", "vdot", "inner", "outer", "tensordot", "sum", "prod", "max", "min", "amax",
    "amin", "any", "all", "mean", "var", "std", "reshape", "transpose", "concatenate", "concat", "zeros",
    "ones", "full", "empty", "zeros_like", "ones_like", "full_like", "empty_like", "array", "asarray",
    "arange", "linspace", "eye", "identity", "tri", "ndim", "shape", "size", "result_type", "promote_types",
))


# Per-element functions of one array: on global arrays they run on each block, keeping the sharding.
_ELEMENTWISE_KEEPS = frozenset(("round", "around", "round_", "fix", "i0", "angle", "isin", "digitize", "polyval",
                                "nan_to_num"))


def _global_in(args, kwargs) -> bool:
    for a in (*args, *kwargs.values()):
        if isinstance(a, ShardedArray):
            return True
        if isinstance(a, (list, tuple)) and builtins.any(isinstance(b, ShardedArray) for b in a):
            return True
    return False


def _captured(values) -> list:
    """`values` with each global array (also inside a list or tuple) made the per-device value
    a shard_map body sees when it closes over it (``lift``: the whole array, invariant)."""
    mesh = CTX.meshes[-1]

    def one(v):
        if isinstance(v, ShardedArray):
            return lift(v, mesh)
        if isinstance(v, (list, tuple)) and builtins.any(isinstance(b, ShardedArray) for b in v):
            return type(v)(lift(b, mesh) if isinstance(b, ShardedArray) else b for b in v)
        return v

    return [one(v) for v in values]


def global_dispatch(fn, name: str):
    """``fn`` (a public jax.numpy function) made safe on global ShardedArrays, and its host results
    in JAX's dtypes (:func:`_host_out`). On global arrays: a function with a
    sharded rule runs it; one registered by the planning layer in ``GLOBAL`` (by name or numpy
    function) runs that; a refused one raises naming the op and what to do; every other one
    runs through the recorded fallback (``planning.global_ops.global_fallback``: gathered,
    computed once, an event labelled ``fallback:<name>``). Never a silent numpy result.

    Example:
        >>> import numpy as np, shardlab as sl, shardlab.numpy as jnp
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((2,), ("X",))
        >>> x = sl.device_put(np.array([3.0, 1.0, 2.0, 0.0], np.float32), sl.NamedSharding(mesh, P("X")))
        >>> with sl.Ledger() as led:
        ...     m = jnp.median(x)
        >>> float(np.asarray(m)), [e["label"] for e in led.events if e["op"] == "numpy_fallback"]
        (1.5, ['fallback:median'])
    """
    if isinstance(fn, (type, _ufunc)) or not callable(fn):
        return fn
    np_fn = getattr(np, name, None)
    aware = name in _GLOBAL_AWARE

    def wrapped(*args, **kwargs):
        try:
            return dispatch(*args, **kwargs)
        except (MemoryError, ValueError) as e:
            if memory.is_refusal(e):  # numpy would not make the result: say which function and how large
                _refused(name, fn, args, kwargs, e)
            raise

    def dispatch(*args, **kwargs):
        if not _global_in(args, kwargs):
            return _host_out(fn(*args, **kwargs))
        if CTX.meshes:  # inside a shard_map body a global array is a closed-over constant (replicated)
            return fn(*_captured(args), **dict(zip(kwargs, _captured(kwargs.values()))))
        if aware:
            return fn(*args, **kwargs)
        impl = _GLOBAL.get(np_fn) if np_fn is not None else None
        impl = impl or _GLOBAL.get(name)
        if impl is not None:
            return impl(*args, **kwargs)
        if name in UNSUPPORTED:
            raise TypeError(f"[{name}] is not supported on global ShardedArrays: {UNSUPPORTED[name]}; "
                            f"use np.asarray(x) for the global value")
        return _GLOBAL["fallback"](fn, name, args, kwargs, elementwise=name in _ELEMENTWISE_KEEPS)

    wrapped.__name__ = getattr(fn, "__name__", name)
    wrapped.__qualname__ = wrapped.__name__
    wrapped.__doc__ = fn.__doc__
    wrapped.__wrapped__ = fn
    return wrapped


def _refused(name, fn, args, kwargs, cause):
    """The ``[name] needs N GiB`` MemoryError for a result numpy refused to make: its bytes from
    the function's ``shape`` and ``dtype`` arguments where it has them (zeros, full,
    broadcast_to, ...), else "more than numpy can address"."""
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):
        bound = {}
    shape = bound.get("shape")
    shapes = None
    if shape is not None:
        try:
            shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(d) for d in shape)
            dtype = bound.get("dtype") or getattr(args[0] if args else None, "dtype", None) or np.float32
            shapes = [(shape, np.dtype(dtype))]
        except (TypeError, ValueError):
            shapes = None
    hint = ("shard it over a mesh (device_put with a NamedSharding) so each device holds a part, or use "
            "eval_shape for shapes without data")
    if shapes is None:
        memory.refused(name, None, hint, cause)
    refused(name, shapes, hint, cause)


_WIDE = {np.dtype(np.float64): np.dtype(np.float32), np.dtype(np.int64): np.dtype(np.int32),
         np.dtype(np.uint64): np.dtype(np.uint32)}


def _host_out(out):
    """A host result in JAX's dtypes (x64 off: numpy's float64 / int64 results become float32 /
    int32), replicated on the mesh under ``set_mesh``; anything that is not an array unchanged."""
    if isinstance(out, (np.ndarray, np.generic)):
        if out.dtype in _WIDE and not _dt.x64_enabled():
            out = np.asarray(out).astype(_WIDE[out.dtype])
        return _on_mesh(out)
    if type(out) in (tuple, list):
        return type(out)(_host_out(o) for o in out)
    return out


def guard_namespace(namespace: dict) -> None:
    """Wraps every public function of ``namespace`` (shardlab.numpy's) with :func:`global_dispatch`."""
    for n, v in list(namespace.items()):
        if n.startswith("_") or not callable(v) or isinstance(v, type):
            continue
        mod = getattr(v, "__module__", "") or ""
        if not (mod.startswith("shardlab") or mod.startswith("numpy")):
            continue
        namespace[n] = global_dispatch(v, n)
