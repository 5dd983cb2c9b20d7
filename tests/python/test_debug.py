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
    assert d._repr_html_().count('class="sl-cell"') == sum(len(r) for r in cells)  # shardlab.viz's picture


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
    with pytest.raises(ValueError, match=r"\[visualize_sharding\] only works for shapes with 1 and 2 dim"):
        sl.debug.visualize_array_sharding(sl.device_put(np.zeros((2, 2, 2)), sl.NamedSharding(mesh, P())))
    with pytest.raises(TypeError, match=r"\[visualize_array_sharding\] expected an array"):
        sl.debug.visualize_array_sharding("not an array")
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


CASES = [((2, 4), (8, 4), ("X", "Y")), ((2, 4), (8, 4), ("Y", "X")), ((8,), (8,), ("X",)),
         ((2, 4), (8,), (("X", "Y"),)), ((2, 4), (16, 4), ("X",)), ((2, 4), (4, 16), (None, "Y")),
         ((2, 4), (8, 8), ()), ((8,), (32, 2), ("X",)), ((2, 4), (2, 64), ("X", "Y"))]


@pytest.mark.jax
@pytest.mark.parametrize("mesh_shape, shape, spec", CASES)
@pytest.mark.parametrize("kw", [{}, {"scale": 2.0}, {"use_color": True, "min_width": 5}],
                         ids=["plain", "scale2", "min_width"])
def test_visualize_prints_what_jax_prints(capsys, mesh_shape, shape, spec, kw):
    """Same boxes, sizes and labels as jax.debug.visualize_array_sharding (pytest's captured
    stdout has no colour terminal, so both draw lines)."""
    jax = pytest.importorskip("jax")
    names = ("X", "Y")[:len(mesh_shape)]
    x = np.zeros(shape, np.float32)
    jmesh = jax.make_mesh(mesh_shape, names)
    jax.debug.visualize_array_sharding(jax.device_put(x, jax.sharding.NamedSharding(jmesh, jax.P(*spec))), **kw)
    want = capsys.readouterr().out
    mesh = sl.make_mesh(mesh_shape, names)
    sl.debug.visualize_array_sharding(sl.device_put(x, sl.NamedSharding(mesh, P(*spec))), **kw)
    assert capsys.readouterr().out == want
    assert want.startswith("┌")


@pytest.mark.jax
def test_host_arrays_are_one_block_on_device_0(capsys):
    jax = pytest.importorskip("jax")
    jax.debug.visualize_array_sharding(jax.numpy.zeros((4, 4)))
    want = capsys.readouterr().out
    sl.debug.visualize_array_sharding(np.zeros((4, 4), np.float32))
    assert capsys.readouterr().out == want


def test_colour_blocks_take_tab20b_in_jaxs_walk():
    """In colour each block is a padded cell with the colour map's background; neighbours
    differ."""
    mesh = sl.make_mesh((2, 2), ("x", "y"))
    table = sl.debug.sharding_table((4, 4), sl.NamedSharding(mesh, P("x", "y")), use_color=True)
    cells = [c for col in table.columns for c in col._cells]
    colours = [str(c.style.bgcolor.triplet.hex) for c in cells]
    assert len(cells) == 4 and len(set(colours)) == 4


def test_inspect_array_sharding_calls_back_with_each_leaf():
    mesh = sl.make_mesh((2,), ("x",))
    a = sl.device_put(np.zeros(4), sl.NamedSharding(mesh, P("x")))
    seen = []
    sl.debug.inspect_array_sharding({"a": a, "b": [a]}, callback=seen.append)
    assert [s.spec for s in seen] == [P("x"), P("x")]
