"""Inter-op planning as Alpa does it: the stage DP (`plan_stages`) with each candidate stage
priced by the intra-op search, and the result as a ``shardlab.train.pipeline`` schedule.

`plan_pipeline(stage_program, num_layers, mesh_shape, hardware=..., num_microbatches=...)` asks
`stage_program(k)` for the program of a stage of `k` consecutive layers on one micro-batch (a
function and its example arguments: the forward and backward of those layers), plans it with
`autoshard` on every sub-mesh shape the DP considers (an abstract mesh ``("hosts", "devices")``
of that shape on the given hardware; the layers are identical, so a stage's cost depends only on
its layer count and sub-mesh, as Alpa's layer clustering assumes) and runs Alpa's DP on those
costs. The answer holds the stages, each stage's intra-op `ShardingPlan`, a 1F1B
``Schedule`` for its stages and micro-batches, and that schedule clocked with the stages' times.

`PipelinePlan.check` runs the schedule on a ``shardlab.models`` transformer of the same layer
count and compares its loss and gradients with the unpipelined step. A plan of
``autoshard.model.stage_program`` runs every stage in the layout its intra-op plan chose, on its
own sub-mesh (`run_pipeline`: the ledger holds each stage plan's predicted collectives per
micro-batch); a plan of a stand-in stage program runs ``train.pipeline.execute``'s
data-parallel stages.
"""

from __future__ import annotations

import dataclasses
import inspect
import math

import numpy as np

import shardlab as sl
from shardlab.train import pipeline as pp

from .graph import MemoryLimitError
from .pipeline_run import run_pipeline
from .plan import autoshard
from .stages import StagePlan, plan_stages

__all__ = ["PipelinePlan", "plan_pipeline"]


@dataclasses.dataclass
class PipelinePlan:
    """Stages (`StagePlan`), each distinct stage's intra-op plan, the schedule and its timeline."""

    stages: StagePlan
    stage_plans: dict  # (layer count or (start, end), sub-mesh shape) -> ShardingPlan
    schedule: object
    timeline: object
    hardware: str
    positional: bool = False  # stage programs depend on where the stage is, not only its length

    def plan_of(self, stage):
        """The intra-op `ShardingPlan` of one `Stage`."""
        span = (stage.layer_start, stage.layer_end) if self.positional else stage.layer_end - stage.layer_start
        return self.stage_plans[(span, tuple(stage.submesh_shape))]

    @property
    def estimate_s(self) -> float:
        """The step time: the 1F1B schedule clocked with the stages' intra-op estimates."""
        return self.timeline.step_time

    def summary(self) -> str:
        lines = [self.stages.summary(),
                 f"1F1B schedule: p={self.schedule.p}, m={self.schedule.m}; clocked step "
                 f"{self.timeline.step_time * 1e3:.4g} ms, bubble {self.timeline.bubble_fraction:.1%}"]
        for s in self.stages.stages:
            plan = self.plan_of(s)
            specs = ", ".join(f"{k} {v}" for k, v in list(plan.specs.items())[:3])
            lines.append(f"  layers {s.layer_start}..{s.layer_end - 1}: intra-op {plan.estimate_s * 1e3:.4g} ms ({specs}, ...)")
        return "\n".join(lines)

    def __repr__(self):
        return self.summary()

    def execute(self, cfg, params, tokens, targets, *, rtol: float = 1e-4):
        """Runs the plan on a ``shardlab.models`` transformer of the same layer count and checks
        it (see `check`). Returns the `PipelineRun` (stages of ``model.stage_program``) or the
        ``train.pipeline`` ``Execution`` (other stage programs)."""
        return self.check(cfg, params, tokens, targets, rtol=rtol)["execution"]

    def check(self, cfg, params, tokens, targets, *, rtol: float = 1e-4) -> dict:
        """Runs the schedule on `cfg`'s model and checks it against the unpipelined step
        (``train.pipeline.reference_step``). Returns ``{"execution", "loss", "max_rel_err"}``
        (the largest difference of a gradient from the unpipelined step's, relative to its
        largest magnitude); raises AssertionError past `rtol`.

        A plan of ``autoshard.model.stage_program`` (stages that depend on where they are) runs
        each stage in its own intra-op plan's layout on its sub-mesh (`run_pipeline`), and its
        ledger is checked too: per stage and micro-batch, the plan's predicted collectives. A
        plan of any other stage program (a stand-in whose ops are not the model's) runs
        ``train.pipeline.execute``'s data-parallel stages on a ``("stage", "data")`` mesh; it
        raises ValueError unless the stages are what that runs: equal sub-meshes and the layer
        split of ``pipeline.stage_layers``."""
        if self.positional:
            ex = run_pipeline(self, cfg, params, tokens, targets)
            ex.check_ledger()
        else:
            ex = self._run_data_parallel(cfg, params, tokens, targets)
        loss, grads = pp.reference_step(params, tokens, targets, cfg)
        if not np.isclose(ex.loss, float(loss), rtol=rtol):
            raise AssertionError(f"pipelined loss {ex.loss} != reference {float(loss)}")
        got, ref = sl.tree_util.tree_leaves(ex.grads), sl.tree_util.tree_leaves(grads)
        worst = 0.0
        for g, r in zip(got, ref):
            g, r = np.asarray(g, np.float64), np.asarray(r, np.float64)
            err = float(np.max(np.abs(g - r))) / max(float(np.max(np.abs(r))), 1e-30)
            if err > rtol:
                raise AssertionError(f"pipelined gradient differs by {np.max(np.abs(g - r)):.3g}")
            worst = max(worst, err)
        return {"execution": ex, "loss": ex.loss, "max_rel_err": worst}

    def _run_data_parallel(self, cfg, params, tokens, targets):
        st = self.stages.stages
        subs = {tuple(s.submesh_shape) for s in st}
        cuts = tuple(range(s.layer_start, s.layer_end) for s in st)
        if len(subs) != 1 or cuts != pp.stage_layers(cfg.num_layers, len(st)):
            raise ValueError(f"[autoshard] train.pipeline runs equal stages on equal sub-meshes; this plan has "
                             f"layers {[(c.start, c.stop) for c in cuts]} on sub-meshes {sorted(subs)}")
        sub = subs.pop()
        mesh = sl.make_mesh((len(st), math.prod(sub)), ("stage", "data"), hardware=self.hardware)
        return pp.execute(self.schedule, params, tokens, targets, cfg, mesh, axis="stage", model=None)


