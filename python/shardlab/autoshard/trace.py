"""From a global-view function to the intra-op `Problem`: trace it, enumerate each op's
candidate shardings, price them on the mesh's hardware.

`trace_program(f, *args, mesh=...)` records `f` shape-only with ``shardlab.jit(f).trace`` on a
one-device mesh: the program of primitives at their global shapes (a gradient's backward pass
included). Each primitive becomes a node whose candidates are the ways to shard it
(`specs.einsum_candidates` for contractions, every layout of the output for elementwise ops,
of the input for reductions and reshapes); each candidate is *priced by running the global-view
op on it shape-only* on an abstract copy of the mesh: the collectives the planner inserts and
their seconds are exactly what a real run records in its ledger. Every program input (a
parameter, a batch) is a node whose candidates are its layouts. Edges carry the resharding
seconds from ``shardlab.plan_reshard`` (what ``shardlab.reshard`` runs).

Memory per device: every input at its layout, plus each forward value a backward op reads (the
activations a training step keeps); transient values are not counted.

Repeated layers: ops (and inputs) with the same structural signature — the primitive, its
parameters, shapes and phase, and those of its producers and consumers — are tied to one
decision variable (Alpa's and autoparallel's merging of repeated blocks).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from typing import Any

import numpy as np

import shardlab as sl
import shardlab.numpy as jnp
from shardlab import cost, tree_util
from shardlab.viz import progress
from shardlab.cost import formulas

from .graph import Edge, Node, Problem, Strategy
from .specs import Dims, dims_of, dims_str, einsum_candidates, local_shape, pspec, tensor_dims

__all__ = ["UntraceableError", "Candidate", "Value", "Op", "Program", "trace_program"]

_ELEMENTWISE = {
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "negative", "exp", "exp2", "log",
    "log1p", "expm1", "tanh", "sqrt", "reciprocal", "square", "sin", "cos", "absolute", "sign", "equal",
    "not_equal", "greater", "greater_equal", "less", "less_equal", "select", "convert_element_type", "erf",
    "logistic", "logical_and", "logical_or", "logical_not", "positive",
}
_REDUCE = {"reduce_sum": jnp.sum, "reduce_max": jnp.max, "reduce_min": jnp.min}
_STRUCTURAL = {"reshape", "broadcast_to", "transpose"}
SUPPORTED = sorted(_ELEMENTWISE | set(_REDUCE) | _STRUCTURAL | {"einsum"})


class UntraceableError(ValueError):
    """The function uses a construct autoshard cannot shard (named in the message)."""


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One way to run an op: the layout each operand must have (None for a literal), the
    output's layout, the collectives the op itself runs ``(op, axes, bytes_sent)`` and its
    seconds."""

    in_dims: tuple
    out_dims: Dims
    collectives: tuple
    compute_s: float
    comm_s: float
    out_kw: Dims | None = None  # the einsum's out_sharding


@dataclasses.dataclass
class Value:
    """A value of the program: its global shape and dtype, and where it comes from."""

    index: int
    name: str
    shape: tuple
    dtype: np.dtype
    kind: str  # 'input', 'const', 'op'
    producer: int | None = None
    const: Any = None
    consumers: list = dataclasses.field(default_factory=list)  # (op index, slot)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclasses.dataclass
class Op:
    """One primitive of the program with its candidates."""

    index: int
    name: str
    prim: str
    params: dict
    inputs: list  # ('value', index) or ('literal', python scalar)
    output: int
    phase: str
    scope: str
    candidates: list = dataclasses.field(default_factory=list)
    saved: bool = False  # a forward value the backward pass reads (kept in memory)
    follows: tuple | None = None  # ('input', value) or ('op', index) whose choice this op takes


# -- running one op on global arrays (the pricing and the plan's execution share it) ------------------
def einsum_collectives(params, in_dims, out_dims) -> list:
    """The reductions a sharded einsum ends with: ``[("psum_scatter", axis, out dim), ...,
    ("psum", axes, None)]`` for the mesh axes on contracted indices (scattered ones first)."""
    terms, out = params["terms"], params["out"]
    on = {}
    for t, dims in zip(terms, in_dims):
        for label, axes in zip(t, dims):
            on.setdefault(label, axes)
    base = [on.get(label, ()) for label in out]
    partial = [a for label, axes in on.items() if label not in out for a in axes]
    steps = []
    for d, axes in enumerate(out_dims):
        steps += [("psum_scatter", a, d) for a in axes if a not in base[d]]
    rest = tuple(a for a in partial if not any(a == s[1] for s in steps))
    if rest:
        steps.append(("psum", rest, None))
    return steps


