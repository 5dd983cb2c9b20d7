"""``shardlab.numpy``: jax.numpy on per-device values (import as ``jnp``).

Each function takes numpy arrays, scalars or LocalArrays (per-device values inside
shard_map); axes and shapes are LOCAL. On LocalArrays every function is a composition of
primitives (``shardlab._src.primitives``), so it runs on any backend, is recorded in the
ledger (contractions and attention as compute events) and is differentiable. On plain numpy
arrays it is numpy itself (matmul / einsum on shardlab's GEMM).

Example:
    >>> import shardlab.numpy as jnp
    >>> jnp.einsum("ij,jk->ik", jnp.ones((2, 3)), jnp.ones((3, 4))).shape
    (2, 4)
"""

from __future__ import annotations

import builtins
import math

import numpy as np

from ..arrays.index_update import IndexOps, at_property
from ..arrays.local_array import HANDLED, UFUNC, LocalArray, lift, local_axes, mesh_of, register_method
from ..arrays.host_array import HOST_UFUNC, HostArray
from ..arrays.host_array import as_host as _as_host
from ..arrays.host_array import promote_weak as _promote_weak
from ..arrays.host_array import weak_result as _weak_result
from ..arrays.sharded_array import ShardedArray
from ..arrays.sharded_array import device_put as _device_put
from ..arrays.storage import AbstractStorage, is_abstract
from ..core import dtypes as _dt
from ..core.dtypes import bfloat16, float32, float64, int8, int32  # noqa: F401  (jnp.float32, ...)
from ..core.context import CTX as _CTX
from ..core.einsum_spec import parse
from ..core.mesh import UNIT_MESH as _UNIT_MESH
from ..core.mesh import get_mesh as _get_mesh
from ..core.sharding import NamedSharding as _NamedSharding
from ..core.sharding import PartitionSpec as _P
from ..kernels.einsum import einsum_arrays, gemm_batched
from ..primitives import broadcasting as bc
from ..primitives import contractions as con
from ..primitives import elementwise as ew
from ..primitives import reductions as red
from ..primitives import structural as st
from ..primitives.primitive import bind

bool_ = np.bool_
ndarray = np.ndarray
int16, int64, uint8, uint16, uint32, uint64, float16 = (np.int16, np.int64, np.uint8, np.uint16, np.uint32,
                                                       np.uint64, np.float16)
pi, e, inf, nan, newaxis = np.pi, np.e, np.inf, np.nan, np.newaxis

_PY_SCALARS = frozenset((int, float, complex, bool))


def _on_mesh(out, weak: bool = False):
    """A result computed from host data: inside shard_map an invariant per-device value (a
    LocalArray, as JAX's body sees a traced constant); under ``set_mesh`` a replicated
    ShardedArray on that mesh, as JAX gives ``NamedSharding(mesh, P())``; with no mesh a
    HostArray (JAX's Array on one device, a numpy subclass; `weak`: its weak_type)."""
    if not isinstance(out, (np.ndarray, np.generic)):
        return out
    if _CTX.meshes:  # inside shard_map: a per-device value, the same on every device (as JAX's)
        return lift(np.asarray(out), _CTX.meshes[-1])
    mesh = _get_mesh()
    if mesh is None:
        return out if type(out) is HostArray and (out._weak or not weak) else _as_host(out, weak=weak)
    if mesh.abstract:
        return out
    return _device_put(np.asarray(out), _NamedSharding(mesh, _P()))


def _has_global(args) -> bool:
    for a in args:
        if isinstance(a, ShardedArray):
            return True
    return False


def _host_operand(v, op: str):
    if isinstance(v, HostArray):  # plain numpy (a weak 0-d one as its Python scalar, promoting as one)
        return v.item() if v._weak and v.ndim == 0 else v.view(np.ndarray)
    if type(v) in _PY_SCALARS or isinstance(v, (np.ndarray, np.generic)):
        return v
    if isinstance(v, (list, tuple)):
        raise TypeError(f"[{op}] {op} requires ndarray or scalar arguments, got {type(v)} at position 0 "
                        f"(as jax.numpy); wrap it with jnp.asarray first")
    return np.asarray(v)


