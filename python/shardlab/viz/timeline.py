"""A timeline of a ledger: per device, a compute lane and a communication lane.

Every device runs every event (SPMD), each event for its estimated time on the mesh's hardware.
With ``overlap="max"`` the two lanes run side by side (collectives overlap compute, the book's
habit: total = the longer lane); with ``overlap="sum"`` nothing overlaps (total = the sum).

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P, viz
    >>> mesh = sl.make_mesh((8,), ("x",), hardware="tpu-v5e")
    >>> f = sl.shard_map(lambda a, b: sl.lax.psum(a @ b, "x"), mesh=mesh,
    ...                  in_specs=(P(None, "x"), P("x")), out_specs=P())
    >>> with sl.Ledger() as ledger:
    ...     _ = f(np.ones((64, 64), np.float32), np.ones((64, 64), np.float32))
    >>> t_max, t_sum = viz.timeline(ledger).data["total"], viz.timeline(ledger, overlap="sum").data["total"]
    >>> t_max <= t_sum
    True
"""

from __future__ import annotations

import math

from shardlab import units

from .colors import palette, text_color
from .view import View, device_prefix, esc

__all__ = ["timeline", "schedule_events"]

_COMPUTE = {"matmul", "einsum", "attention", "attention_vjp"}
_W = 860
_MAX_LANES = 8  # device lanes drawn; the others are identical and summarised


def schedule_events(events, overlap: str = "max") -> list[dict]:
    """Start and end of every event: {"op", "lane" ("compute"/"comm"), "start", "end"}.

    Example:
        >>> ev = [{"op": "matmul", "flops": 1.0, "seconds": 2.0}, {"op": "psum", "flops": 0, "seconds": 1.0}]
        >>> [(s["lane"], s["start"], s["end"]) for s in schedule_events(ev, "max")]
        [('compute', 0.0, 2.0), ('comm', 0.0, 1.0)]
    """
    if overlap not in ("max", "sum"):
        raise ValueError(f"[timeline] overlap={overlap!r}: use 'max' (lanes overlap) or 'sum' (one after another)")
    t = {"compute": 0.0, "comm": 0.0}
    out = []
    for e in events:
        s = e.get("seconds")
        if s is None:
            raise ValueError(f"[timeline] event {e.get('op')!r} has no time estimate: the mesh has no hardware; "
                             f"make it with make_mesh(..., hardware='tpu-v5e') (or another preset)")
        lane = "compute" if e.get("op") in _COMPUTE else "comm"
        start = t[lane] if overlap == "max" else max(t.values())
        end = start + float(s)
        t[lane] = end
        if overlap == "sum":
            t = {k: end for k in t}
        out.append({"op": e.get("op"), "lane": lane, "start": start, "end": end,
                    "axes": tuple(e.get("axes") or ()), "label": e.get("label"), "phase": e.get("phase")})
    return out


def _ticks(total: float) -> list[float]:
    if total <= 0:
        return [0.0]
    raw = total / 5
    p = 10 ** math.floor(math.log10(raw))
    step = min(m * p for m in (1, 2, 5, 10) if m * p >= raw)
    return [i * step for i in range(int(total / step) + 1)]


def timeline(ledger, *, overlap: str = "max", mesh=None) -> View:
    """Draws the ledger's events in time, one compute and one communication lane per device.

    Args:
        ledger: a Ledger (its mesh names the devices) or a list of event dicts.
        overlap: "max" (compute and communication overlap) or "sum" (they do not).
        mesh: the mesh, when ``ledger`` is a list.

    Returns:
        A View; ``view.data["total"]`` is the end time, ``view.data["spans"]`` the schedule.
    """
    events = list(ledger.events) if hasattr(ledger, "events") else list(ledger)
    mesh = mesh if mesh is not None else getattr(ledger, "mesh", None)
    spans = schedule_events(events, overlap)
    total = max((s["end"] for s in spans), default=0.0)
    n_dev = mesh.size if mesh is not None else 1
    prefix = device_prefix(mesh)
    ops = sorted({s["op"] for s in spans})
    colors = dict(zip(ops, palette(len(ops))))
    lanes = min(n_dev, _MAX_LANES)
    lane_h, gap, left = 16, 6, 124
    W = _W
    scale = (W - left - 20) / total if total else 0.0
    H = 34 + lanes * (2 * lane_h + gap) + 24
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="system-ui,sans-serif" '
           f'font-size="11">']
    for t in _ticks(total):
        x = left + t * scale
        out.append(f'<line x1="{x:.1f}" y1="24" x2="{x:.1f}" y2="{H - 20}" stroke="#e3e3e3"/>'
                   f'<text x="{x:.1f}" y="16" text-anchor="middle" fill="#444">{esc(units.fmt_seconds(t))}</text>')
    for d in range(lanes):
        y0 = 28 + d * (2 * lane_h + gap)
        name = f"{prefix} {d}"
        out.append(f'<text x="4" y="{y0 + lane_h - 3}" fill="#333">{esc(name)} compute</text>'
                   f'<text x="4" y="{y0 + 2 * lane_h - 3}" fill="#333">{" " * len(name)} comm</text>')
        for s in spans:
            y = y0 if s["lane"] == "compute" else y0 + lane_h
            x, w = left + s["start"] * scale, max(1.0, (s["end"] - s["start"]) * scale)
            c = colors[s["op"]]
            tip = f"{s['op']} {','.join(s['axes'])}: {units.fmt_seconds(s['end'] - s['start'])}"
            out.append(f'<rect class="sl-span" x="{x:.1f}" y="{y + 1}" width="{w:.1f}" height="{lane_h - 2}" '
                       f'fill="{c}" stroke="#fff" stroke-width="0.5"><title>{esc(tip)}</title></rect>')
            if w > 7 * len(s["op"]) + 4:
                out.append(f'<text x="{x + w / 2:.1f}" y="{y + lane_h - 4}" text-anchor="middle" '
                           f'fill="{text_color(c)}" font-size="10">{esc(s["op"])}</text>')
    if n_dev > lanes:
        out.append(f'<text x="4" y="{H - 6}" fill="#555">… {n_dev - lanes} more devices run the same '
                   f'schedule (SPMD)</text>')
    out.append("</svg>")
    comp = sum(s["end"] - s["start"] for s in spans if s["lane"] == "compute")
    comm = total_comm = sum(s["end"] - s["start"] for s in spans if s["lane"] == "comm")
    head = (f"timeline, overlap='{overlap}': {units.fmt_seconds(total)} "
            f"(compute {units.fmt_seconds(comp)}, communication {units.fmt_seconds(comm)})")
    legend = "".join(f'<span style="display:inline-block;padding:1px 6px;margin-right:4px;background:{c};'
                     f'color:{text_color(c)};border-radius:3px">{esc(o)}</span>' for o, c in colors.items())
    html = (f'<div class="sl-view sl-timeline" data-view="timeline"><div class="sl-title">{esc(head)}</div>'
            f'<div class="sl-sub">{legend}</div>{"".join(out)}</div>')
    lines = [head] + [f"  {s['lane']:<7} {units.fmt_seconds(s['start']):>9} - {units.fmt_seconds(s['end']):>9}  "
                      f"{s['op']} {','.join(s['axes'])}" for s in spans]
    return View(html, "\n".join(lines) + "\n", None,
                {"total": total, "spans": spans, "compute": comp, "comm": total_comm, "colors": colors})
