"""Every object displays itself, in one language: each display kind renders to text and HTML (and
rich), and what can be checked without eyes is checked - units, no exponents, no raw arrays,
readable colours on light and dark grounds, a bounded size - plus export to SVG / PNG / CSV /
JSON / Chrome trace."""

import csv
import io
import json
import re
import shutil

import numpy as np
import pytest
from rich.console import Console

import shardlab as sl
from shardlab import P, cost, units, viz
from shardlab.models import flops_per_token, kv_cache_bytes, mfu, param_count, presets, step_time_lower_bound, \
    training_memory
from shardlab.serve import StepModel, estimate, simulate
from shardlab.serve.simulator import ServingConfig
from shardlab.serve.workload import poisson_requests
from shardlab.train import pipeline as pp
from shardlab.viz import colors

LLAMA = presets.get("llama3-8b")


@pytest.fixture(scope="module")
def objects():
    """One object of every kind that displays itself."""
    mesh = sl.make_mesh((4, 2), ("x", "y"), hardware="tpu-v5e")
    f = sl.shard_map(lambda a, b: sl.lax.psum(a @ b, "y"), mesh=mesh, in_specs=(P(None, "y"), P("y")),
                     out_specs=P())
    with sl.Ledger() as ledger:
        f(np.ones((64, 128), np.float32), np.ones((128, 64), np.float32))
    reqs = poisson_requests(150, rate=40.0, prompt_len=("uniform", 200, 800), output_len=32, seed=0)
    sim = simulate(reqs, StepModel(LLAMA, "tpu-v5e", {"x": 8}), ServingConfig(max_batch=16))
    arr = sl.device_put(np.ones((8, 8), sl.numpy.bfloat16), sl.NamedSharding(mesh, P("x", "y")))
    return {
        "mesh": mesh, "hardware_tpu": sl.hardware.get("tpu-v5e"), "hardware_gpu": sl.hardware.get("h100"),
        "collective_cost": cost.collective_time("psum", 2**20, axes="x", mesh=mesh),
        "axis_schedule": cost.schedule("all_gather", 8, "ring", 2.0**20),
        "plan": sl.plan_einsum("ij,jk->ik", ((64, 64), P("x")), ((64, 64), P(None, "y")), mesh=mesh),
        "roofline": ledger.roofline(), "ledger": ledger, "sharded_array": arr,
        "param_count": param_count(LLAMA), "flops_per_token": flops_per_token(LLAMA, 4096),
        "kv_cache": kv_cache_bytes(LLAMA, 8192), "mfu": mfu(LLAMA, 1e5, "h100", 8),
        "step_time": step_time_lower_bound(LLAMA, 4096, "h100", 8),
        "training_memory": training_memory(LLAMA, "fsdp", {"data": 256}, 256),
        "serve_estimate": estimate(LLAMA, "tpu-v5e", 8, 32, 4096),
        "serve_estimate_oom": estimate(LLAMA, "tpu-v5e", 1, 64, 8192),
        "sim_result": sim, "schedule": pp.one_f_one_b(4, 8), "schedule_zb": pp.zb_h1(4, 8),
    }


def _text(obj) -> str:
    return str(obj)


def _rich(obj) -> str:
    console = Console(width=120, record=True, file=io.StringIO(), color_system=None)
    console.print(obj)
    return console.export_text()


def _visible(html: str) -> str:
    """The text a reader sees in an HTML display (tags, styles and tooltips removed)."""
    html = re.sub(r"<style>.*?</style>", "", html, flags=re.S)
    html = re.sub(r"<title>.*?</title>", "", html, flags=re.S)
    return re.sub(r"<[^>]+>", " ", html)


_EXPONENT = re.compile(r"\d[eE][+-]?\d")
_DECIMAL_MEMORY = re.compile(r"\d\s?[kMGTP]B\b(?!/s)")       # 80 GB (memory in decimal units)
_FLOPS_SPELLINGS = re.compile(r"\d\s?[kMGTPE]?FLOPS\b|FLOPs/|TFLOPs")  # one spelling: FLOP, FLOP/s


def _check_numbers(where: str, s: str) -> None:
    assert not _EXPONENT.search(s), f"{where}: an exponent in {_EXPONENT.search(s).group()!r}"
    assert " us " not in s and not s.endswith(" us"), f"{where}: 'us' instead of µs"
    assert not _DECIMAL_MEMORY.search(s), f"{where}: memory in decimal units: {_DECIMAL_MEMORY.search(s).group()!r}"
    assert not _FLOPS_SPELLINGS.search(s), f"{where}: FLOPs spelled {_FLOPS_SPELLINGS.search(s).group()!r}"
    assert "object at 0x" not in s and "<Hardware" not in s, f"{where}: a bare repr"


