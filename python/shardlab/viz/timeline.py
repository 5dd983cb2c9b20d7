"""A timeline of a ledger: a compute lane and a communication lane, phases and layers marked.

Every device runs every event (SPMD), so the devices behave alike and share one pair of lanes
(labelled with how many devices it stands for); each event lasts its estimated time on the mesh's
hardware. Three ways to place the events (``overlap=``):

- ``"deps"`` (default): events in program order on their lane, respecting the data dependencies
  the ledger implies: a collective starts after the compute event before it ends (that event
  produced its input), and a compute event starts after the collectives between it and the
  previous compute event (their outputs are its inputs) -- except the backward pass's gradient
  reductions, which feed the optimizer at the end of the step and so overlap the rest of it;
- ``"max"``: the two lanes run independently (the book's "collectives hide under compute"
  bound: total = the longer lane);
- ``"sum"``: nothing overlaps (total = the sum of all events).

Events with ``phase`` / ``label`` keys (a training step's forward, backward, recompute, and
``layer0/mlp``-style scopes) are marked by bands above the lanes; a long ledger collapses into one
block per consecutive (phase, label, lane) run (``collapse=``), and the HTML offers 1x / 4x / 16x
zoom in a horizontally scrolling frame. :func:`chrome_trace` writes the same spans in the Chrome
trace format that ui.perfetto.dev and chrome://tracing open.

Examples:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P, viz
    >>> mesh = sl.make_mesh((8,), ("x",), hardware="tpu-v5e")
    >>> f = sl.shard_map(lambda a, b: sl.lax.psum(a @ b, "x"), mesh=mesh,
    ...                  in_specs=(P(None, "x"), P("x")), out_specs=P())
    >>> with sl.Ledger() as ledger:
    ...     _ = f(np.ones((64, 64), np.float32), np.ones((64, 64), np.float32))
    >>> spans = viz.timeline(ledger).data["spans"]
    >>> spans[1]["op"], spans[1]["start"] == spans[0]["end"]   # the psum waits for its matmul
    ('psum', True)
"""

from __future__ import annotations

import json
import math

from shardlab import units

from .colors import palette, text_color
from .view import View, device_prefix, esc

__all__ = ["timeline", "schedule_events", "chrome_trace"]

_COMPUTE = {"matmul", "einsum", "attention", "attention_vjp", "elementwise", "compute"}
_GRAD_REDUCTIONS = {"psum", "psum_scatter", "reduce_scatter", "all_reduce", "pmean"}
_W = 820
_ZOOMS = (1, 4, 16)
_COLLAPSE_AT = 64  # ledgers longer than this collapse by (phase, label) unless told otherwise


def _lane(e: dict) -> str:
    return "compute" if (e.get("op") in _COMPUTE or (e.get("flops") and not e.get("axes"))) else "comm"


def schedule_events(events, overlap: str = "deps") -> list[dict]:
    """Start and end of every event: {"op", "lane" ("compute"/"comm"), "start", "end", ...}.

    Examples:
        >>> ev = [{"op": "matmul", "flops": 1.0, "seconds": 2.0}, {"op": "psum", "flops": 0, "seconds": 1.0}]
        >>> [(s["lane"], s["start"], s["end"]) for s in schedule_events(ev, "max")]
        [('compute', 0.0, 2.0), ('comm', 0.0, 1.0)]
        >>> [(s["lane"], s["start"], s["end"]) for s in schedule_events(ev)]   # the psum needs the matmul
        [('compute', 0.0, 2.0), ('comm', 2.0, 3.0)]
    """
    if overlap not in ("deps", "max", "sum"):
        raise ValueError(f"[timeline] overlap={overlap!r}: use 'deps' (data dependencies), 'max' (lanes "
                         f"independent) or 'sum' (one after another)")
    free = {"compute": 0.0, "comm": 0.0}
    last_compute_end = 0.0      # the producer of the next collective's input
    pending = 0.0               # end of the collectives the next compute event consumes
    out = []
    for e in events:
        s = e.get("seconds")
        if s is None:
            raise ValueError(f"[timeline] event {e.get('op')!r} has no time estimate: the mesh has no hardware; "
                             f"make it with make_mesh(..., hardware='tpu-v5e') (or another preset)")
        lane = _lane(e)
        if overlap == "sum":
            start = max(free.values())
        elif overlap == "max":
            start = free[lane]
        elif lane == "comm":
            start = max(free["comm"], last_compute_end)
        else:
            start = max(free["compute"], pending)
        end = start + float(s)
        free[lane] = end
        if overlap == "sum":
            free = {k: end for k in free}
        if lane == "compute":
            last_compute_end, pending = end, 0.0
        elif not (e.get("phase") == "backward" and e.get("op") in _GRAD_REDUCTIONS):
            pending = max(pending, end)
        out.append({"op": e.get("op"), "lane": lane, "start": start, "end": end, "axes": tuple(e.get("axes") or ()),
                    "label": e.get("label"), "phase": e.get("phase"), "count": 1})
    return out


