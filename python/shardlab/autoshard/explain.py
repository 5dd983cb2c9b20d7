"""Why a plan: each argument's chosen layout against its alternatives, and the plan against
hand-written strategies on the same mesh, each executed.

`explain(plan)` prices, for every argument (parameter or batch), every other layout it could
take: the plan with that argument — and everything tied to it (the same parameter in the other
repeated blocks, the ops that follow it) — switched, everything else kept. The table lists the
chosen layout, the plan's seconds, and the cheapest rejected layouts with their seconds, their
extra seconds and memory, and whether they fit the memory limit.

`compare(f, *args, mesh=..., strategies=...)` plans `f` once freely and once per hand-written
strategy (the arguments' layouts imposed, the rest chosen by the same solver, as XLA's
propagation would), runs each plan on the virtual devices when the mesh is concrete (outputs
checked against the unsharded program, ledger against the prediction), and returns a table and
a picture. Pipelined strategies (``PipelinePlan``s: the stage DP's, a hand-written 1F1B) join
the same table with their clocked step and bubble, executed with each stage in its plan's layout
(``PipelinePlan.check``; ``autoshard.model.compare_model`` builds all of them for a
``shardlab.models`` model).
"""

from __future__ import annotations

import dataclasses
import html

import numpy as np

from shardlab.units import fmt_bytes, fmt_seconds

from .plan import ShardingPlan, autoshard
from .specs import pspec

__all__ = ["Alternative", "ParamExplanation", "Explanation", "explain", "Comparison", "compare"]


@dataclasses.dataclass(frozen=True)
class Alternative:
    spec: object
    seconds: float
    memory_bytes: float
    fits: bool


@dataclasses.dataclass(frozen=True)
class ParamExplanation:
    name: str
    shape: tuple
    chosen: object
    seconds: float
    memory_bytes: float
    rejected: tuple  # Alternatives, cheapest first


class Explanation:
    """Rows of `ParamExplanation`; ``table()`` (text), rich and HTML displays."""

    def __init__(self, plan: ShardingPlan, rows: list):
        self.plan = plan
        self.rows = rows

    def _cells(self, top: int):
        for r in self.rows:
            alts = "; ".join(f"{a.spec} {fmt_seconds(a.seconds)} (+{fmt_seconds(a.seconds - r.seconds)}"
                             f"{'' if a.fits else ', over memory'})" for a in r.rejected[:top])
            yield r.name, "x".join(map(str, r.shape)), str(r.chosen), fmt_seconds(r.seconds), alts or "-"

    def table(self, top: int = 2) -> str:
        head = ("argument", "shape", "chosen", "plan", "cheapest rejected (plan with it)")
        rows = [head] + list(self._cells(top))
        w = [max(len(r[i]) for r in rows) for i in range(4)]
        return "\n".join("  ".join(c.ljust(w[i]) if i < 4 else c for i, c in enumerate(r)) for r in rows)

    def __rich__(self):
        from rich.table import Table  # noqa: PLC0415  (rich is optional for display)

        t = Table(title=f"autoshard: why each layout ({self.plan.program.fun_name})")
        for h in ("argument", "shape", "chosen", "plan", "cheapest rejected (plan with it)"):
            t.add_column(h)
        for c in self._cells(3):
            t.add_row(*c)
        return t

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in ("argument", "shape", "chosen", "plan", "cheapest rejected"))
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>" for cells in self._cells(3))
        return f"<table><tr>{head}</tr>{body}</table>"

    def __repr__(self):
        return self.table()


def explain(plan: ShardingPlan) -> Explanation:
    """For each argument of `plan`, the chosen layout and every rejected one, priced (see the
    module docstring)."""
    prog, prob = plan.program, plan.program.problem
    base = np.array(plan.choice)
    classes = prob.tie_classes
    group_of = {}
    for c in classes:
        for n in c:
            group_of[n] = c
    total = prob.breakdown(base)
    limit = prob.memory_limit_bytes
    rows = []
    for node, (kind, i) in enumerate(prog.nodes):
        if kind != "input" or i not in prog.inputs:
            continue
        v = prog.values[i]
        group = group_of.get(node, [node])
        alts = []
        for j, dims in enumerate(prog.input_dims[i]):
            if j == base[node]:
                continue
            x = base.copy()
            for n in group:
                x[n] = j
            b = prob.breakdown(x)
            alts.append(Alternative(pspec(dims), b["total_s"], b["memory_bytes"],
                                    limit is None or b["memory_bytes"] <= limit * (1 + 1e-9)))
        alts.sort(key=lambda a: (not a.fits, a.seconds))
        rows.append(ParamExplanation(v.name, v.shape, plan.specs[v.name], total["total_s"], total["memory_bytes"],
                                     tuple(alts)))
    return Explanation(plan, rows)


