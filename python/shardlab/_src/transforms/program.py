"""The program ``jit`` lowers to: recorded binds, and what is printed and counted from them.

shardlab has no compiler. ``jit(f).trace(*args)`` runs `f` once shape-only (as ``eval_shape``
does: arrays and ``ShapeDtypeStruct``s become abstract values, on meshes of any size) while a
:class:`Recorder` on the context sees every primitive ``bind`` and every ``shard_map``
boundary. The result is a small flat :class:`Program`: one equation per primitive (compute
and collectives alike), with per-device shapes, the mesh axes each value varies along and,
where a value is a global array (the arguments, the results, a shard_map's boundary), its
global shape and sharding. That is what ``.as_text()`` prints (in the form of XLA's
partitioned HLO), ``.cost_analysis()`` sums (XLA's keys and counting rules),
``.memory_analysis()`` measures (live bytes per device) and ``make_jaxpr`` shows. The stages
that carry it (``Traced``, ``Lowered``, ``Compiled``) are in ``lowered.py``.

Example:
    >>> import numpy as np, shardlab as sl
    >>> import shardlab.numpy as jnp
    >>> lowered = sl.jit(lambda a, b: jnp.tanh(a @ b)).lower(np.ones((8, 16), np.float32),
    ...                                                       np.ones((16, 4), np.float32))
    >>> lowered.cost_analysis()["flops"], lowered.cost_analysis()["transcendentals"]
    (1024.0, 32.0)
    >>> print(lowered.as_text())  # doctest: +NORMALIZE_WHITESPACE
    HloModule jit__lambda_, entry_computation_layout={(f32[8,16], f32[16,4])->f32[8,4]}
    <BLANKLINE>
    ENTRY %main (p0: f32[8,16], p1: f32[16,4]) -> f32[8,4] {
      %p0 = f32[8,16] parameter(0)
      %p1 = f32[16,4] parameter(1)
      %0 = f32[8,4] dot(%p0, %p1), einsum="mk,kn->mn", op_name="einsum"  // 1.02 kFLOP
      ROOT %1 = f32[8,4] tanh(%0)
    }
"""

from __future__ import annotations

import math

import numpy as np

from ..arrays.local_array import LocalArray
from ..arrays.sharded_array import ShardedArray
from ..arrays.storage import is_abstract
from ..core import tree, units
from ..core.context import CTX
from ..core.mesh import UNIT_MESH
from ..core.sharding import NamedSharding

# -- types -----------------------------------------------------------------------------------------

_SHORT = {"bool": "bool", "bfloat16": "bf16"}


def short_dtype(dtype) -> str:
    """JAX's short dtype name: f32, bf16, i32, u8, bool."""
    name = np.dtype(dtype).name
    if name in _SHORT:
        return _SHORT[name]
    for long, short in (("complex", "c"), ("float", "f"), ("uint", "u"), ("int", "i")):
        if name.startswith(long):
            return short + name[len(long):]
    return name


def _axes_str(axes) -> str:
    return axes[0] if len(axes) == 1 else "(" + ",".join(axes) + ")"


