"""The answer of an intra-op solve: a strategy for every node and what it costs."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from shardlab.units import fmt_bytes, fmt_seconds

from .graph import Problem, ProblemSize

__all__ = ["Solution"]


@dataclasses.dataclass
class Solution:
    """A chosen strategy per node with its seconds (``objective`` = compute + comm + reshard),
    its per-device memory, how long the search took, whether the optimum is proven
    (``proven_optimal``; False after a time limit or for the greedy baseline), and the problem's
    size before and after shrinking.

    >>> from shardlab.autoshard import Problem, Node, Strategy, brute_force
    >>> s = brute_force(Problem([Node("w", [Strategy("R", comm_s=1.0, memory_bytes=8),
    ...                                     Strategy("S", comm_s=3.0, memory_bytes=2)])],
    ...                         memory_limit_bytes=4))
    >>> s.strategies, s.objective, s.memory_bytes
    ({'w': 'S'}, 3.0, 2.0)
    """

    choices: dict[str, int]
    strategies: dict[str, str]
    specs: dict[str, Any]
    objective: float
    compute_s: float
    comm_s: float
    reshard_s: float
    memory_bytes: float
    memory_limit_bytes: float | None
    solve_seconds: float
    proven_optimal: bool
    method: str
    size_before: ProblemSize
    size_after: ProblemSize | None = None
    mip_gap: float | None = None
    status: str = ""

    @classmethod
    def from_choice(cls, problem: Problem, x, *, method: str, proven_optimal: bool,
                    solve_seconds: float, size_after: ProblemSize | None = None,
                    mip_gap: float | None = None, status: str = "") -> "Solution":
        x = np.asarray(x, dtype=np.int64)
        b = problem.breakdown(x)
        return cls(
            choices={n.name: int(i) for n, i in zip(problem.nodes, x)},
            strategies={n.name: n.strategies[i].name for n, i in zip(problem.nodes, x)},
            specs={n.name: n.strategies[i].spec for n, i in zip(problem.nodes, x)},
            objective=b["total_s"], compute_s=b["compute_s"], comm_s=b["comm_s"],
            reshard_s=b["reshard_s"], memory_bytes=b["memory_bytes"],
            memory_limit_bytes=problem.memory_limit_bytes, solve_seconds=solve_seconds,
            proven_optimal=proven_optimal, method=method, size_before=problem.size,
            size_after=size_after, mip_gap=mip_gap, status=status)

    def summary(self) -> str:
        """A few lines: objective and its parts, memory, the solver's verdict and sizes."""
        lines = [
            f"{self.method}: {fmt_seconds(self.objective)} = compute {fmt_seconds(self.compute_s)} + comm "
            f"{fmt_seconds(self.comm_s)} + reshard {fmt_seconds(self.reshard_s)}",
            f"memory {fmt_bytes(self.memory_bytes)} per device"
            + ("" if self.memory_limit_bytes is None else f" (limit {fmt_bytes(self.memory_limit_bytes)})"),
            f"{'proven optimal' if self.proven_optimal else 'NOT proven optimal'}"
            f"{'' if not self.status else ' (' + self.status + ')'}, {fmt_seconds(self.solve_seconds)}",
            f"problem: {self.size_before}" + ("" if self.size_after is None else f"; solved as {self.size_after}"),
        ]
        return "\n".join(lines)
