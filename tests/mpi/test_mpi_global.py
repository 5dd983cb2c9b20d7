"""The global view across ranks: reshard, device_put onto another sharding, jax.numpy's explicit
sharding rules, with_sharding_constraint and einsum give the one-process values and ledger,
their results holding only this rank's block; device_put takes rank 0's value; a primitive made
after the MPI backend started runs on it."""

import itertools

import numpy as np
import pytest

import shardlab as sl
import shardlab.numpy as snp
from shardlab import P
from shardlab._src.primitives.primitive import Primitive, bind

from common import assert_same

RANKS = sl.process_count()
SPECS = [P(), P("x"), P("y"), P(None, "x"), P(None, "y"), P("x", "y"), P("y", "x"), P(("x", "y")), P(None, ("y", "x"))]
XI = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
X = XI / 7


def _mesh(types=None):
    """A (2, 4) mesh (x, y): with the default axis types, or all "Explicit" or all "Auto"."""
    if types is None:
        return sl.make_mesh((2, 4), ("x", "y"))
    return sl.make_mesh((2, 4), ("x", "y"), (getattr(sl.sharding.AxisType, types),) * 2)


def _spread(a) -> bool:
    """True when `a` holds only this rank's block (always under MPI, never on one process)."""
    return sl.distributed.holds_block(a._storage) == sl.distributed.is_initialized()


@pytest.mark.parametrize("src", SPECS[1:6])
def test_reshard_to_every_spec_equals_one_process(src):
    def program():
        mesh = _mesh()
        x = sl.device_put(X, sl.NamedSharding(mesh, src))
        outs = [sl.reshard(x, sl.NamedSharding(mesh, dst)) for dst in SPECS]
        assert all(_spread(o) for o in outs)
        return outs

    values, _ = assert_same(program)
    for v in values:
        np.testing.assert_array_equal(v, X)


def test_device_put_onto_another_sharding_and_with_sharding_constraint():
    def program():
        mesh = _mesh("Auto")
        x = sl.device_put(X, sl.NamedSharding(mesh, P("x", "y")))
        a = sl.device_put(x, sl.NamedSharding(mesh, P("y", "x")))
        with sl.set_mesh(mesh):  # Auto axes: the constraint reshards
            b = sl.lax.with_sharding_constraint(x * 2, P(None, ("x", "y")))
        assert _spread(a) and _spread(b)
        return [a, b, sl.device_get(a)]

    values, _ = assert_same(program)
    np.testing.assert_array_equal(values[1], X * 2)


def test_explicit_numpy_rules_equal_one_process():
    def program():
        mesh = _mesh("Explicit")
        a = sl.device_put(X, sl.NamedSharding(mesh, P("x", None)))
        b = sl.device_put(X.T.copy(), sl.NamedSharding(mesh, P(None, "y")))
        with sl.set_mesh(mesh):
            c = snp.matmul(a, b, out_sharding=P("x", "y"))      # a local matmul: no collective
            d = snp.sum(c, axis=1)                               # psum over y
            e = snp.concatenate([a, a], axis=1)
            f = snp.transpose(sl.reshard(e, P(None, "y")))
            g = snp.einsum("ij,jk->ik", a, b, out_sharding=P(None, "x"))
            outs = [c, d, e, f, g, snp.max(g), snp.cumsum(a, axis=1)]
        assert all(_spread(o) for o in outs if o.ndim)
        return outs

    assert_same(program, exact=False)


def test_einsum_partial_sums_then_reshard_equal_one_process():
    def program():
        mesh = _mesh()
        rng = np.random.default_rng(1)
        a = sl.device_put(rng.standard_normal((8, 16)).astype(np.float32), sl.NamedSharding(mesh, P(None, "x")))
        b = sl.device_put(rng.standard_normal((16, 4)).astype(np.float32), sl.NamedSharding(mesh, P("x")))
        c = sl.einsum("ij,jk->ik", a, b, unreduced=("x",))
        return [sl.reshard(c, t) for t in (P(), P("x"), P(("x", "y")), P("y", "x"))]

    assert_same(program, exact=False)


def test_device_put_takes_rank_0s_value():
    mesh = _mesh()
    rank = sl.process_index()
    for spec in (P("x", "y"), P(), P(None, ("y", "x"))):
        x = sl.device_put(X + 1000 * rank, sl.NamedSharding(mesh, spec))  # each rank passes other data
        assert _spread(x)
        np.testing.assert_array_equal(np.asarray(x), X)                  # rank 0's, on every rank
        for s in x.addressable_shards:
            np.testing.assert_array_equal(np.asarray(s.data), X[s.index])
    assert float(sl.device_put(np.float32(rank + 5), sl.NamedSharding(mesh, P()))) == 5.0


