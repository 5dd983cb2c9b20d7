"""Views of shardlab's library objects: Mesh, Hardware, CollectiveCost, AxisSchedule, Plan and
Roofline. Each ``*_view(obj)`` returns a View and is registered for its class right below its
definition (``shardlab.views.register_view``), so the object's ``_repr_html_`` (Jupyter),
``__rich__`` (``rich.print``) and, where the class has no text of its own, ``__str__`` show it.

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
from rich.text import Text

import shardlab as sl
from shardlab import cost, units, views
from shardlab import hardware as _hardware

from .link_traffic import link_traffic
from .view import View, bar_html, device_prefix, esc, figure_html, kv_view, table_html

__all__ = ["mesh_view", "mesh_html", "mesh_text", "hardware_view", "hardware_html", "hardware_text",
           "collective_cost_view", "collective_cost_html", "collective_cost_text", "axis_schedule_view",
           "axis_schedule_html", "axis_schedule_text", "plan_view", "plan_html", "plan_text", "roofline_view",
           "roofline_html", "roofline_text"]


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


def mesh_view(mesh) -> View:
    """A mesh as a grid of devices named after its hardware, axes labelled."""
    grid = _mesh_grid(mesh)
    prefix = device_prefix(mesh)
    names = mesh.axis_names
    cell = "padding:2px 6px;border:1px solid rgba(127,127,127,.45);text-align:center;font-family:ui-monospace,monospace"
    th = f"{cell};background:rgba(127,127,127,.14)"
    head = "".join(f'<th style="{th}">{j}</th>' for j in range(grid.shape[1]))
    rows = "".join(f'<tr><th style="{th}">{i}</th>'
                   + "".join(f'<td style="{cell}">{prefix} {int(d)}</td>' for d in row) + "</tr>"
                   for i, row in enumerate(grid))
    corner = esc(f"{','.join(names[:-1]) or ''} ↓ {names[-1]} →")
    hw = mesh.hardware
    sub = esc(f"{mesh.size} devices; " + (f"{hw.description} ({hw.name})" if hw is not None else
                                          "no hardware preset: times are not estimated"))
    body = (f'<table style="border-collapse:collapse;color:inherit"><tr><th style="{th}">{corner}</th>{head}</tr>'
            f"{rows}</table>")
    text = mesh_text(mesh)
    html = figure_html("mesh", esc(f"Mesh {' × '.join(f'{a}={s}' for a, s in mesh.shape.items())}"), body, sub)
    return View(html, text, Text(text), {"device_ids": grid.tolist()})


def mesh_html(mesh) -> str:
    """The mesh's HTML (``Mesh._repr_html_``)."""
    return mesh_view(mesh)._repr_html_()


views.register_view(sl.Mesh, mesh_view)


