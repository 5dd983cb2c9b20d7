"""shardlab.debug: which device holds which block, as text, HTML and data."""

import numpy as np
import pytest

import shardlab as sl
from shardlab import P


@pytest.mark.parametrize("spec, cells", [
    (P("x", "y"), [[(0,), (1,)], [(2,), (3,)]]),
    (P("x"), [[(0, 1)], [(2, 3)]]),
    (P(None, "y"), [[(0, 2), (1, 3)]]),
    (P(), [[(0, 1, 2, 3)]]),
    (P(("y", "x")), [[(0,)], [(2,)], [(1,)], [(3,)]]),   # y major: block b = y * 2 + x
])
def test_diagram_cells_name_the_devices_holding_each_block(spec, cells):
    mesh = sl.make_mesh((2, 2), ("x", "y"))
    d = sl.debug.sharding_diagram((8, 4), sl.NamedSharding(mesh, spec))
    assert d.cells == cells
    text = str(d)
    for row in cells:
        for ids in row:
            assert "CPU " + ",".join(map(str, ids)) in text
    assert d._repr_html_().count("<td") == sum(len(r) for r in cells)


def test_one_dimensional_arrays_draw_one_row():
    mesh = sl.make_mesh((4,), ("x",))
    d = sl.debug.sharding_diagram((8,), sl.NamedSharding(mesh, P("x")))
    assert d.cells == [[(0,), (1,), (2,), (3,)]]


def test_visualize_prints_in_a_terminal(capsys):
    mesh = sl.make_mesh((2,), ("x",))
    a = sl.device_put(np.zeros((4, 4), np.float32), sl.NamedSharding(mesh, P("x")))
    sl.debug.visualize_array_sharding(a)
    sl.debug.visualize_sharding((4, 4), a.sharding)
    out = capsys.readouterr().out
    assert out.count("CPU 0") == 2 and out.count("CPU 1") == 2
    assert "CPU 0" in a._repr_html_()


def test_bad_input():
    mesh = sl.make_mesh((2,), ("x",))
    with pytest.raises(ValueError, match=r"\[visualize_sharding\] can draw 1-D and 2-D arrays"):
        sl.debug.sharding_diagram((2, 2, 2), sl.NamedSharding(mesh, P()))
    with pytest.raises(TypeError, match=r"\[visualize_array_sharding\] expected a ShardedArray"):
        sl.debug.visualize_array_sharding(np.zeros(4))
    with pytest.raises(TypeError, match=r"\[device_values\] expected a LocalArray"):
        sl.debug.device_values(np.zeros(4))


def test_device_values_stacks_every_device():
    mesh = sl.make_mesh((4,), ("x",))
    seen = {}

    def body(a):
        seen["v"] = sl.debug.device_values(a * 0 + sl.lax.axis_index("x"))
        return a

    sl.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(np.zeros(8, np.int32))
    np.testing.assert_array_equal(seen["v"], [[0, 0], [1, 1], [2, 2], [3, 3]])
