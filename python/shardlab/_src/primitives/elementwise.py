"""Elementwise primitives: one per numpy ufunc, plus select (where) and convert_element_type.

Inputs are LocalArrays or Python scalars (weakly typed, as in JAX). Storages of different
local rank are aligned inside the primitive (local dims right-aligned, mesh dims leading), so
the tape sees the caller's own values. The result varies along every mesh axis an input
varies along.

Example:
    >>> import numpy as np
    >>> from shardlab._src.primitives.elementwise import PRIMS
    >>> PRIMS["tanh"].name, PRIMS["multiply"].name
    ('tanh', 'multiply')
"""

from __future__ import annotations

import functools

import numpy as np

from ..arrays.local_array import LocalArray
from ..core import dtypes
from .primitive import Primitive, bind
from .shapes import align, broadcast_avals
from .broadcasting import unbroadcast

# -- vjp rules (ct: cotangent of the output; xs: inputs; out: the output) --------------------


def _ew(name, *args):
    mesh = next(a.mesh for a in args if isinstance(a, LocalArray))
    return bind(PRIMS[name], list(args), mesh)


def _neg(x):
    return _ew("negative", x)


_RULES = {
    "add": lambda ct, x, y, out: (ct, ct),
    "subtract": lambda ct, x, y, out: (ct, _neg(ct)),
    "multiply": lambda ct, x, y, out: (_ew("multiply", ct, y), _ew("multiply", ct, x)),
    "divide": lambda ct, x, y, out: (_ew("divide", ct, y), _neg(_ew("divide", _ew("multiply", ct, out), y))),
    "true_divide": lambda ct, x, y, out: (_ew("divide", ct, y),
                                          _neg(_ew("divide", _ew("multiply", ct, out), y))),
    "negative": lambda ct, x, out: (_neg(ct),),
    "positive": lambda ct, x, out: (ct,),
    "exp": lambda ct, x, out: (_ew("multiply", ct, out),),
    "exp2": lambda ct, x, out: (_ew("multiply", ct, _ew("multiply", out, float(np.log(2.0)))),),
    "expm1": lambda ct, x, out: (_ew("multiply", ct, _ew("add", out, 1.0)),),
    "log": lambda ct, x, out: (_ew("divide", ct, x),),
    "log2": lambda ct, x, out: (_ew("divide", ct, _ew("multiply", x, float(np.log(2.0)))),),
    "log10": lambda ct, x, out: (_ew("divide", ct, _ew("multiply", x, float(np.log(10.0)))),),
    "log1p": lambda ct, x, out: (_ew("divide", ct, _ew("add", x, 1.0)),),
    "sqrt": lambda ct, x, out: (_ew("divide", ct, _ew("multiply", out, 2.0)),),
    "square": lambda ct, x, out: (_ew("multiply", ct, _ew("multiply", x, 2.0)),),
    "reciprocal": lambda ct, x, out: (_neg(_ew("multiply", ct, _ew("multiply", out, out))),),
    "tanh": lambda ct, x, out: (_ew("multiply", ct, _ew("subtract", 1.0, _ew("multiply", out, out))),),
    "sin": lambda ct, x, out: (_ew("multiply", ct, _ew("cos", x)),),
    "cos": lambda ct, x, out: (_neg(_ew("multiply", ct, _ew("sin", x))),),
    "tan": lambda ct, x, out: (_ew("multiply", ct, _ew("add", 1.0, _ew("multiply", out, out))),),
    "sinh": lambda ct, x, out: (_ew("multiply", ct, _ew("cosh", x)),),
    "cosh": lambda ct, x, out: (_ew("multiply", ct, _ew("sinh", x)),),
    "arctan": lambda ct, x, out: (_ew("divide", ct, _ew("add", 1.0, _ew("multiply", x, x))),),
    "arcsin": lambda ct, x, out: (_ew("divide", ct, _ew("sqrt", _ew("subtract", 1.0, _ew("multiply", x, x)))),),
    "arccos": lambda ct, x, out: (_neg(_ew("divide", ct, _ew("sqrt", _ew("subtract", 1.0, _ew("multiply", x, x))))),),
    "arcsinh": lambda ct, x, out: (_ew("divide", ct, _ew("sqrt", _ew("add", _ew("multiply", x, x), 1.0))),),
    "absolute": lambda ct, x, out: (_ew("multiply", ct, _ew("sign", x)),),
    "conjugate": lambda ct, x, out: (ct,),
    "float_power": lambda ct, x, y, out: _power_rule(ct, x, y, out),
    "ldexp": lambda ct, x, y, out: (_ew("ldexp", ct, y), None),
    "fabs": lambda ct, x, out: (_ew("multiply", ct, _ew("sign", x)),),
    "cbrt": lambda ct, x, out: (_ew("divide", ct, _ew("multiply", _ew("multiply", out, out), 3.0)),),
    "deg2rad": lambda ct, x, out: (_ew("multiply", ct, float(np.pi / 180)),),
    "radians": lambda ct, x, out: (_ew("multiply", ct, float(np.pi / 180)),),
    "rad2deg": lambda ct, x, out: (_ew("multiply", ct, float(180 / np.pi)),),
    "degrees": lambda ct, x, out: (_ew("multiply", ct, float(180 / np.pi)),),
    "arccosh": lambda ct, x, out: (_ew("divide", ct, _ew("sqrt", _ew("subtract", _ew("multiply", x, x), 1.0))),),
    "arctanh": lambda ct, x, out: (_ew("divide", ct, _ew("subtract", 1.0, _ew("multiply", x, x))),),
    "logaddexp2": lambda ct, x, y, out: (_ew("multiply", ct, _ew("exp2", _ew("subtract", x, out))),
                                         _ew("multiply", ct, _ew("exp2", _ew("subtract", y, out)))),
    "maximum": lambda ct, x, y, out: _select_rule(ct, _ew("greater_equal", x, y)),
    "minimum": lambda ct, x, y, out: _select_rule(ct, _ew("less_equal", x, y)),
    "fmax": lambda ct, x, y, out: _select_rule(ct, _ew("greater_equal", x, y)),
    "fmin": lambda ct, x, y, out: _select_rule(ct, _ew("less_equal", x, y)),
    "power": lambda ct, x, y, out: _power_rule(ct, x, y, out),
    "arctan2": lambda ct, y, x, out: (
        _ew("divide", _ew("multiply", ct, x), _ew("add", _ew("multiply", x, x), _ew("multiply", y, y))),
        _neg(_ew("divide", _ew("multiply", ct, y), _ew("add", _ew("multiply", x, x), _ew("multiply", y, y))))),
    "hypot": lambda ct, x, y, out: (_ew("divide", _ew("multiply", ct, x), out),
                                    _ew("divide", _ew("multiply", ct, y), out)),
    "logaddexp": lambda ct, x, y, out: (_ew("multiply", ct, _ew("exp", _ew("subtract", x, out))),
                                        _ew("multiply", ct, _ew("exp", _ew("subtract", y, out)))),
    "copysign": lambda ct, x, y, out: (_ew("multiply", ct, _ew("multiply", _ew("sign", x), _ew("sign", out))), None),
}