class ufunc:
    """A jax.numpy ufunc (``jnp.add``, ``jnp.sin``, ...): numpy's function with JAX's dtype rules.

    On global ShardedArrays it follows JAX's explicit-sharding rule (``planning/sharding_rules``);
    on per-device values (inside shard_map) it is a primitive; on host data it gives JAX's
    dtypes (float64 input -> float32, int64 -> int32, Python scalars weak), as a HostArray
    (JAX's Array on one device; a replicated ShardedArray under ``set_mesh``).

    Example:
        >>> import numpy as np, shardlab.numpy as jnp
        >>> jnp.sin(np.ones(2)).dtype, jnp.add(np.ones(2, np.int64), 1).dtype, jnp.add(np.uint8(1), 300)
        (dtype('float32'), dtype('int32'), Array(45, dtype=uint8))
    """

    def __init__(self, np_ufunc):
        self._np = np_ufunc
        self.__name__ = np_ufunc.__name__
        self.__qualname__ = np_ufunc.__name__
        self.nin, self.nout, self.nargs = np_ufunc.nin, np_ufunc.nout, np_ufunc.nargs
        self.identity = np_ufunc.identity
        self.__doc__ = f"``jax.numpy.{np_ufunc.__name__}``: numpy's ufunc with JAX's dtype and sharding rules."

    def __repr__(self):
        return f"<jnp.ufunc '{self.__name__}'>"

    def __call__(self, *args, out=None, **kwargs):
        if out is not None:
            raise TypeError(f"[{self.__name__}] out= is not supported: arrays are immutable, as in JAX")
        if "dtype" in kwargs:
            raise TypeError(f"[{self.__name__}] ufunc.__call__() got an unexpected keyword argument 'dtype' "
                            f"(as jax.numpy); convert the result with .astype(dtype)")
        dtype = None
        if _has_global(args):
            if _CTX.meshes:  # inside a shard_map body a global array is a closed-over constant (replicated)
                return self(*[lift(a, _CTX.meshes[-1]) if isinstance(a, ShardedArray) else a for a in args], **kwargs)
            return GLOBAL["elementwise"](self._np, args, {"dtype": dtype, **kwargs})
        if _is_local(*args):
            return self._np(*args, **({} if dtype is None else {"dtype": dtype}), **kwargs)
        res = _host_ufunc(self._np, args, dtype, kwargs)
        if isinstance(res, tuple):
            return tuple(_on_mesh(r) for r in res)
        return _on_mesh(res, _weak_result(args, res))

    def _host(self, method: str, a, *rest, **kw):
        fn = getattr(self._np, method)
        if isinstance(a, (LocalArray, ShardedArray)):
            raise TypeError(f"[{self.__name__}.{method}] is not supported on sharded or per-device values; "
                            f"use the jnp reduction (jnp.sum, jnp.max, ...) or jnp.{self.__name__} itself")
        a = _dt.canonicalize(np.asarray(a), f"{self.__name__}.{method}")
        rest = [_dt.canonicalize(np.asarray(r), f"{self.__name__}.{method}") if not _scalar(r) else r for r in rest]
        with np.errstate(all="ignore"):
            res = fn(a, *rest, **kw)
        return _on_mesh(_dt.canonicalize(np.asarray(res), f"{self.__name__}.{method}"))

    def reduce(self, a, axis=0, dtype=None, out=None, keepdims=False, initial=None, where=None):
        """``ufunc.reduce``: the matching jnp reduction on arrays shardlab holds, numpy's on host data."""
        fn = {"add": sum, "multiply": prod, "maximum": max, "minimum": min, "logical_and": all,
              "logical_or": any}.get(self.__name__)
        if isinstance(a, (LocalArray, ShardedArray)) and fn is not None and initial is None and where is None:
            return fn(a, axis=axis, keepdims=keepdims)
        kw = {k: v for k, v in (("dtype", dtype), ("initial", initial), ("where", where)) if v is not None}
        return self._host("reduce", a, axis=axis, keepdims=keepdims, **kw)

    def accumulate(self, a, axis=0, dtype=None, out=None):
        return self._host("accumulate", a, axis=axis, **({} if dtype is None else {"dtype": dtype}))

    def outer(self, a, b, /):
        if isinstance(a, (LocalArray, ShardedArray)) or isinstance(b, (LocalArray, ShardedArray)):
            a2 = expand_dims(a, tuple(range(ndim(a), ndim(a) + ndim(b)))) if ndim(b) else a
            return self(a2, b)
        return self._host("outer", a, b)

    def reduceat(self, a, indices, axis=0, dtype=None, out=None):
        return self._host("reduceat", a, indices, axis=axis)


def _host_ufunc(np_ufunc, args, dtype, kwargs):
    """``np_ufunc`` on host data with jax.numpy's dtype rules (the elementwise primitive on the
    single-device mesh: the same promotion as on sharded values)."""
    name = np_ufunc.__name__
    prim = ew.PRIMS.get(name)
    vals = [_host_operand(a, name) for a in _promote_weak(args)]
    if prim is None or kwargs:
        with np.errstate(all="ignore"):
            res = np_ufunc(*[a if _scalar(a) else _dt.canonicalize(np.asarray(a), name) for a in vals], **kwargs)
        res = tuple(_dt.canonicalize(np.asarray(r), name) for r in res) if isinstance(res, tuple) else \
            _dt.canonicalize(np.asarray(res), name)
    else:
        vals = [np.asarray(a) if isinstance(a, np.generic) else a for a in vals]
        target, _ = ew.dtype_rule(np_ufunc, vals)
        if target is not None and target.kind in "iu":  # a Python int that overflows wraps, as in JAX
            info = np.iinfo(target)
            vals = [np.array(a).astype(target) if type(a) is int and not info.min <= a <= info.max else a
                    for a in vals]
        res = bind(prim, vals, _UNIT_MESH).storage
    if dtype is not None:
        res = np.asarray(res).astype(_dt.canonicalize_dtype(dtype))
    return res


# Elementwise functions: jax.numpy ufuncs over numpy's (they dispatch on LocalArray themselves).
(abs, absolute, add, subtract, multiply, divide, true_divide, negative, positive, exp, exp2, expm1, log,
 log1p, log2, log10, sqrt, square, tanh, sin, cos, tan, arcsin, arccos, arctan, arctan2, sinh, cosh,
 arcsinh, maximum, minimum, fmax, fmin, power, sign, floor, ceil, rint, trunc, equal, not_equal, less,
 less_equal, greater, greater_equal, logical_and, logical_or, logical_xor, logical_not, isnan, isfinite,
 isinf, reciprocal, floor_divide, mod, remainder, hypot, logaddexp, copysign, signbit, bitwise_and,
 bitwise_or, bitwise_xor, invert) = [ufunc(u) for u in (
    np.absolute, np.absolute, np.add, np.subtract, np.multiply, np.divide, np.true_divide, np.negative,
    np.positive, np.exp, np.exp2, np.expm1, np.log, np.log1p, np.log2, np.log10, np.sqrt, np.square, np.tanh,
    np.sin, np.cos, np.tan, np.arcsin, np.arccos, np.arctan, np.arctan2, np.sinh, np.cosh, np.arcsinh,
    np.maximum, np.minimum, np.fmax, np.fmin, np.power, np.sign, np.floor, np.ceil, np.rint, np.trunc,
    np.equal, np.not_equal, np.less, np.less_equal, np.greater, np.greater_equal, np.logical_and,
    np.logical_or, np.logical_xor, np.logical_not, np.isnan, np.isfinite, np.isinf, np.reciprocal,
    np.floor_divide, np.mod, np.remainder, np.hypot, np.logaddexp, np.copysign, np.signbit,
    np.bitwise_and, np.bitwise_or, np.bitwise_xor, np.invert)]
pow = power  # noqa: A001


# Implementations on global ShardedArrays, filled by the planning layer (which the ops layer
# cannot import). Keys: the numpy function (np.sum, np.reshape, ...) or the jnp name; the value
# is called with the jnp function's own arguments. ``shardlab.numpy``'s dispatch
# (numpy_fallback.global_dispatch) looks here first, then falls back (recorded) or refuses.
# Reserved string keys: "elementwise", "contract", "matmul", "astype", "fallback",
# "out_sharding", "reshard" (planning/global_ops.py).
GLOBAL: dict = {}


