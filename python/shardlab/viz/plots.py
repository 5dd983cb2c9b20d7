"""Matplotlib plots: the roofline, collective time vs bytes per preset, planner strategies vs
batch size. matplotlib is optional (the [notebooks] and [test] extras install it).

Example:
    >>> from shardlab import viz
    >>> fig = viz.collective_sweep(["all_gather", "psum"], ["tpu-v5e", "h100"], sizes=[2**10, 2**20])
    >>> len(fig.axes), len(fig.axes[0].lines)
    (2, 2)
"""

from __future__ import annotations

import math

import numpy as np

import shardlab as sl
from shardlab import cost, units
from shardlab import hardware as _hardware

from .colors import palette

__all__ = ["roofline_plot", "collective_sweep", "strategy_sweep", "throughput_latency_plot"]


def _plt():
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("[viz] plots need matplotlib: pip install matplotlib (or shardlab[notebooks])") from None
    return plt


def _fmt_axis(ax, which: str, kind: str) -> None:
    from matplotlib.ticker import FuncFormatter

    f = FuncFormatter(lambda v, _: units.fmt_quantity(v, kind) if v > 0 else "0")
    (ax.xaxis if which == "x" else ax.yaxis).set_major_formatter(f)


def roofline_plot(roofline, *, ax=None):
    """The roofline of the hardware with the program's point on it, and, when the program
    communicates, its communication roof: FLOP/s against FLOPs per byte sent over the links, at
    the rate the cost model charged its collectives (comm bytes / T_comms), with the program's
    point on that roof too (the book's ICI roofline beside the HBM one).

    Args:
        roofline: a ``shardlab.cost.Roofline`` (``ledger.roofline()``).
        ax: a matplotlib Axes to draw on (a new figure by default).

    Returns:
        The matplotlib Figure.
    """
    plt = _plt()
    hw = _hardware.get(roofline.hardware)
    peak, bw = hw.peak("bfloat16"), hw.hbm_bandwidth
    fig = ax.figure if ax is not None else plt.figure(figsize=(6.4, 4.2), layout="constrained")
    ax = ax if ax is not None else fig.add_subplot()
    crit = peak / bw
    ai = roofline.arithmetic_intensity
    lo = min(crit / 100, ai / 4 if math.isfinite(ai) and ai > 0 else crit / 100)
    hi = max(crit * 100, ai * 4 if math.isfinite(ai) else crit * 100)
    comm = roofline.comm_bytes > 0 and roofline.t_comms > 0 and roofline.flops > 0
    if comm:  # the communication roof, at the collectives' priced rate
        rate = roofline.comm_bytes / roofline.t_comms
        ci = roofline.flops / roofline.comm_bytes
        lo, hi = min(lo, ci / 4, peak / rate / 100), max(hi, ci * 4, peak / rate * 100)
    x = np.logspace(math.log10(lo), math.log10(hi), 200)
    ax.loglog(x, np.minimum(peak, x * bw), color="#2f5597", lw=2, label=f"{hw.name} HBM roof (bf16)")
    if comm:
        ax.loglog(x, np.minimum(peak, x * rate), color="#7f6000", lw=1.5, ls="--",
                  label=f"communication roof ({units.fmt_bandwidth(rate)} priced)")
    ax.axvline(crit, color="#999", ls="--", lw=1)
    ax.text(crit, peak * 1.15, f"critical {units.fmt_count(crit, 'FLOP/B')}", ha="center", fontsize=8)
    if math.isfinite(ai) and roofline.total_seconds > 0:
        achieved = roofline.flops / roofline.total_seconds
        ax.plot([ai], [achieved], "o", color="#c0392b", ms=8,
                label=f"program: {units.fmt_flop_rate(achieved)}, {roofline.bound}-bound")
        if comm:
            ax.plot([ci], [achieved], "s", color="#7f6000", ms=7,
                    label=f"program per byte sent: {units.fmt_count(ci, 'FLOP/B')}")
    ax.set_xlabel("FLOP per byte (HBM bytes; dashed roof: bytes sent)")
    ax.set_ylabel("FLOP/s per device")
    _fmt_axis(ax, "y", "flop_rate")
    ax.set_ylim(top=peak * 2)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"Roofline on {hw.description}", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    return fig


