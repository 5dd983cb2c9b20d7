"""The pictures say what the cost model says, and every kind renders readably: each picture kind
is rendered to HTML and checked for what can be checked without eyes (distinct colours per block,
text contrast, no overflow of a 1100 px viewport, units on the numbers)."""

import json
import re

import numpy as np
import pytest

import shardlab as sl
from shardlab import P, cost, units, viz
from shardlab.train import pipeline as pp
from shardlab.viz import colors

_VIEWPORT = 1100
_UNIT = re.compile(r"\d(?:\.\d+)? ?(?:B|KiB|MiB|GiB|TiB|ps|ns|µs|ms|s|GB/s|TB/s)\b")


def _svg_widths(html):
    return [float(w) for w in re.findall(r'<svg[^>]*\swidth="([\d.]+)"', html)]


def _text_on_fill(html):
    """(fill, text colour) of every label drawn on a coloured rectangle right before it."""
    return re.findall(r'<rect (?:class="sl-(?:chunk|span|stack)" )?[^>]*fill="(#[0-9a-f]{6})"[^>]*/?>'
                      r'(?:<title>[^<]*</title></rect>)?\s*<text[^>]*fill="(#[0-9a-f]{6})"', html)


# -- collectives: the stages are the cost model's --------------------------------------------------
def test_psum_stages_add_up_to_the_title_time():
    mesh = sl.make_mesh((8,), ("x",), hardware="tpu-v5e")
    v = viz.collective("psum", mesh, "x", nbytes=2**30)
    c = cost.collective_time("psum", 2**30, axes="x", mesh=mesh)
    st = v.data["stages"]
    assert [s["op"] for s in st] == ["reduce_scatter", "all_gather"]
    assert sum(s["busiest"] for s in st) == pytest.approx(c.axis_link_bytes[0])   # 1.75 GiB on a line
    assert sum(s["seconds"] for s in st) == pytest.approx(c.bandwidth_seconds)
    assert units.fmt_seconds(c.seconds) in v.html.split("</div>")[0]           # the title's time
    # what each link carries in all equals the link-level schedule of the whole all-reduce
    whole = cost.schedule("psum", 8, v.data["topology"], 2**30)
    assert v.data["link_bytes"] == pytest.approx({(lc.src, lc.dst): lc.bytes for lc in whole.links})
    # every stage's bytes are shown, and the per-step maximum
    for s in st:
        assert units.fmt_bytes(s["busiest"]) in v.html and f"{s['steps']} steps" in v.html


def test_reduction_values_are_sums_of_the_before_values():
    mesh = sl.make_mesh((4,), ("x",), hardware="tpu-v5e")
    v = viz.collective("psum", mesh, "x")
    before, after = np.array(v.data["values_before"]), np.array(v.data["values_after"])
    assert (after == before.sum(axis=0)).all()
    assert "1 + 2 + 3 + 4 = 10" in v.html and ">10<" in v.html
    rs = viz.collective("psum_scatter", mesh, "x")
    assert [r[0] for r in rs.data["values_after"]] == list(before.sum(axis=0))   # device i keeps chunk i


def test_64_devices_over_two_axes_has_colour_and_links():
    mesh = sl.make_mesh((8, 8), ("x", "y"), hardware="tpu-v5e")
    v = viz.collective("psum", mesh, ("x", "y"), nbytes=2**30)
    c = cost.collective_time("psum", 2**30, axes=("x", "y"), mesh=mesh)
    after_fills = re.findall(r'<rect class="sl-chunk"[^>]*fill="(#[0-9a-f]{6})"', v.html)[-64:]
    assert colors.PARTIAL not in after_fills and colors.NEUTRAL not in after_fills
    assert v.html.count('class="sl-link"') >= 2 * 7 * 2                    # both axes' bands drawn
    loads = {d: sum(s["busiest"] for s in v.data["stages"] if s["axis"] == d) for d in ("x", "y")}
    assert [loads["x"], loads["y"]] == pytest.approx(list(c.axis_link_bytes))
    assert v.data["width"] <= 960


