"""Alpa's intra-op integer program, solved with HiGHS (``highspy``).

For every decision variable v (a node, or a group of tied nodes after shrinking) a one-hot
binary vector s_v; for every edge (u, v) whose resharding matrix R_uv is not of the form
a[i] + b[j] a vector e_uv of continuous variables standing for the product s_u[i] * s_v[j],
linearised exactly by its marginals (sum_j e_uv[i, j] = s_u[i], sum_i e_uv[i, j] = s_v[j],
e >= 0: with binary s the only solution is the product). Minimise

    sum_v s_v . (c_v + d_v)  +  sum_(u,v) e_uv . R_uv

subject to sum_v s_v . m_v <= the per-device memory limit.

>>> from shardlab.autoshard import Problem, Node, Strategy, Edge
>>> matmul = Node("matmul", [Strategy("S0R x RR (data parallel)", compute_s=1.0, comm_s=0.5,
...                                    memory_bytes=16),
...                           Strategy("RR x RS0 (tensor parallel)", compute_s=1.0, comm_s=0.2,
...                                    memory_bytes=4)])
>>> relu = Node("relu", [Strategy("S0R"), Strategy("RS0")])
>>> sol = solve(Problem([matmul, relu], [Edge("matmul", "relu", [[0, 0.4], [0.4, 0]])],
...                     memory_limit_bytes=32))
>>> sol.strategies["matmul"], round(sol.objective, 6), sol.proven_optimal
('RR x RS0 (tensor parallel)', 1.2, True)
"""

from __future__ import annotations

import os
import sys
import time
import warnings

import numpy as np

from shardlab.units import fmt_seconds
from shardlab.viz import progress

from .brute import greedy
from .graph import MemoryLimitError, Problem, Reduced
from .solution import Solution

__all__ = ["solve", "SolverTimeLimitWarning"]


class SolverTimeLimitWarning(UserWarning):
    """The solver stopped at its time limit: the plan returned is the best found, not proven
    optimal."""


def _highs():
    try:
        import highspy
    except ImportError as e:  # pragma: no cover - highspy is a dependency of [autoshard]
        raise ImportError("shardlab.autoshard needs HiGHS: pip install 'highspy>=1.7' "
                          "(or pip install 'shardlab[autoshard]')") from e
    return highspy