# Piecewise-constant functions: their derivative is zero almost everywhere (as JAX).
_ZERO_GRAD = ("sign", "floor", "ceil", "rint", "trunc", "round", "floor_divide", "mod", "remainder", "fmod",
              "heaviside", "spacing")

# Functions whose output is boolean or integer: not differentiable, no cotangent flows.
_NO_GRAD = ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_and",
            "logical_or", "logical_xor", "logical_not", "isnan", "isfinite", "isinf", "signbit",
            "bitwise_and", "bitwise_or", "bitwise_xor", "invert", "left_shift", "right_shift", "gcd", "lcm",
            "bitwise_count", "nextafter")


def _power_rule(ct, x, y, out):
    ym1 = _ew("subtract", y, 1) if isinstance(y, LocalArray) else y - 1
    gx = None if not isinstance(x, LocalArray) else _ew("multiply", ct, _ew("multiply", y, _ew("power", x, ym1)))
    gy = None if not isinstance(y, LocalArray) else \
        _ew("multiply", ct, _ew("multiply", out, _ew("log", _ew("where_positive", x))))
    return gx, gy


def _select_rule(ct, cond):
    zero = 0.0
    return (bind(SELECT, [cond, ct, zero], ct.mesh), bind(SELECT, [cond, zero, ct], ct.mesh))


