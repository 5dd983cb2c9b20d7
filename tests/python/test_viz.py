"""shardlab.viz and shardlab.units: every view renders, colours are distinct per block, text
contrast >= 4.5, no "0.00" times, one set of units, 3-D arrays draw something."""

import re

import numpy as np
import pytest

import shardlab as sl
from shardlab import P, cost, units, viz
from shardlab.viz import colors

_TIME = re.compile(r"\b\d+(?:\.\d+)?\s?(?:ps|ns|µs|ms|s|min|h)\b")
_BYTES = re.compile(r"\b\d+(?:\.\d+)?\s?(?:B|KiB|MiB|GiB|TiB)\b")


def _cells(html):
    return re.findall(r'class="sl-cell" data-block="(\d+)"[^>]*background:(#[0-9a-f]{6});color:(#[0-9a-f]{6})', html)


def _no_bad_numbers(text):
    assert "0.00" not in re.sub(r"\d0\.00|0\.00\d", "", text), text  # no "0.00 us"-style zeros
    assert " us" not in text and "e-0" not in text, text  # old units / raw exponents gone


@pytest.fixture
def ledger64():
    mesh = sl.make_mesh((8, 8), ("x", "y"), hardware="tpu-v5p")
    f = sl.shard_map(lambda a, b: sl.lax.psum(a @ b, "y"), mesh=mesh, in_specs=(P(None, "y"), P("y")), out_specs=P())
    with sl.Ledger() as ledger:
        f(np.ones((64, 128), np.float32), np.ones((128, 64), np.float32))
    return ledger


# -- units -----------------------------------------------------------------------------------
@pytest.mark.parametrize("s", [1e-19, 1e-15, 3e-13, 4.9e-9, 1e-9, 6.497e-07, 0.0009999, 1.0, 59.9, 5400.0])
def test_times_have_three_digits_and_never_zero(s):
    text = units.fmt_seconds(s)
    if s < 1e-15:  # below the smallest unit: a bound, never an exponent
        assert text == "< 1 fs"
        return
    mantissa = float(text.split()[0])
    assert mantissa > 0 and not text.startswith("0."), text
    assert 1 <= mantissa < 1000 or "e-" in text, text


def test_units_round_trip_within_three_digits():
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    for n in [1, 1000, 1023.7, 1536, 100663296, 3.3e9]:
        v, u = units.fmt_bytes(n).split()
        assert abs(float(v) * scale[u] - n) / n < 5e-3, (n, v, u)
    assert units.fmt_bytes(100663296) == "96.0 MiB" and units.fmt_seconds(None) == "-"
    with pytest.raises(ValueError, match="fmt_quantity"):
        units.fmt_quantity(1, "furlongs")


# -- colours ---------------------------------------------------------------------------------
def test_palette_distinct_and_readable():
    p = colors.palette(128)
    assert len(set(p)) == 128
    assert min(colors.contrast(colors.text_color(c), c) for c in p) >= 4.5


# -- sharding --------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,axes,spec,hw,prefix", [
    ((4, 2), ("x", "y"), P("x", "y"), "tpu-v5e", "TPU"),
    ((8, 8), ("x", "y"), P("x", "y"), "h100", "GPU"),
    ((8,), ("x",), P("x"), None, "CPU"),
])
def test_sharding_blocks_distinct_colours_and_contrast(shape, axes, spec, hw, prefix):
    mesh = sl.make_mesh(shape, axes, hardware=hw)
    v = viz.sharding((64, 64), sl.NamedSharding(mesh, spec))
    cells = _cells(v.html)
    assert len(cells) == mesh.size
    by_block = {b: bg for b, bg, _ in cells}
    assert len(set(by_block.values())) == len(by_block) == mesh.size
    assert all(colors.contrast(fg, bg) >= 4.5 for _, bg, fg in cells)
    assert v.data["prefix"] == prefix and f"{prefix} 0" in v.html
    assert v.data["height"] <= 780 and v.data["width"] <= 960
    assert v.data["notation"] in v.text


def test_replicated_blocks_share_one_colour_and_label_all_owners():
    mesh = sl.make_mesh((4, 2), ("x", "y"))
    v = viz.sharding((8, 8), sl.NamedSharding(mesh, P("x")))
    assert [b["owners"] for b in v.data["blocks"]] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert len(_cells(v.html)) == 4 and "CPU 0-1" in v.html


def test_sharding_3d_draws_a_row_of_slices_and_terminal_colour():
    mesh = sl.make_mesh((2, 2, 2), ("x", "y", "z"), hardware="tpu-v5p")
    a = sl.device_put(np.zeros((4, 4, 4), np.float32), sl.NamedSharding(mesh, P("x", "y", "z")))
    v = viz.sharding(a)
    assert v.data["panels"] == 2 and len(_cells(v.html)) == 8
    assert v.html.count('class="sl-panel"') == 2
    from rich.console import Console

    console = Console(record=True, width=120, color_system="truecolor", force_terminal=True)
    console.print(v)
    assert "\x1b[" in console.export_text(styles=True)


def test_sharding_bad_input_names_the_op():
    with pytest.raises(TypeError, match=r"\[viz.sharding\]"):
        viz.sharding((4, 4), P("x"))


