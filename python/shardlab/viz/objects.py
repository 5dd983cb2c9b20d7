"""HTML and text views of shardlab's public objects: Mesh, Hardware, CollectiveCost,
AxisSchedule, Plan and Roofline. These back the objects' ``_repr_html_`` / ``__repr__``
(see ``shardlab.viz.VIEWS`` and ``shardlab.viz.TEXTS``).

Example:
    >>> import shardlab as sl
    >>> from shardlab import viz
    >>> print(viz.mesh_text(sl.make_mesh((2, 4), ("x", "y"), hardware="tpu-v5e")))
    Mesh x=2 × y=4 (8 TPU v5e devices)
      x\\y  0  1  2  3
      0    0  1  2  3
      1    4  5  6  7
"""

from __future__ import annotations

import numpy as np

from shardlab import hardware as _hardware
from shardlab import units

from .link_traffic import link_traffic
from .view import View, device_prefix, esc, table_html

__all__ = ["mesh_html", "mesh_text", "hardware_html", "hardware_text", "collective_cost_html",
           "collective_cost_text", "axis_schedule_html", "axis_schedule_text", "plan_html", "plan_text",
           "roofline_html", "roofline_text"]


def _wrap(kind: str, title: str, body: str, sub: str = "") -> str:
    return View(f'<div class="sl-view sl-{kind}" data-view="{kind}"><div class="sl-title">{title}</div>'
                + (f'<div class="sl-sub">{sub}</div>' if sub else "") + body + "</div>", "")._repr_html_()


# -- Mesh --------------------------------------------------------------------------------------
def _mesh_grid(mesh) -> np.ndarray:
    ids = np.asarray(mesh.device_ids)
    return ids.reshape(1, -1) if ids.ndim == 1 else ids.reshape(-1, ids.shape[-1])


def mesh_text(mesh) -> str:
    """A mesh as its device-id grid (leading axes flattened into rows)."""
    hw = mesh.hardware
    kind = hw.description if hw is not None else "CPU (no hardware preset)"
    head = f"Mesh {' × '.join(f'{a}={s}' for a, s in mesh.shape.items())} ({mesh.size} {kind} devices)"
    grid = _mesh_grid(mesh)
    names = mesh.axis_names
    corner = f"{','.join(names[:-1]) or '-'}\\{names[-1]}"
    w = max(len(str(mesh.size - 1)), 1)
    lines = [head, f"  {corner}  " + "  ".join(str(j).rjust(w) for j in range(grid.shape[1]))]
    for i, row in enumerate(grid[:16]):
        lines.append(f"  {str(i).ljust(len(corner))}  " + "  ".join(str(int(d)).rjust(w) for d in row))
    if grid.shape[0] > 16:
        lines.append(f"  … {grid.shape[0] - 16} more rows")
    return "\n".join(lines)


def mesh_html(mesh) -> str:
    """A mesh as a grid of devices named after its hardware, axes labelled."""
    grid = _mesh_grid(mesh)
    prefix = device_prefix(mesh)
    names = mesh.axis_names
    cell = "padding:2px 6px;border:1px solid #ccc;text-align:center;font-family:ui-monospace,monospace"
    head = "".join(f'<th style="{cell};background:#f3f3f3">{j}</th>' for j in range(grid.shape[1]))
    rows = "".join(f'<tr><th style="{cell};background:#f3f3f3">{i}</th>'
                   + "".join(f'<td style="{cell}">{prefix} {int(d)}</td>' for d in row) + "</tr>"
                   for i, row in enumerate(grid))
    corner = esc(f"{','.join(names[:-1]) or ''} ↓ {names[-1]} →")
    hw = mesh.hardware
    sub = esc(f"{mesh.size} devices; " + (f"{hw.description} ({hw.name})" if hw is not None else
                                          "no hardware preset: times are not estimated"))
    body = (f'<table style="border-collapse:collapse"><tr><th style="{cell}">{corner}</th>{head}</tr>{rows}'
            f"</table>")
    return _wrap("mesh", esc(f"Mesh {' × '.join(f'{a}={s}' for a, s in mesh.shape.items())}"), body, sub)


# -- Hardware ----------------------------------------------------------------------------------
def _hw_rows(hw) -> list[tuple[str, str]]:
    rows = [("family", hw.family.upper()), ("peak bf16", units.fmt_flop_rate(hw.peak("bfloat16"))),
            ("peak int8", units.fmt_flop_rate(hw.peak("int8"))),
            ("HBM", units.fmt_bytes(hw.hbm_capacity)), ("HBM bandwidth", units.fmt_bandwidth(hw.hbm_bandwidth)),
            ("critical intensity", units.fmt_count(hw.peak("bfloat16") / hw.hbm_bandwidth, "FLOP/B"))]
    if hw.family == "tpu":
        rows += [("ICI link (one-way)", units.fmt_bandwidth(hw.ici_link_bandwidth)),
                 ("torus axes", ", ".join(hw.ici_axes)), ("hop latency", units.fmt_seconds(hw.hop_latency)),
                 ("DCN", units.fmt_bandwidth(hw.dcn_bandwidth))]
    else:
        rows += [("NVLink (per GPU, one-way)", units.fmt_bandwidth(hw.nvlink_bandwidth)),
                 ("GPUs per node", str(hw.node_size)), ("InfiniBand", units.fmt_bandwidth(hw.ib_bandwidth))]
    return rows