def _run_einsum(p, args, in_dims, out_dims, mesh):
    """A sharded einsum as the candidate says: a local einsum on each device's blocks, then
    reduce-scatters and one all-reduce over the axes of contracted indices (shard_map)."""
    sub = ",".join(p["terms"]) + "->" + p["out"]
    kw = {} if p.get("preferred_element_type") is None else {"preferred_element_type": p["preferred_element_type"]}
    steps = einsum_collectives(p, in_dims, out_dims)

    def body(*xs):
        y = jnp.einsum(sub, *xs, **kw)
        for kind, axes, d in steps:
            if kind == "psum_scatter":
                y = sl.lax.psum_scatter(y, axes, scatter_dimension=d, tiled=True)
            else:
                y = sl.lax.psum(y, axes if len(axes) > 1 else axes[0])
        return y

    return sl.shard_map(body, mesh=mesh, in_specs=tuple(pspec(d) for d in in_dims), out_specs=pspec(out_dims))(*args)


def apply_op(op: Op, args: list, out_shape: tuple, out_kw: Dims | None, mesh=None, in_dims=None):
    """Runs `op` on global arrays (or literals) with the global-view functions (an einsum as
    its candidate's shard_map)."""
    p, prim = op.params, op.prim
    if prim == "einsum":
        return _run_einsum(p, args, in_dims, out_kw, mesh)
    if prim in _REDUCE:
        return _REDUCE[prim](args[0], axis=tuple(p["axes"]), keepdims=bool(p.get("keepdims", False)))
    if prim == "reshape":
        return jnp.reshape(args[0], out_shape)
    if prim == "broadcast_to":
        return jnp.broadcast_to(args[0], out_shape)
    if prim == "transpose":
        return jnp.transpose(args[0], tuple(p["perm"]))
    if prim == "select":
        return jnp.where(*args)
    if prim == "convert_element_type":
        return args[0].astype(p["dtype"]) if hasattr(args[0], "astype") else np.asarray(args[0], p["dtype"])
    if prim == "logistic":
        return 1.0 / (1.0 + jnp.exp(-args[0]))
    fn = getattr(jnp, prim, None) or getattr(sl.lax, prim)
    return fn(*args)


def out_shape_of(op: Op, values) -> tuple:
    return values[op.output].shape


def _events_of(program) -> list:
    return [e.event.as_dict() for e in program.eqns if e.event is not None]