def _quiet_highs(highspy):
    """A HiGHS solver, made with the process's stdout pointed at /dev/null: HiGHS prints its
    banner from C (past Python's sys.stdout, into a notebook's output) when the first one is made."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            return highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def solve(problem: Problem, *, shrink: bool = True, time_limit_s: float | None = 60.0,
          rel_gap: float = 1e-7, threads: int | None = None, warm_start: bool = False,
          verbose: bool = False, progress_bar: bool | None = None) -> Solution:
    """The plan of least seconds under the memory limit.

    ``shrink``: solve the exactly shrunk problem (`Problem.reduce`: repeated layers share
    variables, follower nodes merge into their leader, dominated choices go); False solves one
    variable per node with the equalities as constraints. ``time_limit_s``: stop HiGHS there
    and return the best plan found with ``proven_optimal=False`` and a SolverTimeLimitWarning.
    ``rel_gap``: the relative optimality gap HiGHS proves. The `greedy` plan is computed too:
    when HiGHS stops without a better plan, it is returned (flagged not proven optimal).
    ``warm_start``: also hand it to HiGHS as its first incumbent (off by default: HiGHS 1.16
    declared a presolved model with a MIP start optimal at the start's objective).
    ``progress_bar``: a bar of the share of HiGHS's first optimality gap closed so far, drawn
    when a person watches (`shardlab.viz.progress.interactive`; True or False forces it).

    Raises MemoryLimitError (a ValueError) when no choice fits the memory limit, naming the
    least memory needed and the nodes that need most of it.
    """
    highspy = _highs()
    t0 = time.perf_counter()
    problem.check_memory()
    if shrink:
        red = problem.reduce()
    else:
        red = problem.reduce(merge_layers=False, follow_leader=False, prune=False)
    if red.num_vars == 0:
        return Solution.from_choice(problem, red.expand([]), method="ilp", proven_optimal=True,
                                    solve_seconds=time.perf_counter() - t0,
                                    size_after=red.size_after, status="solved by shrinking")
    h = _quiet_highs(highspy)
    h.setOptionValue("output_flag", bool(verbose))
    h.setOptionValue("mip_rel_gap", float(rel_gap))
    h.setOptionValue("mip_abs_gap", 0.0)
    if threads is not None:
        h.setOptionValue("threads", int(threads))
    if time_limit_s is not None:
        h.setOptionValue("time_limit", float(time_limit_s))
    first_col, groups = _build(h, highspy, red, problem.memory_limit_bytes)
    start = greedy(problem)
    if warm_start:
        _set_start(h, highspy, red, first_col, groups, start)
    with progress.bar(f"autoshard: HiGHS on {red.size_after.nodes} variables ({red.size_after.strategies} "
                      "choices), optimality gap closed %", total=100, enabled=progress_bar) as bar:
        _watch_gap(h, bar)
        h.run()
        if h.getModelStatus() == highspy.HighsModelStatus.kOptimal and bar.completed < 100:
            bar.advance(100 - bar.completed)  # proven: the gap is closed
    status = h.getModelStatus()
    info = h.getInfo()
    has_plan = info.primal_solution_status == 2  # kSolutionStatusFeasible
    elapsed = time.perf_counter() - t0
    if status == highspy.HighsModelStatus.kOptimal:
        proven = True
    elif status == highspy.HighsModelStatus.kInfeasible:
        raise MemoryLimitError("solve: HiGHS proved that no plan fits the memory limit of "
                               f"{problem.memory_limit_bytes} bytes per device")
    else:
        proven = False
    if has_plan:
        col = np.asarray(h.getSolution().col_value)
        x = [int(np.argmax(col[first_col[k]:first_col[k] + len(c)])) for k, c in enumerate(red.cost)]
        nodes_x = red.expand(x)
    else:
        nodes_x = np.array([start.choices[n.name] for n in problem.nodes])
    sol = Solution.from_choice(problem, nodes_x, method="ilp" if shrink else "ilp (no shrinking)",
                               proven_optimal=proven, solve_seconds=elapsed,
                               size_after=red.size_after, mip_gap=float(info.mip_gap),
                               status=h.modelStatusToString(status))
    if not proven and start.objective < sol.objective and problem.is_feasible(start.choices):
        sol = Solution.from_choice(problem, [start.choices[n.name] for n in problem.nodes],
                                   method=sol.method, proven_optimal=False, solve_seconds=elapsed,
                                   size_after=red.size_after, mip_gap=sol.mip_gap, status=sol.status)
    if not proven:
        warnings.warn(
            f"autoshard.solve: HiGHS stopped ({sol.status}) after {fmt_seconds(elapsed)} with "
            f"time_limit_s={time_limit_s}; returning the best plan found ({fmt_seconds(sol.objective)}, "
            f"relative gap {sol.mip_gap:.3g}), which is not proven optimal. Raise time_limit_s "
            "for a proof.", SolverTimeLimitWarning, stacklevel=2)
    return sol


def _watch_gap(h, bar) -> None:
    """Advance `bar` (out of 100) to the share of the first finite MIP gap HiGHS has closed."""
    first = []

    def on_interrupt(event):
        gap = float(event.data_out.mip_gap)
        if not np.isfinite(gap) or gap >= 1e300:
            return
        if not first:
            first.append(max(gap, 1e-12))
        done = 100.0 * min(1.0, max(0.0, 1.0 - gap / first[0]))
        if done > bar.completed:
            bar.advance(done - bar.completed)

    h.cbMipInterrupt += on_interrupt


def _build(h, highspy, red: Reduced, memory_limit: float | None) -> tuple[list[int], list]:
    """Add rows and columns of the ILP to ``h``; return the first column of each variable and
    each edge's (row groups, column groups, number of column groups)."""
    costs = np.concatenate(red.cost + [m.ravel() for m in red.edges.values()])
    scale = float(np.max(np.abs(costs))) if costs.size and np.max(np.abs(costs)) > 0 else 1.0
    rows_lo, rows_hi = [], []
    trip_r, trip_c, trip_v = [], [], []
    col_cost, col_hi = [], []
    first_col = []

    def new_row(lo, hi):
        rows_lo.append(lo)
        rows_hi.append(hi)
        return len(rows_lo) - 1

    # one-hot rows and s columns
    for k, c in enumerate(red.cost):
        first_col.append(len(col_cost))
        r = new_row(1.0, 1.0)
        for j in range(len(c)):
            trip_r.append(r), trip_c.append(len(col_cost)), trip_v.append(1.0)
            col_cost.append(c[j] / scale)
            col_hi.append(1.0)
    n_binary = len(col_cost)
    # edges: e[g, h] over groups of equal rows g (choices of a) and equal columns h (choices of
    # b) of the matrix, with marginal rows sum_h e[g, h] = sum_{i in g} s_a[i] (and the same for
    # b). The group sums of a one-hot vector are a one-hot vector, so e is still the product
    # exactly; a consumer whose cost depends only on its producer's output layout (not on which
    # of the candidates that give it) gets a matrix of layouts x layouts instead of choices x choices.
    groups = []
    for (a, b), m in red.edges.items():
        small_r, gr = np.unique(m, axis=0, return_inverse=True)
        small, gc = np.unique(small_r, axis=1, return_inverse=True)
        gr, gc = np.asarray(gr).ravel(), np.asarray(gc).ravel()
        groups.append((gr, gc, small.shape[1]))
        na, nb = small.shape
        rows_a = [new_row(0.0, 0.0) for _ in range(na)]
        rows_b = [new_row(0.0, 0.0) for _ in range(nb)]
        for i, g in enumerate(gr):
            trip_r.append(rows_a[g]), trip_c.append(first_col[a] + i), trip_v.append(-1.0)
        for j, g in enumerate(gc):
            trip_r.append(rows_b[g]), trip_c.append(first_col[b] + j), trip_v.append(-1.0)
        for i in range(na):
            for j in range(nb):
                col = len(col_cost)
                col_cost.append(small[i, j] / scale)
                col_hi.append(1.0)
                trip_r.append(rows_a[i]), trip_c.append(col), trip_v.append(1.0)
                trip_r.append(rows_b[j]), trip_c.append(col), trip_v.append(1.0)
    # equalities between variables (no shrinking): s_a[j] - s_b[j] = 0
    for a, b in red.equalities:
        for j in range(len(red.cost[a])):
            r = new_row(0.0, 0.0)
            trip_r += [r, r]
            trip_c += [first_col[a] + j, first_col[b] + j]
            trip_v += [1.0, -1.0]
    # memory
    if memory_limit is not None:
        mscale = max(float(memory_limit), 1.0)
        r = new_row(-np.inf, (memory_limit * (1 + 1e-9) - red.constant_bytes) / mscale)
        for k, m in enumerate(red.memory):
            for j in range(len(m)):
                if m[j]:
                    trip_r.append(r), trip_c.append(first_col[k] + j), trip_v.append(m[j] / mscale)
    n_rows, n_cols = len(rows_lo), len(col_cost)
    h.addRows(n_rows, np.array(rows_lo, float), np.array(rows_hi, float), 0,
              np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, float))
    order = np.lexsort((np.array(trip_r), np.array(trip_c)))
    cols = np.array(trip_c, np.int64)[order]
    starts = np.searchsorted(cols, np.arange(n_cols)).astype(np.int32)
    h.addCols(n_cols, np.array(col_cost, float), np.zeros(n_cols), np.array(col_hi, float),
              len(order), starts, np.array(trip_r, np.int32)[order], np.array(trip_v, float)[order])
    h.changeColsIntegrality(n_binary, np.arange(n_binary, dtype=np.int32),
                            np.full(n_binary, highspy.HighsVarType.kInteger, dtype=np.uint8))
    return first_col, groups


def _set_start(h, highspy, red: Reduced, first_col: list[int], groups: list, start: Solution) -> None:
    """Give HiGHS a plan (in node terms) as its first incumbent, when the reduced variables can
    express it (shrinking may have removed the choices it uses)."""
    p = red.problem
    x = []
    for k in range(red.num_vars):
        nodes = [v for v, (kk, _) in enumerate(red.node_map) if kk == k]
        want = [start.choices[p.nodes[v].name] for v in nodes]
        hit = [j for j in range(len(red.cost[k]))
               if all(red.node_map[v][1][j] == w for v, w in zip(nodes, want))]
        if not hit:
            return
        x.append(hit[0])
    col = np.zeros(h.getNumCol())
    for k, j in enumerate(x):
        col[first_col[k] + j] = 1.0
    at = first_col[-1] + len(red.cost[-1])  # the edge columns follow, in red.edges order
    for (a, b), (gr, gc, nb) in zip(red.edges, groups):
        col[at + gr[x[a]] * nb + gc[x[b]]] = 1.0
        at += (int(gr.max()) + 1) * nb
    sol = highspy.HighsSolution()
    sol.col_value = col.tolist()
    h.setSolution(sol)
