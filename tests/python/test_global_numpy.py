"""jax.numpy on global ShardedArrays: values and shardings against JAX's explicit sharding,
recorded collectives for reductions over sharded dims, reshard requests where JAX asks for
them, and gradients through shard_map."""

import numpy as np
import pytest

import shardlab as sl
import shardlab.numpy as snp
from shardlab import P
from shardlab.sharding import ShardingTypeError

MESH = sl.make_mesh((4, 2), ("x", "y"))
X = (np.arange(64, dtype=np.float32).reshape(8, 8) % 7 - 3) / 4


def put(x, *spec):
    return sl.device_put(x, sl.NamedSharding(MESH, P(*spec)))


REDUCTIONS = ["sum", "mean", "max", "min", "prod", "any", "all", "var", "std"]


@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1)])
def test_reductions_values_and_shardings(name, axis):
    a = put(X, "x", "y")
    got = getattr(snp, name)(a, axis=axis)
    want = getattr(np, name)(X, axis=axis)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    kept = {None: (), 0: ("y",), 1: ("x",), (0, 1): ()}[axis]
    assert got.sharding.spec == P(*kept)
    kd = getattr(snp, name)(a, axis=axis, keepdims=True)
    assert np.asarray(kd).shape == np.asarray(getattr(np, name)(X, axis=axis, keepdims=True)).shape


def test_reduction_over_a_sharded_dim_records_its_collective():
    a = put(X, "x", "y")
    with sl.Ledger() as ledger:
        snp.sum(a, axis=0)
    ops = [(e["op"], tuple(e["axes"])) for e in ledger.events]
    assert ops == [("psum", ("x",))]
    with sl.Ledger() as ledger:
        snp.sum(put(X, None, "y"), axis=0)  # the reduced dim is not sharded: no collective
    assert [e["op"] for e in ledger.events] == []


def test_integer_mean_is_float32_as_jax():
    a = put(np.arange(8, dtype=np.int32).reshape(4, 2), "x")
    m = snp.mean(a, axis=0)
    assert m.dtype == np.float32 and np.asarray(m).tolist() == [3.0, 4.0]


def test_reshape_keeps_the_sharding_where_jax_does_and_asks_for_reshard_otherwise():
    a = put(X, "x", "y")
    r = snp.reshape(a, (4, 2, 8))
    assert r.sharding.spec == P("x", None, "y")
    np.testing.assert_array_equal(np.asarray(r), X.reshape(4, 2, 8))
    r = snp.reshape(put(X, "x"), (64,))
    assert r.sharding.spec == P("x")
    np.testing.assert_array_equal(np.asarray(r), X.reshape(64))
    r = snp.reshape(a, (64,))  # merging two sharded dims: JAX shards the result over both axes
    assert r.sharding.spec == P(("x", "y"))
    np.testing.assert_array_equal(np.asarray(r), X.reshape(64))
    with pytest.raises(ShardingTypeError, match=r"\[reshape\] This reshape is not supported.*out_sharding"):
        snp.reshape(a, (2, 4, 8))  # the split leaves 2 rows for 4 shards


def test_transpose_permutes_the_spec():
    a = put(X, "x", "y")
    t = snp.transpose(a)
    assert t.sharding.spec == P("y", "x")
    np.testing.assert_array_equal(np.asarray(t), X.T)


def test_indexing_keeps_whole_dims_sharded_and_refuses_slicing_sharded_ones():
    a = put(X, "x")
    s = a[:, 2:5]
    assert s.sharding.spec == P("x", None)
    np.testing.assert_array_equal(np.asarray(s), X[:, 2:5])
    s = a[..., 3]
    assert s.sharding.spec == P("x")
    np.testing.assert_array_equal(np.asarray(s), X[:, 3])
    assert a[None].sharding.spec == P(None, "x", None)
    with pytest.raises(ShardingTypeError, match=r"\[getitem\] Use `.at\[...\].get\(out_sharding=\)`"):
        a[0:2]