class _Pricer:
    """Prices candidates by running the op shape-only on an abstract copy of the mesh (memoized
    by the op's signature), and reshards with ``plan_reshard``."""

    def __init__(self, mesh):
        self.mesh = mesh
        self.shape = dict(mesh.shape)
        self.hw = mesh.hardware
        self.abstract = sl.make_mesh(tuple(mesh.shape.values()), tuple(mesh.axis_names), hardware=self.hw,
                                     abstract=True)
        self._ops: dict = {}
        self._edges: dict = {}
        self._sigs: dict = {}  # op index -> (op, its pricing signature)
        self._labels: dict = {}
        self._records: dict = {}

    def record(self, f, args):
        """`_record` of `f` on arguments of these shapes and dtypes, once: as ``jit`` caches a
        trace by the function and its arguments' types, a pricer reused for another plan of the
        same program (hand-written layouts imposed) reuses the recorded program."""
        leaves, tree = tree_util.tree_flatten(args)
        key = (f, tree, tuple((tuple(x.shape), np.dtype(x.dtype).name) if hasattr(x, "shape") and hasattr(x, "dtype")
                              else (type(x).__name__, id(x)) for x in leaves))
        try:
            hit = self._records.get(key)
        except TypeError:  # an unhashable callable: no reuse
            return _record(f, args)
        if hit is None:
            hit = self._records[key] = _record(f, args)
        return hit

    def sds(self, shape, dtype, dims):
        return sl.ShapeDtypeStruct(shape, dtype, sharding=sl.NamedSharding(self.abstract, pspec(dims)))

    def local_bytes(self, shape, dtype, dims) -> int:
        return math.prod(local_shape(shape, dims, self.shape)) * np.dtype(dtype).itemsize

    def signature(self, op: Op, values: list) -> tuple:
        """What an op's prices depend on: the primitive, its parameters, operand and result
        shapes and dtypes (equal for the same op in every copy of a repeated layer)."""
        sig = self._sigs.get(op.index)
        if sig is None or sig[0] is not op:
            avals = tuple((values[i].shape, values[i].dtype.name) if k == "value" else ("lit", repr(i))
                          for k, i in op.inputs)
            sig = self._sigs[op.index] = (op, (op.prim, repr(sorted(op.params.items())), avals,
                                               values[op.output].shape, values[op.output].dtype.name))
        return sig[1]

    def op(self, op: Op, values: list, in_dims: tuple, out_kw) -> Candidate | None:
        key = (self.signature(op, values), in_dims, out_kw)
        if key in self._ops:
            return self._ops[key]
        cand = None
        slots = [(k, i) for k, i in op.inputs]
        if op.prim == "einsum":
            cand = self._ops[key] = self._einsum(op, values, in_dims, out_kw)
            return cand
        if op.prim in _ELEMENTWISE and out_kw is not None:  # operands already laid out as the output: local
            nbytes = sum(self.local_bytes(values[i].shape, values[i].dtype, d)
                         for (k, i), d in zip(slots, in_dims) if k == "value")
            nbytes += self.local_bytes(out_shape_of(op, values), values[op.output].dtype, out_kw)
            cand = self._ops[key] = Candidate(in_dims, out_kw, (), float(cost.hbm_load_time(nbytes, self.hw)), 0.0)
            return cand
        arrays = [self.sds(values[i].shape, values[i].dtype, d) for (k, i), d in zip(slots, in_dims) if k == "value"]
        out_shape = values[op.output].shape

        def run(*xs):
            it = iter(xs)
            args = [next(it) if k == "value" else i for k, i in slots]
            return apply_op(op, args, out_shape, out_kw, self.abstract, in_dims)

        try:
            prog = sl.jit(run).trace(*arrays).lower().compiler_ir()
        except Exception:  # the global view refuses this layout: not a candidate
            prog = None
        if prog is not None:
            aval = prog.outvars[0].aval
            gshape = aval.global_shape if aval.global_shape is not None else aval.shape
            if not aval.unreduced and tuple(gshape) == tuple(out_shape):
                out_dims = dims_of(aval.sharding.spec if aval.sharding is not None else None, len(out_shape))
                events = _events_of(prog)
                colls = tuple((e["op"], tuple(e["axes"]), float(e["bytes_sent"])) for e in events if e["axes"])
                comm = sum(float(e["seconds"] or 0.0) for e in events if e["axes"])
                compute = sum(float(e["seconds"] or 0.0) for e in events if not e["axes"])
                if op.prim != "einsum":  # elementwise, reductions, reshapes: memory-bound
                    nbytes = sum(self.local_bytes(values[i].shape, values[i].dtype, d)
                                 for (k, i), d in zip(slots, in_dims) if k == "value")
                    nbytes += self.local_bytes(out_shape, values[op.output].dtype, out_dims)
                    compute += float(cost.hbm_load_time(nbytes, self.hw))
                cand = Candidate(in_dims, out_dims, colls, compute, comm, out_kw)
        self._ops[key] = cand
        return cand

    def event_s(self, event: dict) -> float:
        return float(cost.event_seconds(event, self.abstract))

    def _einsum(self, op: Op, values, in_dims, out_dims) -> Candidate:
        p = op.params
        size, local = {}, {}
        arrays = [(values[i], d) for (k, i), d in zip(op.inputs, in_dims) if k == "value"]
        for t, (v, d) in zip(p["terms"], arrays):
            for label, s, axes in zip(t, v.shape, d):
                size[label] = s
                local[label] = s // math.prod(self.shape[a] for a in axes)
        out = values[op.output]
        dtype = out.dtype.name
        y_shape = [local[label] for label in p["out"]]
        y_bytes = math.prod(y_shape) * out.dtype.itemsize
        hbm = sum(self.local_bytes(v.shape, v.dtype, d) for v, d in arrays) + y_bytes
        compute = self.event_s({"op": "einsum", "flops": 2.0 * math.prod(local.values()), "hbm_bytes": hbm,
                                "dtype": dtype})
        colls, comm = [], 0.0
        for kind, axes, d in einsum_collectives(p, in_dims, out_dims):
            axes = (axes,) if isinstance(axes, str) else tuple(axes)
            n = math.prod(self.shape[a] for a in axes)
            b_out, _, sent = formulas.collective_bytes(kind, n, y_bytes)
            ev = {"op": kind, "axes": axes, "group_size": n, "bytes_in": float(y_bytes), "bytes_out": float(b_out),
                  "dtype": dtype}
            comm += self.event_s(ev)
            colls.append((kind, axes, float(sent)))
            y_bytes = b_out
        return Candidate(in_dims, out_dims, tuple(colls), compute, comm, out_dims)

    def reshard_run(self, shape, dtype, src: Dims, dst: Dims) -> tuple[float, tuple]:
        """What ``shardlab.reshard`` records moving a value from `src` to `dst` (traced
        shape-only: the plan's prediction of its ledger)."""
        if src == dst:
            return 0.0, ()
        key = ("run", shape, np.dtype(dtype).name, src, dst)
        hit = self._edges.get(key)
        if hit is None:
            target = sl.NamedSharding(self.abstract, pspec(dst))
            prog = sl.jit(lambda x: sl.reshard(x, target)).trace(self.sds(shape, dtype, src)).lower().compiler_ir()
            events = [e for e in _events_of(prog) if e["axes"]]
            hit = self._edges[key] = (sum(float(e["seconds"] or 0.0) for e in events),
                                      tuple((e["op"], tuple(e["axes"]), float(e["bytes_sent"])) for e in events))
        return hit

    def matrix(self, shape, dtype, srcs: list, dsts: list) -> np.ndarray:
        """Resharding seconds from each layout of `srcs` to each of `dsts` (priced once per
        distinct pair)."""
        us, ud = list(dict.fromkeys(srcs)), list(dict.fromkeys(dsts))
        key = ("matrix", shape, str(dtype), tuple(us), tuple(ud))
        small = self._edges.get(key)
        if small is None:
            small = self._edges[key] = np.array([[self.reshard(shape, dtype, a, b)[0] for b in ud]
                                                 for a in us]).reshape(len(us), len(ud))
        iu, idd = {a: i for i, a in enumerate(us)}, {b: i for i, b in enumerate(ud)}
        si, di = np.array([iu[a] for a in srcs]), np.array([idd[b] for b in dsts])
        return small[np.ix_(si, di)]

    def reshard(self, shape, dtype, src: Dims, dst: Dims) -> tuple[float, tuple]:
        """Seconds and collectives ``(op, axes, bytes_sent)`` of moving a value from `src` to `dst`."""
        if src == dst:
            return 0.0, ()
        key = (shape, str(dtype), src, dst)
        hit = self._edges.get(key)
        if hit is None:
            plan = sl.plan_reshard((tuple(shape), sl.NamedSharding(self.abstract, pspec(src)), dtype),
                                   sl.NamedSharding(self.abstract, pspec(dst)))
            colls = tuple((s.op, tuple(s.axes), float(s.bytes_sent)) for s in plan.steps if s.op != "dynamic_slice")
            hit = self._edges[key] = (float(plan.comm_seconds or 0.0), colls)
        return hit