def _global(np_fn, x, **kw):
    impl = GLOBAL.get(np_fn)
    if impl is None:
        raise TypeError(f"[{np_fn.__name__}] on a global ShardedArray is not supported yet; use it inside "
                        f"shard_map, or np.asarray(x) for the global value")
    return impl(x, **kw)


def _implements(*np_funcs):
    def register(fn):
        for f in np_funcs:
            HANDLED[f] = fn
        return fn

    return register


def _is_local(*values) -> bool:
    return builtins.any(isinstance(v, LocalArray) for v in values)


def _scalar(v) -> bool:
    return isinstance(v, (int, float, complex, bool)) and not isinstance(v, np.generic)


def _operand(v, mesh):
    """A bind operand: LocalArrays as they are, Python scalars as weakly typed constants,
    anything else lifted to an invariant LocalArray."""
    if isinstance(v, LocalArray) or _scalar(v):
        return v
    return lift(v, mesh)


def _promote(ufunc, args) -> list:
    """jax.numpy's promotion: every array operand converted to the common dtype
    (dtypes.result_type; float-valued functions of integers go to to_inexact_dtype), so
    ``int32 * float32`` is float32, ``uint8 + 3`` stays uint8 and ``tanh(int32)`` is float32.
    Python scalars stay weak. The conversions are primitives, so cotangents come back in each
    operand's own dtype."""
    target, _ = ew.dtype_rule(ufunc, args)
    if target is None:
        return args
    return [astype(a, target) if isinstance(a, LocalArray) and a.dtype != target else a for a in args]


def _ufunc(ufunc, method, inputs, kwargs):
    """numpy ufuncs on LocalArrays: each a primitive."""
    if kwargs.get("out") is not None:
        raise TypeError(f"[{ufunc.__name__}] LocalArrays are immutable; out= is not supported")
    if method == "__call__":
        if ufunc is np.matmul:
            return matmul(*inputs)
        prim = ew.PRIMS.get(ufunc.__name__)
        if prim is None:
            raise TypeError(f"[{ufunc.__name__}] is not supported on per-device values "
                            f"(it returns {ufunc.nout} arrays)")
        dtype = kwargs.pop("dtype", None)
        if kwargs:
            raise TypeError(f"[{ufunc.__name__}] keyword arguments {sorted(kwargs)} are not supported "
                            f"on per-device values")
        mesh = mesh_of(inputs)
        args = [_operand(v, mesh) for v in inputs]
        args = _promote(ufunc, args)
        out = bind(prim, args, mesh)
        return out if dtype is None else astype(out, dtype)
    if method == "reduce" and len(inputs) == 1:
        fn = {"add": sum, "multiply": prod, "maximum": max, "minimum": min, "logical_and": all,
              "logical_or": any}.get(ufunc.__name__)
        if fn is not None:
            return fn(inputs[0], axis=kwargs.pop("axis", 0), keepdims=kwargs.pop("keepdims", False))
    return NotImplemented


UFUNC[0] = _ufunc
HOST_UFUNC[0] = _host_ufunc  # HostArray arithmetic: jax.numpy's dtype rules


# -- constants and creation ------------------------------------------------------------------
def _placement(device, out_sharding, op: str, shape):
    """The NamedSharding a creation function puts its result on (``out_sharding=`` or ``device=``
    a sharding), or None. JAX refuses both at once."""
    if device is not None and out_sharding is not None:
        raise ValueError(f"[{op}] pass only one of device= and out_sharding= (as jax.numpy)")
    want = out_sharding if out_sharding is not None else device
    if want is None or not isinstance(want, (_NamedSharding, _P)):
        if want is not None and not hasattr(want, "id"):
            raise TypeError(f"[{op}] device= must be a Device, a NamedSharding or (with set_mesh) a "
                            f"PartitionSpec, got {want!r}")
        return None  # a single device: shardlab's host array
    return GLOBAL["out_sharding"](want, op, len(shape), shape)


def _create(value, device, out_sharding, op: str):
    """A host value placed as JAX's creation functions place it."""
    value = np.asarray(value)
    sh = _placement(device, out_sharding, op, value.shape)
    if sh is not None:
        return _device_put(value, sh)
    return _on_mesh(value)


