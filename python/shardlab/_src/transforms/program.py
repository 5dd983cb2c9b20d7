"""The program ``jit`` lowers to: the binds recorded while a function runs shape-only.

shardlab has no compiler. ``jit(f).trace(*args)`` runs `f` once shape-only (as ``eval_shape``
does: arrays and ``ShapeDtypeStruct``s become abstract values, on meshes of any size) while a
:class:`Recorder` on the context sees every primitive ``bind`` and every ``shard_map``
boundary. The result is a small flat :class:`Program`: one equation per primitive (compute
and collectives alike), with per-device shapes, the mesh axes each value varies along and,
where a value is a global array (the arguments, the results, a shard_map's boundary), its
global shape and sharding. ``program_text.py`` prints it (``.as_text()``),
``program_cost.py`` counts it (``.cost_analysis()``, ``.memory_analysis()``), ``make_jaxpr``
shows it as a jaxpr, and the stages that carry it (``Traced``, ``Lowered``, ``Compiled``)
are in ``lowered.py``.

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
from ..arrays.typeof import ShapedArray
from ..core.context import CTX
from ..core.dtypes import default_float_dtype, default_int_dtype
from ..core.mesh import UNIT_MESH
from ..core.sharding import NamedSharding
from .eval_shape import ShapeDtypeStruct

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
        return ShapeDtypeStruct(self.global_shape if self.global_shape is not None else self.shape, self.dtype,
                                sharding=self.sharding)

    def __repr__(self):
        return f"Aval({self.str_global()})"


def shaped(aval: Aval) -> ShapedArray:
    """The ShapedArray (what ``typeof`` returns) of a program value's global type."""
    shape = aval.global_shape if aval.global_shape is not None else aval.shape
    if aval.sharding is None:
        return ShapedArray(shape, aval.dtype)
    return ShapedArray(shape, aval.dtype, sharding=aval.sharding)


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
        self.value = arr
        self.aval = Aval(arr.shape, arr.dtype)

    def resolve(self):
        return self

    def weak(self, dtype) -> None:
        """A Python number takes the dtype of the array it meets, as JAX's weak types do."""
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

    __slots__ = ("prim", "params", "invars", "outvars", "mesh", "event", "primitive", "note", "phase", "scope")

    def __init__(self, prim: str, params: dict, invars, outvars, mesh, event=None, primitive=None, note=""):
        self.prim = prim
        self.params = params
        self.invars = list(invars)
        self.outvars = list(outvars)
        self.mesh = mesh
        self.event = event
        self.primitive = primitive
        self.note = note  # what the text's comment says of a step that is not a primitive
        self.phase = CTX.phase  # 'forward', 'backward' or 'recompute' when it was recorded
        self.scope = "/".join(CTX.scopes)  # the named_scope labels around it

    def __repr__(self):
        return f"Eqn({self.prim})"


class Region:
    """One shard_map call the user wrote, as the program saw it: its mesh and parameters
    (check_vma, in_specs, out_specs, manual axes), the (outer, inner) variables of its
    arguments and of its results, its body's equations and its boundary steps. The program
    stays flat (costs and text walk it in order); the jaxpr printer nests a region under one
    ``shard_map`` equation, as JAX's jaxpr does."""

    def __init__(self, mesh, params: dict, args: list, body: list, outs: list, boundary: list):
        self.mesh = mesh
        self.params = dict(params)
        self.args = list(args)
        self.body = list(body)
        self.outs = list(outs)
        self.boundary = list(boundary)


