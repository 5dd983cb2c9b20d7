"""A picture of one collective: each device's data before and after, and the cost model's stages
between, each with the bytes every link carries.

The collective really runs (shard_map on a small array whose values name their origin), so the
"after" row shows what shardlab computed; each chunk is coloured by the device it came from, and
a reduced chunk by a stripe of every device's colour with its value (a reduction's "before"
values are ``device + 1 + 10·chunk``, so "after" reads as their sum: 1 + 2 + … + 8 = 36).

Between the rows are the stages the cost model prices (``shardlab.cost.collective_time``): one
for an AllGather, a reduce-scatter then an all-gather for a psum, one stage per mesh axis over
several axes. Each stage's band draws the links of its ring, line or switch
(``shardlab.cost.schedule``) coloured on one sequential scale and labelled with their bytes where
they fit, and says how many steps it takes and its time (its busiest link over the link
bandwidth); the stage times add up to the title's time.

Examples:
    >>> import shardlab as sl
    >>> from shardlab import viz
    >>> mesh = sl.make_mesh((4, 2), ("x", "y"), hardware="tpu-v5e")
    >>> v = viz.collective("all_gather", mesh, "x", nbytes=4096)
    >>> v.data["after"][0], v.data["topology"], v.data["link_bytes"][(0, 1)]
    ([0, 1, 2, 3], 'line', 1024.0)
    >>> [(s["op"], s["steps"]) for s in viz.collective("psum", mesh, "x", nbytes=4096).data["stages"]]
    [('reduce_scatter', 3), ('all_gather', 3)]
"""

from __future__ import annotations

import itertools
import math

import numpy as np

import shardlab as sl
from shardlab import cost, units

from .colors import NEUTRAL, heat, palette, text_color
from .view import View, device_prefix, esc

__all__ = ["collective", "group_bytes"]

_KIND = {"all_gather": "all_gather", "psum": "psum", "all_reduce": "psum", "pmean": "psum", "pmax": "psum",
         "pmin": "psum", "psum_scatter": "psum_scatter", "reduce_scatter": "psum_scatter",
         "all_to_all": "all_to_all", "ppermute": "ppermute"}
_MAX_W = 960
_REL = 1e-9
_SUM = "#3d4f73"  # the one colour of a sum when each device holds a single value


def group_bytes(event: dict) -> float:
    """V of a ledger event: the array one group's collective works on (docs/cost_model.md);
    the cost model's own formula (``shardlab.cost.formulas.group_bytes``).

    Examples:
        >>> group_bytes({"op": "all_gather", "group_size": 4, "bytes_in": 8, "bytes_out": 32})
        32.0
    """
    return cost.formulas.group_bytes(event["op"], int(event.get("group_size") or 1),
                                     float(event.get("bytes_in") or 0), float(event.get("bytes_out") or 0))


def _base(n: int) -> int:
    """10, 100, ...: the chunk stride of a reduction's "before" values (device + 1 + base·chunk)."""
    return 10 ** len(str(n + 1)) if n >= 10 else 10


def _run(kind: str, mesh, axes: tuple, n: int):
    """Runs the collective; per-device values before and after, and the ledger event.

    A reduction starts from ``k + 1 + base·j`` (device k of the flattened mesh, element j) so its
    sums are easy to read; the other collectives from ``k·L + j``, one value per origin.
    """
    L = n if kind in ("psum_scatter", "all_to_all") or (kind == "psum" and n <= 16) else 1
    k = np.repeat(np.arange(mesh.size), L).astype(np.float32)
    j = np.tile(np.arange(L), mesh.size).astype(np.float32)
    x = (k + 1 + _base(n) * j) if kind in ("psum", "psum_scatter") else k * L + j
    x = x.astype(np.float32)
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
    before = {d: x[i * L:(i + 1) * L] for i, d in enumerate(flat)}
    return before, after, L, ledger.events[-1]


def _group(mesh, axes) -> list[int]:
    """Device ids of the first group (the other mesh axes at 0), in group order (first axis major)."""
    idx = tuple(slice(None) if a in axes else 0 for a in mesh.axis_names)
    sub = mesh.device_ids[idx]
    order = [a for a in mesh.axis_names if a in axes]
    sub = np.moveaxis(sub, [order.index(a) for a in axes], range(len(axes))) if len(axes) > 1 else sub
    return [int(i) for i in np.asarray(sub).ravel()]


