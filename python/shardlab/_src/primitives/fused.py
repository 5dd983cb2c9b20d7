"""Fused elementwise primitives: one pass over memory where the composite expression takes
several. Each equals a composite of elementwise primitives (the docstring of each says which)
and has the same rules; the emulated backend runs the C++ kernels of ``shardlab/fused.hpp``.

- ``silu(x) = x * sigmoid(x)``, and its vjp ``silu_vjp(x, dy) = dy * s * (1 + x * (1 - s))``
  (itself differentiable, so second derivatives work);
- ``swiglu(x) = silu(x[..., :F]) * x[..., F:]`` on a last dim of 2F ([gate | up], jax.nn.glu's
  layout), and its vjp ``swiglu_vjp(x, dz) -> dx`` in one buffer (under a grad of a grad the
  rule is written with split, ``silu``/``silu_vjp`` and concatenate instead);
- ``exp_sum(x, shift) = sum(exp(x - shift[..., None]), -1)`` (logsumexp's and softmax's sum
  without the exponentials in memory) and its vjp in x ``exp_sum_vjp(x, shift, ct)``;
- ``rms_norm(x, scale) -> (y, rstd)`` over the last local dim, and its vjp ``rms_norm_vjp``
  from the saved rstd (under a grad of a grad the rule is written with elementwise primitives
  instead, so second derivatives work);
- ``rotary_embedding(x, cos, sin)`` (rotate-half layout); its vjp is the same primitive with
  ``inverse`` flipped, since a rotation's transpose is the rotation by minus the angle;
- ``adamw_update(param, grad, m, v)``: one AdamW step (new param, m, v), not differentiable.

They take float32 operands of one local shape; callers (``shardlab.nn.silu``,
``shardlab.experimental.adamw_update``) use the composite for anything else.

Example:
    >>> from shardlab._src.primitives.fused import SILU, SWIGLU, RMS_NORM, ADAMW_UPDATE
    >>> SILU.name, SWIGLU.name, RMS_NORM.name, ADAMW_UPDATE.name
    ('silu', 'swiglu', 'rms_norm', 'adamw_update')
"""

from __future__ import annotations

import numpy as np

from ..arrays.local_array import LocalArray
from ..core.context import CTX, wanted
from .broadcasting import REDUCE_SUM, unbroadcast
from .elementwise import PRIMS
from .primitive import Primitive, bind
from .shapes import broadcast_avals
from .structural import CONCATENATE, RESHAPE, SPLIT

_F32 = np.dtype(np.float32)


def _check_float32(op: str, avals) -> None:
    for a in avals:
        if a.dtype != _F32:
            raise TypeError(f"[{op}] takes float32 operands; got {a.dtype} (use the composite expression)")


def _same_local_shapes(op: str, avals, mesh) -> tuple:
    k = mesh.ndim
    local = tuple(avals[0].shape[k:])
    for a in avals[1:]:
        if tuple(a.shape[k:]) != local:
            raise ValueError(f"[{op}] operands have local shapes {local} and {tuple(a.shape[k:])}; "
                             f"they must be equal")
    return broadcast_avals(avals, k)


def _mesh_dims(avals, k: int) -> tuple:
    return tuple(np.broadcast_shapes(*(tuple(a.shape[:k]) for a in avals)))


def _ew(name, *args):
    mesh = next(a.mesh for a in args if isinstance(a, LocalArray))
    return bind(PRIMS[name], list(args), mesh)


# -- silu ------------------------------------------------------------------------------------
def _silu_shape(avals, mesh):
    _check_float32("silu", avals)
    return [(tuple(avals[0].shape), _F32)]


def _silu_vjp(cts, ins, outs, mesh):
    ct = cts[0]
    return [None if ct is None else bind(SILU_VJP, [ins[0], ct], mesh)]


SILU = Primitive("silu", shape_rule=_silu_shape, vjp=_silu_vjp)


def _silu_vjp_shape(avals, mesh):
    _check_float32("silu_vjp", avals)
    return [(_same_local_shapes("silu_vjp", avals, mesh), _F32)]


def _silu_vjp_vjp(cts, ins, outs, mesh):
    """d/d(x, dy) of dy * h(x), h = s (1 + x (1 - s)): (ct dy h'(x), ct h(x)), with
    h'(x) = s (1 - s) (2 + x (1 - 2 s))."""
    ct = cts[0]
    if ct is None:
        return [None, None]
    x, dy = ins
    s = _ew("reciprocal", _ew("add", 1.0, _ew("exp", _ew("negative", x))))
    one_minus = _ew("subtract", 1.0, s)
    h_prime = _ew("multiply", _ew("multiply", s, one_minus),
                  _ew("add", 2.0, _ew("multiply", x, _ew("subtract", one_minus, s))))
    gx = _ew("multiply", _ew("multiply", ct, dy), h_prime)
    gdy = bind(SILU_VJP, [x, ct], mesh)
    return [unbroadcast(gx, x), unbroadcast(gdy, dy)]