class Program:
    """The recorded program: parameters, constants, equations and results (flat).

    ``in_tree`` / ``out_tree`` give the pytree structure of ``(args, kwargs)`` and of the
    result; ``out_literals`` holds results that are not arrays of the program (Python numbers).
    """

    def __init__(self, name: str, invars, constvars, consts, eqns, outvars, meshes, regions=()):
        self.name = name
        self.invars = list(invars)
        self.constvars = list(constvars)
        self.consts = list(consts)
        self.eqns = list(eqns)
        self.outvars = list(outvars)
        self.meshes = list(meshes)
        self.regions = list(regions)  # the user's shard_map calls, for the jaxpr's nested equations

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
        self.regions: list = []  # Region of each finished shard_map call the user wrote

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
            if aval.size == 1 and not aval.varying and not is_abstract(st):  # a lifted scalar
                return Literal(np.asarray(st).reshape(aval.shape))
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

    def step(self, rule, params, inputs, outputs, mesh) -> None:
        """A non-primitive step (a shard_map boundary crossed by the backward walk): an output
        of the same per-device type is the input's buffer; another is a step of its own."""
        if CTX.phase != "backward" or not inputs or not outputs:
            return  # forward boundaries come from shard_map itself (end_shard_map)
        src = self.read(inputs[0])
        for o in outputs:
            if id(o) in self.env or not _is_array(o):
                continue
            var = self.define(o, Var(Aval.of(o)))
            a, b = var.aval, src.aval if isinstance(src, Var) else None
            if b is not None and (a.shape, a.dtype, sorted(a.varying)) == (b.shape, b.dtype, sorted(b.varying)):
                var.alias = src
            else:
                name = getattr(rule, "name", type(rule).__name__).replace(" (", "_").replace(")", "")
                sharding = params.get("sharding")
                self.eqns.append(Eqn(name.replace(" ", "_"), {"spec": getattr(sharding, "spec", None)},
                                     [src], [var], mesh, note="host re-layout where the backward pass crosses a "
                                     "shard_map boundary (no ledger event)"))

    def begin_shard_map(self, mesh) -> None:
        self.frames.append(len(self.eqns))
        self._note_mesh(mesh)

    def end_shard_map(self, mesh, leaves, specs, local, out_leaves, out_specs, results, region=None) -> None:
        """The boundary of a finished shard_map call: an entry step per argument that moves data
        on the host (others alias the outer value), an exit step per result likewise; with
        `region` (the user's own shard_map: its parameters), a Region for the jaxpr's printer."""
        start = self.frames.pop() if self.frames else len(self.eqns)
        body = self.eqns[start:]
        enters, exits, body_in = [], [], []
        for x, spec, inner in zip(leaves, specs, local):
            if spec is None:  # passed through unchanged (in_specs=None)
                continue
            outer = self.read(x)
            sharding = NamedSharding(mesh, spec)
            placeholder = self.env.get(id(inner))
            free = isinstance(x, ShardedArray) and x.sharding.is_equivalent_to(sharding, x.ndim)
            if placeholder is not None and placeholder.kind in ("const", "host"):
                placeholder.kind = "value"  # read before this boundary told where it came from
                self.consts = [(v, c) for v, c in self.consts if v is not placeholder]
            var = placeholder or self.define(inner, Var(Aval.of(inner)))
            if free and isinstance(outer, Var):
                var.alias = outer
            else:
                enters.append(Eqn("shard_map_enter", {"spec": spec}, [outer], [var], mesh))
            body_in.append((outer, var))
        self.eqns[start:start] = enters
        body_out = []
        for o, spec, r in zip(out_leaves, out_specs, results):
            inner = self.read(o)
            var = self.define(r, Var(Aval.of(r)))
            if isinstance(inner, Var) and tuple(sorted(inner.resolve().aval.varying)) == \
                    tuple(sorted(a for a in var.aval.varying)):
                var.alias = inner
            else:
                exits.append(Eqn("shard_map_exit", {"spec": spec}, [inner], [var], mesh))
            body_out.append((inner, var))
        self.eqns.extend(exits)
        if region is not None:
            self.regions.append(Region(mesh, region, body_in, body, body_out, enters + exits))

    # -- the result ------------------------------------------------------------------------------
    def program(self, name: str, invars, out_leaves) -> Program:
        outvars = [self.read(o) for o in out_leaves]
        outvars = [v if isinstance(v, Var) else self._literal_out(v) for v in outvars]
        constvars = [v for v, _ in self.consts]
        consts = [c for _, c in self.consts]
        return Program(name, invars, constvars, consts, self.eqns, outvars, self.meshes, self.regions)

    def _literal_out(self, lit: Literal) -> Var:
        v = Var(lit.aval, "const")
        self.consts.append((v, lit.value))
        return v