def test_every_display_kind_renders_text_html_and_rich(objects):
    for name, obj in objects.items():
        text, html, rich_text = _text(obj), obj._repr_html_(), _rich(obj)
        assert text.strip() and rich_text.strip(), name
        assert html.startswith("<style>") and 'class="sl-view' in html, name  # the CSS travels with the HTML
        for where, s in (("text", text), ("html", _visible(html)), ("rich", rich_text)):
            _check_numbers(f"{name} {where}", s)
        assert len(html) < 400_000, f"{name}: {len(html)} characters of HTML"
        r = repr(obj)  # what a terminal REPL shows: short, no 16-digit floats, no exponents
        assert not re.search(r"\d\.\d{7,}", r) and not _EXPONENT.search(r), f"{name} repr: {r[:200]}"


def test_no_raw_arrays_in_a_simulation(objects):
    sim = objects["sim_result"]
    for s in (str(sim), repr(sim), _visible(sim._repr_html_()), _rich(sim)):
        assert "array(" not in s and not re.search(r"\[\s*\d+\.\d+\s+\d+\.\d+", s), s[:300]
    assert repr(sim).startswith("<SimResult interleaved: 150 requests done") and "\n" not in repr(sim)
    p = sim.view().data["percentiles"]
    assert p["TTFT"][50] == pytest.approx(float(np.percentile(sim.ttft, 50)))
    assert units.fmt_seconds(p["TPOT"][99]) in str(sim)
    assert sim._repr_html_().count("<circle") <= 2 * 400  # a sample of requests, not all


def test_units_in_the_displays(objects):
    hw = str(objects["hardware_gpu"])
    assert hw.startswith("Hardware h100: NVIDIA H100") and "74.5 GiB" in hw and "3.35 TB/s" in hw
    assert "989 TFLOP/s" in hw
    m = objects["training_memory"]
    lines = {ln.split()[0]: ln for ln in str(m).splitlines()[1:] if ln.strip()}
    assert lines["data_parallel"].split()[-1] == "256"            # a count, not "256 B"
    assert lines["param_count"].endswith("8.03B params")         # not GiB
    assert lines["total"].endswith(units.fmt_bytes(m.total))
    assert int(m) == int(m.total) and float(objects["param_count"]) == float(objects["param_count"].total)
    assert "56.9%" in str(objects["mfu"]) and "45.0 GFLOP" in str(objects["mfu"])
    e = objects["serve_estimate"]
    assert units.fmt_bytes(e.param_bytes) in str(e) and units.fmt_seconds(e.decode.seconds) in str(e)
    assert "does not fit" in str(objects["serve_estimate_oom"])
    assert "1 event" not in str(objects["ledger"]) or "1 events" not in str(objects["ledger"])