def hardware_text(hw) -> str:
    """A preset's figures, one per line, in shardlab.units."""
    hw = _hardware.get(hw)
    rows = _hw_rows(hw)
    w = max(len(k) for k, _ in rows)
    return "\n".join([f"Hardware {hw.name}: {hw.description}"] + [f"  {k.ljust(w)}  {v}" for k, v in rows])


def hardware_html(hw) -> str:
    """A preset's figures as a two-column table."""
    hw = _hardware.get(hw)
    body = table_html(["", ""], [[esc(k), esc(v)] for k, v in _hw_rows(hw)], numeric=(1,))
    return _wrap("hardware", esc(f"{hw.description} ({hw.name})"), body)


# -- CollectiveCost ----------------------------------------------------------------------------
def _cost_rows(c) -> list[tuple[str, str]]:
    book = units.fmt_seconds(c.book_seconds)
    err = "-" if c.book_error is None else f"{c.book_error * 100:+.1f}%"
    return [("V (bytes)", units.fmt_bytes(c.bytes)), ("time (link-level)", units.fmt_seconds(c.seconds)),
            ("  bandwidth term", units.fmt_seconds(c.bandwidth_seconds)),
            ("  latency term", units.fmt_seconds(c.latency_seconds)), ("bound", c.bound), ("hops", str(c.hops)),
            ("book formula", book), ("book vs link-level", err), ("plan", c.plan)]


def collective_cost_text(c) -> str:
    """One CollectiveCost: times, bound, the book's formula and the links."""
    rows = _cost_rows(c)
    w = max(len(k) for k, _ in rows)
    lines = [f"{c.op} over {', '.join(c.axes)} (n={c.group_size})"] + [f"  {k.ljust(w)}  {v}" for k, v in rows]
    lines += [f"  link {l.mesh_axis} ({l.link}, {l.topology}, {l.size}): busiest {units.fmt_bytes(b)} at "
              f"{units.fmt_bandwidth(l.bandwidth)}" for l, b in zip(c.links, c.axis_link_bytes)]
    return "\n".join(lines)


def collective_cost_html(c) -> str:
    """One CollectiveCost as a table plus its links."""
    body = table_html(["", ""], [[esc(k), esc(v)] for k, v in _cost_rows(c)], numeric=(1,))
    body += table_html(["mesh axis", "link", "topology", "devices", "bandwidth", "busiest link bytes"],
                       [[esc(l.mesh_axis), esc(l.link), esc(l.topology), str(l.size),
                         esc(units.fmt_bandwidth(l.bandwidth)), esc(units.fmt_bytes(b))]
                        for l, b in zip(c.links, c.axis_link_bytes)], numeric=(3, 4, 5))
    return _wrap("collective_cost", esc(f"{c.op} over {', '.join(c.axes)} (n={c.group_size}): "
                                        f"{units.fmt_seconds(c.seconds)}, {c.bound}-bound"), body)


# -- AxisSchedule ------------------------------------------------------------------------------
def axis_schedule_text(s) -> str:
    """One axis's schedule: steps, busiest link, total link bytes."""
    return (f"AxisSchedule {s.op} on a {s.size}-device {s.topology}, V = {units.fmt_bytes(s.bytes)}: "
            f"{s.steps} steps, busiest link {units.fmt_bytes(s.max_link_bytes)}, "
            f"all links {units.fmt_bytes(s.total_link_bytes)}")


def axis_schedule_html(s) -> str:
    """One axis's schedule: its per-link heat map and the bytes per step."""
    steps = table_html(["step", "busiest link bytes"],
                       [[str(i + 1), esc(units.fmt_bytes(b))] for i, b in enumerate(s.step_max_bytes)],
                       numeric=(0, 1))
    return _wrap("axis_schedule", esc(axis_schedule_text(s)), link_traffic(s).html + steps)


# -- Plan --------------------------------------------------------------------------------------
def _plan_rows(p) -> list[list[str]]:
    rows = []
    for i, s in enumerate(p.steps, 1):
        moves = s.op not in ("einsum", "dynamic_slice")
        rows.append([str(i), f"<code>{s.render('html')}</code>",
                     esc(units.fmt_bytes(s.bytes_sent) if moves else "-"),
                     esc(units.fmt_flops(s.flops) if s.op == "einsum" else "-"), esc(units.fmt_seconds(s.seconds))])
    return rows


