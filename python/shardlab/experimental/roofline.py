"""``shardlab.experimental.roofline``, as ``jax.experimental.roofline``: FLOPs, HBM bytes and
ICI bytes per mesh axis of one device's program, and what they cost in seconds.

``roofline(f, mesh, in_specs, out_specs)(*args)`` wraps `f` in ``shard_map`` (when all three
are given), records its program shape-only (``jit(f).trace``: arrays or ShapeDtypeStructs,
abstract meshes of any size) and sums JAX's per-primitive roofline rules over it:
``flops`` / ``hbm_bytes`` count the matmuls (what stays when the elementwise work fuses
into them), ``unfused_flops`` / ``unfused_hbm_bytes`` every op, ``ici_bytes`` /
``ici_latency`` the collectives per mesh axis (JAX's ring formulas), ``peak_hbm_bytes`` the
most bytes live at once. On a mesh with hardware the result is also priced with shardlab's
cost model: ``flops_seconds`` (matmul FLOPs at the chip's peak for their dtype),
``hbm_seconds``, ``ici_seconds`` per axis (the link-level collective model), ``seconds``
(the largest, as perfect overlap would give) and ``bound``.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> from shardlab.experimental import roofline
    >>> mesh = sl.make_mesh((4, 2), ("x", "y"), hardware="tpu-v5e")
    >>> a = sl.ShapeDtypeStruct((64, 32), np.float32, sharding=sl.NamedSharding(mesh, P("x", "y")))
    >>> b = sl.ShapeDtypeStruct((32, 16), np.float32, sharding=sl.NamedSharding(mesh, P("y", None)))
    >>> out, r = roofline.roofline(lambda a, b: sl.lax.psum(a @ b, "y"), mesh=mesh,
    ...                            in_specs=(P("x", "y"), P("y", None)), out_specs=P("x", None))(a, b)
    >>> out.shape, r.flops, r.ici_bytes, r.hbm_bytes, r.bound
    ((64, 16), 8192, {'y': 1024}, 3072, 'communication')
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .._src.arrays.local_array import LocalArray
from .._src.arrays.sharded_array import ShardedArray, abstract_array
from .._src.arrays.storage import AbstractStorage
from .._src.core import tree
from .._src.core.dtypes import bfloat16
from .._src.core.sharding import NamedSharding
from .._src.cost import model as _cost
from .._src.transforms import program as _prog
from .._src.transforms.autodiff import vjp as _vjp
from .._src.transforms.eval_shape import ShapeDtypeStruct
from .._src.transforms.jit import jit
from .._src.transforms.shard_map import shard_map

__all__ = ["RooflineRuleContext", "RooflineShape", "RooflineResult", "roofline", "roofline_and_grad",
           "register_roofline", "register_standard_roofline"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RooflineRuleContext:
    """What a rule sees besides its operands (JAX's fields; ``primitive`` is shardlab's name)."""

    name_stack: str
    primitive: str
    avals_in: list
    avals_out: list
    jaxpr_eqn_ctx: Any
    mesh: Any
    pin_lhs_in_vmem: bool
    pin_rhs_in_vmem: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class RooflineShape:
    """Shape and dtype of one operand (per device)."""

    shape: tuple
    dtype: Any

    @classmethod
    def from_aval(cls, aval) -> "RooflineShape":
        return cls(shape=tuple(aval.shape), dtype=np.dtype(aval.dtype))

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def bytes(self) -> int:
        return int(self.size * np.dtype(self.dtype).itemsize)

    @classmethod
    def total_bytes(cls, avals) -> int:
        return sum(cls.from_aval(a).bytes for a in avals)


def _merge(d1: dict, d2: dict) -> dict:
    return {k: d1.get(k, 0) + d2.get(k, 0) for k in sorted(set(d1) | set(d2))}


@dataclass(frozen=True, slots=True, kw_only=True)
class RooflineResult:
    """JAX's RooflineResult fields (per device), plus their price on the mesh's hardware
    (``None`` / empty where the mesh has none)."""

    flops: int = 0
    unfused_flops: int = 0
    ici_bytes: dict = field(default_factory=dict)
    ici_latency: dict = field(default_factory=dict)
    hbm_bytes: int = 0
    peak_hbm_bytes: int = 0
    unfused_hbm_bytes: int = 0
    hardware: str | None = None
    flops_seconds: float | None = None
    hbm_seconds: float | None = None
    ici_seconds: dict = field(default_factory=dict)

    @classmethod
    def zeros(cls) -> "RooflineResult":
        return cls()

    @property
    def seconds(self) -> float | None:
        """The largest of compute, HBM and communication time (perfect overlap)."""
        if self.hardware is None:
            return None
        return max(self.flops_seconds or 0.0, self.hbm_seconds or 0.0, sum(self.ici_seconds.values()))

    @property
    def bound(self) -> str | None:
        """'compute', 'memory' or 'communication': the largest term of ``seconds``."""
        if self.hardware is None:
            return None
        terms = {"compute": self.flops_seconds or 0.0, "memory": self.hbm_seconds or 0.0,
                 "communication": sum(self.ici_seconds.values())}
        return max(terms, key=terms.get) if any(terms.values()) else "compute"

    def __add__(self, other: "RooflineResult") -> "RooflineResult":
        def add(a, b):
            return None if a is None and b is None else (a or 0.0) + (b or 0.0)

        return RooflineResult(
            flops=self.flops + other.flops, unfused_flops=self.unfused_flops + other.unfused_flops,
            ici_bytes=_merge(self.ici_bytes, other.ici_bytes), ici_latency=_merge(self.ici_latency, other.ici_latency),
            hbm_bytes=self.hbm_bytes + other.hbm_bytes, peak_hbm_bytes=max(self.peak_hbm_bytes, other.peak_hbm_bytes),
            unfused_hbm_bytes=self.unfused_hbm_bytes + other.unfused_hbm_bytes,
            hardware=self.hardware or other.hardware, flops_seconds=add(self.flops_seconds, other.flops_seconds),
            hbm_seconds=add(self.hbm_seconds, other.hbm_seconds), ici_seconds=_merge(self.ici_seconds, other.ici_seconds))

    def __mul__(self, constant) -> "RooflineResult":
        def mul(a):
            return None if a is None else a * constant

        return RooflineResult(
            flops=int(self.flops * constant), unfused_flops=int(self.unfused_flops * constant),
            ici_bytes={k: int(v * constant) for k, v in self.ici_bytes.items()},
            ici_latency={k: int(v * constant) for k, v in self.ici_latency.items()},
            hbm_bytes=int(self.hbm_bytes * constant), peak_hbm_bytes=int(self.peak_hbm_bytes * constant),
            unfused_hbm_bytes=int(self.unfused_hbm_bytes * constant), hardware=self.hardware,
            flops_seconds=mul(self.flops_seconds), hbm_seconds=mul(self.hbm_seconds),
            ici_seconds={k: v * constant for k, v in self.ici_seconds.items()})

    __rmul__ = __mul__


# -- rules (JAX's jax/experimental/roofline/rooflines.py, keyed by shardlab's primitive names) ---------
_rooflines: dict = {}


def register_roofline(prim):
    """Registers ``rule(ctx, *operands: RooflineShape, **params) -> RooflineResult`` for a
    primitive (a shardlab Primitive or its name)."""
    name = prim if isinstance(prim, str) else prim.name

    def register(rule):
        _rooflines[name] = rule
        return rule

    return register


def register_standard_roofline(prim) -> None:
    """Registers a rule that counts nothing (ops that move no data through HBM of their own)."""
    _rooflines[prim if isinstance(prim, str) else prim.name] = lambda ctx, *args, **kw: RooflineResult.zeros()


def _unary(ctx, *args, **kw):
    x, out = (RooflineShape.from_aval(a) for a in (ctx.avals_in[0], ctx.avals_out[0]))
    return RooflineResult(unfused_flops=x.size, unfused_hbm_bytes=x.bytes + out.bytes)


def _binary(ctx, *args, **kw):
    lhs, rhs = (RooflineShape.from_aval(a) for a in ctx.avals_in[:2])
    out = RooflineShape.from_aval(ctx.avals_out[0])
    shape = [max(a, b) for a, b in itertools.zip_longest(lhs.shape[::-1], rhs.shape[::-1], fillvalue=1)]
    return RooflineResult(unfused_flops=int(np.prod(shape)), unfused_hbm_bytes=lhs.bytes + rhs.bytes + out.bytes)


def _dot(ctx, *args, **kw):
    ins = [RooflineShape.from_aval(a) for a in ctx.avals_in]
    out = RooflineShape.from_aval(ctx.avals_out[0])
    flops = int(kw["_event"].flops) if kw.get("_event") is not None else 0
    hbm = 0
    if not ctx.pin_lhs_in_vmem:
        hbm += ins[0].bytes + out.bytes
    if not ctx.pin_rhs_in_vmem:
        hbm += sum(s.bytes for s in ins[1:])
    return RooflineResult(flops=flops, unfused_flops=flops, hbm_bytes=hbm, unfused_hbm_bytes=hbm)


def _reduce(ctx, *args, axes=(), **kw):
    x = RooflineShape.from_aval(ctx.avals_in[0])
    axes = tuple(a % len(x.shape) for a in axes) if x.shape else ()
    domain = int(np.prod([x.shape[i] for i in axes]))
    result = int(np.prod([s for i, s in enumerate(x.shape) if i not in axes]))
    return RooflineResult(unfused_flops=int((domain - 1) * result),
                          unfused_hbm_bytes=int(np.dtype(x.dtype).itemsize * (x.size + result)))


def _cumulative(ctx, *args, axis=0, **kw):
    x, out = (RooflineShape.from_aval(a) for a in (ctx.avals_in[0], ctx.avals_out[0]))
    return RooflineResult(unfused_flops=x.shape[axis] if x.shape else 1, unfused_hbm_bytes=x.bytes + out.bytes)


def _select(ctx, *args, **kw):
    x, out = (RooflineShape.from_aval(a) for a in (ctx.avals_in[0], ctx.avals_out[0]))
    return RooflineResult(unfused_flops=out.size, unfused_hbm_bytes=x.bytes + out.bytes)


def _zeros_if_one(ctx, axes):
    if math.prod(ctx.mesh.shape[a] for a in axes) > 1:
        return None
    return RooflineResult(ici_bytes={a: 0 for a in axes}, ici_latency={a: 0 for a in axes})


def _ring(ctx, axes, shard_bytes, is_reduce: bool):
    if (zero := _zeros_if_one(ctx, axes)) is not None:
        return zero
    mesh = ctx.mesh.shape
    current = shard_bytes / math.prod(mesh[a] for a in axes) if is_reduce else shard_bytes
    ordered = sorted(axes, key=lambda a: mesh[a], reverse=True)
    current //= len(ordered)
    ici = 0
    for a in ordered:
        ici += current * (mesh[a] - 1)
        current *= mesh[a]
    latency = mesh[ordered[0]] * len(ordered)
    return RooflineResult(ici_bytes={a: int(ici) for a in ordered}, ici_latency={a: int(latency) for a in ordered})


def _all_gather(ctx, *args, axes, **kw):
    return _ring(ctx, tuple(axes), RooflineShape.total_bytes(ctx.avals_in), False)


def _psum_scatter(ctx, *args, axes, **kw):
    return _ring(ctx, tuple(axes), RooflineShape.total_bytes(ctx.avals_in), True)


def _psum(ctx, *args, axes, reduction="sum", **kw):
    axes = tuple(axes)
    if reduction in ("max", "min"):  # JAX counts one element per device for pmax / pmin
        return _ring(ctx, axes, np.dtype(ctx.avals_in[0].dtype).itemsize, False)
    ring = _ring(ctx, axes, RooflineShape.total_bytes(ctx.avals_in), True)
    return RooflineResult(ici_bytes={k: 2 * v for k, v in ring.ici_bytes.items()},
                          ici_latency={k: 2 * v for k, v in ring.ici_latency.items()})


def _all_to_all(ctx, *args, axes, **kw):
    axes = tuple(axes)
    if (zero := _zeros_if_one(ctx, axes)) is not None:
        return zero
    mesh = ctx.mesh.shape
    size = RooflineShape.total_bytes(ctx.avals_in) * math.prod(mesh[a] for a in axes)
    smallest = sorted(axes, key=lambda a: mesh[a])[0]
    bisection = mesh[smallest] ** (len(axes) - 1)
    if mesh[smallest] > 2:
        bisection *= 2  # wraparound
    ici = size / 2 / bisection
    latency = sum(mesh[a] / 2 for a in axes)
    return RooflineResult(ici_bytes={a: int(ici) for a in axes}, ici_latency={a: int(latency) for a in axes})


def _ppermute(ctx, *args, axes, perm=(), **kw):
    axes = tuple(axes)
    if (zero := _zeros_if_one(ctx, axes)) is not None:
        return zero
    dims = [ctx.mesh.shape.get(a, 1) for a in axes]
    shard = RooflineShape.total_bytes(ctx.avals_in)
    contention: dict = defaultdict(float)
    latency = 0
    for src, dst in perm or ():
        if src == dst:
            continue
        s, d = (tuple(int(i) for i in np.unravel_index(v, dims)) for v in (src, dst))
        hops = 0
        for i, n in enumerate(dims):
            if s[i] == d[i]:
                continue
            cw, ccw = (d[i] - s[i]) % n, (s[i] - d[i]) % n
            step = 1 if cw <= ccw else -1
            pos = s[i]
            while pos != d[i]:
                here = s[:i] + (pos,) + s[i + 1:]
                nxt = (pos + step) % n
                there = s[:i] + (nxt,) + s[i + 1:]
                contention[tuple(sorted([here, there]))] += 1
                pos = nxt
            hops += min(cw, ccw)
        latency = max(latency, hops)
    ici = shard * max(contention.values(), default=0)
    return RooflineResult(ici_bytes={a: int(ici) for a in axes}, ici_latency={a: int(latency) for a in axes})


def _fused(ctx, *args, **kw):
    out = sum(RooflineShape.from_aval(a).size for a in ctx.avals_out)
    nbytes = RooflineShape.total_bytes(ctx.avals_in) + RooflineShape.total_bytes(ctx.avals_out)
    return RooflineResult(unfused_flops=out, unfused_hbm_bytes=nbytes)


for _name in ("absolute", "fabs", "arccos", "arcsin", "arctan", "cbrt", "ceil", "conjugate", "cos", "cosh", "exp",
              "expm1", "floor", "isfinite", "log", "log1p", "negative", "logical_not", "invert", "rint", "sign",
              "sin", "sinh", "sqrt", "square", "tan", "erf", "tanh", "exp2", "log2", "log10", "reciprocal",
              "arcsinh", "arccosh", "arctanh", "trunc"):
    _rooflines[_name] = _unary
for _name in ("add", "subtract", "multiply", "divide", "remainder", "bitwise_and", "bitwise_or", "bitwise_xor",
              "logical_and", "logical_or", "logical_xor", "greater", "less", "greater_equal", "less_equal", "equal",
              "not_equal", "minimum", "maximum", "power", "arctan2", "floor_divide", "fmax", "fmin", "hypot"):
    _rooflines[_name] = _binary
for _name in ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_any", "reduce_all", "argmax",
              "argmin"):
    _rooflines[_name] = _reduce
for _name in ("rms_norm", "rms_norm_vjp", "swiglu", "swiglu_vjp", "silu", "silu_vjp", "rotary_embedding", "exp_sum",
              "exp_sum_vjp", "adamw_update", "where_positive"):
    _rooflines[_name] = _fused
_rooflines.update({"einsum": _dot, "attention": _dot, "attention_vjp": _dot, "cumsum": _cumulative,
                   "select": _select, "all_gather": _all_gather, "psum_scatter": _psum_scatter, "psum": _psum,
                   "all_to_all": _all_to_all, "ppermute": _ppermute})


# -- the interpreter --------------------------------------------------------------------------------
def _price(program, mesh, result: RooflineResult) -> RooflineResult:
    """Adds the seconds of the recorded events on the mesh's hardware."""
    hw = getattr(mesh, "hardware", None) if mesh is not None else None
    if hw is None:
        return result
    t_math = 0.0
    ici: dict = {}
    for eqn in program.eqns:
        e = eqn.event
        if e is None:
            continue
        if e.axes:
            s = e.seconds if e.seconds is not None else _cost.event_seconds(e.as_dict(), mesh)
            for a in e.axes:
                ici[a] = ici.get(a, 0.0) + s / len(e.axes)
        elif eqn.prim in ("einsum", "attention", "attention_vjp"):
            t_math += e.flops / _cost.peak_flops(hw, e.dtype)[0]
    return dataclasses.replace(result, hardware=hw.name, flops_seconds=t_math,
                               hbm_seconds=result.hbm_bytes / hw.hbm_bandwidth, ici_seconds=ici)


