"""`autoshard(f, *args, mesh=...)`: the intra-op search on a real program, and the plan it finds
as PartitionSpecs and as a function that runs it.

The plan runs the traced program op by op on global arrays: each operand is moved to the
layout its op's chosen candidate needs with ``shardlab.reshard`` (what the edge priced), then
the op runs with the global-view function it was priced with (``einsum`` with its
``out_sharding``, ``shardlab.numpy`` for the rest). So the ledger of a run holds exactly the
collectives the plan predicted (``ShardingPlan.collectives``), in the same order, and the
outputs equal the unsharded program's.

>>> import numpy as np, shardlab as sl
>>> import shardlab.numpy as jnp
>>> from shardlab.autoshard import autoshard
>>> mesh = sl.make_mesh((4,), ("x",), hardware="tpu-v5p")
>>> x, w = np.ones((4096, 256), np.float32), np.ones((256, 256), np.float32)
>>> plan = autoshard(lambda x, w: jnp.tanh(x @ w), x, w, mesh=mesh, memory_limit_bytes=2**21)
>>> plan.in_specs  # x (4 MiB) must be split to fit 2 MiB; w stays whole: no communication
(P('x',), P())
>>> out, ledger = plan.run(x, w)
>>> bool(np.allclose(np.asarray(out), np.tanh(x @ w))), [e for e in ledger.events if e["axes"]], plan.collectives
(True, [], [])
"""

from __future__ import annotations

import dataclasses

import numpy as np

import shardlab as sl
from shardlab import tree_util
from shardlab.units import fmt_bytes, fmt_seconds

from .ilp import solve
from .solution import Solution
from .specs import dims_str, pspec
from .trace import Program, apply_op, trace_program