# -- the traced program -----------------------------------------------------------------------------
@dataclasses.dataclass
class Program:
    """A traced global-view program with every op's candidates, and the intra-op `Problem`
    built from it (``problem``; node i of the problem is ``nodes[i]``: ('input', value) or
    ('op', op))."""

    fun_name: str
    mesh: Any
    values: list
    ops: list
    inputs: list  # value indices of the flat arguments, in order
    outputs: list  # ('value', index) or ('literal', scalar) per flat result
    args_tree: Any  # the treedef of the positional arguments
    out_tree: Any
    input_dims: dict  # value index -> candidate dims of an input
    problem: Problem
    nodes: list
    pricer: Any
    trace_seconds: float = 0.0
    fun: Any = None  # the traced function (the unsharded reference)
    carry: list = dataclasses.field(default_factory=list)  # (result leaf, its value, argument value) pairs

    def node_dims(self, node: int, choice: int) -> Dims:
        """The layout node `node` gives its value in strategy `choice`."""
        kind, i = self.nodes[node]
        return self.input_dims[i][choice] if kind == "input" else self.ops[i].candidates[choice].out_dims


def _flat_paths(args) -> list:
    leaves, _ = tree_util.tree_flatten_with_path(args)
    return [tree_util.keystr(path) for path, _ in leaves]


def _struct(x, mesh1):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise UntraceableError(f"[autoshard] every argument must be an array or a ShapeDtypeStruct; got "
                               f"{type(x).__name__} {x!r}: close over Python values instead")
    dtype = sl.dtypes.canonicalize_dtype(x.dtype)  # float64 data runs as float32 unless x64 is on, as in JAX
    return sl.ShapeDtypeStruct(tuple(x.shape), dtype, sharding=sl.NamedSharding(mesh1, sl.P()))


def _check_mesh(mesh):
    if mesh is None or not hasattr(mesh, "axis_names"):
        raise TypeError(f"[autoshard] pass mesh=: a shardlab Mesh (possibly abstract), got {mesh!r}")
    if mesh.hardware is None:
        raise ValueError("[autoshard] the mesh has no hardware, so nothing can be priced: make it with "
                         "shardlab.make_mesh(..., hardware='tpu-v5p') (or another preset)")


def _record(f, args):
    """The one-device program of `f` (global shapes), its input and output trees."""
    mesh1 = sl.make_mesh((1,), ("_autoshard",))
    structs = tree_util.tree_map(lambda x: _struct(x, mesh1), args)
    name = getattr(f, "__name__", type(f).__name__)
    try:
        lowered = sl.jit(f).trace(*structs).lower()
    except UntraceableError:
        raise
    except Exception as err:
        raise UntraceableError(f"[autoshard] cannot trace {name}: {type(err).__name__}: {err}") from err
    return lowered, name


def _fixed_layouts(in_specs, args, values, inputs) -> dict:
    """``{input value: dims}`` from `in_specs`: a pytree like `args` of PartitionSpecs (None:
    free), or a dict ``{argument path: PartitionSpec}`` (paths as ``ShardingPlan.specs`` names)."""
    if in_specs is None:
        return {}
    by_name = {values[i].name: i for i in inputs}
    if isinstance(in_specs, dict) and all(isinstance(k, str) and k in by_name for k in in_specs):
        pairs = [(by_name[k], v) for k, v in in_specs.items()]
    else:
        leaves = tree_util.tree_leaves(in_specs, is_leaf=lambda x: x is None or isinstance(x, sl.PartitionSpec))
        if len(leaves) != len(inputs):
            raise ValueError(f"[autoshard] in_specs has {len(leaves)} leaves, the arguments {len(inputs)}: give a "
                             f"PartitionSpec or None per array, or a dict {{path: spec}} with paths such as "
                             f"{list(by_name)[:3]}")
        pairs = list(zip(inputs, leaves))
    out = {}
    for i, spec in pairs:
        if spec is not None:
            v = values[i]
            dims = dims_of(spec, len(v.shape))
            out[i] = dims
    return out


