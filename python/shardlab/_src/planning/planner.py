"""The sharded matmul planner: which collectives a global-view einsum needs, and what they cost.

Given operands sharded over a mesh and a wanted output sharding, ``plan_einsum`` searches the
moves of the book's part 3 — AllGather (drop a subscript), AllToAll (move a subscript to
another dim), dynamic slicing (add a subscript to a replicated dim, free), local contraction
(sharded contracting dims leave the result unreduced, {U_X}), AllReduce and ReduceScatter
(clear {U_X}) — and keeps the cheapest. With hardware on the mesh, "cheapest" is estimated
time (``shardlab.cost``); without, bytes sent per device, then FLOPs per device. Bytes are
counted exactly as the ledger counts them, so a plan's prediction can be checked against
the ledger of its run (``shardlab.einsum``).

The four cases fall out of the search: case 1 needs no communication; case 2 gathers the
sharded operand or slices the other and reduces; case 3 multiplies locally and reduces;
case 4 gathers one operand because one mesh axis cannot shard two dims.

Example:
    >>> import shardlab as sl
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((4,), ("X",))
    >>> plan = sl.plan_einsum("ij,jk->ik", ((64, 256), P(None, "X")), ((256, 32), P("X", None)),
    ...                       out_sharding=P(), mesh=mesh)
    >>> print(plan.steps[-1])
    AllReduce_X(C[I, K]{U_X}) -> C[I, K]
"""


from __future__ import annotations

import heapq
import itertools
import math

import numpy as np

from ..arrays.sharded_array import ShardedArray
from ..core.dtypes import bfloat16
from ..core.einsum_spec import parse
from ..core.mesh import get_mesh
from ..core.sharding import DuplicateSpecError, NamedSharding, P, PartitionSpec
from ..cost import model as cost
from ..cost.formulas import collective_bytes
from .plan import Layout, Plan, Step, Term


# -- costs ------------------------------------------------------------------------------------

class _Costs:
    """Bytes and seconds of collectives and contractions on one mesh (memoized per plan)."""

    def __init__(self, mesh, overlap: str = "max"):
        self.mesh = mesh
        self.hw = mesh.hardware is not None
        self.overlap = overlap
        self._memo: dict = {}

    def collective(self, op: str, axes: tuple, bytes_in: int) -> tuple[float, float | None]:
        n = math.prod(self.mesh.shape[a] for a in axes)
        if op not in ("all_gather", "psum", "psum_scatter", "all_to_all"):
            raise ValueError(f"[plan_einsum] no cost for {op!r}")
        out, _, sent = collective_bytes(op, n, bytes_in)
        out = int(out)
        if not self.hw:
            return float(sent), None
        key = (op, axes, bytes_in)
        if key not in self._memo:
            self._memo[key] = float(cost.event_seconds(
                {"op": op, "axes": axes, "group_size": n, "bytes_in": bytes_in, "bytes_out": out}, self.mesh))
        return float(sent), self._memo[key]

    def compute(self, flops: float, hbm_bytes: float, dtype) -> float | None:
        if not self.hw:
            return None
        return float(cost.event_seconds({"op": "einsum", "flops": flops, "hbm_bytes": hbm_bytes,
                                         "dtype": np.dtype(dtype).name}, self.mesh))

    def key(self, acc) -> tuple:
        """Ranking key of an accumulated cost (bytes, comm s, compute s, FLOPs, collectives,
        steps): time on hardware, else bytes; then bytes, FLOPs, collectives and steps."""
        b, comm, comp, f, n, m = acc
        if self.hw:
            t = max(comm, comp) if self.overlap == "max" else comm + comp
            return (round(t, 15), b, f, n, m)
        return (b, f, n, m)


_ZERO = (0.0, 0.0, 0.0, 0.0, 0, 0)


def _add(*accs) -> tuple:
    return tuple(map(sum, zip(*accs)))


def _acc(step: "Step") -> tuple:
    if step.op == "einsum":
        return (0.0, 0.0, step.seconds or 0.0, step.flops, 0, 1)
    if step.op == "dynamic_slice":
        return (0.0, 0.0, 0.0, 0.0, 0, 1)
    return (step.bytes_sent, step.seconds or 0.0, 0.0, 0.0, 1, 1)


# -- resharding: Dijkstra over layouts -----------------------------------------------------------

