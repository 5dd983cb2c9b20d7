"""Per-link traffic of a collective on the physical topology, as a heat map.

From shardlab.cost's link-level schedule: one AxisSchedule (``cost.schedule(...)``) draws one
axis (ring, uni_ring, line or switch); a CollectiveCost (``cost.collective_time(...)``) or a
ledger event draws every physical axis it uses as a 1-D, 2-D or 3-D torus (3-D as a row of 2-D
slices, the links between slices as short diagonal strokes at each node), each link coloured on one
sequential scale (with its legend) and labelled with its bytes where there is room, the busiest named.

Examples:
    >>> from shardlab import cost, viz
    >>> v = viz.link_traffic(cost.schedule("all_gather", 4, "line", 1024))
    >>> v.data["busiest"]["bytes"], v.data["busiest"]["src"], v.data["busiest"]["dst"]
    (768.0, (2,), (3,))
"""

from __future__ import annotations

import itertools
import math

from shardlab import cost, units

from .collective import group_bytes
from .colors import heat
from .view import View, esc

__all__ = ["link_traffic"]

_BOX = 560  # px of a 2-D slice's longest side
_MAX_SLICES = 4  # slices of a 3-D torus drawn (the others carry the same traffic)


def _axis_links(sched, scale: float = 1.0) -> dict:
    """{(src, dst): bytes} of one axis; dst -1 is a switch port."""
    return {(lc.src, lc.dst): float(lc.bytes) * scale for lc in sched.links}


def _from_cost(c) -> tuple[list, dict]:
    """Dims (name, size, topology, link, bandwidth) and {(src coord, dst coord): bytes}."""
    dims = [(f"{l.mesh_axis} ({l.link})", l.size, l.topology, l.link, l.bandwidth) for l in c.links]
    if len(dims) > 3:
        raise ValueError(f"[viz.link_traffic] {c.op} uses {len(dims)} physical axes; 1 to 3 can be drawn")
    edges: dict = {}
    shape = [d[1] for d in dims]
    for i, (_, size, topo, _, _) in enumerate(dims):
        sched = cost.schedule(c.op, size, topo, 1.0)
        top = sched.max_link_bytes
        per = _axis_links(sched, c.axis_link_bytes[i] / top if top else 0.0)
        others = [range(s) if j != i else [0] for j, s in enumerate(shape)]
        for base in itertools.product(*others):
            for (a, b), v in per.items():
                src = tuple(a if j == i else x for j, x in enumerate(base))
                dst = None if b < 0 else tuple(b if j == i else x for j, x in enumerate(base))
                edges[(src, dst, i)] = v
    return dims, edges


