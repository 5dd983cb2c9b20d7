"""Views of serving results: a simulation (``serve.SimResult``) and a step-time estimate
(``serve.Estimate``). They back those classes' ``_repr_html_``, ``__rich__`` and ``__str__``.

A SimResult shows a one-line summary, the latency percentiles (TTFT, TPOT, E2E), the system
figures, and a picture of the run: output tokens per second over time above each request's
latency at its arrival (a few hundred requests sampled when there are more), so a queue that
builds up is visible - never the raw arrays.

Example:
    >>> from shardlab.models import presets
    >>> from shardlab.serve import StepModel, estimate
    >>> from shardlab.serve.simulator import ServingConfig, simulate
    >>> from shardlab.serve.workload import poisson_requests
    >>> model = StepModel(presets.get("llama3-8b"), "tpu-v5e", {"x": 8})
    >>> reqs = poisson_requests(100, rate=20.0, prompt_len=("uniform", 200, 800), output_len=32, seed=0)
    >>> v = sim_result_view(simulate(reqs, model, ServingConfig(max_batch=32)))
    >>> v.text.splitlines()[0].startswith("interleaved: 100 requests done, 0 rejected")
    True
    >>> estimate_view(estimate(presets.get("llama3-8b"), "tpu-v5e", 8, 32, 4096)).data["fits"]
    True
"""

from __future__ import annotations

import math

import numpy as np
from rich.console import Group

from shardlab import units

from .colors import palette
from .view import View, bar_html, esc, figure_html, grid_view, kv_view, short_tick, stacked_bar_html

__all__ = ["sim_result_view", "sim_summary", "estimate_view", "nice_ticks", "throughput_latency"]

_PCTS = (50, 90, 99)
_MAX_DOTS = 400
_TTFT, _E2E, _TPUT = "#2f6bd0", "#d1495b", "#4c9a6a"


def _pct(a: np.ndarray, p: float) -> float:
    return float(np.percentile(a, p)) if len(a) else math.nan


def sim_summary(r) -> str:
    """One line: mode, requests done and rejected, throughput, median latencies."""
    return (f"{r.mode}: {units.plural(r.completed, 'request')} done, {len(r.rejected)} rejected, "
            f"{units.fmt_count(r.throughput, 'tokens/s')}; TTFT p50 {units.fmt_seconds(_pct(r.ttft, 50))}, "
            f"TPOT p50 {units.fmt_seconds(_pct(r.tpot, 50))}, E2E p50 {units.fmt_seconds(_pct(r.e2e, 50))}")


def nice_ticks(hi: float, n: int = 4) -> list[float]:
    """Round tick values from 0 to at least ``hi`` (1, 2 or 5 times a power of ten apart).

    Example:
        >>> nice_ticks(0.0437), nice_ticks(980.0)
        ([0.0, 0.02, 0.04, 0.06], [0.0, 500.0, 1000.0])
    """
    if not hi > 0 or not math.isfinite(hi):
        return [0.0, 1.0]
    raw = hi / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    k = math.ceil(hi / step - 1e-9)
    return [float(round(i * step, 12)) for i in range(k + 1)]