def _collapse(spans: list[dict]) -> list[dict]:
    """Consecutive spans of one (phase, label, lane) merged into one block (op "label")."""
    out: list[dict] = []
    last: dict = {}
    for s in spans:
        key = (s["phase"], s["label"], s["lane"])
        prev = last.get(s["lane"])
        if prev is not None and prev["key"] == key:
            m = out[prev["i"]]
            m["end"], m["count"], m["busy"] = max(m["end"], s["end"]), m["count"] + 1, m["busy"] + s["end"] - s["start"]
            m["ops"][s["op"]] = m["ops"].get(s["op"], 0) + 1
            continue
        block = dict(s, busy=s["end"] - s["start"], ops={s["op"]: 1},
                     op=(s["label"] or s["op"]) if s["label"] else s["op"])
        out.append(block)
        last[s["lane"]] = {"key": key, "i": len(out) - 1}
    return out


def _ticks(total: float, count: int = 6) -> list[float]:
    if total <= 0:
        return [0.0]
    raw = total / count
    p = 10 ** math.floor(math.log10(raw))
    step = min(m * p for m in (1, 2, 5, 10) if m * p >= raw)
    return [i * step for i in range(int(total / step + 1e-9) + 1)]


def _runs(spans: list[dict], key: str) -> list[tuple[str, float, float]]:
    """(value, start, end) of consecutive spans (in program order) sharing ``key``."""
    out: list[list] = []
    for s in spans:
        v = s.get(key)
        if not v:
            continue
        if out and out[-1][0] == v:
            out[-1][1] = min(out[-1][1], s["start"])
            out[-1][2] = max(out[-1][2], s["end"])
        else:
            out.append([v, s["start"], s["end"]])
    return [tuple(r) for r in out]


def _layer(label) -> str | None:
    """"layer3" of "layer3/mlp"; the label itself when it has no slash."""
    return str(label).split("/")[0] if label else None