class Aval:
    """A value's type in the program: its per-device shape and dtype, the mesh axes it varies
    along (JAX's ``{V:...}``) and, for a global array, its global shape and sharding."""

    __slots__ = ("shape", "dtype", "mesh", "varying", "global_shape", "sharding", "unreduced")

    def __init__(self, shape, dtype, mesh=None, varying=(), global_shape=None, sharding=None, unreduced=()):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.mesh = mesh
        self.varying = tuple(varying)
        self.global_shape = None if global_shape is None else tuple(int(s) for s in global_shape)
        self.sharding = sharding
        self.unreduced = tuple(sorted(unreduced))

    @classmethod
    def of(cls, x) -> "Aval":
        if isinstance(x, ShardedArray):
            s = x.sharding
            mesh = s.mesh
            st = x._storage.shape
            varying = tuple(n for n, d in zip(mesh.axis_names, st[:mesh.ndim]) if d != 1)
            return cls(st[mesh.ndim:], x.dtype, mesh, varying, x.shape, s, x.unreduced)
        if isinstance(x, LocalArray):
            mesh = x.mesh
            st = x.storage.shape
            k = mesh.ndim
            if mesh is UNIT_MESH or k == 0:
                return cls(st[k:], x.dtype, None, (), st[k:])
            return cls(st[k:], x.dtype, mesh, tuple(n for n, d in zip(mesh.axis_names, st[:k]) if d != 1))
        arr = np.asarray(x)
        return cls(arr.shape, arr.dtype, None, (), arr.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes one device holds."""
        return self.size * self.dtype.itemsize

    def str_short(self) -> str:
        """The per-device type, as a jaxpr prints it inside shard_map: ``f32[2,4]{V:x}``."""
        v = "{V:" + _axes_str(self.varying) + "}" if self.varying else ""
        return f"{short_dtype(self.dtype)}[{','.join(map(str, self.shape))}]{v}"

    def str_global(self) -> str:
        """The global type in the book's notation (``f32[8@x,4]``), or the per-device one."""
        if self.global_shape is None:
            return self.str_short()
        dims = []
        spec = self.sharding.spec.normalized(len(self.global_shape)) if self.sharding is not None else \
            ((),) * len(self.global_shape)
        for d, axes in zip(self.global_shape, spec):
            dims.append(f"{d}@{_axes_str(tuple(axes))}" if axes else str(d))
        u = "{U:" + _axes_str(self.unreduced) + "}" if self.unreduced else ""
        return f"{short_dtype(self.dtype)}[{','.join(dims)}]{u}"

    def struct(self):
        """A ShapeDtypeStruct of the global value (per-device where no global type is known)."""
        from .eval_shape import ShapeDtypeStruct

        return ShapeDtypeStruct(self.global_shape if self.global_shape is not None else self.shape, self.dtype,
                                sharding=self.sharding)

    def __repr__(self):
        return f"Aval({self.str_global()})"


class Var:
    """A value of the program. ``alias`` points at the value it is the same buffer as (a global
    array entering shard_map with its own sharding is its per-device shard: nothing moves)."""

    __slots__ = ("aval", "alias", "kind", "index")

    def __init__(self, aval: Aval, kind: str = "value", index: int | None = None):
        self.aval = aval
        self.alias = None
        self.kind = kind  # 'param', 'value', 'const'
        self.index = index

    def resolve(self) -> "Var":
        v = self
        while v.alias is not None:
            v = v.alias
        return v

    def __repr__(self):
        return f"Var({self.aval.str_short()})"


class Literal:
    """A scalar constant operand (``2.0:f32[]``)."""

    __slots__ = ("value", "aval")

    def __init__(self, value):
        arr = np.asarray(value)
        self.value = arr.reshape(()) if arr.size == 1 else arr
        self.aval = Aval(self.value.shape, arr.dtype)

    def resolve(self):
        return self

    def weak(self, dtype) -> None:
        """A Python number takes the dtype of the array it meets, as JAX's weak types do."""
        from ..core.dtypes import default_float_dtype, default_int_dtype

        kind = self.value.dtype.kind
        if dtype is not None and (np.dtype(dtype).kind in "fc" or kind in "iub"):
            self.aval = Aval((), dtype if not (kind == "f" and np.dtype(dtype).kind in "iub") else
                             default_float_dtype())
        else:
            self.aval = Aval((), default_float_dtype() if kind == "f" else default_int_dtype()
                             if kind in "iu" else self.value.dtype)
        self.value = self.value.astype(self.aval.dtype)

    def __repr__(self):
        v = self.value.item() if self.value.ndim == 0 else self.value
        return f"{v!r}:{self.aval.str_short()}"


class Eqn:
    """One step: a primitive bind (``prim`` its name) or a shard_map boundary that moves data
    on the host ('shard_map_enter' / 'shard_map_exit': recorded in no ledger)."""

    __slots__ = ("prim", "params", "invars", "outvars", "mesh", "event", "primitive")

    def __init__(self, prim: str, params: dict, invars, outvars, mesh, event=None, primitive=None):
        self.prim = prim
        self.params = params
        self.invars = list(invars)
        self.outvars = list(outvars)
        self.mesh = mesh
        self.event = event
        self.primitive = primitive

    def __repr__(self):
        return f"Eqn({self.prim})"


class Program:
    """The recorded program: parameters, constants, equations and results (flat).

    ``in_tree`` / ``out_tree`` give the pytree structure of ``(args, kwargs)`` and of the
    result; ``out_literals`` holds results that are not arrays of the program (Python numbers).
    """

    def __init__(self, name: str, invars, constvars, consts, eqns, outvars, meshes):
        self.name = name
        self.invars = list(invars)
        self.constvars = list(constvars)
        self.consts = list(consts)
        self.eqns = list(eqns)
        self.outvars = list(outvars)
        self.meshes = list(meshes)

    @property
    def mesh(self):
        """The program's mesh (the first one any value lives on), or None."""
        return self.meshes[0] if self.meshes else None

    @property
    def in_avals(self) -> list:
        return [v.aval for v in self.invars]

    @property
    def out_avals(self) -> list:
        return [v.aval for v in self.outvars]

    def as_text(self) -> str:
        return hlo_text(self)

    def __str__(self):
        return hlo_text(self)


# -- the recorder ----------------------------------------------------------------------------------
def _is_array(x) -> bool:
    return isinstance(x, (LocalArray, ShardedArray))


class Recorder:
    """Sees every bind and shard_map boundary while active (``with Recorder() as r:``)."""

    def __init__(self):
        self.eqns: list = []
        self.env: dict = {}      # id(value) -> Var
        self.keep: list = []     # the values behind env's ids, kept alive so the ids stay unique
        self.consts: list = []   # (Var, value) of arrays the program captured
        self.frames: list = []   # eqn index where each running shard_map body began
        self.meshes: list = []
        self.events: list = []

    def __enter__(self):
        CTX.recorders.append(self)
        return self

    def __exit__(self, *exc):
        CTX.recorders.remove(self)
        return False

    # -- values --------------------------------------------------------------------------------
    def _note_mesh(self, mesh) -> None:
        if mesh is not None and mesh is not UNIT_MESH and mesh.ndim and mesh not in self.meshes:
            self.meshes.append(mesh)

    def define(self, value, var: Var) -> Var:
        self.env[id(value)] = var
        self.keep.append(value)
        self._note_mesh(var.aval.mesh)
        return var

    def param(self, value, index: int) -> Var:
        return self.define(value, Var(Aval.of(value), "param", index))

    def read(self, x):
        """The Var of operand `x` (a captured array becomes a constant), or a Literal."""
        if _is_array(x):
            v = self.env.get(id(x))
            if v is not None:
                return v
            aval = Aval.of(x)
            st = x._storage if isinstance(x, ShardedArray) else x.storage
            if aval.size == 1 and not aval.varying and not is_abstract(st) and aval.global_shape is not None \
                    or (isinstance(x, LocalArray) and not aval.varying and aval.size == 1 and not is_abstract(st)):
                return Literal(np.asarray(st).reshape(()))
            if is_abstract(st):  # made by a transform's rule without a bind (a view, a cotangent seed)
                return self.define(x, Var(aval, "host"))
            v = self.define(x, Var(aval, "const"))
            self.consts.append((v, x))
            return v
        arr = np.asarray(x)
        if arr.size == 1:
            return Literal(arr)
        v = Var(Aval.of(arr), "const")
        self.consts.append((v, arr))
        self.keep.append(arr)
        return v

    # -- hooks (called by bind, shard_map_frame and shard_map) ----------------------------------
    def bind(self, prim, params, args, results, mesh, event) -> None:
        invars = [self.read(a) for a in args]
        typed = next((v.aval.dtype for v in invars if isinstance(v, Var)), None)
        for a, v in zip(args, invars):
            if isinstance(v, Literal) and type(a) in (bool, int, float, complex):
                v.weak(typed)
        outvars = [self.define(r, Var(Aval.of(r))) for r in results]
        self.eqns.append(Eqn(prim.name, dict(params), invars, outvars, mesh, event, prim))
        if event is not None:
            self.events.append(event)

    def begin_shard_map(self, mesh) -> None:
        self.frames.append(len(self.eqns))
        self._note_mesh(mesh)

    def end_shard_map(self, mesh, leaves, specs, local, out_leaves, out_specs, results) -> None:
        start = self.frames.pop() if self.frames else len(self.eqns)
        enters = []
        for x, spec, inner in zip(leaves, specs, local):
            if spec is None:  # passed through unchanged (in_specs=None)
                continue
            outer = self.read(x)
            sharding = NamedSharding(mesh, spec)
            placeholder = self.env.get(id(inner))
            free = isinstance(x, ShardedArray) and x.sharding.is_equivalent_to(sharding, x.ndim)
            if placeholder is not None and placeholder.kind == "const":
                placeholder.kind = "value"
                self.consts = [(v, c) for v, c in self.consts if v is not placeholder]
            if free and isinstance(outer, Var):
                var = placeholder or self.define(inner, Var(Aval.of(inner)))
                var.alias = outer
            else:
                var = placeholder or self.define(inner, Var(Aval.of(inner)))
                enters.append(Eqn("shard_map_enter", {"spec": spec}, [outer], [var], mesh))
        self.eqns[start:start] = enters
        for o, spec, r in zip(out_leaves, out_specs, results):
            inner = self.read(o)
            var = self.define(r, Var(Aval.of(r)))
            if isinstance(inner, Var) and tuple(sorted(inner.resolve().aval.varying)) == \
                    tuple(sorted(a for a in var.aval.varying)):
                var.alias = inner
            else:
                self.eqns.append(Eqn("shard_map_exit", {"spec": spec}, [inner], [var], mesh))

    # -- the result ------------------------------------------------------------------------------
    def program(self, name: str, invars, out_leaves) -> Program:
        outvars = [self.read(o) for o in out_leaves]
        outvars = [v if isinstance(v, Var) else self._literal_out(v) for v in outvars]
        constvars = [v for v, _ in self.consts]
        consts = [c for _, c in self.consts]
        return Program(name, invars, constvars, consts, self.eqns, outvars, self.meshes)

    def _literal_out(self, lit: Literal) -> Var:
        v = Var(lit.aval, "const")
        self.consts.append((v, lit.value))
        return v


# -- per-op names and counts (XLA's conventions) ----------------------------------------------------
# shardlab primitive -> XLA HLO opcode (for .as_text) and JAX lax primitive (for make_jaxpr).
HLO_NAMES = {
    "einsum": "dot", "matmul": "dot", "add": "add", "subtract": "subtract", "multiply": "multiply",
    "divide": "divide", "negative": "negate", "maximum": "maximum", "minimum": "minimum", "exp": "exponential",
    "log": "log", "tanh": "tanh", "sqrt": "sqrt", "power": "power", "absolute": "abs", "sin": "sine",
    "cos": "cosine", "tan": "tan", "expm1": "exponential-minus-one", "log1p": "log-plus-one", "sign": "sign",
    "floor": "floor", "ceil": "ceil", "equal": "compare", "not_equal": "compare", "greater": "compare",
    "greater_equal": "compare", "less": "compare", "less_equal": "compare", "select": "select",
    "convert_element_type": "convert", "reshape": "reshape", "transpose": "transpose", "broadcast": "broadcast",
    "broadcast_to": "broadcast", "reduce_sum": "reduce", "reduce_max": "reduce", "reduce_min": "reduce",
    "reduce_prod": "reduce", "reduce_any": "reduce", "reduce_all": "reduce", "concatenate": "concatenate",
    "dynamic_slice": "dynamic-slice", "dynamic_update_slice": "dynamic-update-slice", "gather": "gather",
    "scatter": "scatter", "scatter_add": "scatter", "cumsum": "reduce-window", "psum": "all-reduce",
    "all_gather": "all-gather", "psum_scatter": "reduce-scatter", "all_to_all": "all-to-all",
    "ppermute": "collective-permute", "axis_index": "partition-id", "erf": "erf", "logistic": "logistic",
    "remainder": "remainder", "arctan2": "atan2", "cbrt": "cbrt", "getitem": "slice",
}
JAX_NAMES = {
    "multiply": "mul", "subtract": "sub", "divide": "div", "negative": "neg", "maximum": "max",
    "minimum": "min", "power": "pow", "absolute": "abs", "greater": "gt", "greater_equal": "ge", "less": "lt",
    "less_equal": "le", "equal": "eq", "not_equal": "ne", "einsum": "dot_general", "select": "select_n",
    "psum_scatter": "reduce_scatter", "pcast": "pvary", "arctan2": "atan2", "remainder": "rem",
    "bitwise_and": "and", "bitwise_or": "or", "bitwise_xor": "xor", "logical_not": "not", "invert": "not",
    "broadcast_to": "broadcast_in_dim", "broadcast": "broadcast_in_dim", "getitem": "slice",
}
# XLA counts these elementwise ops as transcendentals, not flops (HloCostAnalysis).
TRANSCENDENTAL = frozenset({
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "tanh", "sin", "cos", "tan", "sqrt", "cbrt",
    "power", "float_power", "arctan2", "erf", "arcsin", "arccos", "arctan", "arcsinh", "arccosh", "arctanh",
    "sinh", "cosh", "logaddexp", "logaddexp2", "hypot", "reciprocal_sqrt", "silu", "swiglu", "silu_vjp",
    "swiglu_vjp", "exp_sum",
})
# No arithmetic: XLA counts their bytes only.
DATA_MOVEMENT = frozenset({
    "reshape", "transpose", "broadcast", "broadcast_to", "concatenate", "split", "getitem", "gather",
    "dynamic_slice", "dynamic_update_slice", "take_along_axis", "convert_element_type", "zeros_like", "pcast",
    "all_gather", "psum_scatter", "all_to_all", "ppermute", "axis_index", "numpy_fallback", "scatter",
    "positive",
})
REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_any", "reduce_all",
                        "argmax", "argmin", "reduce"})