def _svg(r) -> str:
    """Tokens/s over the run (bars) above each request's TTFT and E2E at its arrival (dots)."""
    done = r.done
    if not done.any():
        return ""
    t0 = float(r.arrival.min())
    arr, fin = r.arrival[done] - t0, r.finish[done] - t0
    ttft, e2e, out = (r.first_token - r.arrival)[done], (r.finish - r.arrival)[done], r.output_len[done]
    span = float(max(fin.max(), arr.max(), 1e-12))
    W, left, right, top_h, bot_h, gap = 660, 64, 32, 90, 150, 34
    pw = W - left - right
    H = 22 + top_h + gap + bot_h + 34
    xt = nice_ticks(span, 5)
    sx = pw / xt[-1]
    bins = 30
    edges = np.linspace(0, xt[-1], bins + 1)
    tok = np.histogram(fin, bins=edges, weights=out.astype(float))[0] / (edges[1] - edges[0])
    yt_top = nice_ticks(float(tok.max()), 2)
    y0 = 22
    out_svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-size="11" '
               f'font-family="system-ui,sans-serif" fill="#1b1b1b">']
    out_svg.append(f'<text x="{left}" y="14" font-weight="600">output tokens/s over the run</text>')
    for v in yt_top:
        y = y0 + top_h - top_h * v / yt_top[-1]
        out_svg.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e3e3"/>'
                       f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{esc(short_tick(units.fmt_count(v)))}</text>')
    bw = pw / bins
    for i, v in enumerate(tok):
        h = top_h * v / yt_top[-1]
        out_svg.append(f'<rect x="{left + i * bw + 0.5:.1f}" y="{y0 + top_h - h:.1f}" width="{bw - 1:.1f}" '
                       f'height="{h:.1f}" fill="{_TPUT}"><title>{esc(units.fmt_count(v, "tokens/s"))}</title></rect>')
    yb = y0 + top_h + gap
    lat_hi = float(max(e2e.max(), ttft.max()))
    yt = nice_ticks(lat_hi, 4)
    out_svg.append(f'<text x="{left}" y="{yb - 8}" font-weight="600">latency of each request, at its arrival: '
                   f'<tspan fill="{_TTFT}">● TTFT</tspan>  <tspan fill="{_E2E}">● E2E</tspan></text>')
    for v in yt:
        y = yb + bot_h - bot_h * v / yt[-1]
        out_svg.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e3e3"/>'
                       f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{esc(short_tick(units.fmt_seconds(v)))}</text>')
    idx = np.arange(len(arr)) if len(arr) <= _MAX_DOTS else np.linspace(0, len(arr) - 1, _MAX_DOTS).astype(int)
    for series, color in ((e2e, _E2E), (ttft, _TTFT)):
        for i in idx:
            x, y = left + arr[i] * sx, yb + bot_h - bot_h * series[i] / yt[-1]
            out_svg.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2" fill="{color}" fill-opacity="0.75"/>')
    ya = yb + bot_h
    out_svg.append(f'<line x1="{left}" x2="{left + pw}" y1="{ya}" y2="{ya}" stroke="#555"/>')
    for v in xt:
        x = left + v * sx
        out_svg.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{ya}" y2="{ya + 4}" stroke="#555"/>'
                       f'<text x="{x:.1f}" y="{ya + 16}" text-anchor="middle">{esc(short_tick(units.fmt_seconds(v)))}</text>')
    out_svg.append(f'<text x="{left + pw / 2:.1f}" y="{ya + 30}" text-anchor="middle">time since the first arrival'
                   + (f" ({len(idx)} of {len(arr)} requests drawn)" if len(idx) < len(arr) else "") + "</text>")
    out_svg.append("</svg>")
    return "".join(out_svg)


def sim_result_view(r) -> View:
    """A SimResult: one-line summary, latency percentiles, system figures, the run's picture."""
    lat = {"TTFT": r.ttft, "TPOT": r.tpot, "E2E": r.e2e}
    head = ["latency"] + [f"p{p}" for p in _PCTS] + ["mean", "max"]
    rows = [[k] + [units.fmt_seconds(_pct(a, p)) for p in _PCTS]
            + [units.fmt_seconds(float(a.mean()) if len(a) else math.nan),
               units.fmt_seconds(float(a.max()) if len(a) else math.nan)] for k, a in lat.items()]
    figs = [("throughput", units.fmt_count(r.throughput, "tokens/s")), ("run", units.fmt_seconds(r.duration)),
            ("requests done / rejected", f"{r.completed} / {len(r.rejected)}"),
            ("KV cache used (time-average)", units.fmt_percent(r.kv_utilization)),
            ("prefix-cache hits", units.fmt_percent(r.prefix_hit_rate))]
    if r.mode == "disaggregated":
        figs.append(("KV transfer link busy", units.fmt_seconds(r.transfer_seconds)))
    summary = sim_summary(r)
    table = grid_view("sim_result", summary, head, rows, numeric=(1, 2, 3, 4, 5))
    facts = kv_view("sim_result", "", figs)
    svg = _svg(r)
    body = (table.html[table.html.index('<table'):table.html.rindex("</div>")]
            + facts.html[facts.html.index("<table"):facts.html.rindex("</div>")] + svg)
    html = figure_html("sim_result", esc(summary), body,
                       "TTFT: arrival to first token; TPOT: per output token after the first; E2E: arrival to "
                       "last token")
    text = table.text + "\n" + "\n".join(facts.text.splitlines()[1:])
    data = {"summary": r.summary(), "percentiles": {k: {p: _pct(a, p) for p in _PCTS} for k, a in lat.items()}}
    return View(html, text, Group(table.renderable, facts.renderable), data)