def trace_program(f, *args, mesh, memory_limit_bytes: float | None = None, merge_layers: bool = True,
                  follow: bool = True, in_specs=None, pricer=None, carry=None) -> Program:
    """Traces `f(*args)` and builds the intra-op Problem on `mesh` (see the module docstring).

    Args:
        f: a global-view function of arrays (shardlab.numpy, einsum, grad, ...).
        *args: example arrays or ShapeDtypeStructs (pytrees of them); only shapes and dtypes count.
        mesh: the mesh to shard over, with hardware (an abstract mesh is fine).
        memory_limit_bytes: per-device limit for the Problem (None: no limit).
        merge_layers: tie structurally identical ops (repeated layers) to one decision.
        follow: an op that is not a contraction takes its operand's layout (Alpa's follow
            nodes; False gives every op every layout of its own).
        in_specs: layouts to impose on arguments (a hand-written strategy): a pytree like
            `args` of PartitionSpecs or None (free), or ``{argument path: PartitionSpec}``.
        pricer: the prices of an earlier call on the same mesh (``Program.pricer``), reused.
        carry: ``[(result index, argument index), ...]``: results that are the next step's
            arguments (a training step's new parameters and optimizer state). Each such result
            is brought back to its argument's layout at the end of the step, and that
            resharding is priced (an edge from the result to the argument): a plan cannot
            leave the weights in a layout the next step does not start from. `f` must return
            a tuple; the two subtrees must have the same leaves' shapes.

    Raises:
        UntraceableError: `f` uses a primitive or construct autoshard cannot shard (named).
    """
    _check_mesh(mesh)
    t0 = time.perf_counter()
    if pricer is None or pricer.mesh is not mesh:
        pricer = _Pricer(mesh)
    lowered, name = pricer.record(f, args)
    prog = lowered.compiler_ir()
    paths = _flat_paths(args)
    values, ops, var_index = [], [], {}

    def new_value(var, name, kind, producer=None, const=None):
        aval = var.aval
        shape = tuple(aval.global_shape if aval.global_shape is not None else aval.shape)
        v = Value(len(values), name, shape, np.dtype(aval.dtype), kind, producer, const)
        values.append(v)
        var_index[id(var)] = v.index
        return v.index

    inputs = [new_value(var, paths[i] if i < len(paths) else f"arg{i}", "input") for i, var in enumerate(prog.invars)]
    for var, c in zip(prog.constvars, prog.consts):
        new_value(var, f"const{len(values)}", "const", const=c)

    def operand(x, op_name, scope):
        if not hasattr(x, "resolve"):
            return ("literal", x)
        r = x.resolve()
        if hasattr(r, "value") and not hasattr(r, "kind"):  # a Literal
            return ("literal", r.value.item() if r.value.ndim == 0 else r.value)
        if id(r) in var_index:
            return ("value", var_index[id(r)])
        if id(r) in lifted:
            return ("literal", lifted[id(r)])
        if r.kind == "host" and r.aval.size == 1:  # grad's seed cotangent (ones), made without a primitive
            return ("literal", np.ones(r.aval.shape, r.aval.dtype).reshape(()).item())
        raise UntraceableError(f"[autoshard] {op_name} (scope {scope or '-'}) reads a value made outside a "
                               f"primitive ({r.aval.str_short()}); autoshard shards global-view programs")

    lifted = {}  # a scalar constant the global view lifted into a shard_map: still a literal
    consts = {id(v): c for v, c in zip(prog.constvars, prog.consts)}
    for e in prog.eqns:
        if e.prim == "shard_map_enter" and len(e.invars) == 1:
            src = e.invars[0].resolve() if hasattr(e.invars[0], "resolve") else e.invars[0]
            c = consts.get(id(src), getattr(src, "value", None))
            if c is not None and np.size(c) == 1:
                lifted[id(e.outvars[0])] = np.asarray(c).reshape(()).astype(e.outvars[0].aval.dtype).item()
                continue
            if c is not None:  # a numpy array constant (a mask, a one-hot's arange): a const value with layouts
                new_value(e.outvars[0], f"const{len(values)}", "const", const=np.asarray(c))
                continue
        if e.prim not in SUPPORTED:
            hint = ("a shard_map is already sharded by hand: autoshard takes global-view programs"
                    if e.prim.startswith("shard_map") or e.prim in ("psum", "all_gather", "psum_scatter", "all_to_all",
                                                                    "ppermute", "axis_index")
                    else f"autoshard shards {', '.join(SUPPORTED)}")
            raise UntraceableError(f"[autoshard] cannot shard primitive {e.prim!r} in {name} "
                                   f"(scope {e.scope or '-'}, {e.phase} pass): {hint}")
        if len(e.outvars) != 1:
            raise UntraceableError(f"[autoshard] {e.prim} has {len(e.outvars)} results; autoshard takes one")
        op = Op(len(ops), f"{len(ops)}:{e.prim}", e.prim, dict(e.params),
                [operand(x, e.prim, e.scope) for x in e.invars], -1, e.phase, e.scope)
        op.output = new_value(e.outvars[0], f"%{len(ops)}", "op", producer=op.index)
        ops.append(op)

    outputs = []
    for var in prog.outvars:
        r = var.resolve()
        outputs.append(("value", var_index[id(r)]) if id(r) in var_index else ("literal", None))

    # dead code (a transform's unused cotangents) is dropped
    live = {i for k, i in outputs if k == "value"}
    keep = []
    for op in reversed(ops):
        if op.output in live:
            keep.append(op)
            live.update(i for k, i in op.inputs if k == "value")
    ops_live = list(reversed(keep))
    for op in ops_live:
        for slot, (k, i) in enumerate(op.inputs):
            if k == "value":
                values[i].consumers.append((op.index, slot))
    for op in ops_live:
        v = values[op.output]
        op.saved = op.phase == "forward" and any(ops[c].phase == "backward" for c, _ in v.consumers)

    mshape = pricer.shape
    by_shape: dict = {}  # one list of layouts per shape: inputs of a repeated layer share it
    input_dims = {}
    for v in values:
        if v.kind in ("input", "const") and v.consumers:
            if v.shape not in by_shape:
                by_shape[v.shape] = tensor_dims(v.shape, mshape)
            input_dims[v.index] = by_shape[v.shape]
    for i, dims in _fixed_layouts(in_specs, args, values, inputs).items():
        if i in input_dims:
            if dims not in input_dims[i]:
                v = values[i]
                raise ValueError(f"[autoshard] in_specs gives {v.name} {pspec(dims)}, which cannot shard its shape "
                                 f"{v.shape} on the mesh {mshape}")
            input_dims[i] = [dims]
    layouts = _Layouts(values, ops, input_dims)
    # the same op in every copy of a repeated layer (same signature, operands with the same
    # candidate layouts) gets the same candidate list: enumerated and priced once
    memo: dict = {}
    for op in progress.track(ops_live, f"autoshard: pricing the shardings of {len(ops_live)} ops"):
        sig = pricer.signature(op, values)
        key = (sig,) if op.prim == "einsum" or not follow else (
            sig, tuple(id(layouts.of(i)) if k == "value" else None for k, i in op.inputs))
        hit = memo.get(key)
        if hit is None:
            cands, main = _follow(op, values, layouts, pricer) if follow else ([], None)
            if not cands:
                cands, main = _candidates(op, values, pricer, mshape), None
            hit = memo[key] = (cands, main)
        op.candidates = hit[0]
        op.follows = None if hit[1] is None else layouts.leader(op.inputs[hit[1]][1])
        if not op.candidates:
            raise UntraceableError(f"[autoshard] no layout of {op.prim} (scope {op.scope or '-'}) can run on the "
                                   f"mesh {mshape}")
    carried = _carried(carry, lowered.out_tree, tree_util.tree_structure(args), outputs, inputs, values, input_dims,
                       name)
    problem, nodes = _problem(values, ops_live, input_dims, pricer, memory_limit_bytes, merge_layers, carried)
    return Program(name, mesh, values, ops, inputs, outputs, tree_util.tree_structure(args), lowered.out_tree, input_dims,
                   problem, nodes, pricer, time.perf_counter() - t0, f, carried)


