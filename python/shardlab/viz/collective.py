"""A picture of one collective: each device's data before and after, the links' traffic between.

The collective really runs (shard_map on a small array whose values name their origin), so the
"after" row shows what shardlab computed; each chunk is coloured by the device it came from
(reduced chunks in grey with their value). Arrows are the links of the collective's schedule
(shardlab.cost.schedule) on the mesh's physical topology, labelled with the bytes each carries for
the event's V.

Example:
    >>> import shardlab as sl
    >>> from shardlab import viz
    >>> mesh = sl.make_mesh((4, 2), ("x", "y"), hardware="tpu-v5e")
    >>> v = viz.collective("all_gather", mesh, "x", nbytes=4096)
    >>> v.data["after"][0], v.data["topology"], v.data["link_bytes"][(0, 1)]
    ([0, 1, 2, 3], 'line', 1024.0)
"""

from __future__ import annotations

import math

import numpy as np

import shardlab as sl
from shardlab import cost, units

from .colors import PARTIAL, heat, palette, text_color
from .view import View, device_prefix, esc

__all__ = ["collective", "group_bytes"]

_KIND = {"all_gather": "all_gather", "psum": "psum", "all_reduce": "psum", "pmean": "psum", "pmax": "psum",
         "pmin": "psum", "psum_scatter": "psum_scatter", "reduce_scatter": "psum_scatter",
         "all_to_all": "all_to_all", "ppermute": "ppermute"}
_MAX_W = 960


def group_bytes(event: dict) -> float:
    """V of a ledger event: the array one group's collective works on (docs/cost_model.md);
    the cost model's own formula (``shardlab.cost.formulas.group_bytes``).

    Example:
        >>> group_bytes({"op": "all_gather", "group_size": 4, "bytes_in": 8, "bytes_out": 32})
        32.0
    """
    return cost.formulas.group_bytes(event["op"], int(event.get("group_size") or 1),
                                     float(event.get("bytes_in") or 0), float(event.get("bytes_out") or 0))


def _run(kind: str, mesh, axes: tuple, n: int):
    """Runs the collective on values k*L + j (device k's j-th element); per-device in/out."""
    L = n if kind in ("psum", "psum_scatter", "all_to_all") else 1
    x = np.arange(mesh.size * L, dtype=np.float32)
    spec = sl.P(tuple(mesh.axis_names))
    lax = sl.lax

    def f(a):
        if kind == "all_gather":
            return lax.all_gather(a, axes, tiled=True)
        if kind == "psum":
            return lax.psum(a, axes)
        if kind == "psum_scatter":
            return lax.psum_scatter(a, axes, tiled=True)
        if kind == "all_to_all":
            return lax.all_to_all(a, axes, 0, 0, tiled=True)
        return lax.ppermute(a, axes[0], perm=[(i, (i + 1) % n) for i in range(n)])

    with sl.Ledger() as ledger:
        out = sl.shard_map(f, mesh=mesh, in_specs=spec, out_specs=spec)(x)
    after = {s.device.id: np.asarray(s.data).ravel() for s in out.addressable_shards}
    flat = [int(i) for i in mesh.device_ids.ravel()]
    before = {d: x[k * L:(k + 1) * L] for k, d in enumerate(flat)}
    return before, after, L, ledger.events[-1]


def _group(mesh, axes) -> list[int]:
    """Device ids of the first group (the other mesh axes at 0), in group order."""
    idx = tuple(slice(None) if a in axes else 0 for a in mesh.axis_names)
    sub = mesh.device_ids[idx]
    order = [a for a in mesh.axis_names if a in axes]
    sub = np.moveaxis(sub, [order.index(a) for a in axes], range(len(axes))) if len(axes) > 1 else sub
    return [int(i) for i in np.asarray(sub).ravel()]