def _interpret(program, mesh, pin_lhs_in_vmem: bool, pin_rhs_in_vmem: bool, backward_only: bool = False
               ) -> RooflineResult:
    result = RooflineResult.zeros()
    eqns = [e for e in program.eqns if not e.prim.startswith("shard_map_")]
    if backward_only:  # JAX costs the transposed shard_map body only
        eqns = [e for e in eqns if e.phase == "backward"]
    last: dict = {}
    defined = {id(v.resolve()) for e in eqns for v in e.outvars}
    inputs: dict = {} if backward_only else {id(v.resolve()): v.resolve()
                                               for v in list(program.constvars) + list(program.invars)}
    for eqn in eqns:
        for v in eqn.invars:
            if isinstance(v, _prog.Var):
                r = v.resolve()
                last[id(r)] = eqn
                if id(r) not in defined:
                    inputs.setdefault(id(r), r)  # what the body reads from outside: live from the start
    live = {k: r.aval.nbytes for k, r in inputs.items()}
    current = sum(live.values())
    peak = current
    for eqn in eqns:
        rule = _rooflines.get(eqn.prim)
        if rule is not None:
            avals_in = [v.resolve().aval for v in eqn.invars]
            avals_out = [v.resolve().aval for v in eqn.outvars]
            ctx = RooflineRuleContext(name_stack="", primitive=eqn.prim, avals_in=avals_in, avals_out=avals_out,
                                      jaxpr_eqn_ctx=None, mesh=eqn.mesh if eqn.mesh is not None else mesh,
                                      pin_lhs_in_vmem=pin_lhs_in_vmem, pin_rhs_in_vmem=pin_rhs_in_vmem)
            params = dict(eqn.params)
            if rule is _dot:
                params["_event"] = eqn.event
            result = result + rule(ctx, *[RooflineShape.from_aval(a) for a in avals_in], **params)
        for v in eqn.outvars:
            r = v.resolve()
            if id(r) not in live:
                live[id(r)] = r.aval.nbytes
                current += r.aval.nbytes
        for v in {id(v.resolve()): v for v in eqn.invars if isinstance(v, _prog.Var)}.values():
            r = v.resolve()
            if last.get(id(r)) is eqn and id(r) in live:
                current -= live.pop(id(r))
        peak = max(peak, current)
    result = result + RooflineResult(peak_hbm_bytes=peak)
    return _price(program, mesh if mesh is not None else program.mesh, result)


