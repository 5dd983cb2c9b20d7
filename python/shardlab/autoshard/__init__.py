"""``shardlab.autoshard``: automatic sharding as Alpa does it (see docs/autoshard.md).

The solver layer: an intra-op problem of nodes, candidate strategies and resharding matrices
(`Problem`), solved exactly by an integer program with HiGHS (`solve`) after exact shrinking,
checked against exhaustive search (`brute_force`) and a `greedy` baseline; and Alpa's inter-op
dynamic program cutting layers into pipeline stages on sub-meshes (`plan_stages`); and on top,
`autoshard(f, *args, mesh=...)`: a global-view function traced into a Problem
(`trace_program`), solved, and returned as a `ShardingPlan` that runs on the virtual devices;
`plan_model(cfg, mesh=..., batch=..., seq=...)` does it for the model library's own training
step (`model`).
"""

from .graph import Edge, MemoryLimitError, Node, Problem, ProblemSize, Reduced, Strategy
from .solution import Solution
from .brute import brute_force, greedy
from .ilp import SolverTimeLimitWarning, solve
from .stages import Stage, StagePlan, brute_force_stages, plan_stages, submesh_choices
from .trace import Program, UntraceableError, trace_program
from .plan import Collective, ShardingPlan, autoshard
from .explain import Comparison, Explanation, compare, explain
from .pipeline_run import PipelineRun, run_pipeline
from .pipeline import PipelinePlan, plan_pipeline
from . import examples, model
from .model import plan_model

__all__ = [
    "Strategy", "Node", "Edge", "Problem", "ProblemSize", "Reduced", "MemoryLimitError",
    "Solution", "solve", "SolverTimeLimitWarning", "brute_force", "greedy",
    "Stage", "StagePlan", "plan_stages", "brute_force_stages", "submesh_choices",
    "Program", "UntraceableError", "trace_program", "Collective", "ShardingPlan", "autoshard", "examples",
    "Explanation", "explain", "Comparison", "compare", "PipelinePlan", "plan_pipeline", "model", "plan_model",
    "PipelineRun", "run_pipeline",
]