def collective(op, mesh=None, axis=None, *, nbytes: float | None = None) -> View:
    """Draws one collective over one group of devices.

    Args:
        op: a collective name (all_gather, psum, psum_scatter, all_to_all, ppermute, ...) or a
            ledger event dict (``ledger.events[i]``), whose op, axes and bytes are used.
        mesh: the mesh (for an event: the mesh it ran on, e.g. ``ledger.mesh``).
        axis: mesh axis name or tuple of names (taken from the event when one is given).
        nbytes: V, the bytes one group's collective works on, for the link labels
            (default: the event's, else the small array drawn).

    Returns:
        A View (SVG in HTML; text lists the rows and link bytes). ``view.data`` has ``before``
        and ``after`` (origin device of each chunk, -1 for a reduced chunk), ``link_bytes``
        ({(src, dst): bytes}) and ``topology``.
    """
    event = op if isinstance(op, dict) else None
    if event is not None:
        op = event["op"]
        axis = tuple(event["axes"]) if axis is None else axis
    if mesh is None:
        raise ValueError(f"[viz.collective] pass the mesh {op!r} ran on (e.g. ledger.mesh)")
    kind = _KIND.get(op)
    if kind is None:
        raise ValueError(f"[viz.collective] cannot draw {op!r}; drawable: {', '.join(sorted(_KIND))}")
    axes = (axis,) if isinstance(axis, str) else tuple(axis or ())
    if not axes or any(a not in mesh.shape for a in axes):
        raise ValueError(f"[viz.collective] axis {axis!r} is not among the mesh axes {mesh.axis_names}")
    if kind == "ppermute" and len(axes) != 1:
        raise ValueError(f"[viz.collective] ppermute over one axis only, got {axes}")
    n = math.prod(mesh.shape[a] for a in axes)
    before, after, L, ran = _run(kind, mesh, axes, n)
    V = float(nbytes) if nbytes is not None else group_bytes(event if event is not None else ran)
    group = _group(mesh, axes)
    pos = {d: i for i, d in enumerate(group)}
    origin_of = {}  # value -> group index of the device that held it before
    for d in group:
        for v in before[d]:
            origin_of[float(v)] = pos[d]

    def origins(vals, reduced):
        return [-1 if reduced else origin_of.get(float(v), -1) for v in vals]

    reduced = kind in ("psum", "psum_scatter")
    rows_b = [origins(before[d], False) for d in group]
    rows_a = [origins(after[d], reduced) for d in group]
    vals_b = [before[d].tolist() for d in group]
    vals_a = [after[d].tolist() for d in group]

    # The links: the schedule on the physical topology of a single axis.
    hw, topology, link_bw, links = mesh.hardware, "ring", None, {}
    note = ""
    if len(axes) == 1:
        if hw is not None:
            al = sl.hardware.axis_links(hw, dict(mesh.shape), axes, mesh.physical_axes)
            if len(al) == 1:
                topology, link_bw = al[0].topology, al[0].bandwidth
        else:
            note = "no hardware preset: drawn on a bidirectional ring"
        sched = cost.schedule(op if op != "pmean" else "psum", n, topology, V)
        links = {(lc.src, lc.dst): float(lc.bytes) for lc in sched.links}
    else:
        topology = "multi-axis"
        note = f"over {len(axes)} axes: viz.link_traffic draws their links"
    seconds = None
    if hw is not None:
        seconds = cost.collective_time(op, V, axes=axes, mesh=mesh).seconds

    prefix = device_prefix(mesh)
    colors = palette(n)
    svg, width = _svg(group, rows_b, rows_a, vals_b, vals_a, links, topology, colors, prefix, link_bw)
    groups = mesh.size // n
    head = (f"{op} over {', '.join(axes)} (n={n}): V = {units.fmt_bytes(V)}"
            + (f", {units.fmt_seconds(seconds)} on {hw.name}" if seconds is not None else ""))
    busiest = max(links.values()) if links else 0.0
    sub = (f"one group of {n} drawn ({prefix} {', '.join(map(str, group[:8]))}{'…' if n > 8 else ''}); "
           f"{groups} group{'s' * (groups != 1)} in all; topology {topology}"
           + ("" if not links else ("; every link carries " if busiest == min(links.values()) else
                                    "; busiest link carries ") + units.fmt_bytes(busiest)
              + (f" at {units.fmt_bandwidth(link_bw)}" if link_bw else ""))
           + (f"; {note}" if note else ""))
    html = (f'<div class="sl-view sl-collective" data-view="collective"><div class="sl-title">{esc(head)}</div>'
            f'<div class="sl-sub">{esc(sub)}</div>{svg}</div>')
    lines = [head, sub]
    for name, rows in (("before", rows_b), ("after", rows_a)):
        lines.append(f"{name}:")
        for d, r in zip(group, rows):
            lines.append(f"  {prefix} {d}: " + " ".join("Σ" if o < 0 else str(group[o]) for o in r))
    lines += [f"  link {group[s]}->{'switch' if t < 0 else group[t]}: {units.fmt_bytes(b)}"
              for (s, t), b in sorted(links.items())][:64]
    data = {"before": rows_b, "after": rows_a, "group": group, "link_bytes": links, "topology": topology,
            "nbytes": V, "seconds": seconds, "width": width, "colors": colors}
    return View(html, "\n".join(lines) + "\n", None, data)


