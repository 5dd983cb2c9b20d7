"""Every collective on the MPI backend gives the one-process values and ledger, on meshes
whose axes are split over the ranks or kept inside one."""

import numpy as np
import pytest

import shardlab as sl
from shardlab import P, lax

from common import assert_same

MESHES = [((8,), ("x",)), ((2, 4), ("x", "y")), ((4, 2), ("x", "y"))]


def _input(mesh, spec, shape=(8, 16), dtype=np.float32):
    x = np.arange(np.prod(shape)).reshape(shape) % 13
    return sl.device_put(x.astype(dtype), sl.NamedSharding(mesh, spec))


def _smap(mesh, f, in_spec, out_spec, x):
    return sl.shard_map(f, mesh=mesh, in_specs=in_spec, out_specs=out_spec)(x)


def test_ranks_and_processes():
    from mpi4py import MPI
    assert sl.process_count() == MPI.COMM_WORLD.Get_size()
    assert sl.process_index() == MPI.COMM_WORLD.Get_rank()
    assert sl.distributed.is_initialized() == (MPI.COMM_WORLD.Get_size() > 1)


@pytest.mark.parametrize("shape,names", MESHES)
@pytest.mark.parametrize("reduction", ["psum", "pmean", "pmax", "pmin"])
def test_reductions(shape, names, reduction):
    mesh = sl.make_mesh(shape, names)
    spec = P(names)
    for axes in [names[0], names[-1], names]:
        fn = getattr(lax, reduction)
        assert_same(lambda: _smap(mesh, lambda a: fn(a * 1.5, axes), spec, spec, _input(mesh, spec)))


@pytest.mark.parametrize("shape,names", MESHES)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, sl.dtypes.bfloat16])
def test_psum_dtypes_and_invariant_operands(shape, names, dtype):
    mesh = sl.make_mesh(shape, names)
    # a replicated operand: psum of an invariant value is the axis size times it
    assert_same(lambda: _smap(mesh, lambda a: lax.psum(a, names[0]), P(), P(), _input(mesh, P(), dtype=dtype)))
    assert_same(lambda: _smap(mesh, lambda a: lax.psum(a, names), P(names), P(), _input(mesh, P(names), dtype=dtype)))


@pytest.mark.parametrize("shape,names", MESHES)
@pytest.mark.parametrize("tiled", [True, False])
def test_all_gather(shape, names, tiled):
    mesh = sl.make_mesh(shape, names)
    for axes in [names[0], names]:
        for axis in (0, 1):
            rest = tuple(n for n in names if n not in axes)  # the output still varies along these
            assert_same(lambda: _smap(mesh, lambda a: lax.all_gather(a, axes, axis=axis, tiled=tiled),
                                      P(names), P(rest or None), _input(mesh, P(names))))


@pytest.mark.parametrize("shape,names", MESHES)
def test_psum_scatter(shape, names):
    mesh = sl.make_mesh(shape, names)
    n = mesh.size
    for axes, dim in [(names[0], 1), (names, 1), (names[-1], 0)]:
        assert_same(lambda: _smap(mesh, lambda a: lax.psum_scatter(a, axes, scatter_dimension=dim, tiled=True),
                                  P(), P(names), _input(mesh, P(), shape=(n, n))))


@pytest.mark.parametrize("shape,names", MESHES)
def test_all_to_all(shape, names):
    mesh = sl.make_mesh(shape, names)
    for axes in [names[0], names[-1], names]:
        assert_same(lambda: _smap(mesh, lambda a: lax.all_to_all(a, axes, 1, 0, tiled=True),
                                  P(names), P(names), _input(mesh, P(names), shape=(8, 16))))


@pytest.mark.parametrize("shape,names", MESHES)
def test_ppermute_axis_index_broadcast(shape, names):
    mesh = sl.make_mesh(shape, names)
    a0 = names[0]
    n = mesh.shape[a0]
    ring = [(i, (i + 1) % n) for i in range(n)]
    half = [(i, i + 1) for i in range(0, n - 1, 2)]  # devices left out receive zeros
    for perm in (ring, half):
        assert_same(lambda: _smap(mesh, lambda a: lax.ppermute(a, a0, perm), P(names), P(names),
                                  _input(mesh, P(names))))
    assert_same(lambda: _smap(mesh, lambda a: a + lax.axis_index(names).astype(np.float32), P(names), P(names),
                              _input(mesh, P(names))), events=False)  # axis_index moves no data
    assert_same(lambda: _smap(mesh, lambda a: lax.pbroadcast(a, a0, source=n - 1), P(names), P(names),
                              _input(mesh, P(names))))


def test_local_ops_between_collectives_and_grad():
    mesh = sl.make_mesh((2, 4), ("x", "y"))

    def program():
        w = _input(mesh, P(None, "y"), shape=(16, 8))
        x = _input(mesh, P("x"), shape=(8, 16))

        def loss(w, x):
            def body(w, x):
                h = sl.numpy.tanh(lax.all_gather(x, "y", axis=1, tiled=True) @ w / 16.0)
                return lax.psum(sl.numpy.sum(h * h), ("x", "y"))
            return sl.shard_map(body, mesh=mesh, in_specs=(P(None, "y"), P("x", "y")), out_specs=P())(w, x)

        return sl.value_and_grad(loss)(w, sl.device_put(x, sl.NamedSharding(mesh, P("x", "y"))))

    assert_same(program, exact=False)


@pytest.mark.parametrize("case", ["all_gather", "psum", "all_to_all"])
def test_direct_mpi_forms_need_no_general_path(case, monkeypatch):
    """all_gather of a value with one device per rank, psum, and a tiled all_to_all over one
    split axis run as MPI Allgather / Allreduce / Alltoall, not through the general path."""
    from shardlab._src.backends.mpi import collectives as mc
    general = []
    monkeypatch.setattr(mc, "run_collective", lambda *a: general.append(a[0].name) or orig(*a))
    orig = mc.dispatch.run_collective
    ranks = sl.process_count()
    mesh = sl.make_mesh((2, 4), ("x", "y"))
    if case == "all_gather":  # P("x"): invariant along y, so each rank's block is one device
        f = lambda a: lax.all_gather(a, "x", axis=0, tiled=True)  # noqa: E731
        assert_same(lambda: _smap(mesh, f, P("x"), P(), _input(mesh, P("x"))))
        one = sl.make_mesh((ranks,), ("r",), devices=sl.devices()[:ranks])
        assert_same(lambda: _smap(one, lambda a: lax.all_gather(a, "r", tiled=True), P("r"), P(),
                                  _input(one, P("r"), shape=(4 * ranks, 3))))
    elif case == "psum":
        assert_same(lambda: _smap(mesh, lambda a: lax.psum(a, ("x", "y")), P("x", "y"), P(),
                                  _input(mesh, P("x", "y"))))
    else:
        for concat in (0, 1):
            assert_same(lambda: _smap(mesh, lambda a: lax.all_to_all(a, "x", 1, concat, tiled=True),
                                      P("x", "y"), P("x", "y"), _input(mesh, P("x", "y"), shape=(8, 32))))
    assert general == []