def _carried(carry, out_tree, args_tree, outputs, inputs, values, input_dims, name) -> list:
    """``[(result leaf position, result value, argument value), ...]`` of `carry` (see
    `trace_program`), checked: each named result and argument exist and have leaves of the same
    shapes. Arguments the program does not read have no layout to keep and are left out."""
    if not carry:
        return []
    outs = tree_util.tree_unflatten(out_tree, list(range(len(outputs))))
    ins = tree_util.tree_unflatten(args_tree, list(range(len(inputs))))
    if not isinstance(outs, (tuple, list)):
        raise ValueError(f"[autoshard] carry= pairs results with arguments, but {name} returns one value, not a tuple")
    pairs = []
    for pair in carry:
        r, a = pair
        if not 0 <= r < len(outs) or not 0 <= a < len(ins):
            raise ValueError(f"[autoshard] carry pair {pair}: {name} returns {len(outs)} results and takes "
                             f"{len(ins)} arguments")
        lo, li = tree_util.tree_leaves(outs[r]), tree_util.tree_leaves(ins[a])
        shapes_o = [values[outputs[o][1]].shape if outputs[o][0] == "value" else None for o in lo]
        shapes_i = [values[inputs[i]].shape for i in li]
        if shapes_o != shapes_i:
            raise ValueError(f"[autoshard] carry pair {pair}: result {r} has leaves of shapes {shapes_o[:4]}"
                             f"{'...' if len(lo) > 4 else ''}, argument {a} {shapes_i[:4]}"
                             f"{'...' if len(li) > 4 else ''}: a carried result must match its argument")
        pairs += [(o, outputs[o][1], inputs[i]) for o, i in zip(lo, li) if inputs[i] in input_dims]
    return pairs


def _broadcast_in(out_shape, out_dims, shape) -> Dims:
    """An operand's layout under an elementwise op's output layout (right-aligned broadcasting)."""
    off = len(out_shape) - len(shape)
    return tuple(() if s == 1 and out_shape[off + d] != 1 else out_dims[off + d] for d, s in enumerate(shape))


