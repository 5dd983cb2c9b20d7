"""Receive buffers of the MPI collectives come from the core's buffer pool (storage.empty): a
buffer is reused only after the array and every view of it are freed, so a value the user
still holds is never overwritten; outputs of 1 MiB and more (the pooled sizes) equal the
one-process run."""

import numpy as np
import pytest

import shardlab as sl
import shardlab._core as _core
from shardlab import P, lax
from shardlab._src.backends.mpi.storage import empty

from common import assert_same

RANKS = sl.process_count()
multi = pytest.mark.skipif(RANKS == 1, reason="needs mpirun -n 2 or more")
pooled = pytest.mark.skipif(not hasattr(_core, "pool_empty"), reason="a core built before _core.pool_empty")
MiB = 1 << 20


def _ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _owner(a: np.ndarray):
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a


@pooled
@pytest.mark.parametrize("shift", [0, 16, 64, 4092])
def test_empty_comes_from_the_pool_at_the_send_buffers_page_offset(shift):
    src = np.ones(MiB + 1024, np.float32).view(np.uint8)[shift:shift + 4 * MiB].view(np.float32)
    out = empty((3,) + src.shape, src.dtype, like=src)
    assert out.shape == (3, MiB) and out.dtype == np.float32 and out.flags.c_contiguous and out.flags.writeable
    assert (_ptr(out) - _ptr(src)) % 4096 == 0
    assert type(_owner(out)).__name__ == "PyCapsule"  # the core's pool, not numpy's malloc
    out[...] = 2.0  # every byte of it is writable memory
    assert float(out.sum()) == 2.0 * out.size