def _moves(t: Term, mesh, costs: _Costs):
    """Every single move from ``t``: (op, axes, dim, dim2, new Layout)."""
    lay, sizes = t.layout, mesh.shape
    local = t.local_shape(mesh)
    free = [a for a in mesh.axis_names if a not in lay.used()]
    for d, axes in enumerate(lay.dims):
        for k in range(1, len(axes) + 1):  # gather a minor suffix: the rest stays a valid layout
            yield "all_gather", axes[-k:], d, None, _with(lay, {d: axes[:-k]})
        if axes:
            a = axes[-1]
            for d2 in range(len(lay.dims)):
                if d2 != d and local[d2] % sizes[a] == 0:
                    yield "all_to_all", (a,), d, d2, _with(lay, {d: axes[:-1], d2: lay.dims[d2] + (a,)})
    for a in free:
        for d in range(len(lay.dims)):
            if local[d] % sizes[a] == 0:
                yield "dynamic_slice", (a,), d, None, _with(lay, {d: lay.dims[d] + (a,)})
    u = [a for a in mesh.axis_names if a in lay.unreduced]
    for r in range(1, len(u) + 1):
        for group in itertools.combinations(u, r):
            rest = lay.unreduced - set(group)
            yield "psum", group, None, None, Layout(lay.dims, rest)
            for d in range(len(lay.dims)):
                if local[d] % math.prod(sizes[a] for a in group) == 0:
                    yield "psum_scatter", group, d, None, Layout(_with(lay, {d: lay.dims[d] + group}).dims, rest)


def _with(lay: Layout, changes: dict) -> Layout:
    return Layout(tuple(changes.get(i, d) for i, d in enumerate(lay.dims)), lay.unreduced)


def _step(op, axes, d, d2, t: Term, new: Layout, mesh, costs: _Costs) -> Step:
    out = Term(t.name, t.labels, new, t.shape, t.dtype)
    if op == "dynamic_slice":
        return Step(op, (t,), out, axes, d, d2, 0.0, 0.0, 0.0 if costs.hw else None, mesh_order=mesh.axis_names)
    sent, sec = costs.collective(op, axes, t.local_bytes(mesh))
    return Step(op, (t,), out, axes, d, d2, sent, 0.0, sec, mesh_order=mesh.axis_names)


_REACH: dict = {}  # reachability is pure in (mesh, hardware, term, moves): shared across plans


def _reachable(t: Term, mesh, costs: _Costs, ops=None) -> dict:
    """Layout → (acc, parent layout, step) of the cheapest way to reach it from ``t``
    (Dijkstra), using only the moves in ``ops`` if given. ``_path`` reads the steps."""
    hw = mesh.hardware.name if mesh.hardware is not None else None
    mk = (mesh, hw, repr(getattr(mesh, "physical_axes", None)), costs.overlap, t.name, t.labels, t.layout,
          t.shape, t.dtype, ops)
    if mk in _REACH:
        return _REACH[mk]
    best = {t.layout: (_ZERO, None, None)}
    heap = [(costs.key(_ZERO), 0, t.layout)]
    tick = itertools.count(1)
    done = set()
    while heap:
        _, _, lay = heapq.heappop(heap)
        if lay in done:
            continue
        done.add(lay)
        acc = best[lay][0]
        cur = Term(t.name, t.labels, lay, t.shape, t.dtype)
        for op, axes, d, d2, new in _moves(cur, mesh, costs):
            if new in done or (ops is not None and op not in ops):
                continue
            step = _step(op, axes, d, d2, cur, new, mesh, costs)
            a = _add(acc, _acc(step))
            if new not in best or costs.key(a) < costs.key(best[new][0]):
                best[new] = (a, lay, step)
                heapq.heappush(heap, (costs.key(a), next(tick), new))
    if len(_REACH) > 50000:
        _REACH.clear()
    _REACH[mk] = best
    return best


def _path(reach: dict, lay: Layout) -> list:
    steps = []
    while reach[lay][2] is not None:
        steps.append(reach[lay][2])
        lay = reach[lay][1]
    return steps[::-1]


# -- inputs -----------------------------------------------------------------------------------

