"""Elementwise functions: :class:`ufunc` (``jnp.add``, ``jnp.sin``, ...: numpy's ufuncs with JAX's
dtype and sharding rules), the LocalArray operators, selection (``where``, ``select``,
``clip``, ``tril`` / ``triu``) and the comparisons and cleaning functions composed from them.
"""

from __future__ import annotations

import numpy as np

from ...arrays.host_array import promote_weak as _promote_weak, register_host_ufunc, weak_result as _weak_result
from ...arrays.local_array import lift, LocalArray, mesh_of, register_method, register_ufunc_handler
from ...arrays.sharded_array import ShardedArray
from ...core import dtypes as _dt
from ...core.context import CTX as _CTX
from ...core.mesh import UNIT_MESH
from ...primitives import elementwise as ew
from ...primitives.primitive import bind
from .dispatch import (_has_global, _host_operand, _implements, _is_local, _local, _on_mesh, _operand, _PY_SCALARS,
                       _scalar, GLOBAL)
from .conversion import _inexact, astype, ndim
from .manipulation import expand_dims
from .creation import ones_like, zeros_like

__all__ = ["ufunc", "abs", "absolute", "add", "arccos", "arcsin", "arcsinh", "arctan", "arctan2", "bitwise_and",
           "bitwise_or", "bitwise_xor", "ceil", "copysign", "cos", "cosh", "divide", "equal", "exp", "exp2", "expm1",
           "floor", "floor_divide", "fmax", "fmin", "greater", "greater_equal", "hypot", "invert", "isfinite", "isinf",
           "isnan", "less", "less_equal", "log", "log10", "log1p", "log2", "logaddexp", "logical_and", "logical_not",
           "logical_or", "logical_xor", "maximum", "minimum", "mod", "multiply", "negative", "not_equal", "positive",
           "power", "reciprocal", "remainder", "rint", "sign", "signbit", "sin", "sinh", "sqrt", "square", "subtract",
           "tan", "tanh", "true_divide", "trunc", "pow", "tril", "triu", "where", "clip", "acos", "acosh", "asin",
           "asinh", "atan", "atan2", "atanh", "arccosh", "arctanh", "bitwise_invert", "bitwise_not",
           "bitwise_left_shift", "bitwise_right_shift", "left_shift", "right_shift", "bitwise_count", "cbrt", "conj",
           "conjugate", "deg2rad", "degrees", "fabs", "float_power", "fmod", "gcd", "heaviside", "lcm", "ldexp",
           "logaddexp2", "nextafter", "rad2deg", "radians", "spacing", "erf", "isclose", "nan_to_num", "isposinf",
           "isneginf", "real", "imag", "isreal", "iscomplex", "sinc", "divmod", "select"]


# What a ufunc does on per-device values beyond an elementwise primitive, registered by the
# family that defines it: ``ufunc.reduce`` is the matching reduction (reductions.py), ``np.matmul``
# the contraction (contractions.py).
_REDUCTIONS: dict = {}   # ufunc name ("add", ...) -> the jnp reduction
_CALLS: dict = {}        # numpy ufunc (np.matmul) -> the jnp function it calls


def register_ufunc_reduction(name: str, fn) -> None:
    """``<ufunc name>.reduce`` on arrays shardlab holds is ``fn(x, axis=, keepdims=)``."""
    _REDUCTIONS[name] = fn


def register_ufunc_call(np_ufunc, fn) -> None:
    """``np_ufunc(*operands)`` on per-device values is ``fn(*operands)`` (a ufunc that is not an
    elementwise primitive, as ``np.matmul``)."""
    _CALLS[np_ufunc] = fn


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
        fn = _REDUCTIONS.get(self.__name__)
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
        res = bind(prim, vals, UNIT_MESH).storage
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
        if ufunc in _CALLS:
            return _CALLS[ufunc](*inputs)
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
        fn = _REDUCTIONS.get(ufunc.__name__)
        if fn is not None:
            return fn(inputs[0], axis=kwargs.pop("axis", 0), keepdims=kwargs.pop("keepdims", False))
    return NotImplemented


register_ufunc_handler(_ufunc)
register_host_ufunc(_host_ufunc)  # HostArray arithmetic: jax.numpy's dtype rules


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


_U = ufunc
acos, acosh, asin, asinh, atan, atan2, atanh = [_U(u) for u in (np.arccos, np.arccosh, np.arcsin, np.arcsinh,
                                                                np.arctan, np.arctan2, np.arctanh)]
arccosh, arctanh = acosh, atanh
bitwise_invert = bitwise_not = invert
bitwise_left_shift, bitwise_right_shift = _U(np.left_shift), _U(np.right_shift)
left_shift, right_shift = bitwise_left_shift, bitwise_right_shift
(cbrt, fabs, deg2rad, rad2deg, degrees, radians, logaddexp2, heaviside, spacing, nextafter, gcd, lcm,
 float_power, fmod, ldexp, bitwise_count, conj, conjugate) = [_U(u) for u in (
    np.cbrt, np.fabs, np.deg2rad, np.rad2deg, np.degrees, np.radians, np.logaddexp2, np.heaviside,
    np.spacing, np.nextafter, np.gcd, np.lcm, np.float_power, np.fmod, np.ldexp, np.bitwise_count,
    np.conj, np.conjugate)]


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


@_implements(np.isclose)
def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    if not _is_local(a, b):
        return np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)
    close = abs(a - b) <= atol + rtol * abs(b)
    close = close | equal(a, b)
    return close | (isnan(a) & isnan(b)) if equal_nan else close


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
    return zeros_like(x) if _local(x) else np.imag(x)


@_implements(np.isreal)
def isreal(x):
    return ones_like(x, dtype=bool) if _local(x) else np.isreal(x)


@_implements(np.iscomplex)
def iscomplex(x):
    return zeros_like(x, dtype=bool) if _local(x) else np.iscomplex(x)


@_implements(np.sinc)
def sinc(x):
    if not _local(x):
        return np.sinc(x)
    x = _inexact(x)
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