class _Layouts:
    """The output layouts of each value's producer (an input's candidate layouts, or the
    out_dims of an op's candidates), as one interned tuple per distinct content: values of
    repeated layers share it, so its ``id`` keys the candidates of the ops that read them."""

    def __init__(self, values, ops, input_dims):
        self.values, self.ops, self.input_dims = values, ops, input_dims
        self._of_list: dict = {}  # id(candidate list or input layouts) -> (the list, interned layouts)
        self._interned: dict = {}

    def leader(self, i) -> tuple:
        p = self.values[i].producer
        return ("input", i) if p is None else ("op", p)

    def of(self, i) -> tuple:
        p = self.values[i].producer
        src = self.input_dims.get(i, ()) if p is None else self.ops[p].candidates
        hit = self._of_list.get(id(src))
        if hit is None or hit[0] is not src:
            lay = tuple(src) if p is None else tuple(c.out_dims for c in src)
            hit = self._of_list[id(src)] = (src, self._interned.setdefault(lay, lay))
        return hit[1]


def _follow(op: Op, values, layouts: _Layouts, pricer: _Pricer):
    """Alpa's follow nodes: an op that is not a contraction takes its main operand's layouts
    (the first operand of the output's shape, else the first), one candidate per candidate of
    the operand's producer, in the same order. Returns (candidates, the main operand's slot),
    or ([], None) where that cannot be done."""
    if op.prim == "einsum":
        return [], None
    arrays = [(slot, i) for slot, (k, i) in enumerate(op.inputs) if k == "value"]
    if not arrays:
        return [], None
    out_shape = values[op.output].shape

    # the operand of the output's shape with the most distinct layouts (not grad's replicated seed)
    full = [(slot, i) for slot, i in arrays if values[i].shape == out_shape] or [arrays[0]]
    main_slot, main = max(full, key=lambda si: len(set(layouts.of(si[1]))))
    v = values[main]
    lays = layouts.of(main)
    if not lays:
        return [], None
    shapes = [values[i].shape if k == "value" else None for k, i in op.inputs]
    out = []
    for lay in lays:
        if op.prim in _ELEMENTWISE and v.shape == out_shape:
            tries = (tuple(None if s is None else _broadcast_in(out_shape, lay, s) for s in shapes), lay)
        elif len(arrays) == 1:
            tries = (tuple(lay if k == "value" else None for k, _ in op.inputs), None)
        else:
            return [], None
        c = pricer.op(op, values, *tries)
        if c is None:
            return [], None
        out.append(c)
    return out, main_slot


def _candidates(op: Op, values, pricer: _Pricer, mshape) -> list:
    out_shape = values[op.output].shape
    shapes = [values[i].shape if k == "value" else None for k, i in op.inputs]
    tries = []
    if all(s is None for s in shapes):  # literals only (grad's seed reshaped): computed in place
        tries.append(((None,) * len(shapes), None))
    elif op.prim == "einsum":
        for ins, od in einsum_candidates(op.params["terms"], op.params["out"], shapes, mshape):
            tries.append((ins, od))
    elif op.prim in _ELEMENTWISE:
        for od in tensor_dims(out_shape, mshape):
            tries.append((tuple(None if s is None else _broadcast_in(out_shape, od, s) for s in shapes), od))
    else:  # reductions and reshapes: the input's layout decides
        for d in tensor_dims(shapes[0], mshape):
            tries.append(((d,), None))
    out, seen = [], set()
    for in_dims, out_kw in tries:
        c = pricer.op(op, values, in_dims, out_kw)
        if c is not None and (out_kw is None or c.out_dims == out_kw or op.prim != "einsum") and (c.in_dims, c.out_dims) not in seen:
            seen.add((c.in_dims, c.out_dims))
            out.append(c)
    return out


class _Signatures:
    """Each op's structural signature (see `_problem`), computed once per op."""

    def __init__(self, values, ops):
        self.values, self.ops = values, ops
        self._base: dict = {}
        self._sig: dict = {}

    def base(self, o) -> tuple:
        hit = self._base.get(o.index)
        if hit is None:
            shapes = tuple(self.values[i].shape if k == "value" else "lit" for k, i in o.inputs)
            hit = self._base[o.index] = (o.prim, repr(sorted((k, repr(v)) for k, v in o.params.items())), shapes,
                                         o.phase)
        return hit

    def __call__(self, op: Op) -> str:
        hit = self._sig.get(op.index)
        if hit is None:
            values, ops = self.values, self.ops
            prod = tuple(self.base(ops[values[i].producer]) if k == "value" and values[i].producer is not None
                         else ("input", values[i].shape) if k == "value" else "lit" for k, i in op.inputs)
            cons = tuple(sorted(repr(self.base(ops[c])) + str(s) for c, s in values[op.output].consumers))
            hit = self._sig[op.index] = hashlib.sha1(repr((self.base(op), prod, cons)).encode()).hexdigest()[:16]
        return hit