def _plan_total(p) -> str:
    t = f"{units.fmt_bytes(p.bytes_sent)} sent/device, {units.fmt_flops(p.flops)}/device"
    if p.seconds is not None:
        t += (f", {units.fmt_seconds(p.seconds)} ({units.fmt_seconds(p.comm_seconds)} comm, "
              f"{units.fmt_seconds(p.compute_seconds)} compute, overlap '{p.overlap}')")
    return t


def plan_text(p) -> str:
    """A Plan: its steps in the book's notation with costs, and the alternatives."""
    lines = [f"Plan {p.subscripts} on {p.mesh}"] + [f"  {c}" for c in p.cases]
    for i, s in enumerate(p.steps, 1):
        lines.append(f"  {i}. {s.render('text')}")
    lines.append(f"  total: {_plan_total(p)}")
    lines += [f"  alternative: {a.summary()} ({_plan_total(a)})" for a in p.alternatives]
    lines += [f"  rejected: {w}: {y}" for w, y in p.rejected]
    return "\n".join(lines)


def plan_html(p) -> str:
    """A Plan as a table of steps (book notation), totals and the alternatives."""
    rows = _plan_rows(p) + [["", "total", esc(units.fmt_bytes(p.bytes_sent)), esc(units.fmt_flops(p.flops)),
                             esc(units.fmt_seconds(p.seconds))]]
    body = (("<ul>" + "".join(f"<li>{esc(c)}</li>" for c in p.cases) + "</ul>") if p.cases else "")
    body += table_html(["#", "step", "sent / device", "FLOPs / device", "time"], rows, numeric=(0, 2, 3, 4),
                       row_classes=[""] * (len(rows) - 1) + ["sl-total"])
    alts = [f"<li><code>{a.summary('html')}</code> - {esc(_plan_total(a))}</li>" for a in p.alternatives]
    alts += [f"<li>{esc(w)}: {esc(y)}</li>" for w, y in p.rejected]
    if alts:
        body += '<div class="sl-note">alternatives:</div><ul>' + "".join(alts) + "</ul>"
    return _wrap("plan", f"Plan <code>{esc(p.subscripts)}</code> on <code>{esc(str(p.mesh))}</code>", body,
                 esc(_plan_total(p)))


# -- Roofline ----------------------------------------------------------------------------------
def _roof_rows(r) -> list[tuple[str, str]]:
    rows = [("T_math", units.fmt_seconds(r.t_math)), ("T_hbm", units.fmt_seconds(r.t_hbm)),
            ("T_comms", units.fmt_seconds(r.t_comms))]
    rows += [(f"  T_comms[{k}]", units.fmt_seconds(v)) for k, v in r.t_comms_by_axes.items()]
    rows += [(f"total (overlap '{r.overlap}')", units.fmt_seconds(r.total_seconds)), ("bound", r.bound),
             ("FLOPs / device", units.fmt_flops(r.flops)), ("HBM bytes / device", units.fmt_bytes(r.hbm_bytes)),
             ("sent / device", units.fmt_bytes(r.comm_bytes)),
             ("arithmetic intensity", units.fmt_count(r.arithmetic_intensity, "FLOP/B")),
             ("critical intensity", units.fmt_count(r.critical_intensity, "FLOP/B"))]
    return rows


def roofline_text(r) -> str:
    """A Roofline's terms and verdict, in shardlab.units."""
    rows = _roof_rows(r)
    w = max(len(k) for k, _ in rows)
    return "\n".join([f"Roofline on {r.hardware}"] + [f"  {k.ljust(w)}  {v}" for k, v in rows]
                     + [f"  note: {n}" for n in r.notes])


def roofline_html(r) -> str:
    """A Roofline: bars for T_math / T_hbm / T_comms, the verdict and the figures."""
    terms = [("compute", r.t_math), ("memory", r.t_hbm), ("communication", r.t_comms)]
    top = max(v for _, v in terms) or 1.0
    bars = "".join(
        f'<div style="display:flex;align-items:center;gap:8px;margin:2px 0"><span style="width:110px">{k}</span>'
        f'<span class="sl-bar" style="display:inline-block;height:12px;width:{max(1, 260 * v / top):.0f}px;'
        f'background:{"#2f5597" if k == r.bound else "#a9b8d6"}"></span><span>{esc(units.fmt_seconds(v))}</span></div>'
        for k, v in terms)
    body = bars + table_html(["", ""], [[esc(k), esc(v)] for k, v in _roof_rows(r)], numeric=(1,))
    body += "".join(f'<div class="sl-note">{esc(n)}</div>' for n in r.notes)
    return _wrap("roofline", esc(f"Roofline on {r.hardware}: {r.bound}-bound, "
                                 f"{units.fmt_seconds(r.total_seconds)}"), body)
