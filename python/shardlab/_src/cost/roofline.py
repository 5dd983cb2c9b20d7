"""The roofline: a program's events summed into T_math, T_hbm and T_comms, and the bound.

Example:
    >>> import numpy as np, shardlab as sl
    >>> mesh = sl.make_mesh((4,), ("x",), hardware="tpu-v5e")
    >>> f = sl.shard_map(lambda a: sl.lax.psum(a @ a.T, "x"), mesh=mesh, in_specs=sl.P(None, "x"), out_specs=sl.P())
    >>> with sl.Ledger() as ledger:
    ...     _ = f(np.ones((256, 1024), np.float32))
    >>> ledger.roofline().bound
    'communication'
"""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Mapping, Sequence

from ..core import units, views
from .compute import COMPUTE, compute_time
from .events import _mesh_parts, event_seconds

__all__ = ["Roofline", "roofline"]


@dataclasses.dataclass(repr=False)
class Roofline(views.Viewable):
    """Where a program's time goes on the mesh's hardware.

    Attributes:
        t_math: sum of FLOPs / peak over compute events (per device).
        t_hbm: sum of HBM bytes / HBM bandwidth.
        t_comms: sum of collective times; t_comms_by_axes: the same split by mesh axes.
        total_seconds: max of the three (overlap="max") or their sum (overlap="sum").
        bound: "compute", "memory" or "communication" - the largest term.
        arithmetic_intensity: FLOPs per HBM byte; critical_intensity: peak / HBM bandwidth.
        notes: assumptions made (overlap, stand-in peaks).
    """

    hardware: str
    overlap: str
    flops: float
    hbm_bytes: float
    comm_bytes: float
    t_math: float
    t_hbm: float
    t_comms: float
    t_comms_by_axes: dict
    total_seconds: float
    bound: str
    arithmetic_intensity: float
    critical_intensity: float
    notes: list

    def rows(self) -> list[tuple[str, str]]:
        """(name, time) rows of the roofline: T_math, T_hbm, T_comms and T_comms per mesh axis."""
        rows = [("T_math", _us(self.t_math)), ("T_hbm", _us(self.t_hbm)), ("T_comms", _us(self.t_comms))]
        rows += [(f"  T_comms[{k}]", _us(v)) for k, v in self.t_comms_by_axes.items()]
        rows += [(f"total ({self.overlap})", _us(self.total_seconds)), ("bound", self.bound),
                 ("arithmetic intensity", units.fmt_count(self.arithmetic_intensity, "FLOP/B")),
                 ("critical intensity", units.fmt_count(self.critical_intensity, "FLOP/B"))]
        return rows

    def text(self) -> str:
        """The terms and the verdict as text (shardlab.viz's view when registered)."""
        view = views.text_view(self)
        if view is not None:
            return view
        w = max(len(k) for k, _ in self.rows())
        lines = [f"Roofline on {self.hardware}"] + [f"  {k.ljust(w)}  {v}" for k, v in self.rows()]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])

    __str__ = text

    def __repr__(self) -> str:
        return (f"<Roofline on {self.hardware}: {self.bound}-bound, {units.fmt_seconds(self.total_seconds)} "
                f"(T_math {units.fmt_seconds(self.t_math)}, T_hbm {units.fmt_seconds(self.t_hbm)}, "
                f"T_comms {units.fmt_seconds(self.t_comms)})>")

    def _repr_html_(self) -> str:
        view = views.html_view(self)
        if view is not None:
            return view
        body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in self.rows())
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
        return (f"<div><b>Roofline on {html.escape(self.hardware)}</b><table>{body}</table>"
                f"<ul>{notes}</ul></div>")


def _us(s: float) -> str:
    return units.fmt_seconds(s)


def roofline(events: Sequence[Mapping], mesh, overlap: str = "max") -> Roofline:
    """Sums a program's events into T_math, T_hbm and T_comms and names the bound.

    Args:
        events: ledger events (dicts with op, axes, bytes_in, bytes_out, flops, hbm_bytes, ...).
        mesh: a mesh with hardware.
        overlap: "max" assumes compute, memory traffic and communication overlap perfectly
            (time = the largest term); "sum" assumes none does (time = their sum).
    """
    if overlap not in ("max", "sum"):
        raise ValueError(f"[roofline] overlap={overlap!r}: use 'max' (perfect overlap) or 'sum' (none)")
    shape, hw, physical = _mesh_parts(mesh)
    if hw is None:
        raise ValueError("[roofline] the mesh has no hardware: make_mesh(..., hardware='tpu-v5e')")
    flops = hbm = comm_bytes = t_math = t_hbm = 0.0
    by_axes: dict[str, float] = {}
    notes: set[str] = set()
    for e in events:
        op = e.get("op")
        if op in COMPUTE:
            t = compute_time(float(e.get("flops") or 0), float(e.get("hbm_bytes") or 0), e.get("dtype") or "bfloat16", hw)
            if t.note:
                notes.add(t.note)
            flops += float(e.get("flops") or 0)
            hbm += float(e.get("hbm_bytes") or 0)
            t_math += t.math_seconds
            t_hbm += t.hbm_seconds
        else:
            s = e.get("seconds")
            if s is None or (isinstance(s, float) and math.isnan(s)):
                s = event_seconds(e, mesh)
            key = ",".join(e.get("axes") or ()) or "-"
            by_axes[key] = by_axes.get(key, 0.0) + s
            comm_bytes += float(e.get("bytes_sent") or 0)
    t_comms = sum(by_axes.values())
    terms = {"compute": t_math, "memory": t_hbm, "communication": t_comms}
    total = max(terms.values()) if overlap == "max" else sum(terms.values())
    bound = max(terms, key=terms.get) if any(terms.values()) else "compute"
    notes.add("overlap='max': compute, HBM traffic and collectives assumed to overlap perfectly"
              if overlap == "max" else "overlap='sum': nothing overlaps (an upper bound)")
    return Roofline(hw.name, overlap, flops, hbm, comm_bytes, t_math, t_hbm, t_comms, by_axes, total, bound,
                    flops / hbm if hbm else math.inf, hw.peak("bfloat16") / hw.hbm_bandwidth, sorted(notes))
