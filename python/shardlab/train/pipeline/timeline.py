"""Pictures of a clocked schedule: one lane per device, blocks coloured by microbatch.

Each device gets a compute lane (forward blocks light, whole backward / input gradient full
colour, weight gradient dark, all in the microbatch's hue, labelled F3 / B3 / I3 / W3, ``.c`` for
chunk c; the two members of an overlapped F&B pair share one block, the forward in its upper half
and the backward in its lower half) with its idle time shaded grey and hatched, and a thin send lane below it (the link
busy with an activation or gradient). :func:`to_svg` / :func:`to_html` give inline SVG for
Jupyter (``Timeline._repr_html_``, in a frame that scrolls sideways instead of being cut), :func:`plot`
a matplotlib figure, and :func:`to_chrome_trace` the Chrome trace / Perfetto JSON (open it in
ui.perfetto.dev): one track per stage for compute and one for its sends.

Examples:
    >>> from shardlab.train import pipeline as pp
    >>> svg = pp.clock(pp.gpipe(2, 2)).to_svg()
    >>> svg.startswith("<svg") and "F1" in svg and "bubble" in svg
    True
"""

from __future__ import annotations

import colorsys
import html
import json

from shardlab.viz.colors import text_color

__all__ = ["to_svg", "to_html", "plot", "microbatch_colour", "to_chrome_trace"]

_KIND_LIGHTNESS = {"forward": 0.72, "backward": 0.50, "backward_input": 0.50, "backward_weight": 0.32,
                   "send": 0.55}
_SHORT = {"forward": "F", "backward": "B", "backward_input": "I", "backward_weight": "W"}
_BUBBLE = "#d9d9d9"


def microbatch_colour(mb: int, kind: str = "backward") -> str:
    """The hex colour of microbatch ``mb``'s ``kind`` blocks (golden-ratio hues, lightness by kind)."""
    hue = (mb * 0.618033988749895) % 1.0
    r, g, b = colorsys.hls_to_rgb(hue, _KIND_LIGHTNESS.get(kind, 0.5), 0.65)
    return "#%02x%02x%02x" % (round(r * 255), round(g * 255), round(b * 255))


def _label(action) -> str:
    c = f".{action.chunk}" if action.chunk else ""
    return f"{_SHORT.get(action.kind, '')}{action.microbatch}{c}"


def _halves(tl, s: int) -> dict:
    """Device s's overlapped actions -> 0 (the forward: upper half) or 1 (the backward: lower half)."""
    if not tl.schedule.overlapped:
        return {}
    acts = tl.schedule.actions[s]
    return {acts[k]: h for pair in tl.schedule.overlapped[s] for h, k in enumerate(pair)}


def _text_colour(action) -> str:
    """Black or white, whichever reads better on the block's colour (WCAG contrast >= 4.5)."""
    return text_color(microbatch_colour(action.microbatch, action.kind))


