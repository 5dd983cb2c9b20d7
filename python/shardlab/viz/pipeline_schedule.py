"""The picture of a pipeline Schedule: every device's compute actions in the order it runs them.

One row per device (pipeline stage), one block per compute action, coloured by kind (forward,
backward, its input part, its weight part) and labelled with the microbatch (``F3``; ``F3.1`` for
model chunk 1). It shows the *order*; when each block runs (and where the bubbles are) is the
timeline of ``pipeline.clock(schedule, durations)``. It backs ``Schedule``'s display.

Example:
    >>> from shardlab.train import pipeline as pp
    >>> v = pipeline_schedule(pp.one_f_one_b(4, 8))
    >>> v.data["rows"][3][:4], v.text.splitlines()[0]
    (['F0', 'B0', 'F1', 'B1'], 'Schedule 1f1b: 4 stages, 8 microbatches, 1 chunk per stage; 64 compute actions')
"""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from shardlab import units

from .colors import text_color
from .view import View, esc, figure_html

__all__ = ["pipeline_schedule", "KIND_COLORS"]

#: Colour of each compute kind (forward, backward, backward's input and weight parts).
KIND_COLORS = {"forward": "#4c78a8", "backward": "#d1495b", "backward_input": "#f28e2b",
               "backward_weight": "#59a14f"}
_NAMES = {"forward": "F forward", "backward": "B backward", "backward_input": "I input gradient",
          "backward_weight": "W weight gradient"}
_MAX_W = 900


def pipeline_schedule(schedule) -> View:
    """The order of every device's compute actions (a ``train.pipeline.Schedule``)."""
    s = schedule
    rows = [s.compute(k) for k in range(s.p)]
    n = sum(len(r) for r in rows)
    title = (f"Schedule {s.name}: {units.plural(s.p, 'stage')}, {units.plural(s.m, 'microbatch', 'microbatches')}, "
             f"{units.plural(s.v, 'chunk')} per stage; {n} compute actions")
    cols = max((len(r) for r in rows), default=0)
    cw = max(6.0, min(30.0, (_MAX_W - 70) / max(cols, 1)))
    label_fits = cw >= 20
    rh, left = 22, 64
    W, H = left + cols * cw + 8, 6 + s.p * (rh + 4) + 4
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W:.0f}" height="{H:.0f}" font-size="10" '
           f'font-family="ui-monospace,Menlo,monospace">']
    for k, acts in enumerate(rows):
        y = 6 + k * (rh + 4)
        svg.append(f'<text x="4" y="{y + rh / 2 + 4:.1f}" fill="#1b1b1b" font-family="system-ui,sans-serif" '
                   f'font-size="11">stage {k}</text>')
        for i, a in enumerate(acts):
            c = KIND_COLORS.get(a.kind, "#888888")
            x = left + i * cw
            svg.append(f'<rect x="{x:.1f}" y="{y}" width="{cw - 1:.1f}" height="{rh}" rx="2" fill="{c}">'
                       f"<title>{esc(str(a))}</title></rect>")
            if label_fits:
                svg.append(f'<text x="{x + (cw - 1) / 2:.1f}" y="{y + rh / 2 + 3.5:.1f}" text-anchor="middle" '
                           f'fill="{text_color(c)}">{esc(a.short)}</text>')
    svg.append("</svg>")
    kinds = [k for k in KIND_COLORS if any(a.kind == k for r in rows for a in r)]
    legend = "".join(f'<span style="display:inline-block;padding:1px 6px;margin-right:6px;border-radius:3px;'
                     f'background:{KIND_COLORS[k]};color:{text_color(KIND_COLORS[k])}">{esc(_NAMES[k])}</span>'
                     for k in kinds)
    sub = ("the order each stage runs its compute in (sends and receives left out); "
           "time it with pipeline.clock for the bubbles")
    html = figure_html("pipeline_schedule", esc(title), f'<div style="margin:4px 0">{legend}</div>' + "".join(svg),
                       esc(sub))
    text = title + "\n" + str(s)
    styled = []
    for k, acts in enumerate(rows):
        line = Text(f"stage {k}: ")
        for a in acts:
            c = KIND_COLORS.get(a.kind, "#888888")
            line.append(f" {a.short} ", style=f"{text_color(c)} on {c}")
        styled.append(line)
    return View(html, text, Group(Text(title, style="bold"), *styled),
                {"rows": [[a.short for a in r] for r in rows], "kinds": kinds})