def estimate_view(e) -> View:
    """A serving Estimate: memory against HBM, the decode step's parts, the throughput."""
    d, p = e.decode, e.prefill
    free = e.hbm_bytes - e.memory_bytes
    mem = stacked_bar_html([("weights", e.param_bytes, "#2f6bd0", units.fmt_bytes(e.param_bytes)),
                            ("KV cache", e.kv_bytes, "#8a63d2", units.fmt_bytes(e.kv_bytes)),
                            ("free", free, "#b4bfcc", units.fmt_bytes(free)) if free >= 0 else
                            ("over HBM by", 0.0, "#d1495b", units.fmt_bytes(-free))], e.hbm_bytes)
    parts = [("KV reads", d.kv_seconds), ("weight reads", d.weight_seconds), ("compute", d.compute_seconds),
             ("collectives", d.comm_seconds)]
    longest = max(parts[1:], key=lambda kv: kv[1])[0]   # the step is KV + the longest of the other three
    step_top = max(v for _, v in parts) or 1.0
    step = "".join(bar_html(k, v, step_top, units.fmt_seconds(v), strong=k in ("KV reads", longest))
                   for k, v in parts)
    chips = "1 chip" if e.chips == 1 else f"the {e.chips} chips together"
    before = (f'<div class="sl-note">HBM of {chips}: '
              f"{units.fmt_bytes(e.memory_bytes)} needed of {units.fmt_bytes(e.hbm_bytes)}"
              + ("" if e.fits else " - does not fit") + f"</div>{mem}"
              f'<div class="sl-note">decode step {units.fmt_seconds(d.seconds)} = KV reads + the longest of weight '
              f"reads, compute and collectives (dark: the two that count)</div>{step}")
    rows = [("model", e.model), ("mesh", f"{e.mesh_shape} of {e.hardware} ({units.plural(e.chips, 'chip')})"),
            ("batch × context", f"{e.batch} × {e.context}"), ("weights", units.fmt_bytes(e.param_bytes)),
            ("KV cache", f"{units.fmt_bytes(e.kv_bytes)} ({units.fmt_bytes(e.kv_bytes_per_token)} per token)"),
            ("memory / HBM", f"{units.fmt_bytes(e.memory_bytes)} / {units.fmt_bytes(e.hbm_bytes)}"
             + ("" if e.fits else " (does not fit)")),
            ("largest batch that fits", str(e.max_batch)),
            ("prefill (TTFT)", f"{units.fmt_seconds(p.seconds)} ({p.bound}-bound)"),
            ("decode step", f"{units.fmt_seconds(d.seconds)} ({d.bound}-bound)"),
            ("  KV reads", units.fmt_seconds(d.kv_seconds)), ("  weight reads", units.fmt_seconds(d.weight_seconds)),
            ("  compute", units.fmt_seconds(d.compute_seconds)), ("  collectives", units.fmt_seconds(d.comm_seconds)),
            ("decode throughput", units.fmt_count(d.tokens_per_s, "tokens/s"))]
    title = (f"Serving {e.model} on {units.plural(e.chips, 'chip')} of {e.hardware}: batch {e.batch} at "
             f"context {e.context}, decode {units.fmt_seconds(d.seconds)}/step, "
             f"{units.fmt_count(d.tokens_per_s, 'tokens/s')}" + ("" if e.fits else " - does not fit"))
    return kv_view("serve_estimate", title, rows, before_html=before, data={"fits": e.fits})


