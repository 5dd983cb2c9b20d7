"""The intra-op sharding problem, independent of how it was obtained: nodes with candidate
strategies, edges with resharding-cost matrices, a per-device memory limit; and the exact
shrinking passes the anchors use (Alpa's "follow" nodes, repeated layers sharing one set of
decision variables, dominated choices removed) with the expansion back to every node.

The objective of a choice ``x`` (one strategy index per node) is Alpa's

    sum_v compute_s[v][x_v] + comm_s[v][x_v]  +  sum_(u,v) reshard_s[u,v][x_u, x_v]

and it is feasible when ``sum_v memory_bytes[v][x_v] <= memory_limit_bytes`` and every
equality the problem declares holds (``follows=`` and nodes of a repeated layer: see `Node`).

>>> p = Problem(
...     [Node("x", [Strategy("R", comm_s=2.0), Strategy("S", comm_s=1.0)]),
...      Node("relu", [Strategy("R"), Strategy("S")], follows="x")],
...     [Edge("x", "relu", [[0.0, 0.5], [3.0, 0.0]])])
>>> p.objective({"x": 1, "relu": 1})
1.0
>>> r = p.reduce()  # relu shares x's variable; then x's choice S dominates R
>>> r.size_before.nodes, r.num_vars, r.constant_s, r.expand([]).tolist()
(2, 0, 1.0, [1, 1])
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from shardlab.units import fmt_bytes

__all__ = ["Strategy", "Node", "Edge", "Problem", "ProblemSize", "Reduced", "MemoryLimitError"]


class MemoryLimitError(ValueError):
    """No choice of strategies fits the per-device memory limit."""


@dataclasses.dataclass(frozen=True)
class Strategy:
    """One candidate sharding of a node: its name (e.g. ``"S0R"`` or a PartitionSpec's text),
    an optional ``spec`` object it stands for, its per-device compute and communication seconds
    and the bytes it holds on each device."""

    name: str
    compute_s: float = 0.0
    comm_s: float = 0.0
    memory_bytes: float = 0.0
    spec: Any = None


@dataclasses.dataclass(frozen=True)
class Node:
    """An operator or tensor whose sharding is to be chosen.

    ``follows="u"``: this node takes the same strategy index as node ``u`` (Alpa's follow
    nodes, e.g. an elementwise op sharded like its operand); both need as many strategies.
    ``layer_class`` and ``position``: nodes with the same pair (the same op in every copy of a
    repeated transformer block) take the same strategy index, as Alpa and autoparallel do for
    repeated layers. Both are constraints of the problem: the brute force honours them too.
    """

    name: str
    strategies: Sequence[Strategy]
    follows: str | None = None
    layer_class: str | None = None
    position: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "strategies", tuple(self.strategies))


@dataclasses.dataclass(frozen=True)
class Edge:
    """Data flowing from ``src`` to ``dst``: ``reshard_s[i][j]`` is the seconds to convert
    ``src``'s output in its strategy ``i`` to what ``dst`` needs in its strategy ``j``."""

    src: str
    dst: str
    reshard_s: Any

    def __post_init__(self):
        object.__setattr__(self, "reshard_s", np.asarray(self.reshard_s, dtype=np.float64))


@dataclasses.dataclass(frozen=True)
class ProblemSize:
    """Decision variables (nodes), one-hot entries (strategies) and edge matrices of a problem."""

    nodes: int
    strategies: int
    edges: int
    edge_entries: int

    def __str__(self):
        return (f"{self.nodes} nodes, {self.strategies} strategy variables, "
                f"{self.edges} edges ({self.edge_entries} edge variables)")


def _check_costs(what: str, values: np.ndarray) -> None:
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{what}: costs must be finite, got {values.tolist()}")
    if np.any(values < 0):
        raise ValueError(f"{what}: costs must be non-negative, got {values.tolist()}")


class Problem:
    """Nodes, edges and an optional per-device memory limit; validated on construction.

    Raises ValueError for duplicate or unknown node names, a node without strategies,
    negative or non-finite costs, an edge matrix whose shape is not
    (strategies of src, strategies of dst), a self-edge, or tied nodes (``follows`` or the same
    ``layer_class``/``position``) with different numbers of strategies.
    """

    def __init__(self, nodes: Iterable[Node], edges: Iterable[Edge] = (),
                 memory_limit_bytes: float | None = None):
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self.edges: tuple[Edge, ...] = tuple(edges)
        self.memory_limit_bytes = None if memory_limit_bytes is None else float(memory_limit_bytes)
        if self.memory_limit_bytes is not None and not self.memory_limit_bytes >= 0:
            raise ValueError(f"Problem: memory_limit_bytes must be >= 0, got {memory_limit_bytes}")
        self.index: dict[str, int] = {}
        for i, n in enumerate(self.nodes):
            if not isinstance(n, Node):
                raise TypeError(f"Problem: nodes must be Node objects, got {type(n).__name__}")
            if n.name in self.index:
                raise ValueError(f"Problem: duplicate node name {n.name!r}")
            if not n.strategies:
                raise ValueError(f"Problem: node {n.name!r} has no strategies")
            self.index[n.name] = i
        # nodes of repeated layers usually share one strategies tuple: its arrays are made and
        # checked once (read-only, shared)
        arrays: dict = {}
        self.compute, self.comm, self.memory = [], [], []
        for n in self.nodes:
            hit = arrays.get(id(n.strategies))
            if hit is None or hit[0] is not n.strategies:
                c, d, m = (np.array([getattr(s, f) for s in n.strategies], float)
                           for f in ("compute_s", "comm_s", "memory_bytes"))
                _check_costs(f"node {n.name!r} compute_s", c)
                _check_costs(f"node {n.name!r} comm_s", d)
                _check_costs(f"node {n.name!r} memory_bytes", m)
                for a in (c, d, m):
                    a.flags.writeable = False
                hit = arrays[id(n.strategies)] = (n.strategies, c, d, m)
            self.compute.append(hit[1])
            self.comm.append(hit[2])
            self.memory.append(hit[3])
        checked: set = set()
        for e in self.edges:
            for end in (e.src, e.dst):
                if end not in self.index:
                    raise ValueError(f"Edge {e.src!r} -> {e.dst!r}: unknown node {end!r}; "
                                     f"known nodes: {sorted(self.index)[:10]}")
            if e.src == e.dst:
                raise ValueError(f"Edge {e.src!r} -> {e.dst!r}: a node cannot feed itself")
            want = (len(self.node(e.src).strategies), len(self.node(e.dst).strategies))
            if e.reshard_s.shape != want:
                raise ValueError(f"Edge {e.src!r} -> {e.dst!r}: reshard_s has shape "
                                 f"{e.reshard_s.shape}, expected {want} (strategies of "
                                 f"{e.src!r} x strategies of {e.dst!r})")
            if id(e.reshard_s) not in checked:
                _check_costs(f"edge {e.src!r} -> {e.dst!r} reshard_s", e.reshard_s)
                checked.add(id(e.reshard_s))
        self._classes = self._tie_classes()

    def node(self, name: str) -> Node:
        return self.nodes[self.index[name]]

    # -- equalities -----------------------------------------------------------------------------
    def _tie_classes(self) -> list[int]:
        """Union-find over the declared equalities: the representative node of each node."""
        parent = list(range(len(self.nodes)))

        def find(i):
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        def union(i, j, why):
            ni, nj = self.nodes[i], self.nodes[j]
            if len(ni.strategies) != len(nj.strategies):
                raise ValueError(f"Problem: {why}, but {ni.name!r} has {len(ni.strategies)} "
                                 f"strategies and {nj.name!r} has {len(nj.strategies)}; tied nodes "
                                 "need the same number (strategy i of one is strategy i of the other)")
            a, b = find(i), find(j)
            if a != b:
                parent[max(a, b)] = min(a, b)

        layers: dict[tuple[str, str], int] = {}
        for i, n in enumerate(self.nodes):
            if n.follows is not None:
                if n.follows not in self.index:
                    raise ValueError(f"Node {n.name!r}: follows={n.follows!r} is not a node")
                union(i, self.index[n.follows], f"{n.name!r} follows {n.follows!r}")
            if n.layer_class is not None or n.position is not None:
                if n.layer_class is None or n.position is None:
                    raise ValueError(f"Node {n.name!r}: give both layer_class and position (the op's "
                                     "place inside the repeated layer), or neither")
                key = (n.layer_class, n.position)
                if key in layers:
                    union(i, layers[key], f"{n.name!r} and {self.nodes[layers[key]].name!r} are "
                          f"position {n.position!r} of layer class {n.layer_class!r}")
                else:
                    layers[key] = i
        return [find(i) for i in range(len(self.nodes))]

    @property
    def tie_classes(self) -> list[list[int]]:
        """Groups of node indices that must take the same strategy index (singletons included),
        in order of their first node."""
        groups: dict[int, list[int]] = {}
        for i, r in enumerate(self._classes):
            groups.setdefault(r, []).append(i)
        return list(groups.values())

    # -- evaluation -----------------------------------------------------------------------------
    def _as_indices(self, choice: Mapping[str, int] | Sequence[int]) -> np.ndarray:
        if isinstance(choice, Mapping):
            missing = [n.name for n in self.nodes if n.name not in choice]
            if missing:
                raise ValueError(f"choice: no strategy for nodes {missing[:10]}")
            x = np.array([choice[n.name] for n in self.nodes], dtype=np.int64)
        else:
            x = np.asarray(choice, dtype=np.int64)
            if x.shape != (len(self.nodes),):
                raise ValueError(f"choice: expected {len(self.nodes)} indices, got shape {x.shape}")
        for n, xi in zip(self.nodes, x):
            if not 0 <= xi < len(n.strategies):
                raise ValueError(f"choice: node {n.name!r} has {len(n.strategies)} strategies, got {xi}")
        return x

    def breakdown(self, choice) -> dict[str, float]:
        """Compute, communication and resharding seconds, their total and the memory of a choice."""
        x = self._as_indices(choice)
        compute = float(sum(c[i] for c, i in zip(self.compute, x)))
        comm = float(sum(c[i] for c, i in zip(self.comm, x)))
        reshard = float(sum(e.reshard_s[x[self.index[e.src]], x[self.index[e.dst]]] for e in self.edges))
        memory = float(sum(m[i] for m, i in zip(self.memory, x)))
        return {"compute_s": compute, "comm_s": comm, "reshard_s": reshard,
                "total_s": compute + comm + reshard, "memory_bytes": memory}

    def objective(self, choice) -> float:
        """Total seconds of a choice (dict name -> strategy index, or indices in node order)."""
        return self.breakdown(choice)["total_s"]

    def is_feasible(self, choice, *, rtol: float = 1e-9) -> bool:
        """Whether a choice honours the memory limit and the declared equalities."""
        x = self._as_indices(choice)
        if any(x[i] != x[r] for i, r in enumerate(self._classes)):
            return False
        if self.memory_limit_bytes is None:
            return True
        return self.breakdown(x)["memory_bytes"] <= self.memory_limit_bytes * (1 + rtol)

    @property
    def size(self) -> ProblemSize:
        return ProblemSize(len(self.nodes), sum(len(n.strategies) for n in self.nodes),
                           len(self.edges), int(sum(e.reshard_s.size for e in self.edges)))

    def min_memory(self) -> tuple[float, list[tuple[str, float]]]:
        """The least memory any feasible-by-equalities choice needs, and each tie class's share
        (named by its first node and counting all its members), largest first."""
        shares = []
        for group in self.tie_classes:
            per_choice = sum(self.memory[i] for i in group)
            names = self.nodes[group[0]].name + (f" (+{len(group) - 1} tied)" if len(group) > 1 else "")
            shares.append((names, float(per_choice.min())))
        shares.sort(key=lambda t: -t[1])
        return float(sum(s for _, s in shares)), shares

    def check_memory(self) -> None:
        """Raise MemoryLimitError when no choice fits the limit, naming the least memory needed
        and the nodes that need the most of it."""
        if self.memory_limit_bytes is None:
            return
        need, shares = self.min_memory()
        if need > self.memory_limit_bytes * (1 + 1e-9):
            top = ", ".join(f"{n}: {fmt_bytes(b)}" for n, b in shares[:5] if b > 0)
            raise MemoryLimitError(
                f"no sharding fits the memory limit of {fmt_bytes(self.memory_limit_bytes)} per "
                f"device: the least any choice needs is {fmt_bytes(need)} (each node at its "
                f"smallest strategy); the largest needs: {top}. Raise the limit, use a larger mesh, "
                "or add strategies that shard these nodes further.")

    def reduce(self, *, merge_layers: bool = True, follow_leader: bool = True,
               prune: bool = True) -> "Reduced":
        """The problem as decision variables for a solver, shrunk exactly (see `Reduced`)."""
        return Reduced(self, merge_layers=merge_layers, follow_leader=follow_leader, prune=prune)




class Reduced:
    """Decision variables of a Problem after exact shrinking, and the way back to every node.

    Variable ``k`` has ``len(cost[k])`` choices with seconds ``cost[k]`` and bytes
    ``memory[k]``; ``edges[(a, b)]`` (a < b) is the matrix of seconds added when variable a takes
    choice i and b takes j; ``constant_s``/``constant_bytes`` are added to every plan. Node ``v``
    of the problem takes strategy ``node_map[v][1][choice of variable node_map[v][0]]``.

    Passes, each of which keeps the optimum (objective and feasibility) unchanged:

    * merge_layers: nodes tied by ``follows=`` or by the same ``layer_class``/``position``
      share one variable; their costs and memory add up and edges between members of the same
      pair of variables add up (an edge inside one variable keeps its diagonal).
      With ``merge_layers=False`` every node keeps its own variable and ``equalities`` lists
      the pairs of variables the solver must keep equal.
    * prune: a choice j of a variable is dropped when another choice j' is no worse in memory and
      no worse in seconds whatever the neighbours choose:
      ``cost[j'] - cost[j] + sum_w max_k (R_w[j', k] - R_w[j, k]) <= 0``.
    * follow_leader: a variable v is merged into a neighbour u when, for every choice i of u,
      one choice f(i) of v dominates all others in that sense given u = i (the elementwise node
      that should simply follow its operand); v disappears, u's costs gain v's, v's other
      edges move to u through f.
    * Always (part of the ILP's formulation rather than a shrinking pass): edges whose matrix
      is a[i] + b[j] (constants included) are folded into the costs of their ends, and
      variables left with one choice into constants.
    """

    def __init__(self, problem: Problem, *, merge_layers=True, follow_leader=True, prune=True):
        self.problem = problem
        p = problem
        self.constant_s = 0.0
        self.constant_bytes = 0.0
        self.equalities: list[tuple[int, int]] = []
        if merge_layers:
            groups = p.tie_classes
        else:
            groups = [[i] for i in range(len(p.nodes))]
        var_of = {}
        self.cost, self.memory, self.names = [], [], []
        for k, g in enumerate(groups):
            for i in g:
                var_of[i] = k
            self.cost.append(sum(p.compute[i] + p.comm[i] for i in g))
            self.memory.append(sum(p.memory[i] for i in g).astype(float))
            self.names.append([p.nodes[i].name for i in g])
        if not merge_layers:
            for i, r in enumerate(p._classes):
                if i != r:
                    self.equalities.append((r, i))
        # node v -> (variable, map from the variable's choices to v's strategy indices)
        self.node_map: list[tuple[int, np.ndarray]] = [
            (var_of[i], np.arange(len(p.nodes[i].strategies))) for i in range(len(p.nodes))]
        self.edges: dict[tuple[int, int], np.ndarray] = {}
        self.adj: dict[int, set[int]] = {k: set() for k in range(len(self.cost))}
        self._extra_cache: dict = {}
        for e in p.edges:
            self._add_edge(var_of[p.index[e.src]], var_of[p.index[e.dst]], e.reshard_s)
        self.alive = [True] * len(self.cost)
        self.size_before = p.size
        # without a limit memory does not constrain the choice: dominance ignores it
        self._mem_matters = p.memory_limit_bytes is not None
        self._fold()  # always: only edges that are not a[i] + b[j] need edge variables
        if prune or follow_leader:
            changed = True
            while changed:
                changed = False
                if prune:
                    changed |= self._over_budget()
                    changed |= self._prune()
                if follow_leader:
                    changed |= self._follow_leader()
                changed |= self._fold()
        self._compact()

    # -- building blocks --------------------------------------------------------------------------
    def _add_edge(self, a: int, b: int, mat: np.ndarray) -> None:
        if a == b:  # both ends in one variable: only the diagonal can happen
            self.cost[a] = self.cost[a] + np.diag(mat)
            return
        if a > b:
            a, b, mat = b, a, mat.T
        if (a, b) in self.edges:
            self.edges[(a, b)] = self.edges[(a, b)] + mat
        else:
            self.edges[(a, b)] = np.array(mat, dtype=float)
            self.adj[a].add(b)
            self.adj[b].add(a)

    def _del_edge(self, a: int, b: int) -> None:
        del self.edges[(min(a, b), max(a, b))]
        self.adj[a].discard(b)
        self.adj[b].discard(a)

    def _neighbours(self, v: int) -> dict[int, np.ndarray]:
        """Neighbour -> matrix indexed [choice of v, choice of neighbour]."""
        return {w: self.edges[(v, w)] if v < w else self.edges[(w, v)].T for w in self.adj[v]}

    def _tied(self, v: int) -> bool:
        if not hasattr(self, "_tied_set"):
            self._tied_set = {v for pair in self.equalities for v in pair}
        return v in self._tied_set

    def _keep_choices(self, v: int, keep: np.ndarray) -> None:
        self.cost[v] = self.cost[v][keep]
        self.memory[v] = self.memory[v][keep]
        for w in self.adj[v]:
            if v < w:
                self.edges[(v, w)] = self.edges[(v, w)][keep, :]
            else:
                self.edges[(w, v)] = self.edges[(w, v)][:, keep]
        self.node_map = [(k, mp[keep]) if k == v else (k, mp) for k, mp in self.node_map]

    def _over_budget(self) -> bool:
        """Drop the choices no plan can afford: choice j of v needs ``memory[v][j]`` while every
        other variable needs at least its least memory, so j goes when the sum is over the limit.
        When even the largest choices all fit together, memory no longer constrains anything and
        dominance stops comparing it."""
        if not self._mem_matters:
            return False
        live = [v for v in range(len(self.cost)) if self.alive[v]]
        limit = self.problem.memory_limit_bytes * (1 + 1e-9) - self.constant_bytes
        least = {v: float(self.memory[v].min()) for v in live}
        if sum(float(self.memory[v].max()) for v in live) <= limit:
            self._mem_matters = False
            return True
        slack = limit - sum(least.values())
        changed = False
        for v in live:
            if self._tied(v):
                continue
            keep = np.flatnonzero(self.memory[v] - least[v] <= slack)
            if 0 < keep.size < len(self.cost[v]):
                self._keep_choices(v, keep)
                changed = True
        return changed

    def _prune(self) -> bool:
        changed = False
        for v in range(len(self.cost)):
            if not self.alive[v] or self._tied(v) or len(self.cost[v]) == 1:
                continue
            n = len(self.cost[v])
            # dom[j, jp]: choice jp is never worse than j
            dom = (self.cost[v][None, :] - self.cost[v][:, None]
                   + self._sum(self._extras(v).values(), n)) <= 0
            if self._mem_matters:
                dom &= self.memory[v][None, :] <= self.memory[v][:, None]
            keep = list(range(n))
            for j in range(n):
                if any(dom[j, jp] for jp in keep if jp != j):
                    keep.remove(j)
                    changed = True
            if len(keep) < len(self.cost[v]):
                self._keep_choices(v, np.array(keep))
        return changed

    def _extras(self, v: int) -> dict[int, np.ndarray]:
        """Neighbour w -> [j, jp]: the most seconds choice jp of v can add over choice j through
        the edge to w, whatever w chooses. Cached per edge matrix (edges are replaced, never
        changed in place, so the matrix object identifies its content)."""
        out = {}
        for w in self.adj[v]:
            base = self.edges[(v, w) if v < w else (w, v)]
            hit = self._extra_cache.get((v, w))
            if hit is None or hit[0] is not base:
                m = base if v < w else base.T
                hit = self._extra_cache[(v, w)] = (base, np.max(m[None, :, :] - m[:, None, :], axis=2))
            out[w] = hit[1]
        return out

    @staticmethod
    def _sum(extras, n) -> np.ndarray:
        total = np.zeros((n, n))
        for e in extras:
            total += e
        return total

    def _follow_leader(self) -> bool:
        changed = False
        for v in range(len(self.cost)):
            if not self.alive[v] or self._tied(v):
                continue
            nbs = self._neighbours(v)
            extras = self._extras(v)
            for u, r_vu in nbs.items():
                if self._tied(u):
                    continue
                f = self._leader_map(v, r_vu, self._sum((e for w, e in extras.items() if w != u), len(self.cost[v])))
                if f is None:
                    continue
                # merge v into u: u = i implies v = f[i]
                ni = np.arange(len(self.cost[u]))
                self.cost[u] = self.cost[u] + self.cost[v][f] + r_vu[f, ni]
                self.memory[u] = self.memory[u] + self.memory[v][f]
                for w, m in nbs.items():
                    self._del_edge(v, w)
                    if w != u:
                        self._add_edge(u, w, m[f, :])
                self.node_map = [(u, mp[f]) if k == v else (k, mp) for k, mp in self.node_map]
                self.alive[v] = False
                self.cost[v] = self.memory[v] = np.zeros(0)
                changed = True
                break
        return changed

    def _leader_map(self, v, r_vu, extra):
        """For each choice i of u, the choice of v that dominates all others given u = i
        (`extra`: what v's other edges can add, as `_extras` summed)."""
        nv, nu = r_vu.shape
        f = np.empty(nu, dtype=np.int64)
        mem = self.memory[v] if self._mem_matters else np.zeros(nv)
        mem_ok = mem[None, :] <= mem[:, None]  # [j, jp]
        for i in range(nu):
            local = self.cost[v] + r_vu[:, i]
            dom = ((local[None, :] - local[:, None] + extra) <= 0) & mem_ok
            winners = np.flatnonzero(dom.all(axis=0))  # jp that dominates every j
            if winners.size == 0:
                return None
            f[i] = winners[0]
        return f

    def _fold(self) -> bool:
        changed = False
        for (a, b), m in list(self.edges.items()):
            row, col = m[:, 0], m[0, :]
            approx = row[:, None] + col[None, :] - m[0, 0]
            if np.allclose(approx, m, rtol=1e-12, atol=1e-15 * max(1.0, float(np.abs(m).max()))):
                self.cost[a] = self.cost[a] + row - m[0, 0]
                self.cost[b] = self.cost[b] + col
                self._del_edge(a, b)
                changed = True
        for v in range(len(self.cost)):
            if self.alive[v] and len(self.cost[v]) == 1 and not self._tied(v):
                if self.adj[v]:
                    continue  # folded on the next round, once its edges are vectors
                self.constant_s += float(self.cost[v][0])
                self.constant_bytes += float(self.memory[v][0])
                self.alive[v] = False
                self.node_map = [(-1, mp[[0]]) if k == v else (k, mp) for k, mp in self.node_map]
                changed = True
        return changed

    def _compact(self) -> None:
        new = {}
        for v, a in enumerate(self.alive):
            if a:
                new[v] = len(new)
        self.cost = [self.cost[v] for v in new]
        self.memory = [self.memory[v] for v in new]
        self.names = [self.names[v] for v in new]
        self.edges = {(new[a], new[b]): m for (a, b), m in self.edges.items()}
        self.equalities = [(new[a], new[b]) for a, b in self.equalities]
        del self.adj, self._extra_cache
        self.node_map = [(new[k] if k >= 0 else -1, mp) for k, mp in self.node_map]
        del self.alive

    # -- results ----------------------------------------------------------------------------------
    @property
    def num_vars(self) -> int:
        return len(self.cost)

    @property
    def size_after(self) -> ProblemSize:
        return ProblemSize(self.num_vars, int(sum(len(c) for c in self.cost)), len(self.edges),
                           int(sum(m.size for m in self.edges.values())))

    def expand(self, var_choice: Sequence[int]) -> np.ndarray:
        """Strategy index of every problem node from one choice index per variable."""
        out = np.empty(len(self.node_map), dtype=np.int64)
        for v, (k, mp) in enumerate(self.node_map):
            out[v] = mp[0] if k < 0 else mp[var_choice[k]]
        return out

    def objective(self, var_choice: Sequence[int]) -> float:
        """Seconds of a variable choice in the reduced problem (equals the problem's objective of
        its expansion)."""
        total = self.constant_s + sum(float(c[x]) for c, x in zip(self.cost, var_choice))
        for (a, b), m in self.edges.items():
            total += float(m[var_choice[a], var_choice[b]])
        return total
