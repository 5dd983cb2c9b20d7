"""Global arrays across ranks: device_put, np.asarray (gathers, on every rank),
addressable_shards (this rank's devices), and values staying on their ranks between programs."""

import numpy as np
import pytest

import shardlab as sl
from shardlab import P, lax

RANKS = sl.process_count()


def _program(mesh):
    x = sl.device_put(np.arange(32, dtype=np.float32).reshape(4, 8), sl.NamedSharding(mesh, P("x", "y")))
    f = sl.shard_map(lambda a: lax.ppermute(a * 2, "y", [(i, (i + 1) % 4) for i in range(4)]),
                     mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y"))
    return f(f(x))  # the second call takes the first's output as it is on the ranks


def test_values_stay_on_their_ranks_between_programs():
    mesh = sl.make_mesh((2, 4), ("x", "y"))
    y = _program(mesh)
    assert sl.distributed.holds_block(y._storage) == (RANKS > 1)
    want = np.roll(np.arange(32, dtype=np.float32).reshape(4, 8) * 4, 4, axis=1)
    np.testing.assert_array_equal(np.asarray(y), want)  # np.asarray gathers on every rank
    np.testing.assert_array_equal(sl.distributed.process_allgather(y + 1), want + 1)


def test_host_nbytes_counts_this_ranks_block():
    mesh = sl.make_mesh((2, 4), ("x", "y"))
    y = _program(mesh)
    # each rank holds its devices' values only: 1/RANKS of the one-process array's bytes
    assert y.host_nbytes * RANKS == 4 * 8 * 4
    assert y.host_nbytes == sum(np.asarray(s.data).nbytes for s in y.addressable_shards)


def test_addressable_shards_are_this_ranks_devices():
    mesh = sl.make_mesh((2, 4), ("x", "y"))
    y = _program(mesh)
    shards = y.addressable_shards
    assert len(shards) == mesh.size // RANKS
    assert [s.device for s in shards] == sl.distributed.addressable_devices(mesh)
    full = np.asarray(y)
    for s in shards:
        np.testing.assert_array_equal(np.asarray(s.data), full[s.index])
    if RANKS > 1:  # another rank's device is not addressable here, as in multi-process JAX
        other = [d for d in mesh.devices.ravel() if d not in sl.distributed.addressable_devices(mesh)][0]
        with pytest.raises(IndexError, match="lives on another rank"):
            y._local(list(mesh.devices.ravel()).index(other))


def test_global_view_ops_on_rank_blocks():
    mesh = sl.make_mesh((2, 4), ("x", "y"))
    y = _program(mesh)
    z = sl.numpy.tanh(y / 100.0) * 2 + y.T.T
    want = np.asarray(y)
    np.testing.assert_allclose(np.asarray(z), np.tanh(want / 100.0) * 2 + want, rtol=1e-6)
    assert float(sl.numpy.sum(y)) == float(want.sum())