def plan_pipeline(stage_program, num_layers: int, mesh_shape, *, hardware, num_microbatches: int,
                  memory_limit_bytes: float | None = None, num_stages: int | None = None,
                  submesh_shapes=None, time_limit_s: float | None = 60.0, stage_specs=None) -> PipelinePlan:
    """Alpa's inter-op pass with intra-op costs (see the module docstring).

    Args:
        stage_program: ``k -> (f, args)``: a stage of `k` layers on one micro-batch; or
            ``(start, end) -> (f, args)`` when a stage depends on where it is (the first embeds,
            the last has the head and the loss: ``autoshard.model.stage_program``).
        num_layers: L; mesh_shape: (hosts, devices per host); hardware: the preset to price on.
        num_microbatches: B; memory_limit_bytes: per device, for each stage's plan.
        num_stages / submesh_shapes: as `plan_stages`.
        stage_specs: a hand-written layout inside the stages: called like `stage_program`
            with the sub-mesh shape added, it returns the stage's ``in_specs`` over the sub-mesh's
            axes ``("hosts", "devices")`` (None: each stage's layout searched).
    """
    plans: dict = {}
    positional = len(inspect.signature(stage_program).parameters) >= 2

    def stage_cost(start: int, end: int, sub) -> tuple[float, bool]:
        span = (start, end) if positional else end - start
        key = (span, tuple(sub))
        if key not in plans:
            where = (start, end) if positional else (end - start,)
            f, args = stage_program(*where)
            mesh = sl.make_mesh(tuple(sub), ("hosts", "devices"), hardware=hardware, abstract=True)
            specs = None if stage_specs is None else stage_specs(*where, tuple(sub))
            try:
                plans[key] = autoshard(f, *args, mesh=mesh, memory_limit_bytes=memory_limit_bytes,
                                       time_limit_s=time_limit_s, in_specs=specs)
            except MemoryLimitError:
                plans[key] = None
        plan = plans[key]
        return (plan.estimate_s, True) if plan is not None else (0.0, False)

    sp = plan_stages(num_layers, mesh_shape, stage_cost, num_microbatches=num_microbatches, num_stages=num_stages,
                     submesh_shapes=submesh_shapes)
    p = len(sp.stages)
    schedule = pp.one_f_one_b(p, num_microbatches)
    times = [s.seconds for s in sp.stages]
    timeline = pp.clock(schedule, pp.Durations(forward=[t / 3 for t in times], backward=[2 * t / 3 for t in times],
                                               source="autoshard intra-op plans (forward 1/3, backward 2/3)"))
    keys = [((s.layer_start, s.layer_end) if positional else s.layer_end - s.layer_start, tuple(s.submesh_shape))
            for s in sp.stages]
    return PipelinePlan(sp, {k: plans[k] for k in keys}, schedule, timeline, hardware, positional)