@dataclasses.dataclass
class _Row:
    """One strategy of a `Comparison`: an intra-op `plan` (``ShardingPlan``) or a `pipeline`
    (``PipelinePlan``: stages, each with its intra-op plan, on a 1F1B schedule), or neither
    (it could not be planned: `error`)."""

    name: str
    plan: ShardingPlan | None
    error: str = ""
    ran: bool = False
    max_rel_err: float | None = None
    ledger_bytes: float | None = None
    pipeline: object = None

    @property
    def ok(self) -> bool:
        return self.plan is not None or self.pipeline is not None

    @property
    def estimate_s(self) -> float:
        """The estimated step: the plan's, or the pipeline's clocked 1F1B step."""
        return self.plan.estimate_s if self.plan is not None else self.pipeline.estimate_s

    def parts(self) -> dict:
        """Seconds of the step by kind (compute, comm, reshard, bubble), memory per device and
        bytes sent per device. A pipeline's are its slowest stage's times the micro-batches
        (what each stage's devices do in a step); the rest of its step is the bubble."""
        if self.plan is not None:
            s = self.plan.solution
            return dict(compute=s.compute_s, comm=s.comm_s, reshard=s.reshard_s, bubble=0.0,
                        memory=s.memory_bytes, sent=sum(c.bytes_sent for c in self.plan.collectives))
        pl = self.pipeline
        m = pl.schedule.m
        plans = [pl.plan_of(st) for st in pl.stages.stages]
        slow = max(plans, key=lambda p: p.estimate_s)
        s = slow.solution
        return dict(compute=m * s.compute_s, comm=m * s.comm_s, reshard=m * s.reshard_s,
                    bubble=max(pl.estimate_s - m * slow.estimate_s, 0.0),
                    memory=max(p.solution.memory_bytes for p in plans),
                    sent=m * max(sum(c.bytes_sent for c in p.collectives) for p in plans))