def _shape_arg(shape, op: str) -> tuple:
    if isinstance(shape, (ShardedArray, LocalArray)):
        raise TypeError(f"[{op}] shape must be an int or a tuple of ints, got an array of shape {shape.shape}; "
                        f"pass x.shape")
    try:
        return (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
    except TypeError:
        raise TypeError(f"[{op}] shape must be an int or a sequence of ints, got {shape!r}") from None


def _float_dtype(dtype):
    return _dt.default_float_dtype() if dtype is None else _dt.canonicalize_dtype(dtype)


def zeros(shape, dtype=None, *, device=None, out_sharding=None):
    """``jnp.zeros``: float32 by default (JAX's dtypes), placed with ``out_sharding=`` / ``device=``.

    Example:
        >>> import shardlab as sl, shardlab.numpy as jnp
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((2,), ("X",))
        >>> jnp.zeros((4, 2), device=sl.NamedSharding(mesh, P("X"))).sharding.spec, jnp.zeros(3).dtype
        (P('X',), dtype('float32'))
    """
    shape = _shape_arg(shape, "zeros")
    return _create(np.broadcast_to(np.zeros((), _float_dtype(dtype)), shape), device, out_sharding, "zeros")


def ones(shape, dtype=None, *, device=None, out_sharding=None):
    """``jnp.ones`` (see :func:`zeros`)."""
    shape = _shape_arg(shape, "ones")
    return _create(np.broadcast_to(np.ones((), _float_dtype(dtype)), shape), device, out_sharding, "ones")


def empty(shape, dtype=None, *, device=None, out_sharding=None):
    """``jnp.empty``: zeros, as in JAX."""
    return zeros(shape, dtype, device=device, out_sharding=out_sharding)


def full(shape, fill_value, dtype=None, *, device=None, out_sharding=None):
    """``jnp.full``: the fill value's JAX dtype (a Python int gives int32, a float float32)."""
    shape = _shape_arg(shape, "full")
    if isinstance(fill_value, ShardedArray):  # an array fill broadcasts, keeping its sharding (as JAX)
        v = fill_value if dtype is None else astype(fill_value, dtype)
        v = v if tuple(v.shape) == shape else GLOBAL[np.broadcast_to](v, shape)
        sh = _placement(device, out_sharding, "full", shape)
        return v if sh is None else GLOBAL["reshard"](v, sh)
    dt = _dt.result_type(fill_value) if dtype is None else _dt.canonicalize_dtype(dtype)
    value = np.broadcast_to(np.asarray(fill_value).astype(dt), shape)
    out = _create(value, device, out_sharding, "full")
    if dtype is None and type(fill_value) in (int, float, complex) and type(out) is HostArray:
        out = _as_host(out, weak=True)  # a Python scalar's weak type, as JAX's
    return out


def arange(start, stop=None, step=None, dtype=None, *, device=None, out_sharding=None):
    """``jnp.arange``: int32 for ints, float32 for floats (JAX's dtypes with x64 off)."""
    for v in (start, stop, step):
        if isinstance(v, (LocalArray, ShardedArray)):
            raise TypeError("[arange] start, stop and step must be concrete numbers (as in JAX's jit)")
    args = [v for v in (start, stop, step) if v is not None]
    dt = _dt.result_type(*args) if dtype is None else _dt.canonicalize_dtype(dtype)
    value = np.arange(start, stop, step) if stop is not None or step is not None else np.arange(start)
    return _create(value.astype(dt), device, out_sharding, "arange")


def linspace(start, stop, num=50, endpoint=True, retstep=False, dtype=None, axis=0, *, device=None):
    """``jnp.linspace``: float32 by default."""
    dt = _dt.to_inexact_dtype(_dt.result_type(start, stop)) if dtype is None else _dt.canonicalize_dtype(dtype)
    out = np.linspace(np.asarray(start, np.float64), np.asarray(stop, np.float64), num, endpoint=endpoint,
                      retstep=retstep, axis=axis)
    if retstep:
        return _create(out[0].astype(dt), device, None, "linspace"), np.asarray(out[1], dt)
    return _create(out.astype(dt), device, None, "linspace")


def eye(N, M=None, k=0, dtype=None, *, device=None):
    """``jnp.eye``: float32 by default."""
    return _create(np.eye(N, M, k, dtype=_float_dtype(dtype)), device, None, "eye")


def identity(n, dtype=None):
    """``jnp.identity``: float32 by default."""
    return _create(np.identity(n, dtype=_float_dtype(dtype)), None, None, "identity")


def tri(N, M=None, k=0, dtype=None):
    """``jnp.tri``: float32 by default."""
    return _create(np.tri(N, M, k, dtype=_float_dtype(dtype)), None, None, "tri")


def array(object, dtype=None, *args, copy=True, order="K", ndmin=0, device=None, out_sharding=None):  # noqa: A002
    """``jnp.array``: the value in JAX's canonical dtype (float64 -> float32, int64 -> int32 with
    x64 off), placed with ``device=`` / ``out_sharding=``; a ShardedArray keeps its sharding."""
    if isinstance(object, (ShardedArray, LocalArray)):
        x = object if dtype is None else astype(object, dtype)
        if ndmin and x.ndim < ndmin:
            x = reshape(x, (1,) * (ndmin - x.ndim) + tuple(x.shape))
        sh = _placement(device, out_sharding, "array", x.shape) if isinstance(x, ShardedArray) else None
        return x if sh is None else GLOBAL["reshard"](x, sh)
    if isinstance(object, (list, tuple)) and _has_global(object):
        return stack([asarray(o) for o in object]) if object else np.zeros((0,), np.float32)
    value = np.array(object, ndmin=ndmin)
    value = _dt.canonicalize(value, "array") if dtype is None else value.astype(_dt.canonicalize_dtype(dtype))
    out = _create(value, device, out_sharding, "array")
    if dtype is None and type(object) in (int, float, complex) and type(out) is HostArray:
        out = _as_host(out, weak=True)  # a Python scalar's weak type, as JAX's
    return out


def asarray(a, dtype=None, order=None, *, copy=None, device=None, out_sharding=None):
    """``jnp.asarray`` (see :func:`array`)."""
    return array(a, dtype, copy=bool(copy), device=device, out_sharding=out_sharding)


def _const_like(x: LocalArray, fill, dtype=None) -> LocalArray:
    """A constant with `x`'s storage shape (varying axes included), held once (stride 0)."""
    dt = _dt.canonicalize_dtype(x.dtype if dtype is None else dtype)
    if is_abstract(x.storage):
        return LocalArray(AbstractStorage(x.storage.shape, dt), x.mesh)
    return LocalArray(np.broadcast_to(np.full((), fill, dt), x.storage.shape), x.mesh)


def _like(name, x, fill, dtype, shape, device, out_sharding):
    if isinstance(x, LocalArray) and shape is None and device is None and out_sharding is None:
        return _const_like(x, fill, dtype)
    if isinstance(x, LocalArray):
        x = np.zeros(x.shape, x.dtype)
    dt = _dt.canonicalize_dtype(x.dtype if dtype is None else dtype) if hasattr(x, "dtype") else \
        (_dt.result_type(x) if dtype is None else _dt.canonicalize_dtype(dtype))
    shp = tuple(np.shape(x)) if shape is None else _shape_arg(shape, name)
    value = np.broadcast_to(np.asarray(fill).astype(dt), shp)
    if isinstance(x, ShardedArray) and device is None and out_sharding is None:
        # the input's sharding (JAX keeps it when the shape is the input's)
        if shape is None or shp == x.shape:
            return _device_put(value, x.sharding)
    return _create(value, device, out_sharding, name)


@_implements(np.zeros_like)
def zeros_like(a, dtype=None, shape=None, *, device=None, out_sharding=None):
    """``jnp.zeros_like``: a ShardedArray's zeros keep its sharding."""
    return _like("zeros_like", a, 0, dtype, shape, device, out_sharding)


@_implements(np.ones_like)
def ones_like(a, dtype=None, shape=None, *, device=None, out_sharding=None):
    return _like("ones_like", a, 1, dtype, shape, device, out_sharding)


@_implements(np.full_like)
def full_like(a, fill_value, dtype=None, shape=None, *, device=None, out_sharding=None):
    if isinstance(fill_value, (LocalArray, ShardedArray)):
        raise TypeError("[full_like] fill_value must be a scalar or host array here")
    if dtype is None and not hasattr(a, "dtype"):
        dtype = _dt.result_type(fill_value)
    return _like("full_like", a, fill_value, dtype, shape, device, out_sharding)


@_implements(np.empty_like)
def empty_like(prototype, dtype=None, shape=None, *, device=None):
    return zeros_like(prototype, dtype=dtype, shape=shape, device=device)


@_implements(np.ndim)
def ndim(x) -> int:
    """Rank (the LOCAL rank of a per-device value)."""
    return x.ndim if isinstance(x, LocalArray) else np.ndim(x)


@_implements(np.shape)
def shape(x) -> tuple:
    """Shape (the LOCAL shape of a per-device value)."""
    return x.shape if isinstance(x, LocalArray) else np.shape(x)


@_implements(np.size)
def size(x, axis=None) -> int:
    if isinstance(x, LocalArray):
        return x.size if axis is None else x.shape[axis]
    return np.size(x, axis)


def astype(x, dtype, copy=False):
    """``x`` converted to `dtype` (a primitive: differentiable for float to float)."""
    if isinstance(x, ShardedArray):
        return GLOBAL["astype"](x, dtype)
    if not isinstance(x, LocalArray):
        return _on_mesh(np.asarray(x).astype(_dt.canonicalize_dtype(dtype)))
    dtype = _dt.canonicalize_dtype(dtype)
    return x if dtype == x.dtype else bind(ew.CONVERT, [x], x.mesh, dtype=dtype)


# -- reductions ------------------------------------------------------------------------------
def _axes(axis, x: LocalArray, op: str) -> tuple:
    if axis is None:
        return tuple(range(len(x.storage.shape) - x.mesh.ndim))
    try:
        st_axes = local_axes(axis, x)
    except (np.exceptions.AxisError, TypeError) as e:
        raise type(e)(f"[{op}] {e}") from None
    st_axes = st_axes if isinstance(st_axes, tuple) else (st_axes,)
    k = x.mesh.ndim
    axes = tuple(sorted(a - k for a in st_axes))
    if len(set(axes)) != len(axes):
        raise ValueError(f"[{op}] axis {axis!r} repeats a dimension")
    return axes


def _reducer(prim, np_fn, *, takes_dtype=True):
    def fn(x, axis=None, dtype=None, keepdims=False, **kw):
        if isinstance(x, ShardedArray):
            return _global(np_fn, x, axis=axis, dtype=dtype, keepdims=keepdims, **kw)
        if not isinstance(x, LocalArray):
            extra = {"dtype": dtype} if dtype is not None and takes_dtype else {}
            return np_fn(x, axis=axis, keepdims=keepdims, **extra, **kw)
        if kw:
            raise TypeError(f"[{np_fn.__name__}] keyword arguments {sorted(kw)} are not supported on "
                            f"per-device values")
        if dtype is not None:
            x = astype(x, dtype)
        return bind(prim, [x], x.mesh, axes=_axes(axis, x, np_fn.__name__), keepdims=bool(keepdims))

    fn.__name__ = np_fn.__name__
    fn.__doc__ = f"``numpy.{np_fn.__name__}`` over the local axes."
    HANDLED[np_fn] = fn
    return fn


sum = _reducer(bc.REDUCE_SUM, np.sum)  # noqa: A001
prod = _reducer(red.REDUCE_PROD, np.prod)


def _nodtype(prim, np_fn):
    def fn(x, axis=None, keepdims=False, **kw):
        if isinstance(x, ShardedArray):
            return _global(np_fn, x, axis=axis, keepdims=keepdims, **kw)
        if not isinstance(x, LocalArray):
            return np_fn(x, axis=axis, keepdims=keepdims, **kw)
        if kw:
            raise TypeError(f"[{np_fn.__name__}] keyword arguments {sorted(kw)} are not supported on "
                            f"per-device values")
        return bind(prim, [x], x.mesh, axes=_axes(axis, x, np_fn.__name__), keepdims=bool(keepdims))

    fn.__name__ = np_fn.__name__
    fn.__doc__ = f"``numpy.{np_fn.__name__}`` over the local axes."
    HANDLED[np_fn] = fn
    return fn


max = _nodtype(red.REDUCE_MAX, np.max)  # noqa: A001
min = _nodtype(red.REDUCE_MIN, np.min)  # noqa: A001
amax, amin = max, min
any = _nodtype(red.REDUCE_ANY, np.any)  # noqa: A001
all = _nodtype(red.REDUCE_ALL, np.all)  # noqa: A001


def _no_kwargs(kw: dict, op: str) -> None:
    if kw:
        raise TypeError(f"[{op}] keyword arguments {sorted(kw)} are not supported on per-device values; "
                        f"use jnp.where to mask inside shard_map")


def _inexact(x: LocalArray) -> LocalArray:
    """`x` in dtypes.to_inexact_dtype (int32 -> float32, float64 -> float32 with x64 off)."""
    return astype(x, _dt.to_inexact_dtype(x.dtype))


def _count(x: LocalArray, axes: tuple) -> int:
    return math.prod(x.shape[a] for a in axes)


@_implements(np.mean)
def mean(x, axis=None, dtype=None, keepdims=False, **kw):
    """Mean over the local axes (integers give float32, as jax.numpy with x64 off)."""
    if isinstance(x, ShardedArray):
        return _global(np.mean, x, axis=axis, dtype=dtype, keepdims=keepdims, **kw)
    if not isinstance(x, LocalArray):
        return np.mean(x, axis=axis, dtype=dtype, keepdims=keepdims, **kw)
    _no_kwargs(kw, "mean")
    x = _inexact(x) if dtype is None else astype(x, dtype)
    s = sum(x, axis=axis, keepdims=keepdims)
    return divide(s, x.dtype.type(builtins.max(_count(x, _axes(axis, x, "mean")), 1)))


@_implements(np.var)
def var(x, axis=None, dtype=None, ddof=0, keepdims=False, **kw):
    if isinstance(x, ShardedArray):
        return _global(np.var, x, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims, **kw)
    if not isinstance(x, LocalArray):
        return np.var(x, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims, **kw)
    _no_kwargs(kw, "var")
    x = _inexact(x) if dtype is None else astype(x, dtype)
    d = subtract(x, mean(x, axis=axis, keepdims=True))
    s = sum(multiply(d, d), axis=axis, keepdims=keepdims)
    return divide(s, x.dtype.type(builtins.max(_count(x, _axes(axis, x, "var")) - ddof, 0)))


@_implements(np.std)
def std(x, axis=None, dtype=None, ddof=0, keepdims=False, **kw):
    if isinstance(x, ShardedArray):
        return _global(np.std, x, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims, **kw)
    if not isinstance(x, LocalArray):
        return np.std(x, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims, **kw)
    _no_kwargs(kw, "std")
    return sqrt(var(x, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims))


def _arg(prim, np_fn):
    def fn(x, axis=None, keepdims=False):
        if not isinstance(x, LocalArray):
            return np_fn(x, axis=axis, keepdims=keepdims)
        if axis is None:
            x = reshape(x, (-1,))
            axis = 0
        return bind(prim, [x], x.mesh, axes=_axes(axis, x, np_fn.__name__), keepdims=bool(keepdims))

    fn.__name__ = np_fn.__name__
    HANDLED[np_fn] = fn
    return fn


argmax = _arg(red.ARGMAX, np.argmax)
argmin = _arg(red.ARGMIN, np.argmin)


@_implements(np.cumsum)
def cumsum(x, axis=None, dtype=None):
    if not isinstance(x, LocalArray):
        return np.cumsum(x, axis=axis, dtype=dtype)
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    if dtype is not None:
        x = astype(x, dtype)
    (ax,) = _axes(axis, x, "cumsum")
    return bind(red.CUMSUM, [x], x.mesh, axis=ax)


# -- shape -----------------------------------------------------------------------------------
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
def repeat(x, repeats, axis=None):
    if not isinstance(x, LocalArray):
        return np.repeat(x, repeats, axis=axis)
    if not isinstance(repeats, (int, np.integer)):
        raise NotImplementedError("[repeat] per-element repeat counts are not supported on per-device values")
    if axis is None:
        x, axis = ravel(x), 0
    (ax,) = _axes(axis, x, "repeat")
    y = expand_dims(x, ax + 1)
    y = broadcast_to(y, x.shape[:ax + 1] + (int(repeats),) + x.shape[ax + 1:])
    return reshape(y, x.shape[:ax] + (x.shape[ax] * int(repeats),) + x.shape[ax + 1:])


def _tri_mask(shape, k: int, lower: bool) -> np.ndarray:
    n, m = shape[-2:]
    return np.tri(n, m, k, dtype=bool) if lower else ~np.tri(n, m, k - 1, dtype=bool)


@_implements(np.tril)
def tril(x, k=0):
    if not isinstance(x, LocalArray):
        return np.tril(x, k)
    return where(_tri_mask(x.shape, k, True), x, x.dtype.type(0))


@_implements(np.triu)
def triu(x, k=0):
    if not isinstance(x, LocalArray):
        return np.triu(x, k)
    return where(_tri_mask(x.shape, k, False), x, x.dtype.type(0))


@_implements(np.where)
def where(condition, x=None, y=None):
    """``numpy.where(condition, x, y)`` (the three-argument form)."""
    if x is None or y is None:
        raise NotImplementedError("[where] the one-argument form has a data-dependent shape; "
                                  "pass x and y")
    if not _is_local(condition, x, y):
        return np.where(condition, x, y)
    mesh = mesh_of((condition, x, y))
    c = _operand(condition, mesh)
    if isinstance(c, LocalArray) and c.dtype != np.bool_:
        c = astype(c, np.bool_)
    args = [_operand(x, mesh), _operand(y, mesh)]
    dt = _dt.result_type(*[v if _scalar(v) else v.dtype for v in args])
    args = [astype(v, dt) if isinstance(v, LocalArray) else v for v in args]
    return bind(ew.SELECT, [c, *args], mesh)


@_implements(np.clip)
def clip(x, a_min=None, a_max=None):
    if not _is_local(x, a_min, a_max):
        return np.clip(x, a_min, a_max)
    out = x
    if a_min is not None:
        out = maximum(out, a_min)
    if a_max is not None:
        out = minimum(out, a_max)
    return out


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


# -- contractions ----------------------------------------------------------------------------
def _contract(terms, out, ops, mesh, op_name, preferred_element_type):
    dt = _dt.result_type(*[o.dtype for o in ops])
    ops = [astype(o, dt) for o in ops]
    return bind(con.EINSUM, ops, mesh, terms=tuple(terms), out=out, op_name=op_name,
                preferred_element_type=None if preferred_element_type is None
                else np.dtype(preferred_element_type))


def _host_result(out, preferred_element_type, operands):
    """A host contraction's result in JAX's dtype (operands promoted, then canonicalized)."""
    dt = _dt.result_type(*[np.asarray(o).dtype if not _scalar(o) else o for o in operands]) \
        if preferred_element_type is None else _dt.canonicalize_dtype(preferred_element_type)
    return np.asarray(out).astype(dt, copy=False)


def _host_placed(out, out_sharding, op: str):
    if out_sharding is not None:
        return _create(out, None, out_sharding, op)
    return _on_mesh(out)


@_implements(np.matmul)
def matmul(a, b, *, precision=None, preferred_element_type=None, out_sharding=None):
    """``a @ b`` with numpy's rules (1-D operands, broadcast batch dims); on global arrays JAX's
    dot_general sharding rule and the planner (``out_sharding=`` when it is ambiguous)."""
    if _has_global((a, b)):
        return GLOBAL["matmul"](a, b, out_sharding=out_sharding, preferred_element_type=preferred_element_type)
    if not _is_local(a, b):
        out = gemm_batched(np.asarray(a), np.asarray(b)) if np.ndim(a) >= 2 and np.ndim(b) >= 2 \
            else np.matmul(a, b)
        return _host_placed(_host_result(out, preferred_element_type, (a, b)), out_sharding, "matmul")
    mesh = mesh_of((a, b))
    A, B = lift(a, mesh), lift(b, mesh)
    if A.ndim == 0 or B.ndim == 0:
        raise ValueError(f"[matmul] operands must have rank >= 1, got local shapes {A.shape} and {B.shape}")
    kb = B.shape[-2 if B.ndim > 1 else 0]
    if A.shape[-1] != kb:
        raise ValueError(f"[matmul] local shapes {A.shape} and {B.shape}: contracting dims "
                         f"{A.shape[-1]} and {kb} differ")
    ra, rb = builtins.max(A.ndim - 2, 0), builtins.max(B.ndim - 2, 0)
    batch_a, batch_b = A.shape[:ra], B.shape[:rb]
    try:
        batch = np.broadcast_shapes(batch_a, batch_b)
    except ValueError:
        raise ValueError(f"[matmul] batch dims of local shapes {A.shape} and {B.shape} do not broadcast") from None
    letters = "abcdefghijklmnop"[:len(batch)]

    def term(X, rank, tail):
        """X's einsum term; a batch dim of size 1 that broadcasts is dropped (einsum then
        broadcasts the letter, so one [B·M, K] x [K, N] GEMM runs, not B broadcast copies)."""
        own = letters[len(batch) - rank:]
        keep = [i for i, c in enumerate(own) if X.shape[i] != 1 or batch[letters.index(c)] == 1]
        if len(keep) < rank:
            X = reshape(X, tuple(X.shape[i] for i in keep) + X.shape[rank:])
        return X, "".join(own[i] for i in keep) + tail

    A, ta = term(A, ra, "mk" if A.ndim > 1 else "k")
    B, tb = term(B, rb, "kn" if B.ndim > 1 else "k")
    out = letters + ("m" if ta.endswith("mk") else "") + ("n" if tb.endswith("kn") else "")
    return _contract([ta, tb], out, [A, B], mesh, "matmul", preferred_element_type)


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _global_contract(op, sub, operands, out_sharding=None, preferred_element_type=None, prim="dot_general"):
    return GLOBAL["contract"](op, sub, operands, out_sharding=out_sharding,
                              preferred_element_type=preferred_element_type, prim=prim)


@_implements(np.dot)
def dot(a, b, *, precision=None, preferred_element_type=None, out_sharding=None):
    """``jnp.dot``: a's last dim against b's second-to-last (its only one if 1-D); scalars multiply."""
    ra, rb = ndim(a), ndim(b)

    def subscripts():  # JAX's: lax.dot_general contracting (ra-1, max(rb-2, 0)), no batch dims
        la = _LETTERS[:ra]
        lb = _LETTERS[ra:ra + rb - 1]
        lb = lb[:-1] + la[-1] + lb[-1:] if rb > 1 else la[-1]
        return f"{la},{lb}->" + la[:-1] + (lb[:-2] + lb[-1] if rb > 1 else "")

    if _has_global((a, b)):
        if ra == 0 or rb == 0:
            return multiply(a, b)
        return _global_contract("dot", subscripts(), (a, b), out_sharding, preferred_element_type)
    if ra > 2 or rb > 2:
        if not _is_local(a, b):
            return _host_placed(_host_result(np.dot(np.asarray(a), np.asarray(b)), preferred_element_type, (a, b)),
                                out_sharding, "dot")
        if ra == 0 or rb == 0:
            return multiply(a, b)
        mesh = mesh_of((a, b))
        A, B = lift(a, mesh), lift(b, mesh)
        k = B.shape[-2 if rb > 1 else 0]
        if A.shape[-1] != k:
            raise TypeError(f"[dot] dot_general requires contracting dimensions to have the same shape, got "
                            f"({A.shape[-1]},) and ({k},) (local shapes {A.shape} and {B.shape}): jnp.dot "
                            f"contracts a's last dim with b's second-to-last")
        return einsum(subscripts(), A, B, preferred_element_type=preferred_element_type)
    if ra == 0 or rb == 0:
        return multiply(a, b)
    return matmul(a, b, preferred_element_type=preferred_element_type, out_sharding=out_sharding)


@_implements(np.vdot)
def vdot(a, b, *, precision=None, preferred_element_type=None):
    """``jnp.vdot``: the flattened operands' dot product (on global arrays every dim contracts)."""
    if _has_global((a, b)):
        if ndim(a) != ndim(b) or shape(a) != shape(b):
            a, b = ravel(a), ravel(b)
        sub = _LETTERS[:ndim(a)]
        return _global_contract("vdot", f"{sub},{sub}->", (a, b), None, preferred_element_type)
    return sum(multiply(ravel(a), ravel(b)))


@_implements(np.inner)
def inner(a, b, *, precision=None, preferred_element_type=None):
    """``jnp.inner``: the last dims contract."""
    ra, rb = ndim(a), ndim(b)
    if ra == 0 or rb == 0:
        return multiply(a, b)
    la, lb = _LETTERS[:ra], _LETTERS[ra:ra + rb - 1] + _LETTERS[ra - 1]
    sub = f"{la},{lb}->{la[:-1]}{lb[:-1]}"
    if _has_global((a, b)):
        return _global_contract("inner", sub, (a, b), None, preferred_element_type)
    if not _is_local(a, b):
        return _on_mesh(_host_result(np.inner(np.asarray(a), np.asarray(b)), preferred_element_type, (a, b)))
    return einsum(sub, a, b, preferred_element_type=preferred_element_type)


@_implements(np.outer)
def outer(a, b, out=None):
    """``jnp.outer``: ravel(a)[:, None] * ravel(b)[None, :] (on global arrays: the broadcasting rule)."""
    if _has_global((a, b)):
        return _global_contract("outer", "i,j->ij", (ravel(a) if ndim(a) != 1 else a, ravel(b) if ndim(b) != 1
                                                       else b), None, None, prim="mul")
    if not _is_local(a, b):
        return _on_mesh(_host_result(np.outer(a, b), None, (a, b)))
    return einsum("i,j->ij", ravel(a), ravel(b))


def _dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, *, out_sharding=None):
    """``lax.dot_general``: contract ``lhs`` and ``rhs`` along ``dimension_numbers`` =
    ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)); the result is batch dims,
    then lhs's free dims, then rhs's. On global arrays JAX's ``_dot_general_sharding_rule``
    (``out_sharding=`` where contracting dims are sharded on both sides) and the planner.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> sl.lax.dot_general(np.ones((2, 3)), np.ones((3, 4)), (((1,), (0,)), ((), ()))).shape
        (2, 4)
    """
    (lc, rc), (lb, rb) = dimension_numbers
    ra, rb_ = ndim(lhs), ndim(rhs)
    lc, rc, lb, rb = ([int(i) % r for i in ax] for ax, r in ((lc, ra), (rc, rb_), (lb, ra), (rb, rb_)))
    if len(lc) != len(rc) or len(lb) != len(rb):
        raise TypeError(f"[dot_general] dimension_numbers {dimension_numbers} pair {len(lc)} lhs with {len(rc)} rhs "
                        f"contracting and {len(lb)} with {len(rb)} batch dims; give as many on each side")
    lt = list(_LETTERS[:ra])
    rt = list(_LETTERS[ra:ra + rb_])
    for i, j in zip(lc + lb, rc + rb):
        rt[j] = lt[i]
    out = "".join(lt[i] for i in lb) + "".join(c for i, c in enumerate(lt) if i not in lc and i not in lb) + \
        "".join(c for j, c in enumerate(rt) if j not in rc and j not in rb)
    sub = f"{''.join(lt)},{''.join(rt)}->{out}"
    if _has_global((lhs, rhs)):
        return GLOBAL["contract"]("dot_general", sub, (lhs, rhs), out_sharding=out_sharding,
                                  preferred_element_type=preferred_element_type, jnp_order=False)
    return einsum(sub, lhs, rhs, preferred_element_type=preferred_element_type, out_sharding=out_sharding)


