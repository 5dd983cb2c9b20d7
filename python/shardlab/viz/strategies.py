"""Strategies side by side: memory per device (by part, against the chip's HBM) and the bytes each
device sends per step (by mesh axis), one bar per strategy.

Each strategy is a ``train.Estimate`` (its ``memory``, its ledger, its chip's HBM) or a dict with
``memory`` ({part: bytes per device}) and either ``bytes`` ({axis: bytes sent per device}) or a
``ledger`` (whose collectives are summed by mesh axes).

Examples:
    >>> from shardlab import viz
    >>> v = viz.strategies({"dp": {"memory": {"params": 4e9, "optimizer": 12e9}, "bytes": {"data": 8e9}},
    ...                     "fsdp": {"memory": {"params": 5e8, "optimizer": 1.5e9}, "bytes": {"data": 12e9}}},
    ...                    hbm=16 * 2**30)
    >>> v.data["memory_total"]["dp"], v.data["bytes_total"]["fsdp"]
    (16000000000.0, 12000000000.0)
"""

from __future__ import annotations

from shardlab import units

from .colors import palette, text_color
from .view import View, esc

__all__ = ["strategies", "bytes_by_axes"]

_BAR_W = 300   # px of the longest bar in each panel


def bytes_by_axes(ledger) -> dict[str, float]:
    """Bytes each device sends, summed per mesh axes of the collectives ("data", "x+y", ...).

    Examples:
        >>> bytes_by_axes([{"axes": ("x",), "bytes_sent": 8.0}, {"axes": ("x", "y"), "bytes_sent": 2.0},
        ...                {"axes": (), "bytes_sent": 0, "flops": 1.0}])
        {'x': 8.0, 'x+y': 2.0}
    """
    events = ledger.events if hasattr(ledger, "events") else ledger
    out: dict[str, float] = {}
    for e in events:
        if e.get("axes") and e.get("bytes_sent"):
            key = "+".join(e["axes"])
            out[key] = out.get(key, 0.0) + float(e["bytes_sent"])
    return out


def _parts(name, s) -> tuple[dict, dict, float | None]:
    if isinstance(s, dict):
        if "memory" not in s:
            raise ValueError(f"[viz.strategies] {name!r}: give 'memory' ({{part: bytes per device}}) and "
                             f"'bytes' ({{axis: bytes sent}}) or 'ledger'")
        sent = s.get("bytes") if "bytes" in s else bytes_by_axes(s["ledger"]) if "ledger" in s else {}
        return dict(s["memory"]), dict(sent), s.get("hbm")
    if hasattr(s, "memory") and hasattr(s, "ledger"):
        return dict(s.memory), bytes_by_axes(s.ledger), getattr(s, "hbm_capacity", None)
    raise TypeError(f"[viz.strategies] {name!r}: expected a train.Estimate or a dict, got {type(s).__name__}")