COLLECTIVES = frozenset({"psum", "all_gather", "psum_scatter", "all_to_all", "ppermute"})


def eqn_counts(eqn: Eqn) -> tuple[float, float]:
    """(flops, transcendentals) one device spends on `eqn`, counted as XLA's HloCostAnalysis
    counts the unfused op: a dot 2·M·N·K, an elementwise op one per output element (a
    transcendental for exp, log, tanh, ...), a reduction one per input element it folds away,
    an all-reduce one per element, data movement nothing."""
    name = eqn.prim
    if eqn.event is not None and eqn.event.flops:
        return float(eqn.event.flops), 0.0
    if name in DATA_MOVEMENT or name.startswith("shard_map_") or not eqn.outvars:
        return 0.0, 0.0
    out = sum(v.aval.size for v in eqn.outvars)
    if name in REDUCTIONS:
        src = eqn.invars[0].aval.size if eqn.invars else 0
        return float(max(src - out, 0)), 0.0
    if name in TRANSCENDENTAL:
        return 0.0, float(out)
    return float(out), 0.0


def _aval(v) -> Aval:
    return v.resolve().aval if isinstance(v, Var) else v.aval


def cost_analysis(program: Program) -> dict:
    """JAX's ``cost_analysis()`` dict for one device: "flops", "transcendentals", "bytes accessed"
    and the per-operand "bytes accessed{i}{}" / "bytes accessedout{}" (operand i's bytes summed
    over the ops, as XLA reports them); zero entries are left out, as XLA leaves them out. With
    hardware on the mesh, "optimal_seconds" is the program's roofline time (XLA's key)."""
    flops = trans = 0.0
    per_operand: dict = {}
    out_bytes = 0.0
    for eqn in program.eqns:
        if eqn.prim.startswith("shard_map_"):
            continue
        f, t = eqn_counts(eqn)
        flops += f
        trans += t
        for i, v in enumerate(eqn.invars):
            per_operand[i] = per_operand.get(i, 0.0) + _aval(v).nbytes
        out_bytes += sum(_aval(v).nbytes for v in eqn.outvars)
    result = {"flops": flops, "transcendentals": trans,
              "bytes accessed": float(sum(per_operand.values()) + out_bytes)}
    for i in sorted(per_operand):
        result[f"bytes accessed{i}{{}}"] = float(per_operand[i])
    result["bytes accessedout{}"] = float(out_bytes)
    seconds = optimal_seconds(program)
    if seconds is not None:
        result["optimal_seconds"] = seconds
    return {k: v for k, v in result.items() if v}