def timeline(ledger, *, overlap: str = "deps", mesh=None, collapse: bool | None = None) -> View:
    """Draws the ledger's events in time: one compute and one communication lane for the
    (identical) devices, bands marking phases and layers.

    Args:
        ledger: a Ledger (its mesh names the devices) or a list of event dicts.
        overlap: "deps" (data dependencies, the default), "max" (lanes independent) or "sum".
        mesh: the mesh, when ``ledger`` is a list.
        collapse: merge consecutive events of one (phase, label) per lane into one block
            (default: when the ledger has more than 64 events).

    Returns:
        A View; ``view.data`` has ``total`` (the end time), ``spans`` (every event's schedule),
        ``blocks`` (what is drawn: the spans, or the collapsed runs), ``compute`` / ``comm``
        (busy seconds per lane), ``phases`` and ``layers`` (the marked runs) and ``chrome_trace``
        (the spans as a Chrome trace dict).

    Examples:
        >>> from shardlab import viz
        >>> ev = [{"op": "matmul", "flops": 1, "seconds": 1e-3, "phase": "forward", "label": "layer0/mlp"},
        ...       {"op": "psum", "axes": ("x",), "seconds": 5e-4, "phase": "forward", "label": "layer0/mlp"}]
        >>> v = viz.timeline(ev)
        >>> round(v.data["total"], 6), v.data["layers"]
        (0.0015, [('layer0', 0.0, 0.0015)])
    """
    events = list(ledger.events) if hasattr(ledger, "events") else list(ledger)
    mesh = mesh if mesh is not None else getattr(ledger, "mesh", None)
    spans = schedule_events(events, overlap)
    total = max((s["end"] for s in spans), default=0.0)
    collapse = len(spans) > _COLLAPSE_AT if collapse is None else bool(collapse)
    blocks = _collapse(spans) if collapse else spans
    n_dev = mesh.size if mesh is not None else 1
    prefix = device_prefix(mesh)
    names = sorted({b["op"] for b in blocks}, key=str)
    colors = dict(zip(names, palette(len(names))))
    phases = _runs(spans, "phase")
    layers = _runs([dict(s, layer=_layer(s["label"])) for s in spans], "layer")
    who = (f"{prefix} 0" if n_dev == 1 else f"{prefix} 0–{n_dev - 1}")
    svgs = [_svg(blocks, phases, layers, colors, total, _W * z, who, n_dev) for z in _ZOOMS]
    comp = sum(s["end"] - s["start"] for s in spans if s["lane"] == "compute")
    comm = sum(s["end"] - s["start"] for s in spans if s["lane"] == "comm")
    mode = {"deps": "data dependencies", "max": "lanes independent", "sum": "no overlap"}[overlap]
    head = (f"timeline ({mode}): {units.fmt_seconds(total)} (compute {units.fmt_seconds(comp)}, "
            f"communication {units.fmt_seconds(comm)}, {len(spans)} events"
            + (f" in {len(blocks)} blocks" if collapse else "") + ")")
    legend = "".join(f'<span style="display:inline-block;padding:1px 6px;margin:0 4px 2px 0;background:{c};'
                     f'color:{text_color(c)};border-radius:3px">{esc(o)}</span>' for o, c in colors.items())
    uid = f"sl-tl{abs(hash((len(spans), total, id(events)))) % 10**8}"
    zoom = "".join(f'<input type="radio" name="{uid}" id="{uid}-{z}"{" checked" if z == 1 else ""} '
                   f'style="margin-left:8px"><label for="{uid}-{z}">{z}×</label>' for z in _ZOOMS)
    # without CSS (an untrusted notebook) only the 1x frame shows; the radio buttons pick another
    css = (f"#{uid}-1:not(:checked)~.sl-tl-1{{display:none}}"
           + "".join(f"#{uid}-{z}:checked~.sl-tl-{z}{{display:block !important}}" for z in _ZOOMS[1:]))
    frames = "".join(f'<div class="sl-tl-{z}" style="{"" if z == 1 else "display:none;"}overflow-x:auto;'
                     f'max-width:100%">{svg}</div>' for z, svg in zip(_ZOOMS, svgs))
    html = (f'<div class="sl-view sl-timeline" data-view="timeline"><div class="sl-title">{esc(head)}</div>'
            f'<div class="sl-sub">{legend}</div><style>{css}</style>'
            f'<div class="sl-zoom"><span class="sl-note">zoom</span>{zoom}{frames}</div></div>')
    lines = [head]
    if collapse:
        lines += [f"  {b['lane']:<7} {units.fmt_seconds(b['start']):>9} - {units.fmt_seconds(b['end']):>9}  "
                  f"{b['phase'] or ''} {b['op']} ({b['count']} events)" for b in blocks]
    else:
        lines += [f"  {s['lane']:<7} {units.fmt_seconds(s['start']):>9} - {units.fmt_seconds(s['end']):>9}  "
                  f"{s['op']} {','.join(s['axes'])}" for s in spans]
    return View(html, "\n".join(lines) + "\n", None,
                {"total": total, "spans": spans, "blocks": blocks, "compute": comp, "comm": comm,
                 "colors": colors, "phases": phases, "layers": layers, "collapsed": collapse,
                 "chrome_trace": chrome_trace(spans, device=who)})


