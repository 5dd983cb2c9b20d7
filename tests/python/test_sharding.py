"""PartitionSpec and NamedSharding: shard shapes, device indices and replica ids against the
reference (written from jax.sharding's documented semantics)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as ref
import shardlab as sl
from shardlab import P


@st.composite
def sharding_cases(draw):
    """(mesh, spec entries, global shape): each mesh axis used at most once, dims divisible."""
    ndim = draw(st.integers(1, 4))
    sizes = []
    for _ in range(ndim):
        sizes.append(draw(st.integers(1, min(6, 96 // math.prod(sizes)))))
    names = ("a", "b", "c", "d")[:ndim]
    free = list(draw(st.permutations(names)))
    rank = draw(st.integers(0, 4))
    spec = []
    for _ in range(rank):
        k = draw(st.integers(0, min(2, len(free))))
        entry, free = tuple(free[:k]), free[k:]
        spec.append(None if not entry else entry[0] if len(entry) == 1 and draw(st.booleans()) else entry)
    shape = []
    for d in range(rank):
        e = spec[d]
        axes = () if e is None else (e,) if isinstance(e, str) else e
        shape.append(math.prod(sizes[names.index(a)] for a in axes) * draw(st.integers(1, 3)))
    while spec and spec[-1] is None and draw(st.booleans()):
        spec.pop()  # missing trailing entries mean None
    return sl.make_mesh(tuple(sizes), names), tuple(spec), tuple(shape)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(sharding_cases())
def test_indices_replica_ids_and_shard_shape(case):
    mesh, spec, shape = case
    s = sl.NamedSharding(mesh, P(*spec))
    indices = s.devices_indices_map(shape)
    assert list(indices) == list(mesh.devices.ravel())  # mesh (row-major) order
    shard_shape = s.shard_shape(shape)
    for pos, coord in enumerate(np.ndindex(*mesh.axis_sizes)):
        want = ref.shard_index(coord, mesh.axis_names, mesh.axis_sizes, spec, shape)
        got = indices[mesh.devices[coord]]
        assert [sl_.indices(n) for sl_, n in zip(got, shape)] == [w.indices(n) for w, n in zip(want, shape)]
        assert tuple(len(range(*g.indices(n))) for g, n in zip(got, shape)) == shard_shape
        assert s.replica_id(pos) == ref.replica_id(coord, mesh.axis_names, mesh.axis_sizes, spec)
    used = {a for e in spec if e is not None for a in ((e,) if isinstance(e, str) else e)}
    split = math.prod(mesh.shape[a] for a in used)
    assert s.is_fully_replicated == (split == 1)
    assert s.num_devices == mesh.size
    assert s.num_shards(shape) == split
    assert set(s.varying_axes) == used
    # Every element is held by exactly (mesh size / split) devices.
    count = np.zeros(shape, int)
    for idx in indices.values():
        count[idx] += 1
    assert (count == mesh.size // split).all()


def test_hand_derived_4x2():
    mesh = sl.make_mesh((4, 2), ("x", "y"))
    s = sl.NamedSharding(mesh, P("x"))
    assert s.shard_shape((8, 6)) == (2, 6)
    idx = s.devices_indices_map((8, 6))
    assert idx[mesh.devices[1, 0]] == (slice(2, 4), slice(None))
    assert idx[mesh.devices[1, 1]] == (slice(2, 4), slice(None))
    assert [s.replica_id(p) for p in range(8)] == [0, 1] * 4
    t = sl.NamedSharding(mesh, P(None, ("y", "x")))
    assert t.shard_shape((3, 16)) == (3, 2)
    # ('y', 'x'): y is major, so device (i, j) holds column block j * 4 + i.
    assert t.devices_indices_map((3, 16))[mesh.devices[1, 1]] == (slice(None), slice(10, 12))
    assert sl.NamedSharding(mesh, P()).is_fully_replicated
    assert not s.is_fully_replicated


def test_partition_spec_behaviour():
    assert P(["x", "y"]) == P(("x", "y"))
    assert P("x", ("y", "z"), None).normalized(4) == (("x",), ("y", "z"), (), ())
    assert P("x", ("y", "z")).mesh_axes() == ("x", "y", "z")
    assert repr(P("x", None)) == "P('x', None)"  # JAX's repr
    mesh = sl.make_mesh((2, 2), ("x", "y"))
    # Trailing Nones do not change the sharding.
    assert sl.NamedSharding(mesh, P("x")) == sl.NamedSharding(mesh, P("x", None, None))
    assert hash(sl.NamedSharding(mesh, P("x"))) == hash(sl.NamedSharding(mesh, P("x", None)))
    assert sl.NamedSharding(mesh, P("x")) != sl.NamedSharding(mesh, P("y"))
    assert sl.NamedSharding(mesh, ("x", None)).spec == P("x", None)
    assert sl.PartitionSpec is sl.P
    import pickle
    assert pickle.loads(pickle.dumps(P("x", ("y", "z")))) == P("x", ("y", "z"))


def test_storage_shape_is_mesh_factorized():
    mesh = sl.make_mesh((4, 2, 3), ("x", "y", "z"))
    assert sl.NamedSharding(mesh, P("z", "x")).storage_shape((6, 8)) == (4, 1, 3, 2, 2)
    assert sl.NamedSharding(mesh, P()).storage_shape((6, 8)) == (1, 1, 1, 6, 8)


@pytest.mark.parametrize("spec", [P("x", "x"), P(("x", "y"), "x")])
def test_duplicate_spec_error_is_value_error(spec):
    with pytest.raises(ValueError):
        sl.NamedSharding(sl.make_mesh((2, 2), ("x", "y")), spec)


def test_book_notation_of_shardings():
    from shardlab.debug import notation

    mesh = sl.make_mesh((2, 2), ("X", "Y"))
    assert notation(P(("X", "Y"), None)) == "A[I_XY, J]"
    assert notation(P(None, "Y"), 3) == "A[I, J_Y, K]"
    arr = sl.device_put(np.zeros((4, 4), np.float32), sl.NamedSharding(mesh, P("Y", "X")))
    assert notation(arr, name="B", letters="JK") == "B[J_Y, K_X]"
    assert notation(P("X"), 2, unreduced={"Y"}, name="C") == "C[I_X, J]{U_Y}"
    assert "<sub>" in notation(P("X"), 1, fmt="html")
    with pytest.raises(ValueError, match=r"\[notation\]"):
        notation(P("X", "Y"), 1)
    with pytest.raises(TypeError, match=r"\[notation\]"):
        notation("X")