def test_shard_map_of_host_data_takes_rank_0s_value_as_device_put():
    mesh = _mesh()
    seen = []

    def body(a):
        seen.append(sl.distributed.holds_block(a.storage))
        return a * 2

    f = sl.shard_map(body, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y"))
    out = f(X + 1000 * sl.process_index())  # host data, other values on each rank
    np.testing.assert_array_equal(np.asarray(out), X * 2)
    x = sl.device_put(X, sl.NamedSharding(mesh, P("y")))  # a global array entering in another layout
    np.testing.assert_array_equal(np.asarray(f(x)), X * 2)
    assert seen == [sl.distributed.is_initialized()] * 2


@pytest.mark.skipif(RANKS == 1, reason="needs several ranks")
def test_device_put_of_different_shapes_on_the_ranks_is_a_clear_error():
    mesh = _mesh()
    rank = sl.process_index()
    with pytest.raises(ValueError, match=r"the ranks pass different arrays:\n  rank 0: float32\(8, 16\)") as e:
        sl.device_put(np.zeros((8, 16 + 8 * rank), np.float32), sl.NamedSharding(mesh, P("x")))
    assert "rank 1: float32(8, 24)" in str(e.value) and "rank 0's values are used" in str(e.value)


def test_addressable_data_indexes_this_ranks_devices_as_jax():
    mesh = _mesh()
    x = sl.device_put(X, sl.NamedSharding(mesh, P("x", "y")))
    shards = x.addressable_shards
    assert len(shards) == mesh.size // RANKS
    for i, s in enumerate(shards):
        np.testing.assert_array_equal(x.addressable_data(i), X[s.index])
    with pytest.raises(IndexError, match=f"index {len(shards)} is outside the {len(shards)} devices"):
        x.addressable_data(len(shards))


def test_a_primitive_made_after_initialize_runs_on_the_mpi_backend():
    negate = Primitive("negate_made_late", shape_rule=lambda storages, mesh: [(s.shape, s.dtype) for s in storages])
    negate.impl["emulated"] = lambda storages, mesh: [np.negative(storages[0])]

    def program():
        mesh = _mesh()
        x = sl.device_put(X, sl.NamedSharding(mesh, P("x", "y")))
        out = sl.shard_map(lambda a: bind(negate, [a], mesh), mesh=mesh, in_specs=P("x", "y"),
                           out_specs=P("x", "y"))(x)
        assert _spread(out)
        return out

    values, _ = assert_same(program, events=False)
    np.testing.assert_array_equal(values[0], -X)
    assert ("mpi" in negate.impl) == sl.distributed.is_initialized()


def test_reshard_on_the_rank_grid_of_a_reordered_split():
    """axis_order=('y', 'x') splits y over the ranks: the same values and ledger."""
    if not sl.distributed.is_initialized():
        pytest.skip("needs the MPI backend")
    sl.distributed.initialize(axis_order=("y", "x"))
    try:
        def program():
            mesh = _mesh()
            x = sl.device_put(X, sl.NamedSharding(mesh, P("x", "y")))
            return [sl.reshard(x, sl.NamedSharding(mesh, d)) for d in itertools.islice(SPECS, 0, 9, 2)]

        assert_same(program)
    finally:
        sl.distributed.initialize()


def test_partial_manual_and_nested_shard_map_keep_rank_blocks():
    """shard_map's entry into some manual axes and a nested shard_map's exit (the layout
    primitives) run on the ranks' blocks: the one-process values and ledger, nothing gathered
    but the ranks along a merged axis."""
    def program():
        mesh = _mesh("Auto")
        x = sl.device_put(XI, sl.NamedSharding(mesh, P("x", "y")))  # integers: sums exact in any order
        seen = []

        def outer(v):
            inner = sl.shard_map(lambda b: sl.lax.psum(b, "y") + sl.lax.axis_index("x"), in_specs=P(None, "y"),
                                 out_specs=P(None, None), axis_names={"y"})
            out = inner(v) * 2
            seen.append(sl.distributed.holds_block(out.storage))
            return out

        with sl.set_mesh(mesh):
            nested = sl.shard_map(outer, in_specs=P("x"), out_specs=P("x"), axis_names={"x"})(x)
            partial = sl.shard_map(lambda v: sl.lax.psum(v.sum(1, keepdims=True), "x"), in_specs=P("x"),
                                   out_specs=P(), axis_names={"x"})(x)
        assert seen == [sl.distributed.is_initialized()] and _spread(nested) and _spread(partial)
        return [nested, partial]

    values, _ = assert_same(program)
    want = (XI.reshape(8, 4, 4).sum(1) + np.arange(2).repeat(4)[:, None]) * 2  # the y blocks summed, plus x's index
    np.testing.assert_array_equal(values[0], want)