def collective_sweep(ops, presets, *, sizes=None, group: int = 8, axes_shape=None):
    """Time of each collective vs V (bytes) on each preset, one panel per op.

    Args:
        ops: collective names (all_gather, psum, psum_scatter, all_to_all, ...).
        presets: hardware preset names.
        sizes: V values in bytes (default 1 KiB .. 1 GiB).
        group: devices on the axis.

    Returns:
        The matplotlib Figure; each line's data are ``cost.collective_time`` results.
    """
    plt = _plt()
    sizes = list(sizes or [2.0 ** k for k in range(10, 31, 2)])
    fig, axs = plt.subplots(1, len(ops), figsize=(4.2 * len(ops), 3.6), squeeze=False, layout="constrained",
                            sharey=True)
    colors = palette(len(presets))
    for ax, op in zip(axs[0], ops):
        for c, preset in zip(colors, presets):
            t = [cost.collective_time(op, v, axes="x", mesh_shape={"x": group}, hardware=preset).seconds for v in sizes]
            ax.loglog(sizes, t, "o-", color=c, ms=3, label=preset)
        ax.set_title(f"{op}, {group} devices", fontsize=10)
        ax.set_xlabel("V (bytes)")
        _fmt_axis(ax, "x", "bytes")
        _fmt_axis(ax, "y", "seconds")
        ax.grid(True, alpha=0.3)
    axs[0][0].set_ylabel("time")
    axs[0][-1].legend(fontsize=8)
    return fig


def strategy_sweep(batches, *, d_model: int = 4096, d_ff: int = 16384, mesh=None, dtype="bfloat16"):
    """The planner's strategies for ``B·D x D·F`` vs batch size: estimated time of each.

    The input is sharded ``[B_X, D_Y]``, the weight ``[D_X, F_Y]``; for each batch size the
    planner's chosen plan and its alternatives are plotted by their collectives.

    Returns:
        The matplotlib Figure.
    """
    plt = _plt()
    mesh = mesh if mesh is not None else sl.make_mesh((4, 2), ("X", "Y"), hardware="tpu-v5e")
    P = sl.P
    series: dict[str, list] = {}
    chosen = []
    for b in batches:
        p = sl.plan_einsum("bd,df->bf", ((b, d_model), P("X", "Y"), dtype), ((d_model, d_ff), P("X", "Y"), dtype),
                           mesh=mesh)
        chosen.append(p.seconds)
        for q in [p] + p.alternatives:
            key = " + ".join(q.ops) or "local only"
            series.setdefault(key, [None] * len(batches))
        for q in [p] + p.alternatives:
            key = " + ".join(q.ops) or "local only"
            i = list(batches).index(b)
            if series[key][i] is None or q.seconds < series[key][i]:
                series[key][i] = q.seconds
    def score(ys):  # the strategies that come closest to the best at some batch size
        return min((y / best for y, best in zip(ys, chosen) if y is not None), default=math.inf)

    series = dict(sorted(series.items(), key=lambda kv: score(kv[1]))[:5])
    fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    for c, (k, ys) in zip(palette(len(series)), series.items()):
        xs = [b for b, y in zip(batches, ys) if y is not None]
        ax.loglog(xs, [y for y in ys if y is not None], "o-", color=c, ms=3, label=k)
    ax.loglog(batches, chosen, "k--", lw=1, label="planner's choice")
    ax.set_xlabel("batch size B")
    ax.set_ylabel("estimated time")
    _fmt_axis(ax, "y", "seconds")
    ax.set_title(f"B·D × D·F (D={d_model}, F={d_ff}) on {mesh.hardware.name}", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    return fig


def throughput_latency_plot(curves: dict, metric: str = "tpot", percentile: float = 50, ax=None):
    """Throughput (output tokens/s) against a latency percentile, one line per label: the
    serving trade-off of a rate sweep (``serve.sweep``).

    Args:
        curves: ``{label: [SimResult, ...]}`` (e.g. one sweep per layout).
        metric: "tpot", "ttft" or "e2e".
        percentile: which percentile of the metric (50: the median).
        ax: a matplotlib Axes to draw on (a new figure by default).

    Returns:
        The matplotlib Figure.
    """
    if metric not in ("tpot", "ttft", "e2e"):
        raise ValueError(f"[throughput_latency_plot] metric={metric!r}; use 'tpot', 'ttft' or 'e2e'")
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    for c, (label, results) in zip(palette(len(curves)), curves.items()):
        xs = [r.throughput for r in results]
        ys = [float(np.percentile(getattr(r, metric), percentile)) if len(getattr(r, metric)) else math.nan
              for r in results]
        ax.plot(xs, ys, "o-", color=c, ms=4, label=label)
    ax.set_xlabel("throughput (output tokens/s)")
    ax.set_ylabel(f"{metric.upper()} p{percentile:g}")
    ax.set_yscale("log")
    _fmt_axis(ax, "y", "seconds")
    _fmt_axis(ax, "x", "count")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return ax.figure