def link_traffic(x, mesh=None, *, nbytes: float | None = None) -> View:
    """Heat map of bytes per link.

    Args:
        x: an AxisSchedule (``cost.schedule``), a CollectiveCost (``cost.collective_time`` and
            friends) or a ledger event dict (then ``mesh`` must carry hardware).
        mesh: the mesh of an event.
        nbytes: V for an event (default: derived from its bytes).

    Returns:
        A View. Its ``data`` dict names the busiest link under ``busiest`` (src, dst, axis,
        bytes, seconds) and maps each link, as (src coords, dst coords or None for a switch,
        dim), to its bytes under ``links``.

    Examples:
        >>> from shardlab import cost, viz
        >>> c = cost.all_reduce_time((4096, 4096), "bfloat16", axes=("X", "Y"),
        ...                          mesh_shape={"X": 4, "Y": 4}, hardware="tpu-v5p")
        >>> busiest = viz.link_traffic(c).data["busiest"]
        >>> busiest["bytes"] == max(c.axis_link_bytes)
        True
    """
    title_time = None
    if isinstance(x, dict):
        if mesh is None or mesh.hardware is None:
            raise ValueError("[viz.link_traffic] an event needs the mesh it ran on, with hardware "
                             "(make_mesh(..., hardware='tpu-v5e'))")
        V = float(nbytes) if nbytes is not None else group_bytes(x)
        x = cost.collective_time(x["op"], V, axes=tuple(x["axes"]), mesh=mesh)
    if isinstance(x, cost.CollectiveCost):
        dims, edges = _from_cost(x)
        op, V, title_time = x.op, x.bytes, x.seconds
        bw = {i: d[4] for i, d in enumerate(dims)}
    elif hasattr(x, "links") and hasattr(x, "topology") and hasattr(x, "size"):
        dims = [("axis", x.size, x.topology, x.topology, None)]
        edges = {((a,), None if b < 0 else (b,), 0): v for (a, b), v in _axis_links(x).items()}
        op, V, bw = x.op, x.bytes, {0: None}
    else:
        raise TypeError(f"[viz.link_traffic] expected an AxisSchedule, CollectiveCost or ledger event, "
                        f"got {type(x).__name__}")
    busiest_key = max(edges, key=lambda k: edges[k]) if edges else None
    top = edges[busiest_key] if edges else 0.0
    svg, w, h = _draw(dims, edges, top)
    shape_txt = " × ".join(f"{d[0]}: {d[1]} {d[2]}" for d in dims)
    head = f"{op}: bytes per link, V = {units.fmt_bytes(V)}" + \
        (f", {units.fmt_seconds(title_time)}" if title_time is not None else "")
    busiest = None
    if busiest_key is not None:
        src, dst, i = busiest_key
        t = top / bw[i] if bw.get(i) else None
        busiest = {"src": src, "dst": dst, "axis": dims[i][0], "bytes": top, "seconds": t}
        where = f"{_coord(src)} → {'switch' if dst is None else _coord(dst)} on {dims[i][0]}"
        sub = (f"{shape_txt}; busiest link {where}: {units.fmt_bytes(top)}"
               + (f" = {units.fmt_seconds(t)} at {units.fmt_bandwidth(bw[i])}" if t is not None else ""))
    else:
        sub = f"{shape_txt}; no traffic"
    low = min(edges.values()) if edges else 0.0
    legend = (f'<div class="sl-note" style="display:flex;align-items:center;gap:6px;margin-top:4px">bytes per link: '
              f'{esc(units.fmt_bytes(0))} <span style="display:inline-block;width:180px;height:10px;border:1px solid '
              f'#999;background:linear-gradient(90deg,{",".join(heat(i / 8) for i in range(9))})"></span> '
              f'{esc(units.fmt_bytes(top))} (darker: more bytes'
              + ("; every link carries the same" if edges and low == top else
                 f"; least-loaded link {esc(units.fmt_bytes(low))}" if edges else "") + ')</div>')
    html = (f'<div class="sl-view sl-links" data-view="link_traffic"><div class="sl-title">{esc(head)}</div>'
            f'<div class="sl-sub">{esc(sub)}</div><div style="overflow-x:auto;max-width:100%">{svg}</div>{legend}</div>')
    lines = [head, sub] + [f"  {_coord(s)} -> {'switch' if d is None else _coord(d)} [{dims[i][0]}]: "
                           f"{units.fmt_bytes(v)}" for (s, d, i), v in sorted(edges.items(), key=lambda kv: -kv[1])[:16]]
    data = {"links": edges, "busiest": busiest, "dims": dims, "width": w, "height": h}
    return View(html, "\n".join(lines) + "\n", None, data)


def _coord(c) -> str:
    return str(c[0]) if len(c) == 1 else "(" + ",".join(map(str, c)) + ")"