def strategies(strategies: dict, *, hbm: float | None = None, title: str | None = None) -> View:
    """Draws each strategy's memory per device and bytes sent per device per step.

    Args:
        strategies: {name: train.Estimate or dict} (see the module docstring).
        hbm: the chip's memory, drawn as a line on the memory panel (default: the estimates').
        title: a heading.

    Returns:
        A View; ``data`` has ``memory`` and ``bytes`` ({name: {part or axis: bytes}}) and their
        totals ``memory_total`` / ``bytes_total``, and ``fits`` ({name: bool} when hbm is known).
    """
    if not strategies:
        raise ValueError("[viz.strategies] no strategies given")
    memory, sent = {}, {}
    for name, s in strategies.items():
        m, b, h = _parts(name, s)
        memory[name] = {k: float(v) for k, v in m.items() if v}
        sent[name] = {k: float(v) for k, v in b.items() if v}
        hbm = hbm if hbm is not None else h
    mem_total = {n: sum(v.values()) for n, v in memory.items()}
    byte_total = {n: sum(v.values()) for n, v in sent.items()}
    parts = list(dict.fromkeys(k for v in memory.values() for k in v))
    axes = list(dict.fromkeys(k for v in sent.values() for k in v))
    colors = dict(zip(parts + axes, palette(len(parts) + len(axes))))
    fits = {n: t <= hbm for n, t in mem_total.items()} if hbm else None
    mem_svg = _panel(memory, parts, colors, "memory per device", hbm, fits)
    byte_svg = _panel(sent, axes, colors, "bytes sent per device per step, by mesh axis", None, None)
    head = title or f"{len(strategies)} strategies: memory per device and bytes sent per step"
    legend = "".join(f'<span style="display:inline-block;padding:1px 6px;margin:0 4px 2px 0;background:{c};'
                     f'color:{text_color(c)};border-radius:3px">{esc(k)}</span>' for k, c in colors.items())
    html = (f'<div class="sl-view sl-strategies" data-view="strategies"><div class="sl-title">{esc(head)}</div>'
            f'<div class="sl-sub">{legend}</div><div style="display:flex;flex-wrap:wrap;gap:18px;overflow-x:auto">'
            f"{mem_svg}{byte_svg}</div></div>")
    lines = [head]
    for n in strategies:
        lines.append(f"  {n}: memory {units.fmt_bytes(mem_total[n])} ("
                     + ", ".join(f"{k} {units.fmt_bytes(v)}" for k, v in memory[n].items()) + ")"
                     + ("" if fits is None else (" fits" if fits[n] else f" > HBM {units.fmt_bytes(hbm)}"))
                     + f"; sends {units.fmt_bytes(byte_total[n])}"
                     + (" (" + ", ".join(f"{k} {units.fmt_bytes(v)}" for k, v in sent[n].items()) + ")" if sent[n] else ""))
    return View(html, "\n".join(lines) + "\n", None,
                {"memory": memory, "bytes": sent, "memory_total": mem_total, "bytes_total": byte_total,
                 "fits": fits, "hbm": hbm, "colors": colors})


def _panel(values: dict, keys: list, colors: dict, title: str, line: float | None, fits) -> str:
    names = list(values)
    longest = max((len(str(n)) for n in names), default=4)
    label_w, bar_h, gap, top = min(280, 14 + 6.6 * longest), 22, 8, 26
    totals = {n: sum(v.values()) for n, v in values.items()}
    scale_max = max([*totals.values(), line or 0.0, 1e-300])
    k = _BAR_W / scale_max
    W = int(label_w + _BAR_W + 90)
    H = top + len(names) * (bar_h + gap) + 22
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="system-ui,sans-serif" '
           f'font-size="11"><text x="0" y="14" font-weight="600" fill="#1b1b1b">{esc(title)}</text>']
    for i, n in enumerate(names):
        y = top + i * (bar_h + gap)
        out.append(f'<text x="{label_w - 6}" y="{y + bar_h / 2 + 4}" text-anchor="end" fill="#1b1b1b">{esc(n)}</text>')
        verdict = "" if fits is None else ("" if fits[n] else " ✗")
        end = label_w + sum(max(v * k, 0.5) for v in values[n].values() if v)   # on white, after the bar
        out.append(f'<text x="{end + 4:.1f}" y="{y + bar_h / 2 + 4}" fill="#1b1b1b">'
                   f'{esc(units.fmt_bytes(totals[n]))}{verdict}</text>')
        x = float(label_w)
        for key in keys:
            v = values[n].get(key, 0.0)
            if not v:
                continue
            w = v * k
            c = colors[key]
            out.append(f'<rect class="sl-stack" x="{x:.1f}" y="{y}" width="{max(w, 0.5):.1f}" height="{bar_h}" fill="{c}" '
                       f'stroke="#fff" stroke-width="0.5"><title>{esc(n)}: {esc(key)} {esc(units.fmt_bytes(v))}</title></rect>')
            lab = units.fmt_bytes(v)
            if w > 6.2 * len(lab) + 6:
                out.append(f'<text x="{x + w / 2:.1f}" y="{y + bar_h / 2 + 4}" text-anchor="middle" font-size="10" '
                           f'fill="{text_color(c)}">{esc(lab)}</text>')
            x += max(w, 0.5)
    if line:
        x = label_w + line * k
        out.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{H - 18}" stroke="#c0392b" stroke-width="1.5" '
                   f'stroke-dasharray="4,3"/><text x="{x:.1f}" y="{H - 5}" text-anchor="middle" fill="#c0392b">'
                   f'HBM {esc(units.fmt_bytes(line))}</text>')
    out.append("</svg>")
    return "".join(out)