# -- collective, link traffic ----------------------------------------------------------------
@pytest.mark.parametrize("op", ["all_gather", "psum", "psum_scatter", "all_to_all", "ppermute"])
def test_collective_runs_and_shows_movement(op):
    mesh = sl.make_mesh((8,), ("x",), hardware="tpu-v5e")
    v = viz.collective(op, mesh, "x")
    n = 8
    if op == "all_gather":
        assert v.data["after"] == [list(range(n))] * n
    if op == "all_to_all":
        assert v.data["before"][3] == [3] * n  # chunks coloured by the device they came from
        assert v.data["after"] == [list(range(n))] * n
    if op == "ppermute":
        assert v.data["after"] == [[(d - 1) % n] for d in range(n)]
    if op in ("psum", "psum_scatter"):
        assert all(o == -1 for row in v.data["after"] for o in row)
    sched = cost.schedule(op, n, v.data["topology"], v.data["nbytes"])
    assert max(v.data["link_bytes"].values()) == sched.max_link_bytes
    assert "<svg" in v.html and "<line" in v.html
    _no_bad_numbers(v.text)


def test_collective_from_a_ledger_event_at_64_devices(ledger64):
    e = [e for e in ledger64.events if e["op"] == "psum"][0]
    v = viz.collective(e, ledger64.mesh)
    assert len(v.data["group"]) == 8 and v.data["width"] <= 960
    assert v.data["nbytes"] == e["bytes_in"]


@pytest.mark.parametrize("axes,shape", [(("X",), {"X": 8}), (("X", "Y"), {"X": 8, "Y": 8}),
                                        (("X", "Y", "Z"), {"X": 4, "Y": 4, "Z": 4})])
def test_link_traffic_busiest_matches_cost_model(axes, shape):
    c = cost.all_reduce_time((1024, 1024), "bfloat16", axes=axes, mesh_shape=shape, hardware="tpu-v5p")
    v = viz.link_traffic(c)
    assert v.data["busiest"]["bytes"] == pytest.approx(max(c.axis_link_bytes))
    assert len(v.data["dims"]) == len(axes)
    assert v.html.count('class="sl-link"') >= len(v.data["links"])
    assert units.fmt_bytes(v.data["busiest"]["bytes"]) in v.text


def test_link_traffic_switch_and_bad_input():
    v = viz.link_traffic(cost.schedule("all_gather", 8, "switch", 1024))
    assert v.data["busiest"]["dst"] is None and "switch" in v.html
    with pytest.raises(TypeError, match=r"\[viz.link_traffic\]"):
        viz.link_traffic(42)


# -- ledger, timeline ------------------------------------------------------------------------
def test_ledger_view_totals_sections_units(ledger64):
    events = ledger64.events
    v = viz.ledger_view(ledger64)
    assert v.data["total"]["bytes_sent"] == ledger64.total_bytes_sent
    assert "sl-total" in v.html and "sl-section" not in v.html
    for e in events:
        e["phase"], e["label"] = "forward", ("mlp" if e["op"] == "matmul" else "reduce")
    v2 = viz.ledger_view(events)
    assert v2.data["sections"] == ["forward / mlp", "forward / reduce"] and v2.html.count("sl-subtotal") == 2
    _no_bad_numbers(v2.text)
    assert re.search(r'<td class="num">' + re.escape(units.fmt_bytes(events[1]["bytes_sent"])), v2.html)
    assert "text-align:left" in viz.ledger_html(ledger64)


def test_timeline_overlap(ledger64):
    t_max, t_sum = viz.timeline(ledger64, overlap="max"), viz.timeline(ledger64, overlap="sum")
    secs = [e["seconds"] for e in ledger64.events]
    assert t_sum.data["total"] == pytest.approx(sum(secs))
    assert t_max.data["total"] == pytest.approx(max(t_max.data["compute"], t_max.data["comm"]))
    assert "all 64 alike" in t_max.html
    with pytest.raises(ValueError, match="no time estimate"):
        viz.timeline([{"op": "psum", "seconds": None}])


# -- object views, registry, plots -----------------------------------------------------------
def test_registry_renders_every_class(ledger64):
    mesh = ledger64.mesh
    objs = [mesh, mesh.hardware, cost.collective_time("psum", 2**20, axes="x", mesh=mesh),
            cost.schedule("all_gather", 8, "ring", 2**20),
            sl.plan_einsum("ij,jk->ik", ((64, 64), P("x")), ((64, 64), P(None, "y")), mesh=mesh),
            ledger64.roofline(), ledger64]
    for o in objs:
        view = sl.views.view_of(o)  # registered beside the view's definition in shardlab.viz
        html, text = view._repr_html_(), view.text
        assert o._repr_html_() == html
        assert html.startswith("<style>") and 'class="sl-view' in html
        assert text and "object at 0x" not in text
        _no_bad_numbers(text)
        times = _TIME.findall(text)
        assert all(float(t.split()[0]) > 0 for t in times if not t.startswith("0 "))
    assert "TPU 63" in viz.mesh_html(mesh)


def test_plots():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    mesh = sl.make_mesh((4, 2), ("X", "Y"), hardware="tpu-v5e")
    f = sl.shard_map(lambda a, b: sl.lax.psum(a @ b, "Y"), mesh=mesh, in_specs=(P(None, "Y"), P("Y")), out_specs=P())
    with sl.Ledger() as led:
        f(np.ones((64, 128), np.float32), np.ones((128, 64), np.float32))
    r = led.roofline()
    fig = viz.roofline_plot(r)
    labels = [ln.get_label() for ln in fig.axes[0].lines]
    assert any(lb.startswith("communication roof") for lb in labels)  # the psum's roof beside HBM's
    comm = next(ln for ln in fig.axes[0].lines if ln.get_label().startswith("communication roof"))
    x, y = comm.get_data()
    np.testing.assert_allclose(y[0], x[0] * r.comm_bytes / r.t_comms, rtol=1e-9)  # the priced rate
    assert len(labels) >= 4
    fig = viz.strategy_sweep([8, 512], mesh=mesh)
    assert 2 <= len(fig.axes[0].lines) <= 6