def test_link_heat_uses_a_scale_with_legend_and_numbers():
    mesh = sl.make_mesh((4, 4), ("x", "y"), hardware="tpu-v5e")
    v = viz.link_traffic(cost.collective_time("all_gather", 2**30, axes=("x", "y"), mesh=mesh))
    strokes = set(re.findall(r'class="sl-link" data-bytes="[^"]+"[^>]*stroke="(#[0-9a-f]{6})"', v.html))
    assert len(strokes) >= 3                                                   # not one colour for all
    assert "bytes per link" in v.html and "linear-gradient" in v.html
    assert units.fmt_bytes(v.data["busiest"]["bytes"]) in re.sub(r"<title>.*?</title>", "", v.html)


def test_3d_torus_z_links_stay_inside_their_slice():
    mesh = sl.make_mesh((4, 4, 4), ("x", "y", "z"), hardware="tpu-v5p")
    v = viz.link_traffic(cost.collective_time("psum", 2**30, axes=("x", "y", "z"), mesh=mesh))
    slice_w = v.data["width"] / 4
    for x1, x2, title in re.findall(r'<line class="sl-link"[^>]*x1="([\d.]+)"[^>]*x2="([\d.]+)"[^>]*>'
                                    r'<title>([^<]*)</title>', v.html):
        if "ici:z" in title:
            assert int(float(x1) // slice_w) == int(float(x2) // slice_w), title


# -- timelines -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def step_ledger():
    from shardlab import train
    from shardlab.models import presets
    cfg = presets.get("llama2-13b").replace(num_layers=2)
    mesh = sl.make_mesh((8, 4), ("x", "y"), hardware="tpu-v5p", abstract=True)
    e = train.estimate(cfg, train.Strategy("fsdp_tp", data="x", model="y", zero=3, sequence_parallel=True),
                       mesh, "tpu-v5p", batch=16, seq=4096)
    return e.ledger


def test_timeline_collectives_wait_for_their_producer(step_ledger):
    spans = viz.timeline(step_ledger).data["spans"]
    last_compute_end = 0.0
    for s in spans:
        if s["lane"] == "compute":
            last_compute_end = s["end"]
        else:
            assert s["start"] >= last_compute_end - 1e-15
    mx = viz.timeline(step_ledger, overlap="max").data["total"]
    sm = viz.timeline(step_ledger, overlap="sum").data["total"]
    assert mx <= viz.timeline(step_ledger).data["total"] <= sm


def test_training_step_collapses_by_layer_and_phase(step_ledger):
    v = viz.timeline(step_ledger)
    assert v.data["collapsed"] and len(v.data["blocks"]) < len(v.data["spans"]) / 2
    assert {p for p, _, _ in v.data["phases"]} >= {"forward", "backward"}
    assert [name for name, _, _ in v.data["layers"]][:3] == ["embed", "layer0", "layer1"]
    assert v.html.count("<svg") == 3 and 'type="radio"' in v.html                  # 1x, 4x, 16x
    assert "all 32 alike" in v.html and v.html.count(">compute<") == 3             # one lane pair
    trace = v.data["chrome_trace"]
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(step_ledger.events)
    assert max(e["ts"] + e["dur"] for e in xs) == pytest.approx(v.data["total"] * 1e6)
    json.dumps(trace)


def test_pipeline_timeline_exports_a_chrome_trace(tmp_path):
    tl = pp.clock(pp.one_f_one_b(4, 8))
    path = tmp_path / "trace.json"
    t = pp.timeline.to_chrome_trace(tl, str(path))
    assert json.loads(path.read_text()) == t
    xs = [e for e in t["traceEvents"] if e["ph"] == "X" and e["cat"] != "send"]
    assert len(xs) == sum(len(tl.compute_events(s)) for s in range(4))
    assert max(e["ts"] + e["dur"] for e in xs) == pytest.approx(tl.step_time)          # 1 unit = 1 µs
    assert "overflow-x:auto" in tl._repr_html_()


# -- every picture kind renders readably -------------------------------------------------------------
def _pictures():
    mesh = sl.make_mesh((4, 2), ("x", "y"), hardware="tpu-v5e")
    big = sl.make_mesh((8, 8), ("x", "y"), hardware="tpu-v5e")
    f = sl.shard_map(lambda a, b: sl.lax.psum(a @ b, "y"), mesh=mesh, in_specs=(P(None, "y"), P("y")),
                     out_specs=P())
    with sl.Ledger() as led:
        f(np.ones((64, 128), np.float32), np.ones((128, 64), np.float32))
    out = {"sharding": viz.sharding((16, 16), sl.NamedSharding(mesh, P("x", "y")))}
    for op in ("all_gather", "psum", "psum_scatter", "all_to_all", "ppermute"):
        out[f"collective {op}"] = viz.collective(op, mesh, "x", nbytes=2**20)
    out["collective 64"] = viz.collective("psum", big, ("x", "y"), nbytes=2**30)
    out["link_traffic"] = viz.link_traffic(cost.collective_time("psum", 2**30, axes=("x", "y"), mesh=big))
    out["timeline"] = viz.timeline(led)
    out["strategies"] = viz.strategies({"dp": {"memory": {"params": 2e9, "optimizer": 6e9}, "ledger": led},
                                        "fsdp": {"memory": {"params": 2e8, "optimizer": 6e8}, "bytes": {"y": 3e9}}},
                                       hbm=16e9)
    return out


def test_every_picture_kind_is_readable():
    for name, v in _pictures().items():
        html = v._repr_html_()
        for w in _svg_widths(html):  # wider than the page only inside a frame that scrolls
            assert w <= _VIEWPORT - 40 or "overflow-x:auto" in html, (name, w)
        assert name in ("sharding", "link_traffic") or _text_on_fill(html), name
        for fill, fg in _text_on_fill(html):
            assert colors.contrast(fg, fill) >= 4.5, (name, fill, fg)
        assert _UNIT.search(v.text) or name == "sharding", name
        assert "0.00" not in v.text and " us" not in v.text and "e+" not in v.text, name
    # the pipeline timeline: every label readable on its block (white on yellow-green was not)
    html = pp.clock(pp.zb_h1(4, 8))._repr_html_()
    pairs = _text_on_fill(html)
    assert len(pairs) > 40 and min(colors.contrast(fg, fill) for fill, fg in pairs) >= 4.5
    assert "overflow-x:auto" in html
    # blocks of different devices have different colours
    coll = _pictures()["collective all_gather"]
    fills = re.findall(r'<rect class="sl-chunk"[^>]*fill="(#[0-9a-f]{6})"', coll.html)[:4]
    assert len(set(fills)) == 4


# -- strategies side by side -----------------------------------------------------------------------
def test_strategies_memory_against_hbm_and_bytes_per_axis(step_ledger):
    v = viz.strategies({"dp": {"memory": {"params": 2e9, "optimizer": 1e10}, "bytes": {"data": 4e9}},
                        "fsdp": {"memory": {"params": 1e8, "optimizer": 5e8}, "ledger": step_ledger}},
                       hbm=8e9)
    assert v.data["fits"] == {"dp": False, "fsdp": True}
    assert v.data["bytes"]["fsdp"] == viz.bytes_by_axes(step_ledger) and set(v.data["bytes"]["fsdp"]) == {"x", "y"}
    assert "HBM" in v.html and "✗" in v.html and units.fmt_bytes(12e9) in v.text
    fills = re.findall(r'class="sl-stack"[^>]*fill="(#[0-9a-f]{6})"', v.html)
    assert len(set(fills)) == 5                                   # params, optimizer; data, x, y
    with pytest.raises(ValueError, match=r"\[viz.strategies\]"):
        viz.strategies({"dp": {"bytes": {}}})
    with pytest.raises(TypeError, match=r"\[viz.strategies\] 'dp'"):
        viz.strategies({"dp": 3})
