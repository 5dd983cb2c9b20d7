"""Plans in the book's notation: layouts (``A[I, J_X]{U_Y}``), steps and whole plans.

The planner (``shardlab.planner``) builds these; this module only holds and renders them:
text, HTML and LaTeX, with the costs and the alternatives that were rejected.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

import numpy as np

from ..core import notation, units, views
from ..core.sharding import NamedSharding, P, PartitionSpec

_OP_NAMES = {"all_gather": "AllGather", "all_to_all": "AllToAll", "dynamic_slice": "DynamicSlice",
             "psum": "AllReduce", "psum_scatter": "ReduceScatter"}


# -- layouts and their rendering ---------------------------------------------------------------

# The book's names (and their CamelCase forms) for the collectives a plan uses.
_JAX_NAMES = {"all_gather": "all_gather", "all_to_all": "all_to_all", "psum": "psum", "psum_scatter": "psum_scatter",
              "all_reduce": "psum", "allreduce": "psum", "reduce_scatter": "psum_scatter",
              "reducescatter": "psum_scatter", "allgather": "all_gather", "alltoall": "all_to_all"}


def _op_name(name) -> str:
    """A collective's name as plans spell it (JAX's), from JAX's or the book's name."""
    key = name.lower().replace("-", "_") if isinstance(name, str) else None
    if key not in _JAX_NAMES:
        raise ValueError(f"[Plan.alternative] unknown collective {name!r}; use one of all_gather, all_to_all, "
                         f"psum (the book's all_reduce) or psum_scatter (reduce_scatter)")
    return _JAX_NAMES[key]


@dataclass(frozen=True)
class Layout:
    """How a value is laid out: the mesh axes splitting each dim, and its unreduced axes."""

    dims: tuple
    unreduced: frozenset = frozenset()

    def used(self) -> set:
        return {a for d in self.dims for a in d} | set(self.unreduced)

    def spec(self) -> PartitionSpec:
        entries = [None if not d else d[0] if len(d) == 1 else d for d in self.dims]
        while entries and entries[-1] is None:
            entries.pop()
        return P(*entries)


@dataclass(frozen=True)
class Term:
    """A named value in the book's notation: ``A[I, J_X]{U_Y}``."""

    name: str
    labels: str
    layout: Layout
    shape: tuple
    dtype: np.dtype

    def render(self, fmt: str = "text", mesh_order=()) -> str:
        return notation.term(self.name, self.labels, self.layout.dims, self.layout.unreduced, fmt, mesh_order)

    def local_shape(self, mesh) -> tuple:
        return tuple(s // math.prod(mesh.shape[a] for a in d) for s, d in zip(self.shape, self.layout.dims))

    def local_bytes(self, mesh) -> int:
        return math.prod(self.local_shape(mesh)) * self.dtype.itemsize


# -- steps ------------------------------------------------------------------------------------

@dataclass
class Step:
    """One move of a plan: a collective, a dynamic slice or a local contraction.

    Attributes:
        op: all_gather, all_to_all, dynamic_slice, psum, psum_scatter or einsum.
        inputs / output: the Terms before and after.
        axes: mesh axes the collective runs over (major-to-minor).
        dim / dim2: the dim gathered, scattered or sliced (all_to_all: concat dim, split dim).
        bytes_sent: bytes each device sends, as the ledger counts them.
        flops: FLOPs per device (einsum only); seconds: estimated time (None without hardware).
    """

    op: str
    inputs: tuple
    output: Term
    axes: tuple = ()
    dim: int | None = None
    dim2: int | None = None
    bytes_sent: float = 0.0
    flops: float = 0.0
    seconds: float | None = None
    hbm_bytes: float = 0.0
    mesh_order: tuple = ()

    def render(self, fmt: str = "text") -> str:
        arrow = {"text": " -> ", "latex": r" \to ", "html": " &rarr; "}[fmt]
        out = self.output.render(fmt, self.mesh_order)
        if self.op == "einsum":
            ins = [t.render(fmt, self.mesh_order) for t in self.inputs]
            contracted = "".join(sorted({l for t in self.inputs for l in t.labels} - set(self.output.labels)))
            dot = {"text": " .", "latex": r" \cdot", "html": " &middot;"}[fmt]
            if len(ins) == 1:
                return f"sum{_subtxt(contracted.upper(), fmt)}({ins[0]}){arrow}{out}"
            sep = f"{dot}{_subtxt(contracted.upper(), fmt)} " if contracted else \
                {"text": " * ", "latex": r" \otimes ", "html": " &otimes; "}[fmt]
            return sep.join(ins) + arrow + out
        name = _OP_NAMES[self.op]
        sub = notation.axes_str(self.axes)
        if self.op in ("psum_scatter", "all_to_all"):
            sub += "," + self.output.labels[self.dim2 if self.op == "all_to_all" else self.dim].upper()
        name = {"text": name, "latex": rf"\text{{{name}}}", "html": name}[fmt]
        if fmt == "latex":
            head = f"{name}_{{{sub}}}"
        elif fmt == "html":
            head = f"{name}<sub>{html.escape(sub)}</sub>"
        else:
            head = f"{name}_{sub}" if len(sub) == 1 else f"{name}_{{{sub}}}"
        return f"{head}({self.inputs[0].render(fmt, self.mesh_order)}){arrow}{out}"

    def __str__(self):
        return self.render("text")

    __repr__ = __str__


def _subtxt(s: str, fmt: str) -> str:
    if not s:
        return ""
    return {"text": f"_{s}" if len(s) == 1 else f"_{{{s}}}", "latex": f"_{{{s}}}",
            "html": f"<sub>{html.escape(s)}</sub>"}[fmt]


# -- plans ------------------------------------------------------------------------------------

@dataclass
class Plan(views.Viewable):
    """A sharded einsum (or reshard) as steps in the book's notation, with costs.

    Attributes:
        subscripts: the einsum; mesh: where it runs.
        inputs / output: Terms (name, labels, layout, shape, dtype).
        steps: the moves, in order; cases: which of the book's four cases apply, explained.
        alternatives: the cheapest plans it did not choose (Plans, cheapest first).
        rejected: (what, why) for moves that cannot be done at all.
    """

    subscripts: str
    mesh: object
    inputs: list
    output: Term
    steps: list
    cases: list = field(default_factory=list)
    alternatives: list = field(default_factory=list)
    rejected: list = field(default_factory=list)
    overlap: str = "max"

    @property
    def bytes_sent(self) -> float:
        """Bytes each device sends over the whole plan (ledger convention)."""
        return float(sum(s.bytes_sent for s in self.steps))

    @property
    def flops(self) -> float:
        """FLOPs each device performs."""
        return float(sum(s.flops for s in self.steps))

    @property
    def comm_seconds(self) -> float | None:
        """Seconds of the plan's collectives on the mesh's hardware (None without a preset)."""
        if self.mesh.hardware is None:
            return None
        return float(sum(s.seconds or 0.0 for s in self.steps if s.op not in ("einsum", "dynamic_slice")))

    @property
    def compute_seconds(self) -> float | None:
        """Seconds of the plan's local contraction on the mesh's hardware (None without a preset)."""
        if self.mesh.hardware is None:
            return None
        return float(sum(s.seconds or 0.0 for s in self.steps if s.op == "einsum"))

    @property
    def seconds(self) -> float | None:
        """Estimated time: max(comm, compute) if overlapped (the book's habit), else their sum."""
        if self.mesh.hardware is None:
            return None
        c, m = self.comm_seconds, self.compute_seconds
        return max(c, m) if self.overlap == "max" else c + m

    @property
    def collectives(self) -> list:
        """(op, axes, operand name) of each communicating step."""
        return [(s.op, s.axes, s.inputs[0].name) for s in self.steps if s.op not in ("einsum", "dynamic_slice")]

    @property
    def ops(self) -> tuple:
        """The collectives the plan runs, in order (e.g. ``('all_gather', 'psum')``)."""
        return tuple(s.op for s in self.steps if s.op not in ("einsum", "dynamic_slice"))

    def alternative(self, ops) -> "Plan | None":
        """The cheapest of this plan and its alternatives whose collectives are ``ops``, or None.

        ``ops`` names collectives in order, with JAX's names (``psum``, ``psum_scatter``,
        ``all_gather``, ``all_to_all``) or the book's (``all_reduce``, ``reduce_scatter``,
        ``AllReduce``, ``ReduceScatter``, ...); a single name may be passed as a string.

        Raises:
            ValueError: a name that is not one of those collectives.

        Example:
            >>> import shardlab as sl
            >>> from shardlab import P
            >>> mesh = sl.make_mesh((4,), ("X",))
            >>> p = sl.plan_einsum("ij,jk->ik", ((8, 8), P(None, "X")), ((8, 8), P("X")), mesh=mesh,
            ...                    out_sharding=P())
            >>> p.alternative(("all_reduce",)).ops
            ('psum',)
        """
        names = (ops,) if isinstance(ops, str) else tuple(ops)
        wanted = tuple(_op_name(n) for n in names)
        for p in [self] + self.alternatives:
            if p.ops == wanted:
                return p
        return None

    @property
    def out_sharding(self) -> NamedSharding:
        """The result's sharding."""
        return NamedSharding(self.mesh, self.output.layout.spec())

    @property
    def out_unreduced(self) -> frozenset:
        """Mesh axes the result is left unreduced along (partial sums)."""
        return self.output.layout.unreduced

    def summary(self, fmt: str = "text") -> str:
        """One line: the steps joined by ';'."""
        return "; ".join(s.render(fmt) for s in self.steps) or "(nothing to do)"

    def _cost_str(self) -> str:
        s = f"{units.fmt_bytes(self.bytes_sent)} sent/device, {units.fmt_flops(self.flops)}/device"
        if self.mesh.hardware is not None:
            s += (f", {units.fmt_seconds(self.seconds)} ({units.fmt_seconds(self.comm_seconds)} comm, "
                  f"{units.fmt_seconds(self.compute_seconds)} compute, {self.mesh.hardware.name})")
        return s

    def text(self) -> str:
        """The plan as text: the cases considered, each step with its bytes and time, the totals."""
        lines = [f"Plan: {self.subscripts}  on {self.mesh}"]
        lines += [f"  {c}" for c in self.cases]
        for i, s in enumerate(self.steps, 1):
            extra = f"  [{units.fmt_bytes(s.bytes_sent)} sent/device]" if s.op not in ("einsum", "dynamic_slice") else \
                (f"  [{units.fmt_flops(s.flops)}/device]" if s.op == "einsum" else "  [free]")
            lines.append(f"  {i}. {s}{extra}")
        if not self.steps:
            lines.append("  (already in the wanted layout: nothing to do)")
        lines.append(f"  total: {self._cost_str()}")
        if self.alternatives or self.rejected:
            lines.append("  rejected alternatives:")
        for a in self.alternatives:
            lines.append(f"    - {a.summary()}  ({a._cost_str()})")
        for what, why in self.rejected:
            lines.append(f"    - {what}: {why}")
        return "\n".join(lines)

    __str__ = text

    def __repr__(self):
        return f"Plan({self.subscripts!r}: {self.summary()})"

    def _repr_latex_(self) -> str:
        body = r" \\ ".join(s.render("latex") for s in self.steps) or r"\text{(nothing to do)}"
        return rf"$\begin{{array}}{{l}} {body} \end{{array}}$"

    def _repr_html_(self) -> str:
        view = views.html_view(self)
        if view is not None:
            return view
        rows = "".join(
            f"<tr><td>{i}</td><td><code>{s.render('html')}</code></td><td>{units.fmt_bytes(s.bytes_sent)}</td>"
            f"<td>{units.fmt_flops(s.flops)}</td><td>{units.fmt_seconds(s.seconds)}</td></tr>"
            for i, s in enumerate(self.steps, 1))
        cases = "".join(f"<li>{html.escape(c)}</li>" for c in self.cases)
        alts = "".join(f"<li><code>{a.summary('html')}</code> ({html.escape(a._cost_str())})</li>"
                       for a in self.alternatives)
        alts += "".join(f"<li>{html.escape(w)}: {html.escape(y)}</li>" for w, y in self.rejected)
        return (f"<div><b>Plan</b> <code>{html.escape(self.subscripts)}</code> on "
                f"<code>{html.escape(str(self.mesh))}</code><ul>{cases}</ul>"
                f"<table><thead><tr><th>#</th><th>step</th><th>sent/device</th><th>FLOPs/device</th>"
                f"<th>time</th></tr></thead><tbody>{rows}</tbody></table>"
                f"<p>total: {html.escape(self._cost_str())}</p>"
                + (f"<p>rejected alternatives:</p><ul>{alts}</ul>" if alts else "") + "</div>")