__all__ = ["Collective", "ShardingPlan", "autoshard"]


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective the plan runs: where (``reshard %3 -> 4:einsum`` or the op), JAX's name,
    the mesh axes, the bytes each device sends and the seconds the cost model gives."""

    where: str
    op: str
    axes: tuple
    bytes_sent: float
    seconds: float = 0.0

    def key(self) -> tuple:
        return (self.op, tuple(self.axes), float(self.bytes_sent))


class ShardingPlan:
    """The chosen sharding of every value of a traced program, and how to run it.

    Attributes:
        program: the traced `Program` (its ops, values and the `Problem`).
        solution: the solver's `Solution` (objective, parts, memory, solve time).
        in_specs: a PartitionSpec per argument leaf, in the arguments' pytree structure.
        specs: ``{value name: PartitionSpec}`` for every argument and every op result.
        collectives: the collectives a run records, in order (`Collective`).
        estimate_s: the plan's step time (compute + communication + resharding, summed).
    """

    def __init__(self, program: Program, solution: Solution):
        self.program = program
        self.solution = solution
        prob = program.problem
        self.choice = [solution.choices[n.name] for n in prob.nodes]
        self._dims: dict = {}  # value index -> chosen dims
        self._cand: dict = {}  # op index -> chosen Candidate
        for node, (kind, i) in enumerate(program.nodes):
            if kind == "input":
                self._dims[i] = program.input_dims[i][self.choice[node]]
            else:
                c = program.ops[i].candidates[self.choice[node]]
                self._cand[i] = c
                self._dims[program.ops[i].output] = c.out_dims
        values = program.values
        flat_in = [pspec(self._dims.get(i, ((),) * len(values[i].shape))) for i in program.inputs]
        self.in_specs = tree_util.tree_unflatten(program.args_tree, flat_in)
        self.specs = {values[i].name: pspec(d) for i, d in sorted(self._dims.items())}
        self.collectives = self._predict()
        self.estimate_s = float(solution.objective)

    # -- what the plan says ----------------------------------------------------------------------
    @property
    def mesh(self):
        return self.program.mesh

    @property
    def ops(self) -> list:
        """The program's ops the plan runs, in program order (each has a chosen candidate)."""
        return [op for op in self.program.ops if op.index in self._cand]

    def dims(self, index: int) -> tuple:
        """The chosen layout of value ``index`` of the program: a tuple of mesh axes per
        dimension (``()`` for a replicated one; all replicated when the plan placed none).

        Raises:
            IndexError: ``index`` is not a value of the program (``plan.program.values``)."""
        n = len(self.program.values)
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < n:
            raise IndexError(f"[ShardingPlan.dims] value index {index!r} is not one of the program's {n} values "
                             f"(0..{n - 1}; an op's result is op.output, an argument's plan.program.inputs[i])")
        return self._dims.get(index, ((),) * len(self.program.values[index].shape))

    def _predict(self) -> list:
        out = []
        pr = self.program.pricer
        for op in self.ops:
            cand = self._cand[op.index]
            for (k, i), want in zip(op.inputs, cand.in_dims):
                if k != "value":
                    continue
                v = self.program.values[i]
                sec, colls = pr.reshard_run(v.shape, v.dtype, self._dims[i], want)
                per = sec / max(len(colls), 1)
                out += [Collective(f"reshard {v.name} -> {op.name}", c, a, b, per) for c, a, b in colls]
            per = cand.comm_s / max(len(cand.collectives), 1)
            out += [Collective(op.name, c, a, b, per) for c, a, b in cand.collectives]
        for _, vo, vi in self.program.carry:  # results back to their arguments' layouts
            v = self.program.values[vo]
            sec, colls = pr.reshard_run(v.shape, v.dtype, self._dims[vo], self._dims[vi])
            per = sec / max(len(colls), 1)
            out += [Collective(f"carry {v.name} -> {self.program.values[vi].name}", c, a, b, per) for c, a, b in colls]
        return out

    def value_spec(self, name: str):
        """The PartitionSpec of the value called `name` (an argument's path or ``%i``)."""
        return self.specs[name]

    def layout(self, index: int) -> str:
        v = self.program.values[index]
        return dims_str(v.shape, self._dims[index])

    # -- running it --------------------------------------------------------------------------------
    def fun(self, *flat):
        """Runs the program on the arguments' leaves, already placed as `in_specs` (global arrays
        on the plan's mesh); returns the results' pytree."""
        prog = self.program
        mesh = flat[0].sharding.mesh if flat and hasattr(flat[0], "sharding") else prog.mesh
        env = dict(zip(prog.inputs, flat))
        self.run_ops(env, self.ops, mesh)
        leaves = [env[i] if k == "value" else i for k, i in prog.outputs]
        for o, vo, vi in prog.carry:
            if self._dims[vo] != self._dims[vi]:
                leaves[o] = sl.reshard(leaves[o], sl.NamedSharding(mesh, pspec(self._dims[vi])))
        return tree_util.tree_unflatten(prog.out_tree, leaves)

    def run_ops(self, env: dict, ops, mesh) -> None:
        """Runs `ops` (planned ops of the program, in its order) on `env` (``{value index: global
        array}`` on `mesh`, the arguments placed as `in_specs`), adding their results: each operand
        moved to its op's chosen layout first. A pipeline stage runs its ops in two such parts."""
        prog = self.program
        for v in prog.values:
            if v.kind == "const" and v.index in self._dims and v.index not in env:
                env[v.index] = sl.device_put(v.const, sl.NamedSharding(mesh, pspec(self._dims[v.index])))
        for op in ops:
            cand = self._cand[op.index]
            args = []
            for (k, i), want in zip(op.inputs, cand.in_dims):
                if k != "value":
                    args.append(i)
                    continue
                x = env[i]
                if self._dims[i] != want:
                    x = sl.reshard(x, sl.NamedSharding(mesh, pspec(want)))
                args.append(x)
            env[op.output] = apply_op(op, args, prog.values[op.output].shape, cand.out_kw, mesh, cand.in_dims)

    def place(self, *args):
        """The arguments' leaves put on the mesh with the planned shardings."""
        leaves = tree_util.tree_leaves(args)
        mesh = self.program.mesh
        return [sl.device_put(np.asarray(x) if not hasattr(x, "sharding") else x,
                              sl.NamedSharding(mesh, pspec(self._dims.get(i, ()))))
                for x, i in zip(leaves, self.program.inputs)]

    def run(self, *args):
        """Places `args` and runs the plan on the mesh's virtual devices; returns
        ``(outputs, ledger)`` with the ledger of the run (placing the arguments excluded)."""
        if getattr(self.program.mesh, "abstract", False):
            raise ValueError("[autoshard] the plan's mesh is abstract (no data): use plan.lower() for its program "
                             "and costs, or autoshard on a concrete mesh to run it")
        placed = self.place(*args)
        with sl.Ledger() as ledger:
            out = self.fun(*placed)
        return out, ledger

    def lower(self):
        """``shardlab.jit`` of the plan lowered shape-only: ``.as_text()``, ``.cost_analysis()``;
        works on abstract meshes of any size."""
        mesh = self.program.mesh
        structs = [sl.ShapeDtypeStruct(self.program.values[i].shape, self.program.values[i].dtype,
                                       sharding=sl.NamedSharding(mesh, pspec(self._dims.get(i, ()))))
                   for i in self.program.inputs]
        return sl.jit(self.fun).lower(*structs)

    def check(self, *args, rtol: float = 1e-4, reference=None) -> dict:
        """Runs the plan and checks it: outputs equal `reference` (default: the function run
        unsharded on the same inputs) to `rtol` of each result's largest magnitude, and the
        ledger's collectives equal `collectives` in order (op, axes, bytes). Returns
        ``{"outputs", "ledger", "max_rel_err"}``; raises AssertionError."""
        out, ledger = self.run(*args)
        ref = reference if reference is not None else self.program.fun(*args)
        got_l, ref_l = tree_util.tree_leaves(out), tree_util.tree_leaves(ref)
        assert len(got_l) == len(ref_l), f"{len(got_l)} results, the reference has {len(ref_l)}"
        err = 0.0
        for g, r in zip(got_l, ref_l):
            g, r = np.asarray(g, np.float64), np.asarray(r, np.float64)
            assert g.shape == r.shape, f"result shape {g.shape} != {r.shape}"
            rel = float(np.max(np.abs(g - r)) / max(np.max(np.abs(r)), 1e-30)) if g.size else 0.0
            assert rel <= rtol, f"results differ by {rel:.3g} of their magnitude (rtol {rtol})"
            err = max(err, rel)
        seen = [(e["op"], tuple(e["axes"]), float(e["bytes_sent"])) for e in ledger.events if e["axes"]]
        want = [c.key() for c in self.collectives]
        assert seen == want, f"ledger {seen} != plan {want}"
        return {"outputs": out, "ledger": ledger, "max_rel_err": err}

    # -- display -------------------------------------------------------------------------------------
    def summary(self) -> str:
        s = self.solution
        n_bytes = sum(c.bytes_sent for c in self.collectives)
        lines = [f"autoshard plan of {self.program.fun_name} on mesh {dict(self.mesh.shape)} ({self.mesh.hardware.name})",
                 f"estimated step {fmt_seconds(self.estimate_s)} = compute {fmt_seconds(s.compute_s)} + comm {fmt_seconds(s.comm_s)} "
                 f"+ reshard {fmt_seconds(s.reshard_s)}; memory {fmt_bytes(s.memory_bytes)} per device",
                 f"{len(self.collectives)} collectives, {fmt_bytes(n_bytes)} sent per device; "
                 f"{'proven optimal' if s.proven_optimal else 'NOT proven optimal'} in {fmt_seconds(s.solve_seconds)} "
                 f"(trace and pricing {fmt_seconds(self.program.trace_seconds)})"]
        for i in self.program.inputs:
            v = self.program.values[i]
            if i in self._dims:
                lines.append(f"  {v.name}: {self.specs[v.name]}  {dims_str(v.shape, self._dims[i])}")
        return "\n".join(lines)

    def __repr__(self):
        return self.summary()