def test_ledger_header_counts_events_in_english():
    mesh = sl.make_mesh((4,), ("x",), hardware="tpu-v5e")
    f = sl.shard_map(lambda a: sl.lax.psum(a, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())
    with sl.Ledger() as one:
        f(np.ones((4, 8), np.float32))
    for s in (str(one), repr(one), _visible(one._repr_html_()), viz.ledger_view(one).text):
        assert "1 event" in s and "1 events" not in s, s


def test_sharding_keeps_the_dtype(objects):
    arr = objects["sharded_array"]
    v = viz.sharding(arr)
    assert v.data["bytes_per_device"] == 2 * 2 * 4 * 2 / 2 and "bfloat16" in v.text  # (4, 2) bf16 = 16 B
    typ = sl.ShapeDtypeStruct(arr.shape, arr.dtype, sharding=arr.sharding)
    assert viz.sharding(typ).data["bytes_per_device"] == 16
    bare = viz.sharding(arr.shape, arr.sharding)
    assert bare.data["bytes_per_device"] == 32 and "float32 assumed" not in bare.text
    assert "assume float32" in bare.html


def test_html_is_readable_on_dark_themes(objects):
    """Text outside pictures takes the page's colour; every fixed text colour sits on its own
    background with WCAG contrast >= 4.5; pictures (SVG) sit on their own light card."""
    assert "color:inherit" in viz.view.CSS and ".sl-view svg{background:#fff" in viz.view.CSS
    assert not re.search(r"\.sl-view\{[^}]*color:#", viz.view.CSS)
    for name, obj in objects.items():
        html = re.sub(r"<svg.*?</svg>", "", obj._repr_html_(), flags=re.S)
        for style in re.findall(r'style="([^"]*)"', html):
            fg = re.search(r"(?<![-\w])color:(#[0-9a-fA-F]{6})", style)
            if fg:
                bg = re.search(r"background:(#[0-9a-fA-F]{6})", style)
                assert bg, f"{name}: fixed text colour {fg.group(1)} without its background: {style}"
                assert colors.contrast(fg.group(1), bg.group(1)) >= 4.5, (name, style)


def test_pictures_fit_the_viewport(objects):
    for name in ("sim_result", "schedule", "schedule_zb", "axis_schedule"):
        widths = [float(w) for w in re.findall(r'<svg[^>]*?width="([\d.]+)"', objects[name]._repr_html_())]
        assert widths and max(widths) <= 1000, (name, widths)


def test_schedule_display_order_and_colours(objects):
    v = objects["schedule_zb"].view()
    assert v.data["kinds"] == ["forward", "backward_input", "backward_weight"]
    assert v.data["rows"][0][0] == "F0" and str(objects["schedule_zb"]).startswith("stage 0: F0")
    fills = set(re.findall(r'<rect[^>]*fill="(#[0-9a-f]{6})"', v.html))
    assert fills == {viz.pipeline_schedule.__globals__["KIND_COLORS"][k] for k in v.data["kinds"]}


def test_views_are_registered_by_class_not_by_name():
    class MyMesh(sl.Mesh):  # a subclass finds its base class's view
        pass

    m = MyMesh(np.arange(2), ("x",))
    assert 'data-view="mesh"' in m._repr_html_()
    with pytest.raises(TypeError, match=r"\[register_view\] expected a class"):
        sl.views.register_view("Mesh", viz.mesh_view)


def test_export_svg_csv_json_trace(objects, tmp_path, monkeypatch):
    monkeypatch.setattr(viz.view, "_browser", lambda: None)  # the SVG's size estimated, not measured
    view = sl.views.view_of(objects["roofline"])
    view.save(str(tmp_path / "r.svg"))
    svg = (tmp_path / "r.svg").read_text()
    assert svg.startswith("<svg") and "<foreignObject" in svg and "Roofline on tpu-v5e" in svg
    w, h = (float(x) for x in re.search(r'width="([\d.]+)" height="([\d.]+)"', svg).groups())
    assert 300 < w < 1200 and 200 < h < 1200, (w, h)
    objects["training_memory"].save(str(tmp_path / "m.html"))
    assert "training_memory" in (tmp_path / "m.html").read_text()
    with pytest.raises(ValueError, match=r"\[View.save\] cannot save .*\.bmp"):
        view.save(str(tmp_path / "r.bmp"))
    viz.save_ledger(objects["ledger"], str(tmp_path / "l.csv"))
    viz.save_ledger(objects["ledger"], str(tmp_path / "l.json"))
    viz.save_ledger(objects["ledger"], str(tmp_path / "l.trace.json"))
    rows = list(csv.DictReader(open(tmp_path / "l.csv")))
    assert [r["op"] for r in rows] == [e["op"] for e in objects["ledger"].events]
    assert json.load(open(tmp_path / "l.json"))[0]["op"] == rows[0]["op"]
    trace = json.load(open(tmp_path / "l.trace.json"))["traceEvents"]
    assert sorted(e["name"] for e in trace if e["ph"] == "X") == sorted(r["op"] for r in rows)
    with pytest.raises(ValueError, match=r"\[save_ledger\] cannot save"):
        viz.save_ledger(objects["ledger"], str(tmp_path / "l.xlsx"))


@pytest.mark.skipif(shutil.which("chromium") is None and shutil.which("google-chrome") is None,
                    reason="PNG export needs a headless Chromium or Chrome")
def test_png_export(objects, tmp_path):
    pytest.importorskip("PIL")
    from PIL import Image

    objects["schedule"].save(str(tmp_path / "s.png"))
    img = Image.open(tmp_path / "s.png")
    assert 200 < img.width < 2400 and 50 < img.height < 800  # cropped to the picture, at 2x


def test_throughput_latency_view(objects):
    sim = objects["sim_result"]
    v = viz.throughput_latency([sim], "e2e", 99)
    (x, y), = v.data[""]
    assert x == sim.throughput and y == pytest.approx(float(np.percentile(sim.e2e, 99)))
    assert units.fmt_seconds(y) in v.text and "<polyline" in v.html and "(log scale)" in v.html
    with pytest.raises(ValueError, match=r"\[throughput_latency\] metric='latency'"):
        viz.throughput_latency([sim], "latency")