def layout_of(spec: PartitionSpec, rank: int, mesh, unreduced=(), op: str = "plan_einsum") -> Layout:
    """A Layout from a PartitionSpec, with the book's explanation if an axis is used twice."""
    if not isinstance(spec, PartitionSpec):
        spec = P(*spec) if isinstance(spec, (tuple, list)) else P() if spec is None else spec
    if len(spec) > rank:
        raise ValueError(f"[{op}] spec {spec!r} has {len(spec)} entries for an array of rank {rank}")
    dims = spec.normalized(rank)
    seen: dict = {}
    for d, axes in enumerate(dims):
        for a in axes:
            if a not in mesh.shape:
                raise ValueError(f"[{op}] spec {spec!r} names axis {a!r}; the mesh has axes {mesh.axis_names}")
            if a in seen:
                raise DuplicateSpecError(
                    f"[{op}] spec {spec!r} uses mesh axis {a!r} for dims {seen[a]} and {d}: a mesh axis "
                    f"can shard only one dim (device i along {a!r} would hold only block (i, i), the "
                    f"diagonal: the book's case 4). Gather one of them, e.g. drop {a!r} from dim {d}")
            seen[a] = d
    u = frozenset(unreduced or ())
    for a in u:
        if a not in mesh.shape:
            raise ValueError(f"[{op}] unreduced axis {a!r} is not a mesh axis {mesh.axis_names}")
        if a in seen:
            raise DuplicateSpecError(f"[{op}] axis {a!r} both shards dim {seen[a]} and is unreduced; "
                                     f"a value is either sharded or unreduced along an axis")
    return Layout(dims, u)


def _operand(x, op: str):
    """(shape, dtype, NamedSharding, unreduced) of a ShardedArray or a (shape, sharding[, dtype]) tuple."""
    if isinstance(x, ShardedArray):
        return x.shape, x.dtype, x.sharding, x.unreduced
    if isinstance(x, tuple) and len(x) in (2, 3) and isinstance(x[0], (tuple, list)):
        dtype = np.dtype(x[2]) if len(x) == 3 else np.dtype(np.float32)
        if len(x) == 3 and isinstance(x[2], str) and x[2] == "bfloat16":
            dtype = bfloat16
        shape = tuple(x[0])
        for d, size in enumerate(shape):
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
                raise TypeError(f"[{op}] shape {shape} has dim {d} = {size!r}; sizes must be ints")
            if size < 0:
                raise ValueError(f"[{op}] shape {shape} has dim {d} of size {size}; sizes must be >= 0")
        sharding = x[1]
        if not isinstance(sharding, (NamedSharding, PartitionSpec, tuple)):
            raise TypeError(f"[{op}] the sharding of operand {shape} must be a NamedSharding or PartitionSpec, "
                            f"got {sharding!r}")
        return tuple(int(s) for s in shape), dtype, sharding, frozenset()
    raise TypeError(f"[{op}] operands must be ShardedArrays or (shape, sharding[, dtype]) tuples, "
                    f"got {type(x).__name__}")


def _parse(subscripts: str, shapes, op: str):
    """The one einsum parser (core.einsum_spec), plus the planner's own limit: no traces."""
    terms, rhs = parse(subscripts, shapes, op)
    for t in terms:
        if len(set(t)) != len(t):
            raise NotImplementedError(f"[{op}] repeated letter in {t!r} (a trace) is not supported")
    return terms, rhs


def _out_layout(out_sharding, unreduced, rank, mesh, op):
    if out_sharding is not None and not isinstance(out_sharding, (NamedSharding, PartitionSpec, tuple)):
        raise TypeError(f"[{op}] the target sharding must be a NamedSharding or a PartitionSpec, got "
                        f"{out_sharding!r}; for one axis write P({out_sharding!r})")
    if out_sharding is None:
        if unreduced:
            return Layout(((),) * rank, frozenset(unreduced))
        return None
    if isinstance(out_sharding, NamedSharding):
        if out_sharding.mesh != mesh:
            raise ValueError(f"[{op}] out_sharding lives on {out_sharding.mesh!r} but the operands on {mesh!r}")
        out_sharding = out_sharding.spec
    return layout_of(out_sharding, rank, mesh, unreduced, op)


# -- contraction search ---------------------------------------------------------------------------