def _bf16_cotangent(x):
    if isinstance(x, ShardedArray):
        return abstract_array(x.shape, bfloat16, x.sharding) if x.is_abstract else \
            x.astype(bfloat16) if hasattr(x, "astype") else x
    if isinstance(x, LocalArray):
        return LocalArray(AbstractStorage(x.storage.shape, bfloat16), x.mesh)
    return np.asarray(x).astype(bfloat16)


def _f_with_vjp(f: Callable):
    def wrapped(*args):
        primals, f_vjp = _vjp(f, *args)
        leaves, treedef = tree.flatten(primals, lambda v: isinstance(v, (ShardedArray, LocalArray)))
        return f_vjp(tree.unflatten(treedef, [_bf16_cotangent(v) for v in leaves]))

    return wrapped


def roofline(f: Callable, mesh=None, in_specs=None, out_specs=None, *, pin_lhs_in_vmem: bool = False,
             pin_rhs_in_vmem: bool = False, vjp: bool = False, print_jaxpr: bool = False):
    """``jax.experimental.roofline.roofline``: returns a function of `f`'s arguments (arrays or
    ShapeDtypeStructs) giving ``(output ShapeDtypeStructs, RooflineResult)``.

    With `mesh`, `in_specs` and `out_specs`, `f` runs under ``shard_map`` and the result is one
    device's; ``vjp=True`` costs the backward pass alone (bfloat16 cotangents, as JAX);
    ``pin_lhs_in_vmem`` / ``pin_rhs_in_vmem`` leave a matmul's left (with its output) or right
    operand out of the HBM bytes.
    """

    def wrapped(*args):
        wrapped_f = f
        if in_specs is not None and out_specs is not None and mesh is not None:
            wrapped_f = shard_map(wrapped_f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
        if vjp:
            wrapped_f = _f_with_vjp(wrapped_f)
        traced = jit(wrapped_f).trace(*args)
        out_shapes = traced.out_info
        if out_specs is not None and mesh is not None and not vjp:
            leaves, treedef = tree.flatten(out_shapes, lambda v: isinstance(v, ShapeDtypeStruct))
            specs = tree.broadcast_prefix(out_specs, out_shapes, lambda s: s is None or type(s).__name__ ==
                                          "PartitionSpec", "out_specs")
            out_shapes = tree.unflatten(treedef, [ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, p))
                                                  for s, p in zip(leaves, specs)])
        if print_jaxpr:
            print(traced.jaxpr)
        return out_shapes, _interpret(traced.program, mesh, pin_lhs_in_vmem, pin_rhs_in_vmem, backward_only=vjp)

    wrapped.__name__ = getattr(f, "__name__", "roofline")
    return wrapped


