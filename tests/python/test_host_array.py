"""HostArray: shardlab.numpy's results on host data are JAX's single-device Array (a numpy
subclass), compared with real JAX: values, dtypes, weak types, repr/str, .sharding, .at[], the
arithmetic's dtype promotion, and the jax.Array methods."""

import copy
import pickle
import warnings

import numpy as np
import pytest

import shardlab as sl
import shardlab.numpy as jnp
from shardlab._src.arrays.host_array import HostArray

pytestmark = pytest.mark.jax
jax = pytest.importorskip("jax")
jjnp = jax.numpy


def _same(got, want):
    """Same values, dtype and weak type as JAX's array."""
    assert isinstance(got, HostArray), type(got)
    assert got.shape == want.shape
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.weak_type == want.weak_type, (repr(got), repr(want))
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=1e-6)


# each: (description, how to make it with a jnp module)
_MADE = [
    ("arange int", lambda m: m.arange(3)),
    ("arange float", lambda m: m.arange(8.0)),
    ("weak float scalar", lambda m: m.asarray(1.0)),
    ("weak int scalar", lambda m: m.array(3)),
    ("strong scalar", lambda m: m.float32(1.0) if m is jjnp else m.asarray(np.float32(1.0))),
    ("0-d ones", lambda m: m.ones(())),
    ("2-d ones", lambda m: m.ones((2, 3))),
    ("3-d zeros", lambda m: m.zeros((2, 2, 2))),
    ("bool", lambda m: m.array([True, False])),
    ("bfloat16", lambda m: m.ones((2, 3), m.bfloat16)),
    ("uint32", lambda m: m.array([1, 2], m.uint32)),
    ("uint8 scalar", lambda m: m.array(np.uint8(3))),
    ("empty", lambda m: m.zeros((0, 3))),
    ("summarised 1-d", lambda m: m.arange(2000.0)),
    ("summarised 2-d", lambda m: m.arange(2000).reshape(40, 50)),
    ("fractions", lambda m: m.array([1.5, 2.25])),
    ("wide range", lambda m: m.array([1e10, 1.0])),
    ("nan and inf", lambda m: m.array([np.nan, np.inf])),
    ("full weak", lambda m: m.full((2,), 3.0)),
    ("weak times int", lambda m: m.arange(3) * 2.0),
    ("sum", lambda m: m.sum(m.arange(4.0))),
]


@pytest.mark.parametrize("name,make", _MADE, ids=[n for n, _ in _MADE])
def test_repr_str_dtype_and_weak_type_match_jax(name, make):
    got, want = make(jnp), make(jjnp)
    _same(got, want)
    assert repr(got) == repr(want)
    assert str(got) == str(want)


def test_is_an_array_and_a_numpy_array():
    x = jnp.arange(4)
    assert isinstance(x, sl.Array) and isinstance(x, np.ndarray)
    assert type(np.asarray(x)) is np.ndarray  # the core and numpy code see the base array
    assert np.shares_memory(np.asarray(x), x)
    assert x.item(1) == 1 and x.tolist() == [0, 1, 2, 3]
    assert float(jnp.sum(x)) == 6.0 and int(x[2]) == 2 and [0, 1, 2][x[1]] == 1
    assert f"{jnp.asarray(1.25):.1f}" == "1.2"


def test_jax_array_methods_and_properties():
    x, want = jnp.arange(3), jjnp.arange(3)
    assert x.block_until_ready() is x
    assert x.copy_to_host_async() is None and x.is_ready() and not x.is_deleted()
    assert x.is_fully_replicated == want.is_fully_replicated is True
    assert x.is_fully_addressable == want.is_fully_addressable is True
    assert x.sharding == sl.sharding.SingleDeviceSharding(sl.devices()[0])
    assert repr(x.sharding).replace("VirtualDevice", "CpuDevice") == repr(want.sharding)
    assert x.device == sl.devices()[0] and x.devices() == {sl.devices()[0]}
    assert x.sharding.device_set == x.devices()
    (shard,) = x.addressable_shards
    (wshard,) = want.addressable_shards
    assert shard.index == wshard.index and shard.replica_id == wshard.replica_id
    assert shard.device == x.device and shard.data is x
    assert x.global_shards == x.addressable_shards
    assert x.addressable_data(0) is x
    with pytest.raises(IndexError):
        x.addressable_data(1)