def optimal_seconds(program: Program):
    """The roofline time of the program on its mesh's hardware (None without hardware)."""
    mesh = program.mesh
    if mesh is None or mesh.hardware is None:
        return None
    from ..cost import model

    events = [e.event.as_dict() for e in program.eqns if e.event is not None]
    if not events:
        return None
    return model.roofline(events, mesh).total_seconds


class CompiledMemoryStats:
    """Per-device memory of a program, with the attribute names of XLA's CompiledMemoryStats.

    ``argument_size_in_bytes`` and ``output_size_in_bytes`` are one device's share of the
    arguments and results; ``alias_size_in_bytes`` the donated arguments reused for results;
    ``temp_size_in_bytes`` the peak of the intermediate values live at once (no fusion: every
    op's result is materialized); ``peak_memory_in_bytes`` arguments + outputs + temporaries
    less the aliased bytes. There is no generated code and no host memory: those are 0.
    """

    _FIELDS = ("generated_code_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
               "alias_size_in_bytes", "temp_size_in_bytes", "host_generated_code_size_in_bytes",
               "host_argument_size_in_bytes", "host_output_size_in_bytes", "host_alias_size_in_bytes",
               "host_temp_size_in_bytes")

    def __init__(self, argument: int, output: int, alias: int, temp: int):
        self.generated_code_size_in_bytes = 0
        self.argument_size_in_bytes = int(argument)
        self.output_size_in_bytes = int(output)
        self.alias_size_in_bytes = int(alias)
        self.temp_size_in_bytes = int(temp)
        self.host_generated_code_size_in_bytes = 0
        self.host_argument_size_in_bytes = 0
        self.host_output_size_in_bytes = 0
        self.host_alias_size_in_bytes = 0
        self.host_temp_size_in_bytes = 0
        self.peak_memory_in_bytes = int(argument + output + temp - alias)
        self.serialized_buffer_assignment_proto = b""

    def __repr__(self):
        return "CompiledMemoryStats(" + ", ".join(f"{f}={getattr(self, f)}" for f in self._FIELDS) + ")"

    def __eq__(self, other):
        return isinstance(other, CompiledMemoryStats) and all(getattr(self, f) == getattr(other, f)
                                                              for f in self._FIELDS)