@_implements(np.einsum)
def einsum(subscripts, *operands, out=None, optimize="auto", precision=None, preferred_element_type=None,
           _dot_general=None, out_sharding=None):
    """``jnp.einsum``. On global ShardedArrays: JAX's sharding rule decides the output sharding
    (``out_sharding=`` where contracting dims are sharded on both sides) and the planner runs it
    with the collectives it needs, recorded in the ledger. On per-device values: local shapes;
    two-operand contractions run as one batched GEMM.

    Example:
        >>> import numpy as np, shardlab as sl, shardlab.numpy as jnp
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((2, 4), ("X", "Y"))
        >>> a = sl.device_put(np.ones((8, 4), np.float32), sl.NamedSharding(mesh, P("X", None)))
        >>> b = sl.device_put(np.ones((4, 8), np.float32), sl.NamedSharding(mesh, P(None, "Y")))
        >>> jnp.einsum("ij,jk->ik", a, b).sharding.spec
        P('X', 'Y')
    """
    if out is not None:
        raise TypeError("[einsum] out= is not supported: arrays are immutable, as in JAX")
    if _has_global(operands):
        return _global_contract("einsum", subscripts, operands, out_sharding, preferred_element_type)
    if not _is_local(*operands):
        arrays = [np.asarray(o) for o in operands]
        terms, out = parse(subscripts, [a.shape for a in arrays])
        res = einsum_arrays(terms, out, arrays)
        return _host_placed(_host_result(res, preferred_element_type, arrays), out_sharding, "einsum")
    mesh = mesh_of(operands)
    ops = [lift(o, mesh) for o in operands]
    terms, out = parse(subscripts, [o.shape for o in ops])
    return _contract(terms, out, ops, mesh, "einsum", preferred_element_type)