def _draw(dims, edges, top):
    n_dims = len(dims)
    out = []

    tips = sum(1 for k in edges) <= 3000   # hover titles, unless they would bloat a big torus

    def edge(x1, y1, x2, y2, v, off, title, label=False):
        dx, dy = x2 - x1, y2 - y1
        L = math.hypot(dx, dy) or 1.0
        ox, oy = -dy / L * off, dx / L * off
        sh = 0.18 * L  # leave room for the nodes
        ux, uy = dx / L, dy / L
        c = heat(v / top) if top else heat(0)
        wd = 1.2 + 2.3 * (v / top if top else 0)
        out.append(f'<line class="sl-link" data-bytes="{v:g}" x1="{x1 + ox + ux * sh * 0.5:.1f}" '
                   f'y1="{y1 + oy + uy * sh * 0.5:.1f}" x2="{x2 + ox - ux * sh * 0.5:.1f}" '
                   f'y2="{y2 + oy - uy * sh * 0.5:.1f}" stroke="{c}" stroke-width="{wd:.1f}" '
                   f'stroke-linecap="round">'
                   + (f'<title>{esc(title)}: {esc(units.fmt_bytes(v))}</title>' if tips else "") + '</line>')
        if label:  # the bytes beside the link, on its own side of the pair
            mx, my = (x1 + x2) / 2 + ox * 3.2, (y1 + y2) / 2 + oy * 3.2
            rot = "" if abs(dx) >= abs(dy) else f' transform="rotate(-90 {mx:.1f} {my + 3:.1f})"'
            out.append(f'<text x="{mx:.1f}" y="{my + 3:.1f}" text-anchor="middle" font-size="8.5"{rot} '
                       f'fill="#1b1b1b">{esc(units.fmt_bytes(v))}</text>')

    if n_dims == 1 and dims[0][2] in ("ring", "uni_ring", "switch"):
        n = dims[0][1]
        r = max(130.0 if n <= 12 else 70.0, min(260.0, n * 9.0))
        cx = cy = r + 40
        W = H = int(2 * r + 80)
        pos = {(i,): (cx + r * math.sin(2 * math.pi * i / n), cy - r * math.cos(2 * math.pi * i / n))
               for i in range(n)}
        for (s, d, _), v in edges.items():
            x1, y1 = pos[s]
            x2, y2 = (cx, cy) if d is None else pos[d]
            edge(x1, y1, x2, y2, v, 0 if d is None else 3.5, f"{_coord(s)} → {'switch' if d is None else _coord(d)}",
                 label=n <= 12 and d is not None)
        if dims[0][2] == "switch":
            out.append(f'<rect x="{cx - 30}" y="{cy - 12}" width="60" height="24" rx="4" fill="#444"/>'
                       f'<text x="{cx}" y="{cy + 4}" text-anchor="middle" fill="#fff">switch</text>')
        _nodes(out, pos, n <= 32)
        return _svg(out, W, H), W, H

    # grids: dims[0] down, dims[1] across, dims[2] as separate slices
    rows = dims[0][1] if n_dims >= 2 else 1
    cols = dims[1][1] if n_dims >= 2 else dims[0][1]
    all_slices = dims[2][1] if n_dims == 3 else 1
    # every slice carries the same traffic: draw the first few (at most ~256 nodes)
    slices = min(all_slices, _MAX_SLICES, max(1, 256 // max(1, rows * cols)))
    step = max(14.0, min(96.0, (_BOX if slices == 1 else 960 / slices - 40) / max(rows, cols)))
    pad = 30
    sw = cols * step + 2 * pad
    W = int(sw * slices)
    H = int(rows * step + 2 * pad + (16 if slices > 1 else 0) + (18 if slices > 1 else 0))

    def xy(c):
        if n_dims == 1:
            r_, c_, z = 0, c[0], 0
        else:
            r_, c_, z = c[0], c[1], (c[2] if n_dims == 3 else 0)
        return z * sw + pad + (c_ + 0.5) * step, pad + (16 if slices > 1 else 0) + (r_ + 0.5) * step

    pos = {c: xy(c) for c in itertools.product(*[range(d[1]) for d in dims]) if n_dims < 3 or c[2] < slices}
    if slices > 1:
        for z in range(slices):
            out.append(f'<text x="{z * sw + sw / 2:.1f}" y="14" text-anchor="middle" fill="#333">'
                       f'{esc(dims[2][0])} = {z}</text>')
    label = step >= 60
    for (s, d, i), v in edges.items():
        if d is None or s not in pos:
            continue
        x1, y1 = pos[s]
        if i == 2:  # a z link joins two slices: a short diagonal stroke out of the node, ↗ +z, ↙ -z
            up = (d[2] - s[2]) % dims[2][1] == 1
            k = 0.3 * step
            edge(x1, y1, x1 + k, y1 + (-k if up else k), v, 0, f"{_coord(s)} → {_coord(d)} ({dims[2][0]})")
            continue
        x2, y2 = pos[d]
        if abs(d[i] - s[i]) > 1:  # wraparound: a stub out of one edge and into the other
            k = 0.45 * step
            if n_dims >= 2 and i == 0:
                sgn = 1 if d[i] == 0 else -1
                edge(x1, y1, x1, y1 + sgn * k * 2, v, 3.5, f"{_coord(s)} → {_coord(d)} (wrap)")
                edge(x2, y2 - sgn * k * 2, x2, y2, v, 3.5, f"{_coord(s)} → {_coord(d)} (wrap)")
            else:
                sgn = 1 if d[i] == 0 else -1
                edge(x1, y1, x1 + sgn * k * 2, y1, v, 3.5, f"{_coord(s)} → {_coord(d)} (wrap)")
                edge(x2 - sgn * k * 2, y2, x2, y2, v, 3.5, f"{_coord(s)} → {_coord(d)} (wrap)")
            continue
        edge(x1, y1, x2, y2, v, 3.5, f"{_coord(s)} → {_coord(d)}", label=label)
    _nodes(out, pos, step >= 30)
    if slices > 1:
        more = (f"; slices {slices}–{all_slices - 1} carry the same and are not drawn"
                if all_slices > slices else "")
        out.append(f'<text x="4" y="{H - 4}" fill="#444">{esc(dims[2][0])} links run between the slices: the short '
                   f'diagonal strokes, ↗ to the next slice, ↘ to the previous{" (hover a link for its bytes)" if tips else ""}'
                   f'{esc(more)}'
                   f'</text>')
    return _svg(out, W, H), W, H


def _nodes(out, pos, labels: bool):
    for c, (x, y) in pos.items():
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{11 if labels else 4}" fill="#fff" stroke="#333">'
                   f'<title>{esc(_coord(c))}</title></circle>')
        if labels:  # in a 3-D torus the slice title gives the last coordinate
            out.append(f'<text x="{x:.1f}" y="{y + 3:.1f}" text-anchor="middle" font-size="8.5">'
                       f'{esc(",".join(map(str, c[:2])))}</text>')


def _svg(parts, w, h) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="system-ui,sans-serif" '
            f'font-size="11">' + "".join(parts) + "</svg>")