def memory_analysis(program: Program, donated=()) -> CompiledMemoryStats:
    """Per-device argument, output, alias and peak temporary bytes of `program`."""
    params = [v.resolve() for v in program.invars]
    outs = [v.resolve() for v in program.outvars if isinstance(v, Var)]
    argument = sum(v.aval.nbytes for v in params)
    output = sum(v.aval.nbytes for v in program.outvars)
    alias = 0
    free = [v.aval for i, v in enumerate(program.invars) if i in set(donated)]
    for o in program.outvars:
        a = o.aval
        for j, d in enumerate(free):
            if d.shape == a.shape and d.dtype == a.dtype and d.varying == a.varying:
                alias += a.nbytes
                free.pop(j)
                break
    # Liveness: an intermediate lives from its definition to its last use.
    fixed = {id(v) for v in params} | {id(v) for v in outs} | {id(v.resolve()) for v in program.constvars}
    last: dict = {}
    for i, eqn in enumerate(program.eqns):
        for v in eqn.invars:
            if isinstance(v, Var):
                last[id(v.resolve())] = i
    live: dict = {}
    temp = peak = 0
    for i, eqn in enumerate(program.eqns):
        for v in eqn.outvars:
            r = v.resolve()
            if id(r) not in fixed and id(r) not in live and r is v:
                live[id(r)] = r.aval.nbytes
                temp += r.aval.nbytes
        peak = max(peak, temp)
        for key in [k for k in live if last.get(k, -1) <= i]:
            temp -= live.pop(key)
    return CompiledMemoryStats(argument, output, alias, peak)


