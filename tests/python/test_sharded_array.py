"""ShardedArray and device_put: real shards, round trips, emulated vs host bytes."""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as ref
import shardlab as sl
from shardlab import P

from test_sharding import sharding_cases

BF16 = np.dtype(ml_dtypes.bfloat16)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(sharding_cases(), st.sampled_from([np.float32, np.float64, BF16, np.int32, np.int8, np.bool_]))
def test_device_put_shards_and_round_trip(case, dtype):
    mesh, spec, shape = case
    x = (np.arange(math.prod(shape)).reshape(shape) % 7).astype(dtype)
    with sl.dtypes.x64_scope(np.dtype(dtype) == np.float64):   # float64 exists with x64 on, as in JAX
        arr = sl.device_put(x, sl.NamedSharding(mesh, P(*spec)))
    assert arr.shape == shape and arr.dtype == np.dtype(dtype) and arr.ndim == len(shape)
    back = np.asarray(arr)
    assert back.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back, x)
    shards = arr.addressable_shards
    assert [s.device for s in shards] == list(mesh.devices.ravel())
    for pos, (s, coord) in enumerate(zip(shards, np.ndindex(*mesh.axis_sizes))):
        want = ref.shard_index(coord, mesh.axis_names, mesh.axis_sizes, spec, shape)
        np.testing.assert_array_equal(s.data, x[want])
        np.testing.assert_array_equal(arr.addressable_data(pos), x[want])
        assert s.replica_id == ref.replica_id(coord, mesh.axis_names, mesh.axis_sizes, spec)
        assert not s.data.flags.writeable
    item = np.dtype(dtype).itemsize
    per_device = math.prod(arr.sharding.shard_shape(shape)) * item
    assert arr.nbytes_per_device == per_device
    assert arr.emulated_nbytes == per_device * mesh.size
    # Host memory holds each distinct shard once.
    assert arr.host_nbytes == x.size * item


def test_bytes_hand_derived():
    mesh = sl.make_mesh((4, 2), ("x", "y"))
    a = sl.device_put(np.ones((8, 1024), np.float32), sl.NamedSharding(mesh, P("x")))
    assert (a.nbytes_per_device, a.emulated_nbytes, a.host_nbytes) == (8192, 65536, 32768)


def test_replicated_array_on_64_devices_is_held_once():
    mesh = sl.make_mesh((4, 4, 4), ("x", "y", "z"))
    x = np.ones((512, 1024), np.float32)  # 2 MiB
    a = sl.device_put(x, sl.NamedSharding(mesh, P()))
    assert a.host_nbytes == x.nbytes
    assert a.emulated_nbytes == 64 * x.nbytes
    # The 64 shards are views of one buffer.
    bases = {s.data.__array_interface__["data"][0] for s in a.addressable_shards}
    assert len(bases) == 1
    half = sl.device_put(x, sl.NamedSharding(mesh, P("y")))
    assert half.host_nbytes == x.nbytes and half.emulated_nbytes == 16 * x.nbytes


def test_device_put_copies_the_input():
    x = np.arange(8.0)
    a = sl.device_put(x, sl.NamedSharding(sl.make_mesh((4,), ("x",)), P("x")))
    x[:] = -1
    np.testing.assert_array_equal(np.asarray(a), np.arange(8.0))


def test_resharding_a_sharded_array():
    mesh = sl.make_mesh((4, 2), ("x", "y"))
    x = np.arange(64.0).reshape(8, 8)
    a = sl.device_put(x, sl.NamedSharding(mesh, P("x", "y")))
    b = sl.device_put(a, sl.NamedSharding(mesh, P(None, "x")))
    np.testing.assert_array_equal(np.asarray(b), x)
    np.testing.assert_array_equal(b.addressable_shards[1].data, x[:, :2])  # device (0, 1): x index 0
    np.testing.assert_array_equal(b.addressable_shards[2].data, x[:, 2:4])
    assert sl.device_put(a, sl.NamedSharding(mesh, P("x", "y"))) is a  # same sharding: no copy


def test_device_put_with_bare_spec_and_lists():
    mesh = sl.make_mesh((2,), ("x",))
    with sl.set_mesh(mesh):
        a = sl.device_put(np.array([[1, 2], [3, 4]]), P("x"))  # a list would be a pytree, as in JAX
    assert a.dtype == np.int32  # int64 is canonicalized, as JAX without x64
    assert [s.data.tolist() for s in a.addressable_shards] == [[[1, 2]], [[3, 4]]]
    s = sl.device_put(3.5, sl.NamedSharding(mesh, P()))
    assert s.shape == () and float(np.asarray(s)) == 3.5
    assert len(sl.device_put(np.zeros(6), sl.NamedSharding(mesh, P("x")))) == 6


def test_storage_is_read_only_and_factorized():
    mesh = sl.make_mesh((4, 2), ("x", "y"))
    a = sl.device_put(np.zeros((8, 8), np.float32), sl.NamedSharding(mesh, P(None, "x")))
    assert a.storage.shape == (4, 1, 8, 2)
    with pytest.raises(ValueError):
        a.storage[0, 0, 0, 0] = 1
    with pytest.raises(IndexError, match=r"^\[addressable_data\]"):
        a.addressable_data(8)


def test_repr_and_html():
    mesh = sl.make_mesh((4, 2), ("x", "y"))
    a = sl.device_put(np.zeros((8, 6), np.float32), sl.NamedSharding(mesh, P("x", "y")))
    assert repr(a).startswith("Array([[0., 0.,") and "spec=P('x', 'y')" in repr(a)  # JAX's repr + sharding
    html = a._repr_html_()
    assert html.startswith("<") and "Array([[0., 0.," in html
    sl.debug.visualize_array_sharding(a)  # draws without raising


def test_global_view_arithmetic_keeps_the_layout_and_matmul_is_planned():
    mesh = sl.make_mesh((2, 2), ("x", "y"))
    A = np.arange(16.0, dtype=np.float32).reshape(4, 4)
    a = sl.device_put(A, sl.NamedSharding(mesh, P("x", "y")))
    b = sl.device_put(A, sl.NamedSharding(mesh, P("y")))
    c = a * 2 + 1
    assert isinstance(c, sl.ShardedArray) and c.sharding == a.sharding
    np.testing.assert_array_equal(np.asarray(c), A * 2 + 1)
    with pytest.raises(sl.sharding.ShardingTypeError, match="incompatible shardings"):
        a - b                                     # different layouts: JAX's ShardingTypeError
    d = a - sl.reshard(b, a.sharding)
    assert d.sharding == a.sharding
    np.testing.assert_array_equal(np.asarray(d), np.zeros_like(A))
    np.testing.assert_allclose(np.asarray(np.exp(a)), np.exp(A), rtol=1e-6)
    with pytest.raises(sl.sharding.ShardingTypeError, match="Contracting dimensions are sharded"):
        a @ b                                     # ambiguous, as in JAX: say where the result goes
    with sl.Ledger() as ledger:
        e = sl.numpy.matmul(a, b, out_sharding=a.sharding)
    np.testing.assert_allclose(np.asarray(e), A @ A, rtol=1e-6)
    assert any(ev["op"] != "matmul" and ev["op"] != "einsum" for ev in ledger.events)  # it communicated
    assert (a > 3).dtype == np.bool_
