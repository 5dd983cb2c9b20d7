"""shardlab.Ledger: what is recorded, where, and how it is summarized and rendered."""

import numpy as np
import pytest

import shardlab as sl
from shardlab import P


def _program(mesh):
    def body(a, w):
        g = sl.lax.all_gather(w, "x", tiled=True)       # [8, 16] f32 gathered: 512 B
        y = a @ g                                        # a local [2, 8] @ [8, 16]
        return sl.lax.psum(y, "y")                       # [2, 16] f32: 128 B

    return sl.shard_map(body, mesh=mesh, in_specs=(P("x", None), P("x", None)), out_specs=P("x", None))


def test_events_fields_and_summaries():
    mesh = sl.make_mesh((4, 2), ("x", "y"))
    a, w = np.ones((8, 8), np.float32), np.ones((8, 16), np.float32)
    with sl.Ledger() as ledger:
        _program(mesh)(a, w)
    ops = [e["op"] for e in ledger.events]
    assert ops == ["all_gather", "matmul", "psum"]
    ag, mm, ps = ledger.events
    assert ag["axes"] == ("x",) and ag["group_size"] == 4 and ag["num_groups"] == 2
    assert (ag["bytes_in"], ag["bytes_out"], ag["bytes_sent"]) == (128, 512, 384.0)
    assert mm["flops"] == 2 * 2 * 8 * 16 and mm["bytes_sent"] == 0
    assert ps["axes"] == ("y",) and ps["bytes_sent"] == 2 * (2 - 1) / 2 * 128
    assert ledger.total_bytes_sent == 384 + 128
    by_op = ledger.by_op()
    assert by_op["all_gather"]["count"] == 1 and by_op["psum"]["bytes_sent"] == 128
    assert by_op["matmul"]["flops"] == 512 and by_op["psum"]["seconds"] is None
    assert set(ledger.by_axis()) == {("x",), (), ("y",)}
    assert ledger.to_dicts() == ledger.events and len(ledger) == 3 and list(ledger) == ledger.events


def test_nested_ledgers_and_the_mesh_default_ledger_all_record():
    mesh = sl.make_mesh((4, 2), ("x", "y"))
    mesh.ledger.clear()
    with sl.Ledger() as outer:
        with sl.Ledger() as inner:
            _program(mesh)(np.ones((8, 8), np.float32), np.ones((8, 16), np.float32))
        _program(mesh)(np.ones((8, 8), np.float32), np.ones((8, 16), np.float32))
    assert (len(inner), len(outer), len(mesh.ledger)) == (3, 6, 6)
    outer.clear()
    assert len(outer) == 0 and len(inner) == 3


def test_text_and_html_rendering():
    mesh = sl.make_mesh((4, 2), ("x", "y"), hardware="tpu-v5e")
    with sl.Ledger() as ledger:
        _program(mesh)(np.ones((8, 8), np.float32), np.ones((8, 16), np.float32))
    text = ledger.table()
    assert "all_gather" in text and "psum" in text and "512 B" in text and " µs" in text
    assert str(ledger) == text and "3 events" in repr(ledger)
    html = ledger._repr_html_()
    assert "<table" in html and html.count("<tr") == 5   # header + 3 events + the totals row
    assert all(e["seconds"] > 0 for e in ledger.events)
    assert ledger.roofline().bound == "communication"


def test_roofline_needs_hardware_and_dataframe_has_every_event():
    mesh = sl.make_mesh((2,), ("x",))
    with sl.Ledger() as ledger:
        sl.shard_map(lambda a: sl.lax.psum(a, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())(np.ones(4))
    with pytest.raises(ValueError, match=r"\[Ledger.roofline\] .* no hardware"):
        ledger.roofline()
    pd = pytest.importorskip("pandas")
    df = ledger.to_dataframe()
    assert isinstance(df, pd.DataFrame) and list(df["op"]) == ["psum"]
    assert df["bytes_sent"][0] == 2 * (2 - 1) / 2 * 8   # float32[2] per device (float64 enters as float32, as JAX), ring AllReduce