SILU_VJP = Primitive("silu_vjp", shape_rule=_silu_vjp_shape, vjp=_silu_vjp_vjp)


# -- swiglu ----------------------------------------------------------------------------------
def _swiglu_shape(avals, mesh):
    _check_float32("swiglu", avals)
    x = avals[0]
    local = tuple(x.shape[mesh.ndim:])
    if not local or local[-1] % 2:
        raise ValueError(f"[swiglu] x has local shape {local}; its last dim must hold [gate | up], an even size")
    return [(tuple(x.shape[:-1]) + (x.shape[-1] // 2,), _F32)]


def _swiglu_vjp(cts, ins, outs, mesh):
    ct = cts[0]
    if ct is None:
        return [None]
    x = ins[0]
    if CTX.tapes:
        # Recorded by an enclosing grad (grad of grad): primitives with their own rules.
        f = x.shape[-1] // 2
        g, u = bind(SPLIT, [x], mesh, axis=x.ndim - 1, sizes=(f, f))
        dg = bind(SILU_VJP, [g, _ew("multiply", ct, u)], mesh)
        du = _ew("multiply", ct, bind(SILU, [g], mesh))
        return [bind(CONCATENATE, [dg, du], mesh, axis=x.ndim - 1)]
    return [bind(SWIGLU_VJP, [x, ct], mesh)]


SWIGLU = Primitive("swiglu", shape_rule=_swiglu_shape, vjp=_swiglu_vjp)


def _swiglu_vjp_shape(avals, mesh):
    _check_float32("swiglu_vjp", avals)
    k = mesh.ndim
    x, dz = avals
    xl, dl = tuple(x.shape[k:]), tuple(dz.shape[k:])
    if not xl or dl != xl[:-1] + (xl[-1] // 2,):
        raise ValueError(f"[swiglu_vjp] x has local shape {xl} and dz {dl}; dz must be x's with half its last dim")
    return [(_mesh_dims(avals, k) + xl, _F32)]


SWIGLU_VJP = Primitive("swiglu_vjp", shape_rule=_swiglu_vjp_shape)


# -- exp_sum ---------------------------------------------------------------------------------
def _exp_sum_shape(avals, mesh):
    _check_float32("exp_sum", avals)
    k = mesh.ndim
    x, shift = avals
    xl, sl = tuple(x.shape[k:]), tuple(shift.shape[k:])
    if not xl or sl != xl[:-1]:
        raise ValueError(f"[exp_sum] x has local shape {xl} and shift {sl}; shift must be x's without the last dim")
    return [(_mesh_dims(avals, k) + xl[:-1], _F32)]


def _exp_sum_vjp(cts, ins, outs, mesh):
    ct = cts[0]
    if ct is None:
        return [None, None]
    x, shift = ins
    if CTX.tapes:
        # Recorded by an enclosing grad (grad of grad): elementwise primitives.
        e = _ew("exp", _ew("subtract", x, _expand_last(shift, mesh)))
        dx = _ew("multiply", _expand_last(ct, mesh), e)
    else:
        dx = bind(EXP_SUM_VJP, [x, shift, ct], mesh)
    dshift = _ew("negative", _ew("multiply", ct, outs[0])) if wanted(shift) else None
    return [unbroadcast(dx, x), None if dshift is None else unbroadcast(dshift, shift)]


def _expand_last(v, mesh):
    return bind(RESHAPE, [v], mesh, local_shape=tuple(v.shape) + (1,))


EXP_SUM = Primitive("exp_sum", shape_rule=_exp_sum_shape, vjp=_exp_sum_vjp)


def _exp_sum_vjp_shape(avals, mesh):
    _check_float32("exp_sum_vjp", avals)
    k = mesh.ndim
    x, shift, ct = avals
    xl, sl, cl = tuple(x.shape[k:]), tuple(shift.shape[k:]), tuple(ct.shape[k:])
    if not xl or sl != xl[:-1] or cl != sl:
        raise ValueError(f"[exp_sum_vjp] x has local shape {xl}, shift {sl} and ct {cl}; shift and ct must be x's "
                         f"without the last dim")
    return [(_mesh_dims(avals, k) + xl, _F32)]


EXP_SUM_VJP = Primitive("exp_sum_vjp", shape_rule=_exp_sum_vjp_shape)


# -- rms_norm --------------------------------------------------------------------------------
def _rms_norm_shape(avals, mesh, *, eps):
    _check_float32("rms_norm", avals)
    k = mesh.ndim
    x, scale = avals
    xl, sl = tuple(x.shape[k:]), tuple(scale.shape[k:])
    if not xl or sl != xl[-1:]:
        raise ValueError(f"[rms_norm] scale has local shape {sl}; it must be ({xl[-1] if xl else '?'},), the "
                         f"last dim of x {xl}")
    dims = _mesh_dims(avals, k)
    return [(dims + xl, _F32), (dims + xl[:-1] + (1,), _F32)]


def _zero_placeholder(ct) -> bool:
    """The backward walk's stand-in for an output nobody used: zeros with stride 0."""
    st = ct.storage
    return isinstance(st, np.ndarray) and st.size > 0 and not any(st.strides) and not st.flat[0]


def _rms_norm_vjp(cts, ins, outs, mesh, *, eps):
    ct, ct_rstd = cts
    x, scale = ins
    rstd = outs[1]
    dx_rstd = None
    if ct_rstd is not None and not _zero_placeholder(ct_rstd):
        # rstd used downstream (by a grad of grad's backward): d rstd / dx = -rstd³ x / C
        r3 = _ew("multiply", rstd, _ew("multiply", rstd, rstd))
        dx_rstd = _ew("multiply", _ew("multiply", ct_rstd, r3), _ew("divide", x, -float(x.shape[-1])))
    if ct is None:
        return [None if dx_rstd is None else unbroadcast(dx_rstd, x), None]
    if CTX.tapes:
        # An enclosing grad records this backward (grad of grad): elementwise primitives, whose
        # own rules it can differentiate.
        g = _ew("multiply", ct, scale)
        n = float(x.shape[-1])
        dot = _ew("divide", bind(REDUCE_SUM, [_ew("multiply", x, g)], mesh, axes=(x.ndim - 1,), keepdims=True), n)
        r3 = _ew("multiply", rstd, _ew("multiply", rstd, rstd))
        dx = _ew("subtract", _ew("multiply", rstd, g), _ew("multiply", x, _ew("multiply", r3, dot)))
        dscale = _ew("multiply", ct, _ew("multiply", x, rstd))
    else:
        dx, dscale = bind(RMS_NORM_VJP, [x, scale, rstd, ct], mesh)
    if dx_rstd is not None:
        dx = _ew("add", dx, dx_rstd)
    return [unbroadcast(dx, x), unbroadcast(dscale, scale)]


RMS_NORM = Primitive("rms_norm", shape_rule=_rms_norm_shape, vjp=_rms_norm_vjp, multiple_results=True)


def _rms_norm_vjp_shape(avals, mesh):
    _check_float32("rms_norm_vjp", avals)
    k = mesh.ndim
    x, scale, _, ct = avals
    if tuple(ct.shape[k:]) != tuple(x.shape[k:]):
        raise ValueError(f"[rms_norm_vjp] the cotangent has local shape {tuple(ct.shape[k:])}, x {tuple(x.shape[k:])}")
    dims = _mesh_dims(avals, k)
    return [(dims + tuple(x.shape[k:]), _F32), (dims + tuple(scale.shape[k:]), _F32)]


RMS_NORM_VJP = Primitive("rms_norm_vjp", shape_rule=_rms_norm_vjp_shape, multiple_results=True)


# -- rotary_embedding ------------------------------------------------------------------------
def check_rotary_shapes(x: tuple, cos: tuple, sin: tuple) -> None:
    """Raises unless local shapes x ``[..., T, heads, head_dim]`` and cos, sin ``[T, half]``
    with ``2·half <= head_dim`` fit together (shared with ``shardlab.nn.rotary_embedding``)."""
    if len(x) < 3 or len(cos) != 2 or sin != cos or cos[0] != x[-3] or 2 * cos[1] > x[-1]:
        raise ValueError(f"[rotary_embedding] x has local shape {x} ([..., T, heads, head_dim]) and cos, sin "
                         f"{cos} and {sin}; they must be [T, half] with 2·half <= head_dim")


def _rotary_shape(avals, mesh, *, inverse):
    _check_float32("rotary_embedding", avals)
    k = mesh.ndim
    x, cos, sin = (tuple(a.shape[k:]) for a in avals)
    check_rotary_shapes(x, cos, sin)
    return [(_mesh_dims(avals, k) + x, _F32)]


def _rotary_vjp(cts, ins, outs, mesh, *, inverse):
    x, cos, sin = ins
    wanted = CTX.wanted or ()
    if id(cos) in wanted or id(sin) in wanted:
        raise NotImplementedError("[grad] rotary_embedding is not differentiable with respect to its cos and sin "
                                  "tables; compute them outside the differentiated function")
    ct = bind(ROTARY_EMBEDDING, [cts[0], cos, sin], mesh, inverse=not inverse)
    return [unbroadcast(ct, x), None, None]


ROTARY_EMBEDDING = Primitive("rotary_embedding", shape_rule=_rotary_shape, vjp=_rotary_vjp)


# -- adamw -----------------------------------------------------------------------------------
def _adamw_shape(avals, mesh, **_):
    _check_float32("adamw_update", avals)
    shape = _same_local_shapes("adamw_update", avals, mesh)
    return [(shape, _F32)] * 3


ADAMW_UPDATE = Primitive("adamw_update", shape_rule=_adamw_shape, multiple_results=True)