def roofline_and_grad(f: Callable, mesh, in_specs, out_specs, *, pin_lhs_in_vmem: bool = False,
                      pin_rhs_in_vmem: bool = False, print_jaxpr: bool = False):
    """``(output shapes, forward RooflineResult, backward RooflineResult)``; the backward pass
    runs on bfloat16 arguments (int32 kept), as JAX's does."""

    def wrapped(*args):
        shapes, fwd = roofline(f, mesh, in_specs, out_specs, pin_lhs_in_vmem=pin_lhs_in_vmem,
                               pin_rhs_in_vmem=pin_rhs_in_vmem, print_jaxpr=print_jaxpr)(*args)
        leaves, treedef = tree.flatten(args, lambda v: isinstance(v, (ShapeDtypeStruct, ShardedArray, np.ndarray)))
        bf = [ShapeDtypeStruct(np.shape(x), np.int32 if np.dtype(x.dtype) == np.int32 else bfloat16,
                               sharding=getattr(x, "sharding", None)) for x in leaves]
        _, bwd = roofline(f, mesh, in_specs, out_specs, pin_lhs_in_vmem=pin_lhs_in_vmem,
                          pin_rhs_in_vmem=pin_rhs_in_vmem, vjp=True, print_jaxpr=print_jaxpr)(
            *tree.unflatten(treedef, bf))
        return shapes, fwd, bwd

    return wrapped