# -- text ------------------------------------------------------------------------------------------
def _fmt_param(v) -> str:
    if isinstance(v, np.dtype) or isinstance(v, type) and issubclass(v, np.generic):
        return np.dtype(v).name
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, (tuple, list)):
        inner = ", ".join(_fmt_param(x) for x in v)
        return f"({inner}{',' if len(v) == 1 else ''})"
    return repr(v)


def _hlo_attrs(eqn: Eqn) -> list:
    p = eqn.params
    if eqn.prim == "einsum":
        attrs = [f'einsum="{",".join(p["terms"])}->{p["out"]}"']
    elif eqn.prim in COLLECTIVES:
        axes = tuple(p.get("axes", ()))
        n = math.prod(eqn.mesh.shape[a] for a in axes) if eqn.mesh is not None else 1
        groups = eqn.mesh.size // n if eqn.mesh is not None else 1
        attrs = ["axes={" + ",".join(axes) + "}", f"groups={groups}x{n}"]
        attrs += [f"{k}={_fmt_param(v)}" for k, v in p.items() if k != "axes"]
    elif eqn.prim.startswith("shard_map_"):
        attrs = [f"sharding={p['spec']!r}"]
    else:
        attrs = [f"{k}={_fmt_param(v)}" for k, v in p.items()]
    if HLO_NAMES.get(eqn.prim, eqn.prim) != eqn.prim:
        attrs.append(f'op_name="{eqn.prim}"')
    return attrs