def test_committed_as_jax():
    for mod, put, dev in ((jnp, sl.device_put, sl.devices()), (jjnp, jax.device_put, jax.devices())):
        x = mod.arange(3)
        assert [x.committed, put(x).committed, put(x, dev[0]).committed, put(np.ones(2)).committed,
                put(np.ones(2), dev[0]).committed] == [False, False, True, False, True]
    y = sl.device_put(np.ones(2), sl.devices()[3])
    assert y.device == sl.devices()[3] and (y + 1).committed and (y + 1).device == sl.devices()[3]
    assert sl.device_put(1.0).weak_type == jax.device_put(1.0).weak_type is True


def test_device_get_gives_plain_numpy_as_jax():
    x = jnp.arange(3.0)
    got, want = sl.device_get({"a": x}), jax.device_get({"a": jjnp.arange(3.0)})
    assert type(got["a"]) is type(want["a"]) is np.ndarray
    np.testing.assert_array_equal(got["a"], want["a"])


_BINARY = [
    ("int32 * np.float64", lambda m, x: x * np.float64(2.0)),
    ("np.float64 * int32", lambda m, x: np.float64(2.0) * x),
    ("int32 * 2.0", lambda m, x: x * 2.0),
    ("int32 + 1", lambda m, x: x + 1),
    ("int32 / 2", lambda m, x: x / 2),
    ("int32 // 2", lambda m, x: x // 2),
    ("int32 ** 2", lambda m, x: x ** 2),
    ("int32 > 1", lambda m, x: x > 1),
    ("int32 + float32 array", lambda m, x: x + m.ones(3)),
    ("int32 + np int64 array", lambda m, x: x + np.ones(3, np.int64)),
    ("uint8 + 300", lambda m, x: m.array([1, 2], m.uint8) + 300),
    ("weak float + float16", lambda m, x: m.asarray(2.0) * m.ones(2, m.float16)),
    ("weak array + float16", lambda m, x: m.full((2,), 3.0) + m.ones(2, m.float16)),
    # numpy's ufuncs on a HostArray give what jnp's give (on a JAX array they give numpy's dtypes)
    ("np.sin(int32)", lambda m, x: (np.sin if m is jnp else m.sin)(x)),
    ("np.sin(weak int)", lambda m, x: (np.sin if m is jnp else m.sin)(m.asarray(3))),
    ("weak int > 2", lambda m, x: m.asarray(3) > 2),
    ("negate weak", lambda m, x: -m.asarray(3)),
    ("matmul", lambda m, x: m.ones((2, 3)) @ m.ones((3, 2))),
    ("matmul int float", lambda m, x: m.ones((2, 3), m.int32) @ m.ones((3,))),
    ("x.sum()", lambda m, x: x.sum()),
    ("x.mean()", lambda m, x: x.mean()),
    ("x.var()", lambda m, x: m.arange(4.0).var()),
    ("bool sum", lambda m, x: (x > 0).sum()),
    ("x[0]", lambda m, x: x[0]),
    ("weak x[()]", lambda m, x: m.asarray(3.0)[()]),
    ("x[1:]", lambda m, x: x[1:]),
    ("x.T reshape", lambda m, x: m.ones((2, 3)).T.reshape(3, 2)),
    ("astype float64", lambda m, x: x.astype(np.float64)),
]


@pytest.mark.parametrize("name,fn", _BINARY, ids=[n for n, _ in _BINARY])
def test_arithmetic_follows_jax_numpy_dtype_rules(name, fn):
    _same(fn(jnp, jnp.arange(3)), fn(jjnp, jjnp.arange(3)))


def test_iteration_gives_0d_arrays_as_jax():
    got, want = list(jnp.arange(3)), list(jjnp.arange(3))
    assert [repr(g) for g in got] == [repr(w) for w in want]


_AT = [
    ("set", lambda x, m: x.at[0].set(5.0)),
    ("set repeated (last wins)", lambda x, m: x.at[m.array([0, 0])].set(m.array([1.0, 2.0]))),
    ("add repeated", lambda x, m: x.at[m.array([0, 0, 2])].add(1.0)),
    ("subtract slice", lambda x, m: x.at[1:].subtract(1.0)),
    ("multiply slice", lambda x, m: x.at[1:].multiply(2.0)),
    ("mul alias", lambda x, m: x.at[-1].mul(3.0)),
    ("divide repeated", lambda x, m: x.at[m.array([1, 1])].divide(2.0)),
    ("power", lambda x, m: x.at[2].power(2.0)),
    ("min", lambda x, m: x.at[-1].min(-5.0)),
    ("max", lambda x, m: x.at[:2].max(m.array([0.5, 7.0]))),
    ("apply", lambda x, m: x.at[2].apply(m.sin)),
    ("get", lambda x, m: x.at[1:3].get()),
    ("get out of bounds clamps", lambda x, m: x.at[9].get()),
    ("get fill", lambda x, m: x.at[m.array([0, 9])].get(mode="fill", fill_value=-1.0)),
    ("set out of bounds dropped", lambda x, m: x.at[9].set(1.0)),
    ("add mixed in/out of bounds", lambda x, m: x.at[m.array([1, 7, -1])].add(10.0)),
    ("negative index", lambda x, m: x.at[-2].set(0.0)),
    ("2-d row", lambda x, m: x.reshape(2, 2).at[1].set(m.array([8.0, 9.0]))),
    ("2-d ellipsis column", lambda x, m: x.reshape(2, 2).at[..., 0].add(1.0)),
    ("2-d boolean mask", lambda x, m: x.reshape(2, 2).at[x.reshape(2, 2) > 1].set(0.0)),
    ("int array divide", lambda x, m: m.arange(3).at[0].divide(2)),
    ("int array power", lambda x, m: m.arange(3).at[0].power(2)),
    ("weak array set", lambda x, m: m.full((3,), 1.0).at[0].set(2.0)),
]


@pytest.mark.parametrize("name,fn", _AT, ids=[n for n, _ in _AT])
def test_at_matches_jax(name, fn):
    x = jnp.arange(4.0)
    before = np.array(x)
    got = fn(x, jnp)
    _same(got, fn(jjnp.arange(4.0), jjnp))
    np.testing.assert_array_equal(np.asarray(x), before)  # a new array: x is unchanged


def test_at_int_updates_cast_to_the_array_dtype_as_jax():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # JAX warns of the unsafe cast
        want = jjnp.arange(3).at[1].set(2.7)
    _same(jnp.arange(3).at[1].set(2.7), want)


def test_item_assignment_raises_as_jax():
    x, w = jnp.arange(3), jjnp.arange(3)
    with pytest.raises(TypeError) as e:
        w[0] = 1
    with pytest.raises(type(e.value), match="immutable.*at\\[idx\\].set"):
        x[0] = 1


def test_numpy_functions_see_plain_arrays_as_on_jax_arrays():
    """numpy's own functions take JAX arrays through __array__ and give numpy arrays; numpy code
    that fills an ``empty_like`` (np.roll) works."""
    x = jnp.arange(4.0)
    for fn in (lambda v: np.roll(v, 1), lambda v: np.concatenate([v, v]), np.median):
        got, want = fn(x), fn(jjnp.arange(4.0))
        assert type(got) is type(np.asarray(want)) or np.ndim(got) == 0
        np.testing.assert_array_equal(got, np.asarray(want))
    assert isinstance(jnp.roll(x, 1), HostArray)  # shardlab.numpy gives Arrays


def test_pickle_and_deepcopy_keep_the_flags():
    x = jnp.asarray(2.0)
    for y in (pickle.loads(pickle.dumps(x)), copy.deepcopy(x)):
        assert isinstance(y, HostArray) and repr(y) == repr(x) == "Array(2., dtype=float32, weak_type=True)"


def test_results_that_jax_gives_as_arrays():
    """random samplers, grad, vmap and jit on host data give HostArrays, as JAX gives Arrays."""
    x = jnp.ones(3)
    outs = {
        "random.normal": (sl.random.normal(sl.random.key(0), (2,)), jax.random.normal(jax.random.key(0), (2,))),
        "PRNGKey": (sl.random.PRNGKey(3), jax.random.PRNGKey(3)),
        "grad": (sl.grad(lambda v: jnp.sum(v * v))(x), jax.grad(lambda v: jjnp.sum(v * v))(jjnp.ones(3))),
        "vmap": (sl.vmap(lambda v: v * 2)(x), jax.vmap(lambda v: v * 2)(jjnp.ones(3))),
        "jit": (sl.jit(lambda v: jnp.sin(v))(x), jax.jit(lambda v: jjnp.sin(v))(jjnp.ones(3))),
    }
    for name, (got, want) in outs.items():
        assert isinstance(got, HostArray), name
        assert got.dtype == want.dtype and got.shape == want.shape, name


def test_under_set_mesh_host_results_stay_replicated_sharded_arrays():
    mesh = sl.make_mesh((2,), ("x",))
    with sl.set_mesh(mesh):
        y = jnp.arange(4)
    assert isinstance(y, sl.ShardedArray) and y.sharding.spec == sl.P()
    assert isinstance(jnp.arange(4), HostArray)


def test_mixing_with_a_sharded_array_gives_the_sharded_result():
    mesh = sl.make_mesh((2,), ("x",))
    s = sl.device_put(np.arange(4.0, dtype=np.float32), sl.NamedSharding(mesh, sl.P("x")))
    base = np.arange(4.0, dtype=np.float32)
    for out, want in ((jnp.ones(4) + s, base + 1), (s + jnp.ones(4), base + 1), (jnp.full((4,), 2.0) * s, base * 2)):
        assert isinstance(out, sl.ShardedArray) and out.sharding.spec == sl.P("x")
        assert out.dtype == np.float32
        np.testing.assert_array_equal(np.asarray(out), want)


def test_shards_of_a_sharded_array_are_arrays_on_their_device_as_jax():
    mesh, jmesh = sl.make_mesh((2,), ("x",)), jax.make_mesh((2,), ("x",))
    a = sl.device_put(np.arange(4), sl.NamedSharding(mesh, sl.P("x")))
    w = jax.device_put(np.arange(4), jax.NamedSharding(jmesh, jax.P("x")))
    for got, want in ((a.addressable_data(1), w.addressable_data(1)), (a.addressable_shards[1].data,
                                                                       w.addressable_shards[1].data)):
        assert isinstance(got, HostArray) and repr(got) == repr(want)
        assert got.committed == want.committed and got.device.id == want.device.id == 1
    assert repr(a.addressable_shards[1]).replace("VirtualDevice", "CpuDevice") == repr(w.addressable_shards[1])


_METHODS = [
    ("argmax", lambda m, x: x.argmax()), ("argmin axis", lambda m, x: x.argmin(axis=1)),
    ("argsort", lambda m, x: x.ravel().argsort()), ("max axis", lambda m, x: x.max(axis=0)),
    ("cumsum", lambda m, x: x.cumsum()), ("any", lambda m, x: (x > 2).any()), ("round", lambda m, x: x.round()),
    ("clip", lambda m, x: x.clip(0, 1)), ("dot", lambda m, x: x.dot(x.T)), ("std", lambda m, x: x.std()),
    ("prod int", lambda m, x: m.arange(1, 5).prod()), ("flatten", lambda m, x: x.flatten()),
    ("take", lambda m, x: x.ravel().take(m.array([0, 4]))), ("copy", lambda m, x: x.copy()),
    ("astype bool", lambda m, x: x.astype(bool)), ("abs", lambda m, x: abs(-x)),
    ("divmod", lambda m, x: divmod(m.arange(4), 3)[0]), ("nonzero", lambda m, x: x.ravel().nonzero()[0]),
    ("searchsorted", lambda m, x: x.ravel().searchsorted(2.5)),
]


@pytest.mark.parametrize("name,fn", _METHODS, ids=[n for n, _ in _METHODS])
def test_methods_match_jax(name, fn):
    got, want = fn(jnp, jnp.arange(6.0).reshape(2, 3)), fn(jjnp, jjnp.arange(6.0).reshape(2, 3))
    _same(got, want)
    assert repr(got) == repr(want)


def test_control_flow_results_on_host_data_match_jax():
    for name, run in (("scan", lambda j, m: j.lax.scan(lambda c, a: (c + a, a * 2), 0.0, m.ones(3))),
                      ("cond", lambda j, m: j.lax.cond(True, lambda x: x + 1, lambda x: x - 1, 10)),
                      ("map", lambda j, m: j.lax.map(lambda x: x * 2, m.arange(3)))):
        got, want = run(sl, jnp), run(jax, jjnp)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for g, w in zip(got, want):
            assert isinstance(g, HostArray), name
            assert repr(g) == repr(w), name
