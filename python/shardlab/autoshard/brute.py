"""References for the intra-op ILP: exhaustive search (small problems; the tests' oracle) and a
greedy baseline (what the benchmark compares the ILP against).

>>> from shardlab.autoshard import Problem, Node, Strategy, Edge
>>> p = Problem([Node("a", [Strategy("R", comm_s=1.0), Strategy("S", comm_s=2.0)]),
...              Node("b", [Strategy("R", comm_s=2.0), Strategy("S")])],
...             [Edge("a", "b", [[0.0, 5.0], [5.0, 0.0]])])
>>> best = brute_force(p)
>>> best.strategies, best.objective
({'a': 'S', 'b': 'S'}, 2.0)
>>> greedy(p).strategies, greedy(p).objective  # a takes its cheaper R first
({'a': 'R', 'b': 'R'}, 3.0)
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from .graph import MemoryLimitError, Problem
from .solution import Solution

__all__ = ["brute_force", "greedy"]


def brute_force(problem: Problem, *, max_plans: int = 2_000_000) -> Solution:
    """The optimum by enumerating every choice that honours the problem's equalities (one
    strategy per tie class). Raises ValueError beyond ``max_plans`` plans and MemoryLimitError
    when nothing fits."""
    t0 = time.perf_counter()
    p = problem
    classes = p.tie_classes
    counts = [len(p.nodes[g[0]].strategies) for g in classes]
    total = int(np.prod(counts, dtype=np.float64))
    if total > max_plans:
        raise ValueError(f"brute_force: {total} plans exceed max_plans={max_plans}; use solve()")
    p.check_memory()
    grids = np.array(list(itertools.product(*[range(c) for c in counts])), dtype=np.int64)
    grids = grids.reshape(total, len(classes))
    x = np.empty((total, len(p.nodes)), dtype=np.int64)  # strategy of every node, per plan
    for k, g in enumerate(classes):
        for i in g:
            x[:, i] = grids[:, k]
    seconds = np.zeros(total)
    memory = np.zeros(total)
    for i in range(len(p.nodes)):
        seconds += (p.compute[i] + p.comm[i])[x[:, i]]
        memory += p.memory[i][x[:, i]]
    for e in p.edges:
        seconds += e.reshard_s[x[:, p.index[e.src]], x[:, p.index[e.dst]]]
    if p.memory_limit_bytes is not None:
        seconds = np.where(memory <= p.memory_limit_bytes * (1 + 1e-9), seconds, np.inf)
    best = int(np.argmin(seconds))
    if not np.isfinite(seconds[best]):
        raise MemoryLimitError("brute_force: no plan fits the memory limit")  # check_memory is exact
    return Solution.from_choice(p, x[best], method="brute_force", proven_optimal=True,
                                solve_seconds=time.perf_counter() - t0)


def greedy(problem: Problem) -> Solution:
    """Alpa's "greedy" baseline: tie classes in node order, each taking the strategy with the
    least seconds of its own plus resharding from the classes already chosen; then, while the
    plan is over the memory limit, the switch that frees the most bytes per second added."""
    t0 = time.perf_counter()
    p = problem
    classes = p.tie_classes
    cls_of = {}
    for k, g in enumerate(classes):
        for i in g:
            cls_of[i] = k
    own = [sum(p.compute[i] + p.comm[i] for i in g) for g in classes]
    mem = [sum(p.memory[i] for i in g) for g in classes]
    # edges between classes, as matrices [choice of a, choice of b]
    pair: dict[tuple[int, int], np.ndarray] = {}
    for e in p.edges:
        a, b = cls_of[p.index[e.src]], cls_of[p.index[e.dst]]
        if a == b:
            own[a] = own[a] + np.diag(e.reshard_s)
            continue
        m = e.reshard_s
        if a > b:
            a, b, m = b, a, m.T
        pair[(a, b)] = pair.get((a, b), 0) + m
    nbrs: list[list[tuple[int, np.ndarray]]] = [[] for _ in classes]
    for (a, b), m in pair.items():
        nbrs[a].append((b, m))
        nbrs[b].append((a, m.T))
    choice = np.full(len(classes), -1, dtype=np.int64)
    for k in range(len(classes)):
        local = own[k].copy()
        for w, m in nbrs[k]:
            if choice[w] >= 0:
                local = local + m[:, choice[w]]
        choice[k] = int(np.lexsort((mem[k], local))[0])

    if p.memory_limit_bytes is not None:
        p.check_memory()
        _repair_memory(p.memory_limit_bytes, own, mem, nbrs, choice)
    x = np.empty(len(p.nodes), dtype=np.int64)
    for i in range(len(p.nodes)):
        x[i] = choice[cls_of[i]]
    return Solution.from_choice(p, x, method="greedy", proven_optimal=False,
                                solve_seconds=time.perf_counter() - t0)


def _repair_memory(limit, own, mem, nbrs, choice) -> None:
    """While over the limit, make the switch that adds the fewest seconds per byte freed."""
    # seconds of every choice of every class given its neighbours' current choices, flattened
    offsets = np.cumsum([0] + [len(o) for o in own])
    local = np.concatenate([own[k] + sum((m[:, choice[w]] for w, m in nbrs[k]), 0.0)
                            for k in range(len(own))])
    mem_flat = np.concatenate(mem)
    group = np.repeat(np.arange(len(own)), [len(o) for o in own])
    used = float(sum(m[c] for m, c in zip(mem, choice)))
    while used > limit * (1 + 1e-9):
        cur = offsets[group] + choice[group]
        freed = mem_flat[cur] - mem_flat
        added = local - local[cur]
        ratio = np.where(freed > 0, added / np.where(freed > 0, freed, 1.0), np.inf)
        best = int(np.argmin(ratio))
        if not np.isfinite(ratio[best]):  # cannot happen when check_memory passed
            raise MemoryLimitError("greedy: could not reach the memory limit")
        k = int(group[best])
        j = best - offsets[k]
        used -= freed[best]
        for w, m in nbrs[k]:  # m is [choice of k, choice of w]: w's seconds change
            local[offsets[w]:offsets[w + 1]] += m[j, :] - m[choice[k], :]
        choice[k] = j