# Functions whose result is inexact: integer and bool inputs are first converted with
# dtypes.to_inexact_dtype (jnp.tanh of int32 is float32; numpy would give float64).
# numpy's reciprocal keeps integers; jax.numpy's does not.
_ALWAYS_INEXACT = ("reciprocal",)
# Functions whose operands keep their own dtypes (no common promotion), as in jax.numpy.
_MIXED_OPERANDS = ("ldexp", "left_shift", "right_shift")


_WEAK = (bool, int, float, complex)
_ARRAYS = frozenset((np.ndarray, LocalArray))  # operand types whose key is their dtype


def _operand_key(a):
    """A hashable stand-in for an operand's type: its np.dtype, or the Python scalar type
    (int and float are weakly typed, as in JAX). On every elementwise call: kept cheap."""
    t = type(a)
    if t in _WEAK:
        return t
    if isinstance(a, _WEAK) and not isinstance(a, np.generic):  # subclasses (numpy's bool_ is not one)
        return next(w for w in _WEAK if isinstance(a, w))
    return a.dtype


@functools.cache
def _is_inexact_fn(ufunc) -> bool:
    if ufunc.__name__ in _ALWAYS_INEXACT:
        return True
    try:
        with np.errstate(all="ignore"):
            out = ufunc(*([np.ones((), np.int32)] * ufunc.nin))
    except TypeError:
        return False
    return np.asarray(out).dtype.kind in "fc"


@functools.cache
def _rule(ufunc, key: tuple, x64: bool) -> tuple:
    """(operand dtype, result dtype) of `ufunc` on operands of types `key`: jax.numpy's
    promotion (dtypes.result_type), then to_inexact_dtype for float-valued functions."""
    name = ufunc.__name__
    if name in _MIXED_OPERANDS:
        probes = [np.zeros((), k) if isinstance(k, np.dtype) else k(0) for k in key]
        with np.errstate(all="ignore"):
            out = np.asarray(ufunc(*probes)).dtype
        return None, dtypes.canonicalize_dtype(out)
    try:
        target = dtypes.result_type(*key)
    except TypeError as e:
        raise TypeError(f"[{name}] {e}") from None
    if target.kind in "biu" and _is_inexact_fn(ufunc):
        target = dtypes.to_inexact_dtype(target)
    with np.errstate(all="ignore"):
        try:
            out = np.asarray(ufunc(*([np.zeros((), target)] * ufunc.nin))).dtype
        except (TypeError, ValueError):
            raise TypeError(f"[{name}] is not defined for dtype {target} (operands "
                            f"{', '.join(getattr(k, 'name', getattr(k, '__name__', str(k))) for k in key)})") from None
    if target == np.bool_ and out.kind in "iu":
        # numpy computes square / floor_divide / power of booleans in int8; jax.numpy promotes
        # them to the default int first (promote_dtypes_numeric): int32 with x64 off
        return dtypes.default_int_dtype(), dtypes.default_int_dtype()
    return target, dtypes.canonicalize_dtype(out) if out != target else out


def dtype_rule(ufunc, operands) -> tuple:
    """(dtype the operands are cast to, result dtype) of `ufunc` on `operands` (storages,
    LocalArrays or Python scalars), following jax.numpy.

    Example:
        >>> import numpy as np
        >>> dtype_rule(np.tanh, [np.zeros(2, np.int32)])
        (dtype('float32'), dtype('float32'))
        >>> dtype_rule(np.add, [np.zeros(2, np.uint8), 3])
        (dtype('uint8'), dtype('uint8'))
    """
    key = (ufunc, tuple([a.dtype if type(a) in _ARRAYS else _operand_key(a) for a in operands]),
           dtypes.x64_enabled())
    hit = _RULES_SEEN.get(key)
    if hit is None:
        hit = _RULES_SEEN[key] = _rule(*key)
    return hit