def _case_notes(terms: list, out_labels: str, mesh) -> list:
    """Which of the book's four cases a binary contraction is in, per mesh axis."""
    if len(terms) != 2:
        return []
    a, b = terms
    contracting = (set(a.labels) & set(b.labels)) - set(out_labels)
    where = {}
    for t in (a, b):
        for l, axes in zip(t.labels, t.layout.dims):
            for ax in axes:
                where.setdefault(ax, []).append((t.name, l))
    notes = []
    for ax in mesh.axis_names:
        w = where.get(ax, [])
        on_c = [(n, l) for n, l in w if l in contracting]
        if len(w) == 2 and len(on_c) == 2 and w[0][1] == w[1][1] and a.layout.dims[a.labels.index(w[0][1])] == \
                b.layout.dims[b.labels.index(w[0][1])]:
            notes.append(f"case 3 on {ax}: both operands shard the contracting dim {w[0][1].upper()} along {ax}: "
                         f"multiply locally to {{U_{ax}}}, then AllReduce or ReduceScatter")
        elif len(w) == 2 and w[0][1] != w[1][1]:
            notes.append(f"case 4 on {ax}: {w[0][0]} shards {w[0][1].upper()} and {w[1][0]} shards "
                         f"{w[1][1].upper()} along {ax}; one axis cannot shard two dims, so one is gathered")
        elif len(on_c) == 1 and len(w) == 1:
            n, l = on_c[0]
            notes.append(f"case 2 on {ax}: only {n} shards the contracting dim {l.upper()} along {ax}: "
                         f"AllGather it, or slice the other operand, multiply and reduce")
    if not notes:
        notes.append("case 1: no contracting dim is sharded: the local blocks multiply with no communication")
    return notes