def _svg(blocks, phases, layers, colors, total, W, who, n_dev) -> str:
    lane_h, left, top = 22, 150, 20
    y_phase, y_layer = top + 8, top + 28
    y_lanes = top + 70
    H = y_lanes + 2 * lane_h + 30
    scale = (W - left - 20) / total if total else 0.0
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="system-ui,sans-serif" '
           f'font-size="11">']
    for t in _ticks(total, max(6, round(6 * (W - left) / (_W - left)))):   # more ticks when zoomed in
        x = left + t * scale
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{y_lanes + 2 * lane_h + 4}" stroke="#e3e3e3"/>'
                   f'<text x="{x:.1f}" y="{top - 6}" text-anchor="middle" fill="#444">{esc(units.fmt_seconds(t))}</text>')
    shades = {"forward": "#dbe9f6", "backward": "#f6e3d4", "recompute": "#e6e0f3", "optimizer": "#dff0df"}
    for name, y, runs in (("phase", y_phase, phases), ("layer", y_layer, layers)):
        if not runs:
            continue
        out.append(f'<text x="4" y="{y + 13}" fill="#333">{name}</text>')
        for k, (v, a, b) in enumerate(runs):
            x, w = left + a * scale, max(1.0, (b - a) * scale)
            fill = shades.get(v, "#eeeeee") if name == "phase" else ("#f0f0f0" if k % 2 else "#e2e2e2")
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="18" fill="{fill}" stroke="#fff">'
                       f'<title>{esc(v)}: {esc(units.fmt_seconds(a))} – {esc(units.fmt_seconds(b))}</title></rect>')
            if w > 6.5 * len(str(v)) + 6:
                out.append(f'<text x="{x + 4:.1f}" y="{y + 13}" fill="#1b1b1b">{esc(v)}</text>')
    lanes = (("compute", y_lanes), ("comm", y_lanes + lane_h))
    same = "" if n_dev == 1 else f" (all {n_dev} alike)"
    out.append(f'<text x="4" y="{y_lanes - 6}" fill="#333" font-weight="600">{esc(who)}{esc(same)}</text>')
    for name, y in lanes:
        out.append(f'<text x="4" y="{y + lane_h - 7}" fill="#333">{"compute" if name == "compute" else "communication"}'
                   f'</text>')
    for b in blocks:
        y = dict(lanes)[b["lane"]]
        x, w = left + b["start"] * scale, max(1.0, (b["end"] - b["start"]) * scale)
        c = colors[b["op"]]
        what = b["op"] if b.get("count", 1) == 1 else (
            f"{b['phase'] or ''} {b['op']}: {b['count']} events (" + ", ".join(f"{k} ×{v}" for k, v in b["ops"].items())
            + f"), busy {units.fmt_seconds(b['busy'])}")
        tip = f"{what} {','.join(b['axes']) if b.get('count', 1) == 1 else ''}: {units.fmt_seconds(b['start'])} – " \
              f"{units.fmt_seconds(b['end'])}"
        out.append(f'<rect class="sl-span" x="{x:.1f}" y="{y + 1}" width="{w:.1f}" height="{lane_h - 2}" '
                   f'fill="{c}" stroke="#fff" stroke-width="0.5"><title>{esc(tip)}</title></rect>')
        label = str(b["op"]).split("/")[-1]
        if w > 6.6 * len(label) + 4:
            out.append(f'<text x="{x + w / 2:.1f}" y="{y + lane_h - 7}" text-anchor="middle" '
                       f'fill="{text_color(c)}" font-size="10">{esc(label)}</text>')
    out.append(f'<text x="4" y="{H - 6}" fill="#555">hover a block for its op and times; '
               f'every device runs the same schedule (SPMD)</text>')
    out.append("</svg>")
    return "".join(out)


def chrome_trace(spans, *, device: str = "device", path: str | None = None) -> dict:
    """The spans (``viz.timeline(...).data["spans"]`` or ``schedule_events(...)``) in the Chrome
    trace event format: open the JSON in ui.perfetto.dev or chrome://tracing.

    Args:
        spans: dicts with op, lane, start, end (seconds) and optional phase, label, axes.
        device: the process name shown for the lanes.
        path: when given, the JSON is also written there.

    Returns:
        ``{"traceEvents": [...], "displayTimeUnit": "ns"}``, times in microseconds.

    Examples:
        >>> t = chrome_trace([{"op": "matmul", "lane": "compute", "start": 0.0, "end": 2e-3}])
        >>> e = t["traceEvents"][-1]; (e["name"], e["ph"], e["ts"], e["dur"])
        ('matmul', 'X', 0.0, 2000.0)
    """
    tids = {"compute": 0, "comm": 1}
    ev: list[dict] = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": device}}]
    ev += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": t, "args": {"name": n}} for n, t in tids.items()]
    for s in spans:
        args = {k: s[k] for k in ("phase", "label") if s.get(k)}
        if s.get("axes"):
            args["axes"] = ",".join(s["axes"])
        ev.append({"name": str(s["op"]), "cat": s["lane"], "ph": "X", "pid": 0, "tid": tids.get(s["lane"], 2),
                   "ts": s["start"] * 1e6, "dur": (s["end"] - s["start"]) * 1e6, "args": args})
    trace = {"traceEvents": ev, "displayTimeUnit": "ns"}
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(trace, f)
    return trace