def _comment(eqn: Eqn) -> str:
    e = eqn.event
    if eqn.prim == "shard_map_enter":
        return "host re-layout on entering shard_map (no ledger event)"
    if eqn.prim == "shard_map_exit":
        return "device 0's value along the axes the out_spec leaves out (check_vma=False)"
    if e is None:
        return ""
    parts = []
    if e.axes:
        parts.append(f"sends {units.fmt_bytes(e.bytes_sent)}/device")
    elif e.flops:
        parts.append(units.fmt_flops(e.flops))
    if e.seconds is not None and not (isinstance(e.seconds, float) and math.isnan(e.seconds)):
        parts.append(units.fmt_seconds(e.seconds))
    return ", ".join(parts)


def hlo_text(program: Program) -> str:
    """The program in the form of XLA's partitioned HLO: per-device shapes, one line per op
    and per collective, global types (the book's notation) on the parameters and results."""
    names: dict = {}
    count = [0]

    def name(v) -> str:
        if isinstance(v, Literal):
            return f"{short_dtype(v.aval.dtype)}[] constant({v.value.item() if v.value.ndim == 0 else v.value})"
        r = v.resolve()
        if id(r) not in names:
            names[id(r)] = f"%{count[0]}"
            count[0] += 1
        return names[id(r)]

    for i, v in enumerate(program.invars):
        names[id(v.resolve())] = f"%p{i}"
    for i, v in enumerate(program.constvars):
        names.setdefault(id(v.resolve()), f"%c{i}")
    outs = [v.resolve() for v in program.outvars]
    in_types = ", ".join(v.aval.str_global() for v in program.invars)
    out_list = [v.aval.str_global() for v in program.outvars]
    out_type = out_list[0] if len(out_list) == 1 else "(" + ", ".join(out_list) + ")"
    head = f"HloModule {program.name}"
    mesh = program.mesh
    if mesh is not None:
        head += ", mesh={" + ", ".join(f"{a}:{s}" for a, s in mesh.shape.items()) + "}"
        head += f", num_partitions={mesh.size}"
        if mesh.hardware is not None:
            head += f", hardware={mesh.hardware.name}"
    head += f", entry_computation_layout={{({in_types})->{out_type}}}"
    params = ", ".join(f"p{i}: {v.aval.str_global()}" for i, v in enumerate(program.invars))
    lines = [head, "", f"ENTRY %main ({params}) -> {out_type} {{"]
    for i, v in enumerate(program.invars):
        r = v.resolve()
        g = f"  // global {v.aval.str_global()}" if v.aval.global_shape is not None and v.aval.mesh is not None else ""
        lines.append(f"  %p{i} = {r.aval.str_short()} parameter({i}){g}")
    for i, v in enumerate(program.constvars):
        lines.append(f"  %c{i} = {v.aval.str_short()} constant({{...}})")
    hosts = [v for e in program.eqns for v in e.invars] + list(program.outvars)
    hosts = [v for v in hosts if isinstance(v, Var) and v.resolve().kind == "host"]
    for i, v in enumerate({id(h.resolve()): h.resolve() for h in hosts}.values()):
        names[id(v)] = f"%h{i}"
        lines.append(f"  %h{i} = {v.aval.str_short()} custom-call(), custom_call_target=\"host\"  "
                     f"// made outside a primitive (a transform's view or seed): no ledger event")
    root = outs[-1] if len(outs) == 1 else None
    for eqn in program.eqns:
        args = ", ".join(name(v) for v in eqn.invars)
        op = HLO_NAMES.get(eqn.prim, eqn.prim)
        attrs = _hlo_attrs(eqn)
        outvars = [v.resolve() for v in eqn.outvars]
        if len(outvars) == 1:
            lhs, ty = name(outvars[0]), outvars[0].aval.str_short()
        else:
            lhs = name(outvars[0]) if outvars else "%_"
            for o in outvars[1:]:
                name(o)
            ty = "(" + ", ".join(o.aval.str_short() for o in outvars) + ")"
        prefix = "ROOT " if root is not None and outvars and outvars[0] is root else ""
        line = f"  {prefix}{lhs} = {ty} {op}({args})" + "".join(", " + a for a in attrs)
        c = _comment(eqn)
        lines.append(line + (f"  // {c}" if c else ""))
    if root is None or not any(root is v.resolve() for e in program.eqns for v in e.outvars):
        tys = ", ".join(v.aval.str_short() for v in outs)
        lines.append(f"  ROOT %tuple = ({tys}) tuple({', '.join(name(v) for v in outs)})")
    globals_ = [v.aval for v in program.outvars if v.aval.global_shape is not None and v.aval.mesh is not None]
    if globals_:
        lines.append("  // results: " + ", ".join(a.str_global() for a in globals_))
    lines.append("}")
    return "\n".join(lines)
