"""``shardlab.autoshard``: automatic sharding as Alpa does it (see docs/autoshard.md).

The solver layer: an intra-op problem of nodes, candidate strategies and resharding matrices
(`Problem`), solved exactly by an integer program with HiGHS (`solve`) after exact shrinking,
checked against exhaustive search (`brute_force`) and a `greedy` baseline; and Alpa's inter-op
dynamic program cutting layers into pipeline stages on sub-meshes (`plan_stages`). Tracing a
program into a Problem and running the plan come with the global-view and step-time work.
"""

from .graph import Edge, MemoryLimitError, Node, Problem, ProblemSize, Reduced, Strategy
from .solution import Solution
from .brute import brute_force, greedy
from .ilp import SolverTimeLimitWarning, solve
from .stages import Stage, StagePlan, brute_force_stages, plan_stages, submesh_choices

__all__ = [
    "Strategy", "Node", "Edge", "Problem", "ProblemSize", "Reduced", "MemoryLimitError",
    "Solution", "solve", "SolverTimeLimitWarning", "brute_force", "greedy",
    "Stage", "StagePlan", "plan_stages", "brute_force_stages", "submesh_choices",
]