# -- Hardware ----------------------------------------------------------------------------------
def _hw_rows(hw) -> list[tuple[str, str]]:
    rows = [("family", hw.family.upper()), ("peak bf16", units.fmt_flop_rate(hw.peak("bfloat16"))),
            ("peak int8", units.fmt_flop_rate(hw.peak("int8")) if hw.has_peak("int8") else units.MISSING),
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


def hardware_view(hw) -> View:
    """A preset's figures as a two-column table (memory in GiB, rates in SI units).

    Example:
        >>> print(hardware_view("h100").text.splitlines()[0])
        Hardware h100: NVIDIA H100 SXM
    """
    hw = _hardware.get(hw)
    return kv_view("hardware", f"Hardware {hw.name}: {hw.description}", _hw_rows(hw), data={"name": hw.name})


def hardware_text(hw) -> str:
    """A preset's figures, one per line, in shardlab.units (``print(hardware)``)."""
    return hardware_view(hw).text


def hardware_html(hw) -> str:
    """A preset's figures as HTML (``Hardware._repr_html_``)."""
    return hardware_view(hw)._repr_html_()


views.register_view(sl.hardware.Hardware, hardware_view)


# -- CollectiveCost ----------------------------------------------------------------------------
def _cost_rows(c) -> list[tuple[str, str]]:
    book = units.fmt_seconds(c.book_seconds)
    err = "-" if c.book_error is None else f"{c.book_error * 100:+.1f}%"
    return [("V (bytes)", units.fmt_bytes(c.bytes)),
            ("time (link-level): the larger of", units.fmt_seconds(c.seconds)),
            ("  bandwidth term", units.fmt_seconds(c.bandwidth_seconds)),
            ("  latency term", units.fmt_seconds(c.latency_seconds)), ("bound", c.bound), ("hops", str(c.hops)),
            ("book formula", book), ("book vs link-level", err), ("plan", c.plan)]


def collective_cost_view(c) -> View:
    """One CollectiveCost: times, bound, the book's formula, and its links."""
    title = f"{c.op} over {', '.join(c.axes)} (n={c.group_size}): {units.fmt_seconds(c.seconds)}, {c.bound}-bound"
    links = [(l.mesh_axis, l.link, l.topology, str(l.size), units.fmt_bandwidth(l.bandwidth), units.fmt_bytes(b))
             for l, b in zip(c.links, c.axis_link_bytes)]
    after = table_html(["mesh axis", "link", "topology", "devices", "bandwidth", "busiest link bytes"],
                       [[esc(x) for x in r] for r in links], numeric=(3, 4, 5))
    v = kv_view("collective_cost", title, _cost_rows(c), after_html=after)
    v.text += "".join(f"\n  link {a} ({k}, {t}, {n}): busiest {b} at {bw}" for a, k, t, n, bw, b in links)
    return v


def collective_cost_text(c) -> str:
    """One CollectiveCost as text."""
    return collective_cost_view(c).text


def collective_cost_html(c) -> str:
    """One CollectiveCost as HTML (``CollectiveCost._repr_html_``)."""
    return collective_cost_view(c)._repr_html_()


views.register_view(cost.CollectiveCost, collective_cost_view)


# -- AxisSchedule ------------------------------------------------------------------------------
def axis_schedule_text(s) -> str:
    """One axis's schedule: steps, busiest link, total link bytes."""
    return (f"AxisSchedule {s.op} on {s.size} devices ({s.topology}), V = {units.fmt_bytes(s.bytes)}: "
            f"{units.plural(s.steps, 'step')}, busiest link {units.fmt_bytes(s.max_link_bytes)}, "
            f"all links {units.fmt_bytes(s.total_link_bytes)}")


def axis_schedule_view(s) -> View:
    """One axis's schedule: its per-link heat map and the bytes per step."""
    steps = table_html(["step", "busiest link bytes"],
                       [[str(i + 1), esc(units.fmt_bytes(b))] for i, b in enumerate(s.step_max_bytes)],
                       numeric=(0, 1))
    text = axis_schedule_text(s)
    steps = '<div class="sl-note">the busiest link in each step (the steps run one after another):</div>' + steps
    return View(figure_html("axis_schedule", esc(text), link_traffic(s).html + steps), text, Text(text))


def axis_schedule_html(s) -> str:
    """The schedule's HTML (``AxisSchedule._repr_html_``)."""
    return axis_schedule_view(s)._repr_html_()


views.register_view(cost.AxisSchedule, axis_schedule_view)


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


def plan_view(p) -> View:
    """A Plan as a table of steps (book notation), totals and the alternatives."""
    rows = _plan_rows(p) + [["", "total", esc(units.fmt_bytes(p.bytes_sent)), esc(units.fmt_flops(p.flops)),
                             esc(units.fmt_seconds(p.seconds))]]
    body = (("<ul>" + "".join(f"<li>{esc(c)}</li>" for c in p.cases) + "</ul>") if p.cases else "")
    body += table_html(["#", "step", "sent / device", "FLOP / device", "time"], rows, numeric=(0, 2, 3, 4),
                       row_classes=[""] * (len(rows) - 1) + ["sl-total"])
    alts = [f"<li><code>{a.summary('html')}</code> - {esc(_plan_total(a))}</li>" for a in p.alternatives]
    alts += [f"<li>{esc(w)}: {esc(y)}</li>" for w, y in p.rejected]
    if alts:
        body += '<div class="sl-note">alternatives:</div><ul>' + "".join(alts) + "</ul>"
    html = figure_html("plan", f"Plan <code>{esc(p.subscripts)}</code> on <code>{esc(str(p.mesh))}</code>", body,
                       esc(_plan_total(p)))
    text = plan_text(p)
    return View(html, text, Text(text))


def plan_html(p) -> str:
    """The Plan's HTML (``Plan._repr_html_``)."""
    return plan_view(p)._repr_html_()


views.register_view(sl.Plan, plan_view)


# -- Roofline ----------------------------------------------------------------------------------
def _roof_rows(r) -> list[tuple[str, str]]:
    rows = [("T_math", units.fmt_seconds(r.t_math)), ("T_hbm", units.fmt_seconds(r.t_hbm)),
            ("T_comms", units.fmt_seconds(r.t_comms))]
    rows += [(f"  T_comms[{k}]", units.fmt_seconds(v)) for k, v in r.t_comms_by_axes.items()]
    rows += [(f"total (overlap '{r.overlap}')", units.fmt_seconds(r.total_seconds)), ("bound", r.bound),
             ("FLOP / device", units.fmt_flops(r.flops)), ("HBM bytes / device", units.fmt_bytes(r.hbm_bytes)),
             ("sent / device", units.fmt_bytes(r.comm_bytes)),
             ("arithmetic intensity", units.fmt_count(r.arithmetic_intensity, "FLOP/B")),
             ("critical intensity", units.fmt_count(r.critical_intensity, "FLOP/B"))]
    return rows


def roofline_view(r) -> View:
    """A Roofline: bars for T_math / T_hbm / T_comms (the bound one dark), the verdict, the figures.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> mesh = sl.make_mesh((8,), ("x",), hardware="tpu-v5e")
        >>> f = sl.shard_map(lambda a: sl.lax.psum(a, "x"), mesh=mesh, in_specs=sl.P("x"), out_specs=sl.P())
        >>> with sl.Ledger() as led:
        ...     _ = f(np.ones((8, 1024), np.float32))
        >>> roofline_view(led.roofline()).text.splitlines()[0]
        'Roofline on tpu-v5e: communication-bound, 14.0 µs'
    """
    terms = [("compute", "T_math", r.t_math), ("memory", "T_hbm", r.t_hbm), ("communication", "T_comms", r.t_comms)]
    top = max(v for *_, v in terms) or 1.0
    bars = "".join(bar_html(f"{k} ({t})", v, top, units.fmt_seconds(v), strong=k == r.bound) for k, t, v in terms)
    title = f"Roofline on {r.hardware}: {r.bound}-bound, {units.fmt_seconds(r.total_seconds)}"
    return kv_view("roofline", title, _roof_rows(r), notes=r.notes, before_html=bars,
                   data={"bound": r.bound, "total_seconds": r.total_seconds})


def roofline_text(r) -> str:
    """A Roofline's terms and verdict, in shardlab.units."""
    return roofline_view(r).text


def roofline_html(r) -> str:
    """A Roofline's HTML (``Roofline._repr_html_``)."""
    return roofline_view(r)._repr_html_()


views.register_view(cost.Roofline, roofline_view)