def _problem(values, ops, input_dims, pricer: _Pricer, memory_limit_bytes, merge_layers, carried=()):
    """The Problem of the priced ops. Ops and inputs of repeated layers share their candidate
    lists (see `trace_program`), so their strategies and edge matrices are built once per list
    and shared too (read-only)."""
    nodes, node_of, node_list = [], {}, []
    all_ops = {op.index: op for op in ops}
    op_seq = [None] * (max(all_ops) + 1 if all_ops else 0)
    for op in ops:
        op_seq[op.index] = op
    sig_count: dict = {}
    sigs = {}
    if merge_layers:
        signature = _Signatures(values, op_seq)
        cand_hash: dict = {}
        for op in ops:
            h = cand_hash.get(id(op.candidates))
            if h is None:
                h = cand_hash[id(op.candidates)] = hashlib.sha1(
                    repr([(c.in_dims, c.out_dims) for c in op.candidates]).encode()).hexdigest()[:8]
            sigs[("op", op.index)] = "op:" + signature(op) + h
        for vi in input_dims:
            v = values[vi]
            cons = tuple(sorted("op:" + signature(op_seq[c]) + str(s) for c, s in v.consumers))
            sigs[("input", vi)] = "in:" + hashlib.sha1(repr((v.shape, v.dtype.name, cons)).encode()).hexdigest()[:16]
        for s in sigs.values():
            sig_count[s] = sig_count.get(s, 0) + 1

    def tie(key):
        s = sigs.get(key)
        return ("repeated", s) if s is not None and sig_count[s] > 1 else (None, None)

    strat_memo: dict = {}  # (candidate list, shapes, ...) -> strategies, shared by repeated layers
    keep_alive = []  # the lists whose id keys a memo
    for vi, cands in input_dims.items():
        v = values[vi]
        key = ("input", id(cands), v.shape, v.dtype.name)
        strategies = strat_memo.get(key)
        if strategies is None:
            keep_alive.append(cands)
            strategies = strat_memo[key] = tuple(
                Strategy(str(pspec(d)), memory_bytes=pricer.local_bytes(v.shape, v.dtype, d), spec=pspec(d))
                for d in cands)
        lc, pos = tie(("input", vi))
        node_of[("input", vi)] = len(nodes)
        nodes.append(Node(v.name, strategies, layer_class=lc, position=pos))
        node_list.append(("input", vi))
    for op in ops:
        v = values[op.output]
        shapes = tuple(values[i].shape for k, i in op.inputs if k == "value")
        key = ("op", id(op.candidates), op.saved, shapes, v.shape, v.dtype.name)
        strategies = strat_memo.get(key)
        if strategies is None:
            keep_alive.append(op.candidates)
            strategies = []
            for c in op.candidates:
                mem = pricer.local_bytes(v.shape, v.dtype, c.out_dims) if op.saved else 0.0
                lk = (shapes, v.shape, c.in_dims, c.out_dims)
                label = pricer._labels.get(lk)
                if label is None:
                    label = pricer._labels[lk] = (
                        ",".join(dims_str(values[i].shape, d) for (k, i), d in zip(op.inputs, c.in_dims) if k == "value")
                        + " -> " + dims_str(v.shape, c.out_dims))
                strategies.append(Strategy(label, compute_s=c.compute_s, comm_s=c.comm_s, memory_bytes=mem,
                                           spec=pspec(c.out_dims)))
            strategies = strat_memo[key] = tuple(strategies)
        lc, pos = tie(("op", op.index))
        node_of[("op", op.index)] = len(nodes)
        leader = nodes[node_of[op.follows]].name if op.follows is not None else None
        nodes.append(Node(op.name, strategies, follows=leader, layer_class=lc, position=pos))
        node_list.append(("op", op.index))

    layouts = _Layouts(values, op_seq, input_dims)
    mat_memo: dict = {}  # (src layouts, dst candidates, slot, shape, dtype) -> matrix, shared
    mats: dict = {}
    for op in ops:
        dst = node_of[("op", op.index)]
        for slot, (k, i) in enumerate(op.inputs):
            if k != "value":
                continue
            v = values[i]
            src = node_of[layouts.leader(i)]
            srcs = layouts.of(i)
            key = (id(srcs), id(op.candidates), slot, v.shape, v.dtype.name)
            m = mat_memo.get(key)
            if m is None:
                keep_alive.append((srcs, op.candidates))
                m = mat_memo[key] = pricer.matrix(v.shape, v.dtype, srcs, [c.in_dims[slot] for c in op.candidates])
                m.flags.writeable = False
            mats[(src, dst)] = mats[(src, dst)] + m if (src, dst) in mats else m
    for _, vo, vi in carried:  # the result back to its argument's layout, for the next step
        v = values[vo]
        if layouts.leader(vo) not in node_of:  # a constant returned as is
            continue
        src, dst = node_of[layouts.leader(vo)], node_of[("input", vi)]
        if src == dst:
            continue
        m = pricer.matrix(v.shape, v.dtype, layouts.of(vo), input_dims[vi])
        mats[(src, dst)] = mats[(src, dst)] + m if (src, dst) in mats else m
    edges = [Edge(nodes[s].name, nodes[d].name, m) for (s, d), m in mats.items()]
    return Problem(nodes, edges, memory_limit_bytes=memory_limit_bytes), node_list