def to_svg(tl, *, width: int = 1100, lane: int = 26, send_lane: int = 7, title: str | None = None) -> str:
    """Inline SVG of the timeline ``tl`` (a :class:`~shardlab.train.pipeline.clock.Timeline`).

    Args:
        width: pixels of the drawing area; lane / send_lane: heights of a device's lanes.
        title: a heading (default: the schedule's summary).
    """
    p, step = tl.p, tl.step_time or 1.0
    left, top, gap = 70, 34, 8
    scale = width / step
    row = lane + send_lane + gap
    height = top + p * row + 46
    total_w = left + width + 20
    title = tl.summary() if title is None else title
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{height}" style="background:#fff" '
           f'font-family="sans-serif" font-size="11">',
           '<defs><pattern id="bubble" patternUnits="userSpaceOnUse" width="6" height="6" '
           'patternTransform="rotate(45)"><rect width="6" height="6" fill="#eeeeee"/>'
           '<line x1="0" y1="0" x2="0" y2="6" stroke="#bdbdbd" stroke-width="2"/></pattern></defs>',
           f'<text x="{left}" y="16" font-size="13" font-weight="bold">{html.escape(title)}</text>']
    for s in range(p):
        y = top + s * row
        out.append(f'<text x="{left - 8}" y="{y + lane / 2 + 4}" text-anchor="end">stage {s}</text>')
        for a, b in tl.idle_intervals(s):
            out.append(f'<rect x="{left + a * scale:.2f}" y="{y}" width="{(b - a) * scale:.2f}" height="{lane}" '
                       f'fill="url(#bubble)"><title>bubble {a:.4g}-{b:.4g}</title></rect>')
        halves = _halves(tl, s)
        for e in tl.compute_events(s):
            a = e.action
            x, w = left + e.start * scale, (e.end - e.start) * scale
            half = halves.get(a)
            yy, hh = (y, lane) if half is None else (y + half * lane / 2, lane / 2)
            pair = "" if half is None else " (overlapped F&amp;B pair)"
            out.append(f'<rect x="{x:.2f}" y="{yy}" width="{max(w, 0.5):.2f}" height="{hh}" '
                       f'fill="{microbatch_colour(a.microbatch, a.kind)}" stroke="#fff" stroke-width="0.6">'
                       f'<title>{html.escape(str(a))}{pair}: {e.start:.4g}-{e.end:.4g}</title></rect>')
            label = _label(a)
            size = 11 if w >= 6.5 * len(label) + 2 else 8 if w >= 4.4 * len(label) + 1 else 0
            if half is not None:
                size = min(size, 8)
            if size:
                out.append(f'<text x="{x + w / 2:.2f}" y="{yy + hh / 2 + size / 3:.1f}" text-anchor="middle" '
                           f'font-size="{size}" fill="{_text_colour(a)}">{label}</text>')
        for e in tl.send_events(s):
            if e.end <= e.start:
                continue
            a = e.action
            out.append(f'<rect x="{left + e.start * scale:.2f}" y="{y + lane + 1}" '
                       f'width="{(e.end - e.start) * scale:.2f}" height="{send_lane - 1}" '
                       f'fill="{microbatch_colour(a.microbatch, "send")}" opacity="0.85">'
                       f'<title>{html.escape(str(a))}: {e.start:.4g}-{e.end:.4g}</title></rect>')
    # time axis
    ya = top + p * row
    out.append(f'<line x1="{left}" y1="{ya}" x2="{left + width}" y2="{ya}" stroke="#555"/>')
    for k in range(6):
        t = step * k / 5
        x = left + t * scale
        out.append(f'<line x1="{x:.2f}" y1="{ya}" x2="{x:.2f}" y2="{ya + 4}" stroke="#555"/>')
        out.append(f'<text x="{x:.2f}" y="{ya + 15}" text-anchor="middle">{t:.4g}</text>')
    # legend
    ly = ya + 32
    items = [("forward", "F forward"), ("backward", "B backward / I input grad"), ("backward_weight", "W weight grad")]
    x = left
    for kind, text in items:
        out.append(f'<rect x="{x}" y="{ly - 10}" width="14" height="12" fill="{microbatch_colour(0, kind)}"/>')
        out.append(f'<text x="{x + 18}" y="{ly}">{text}</text>')
        x += 30 + 7 * len(text)
    out.append(f'<rect x="{x}" y="{ly - 10}" width="14" height="12" fill="url(#bubble)" stroke="#bbb"/>')
    out.append(f'<text x="{x + 18}" y="{ly}">bubble (idle)</text>')
    x += 120
    if tl.schedule.overlapped:
        out.append(f'<text x="{x}" y="{ly}">half-height: an overlapped F&amp;B pair</text>')
        x += 235
    out.append(f'<text x="{x}" y="{ly}">thin bars: sends; colour = microbatch (times: {html.escape(tl.source)})</text>')
    out.append("</svg>")
    return "\n".join(out)


def to_html(tl) -> str:
    """The SVG plus a small table of the measured figures, for Jupyter."""
    td = "style='padding:1px 10px;text-align:right;border-bottom:1px solid #ddd'"
    rows = "".join(f"<tr><td {td}>stage {s}</td><td {td}>{tl.busy[s]:.6g}</td><td {td}>{tl.step_time - tl.busy[s]:.6g}"
                   f"</td><td {td}>{tl.peak_activations[s]}</td></tr>" for s in range(tl.p))
    head = "".join(f"<th {td}>{h}</th>" for h in ("device", "busy", "idle", "peak activations"))
    table = (f"<table style='font-family:sans-serif;font-size:11px;border-collapse:collapse'><tr>{head}</tr>"
             f"{rows}</table>")
    return (f"<div><div style='overflow-x:auto;max-width:100%'>{to_svg(tl)}</div>"
            f"<div style='margin-left:70px;overflow-x:auto'>{table}</div></div>")