class Comparison:
    """The free plan against hand-written strategies (and pipelines): ``rows`` (name, plan,
    whether it ran and matched), ``table()``, rich and HTML displays, and ``plot()``
    (matplotlib)."""

    def __init__(self, rows: list):
        self.rows = rows

    def best(self) -> _Row:
        ok = [r for r in self.rows if r.ok]
        return min(ok, key=lambda r: r.estimate_s)

    def _cells(self):
        for r in self.rows:
            if not r.ok:
                yield r.name, "-", "-", "-", "-", "-", "-", r.error
                continue
            q = r.parts()
            if r.pipeline is not None:
                how = "in the stages' layouts, ledger," if r.pipeline.positional else "on train.pipeline,"
                ran = (f"ran 1F1B {how} loss and gradients match" if r.ran else "planned only")
            else:
                ran = ("ran, outputs and ledger match" if r.ran else "planned only (abstract mesh)")
            yield (r.name, fmt_seconds(r.estimate_s), fmt_seconds(q["compute"]), fmt_seconds(q["comm"] + q["reshard"]),
                   fmt_seconds(q["bubble"]) if r.pipeline is not None else "-", fmt_bytes(q["memory"]),
                   fmt_bytes(q["sent"]), ran)

    _HEAD = ("strategy", "step (est.)", "compute", "comm + reshard", "bubble", "memory/device", "sent/device", "run")

    def table(self) -> str:
        rows = [self._HEAD] + list(self._cells())
        w = [max(len(r[i]) for r in rows) for i in range(len(self._HEAD))]
        return "\n".join("  ".join(c.ljust(w[i]) for i, c in enumerate(r)) for r in rows)

    def __rich__(self):
        from rich.table import Table  # noqa: PLC0415  (rich is optional for display)

        t = Table(title="autoshard against hand-written strategies")
        for h in self._HEAD:
            t.add_column(h)
        for c in self._cells():
            t.add_row(*c)
        return t

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in self._HEAD)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>" for cells in self._cells())
        return f"<table><tr>{head}</tr>{body}</table>"

    def __repr__(self):
        return self.table()

    def plot(self, ax=None):
        """Stacked bars of each plan's estimated step (compute, communication, resharding, and a
        pipeline's bubble) in s, ms, µs or ns as the largest needs, with its memory per device
        written on top; returns the Axes."""
        import matplotlib.pyplot as plt  # noqa: PLC0415  (matplotlib is optional)

        rows = [r for r in self.rows if r.ok]
        if ax is None:
            _, ax = plt.subplots(figsize=(1.6 * len(rows) + 2, 3.2))
        names = [r.name for r in rows]
        parts = [r.parts() for r in rows]
        top = max(r.estimate_s for r in rows)
        scale, unit = next(((f, u) for f, u in ((1.0, "s"), (1e3, "ms"), (1e6, "µs")) if top * f >= 1), (1e9, "ns"))
        comp = np.array([q["compute"] for q in parts]) * scale
        comm = np.array([q["comm"] for q in parts]) * scale
        resh = np.array([q["reshard"] for q in parts]) * scale
        bub = np.array([q["bubble"] for q in parts]) * scale
        ax.bar(names, comp, label="compute")
        ax.bar(names, comm, bottom=comp, label="collectives of ops")
        ax.bar(names, resh, bottom=comp + comm, label="resharding")
        if bub.any():
            ax.bar(names, bub, bottom=comp + comm + resh, label="pipeline bubble", color="0.75")
        for k, q in enumerate(parts):
            ax.text(k, comp[k] + comm[k] + resh[k] + bub[k], fmt_bytes(q["memory"]), ha="center", va="bottom", fontsize=8)
        ax.set_ylabel(f"estimated step ({unit})")
        ax.set_ylim(0, top * scale * 1.15)  # room for the memory labels
        first = next((r.plan for r in rows if r.plan is not None), None)
        if first is not None:
            ax.set_title(f"plans on mesh {dict(first.mesh.shape)} ({first.mesh.hardware.name})")
        ax.legend(fontsize=8)
        if len(rows) > 5:
            ax.tick_params(axis="x", labelrotation=20)
        return ax


def compare(f, *args, mesh, strategies: dict, memory_limit_bytes=None, run: bool = True, rtol: float = 1e-4,
            pipelines: dict | None = None, pipeline_args: tuple | None = None, **kwargs) -> Comparison:
    """The free plan of `f` and one plan per hand-written strategy (``{name: in_specs}``, as
    `autoshard`'s ``in_specs``), each run and checked when `run` and the mesh is concrete.

    `pipelines` (``{name: PipelinePlan}``) adds pipelined rows (their step the 1F1B schedule
    clocked with the stages' intra-op estimates); with `run` and `pipeline_args`
    (``(cfg, params, tokens, targets)`` of the ``shardlab.models`` model they train) each is
    executed and its loss and gradients (and, for the model's stages, its ledger) checked
    (``PipelinePlan.check``)."""
    rows, pricer = [], None
    for name, specs in [("autoshard", None)] + list(strategies.items()):
        try:
            plan = autoshard(f, *args, mesh=mesh, memory_limit_bytes=memory_limit_bytes, in_specs=specs,
                             pricer=pricer, **kwargs)
        except ValueError as err:  # a strategy that does not fit or cannot shard these shapes
            rows.append(_Row(name, None, error=str(err).split("\n")[0][:160]))
            continue
        pricer = plan.program.pricer  # the same ops on the same mesh: priced once
        row = _Row(name, plan)
        if run and not getattr(mesh, "abstract", False):
            res = plan.check(*args, rtol=rtol)
            row.ran, row.max_rel_err = True, res["max_rel_err"]
            row.ledger_bytes = sum(e["bytes_sent"] for e in res["ledger"].events if e["axes"])
        rows.append(row)
    for name, pl in (pipelines or {}).items():
        row = _Row(name, None, pipeline=pl)
        if run and pipeline_args is not None:
            res = pl.check(*pipeline_args, rtol=rtol)
            row.ran, row.max_rel_err = True, res["max_rel_err"]
        rows.append(row)
    return Comparison(rows)