def test_concatenate_keeps_the_one_sharding_of_its_operands():
    a = put(X, "x")
    c = snp.concatenate([a, a * 2], axis=1)
    assert c.sharding.spec == P("x", None) and c.shape == (8, 16)  # JAX pads the spec to the rank
    np.testing.assert_array_equal(np.asarray(c), np.concatenate([X, X * 2], axis=1))
    c = snp.concatenate([a, a], axis=0)  # along the sharded dim, as JAX: gathered, joined, sliced
    assert c.sharding.spec == P("x", None)
    np.testing.assert_array_equal(np.asarray(c), np.concatenate([X, X], axis=0))
    with pytest.raises(ShardingTypeError, match=r"\[concatenate\] All operands should have the same sharding"):
        snp.concatenate([a, put(X, None, "y")], axis=1)


@pytest.mark.jax
def test_sum_of_shard_map_output_squared_and_mean_match_jax_with_gradients():
    jax = pytest.importorskip("jax")
    if len(jax.devices()) < 8:
        pytest.skip("JAX started with fewer than 8 CPU devices")
    jmesh = jax.make_mesh((4, 2), ("x", "y"))
    jx = jax.device_put(X, jax.sharding.NamedSharding(jmesh, jax.sharding.PartitionSpec("x", "y")))
    jf = jax.shard_map(lambda v: jax.numpy.tanh(v) * 2, mesh=jmesh, in_specs=jax.sharding.PartitionSpec("x", "y"),
                       out_specs=jax.sharding.PartitionSpec("x", "y"))
    f = sl.shard_map(lambda v: snp.tanh(v) * 2, mesh=MESH, in_specs=P("x", "y"), out_specs=P("x", "y"))
    a = put(X, "x", "y")
    with jax.set_mesh(jmesh):
        want_sum = np.asarray(jax.numpy.sum(jf(jx) ** 2))
        want_mean = jax.numpy.mean(jf(jx), axis=0)
    np.testing.assert_allclose(np.asarray(snp.sum(f(a) ** 2)), want_sum, rtol=1e-5)
    got_mean = snp.mean(f(a), axis=0)
    np.testing.assert_allclose(np.asarray(got_mean), np.asarray(want_mean), rtol=1e-5, atol=1e-6)
    assert tuple(got_mean.sharding.spec) == tuple(want_mean.sharding.spec)  # P('y') in both

    def ours(v):
        y = f(v)
        return snp.sum(snp.mean(y, axis=0) ** 2) + snp.sum(snp.transpose(snp.reshape(y, (4, 2, 8))) ** 3)

    def theirs(v):
        y = jf(v)
        return jax.numpy.sum(jax.numpy.mean(y, axis=0) ** 2) + jax.numpy.sum(jax.numpy.transpose(y.reshape(4, 2, 8)) ** 3)

    got = sl.grad(ours)(a)
    with jax.set_mesh(jmesh):
        want = jax.grad(theirs)(jx)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)


def _nonzero_repeat(api, np_, spec):
    """nonzero / repeat on a (2, 2)-mesh array under set_mesh: each result's type and values, or
    the error's class (JAX refuses both on sharded inputs, and asks repeat for out_sharding=)."""
    mesh = api.make_mesh((2, 2), ("X", "Y"), devices=api.devices()[:4])
    x = api.device_put(np.arange(16.0, dtype=np.float32).reshape(4, 4) - 3, api.NamedSharding(mesh, spec(api.P)))
    calls = {"nonzero": lambda v: v.nonzero(), "repeat_free_dim": lambda v: v.repeat(2, axis=1),
             "repeat_dim0": lambda v: v.repeat(2, axis=0),
             "repeat_out_sharding": lambda v: np_.repeat(v, 2, axis=0, out_sharding=api.P("X")),
             "repeat_total_length": lambda v: np_.repeat(v, 2, axis=1, total_repeat_length=5, out_sharding=api.P())}
    out = {}
    with api.set_mesh(mesh):
        for name, f in calls.items():
            try:
                r = f(x)
            except Exception as e:  # noqa: BLE001 - compared by class with JAX's
                out[name] = type(e).__name__
                continue
            rs = r if isinstance(r, tuple) else (r,)
            out[name] = [(str(api.typeof(v)), np.asarray(v).tolist()) for v in rs]
    return out


@pytest.mark.jax
@pytest.mark.parametrize("spec", [lambda P: P("X", "Y"), lambda P: P("X", None), lambda P: P()],
                         ids=["X,Y", "X", "replicated"])
def test_nonzero_and_repeat_follow_jax_s_explicit_rules(spec):
    jax = pytest.importorskip("jax")
    assert _nonzero_repeat(sl, snp, spec) == _nonzero_repeat(jax, jax.numpy, spec)