# -- methods of LocalArray -------------------------------------------------------------------
def _method(fn):
    def method(self, *a, **k):
        return fn(self, *a, **k)

    method.__name__ = fn.__name__
    method.__doc__ = f"``jnp.{fn.__name__}(self, ...)``, on the local value. {(fn.__doc__ or '').strip()}"
    return method


register_method("reshape", lambda self, *shape, order="C": reshape(
    self, shape[0] if len(shape) == 1 else shape, order=order))
register_method("transpose", lambda self, *axes: transpose(self, axes[0] if len(axes) == 1 else (axes or None)))
register_method("astype", _method(astype))
for _name, _fn in (("sum", sum), ("mean", mean), ("max", max), ("min", min), ("prod", prod), ("var", var),
                   ("std", std), ("any", any), ("all", all), ("argmax", argmax), ("argmin", argmin),
                   ("squeeze", squeeze), ("swapaxes", swapaxes), ("ravel", ravel), ("flatten", ravel),
                   ("cumsum", cumsum), ("clip", clip), ("repeat", repeat)):
    register_method(_name, _method(_fn))

# Arithmetic operators call the ufunc handler directly: numpy's operator mixin would route every
# `a + b` through numpy's override protocol first (about 2.5 µs of a ~10 µs dispatch).
def _elementwise(ufunc, prim, inputs):
    """`ufunc` on operands that are LocalArrays or Python scalars, with jax.numpy's promotion:
    the operators' path (the general one is :func:`_ufunc`)."""
    mesh = mesh_of(inputs)
    args = [v if type(v) is LocalArray or type(v) in _PY_SCALARS else _operand(v, mesh) for v in inputs]
    target, _ = ew.dtype_rule(ufunc, args)
    if target is not None:
        args = [astype(a, target) if type(a) is LocalArray and a.dtype != target else a for a in args]
    return bind(prim, args, mesh)