# -- the cost model's stages ------------------------------------------------------------------
def _stage_list(kind: str, order: list[int], sizes: list[int]) -> list[tuple[str, int, float]]:
    """(1-D op, axis index, fraction of V) of each stage, as the cost model splits a collective
    over several axes (cpp/src/cost.cpp, stages_for)."""
    n_total = math.prod(sizes)
    out = []
    if kind == "all_gather":
        done = 1
        for a in order:
            done *= sizes[a]
            out.append(("all_gather", a, done / n_total))
    elif kind in ("psum_scatter", "psum"):
        done = 1
        for a in order:
            out.append(("reduce_scatter", a, 1 / done))
            done *= sizes[a]
        if kind == "psum":
            size = 1 / n_total
            for a in reversed(order):
                size *= sizes[a]
                out.append(("all_gather", a, size))
    elif kind == "all_to_all":
        out = [("all_to_all", a, sizes[a] / n_total) for a in order]
    else:
        out = [("ppermute", a, 1.0) for a in order]
    return out


def _stages(kind: str, op: str, V: float, dims: list[dict], target) -> list[dict]:
    """The stages of the plan the cost model chose: the candidate (one order of the axes, or an
    even split over their rotations) whose busiest-link loads per axis equal ``target``."""
    k = len(dims)
    sizes = [d["size"] for d in dims]
    rotations = [[(r + i) % k for i in range(k)] for r in range(k)]
    candidates = [[list(range(k))]]
    if k > 1 and kind != "ppermute":
        candidates = [rotations] + [[list(p)] for p in itertools.permutations(range(k))]

    def build(orders):
        f = 1.0 / len(orders)
        stages = []
        for o in orders:
            for one, a, scale in _stage_list(kind, o, sizes):
                d = dims[a]
                sv = f * V * scale
                sched = cost.schedule(one, d["size"], d["topology"], sv)
                stages.append({"op": one, "axis": d["name"], "dim": a, "bytes": sv, "steps": int(sched.steps),
                               "step_max_bytes": [float(b) for b in sched.step_max_bytes],
                               "links": {(lc.src, lc.dst): float(lc.bytes) for lc in sched.links},
                               "busiest": float(sched.max_link_bytes),
                               "seconds": float(sched.max_link_bytes) / d["bandwidth"] if d["bandwidth"] else None})
        return stages

    def loads(stages):
        out = [0.0] * k
        for s in stages:
            out[s["dim"]] += s["busiest"]
        return out

    built = [build(c) for c in candidates]
    if target is not None:
        for st in built:
            if all(abs(a - b) <= _REL * max(1.0, b) for a, b in zip(loads(st), target)):
                return st
    return built[0]