def autoshard(f, *args, mesh, memory_limit_bytes: float | None = None, time_limit_s: float | None = 60.0,
              merge_layers: bool = True, shrink: bool = True, follow: bool = True, in_specs=None,
              pricer=None, carry=None) -> ShardingPlan:
    """Finds the fastest sharding of `f(*args)` on `mesh` under a per-device memory limit.

    Traces `f` (see `trace_program`), solves the intra-op problem with HiGHS (`solve`) and
    returns the `ShardingPlan`: PartitionSpecs for every argument and value, the collectives a
    run records, and ``run`` / ``check`` / ``lower`` to execute it.

    Args:
        f: a global-view function (``shardlab.numpy``, ``einsum``, ``grad``, ...).
        *args: example arrays or ShapeDtypeStructs (pytrees).
        mesh: the mesh (with hardware; abstract meshes plan without running).
        memory_limit_bytes: per-device limit (None: none); `MemoryLimitError` when nothing fits.
        time_limit_s: the solver's limit; past it the best plan found, with a warning.
        merge_layers: tie repeated layers to one decision (exact for identical blocks).
        shrink: the solver's exact shrinking passes.
        follow: ops other than contractions take their operand's layouts (Alpa's follow nodes).
        in_specs: fix some arguments' layouts (a hand-written strategy; see `trace_program`).
        pricer: reuse the prices of an earlier plan on the same mesh (``plan.program.pricer``).
        carry: ``[(result index, argument index), ...]``: results that are the next step's
            arguments (new parameters, optimizer state), returned in their argument's layout
            and the resharding priced (see `trace_program`).
    """
    program = trace_program(f, *args, mesh=mesh, memory_limit_bytes=memory_limit_bytes, merge_layers=merge_layers,
                            follow=follow, in_specs=in_specs, pricer=pricer, carry=carry)
    solution = solve(program.problem, shrink=shrink, time_limit_s=time_limit_s)  # with its own progress bar
    return ShardingPlan(program, solution)