def to_chrome_trace(tl, path: str | None = None, *, time_unit: float | None = None) -> dict:
    """The timeline in the Chrome trace event format (ui.perfetto.dev, chrome://tracing).

    Args:
        tl: a :class:`~shardlab.train.pipeline.clock.Timeline`.
        path: when given, the JSON is also written there.
        time_unit: seconds per unit of the timeline's times (default: 1e-6 for durations given
            by hand, which have no unit, so one unit shows as 1 µs; 1 for those of the cost model
            or an executed ledger, which are seconds); the trace is in microseconds.

    Returns:
        ``{"traceEvents": [...]}``: per stage a compute track (F/B/I/W blocks named like the
        picture's labels, microbatch and chunk in ``args``) and a send track.

    Examples:
        >>> from shardlab.train import pipeline as pp
        >>> t = to_chrome_trace(pp.clock(pp.gpipe(2, 2)))
        >>> [e["name"] for e in t["traceEvents"] if e["ph"] == "X" and e["tid"] == 0][:2]
        ['F0', 'F1']
    """
    if time_unit is None:
        time_unit = 1e-6 if str(tl.source) == "given" else 1.0
    us = time_unit * 1e6
    ev = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": tl.schedule.name}}]
    for s in range(tl.p):
        ev.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": 2 * s, "args": {"name": f"stage {s}"}})
        ev.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": 2 * s + 1, "args": {"name": f"stage {s} sends"}})
        for e in tl.compute_events(s):
            a = e.action
            ev.append({"name": _label(a), "cat": a.kind, "ph": "X", "pid": 0, "tid": 2 * s, "ts": e.start * us,
                       "dur": (e.end - e.start) * us, "args": {"microbatch": a.microbatch, "chunk": a.chunk}})
        for e in tl.send_events(s):
            if e.end > e.start:
                ev.append({"name": f"send {e.action.microbatch}", "cat": "send", "ph": "X", "pid": 0,
                           "tid": 2 * s + 1, "ts": e.start * us, "dur": (e.end - e.start) * us,
                           "args": {"action": str(e.action)}})
    trace = {"traceEvents": ev, "displayTimeUnit": "ns"}
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(trace, f)
    return trace


def plot(tl, ax=None, *, title: str | None = None, labels: bool = True):
    """A matplotlib figure of the timeline; draws into ``ax`` when given. Returns the figure."""
    import matplotlib.pyplot as plt  # optional dependency
    from matplotlib.patches import Patch

    p = tl.p
    if ax is None:
        fig, ax = plt.subplots(figsize=(12, 0.55 * p + 1.2))
    else:
        fig = ax.figure
    lane, send_lane = 0.7, 0.18
    for s in range(p):
        y = p - 1 - s
        for a, b in tl.idle_intervals(s):
            ax.broken_barh([(a, b - a)], (y, lane), facecolors=_BUBBLE, hatch="//", edgecolor="#aaaaaa", lw=0)
        halves = _halves(tl, s)
        for e in tl.compute_events(s):
            a = e.action
            half = halves.get(a)
            yy, hh = (y, lane) if half is None else (y + (1 - half) * lane / 2, lane / 2)
            ax.broken_barh([(e.start, e.end - e.start)], (yy, hh), facecolors=microbatch_colour(a.microbatch, a.kind),
                           edgecolor="white", lw=0.5)
            span = (e.end - e.start) / (tl.step_time or 1)
            if labels and span > 0.012 * len(_label(a)):
                ax.text((e.start + e.end) / 2, yy + hh / 2, _label(a), ha="center", va="center",
                        fontsize=7 if half is None else 5, color=_text_colour(a))
        for e in tl.send_events(s):
            if e.end > e.start:
                ax.broken_barh([(e.start, e.end - e.start)], (y - send_lane - 0.02, send_lane),
                               facecolors=microbatch_colour(e.action.microbatch, "send"))
    ax.set_yticks([p - 1 - s + lane / 2 for s in range(p)], [f"stage {s}" for s in range(p)])
    ax.set_xlim(0, tl.step_time or 1)
    ax.set_ylim(-0.3, p)
    ax.set_xlabel("time")
    ax.set_title(tl.summary() if title is None else title, fontsize=10)
    ax.legend(handles=[Patch(color=microbatch_colour(0, "forward"), label="F"),
                       Patch(color=microbatch_colour(0, "backward"), label="B / I"),
                       Patch(color=microbatch_colour(0, "backward_weight"), label="W"),
                       Patch(facecolor=_BUBBLE, hatch="//", edgecolor="#aaaaaa", label="bubble")],
              loc="upper left", bbox_to_anchor=(0, -0.12 - 0.5 / p), fontsize=7, ncol=4, frameon=False)
    fig.tight_layout()
    return fig