def _log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks from the largest at or below ``lo`` to the smallest at or above ``hi``.

    Example:
        >>> [round(t, 4) for t in _log_ticks(0.00248, 0.00667)]
        [0.002, 0.005, 0.01]
    """
    seq = [m * 10.0 ** e for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 2)
           for m in (1, 2, 5)]
    first = max(i for i, v in enumerate(seq) if v <= lo * 1.0001)
    last = min(i for i, v in enumerate(seq) if v >= hi / 1.0001)
    return seq[first:last + 1] if last > first else [seq[first], seq[first + 1]]


def throughput_latency(curves, metric: str = "tpot", percentile: float = 50) -> View:
    """The serving trade-off of rate sweeps: throughput (tokens/s) against a latency percentile
    (log scale), one line per layout - an SVG view, no matplotlib needed.

    Args:
        curves: ``{label: [SimResult, ...]}`` (one ``serve.sweep`` per layout), or one list.
        metric: "tpot", "ttft" or "e2e".
        percentile: which percentile (50: the median).

    Example:
        >>> from shardlab.models import presets
        >>> from shardlab.serve import StepModel, sweep
        >>> from shardlab.serve.workload import poisson_requests
        >>> m = StepModel(presets.get("llama3-8b"), "tpu-v5e", {"x": 8})
        >>> runs = sweep(lambda r: poisson_requests(40, rate=r, prompt_len=200, output_len=16, seed=0), [5.0, 40.0], m)
        >>> v = throughput_latency({"interleaved": runs})
        >>> len(v.data["interleaved"]), v.text.splitlines()[0]
        (2, 'TPOT p50 against throughput')
    """
    if metric not in ("tpot", "ttft", "e2e"):
        raise ValueError(f"[throughput_latency] metric={metric!r}; use 'tpot', 'ttft' or 'e2e'")
    if not isinstance(curves, dict):
        curves = {"": list(curves)}
    pts = {k: [(r.throughput, _pct(getattr(r, metric), percentile)) for r in rs] for k, rs in curves.items()}
    ys = [y for p in pts.values() for _, y in p if y > 0 and math.isfinite(y)]
    xs = [x for p in pts.values() for x, _ in p]
    if not ys:
        raise ValueError(f"[throughput_latency] no run has a {metric.upper()} to draw (no request finished)")
    name = f"{metric.upper()} p{percentile:g}"
    W, H, left, right, top, bottom = 620, 320, 70, 140, 16, 44
    pw, ph = W - left - right, H - top - bottom
    xt = nice_ticks(max(xs), 5)
    yt = _log_ticks(min(ys), max(ys))
    lo, hi = math.log10(yt[0]), math.log10(yt[-1])
    X = lambda x: left + pw * x / xt[-1]  # noqa: E731
    Y = lambda y: top + ph - ph * (math.log10(y) - lo) / (hi - lo)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-size="11" '
           f'font-family="system-ui,sans-serif" fill="#1b1b1b">']
    for v in yt:
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" stroke="#e3e3e3"/>'
                   f'<text x="{left - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{esc(short_tick(units.fmt_seconds(v)))}</text>')
    for v in xt:
        out.append(f'<line x1="{X(v):.1f}" x2="{X(v):.1f}" y1="{top + ph}" y2="{top + ph + 4}" stroke="#555"/>'
                   f'<text x="{X(v):.1f}" y="{top + ph + 16}" text-anchor="middle">{esc(short_tick(units.fmt_count(v)))}</text>')
    out.append(f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" stroke="#555"/>'
               f'<text x="{left + pw / 2:.1f}" y="{H - 8}" text-anchor="middle">throughput (output tokens/s)</text>'
               f'<text transform="translate(14,{top + ph / 2:.1f}) rotate(-90)" text-anchor="middle">{esc(name)} '
               f"(log scale)</text>")
    for i, ((label, p), c) in enumerate(zip(pts.items(), palette(len(pts)))):
        good = [(x, y) for x, y in p if y > 0 and math.isfinite(y)]
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="'
                   + " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in good) + '"/>')
        out += [f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="3.5" fill="{c}"><title>{esc(label)}: '
                f'{esc(units.fmt_count(x, "tokens/s"))}, {esc(name)} {esc(units.fmt_seconds(y))}</title></circle>'
                for x, y in good]
        if label:
            out.append(f'<rect x="{left + pw + 14}" y="{top + 8 + 18 * i}" width="12" height="12" fill="{c}"/>'
                       f'<text x="{left + pw + 32}" y="{top + 18 + 18 * i}">{esc(label)}</text>')
    out.append("</svg>")
    rows = [[label or "-", units.fmt_count(x, "tokens/s"), units.fmt_seconds(y)] for label, p in pts.items() for x, y in p]
    table = grid_view("throughput_latency", f"{name} against throughput", ["layout", "throughput", name], rows,
                      numeric=(1, 2))
    html = figure_html("throughput_latency", esc(f"{name} against throughput"), "".join(out),
                       "each point one arrival rate; further right serves more, higher makes each user wait longer")
    return View(html, table.text, table.renderable, {k: p for k, p in pts.items()})