def test_small_buffers_and_odd_offsets_use_numpy():
    small = empty((4, 8), np.int32)
    assert small.shape == (4, 8) and small.flags.owndata  # below 1 MiB: numpy's own allocation
    odd = np.zeros(MiB + 8, np.uint8)[3:3 + MiB]  # an offset no float64 can start at
    out = empty((MiB // 8,), np.float64, like=odd)
    assert out.flags.aligned and out.shape == (MiB // 8,)


@pooled
def test_a_buffer_returns_to_the_pool_only_when_every_view_is_freed():
    shape = (3 * MiB + 512,)  # a size class of its own in this test
    _core.pool_release()
    a = empty(shape, np.uint8)
    a[:] = 7
    start = _ptr(a)
    view = a[10:20]
    del a
    b = empty(shape, np.uint8)  # the view keeps a's buffer: b must not be it
    b[:] = 1
    assert _ptr(b) != start and view.tolist() == [7] * 10
    del view
    c = empty(shape, np.uint8)
    assert _ptr(c) == start  # freed: reused (its pages are still mapped)
    assert b.min() == 1 and b.max() == 1


def _program(case, mesh, big):
    n = mesh.size
    x = np.arange(n * big, dtype=np.float32).reshape(n, big) % 251 - 125.0
    if case == "all_gather":
        f, out = (lambda a: lax.all_gather(a, "r", tiled=True)), P()
    elif case == "psum":
        f, out = (lambda a: lax.psum(a * 0.5, "r")), P()
    elif case == "pmax":
        f, out = (lambda a: lax.pmax(a, "r")), P()
    elif case == "pmean_int":
        x = x.astype(np.int32)
        f, out = (lambda a: lax.pmean(a, "r")), P()
    else:
        f, out = (lambda a: lax.all_to_all(a, "r", 1, 0, tiled=True)), P("r")
    x = sl.device_put(x, sl.NamedSharding(mesh, P("r")))
    return sl.shard_map(f, mesh=mesh, in_specs=P("r"), out_specs=out)(x)


@multi
@pytest.mark.parametrize("case", ["all_gather", "psum", "pmax", "pmean_int", "all_to_all"])
def test_pooled_outputs_equal_the_one_process_run(case):
    mesh = sl.make_mesh((RANKS,), ("r",), devices=sl.devices()[:RANKS])
    big = MiB // 4 * RANKS  # 1 MiB and more per device: the pooled sizes
    assert_same(lambda: _program(case, mesh, big), exact=case not in ("psum", "pmean_int"))


@multi
@pooled
@pytest.mark.parametrize("case", ["all_gather", "psum", "all_to_all"])
def test_values_the_user_holds_are_never_overwritten(case):
    mesh = sl.make_mesh((RANKS,), ("r",), devices=sl.devices()[:RANKS])
    big = MiB // 4 * RANKS
    n = mesh.size
    f = {"all_gather": lambda a: lax.all_gather(a, "r", tiled=True), "psum": lambda a: lax.psum(a, "r"),
         "all_to_all": lambda a: lax.all_to_all(a, "r", 1, 0, tiled=True)}[case]
    smap = sl.shard_map(f, mesh=mesh, in_specs=P("r"), out_specs=P("r") if case == "all_to_all" else P())
    x = sl.device_put(np.arange(n * big, dtype=np.float32).reshape(n, big) % 97, sl.NamedSharding(mesh, P("r")))
    _core.pool_release()
    first = smap(x)
    expect = np.asarray(first).copy()
    held = first._storage.block.reshape(-1)[-16:]  # a view the user keeps of the output
    start = _ptr(first._storage.block)
    firsts = first._storage.block.copy()
    del first
    second = smap(x)
    assert not np.may_share_memory(second._storage.block, held)  # the held view's buffer is not reused
    np.testing.assert_array_equal(held, firsts.reshape(-1)[-16:])
    del held
    third = smap(x)  # every view freed: the buffer is reused (no new pages), values right
    assert _ptr(third._storage.block) == start
    assert not np.may_share_memory(third._storage.block, second._storage.block)
    np.testing.assert_array_equal(np.asarray(third), expect)
    np.testing.assert_array_equal(np.asarray(second), expect)



@multi
@pytest.mark.parametrize("dtype", [np.float32, np.int32, sl.dtypes.bfloat16])
def test_psum_scatter_and_all_gather_over_a_split_axis_take_the_direct_mpi_forms(dtype, monkeypatch):
    """Several devices per rank along the axis (mesh (4, 2) over 2 ranks) or one (over 4):
    psum_scatter is Reduce_scatter_block, all_gather one Allgather, with the one-process values."""
    from shardlab._src.backends.mpi import collectives as mc
    general = []
    orig = mc.run_collective
    monkeypatch.setattr(mc, "run_collective", lambda *a: general.append(a[0].name) or orig(*a))
    mesh = sl.make_mesh((4, 2), ("x", "y"))

    def run(f, in_spec, out_spec, shape):
        x = (np.arange(np.prod(shape)).reshape(shape) % 11).astype(dtype)
        return sl.shard_map(f, mesh=mesh, in_specs=in_spec, out_specs=out_spec)(
            sl.device_put(x, sl.NamedSharding(mesh, in_spec)))

    for dim, out in [(0, P("x")), (1, P(None, "x")), (-1, P(None, None, "x"))]:  # local (4, 24, 8)
        assert_same(lambda: run(lambda a: lax.psum_scatter(a, "x", scatter_dimension=dim, tiled=True),
                                P("x"), out, (16, 24, 8)))
    assert_same(lambda: run(lambda a: lax.psum_scatter(a, "x", scatter_dimension=1, tiled=False),
                            P("x"), P("x"), (16, 4, 8)))  # dim 1 of the group's size: one row each
    for axis, tiled, out in [(0, True, P(None, "y")), (1, True, P(None, "y")), (2, False, P(None, "y")),
                             (0, False, P(None, None, "y"))]:  # local (4, 12, 8)
        assert_same(lambda: run(lambda a: lax.all_gather(a, "x", axis=axis, tiled=tiled), P("x", "y"), out,
                                (16, 24, 8)))
    assert general == []
