"""Meshes of virtual devices: row-major ids, coordinates, groups, the current mesh."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as ref
import shardlab as sl


@st.composite
def mesh_shapes(draw):
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    return shape if math.prod(shape) <= 128 else shape[:1]


def names_for(shape):
    return ("a", "b", "c", "d")[: len(shape)]


def test_row_major_ids_hand_derived():
    mesh = sl.make_mesh((4, 2), ("x", "y"))
    for i, j in itertools.product(range(4), range(2)):
        assert mesh.devices[i, j].id == 2 * i + j
    assert mesh.device_ids.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.shape == {"x": 4, "y": 2} and list(mesh.shape) == ["x", "y"]
    assert (mesh.size, mesh.ndim, mesh.axis_names, mesh.axis_sizes) == (8, 2, ("x", "y"), (4, 2))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(mesh_shapes())
def test_row_major_ids_and_coords(shape):
    mesh = sl.make_mesh(shape, names_for(shape))
    np.testing.assert_array_equal(mesh.device_ids, np.arange(math.prod(shape)).reshape(shape))
    for pos, coord in enumerate(np.ndindex(*shape)):
        assert mesh.device_at(coord).id == pos
        assert tuple(mesh._core.coords(pos)) == coord
        assert mesh._core.device_id(list(coord)) == pos


@settings(max_examples=40, deadline=None, derandomize=True)
@given(mesh_shapes(), st.data())
def test_groups_match_reference(shape, data):
    names = names_for(shape)
    mesh = sl.make_mesh(shape, names)
    k = data.draw(st.integers(1, len(names)))
    axes = tuple(data.draw(st.permutations(names))[:k])
    groups = mesh._core.groups(list(axes))
    n = math.prod(mesh.shape[a] for a in axes)
    assert len(groups) == mesh.size // n and all(len(g) == n for g in groups)
    assert sorted(i for g in groups for i in g) == list(range(mesh.size))  # a partition
    ids = mesh.device_ids
    want = {tuple(int(ids[c]) for c in ref.group(coord, names, shape, axes)[1]) for coord in np.ndindex(*shape)}
    assert {tuple(g) for g in groups} == want


def test_groups_hand_derived():
    mesh = sl.make_mesh((2, 3), ("a", "b"))
    assert sorted(mesh._core.groups(["b"])) == [[0, 1, 2], [3, 4, 5]]
    assert sorted(mesh._core.groups(["a"])) == [[0, 3], [1, 4], [2, 5]]
    assert mesh._core.groups(["b", "a"]) == [[0, 3, 1, 4, 2, 5]]


def test_mesh_from_device_array_keeps_the_given_order():
    devs = np.array(sl.devices())[::-1].reshape(2, 4)
    mesh = sl.Mesh(devs, ("data", "model"))
    assert mesh.device_ids.tolist() == [[7, 6, 5, 4], [3, 2, 1, 0]]
    assert mesh.devices[1, 0] is sl.devices()[3]
    assert sl.Mesh(np.arange(4).reshape(2, 2), ("x", "y")).device_ids.tolist() == [[0, 1], [2, 3]]
    assert sl.Mesh(np.array(sl.devices()[:4]), "x").axis_names == ("x",)


def test_devices_and_config():
    assert [d.id for d in sl.devices()] == list(range(8))
    assert all(d.platform == "cpu" for d in sl.devices())
    try:
        sl.config.update("num_devices", 16)
        assert len(sl.devices()) == 16
    finally:
        sl.config.update("num_devices", 8)
    assert len(sl.devices()) == 8
    big = sl.make_mesh((16, 16, 16), ("x", "y", "z"))  # make_mesh creates what it needs
    assert big.size == 4096 and big.devices[15, 15, 15].id == 4095
    with pytest.raises(ValueError, match=r"^\[config"):
        sl.config.update("num_devices", 0)


def test_equality_and_hash():
    a, b = sl.make_mesh((4, 2), ("x", "y")), sl.make_mesh((4, 2), ("x", "y"))
    assert a == b and hash(a) == hash(b)
    assert a != sl.make_mesh((2, 4), ("x", "y"))
    assert a != sl.make_mesh((4, 2), ("x", "z"))
    assert a != sl.Mesh(np.array(sl.devices())[::-1].reshape(4, 2), ("x", "y"))


def test_current_mesh_context_and_set_mesh():
    a, b = sl.make_mesh((8,), ("x",)), sl.make_mesh((2, 4), ("x", "y"))
    assert sl.get_mesh() is None
    with pytest.warns(DeprecationWarning, match="set_mesh"):
        with a:  # as JAX 0.10: deprecated, and not the mesh get_mesh / device_put / shard_map use
            assert sl.get_mesh() is None
    assert sl.get_mesh() is None
    with sl.set_mesh(b):
        assert sl.get_mesh() is b
        out = sl.shard_map(lambda v: sl.lax.psum(v, "y"), in_specs=sl.P("y"), out_specs=sl.P())(np.ones(8))
        np.testing.assert_array_equal(np.asarray(out), [4.0, 4.0])
    assert sl.get_mesh() is None
    with pytest.raises(ValueError, match=r"^\[set_mesh\]"):  # JAX's class
        sl.set_mesh("x")


def test_each_mesh_has_a_ledger():
    mesh = sl.make_mesh((4,), ("x",))
    sl.shard_map(lambda v: sl.lax.psum(v, "x"), mesh=mesh, in_specs=sl.P("x"), out_specs=sl.P())(np.ones(4))
    assert [e["op"] for e in mesh.ledger.events] == ["psum"]
    assert len(sl.make_mesh((4,), ("x",)).ledger) == 0