def _contract(terms: list, out: Term, target: Layout | None, mesh, costs: _Costs, keep: int = 6):
    """The ``keep`` cheapest distinct ways (by their collectives) to contract ``terms`` into
    ``out`` with layout ``target`` (None: the layout the rules give). Each: (key, steps, Term)."""
    reach = []
    for t in terms:
        r = _reachable(t, mesh, costs)
        reach.append([(lay, acc) for lay, (acc, _, _) in r.items() if not lay.unreduced])
    out_set = set(out.labels)
    # Without a wanted layout, keep the rules' layout: never slice a dim that survives into the output.
    given = {l: {a for t in terms for m, axes in zip(t.labels, t.layout.dims) if m == l for a in axes}
             for l in out.labels}
    all_labels = {l for t in terms for l in t.labels}
    dtype = np.result_type(*[t.dtype for t in terms])
    sizes = {l: s for t in terms for l, s in zip(t.labels, t.shape)}
    found = []
    for combo in itertools.product(*reach):
        axes_of: dict = {}
        owner: dict = {}
        ok = True
        for t, (lay, _) in zip(terms, combo):
            for l, axes in zip(t.labels, lay.dims):
                if axes_of.setdefault(l, axes) != axes:
                    ok = False  # a shared dim must be split the same way in every operand
                for a in axes:
                    if owner.setdefault(a, l) != l:
                        ok = False  # one mesh axis on two dims: only the diagonal blocks would meet
            if not ok:
                break
        if not ok or (target is None and any(not set(axes_of[l]) <= given[l] for l in out.labels)):
            continue
        dims = tuple(axes_of[l] for l in out.labels)
        unreduced = frozenset(a for l in all_labels - out_set for a in axes_of[l])
        c = Term(out.name, out.labels, Layout(dims, unreduced), out.shape, dtype)
        ins = tuple(Term(t.name, t.labels, lay, t.shape, t.dtype) for t, (lay, _) in zip(terms, combo))
        local = {l: sizes[l] // math.prod(mesh.shape[a] for a in axes_of[l]) for l in all_labels}
        flops = 2.0 * math.prod(local.values())
        hbm = sum(t.local_bytes(mesh) for t in ins) + c.local_bytes(mesh)
        mult = Step("einsum", ins, c, flops=flops, seconds=costs.compute(flops, hbm, dtype),
                    hbm_bytes=hbm, mesh_order=mesh.axis_names)
        # Without a wanted layout only the unreduced axes are cleared; nothing else moves.
        post = _reachable(c, mesh, costs, None if target is not None else ("psum", "psum_scatter"))
        ends = [target] if target is not None else [lay for lay in post if not lay.unreduced]
        pre = _add(*[acc for _, acc in combo], _acc(mult))
        for e in ends:
            if e in post:
                total = _add(pre, post[e][0])
                found.append((costs.key(total), len(found), combo, mult, post, e))
    found.sort(key=lambda f: f[:2])
    out_cands, seen = [], set()
    for k, _, combo, mult, post, e in found:
        steps = [st for t, (lay, _) in zip(terms, combo) for st in _path(_reachable(t, mesh, costs), lay)]
        steps += [mult] + _path(post, e)
        sig = tuple((s.op, s.axes, s.inputs[0].name) for s in steps if s.op not in ("einsum", "dynamic_slice"))
        if sig in seen:
            continue
        seen.add(sig)
        out_cands.append((k, steps, steps[-1].output))
        if len(out_cands) >= keep:
            break
    return out_cands


def _direct_rejection(terms: list, out_labels: str) -> list:
    """Why multiplying the operands as they are is impossible, if it is."""
    axes_of, owner, why = {}, {}, []
    for t in terms:
        for l, axes in zip(t.labels, t.layout.dims):
            if axes_of.setdefault(l, axes) != axes:
                why.append(f"dim {l.upper()} is split as {axes_of[l] or 'unsharded'} in one operand and "
                           f"{axes or 'unsharded'} in {t.name}; local blocks would not line up")
            for a in axes:
                if owner.setdefault(a, (l, t.name))[0] != l:
                    why.append(f"mesh axis {a!r} shards {owner[a][1]}'s {owner[a][0].upper()} and {t.name}'s "
                               f"{l.upper()}: the result would need {a!r} twice (only diagonal blocks meet)")
    if not why:
        return []
    what = " . ".join(t.render() for t in terms) + " locally, as given"
    return [(what, "; ".join(why))]


def plan_einsum(subscripts: str, *operands, out_sharding=None, unreduced=(), mesh=None, names=None,
                overlap: str = "max") -> Plan:
    """Plans a sharded einsum without running it.

    Args:
        subscripts: numpy einsum subscripts (explicit ``->`` or implicit; no ellipsis).
        *operands: ShardedArrays, or ``(shape, sharding_or_spec[, dtype])`` tuples (no data).
        out_sharding: wanted output NamedSharding or PartitionSpec; None picks the cheapest.
        unreduced: mesh axes the output may stay unreduced along ({U_X}).
        mesh: the mesh, when the operands are tuples with bare PartitionSpecs.
        names: names for the operands and the output (default A, B, ..., then the next letter).
        overlap: "max" (comm overlaps compute, as the book assumes) or "sum" for ``Plan.seconds``.

    Returns:
        The cheapest Plan; ``plan.alternatives`` holds the runners-up with their costs.

    Raises:
        DuplicateSpecError: out_sharding would use one mesh axis twice.
        ValueError: bad subscripts, shapes, axes, or no way to reach the wanted output.

    Example:
        >>> import shardlab as sl
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((2, 2), ("X", "Y"))
        >>> p = sl.plan_einsum("ij,jk->ik", ((8, 8), P("X")), ((8, 8), P(None, "Y")), mesh=mesh)
        >>> p.summary(), p.bytes_sent
        ('A[I_X, J] ._J B[J, K_Y] -> C[I_X, K_Y]', 0.0)
    """
    op = "plan_einsum"
    if not operands:
        raise ValueError(f"[{op}] pass at least one operand")
    infos = [_operand(x, op) for x in operands]
    meshes = [s.mesh for _, _, s, _ in infos if isinstance(s, NamedSharding)]
    if mesh is None:
        if not meshes:
            mesh = get_mesh()
        else:
            mesh = meshes[0]
    if mesh is None:
        raise ValueError(f"[{op}] no mesh: pass mesh=, NamedShardings or call shardlab.set_mesh(mesh)")
    if any(m != mesh for m in meshes):
        raise ValueError(f"[{op}] the operands live on different meshes; device_put them onto one")
    labels, out_labels = _parse(subscripts, [i[0] for i in infos], op)
    n = len(infos)
    names = list(names) if names is not None else [chr(ord("A") + i) for i in range(n + 1)]
    if len(names) != n + 1:
        raise ValueError(f"[{op}] names needs {n + 1} entries (operands and output), got {len(names)}")
    terms, sizes = [], {}
    for i, ((shape, dtype, sh, u), lab) in enumerate(zip(infos, labels)):
        spec = sh.spec if isinstance(sh, NamedSharding) else sh
        lay = layout_of(spec, len(shape), mesh, u, op)
        sizes.update(zip(lab, shape))
        if isinstance(spec, PartitionSpec):  # the one divisibility check: the sharding's own
            NamedSharding(mesh, spec).check_shape(shape, f"{op}] [operand {i}")
        terms.append(Term(names[i], lab, lay, tuple(shape), np.dtype(dtype)))
    target = _out_layout(out_sharding, unreduced, len(out_labels), mesh, op)
    out_shape = tuple(sizes[l] for l in out_labels)
    if target is not None:
        for d, (s, axes) in enumerate(zip(out_shape, target.dims)):
            k = math.prod(mesh.shape[a] for a in axes)
            if s % k:
                raise ValueError(f"[{op}] output dim {d} has size {s}, not divisible by {k} (axes {axes})")
    if overlap not in ("max", "sum"):
        raise ValueError(f"[{op}] overlap={overlap!r}; use 'max' or 'sum'")
    costs = _Costs(mesh, overlap)
    best = _search(terms, out_labels, out_shape, names[n], target, mesh, costs)
    if not best:
        why = f"no sequence of collectives reaches {Term(names[n], out_labels, target, out_shape, np.float32).render()}"
        if target is not None and target.unreduced:
            why += (": an output is unreduced along an axis only if a dim sharded along it is contracted "
                    "locally; shard that contracting dim along it or drop it from unreduced")
        raise ValueError(f"[{op}] {why}")
    (_, steps, out_term), rest = best[0], best[1:]
    alts = [Plan(subscripts, mesh, terms, o, s, overlap=overlap) for _, s, o in rest[:5]]
    return Plan(subscripts, mesh, terms, out_term, steps, _case_notes(terms, out_labels, mesh), alts,
                _direct_rejection(terms, out_labels), overlap)


def _search(terms, out_labels, out_shape, out_name, target, mesh, costs):
    """Candidates for contracting all ``terms``; more than two go pairwise in every order."""
    if len(terms) <= 2:
        out = Term(out_name, out_labels, Layout(((),) * len(out_labels)), out_shape, np.float32)
        return _contract(terms, out, target, mesh, costs)
    results = []
    for i, j in itertools.combinations(range(len(terms)), 2):
        rest = [t for k, t in enumerate(terms) if k not in (i, j)]
        keep = set(out_labels) | {l for t in rest for l in t.labels}
        lab = "".join(l for l in dict.fromkeys(terms[i].labels + terms[j].labels) if l in keep)
        sizes = {l: s for t in terms for l, s in zip(t.labels, t.shape)}
        mid = Term(f"T{len(terms) - 2}", lab, Layout(((),) * len(lab)), tuple(sizes[l] for l in lab), np.float32)
        first = _contract([terms[i], terms[j]], mid, None, mesh, costs, keep=1)
        if not first:
            continue
        k1, s1, t1 = first[0]
        for k2, s2, t2 in _search(rest + [t1], out_labels, out_shape, out_name, target, mesh, costs)[:3]:
            steps = s1 + s2
            results.append((costs.key(_add(_ZERO, *map(_acc, steps))), steps, t2))
    return sorted(results, key=lambda c: c[0])


def plan_reshard(x, sharding, *, unreduced=(), name: str = "A") -> Plan:
    """Plans moving ``x`` (ShardedArray or (shape, sharding[, dtype])) to ``sharding``.

    Uses the cheapest of AllGather, AllToAll, dynamic slicing, AllReduce and ReduceScatter
    (for unreduced values); ``unreduced`` names axes the result may stay unreduced along.

    Example:
        >>> import shardlab as sl
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((4,), ("X",))
        >>> sl.plan_reshard(((8, 8), sl.NamedSharding(mesh, P("X"))), P(None, "X")).summary()
        'AllToAll_{X,J}(A[I_X, J]) -> A[I, J_X]'
    """
    op = "reshard"
    shape, dtype, sh, u = _operand(x, op)
    if not isinstance(sh, NamedSharding):
        raise TypeError(f"[{op}] x must carry a NamedSharding")
    mesh = sh.mesh
    labels = "ijklmnopqrstuvwxyzabcdefgh"[: len(shape)]
    t = Term(name, labels, layout_of(sh.spec, len(shape), mesh, u, op), tuple(shape), np.dtype(dtype))
    target = _out_layout(sharding, unreduced, len(shape), mesh, op)
    for d, (s, axes) in enumerate(zip(shape, target.dims)):
        k = math.prod(mesh.shape[a] for a in axes)
        if s % k:
            raise ValueError(f"[{op}] dim {d} has size {s}, not divisible by {k} (axes {axes})")
    costs = _Costs(mesh)
    reach = _reachable(t, mesh, costs)
    if target not in reach:
        raise ValueError(f"[{op}] cannot reach {Term(name, labels, target, shape, dtype).render()} from "
                         f"{t.render()}: unreduced axes can only be reduced, never created")
    steps = _path(reach, target)
    return Plan(f"reshard {labels}", mesh, [t], steps[-1].output if steps else t, steps)