_RULES_SEEN: dict = {}  # (ufunc, operand types, x64) -> rule: one dict lookup per elementwise call


def _shape_rule_for(ufunc):
    def shape_rule(avals, mesh):
        shape = broadcast_avals(avals, mesh.ndim)
        return [(shape, dtype_rule(ufunc, avals)[1])]

    return shape_rule


def _vjp_for(name: str, nin: int):
    rule = _RULES.get(name)

    def vjp(cts, ins, outs, mesh):
        ct = cts[0]
        if name in _ZERO_GRAD:
            return [None] * nin
        if rule is None:
            raise NotImplementedError(f"[grad] {name} has no derivative rule in shardlab; "
                                      f"write the function with differentiable primitives")
        raw = rule(ct, *ins, outs[0])
        return [None if not isinstance(x, LocalArray) or g is None else unbroadcast(g, x)
                for x, g in zip(ins, raw)]

    return vjp if name not in _NO_GRAD else None


def _make(ufunc) -> Primitive:
    return Primitive(ufunc.__name__, shape_rule=_shape_rule_for(ufunc), vjp=_vjp_for(ufunc.__name__, ufunc.nin))


_UFUNCS = [getattr(np, n) for n in dir(np) if isinstance(getattr(np, n), np.ufunc)]
PRIMS: dict = {u.__name__: _make(u) for u in _UFUNCS if u.nout == 1}
UFUNC_OF: dict = {u.__name__: u for u in _UFUNCS}


# "where_positive": x where x > 0 else 1, so d/dy x**y = x**y log x is finite where x <= 0
# (those entries' cotangent is multiplied by out = 0 anyway, as in JAX).
def _where_positive(x):
    return np.where(x > 0, x, np.ones((), x.dtype))


PRIMS["where_positive"] = Primitive("where_positive", shape_rule=lambda avals, mesh: [
    (tuple(avals[0].shape), avals[0].dtype)])
UFUNC_OF["where_positive"] = _where_positive


# -- select: where(cond, x, y) ----------------------------------------------------------------
def _select_shape(avals, mesh):
    shape = broadcast_avals(avals, mesh.ndim)
    return [(shape, dtypes.result_type(*[_operand_key(a) for a in avals[1:]]))]


def _select_vjp(cts, ins, outs, mesh):
    cond, x, y = ins
    ct = cts[0]
    zero = 0.0
    gx = unbroadcast(bind(SELECT, [cond, ct, zero], mesh), x) if isinstance(x, LocalArray) else None
    gy = unbroadcast(bind(SELECT, [cond, zero, ct], mesh), y) if isinstance(y, LocalArray) else None
    return [None, gx, gy]


SELECT = Primitive("select", shape_rule=_select_shape, vjp=_select_vjp)


# -- convert_element_type (astype) ------------------------------------------------------------
def _convert_vjp(cts, ins, outs, mesh, *, dtype):
    x = ins[0]
    if x.dtype.kind not in "fc" and x.dtype.name != "bfloat16":
        return [None]
    return [bind(CONVERT, [cts[0]], mesh, dtype=x.dtype)]


CONVERT = Primitive("convert_element_type",
                    shape_rule=lambda avals, mesh, *, dtype: [(tuple(avals[0].shape), np.dtype(dtype))],
                    vjp=_convert_vjp)


# -- erf (jax.scipy.special.erf / lax.erf): d/dx erf(x) = 2/sqrt(pi) exp(-x^2) ---------------
_TWO_OVER_SQRT_PI = float(2.0 / np.sqrt(np.pi))


def _erf_shape(avals, mesh):
    x = avals[0]
    return [(tuple(x.shape), dtypes.to_inexact_dtype(x.dtype))]


def _erf_vjp(cts, ins, outs, mesh):
    x = ins[0]
    slope = _ew("multiply", _ew("exp", _neg(_ew("multiply", x, x))), _TWO_OVER_SQRT_PI)
    return [_ew("multiply", cts[0], slope)]


ERF = Primitive("erf", shape_rule=_erf_shape, vjp=_erf_vjp)


__all__ = ["PRIMS", "SELECT", "CONVERT", "ERF", "UFUNC_OF", "align", "dtype_rule"]