_PY_SCALARS = frozenset((int, float, complex, bool))


def _binary(ufunc):
    prim = ew.PRIMS[ufunc.__name__]

    def op(self, other):
        return _elementwise(ufunc, prim, (self, other))

    def rop(self, other):
        return _elementwise(ufunc, prim, (other, self))

    return op, rop


for _name, _uf in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("truediv", np.true_divide),
                   ("floordiv", np.floor_divide), ("mod", np.remainder), ("pow", np.power), ("and", np.bitwise_and),
                   ("or", np.bitwise_or), ("xor", np.bitwise_xor), ("lshift", np.left_shift),
                   ("rshift", np.right_shift)):
    _op, _rop = _binary(_uf)
    register_method(f"__{_name}__", _op)
    register_method(f"__r{_name}__", _rop)
for _name, _uf in (("lt", np.less), ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal),
                   ("eq", np.equal), ("ne", np.not_equal)):
    register_method(f"__{_name}__", _binary(_uf)[0])
register_method("__neg__", lambda self: _ufunc(np.negative, "__call__", (self,), {}))
register_method("__pos__", lambda self: _ufunc(np.positive, "__call__", (self,), {}))
register_method("__abs__", lambda self: _ufunc(np.absolute, "__call__", (self,), {}))
register_method("__invert__", lambda self: _ufunc(np.invert, "__call__", (self,), {}))

# JAX arrays are immutable: `x += y` rebinds x instead of writing into shared storage.
for _op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor", "lshift",
            "rshift"):
    register_method(f"__i{_op}__", getattr(LocalArray, f"__{_op}__"))