def _svg(group, rows_b, rows_a, vals_b, vals_a, links, topology, colors, prefix, link_bw):
    n = len(group)
    gap = 10 if n <= 16 else 3
    bw = min(120.0, (_MAX_W - 70 - gap * (n - 1)) / n)
    x0, label_w = 60.0, 60
    width = int(x0 + n * bw + (n - 1) * gap + 10)
    bh = 34
    yb, ylink = 30, 30 + bh + 30
    band = 170 if topology != "switch" else 120
    ya = ylink + band
    height = ya + bh + 20
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="system-ui,sans-serif" font-size="11">',
           '<defs><marker id="sl-arr" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="9" markerHeight="9" '
           'markerUnits="userSpaceOnUse" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#333"/></marker></defs>']

    def cx(i):
        return x0 + i * (bw + gap) + bw / 2

    def row(y, rows, vals, title):
        out.append(f'<text x="{x0 - label_w + 2}" y="{y + bh / 2 + 4}" font-weight="600">{title}</text>')
        for i, (r, v) in enumerate(zip(rows, vals)):
            left = x0 + i * (bw + gap)
            cw = bw / max(1, len(r))
            runs = []  # (first chunk, count, origin, value): neighbours of one origin merge when thin
            for j, (o, val) in enumerate(zip(r, v)):
                if cw < 4 and runs and runs[-1][2] == o:
                    runs[-1][1] += 1
                else:
                    runs.append([j, 1, o, val])
            for j, k, o, val in runs:
                c = PARTIAL if o < 0 else colors[o]
                out.append(f'<rect class="sl-chunk" x="{left + j * cw:.1f}" y="{y}" width="{k * cw:.1f}" '
                           f'height="{bh}" fill="{c}"' + (' stroke="#fff" stroke-width="0.5"/>' if cw >= 4 else "/>"))
                label = "Σ" if o < 0 and cw < 22 else (f"{val:g}" if o < 0 else str(group[o]))
                if k == 1 and cw >= 7 * len(label) + 2:
                    out.append(f'<text x="{left + (j + 0.5) * cw:.1f}" y="{y + bh / 2 + 4}" text-anchor="middle" '
                               f'fill="{text_color(c)}">{esc(label)}</text>')
            out.append(f'<rect x="{left:.1f}" y="{y}" width="{bw:.1f}" height="{bh}" fill="none" stroke="#333"/>')

    # device names above the top row
    step = 1 if bw >= 40 else max(1, int(math.ceil(40 / (bw + gap))))
    for i, d in enumerate(group):
        if i % step == 0:
            out.append(f'<text x="{cx(i):.1f}" y="{yb - 6}" text-anchor="middle" fill="#333">'
                       f'{esc(prefix + " " + str(d) if bw >= 50 else str(d))}</text>')
    row(yb, rows_b, vals_b, "before")
    row(ya, rows_a, vals_a, "after")

    # links: arrows between the rows; forward above the middle line, backward below
    busiest = max(links.values()) if links else 0.0
    equal = links and max(links.values()) == min(links.values())
    mid = ylink + band / 2
    if topology == "switch" and links:
        sx, sw = x0 + (n * (bw + gap)) / 2, 70
        out.append(f'<rect x="{sx - sw / 2:.1f}" y="{mid - 12:.1f}" width="{sw}" height="24" rx="4" fill="#444"/>'
                   f'<text x="{sx:.1f}" y="{mid + 4:.1f}" text-anchor="middle" fill="#fff">switch</text>')
    for (s, t), b in sorted(links.items()):
        col = heat(b / busiest) if busiest else "#999"
        w = 1.5 + 2.5 * (b / busiest if busiest else 0)
        label = units.fmt_bytes(b)
        if t < 0:  # switch port: device -> switch
            sx = x0 + (n * (bw + gap)) / 2
            out.append(f'<line class="sl-link" x1="{cx(s):.1f}" y1="{yb + bh + 2}" x2="{sx:.1f}" y2="{mid - 13:.1f}" '
                       f'stroke="{col}" stroke-width="{w:.1f}" marker-end="url(#sl-arr)"/>'
                       f'<line x1="{sx:.1f}" y1="{mid + 13:.1f}" x2="{cx(s):.1f}" y2="{ya - 3}" stroke="#bbb" '
                       f'stroke-width="1.2" marker-end="url(#sl-arr)"/>')
            continue
        fwd = (t == s + 1) or (s == n - 1 and t == 0 and n > 2 and topology != "line")
        y = mid - 22 if fwd else mid + 22
        wrap = abs(t - s) > 1
        if wrap:  # the wraparound link: an arc outside the straight links
            bend = -48 if fwd else 48
            out.append(f'<path d="M{cx(s):.1f},{y} C{cx(s):.1f},{y + bend} {cx(t):.1f},{y + bend} '
                       f'{cx(t):.1f},{y}" fill="none" stroke="{col}" stroke-width="{w:.1f}" '
                       f'stroke-dasharray="5,3" marker-end="url(#sl-arr)"/>')
            if not equal and n <= 16:
                out.append(f'<text x="{(cx(s) + cx(t)) / 2:.1f}" y="{y + bend * 0.75 + (4 if fwd else 10):.1f}" '
                           f'text-anchor="middle" fill="#333">{esc(label)}</text>')
            continue
        x1, x2 = cx(s) + (4 if fwd else -4), cx(t) + (-4 if fwd else 4)
        out.append(f'<line class="sl-link" x1="{x1:.1f}" y1="{y}" x2="{x2:.1f}" y2="{y}" stroke="{col}" '
                   f'stroke-width="{w:.1f}" marker-end="url(#sl-arr)"/>')
        if not equal and n <= 16 and bw >= 50:
            out.append(f'<text x="{(x1 + x2) / 2:.1f}" y="{y - 5}" text-anchor="middle" fill="#333">'
                       f'{esc(label)}</text>')
    for i in range(n):
        out.append(f'<circle cx="{cx(i):.1f}" cy="{mid}" r="3" fill="#333"/>')
    out.append(f'<text x="{x0 - label_w + 2}" y="{mid + 4}" fill="#333">links</text>')
    out.append("</svg>")
    return "".join(out), width