def collective(op, mesh=None, axis=None, *, nbytes: float | None = None) -> View:
    """Draws one collective over one group of devices, stage by stage.

    Args:
        op: a collective name (all_gather, psum, psum_scatter, all_to_all, ppermute, ...) or a
            ledger event dict (``ledger.events[i]``), whose op, axes and bytes are used.
        mesh: the mesh (for an event: the mesh it ran on, e.g. ``ledger.mesh``).
        axis: mesh axis name or tuple of names (taken from the event when one is given).
        nbytes: V, the bytes one group's collective works on, for the link labels
            (default: the event's, else the small array drawn).

    Returns:
        A View (SVG in HTML; text lists the rows, stages and link bytes). ``view.data`` has
        ``before`` and ``after`` (origin device of each chunk, -1 for a reduced chunk),
        ``values_after``, ``stages`` (per stage: op, axis, steps, links {(src, dst): bytes},
        busiest, seconds), ``link_bytes`` (each link's bytes over all stages, by axis position in
        the group), ``topology`` and ``seconds`` (the cost model's time).

    Examples:
        >>> import shardlab as sl
        >>> from shardlab import viz
        >>> mesh = sl.make_mesh((8,), ("x",), hardware="tpu-v5e")
        >>> v = viz.collective("psum", mesh, "x", nbytes=2**30)
        >>> import math   # the stages add up to the cost model's time (to the last bit or so)
        >>> math.isclose(sum(s["seconds"] for s in v.data["stages"]), v.data["bandwidth_seconds"], rel_tol=1e-12)
        True
        >>> v.data["values_after"][0][0] == sum(range(1, 9))   # 1 + 2 + ... + 8
        True
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
    origin_of = {float(v): pos[d] for d in group for v in before[d]}
    reduced = kind in ("psum", "psum_scatter")
    rows_b = [[pos[d]] * len(before[d]) if reduced else [origin_of.get(float(v), -1) for v in before[d]]
              for d in group]
    # a reduction's chunks are coloured by chunk (j of every device sums into j), the others by origin
    rows_a = [[-1 if reduced else origin_of.get(float(v), -1) for v in after[d]] for d in group]
    # a reduction's chunks are coloured by chunk (chunk j of every device sums into chunk j), the
    # others by origin; one value per device (a psum over many devices) gets one colour for the sum
    fill_b = [[j % n for j in range(len(before[d]))] for d in group] if reduced and L > 1 else rows_b
    fill_a = ([list(range(len(after[d]))) if L > 1 else [-1] for d in group]) if reduced else rows_a
    vals_b = [before[d].tolist() for d in group]
    vals_a = [after[d].tolist() for d in group]

    # The physical links of each mesh axis (one link kind per axis), and the stages on them.
    hw = mesh.hardware
    real = [a for a in axes if mesh.shape[a] > 1]
    strides = {a: math.prod(mesh.shape[b] for b in axes[axes.index(a) + 1:]) for a in axes}
    dims = [{"name": a, "size": mesh.shape[a], "topology": "ring", "bandwidth": None, "stride": strides[a]}
            for a in real]
    note, seconds, bw_seconds, target, drawable = "", None, None, None, True
    if hw is None:
        note = "no hardware preset: drawn on bidirectional rings"
    else:
        al = sl.hardware.axis_links(hw, dict(mesh.shape), tuple(real), mesh.physical_axes)
        if [l.mesh_axis for l in al] == real:
            for d, l in zip(dims, al):
                d["topology"], d["bandwidth"], d["link"] = l.topology, l.bandwidth, l.link
        else:
            drawable = False
            note = "an axis spans several physical links: viz.link_traffic draws them"
        c = cost.collective_time(op if op != "pmean" else "psum", V, axes=axes, mesh=mesh)
        seconds, bw_seconds, target = c.seconds, c.bandwidth_seconds, list(c.axis_link_bytes)
    stages = _stages(kind, op, V, dims, target) if dims and drawable else []
    topology = dims[0]["topology"] if len(dims) == 1 else ("multi-axis" if dims else "none")
    # bytes per link over all stages, by position in the drawn group
    link_bytes: dict = {}
    for s in stages:
        if len(dims) == 1:
            for key, b in s["links"].items():
                link_bytes[key] = link_bytes.get(key, 0.0) + b
    values_mid = None
    if kind == "psum" and len(dims) == 1:
        values_mid = [[vals_a[i][j] if j // max(1, L // n) == i else None for j in range(L)] for i in range(n)]
    if kind == "psum_scatter":
        fill_a = [[i * (L // n) + j for j in range(len(vals_a[i]))] for i in range(n)]

    prefix = device_prefix(mesh)
    colors = palette(n)
    svg, width, top = _svg(group, fill_b, fill_a, vals_b, vals_a, values_mid, stages, dims, colors, prefix, reduced)
    groups = mesh.size // n
    head = (f"{op} over {', '.join(axes)} (n={n}): V = {units.fmt_bytes(V)}"
            + (f", {units.fmt_seconds(seconds)} on {hw.name}" if seconds is not None else ""))
    sub = (f"one group of {n} drawn ({prefix} {', '.join(map(str, group[:8]))}{'…' if n > 8 else ''}); "
           f"{groups} group{'s' * (groups != 1)} in all; "
           + (f"topology {topology}" if len(dims) <= 1 else
              "; ".join(f"{d['name']}: {d['size']} {d['topology']}" for d in dims)))
    if note:
        sub += f"; {note}"
    caption = ""
    if reduced:
        col = [vals_b[i][0] for i in range(n)]
        terms = " + ".join(f"{v:g}" for v in col) if n <= 8 else f"{col[0]:g} + {col[1]:g} + … + {col[-1]:g}"
        caption = (f"after[j] = the sum over the {n} devices of before[j]; chunk 0: {terms} = {sum(col):g}"
                   + ("" if kind == "psum" else f"; device i keeps chunk i"))
    timing = ""
    if stages and bw_seconds is not None and all(s["seconds"] is not None for s in stages):
        if len(dims) == 1:
            timing = ("time: " + " + ".join(units.fmt_seconds(s["seconds"]) for s in stages)
                      + (f" = {units.fmt_seconds(bw_seconds)}" if len(stages) > 1 else "")
                      + " (each stage: its busiest link over the link bandwidth)")
        else:
            per = [sum(s["seconds"] for s in stages if s["axis"] == d["name"]) for d in dims]
            timing = ("time: the axes work in parallel, max(" + ", ".join(
                f"{d['name']} {units.fmt_seconds(t)}" for d, t in zip(dims, per)) + f") = {units.fmt_seconds(max(per))}")
        if seconds > bw_seconds * (1 + 1e-9):
            timing += f"; the hops' latency makes it {units.fmt_seconds(seconds)}"
    caption = "; ".join(x for x in (caption, timing) if x)
    legend = _legend(top)
    html = (f'<div class="sl-view sl-collective" data-view="collective"><div class="sl-title">{esc(head)}</div>'
            f'<div class="sl-sub">{esc(sub)}</div>'
            f'<div style="overflow-x:auto;max-width:100%">{svg}</div>'
            + (f'<div class="sl-note">{esc(caption).replace("; ", "<br>")}</div>' if caption else "") + legend + "</div>")
    lines = [head, sub] + ([caption] if caption else [])
    for name, rows, vals in (("before", rows_b, vals_b), ("after", rows_a, vals_a)):
        lines.append(f"{name}:")
        for d, r, v in zip(group[:16], rows, vals):
            lines.append(f"  {prefix} {d}: " + " ".join(f"Σ{x:g}" if o < 0 else
                                                         (f"{x:g}" if reduced else str(group[o]))
                                                         for o, x in zip(r[:16], v[:16])))
    for i, s in enumerate(stages, 1):
        lines.append(f"stage {i}: {_stage_text(s)}")
        lines += [f"  link {s['axis']} {a}->{'switch' if b < 0 else b}: {units.fmt_bytes(x)}"
                  for (a, b), x in sorted(s["links"].items())][:32]
    data = {"before": rows_b, "after": rows_a, "values_before": vals_b, "values_after": vals_a,
            "values_mid": values_mid, "group": group, "link_bytes": link_bytes, "stages": stages,
            "topology": topology, "nbytes": V, "seconds": seconds, "bandwidth_seconds": bw_seconds,
            "width": width, "colors": colors}
    return View(html, "\n".join(lines) + "\n", None, data)


def _stage_text(s: dict) -> str:
    steps = s["step_max_bytes"]
    per_step = (f" (≤ {units.fmt_bytes(max(steps))} per link per step)" if steps else "")
    return (f"{s['op']} over {s['axis']} on {units.fmt_bytes(s['bytes'])}: {_steps(s['steps'])}"
            f"{per_step}, busiest link {units.fmt_bytes(s['busiest'])}"
            + (f" = {units.fmt_seconds(s['seconds'])}" if s["seconds"] is not None else ""))


def _legend(top: float) -> str:
    if not top:
        return ""
    ticks = [0.0, 0.5, 1.0]
    return ('<div class="sl-note" style="display:flex;align-items:center;gap:6px;margin-top:4px">'
            'bytes per link: ' + f'{esc(units.fmt_bytes(0))} <span style="display:inline-block;width:180px;'
            f'height:10px;border:1px solid #999;background:linear-gradient(90deg,'
            f'{",".join(heat(i / 8) for i in range(9))})"></span> {esc(units.fmt_bytes(top))} '
            f'(darker: more bytes; midpoint {esc(units.fmt_bytes(top * ticks[1]))})</div>')


def _svg(group, rows_b, rows_a, vals_b, vals_a, values_mid, stages, dims, colors, prefix, reduced):
    n = len(group)
    gap = 10 if n <= 16 else 2
    x0, label_w = 64.0, 62
    bw = min(120.0, (_MAX_W - x0 - 10 - gap * (n - 1)) / n)
    width = int(x0 + n * bw + (n - 1) * gap + 10)
    bh = 30
    top = max((s["busiest"] for s in stages), default=0.0)
    # bands: one per stage on one axis; one per axis (all its stages summed) over several axes
    if len(dims) == 1:
        bands = [(f"{i}. {s['op']}", s["links"], s, dims[0]) for i, s in enumerate(stages, 1)]
    else:
        bands = []
        for d in dims:
            mine = [s for s in stages if s["axis"] == d["name"]]
            total: dict = {}
            for s in mine:
                for k, b in s["links"].items():
                    total[k] = total.get(k, 0.0) + b
            bands.append((f"{d['name']} links", total, mine, d))
        top = max((max(b[1].values(), default=0.0) for b in bands), default=0.0)
    band_h = [(64 if d["topology"] == "line" else 100 if d["topology"] == "switch" else 136)
              for _, _, _, d in bands]
    out = []
    y = 24
    rows_y = {}

    def cx(i):
        return x0 + i * (bw + gap) + bw / 2

    out.append("")  # the <svg> header, once the height is known
    out.append('<defs><marker id="sl-arr" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
               'markerUnits="userSpaceOnUse" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#333"/>'
               '</marker></defs>')
    # device names above the top row
    step = 1 if bw >= 40 else max(1, int(math.ceil(40 / (bw + gap))))
    for i, d in enumerate(group):
        if i % step == 0:
            out.append(f'<text x="{cx(i):.1f}" y="{y - 6}" text-anchor="middle" fill="#333">'
                       f'{esc(prefix + " " + str(d) if bw >= 50 else str(d))}</text>')

    def row(y, fills, vals, title):
        """Device blocks of chunks: ``fills`` are colour indices, ``vals`` the values (None: empty)."""
        out.append(f'<text x="{x0 - label_w}" y="{y + bh / 2 + 4}" font-weight="600" fill="#1b1b1b">{title}</text>')
        for i, (r, v) in enumerate(zip(fills, vals)):
            left = x0 + i * (bw + gap)
            cw = bw / max(1, len(r))
            runs = []  # [first chunk, count, colour, value]: neighbours of one colour merge when thin
            for j, (o, val) in enumerate(zip(r, v)):
                if cw < 4 and runs and runs[-1][2] == o and (val is None) == (runs[-1][3] is None):
                    runs[-1][1] += 1
                else:
                    runs.append([j, 1, o, val])
            for j, k, o, val in runs:
                fill = NEUTRAL if val is None else (_SUM if o < 0 else colors[o % n])
                out.append(f'<rect class="sl-chunk" x="{left + j * cw:.1f}" y="{y}" width="{k * cw:.1f}" '
                           f'height="{bh}" fill="{fill}"' + (' stroke="#fff" stroke-width="0.5"/>' if cw >= 4 else "/>"))
                if val is None or k != 1:
                    continue
                label = f"{val:g}" if reduced else str(group[o])
                fs = 11 if cw >= 7 * len(label) + 2 else 9 if cw >= 5.6 * len(label) + 1 else 0
                if fs:
                    out.append(f'<text x="{left + (j + 0.5) * cw:.1f}" y="{y + bh / 2 + 4}" text-anchor="middle" '
                               f'font-size="{fs}" fill="{text_color(fill)}">{esc(label)}</text>')
            out.append(f'<rect x="{left:.1f}" y="{y}" width="{bw:.1f}" height="{bh}" fill="none" stroke="#333"/>')

    row(y, rows_b, vals_b, "before")
    rows_y["before"] = y
    y += bh
    for b, ((title, links, st, d), h) in enumerate(zip(bands, band_h)):
        _band(out, y, h, title, links, st, d, n, cx, x0, label_w, top, bw, group)
        y += h
        if values_mid is not None and b == 0 and len(bands) > 1:
            row(y, rows_a, values_mid, "after 1")
            y += bh
    if not bands:
        y += 40
    row(y, rows_a, vals_a, "after")
    height = y + bh + 8
    out[0] = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
              f'font-family="system-ui,sans-serif" font-size="11">')
    out.append("</svg>")
    return "".join(out), width, top


def _band(out, y, h, title, links, st, d, n, cx, x0, label_w, top, bw, group):
    """One band of links between two rows, for one line of the axis (device 0's; every line of
    it carries the same): forward links above the middle, backward below, a ring's wraparound as
    a dashed arc; colour (one sequential scale) and width by bytes, numbers where they fit."""
    mid = y + h / 2 + 8
    stage_list = st if isinstance(st, list) else [st]
    bwd = f" at {units.fmt_bandwidth(d['bandwidth'])}" if d["bandwidth"] else ""
    if len(stage_list) == 1:
        s = stage_list[0]
        per = max(s["step_max_bytes"]) if s["step_max_bytes"] else 0.0
        note = (f"{_steps(s['steps'])}, ≤ {units.fmt_bytes(per)} per link per step; busiest link "
                f"{units.fmt_bytes(s['busiest'])}" + (f" = {units.fmt_seconds(s['seconds'])}{bwd}"
                                                      if s["seconds"] is not None else ""))
    else:
        load = sum(s["busiest"] for s in stage_list)
        note = (f"{len(stage_list)} stages ({', '.join(sorted({s['op'] for s in stage_list}))}); their busiest links "
                f"add to {units.fmt_bytes(load)}" + (f" = {units.fmt_seconds(load / d['bandwidth'])}{bwd}"
                                                     if d["bandwidth"] else ""))
    tip = "; ".join(_stage_text(s) for s in stage_list)
    out.append(f'<text x="{x0 - label_w}" y="{y + 16}" fill="#1b1b1b"><tspan font-weight="600">{esc(title)}</tspan>'
               f'<tspan fill="#444">  {esc(note)}</tspan><title>{esc(tip)}</title></text>')
    stride, size, topo = d["stride"], d["size"], d["topology"]
    on_line = [k * stride for k in range(size)]
    for o in range(n):
        r = 3 if o in on_line else 1.5
        out.append(f'<circle cx="{cx(o):.1f}" cy="{mid:.1f}" r="{r}" fill="{"#333" if r == 3 else "#aaa"}"/>')
    if topo == "switch" and links:
        sx = (cx(0) + cx(n - 1)) / 2
        out.append(f'<rect x="{sx - 35:.1f}" y="{mid + 14:.1f}" width="70" height="22" rx="4" fill="#444"/>'
                   f'<text x="{sx:.1f}" y="{mid + 29:.1f}" text-anchor="middle" fill="#fff">switch</text>')
    for (s, t), b in sorted(links.items()):
        col = heat(b / top) if top else heat(0)
        w = 1.5 + 2.5 * (b / top if top else 0)
        lab = units.fmt_bytes(b)
        tip = f"{d['name']} {s} → {'switch' if t < 0 else t}: {lab}"
        a = s * stride
        if t < 0:  # a switch port
            sx = (cx(0) + cx(n - 1)) / 2
            out.append(f'<line class="sl-link" data-bytes="{b:g}" x1="{cx(a):.1f}" y1="{mid + 4:.1f}" '
                       f'x2="{sx + (cx(a) - sx) * 0.15:.1f}" y2="{mid + 13:.1f}" stroke="{col}" stroke-width="{w:.1f}" '
                       f'marker-end="url(#sl-arr)"><title>{esc(tip)}</title></line>')
            continue
        c = t * stride
        wrap = abs(t - s) > 1
        fwd = ((t - s) % size == 1) if topo in ("ring", "uni_ring") else t > s
        yy = mid - 7 if fwd else mid + 7
        if not wrap:
            x1, x2 = cx(a) + (5 if c > a else -5), cx(c) + (-5 if c > a else 5)
            out.append(f'<line class="sl-link" data-bytes="{b:g}" x1="{x1:.1f}" y1="{yy:.1f}" x2="{x2:.1f}" '
                       f'y2="{yy:.1f}" stroke="{col}" stroke-width="{w:.1f}" marker-end="url(#sl-arr)">'
                       f'<title>{esc(tip)}</title></line>')
            if abs(x2 - x1) >= 6.2 * len(lab) + 4:
                out.append(f'<text x="{(x1 + x2) / 2:.1f}" y="{yy + (-6 if fwd else 14):.1f}" '
                           f'text-anchor="middle" font-size="10" fill="#1b1b1b">{esc(lab)}</text>')
        else:  # the wraparound: an arc outside the straight links
            bend = (h / 2 - 20) * (-1 if fwd else 1)
            out.append(f'<path class="sl-link" data-bytes="{b:g}" d="M{cx(a):.1f},{yy:.1f} '
                       f'C{cx(a):.1f},{yy + bend:.1f} {cx(c):.1f},{yy + bend:.1f} {cx(c):.1f},{yy:.1f}" '
                       f'fill="none" stroke="{col}" stroke-width="{w:.1f}" stroke-dasharray="5,3" '
                       f'marker-end="url(#sl-arr)"><title>{esc(tip)} (wraparound)</title></path>')
            out.append(f'<text x="{(cx(a) + cx(c)) / 2:.1f}" y="{yy + bend * 0.75 + (-3 if fwd else 11):.1f}" '
                       f'text-anchor="middle" font-size="10" fill="#1b1b1b">{esc(lab)} (wraparound {s} → {t})</text>')


def _steps(k: int) -> str:
    return f"{k} step{'s' * (k != 1)}"
