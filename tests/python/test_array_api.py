"""A global ShardedArray behaves as a jax.Array (repr/str, scalar conversions, iteration,
shards, methods), ``shardlab.Array`` for isinstance, device_put of pytrees, the small ``jax``
namespace functions (devices, process_index, ...) and config flags; compared with JAX 0.10."""

import numpy as np
import pytest

import shardlab as sl
import shardlab.numpy as jnp
from shardlab import P
from shardlab.sharding import NamedSharding, SingleDeviceSharding

jaxmark = pytest.mark.jax


@pytest.fixture(scope="module")
def jax():
    return pytest.importorskip("jax")


def _pair(jax, x, spec, shape=(2, 4), types=None):
    """The same value placed with the same sharding in shardlab and in JAX."""
    mesh = sl.make_mesh(shape, ("X", "Y"), types)
    jtypes = None if types is None else tuple(getattr(jax.sharding.AxisType, t.name) for t in types)
    jmesh = jax.make_mesh(shape, ("X", "Y"), jtypes)
    return (sl.device_put(x, NamedSharding(mesh, spec)),
            jax.device_put(x, jax.sharding.NamedSharding(jmesh, jax.P(*spec.partitions))))


# -- repr and str --------------------------------------------------------------------------------
VALUES = [np.arange(32.0, dtype=np.float32).reshape(8, 4), np.arange(8, dtype=np.int32), np.zeros((0, 4), np.float32),
          np.ones((4, 2), sl.dtypes.bfloat16), np.arange(-4, 4, dtype=np.int8),
          np.array([True, False] * 4), np.float32(3.5), np.linspace(-1e6, 1e6, 64, dtype=np.float32).reshape(8, 8)]


@jaxmark
@pytest.mark.parametrize("i", range(len(VALUES)))
def test_repr_is_jax_s_followed_by_the_sharding_and_str_is_jax_s(jax, i):
    x = VALUES[i]
    spec = P("X") if x.ndim and x.shape[0] % 2 == 0 and x.shape[0] else P()
    a, j = _pair(jax, x, spec)
    assert repr(a) == f"{repr(j)[:-1]}, sharding={a.sharding})"
    assert str(a) == str(j)
    assert str(a.sharding) == str(j.sharding)  # the sharding part reads as JAX prints it


@jaxmark
@pytest.mark.parametrize("value", [3.5, 2, True, np.float32(1.5)], ids=repr)
def test_a_placed_python_scalar_is_weakly_typed_as_in_jax(jax, value):
    a, j = _pair(jax, value, P())
    assert a.weak_type == j.weak_type and repr(a) == f"{repr(j)[:-1]}, sharding={a.sharding})"
    assert str(sl.typeof(a)) == str(jax.typeof(j))


def test_abstract_arrays_keep_a_shape_dtype_struct_repr():
    m = sl.make_mesh((4,), ("x",), abstract=True)
    seen = []
    sl.eval_shape(lambda v: seen.append(repr(v)) or v,
                  sl.ShapeDtypeStruct((8,), np.float32, sharding=NamedSharding(m, P("x"))))
    assert seen and seen[0].startswith("ShapeDtypeStruct(shape=(8,), dtype=float32, sharding=NamedSharding(")


# -- scalar conversions, iteration, len, hash -------------------------------------------------------
@jaxmark
def test_scalar_conversions_and_their_errors_match_jax(jax):
    a, j = _pair(jax, np.arange(8.0, dtype=np.float32), P("X"))
    s, js = _pair(jax, np.float32(2.5), P())
    i, ji = _pair(jax, np.int32(3), P())
    assert float(s) == float(js) and int(s) == int(js) and complex(s) == complex(js) and bool(s) == bool(js)
    assert i.__index__() == ji.__index__() == 3 and [10, 20, 30, 40][i] == 40
    assert s.item() == js.item() and a.item(3) == j.item(3) and a.tolist() == j.tolist()
    assert f"{s:.2f}" == f"{js:.2f}" == "2.50" and len(a) == len(j) == 8
    for op in (float, int, complex, lambda v: v.__index__(), bool, len, hash, iter):
        for target in ((a, j), (s, js)):
            try:
                op(target[1])
            except Exception as e:  # noqa: BLE001 - whatever JAX raises, shardlab must raise the same
                with pytest.raises(type(e)) as ours:
                    op(target[0])
                if op is not hash:
                    assert str(ours.value) == str(e)
            else:
                op(target[0])
    empty, jempty = _pair(jax, np.zeros((0,), np.float32), P())
    with pytest.raises(ValueError) as theirs:
        bool(jempty)
    with pytest.raises(ValueError, match=theirs.value.args[0][:30]):
        bool(empty)
    with pytest.raises(TypeError, match="unhashable"):
        hash(a)
    with pytest.raises(TypeError, match="Only integer scalar arrays"):
        s.__index__()


@jaxmark
def test_iteration_gives_the_rows(jax):
    if not hasattr(sl.ShardedArray, "__getitem__"):
        pytest.xfail("ShardedArray indexing (shardlab.numpy's global indexing) is not registered")
    a, j = _pair(jax, np.arange(16.0, dtype=np.float32).reshape(8, 2), P(None, "X"))
    rows = list(a)
    assert len(rows) == 8 and all(isinstance(r, sl.Array) for r in rows)
    np.testing.assert_array_equal(np.stack([np.asarray(r) for r in rows]), np.stack([np.asarray(r) for r in j]))


# -- devices, shards and the rest of jax.Array's interface ------------------------------------------
@jaxmark
@pytest.mark.parametrize("spec", [P("X", "Y"), P(), P("Y")])
def test_placement_queries_match_jax(jax, spec):
    a, j = _pair(jax, np.arange(32.0, dtype=np.float32).reshape(8, 4), spec)
    assert a.block_until_ready() is a and j.block_until_ready() is j
    assert a.copy_to_host_async() is None and j.copy_to_host_async() is None
    assert (a.is_fully_addressable, a.is_fully_replicated, a.committed) == \
        (j.is_fully_addressable, j.is_fully_replicated, j.committed)
    assert {d.id for d in a.devices()} == {d.id for d in j.devices()}
    assert [(s.device.id, s.index, s.replica_id) for s in a.global_shards] == \
        [(s.device.id, s.index, s.replica_id) for s in j.global_shards]
    for ours, theirs in zip(a.addressable_shards, j.addressable_shards):
        np.testing.assert_array_equal(ours.data, np.asarray(theirs.data))
    assert a.format.sharding == a.sharding and j.format.sharding == j.sharding
    for name in ("device_buffer", "device_buffers"):
        with pytest.raises(AttributeError) as theirs:
            getattr(j, name)
        with pytest.raises(AttributeError) as ours:
            getattr(a, name)
        assert str(ours.value) == str(theirs.value)
    assert (a.weak_type, a.itemsize, a.nbytes, a.size, a.ndim) == (j.weak_type, j.itemsize, j.nbytes, j.size, j.ndim)
    assert repr(a.aval) == repr(j.aval) and a.device == a.sharding and str(j.device) == str(j.sharding)
    c, jc = a.copy(), j.copy()
    assert c is not a and c.sharding == a.sharding and str(jc.sharding) == str(c.sharding)
    np.testing.assert_array_equal(np.asarray(c), np.asarray(jc))
    moved = a.to_device(NamedSharding(a.sharding.mesh, P()))
    assert moved.sharding.spec == P() and np.array_equal(np.asarray(moved), np.asarray(a))


# -- isinstance(x, shardlab.Array) ------------------------------------------------------------------
def test_array_covers_global_local_and_host_arrays():
    mesh = sl.make_mesh((4,), ("x",))
    a = sl.device_put(np.ones(8, np.float32), NamedSharding(mesh, P("x")))
    seen = []
    sl.shard_map(lambda v: seen.append(isinstance(v, sl.Array)) or v, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(a)
    assert isinstance(a, sl.Array) and seen == [True] and issubclass(sl.ShardedArray, sl.Array)
    assert isinstance(jnp.ones(3), sl.Array) and isinstance(jnp.sum(jnp.ones(3)), sl.Array)
    for other in ([1.0], 1.0, "a", None, P()):
        assert not isinstance(other, sl.Array)
    with pytest.raises(TypeError, match="cannot be instantiated"):
        sl.Array()


# -- methods delegating to shardlab.numpy -----------------------------------------------------------
def _x():
    return np.arange(1.0, 33.0, dtype=np.float32).reshape(8, 4) / 7


# name → (call on a ShardedArray / jax.Array); the result is compared with JAX's
METHODS = {
    "sum": lambda v: v.sum(), "sum_axis": lambda v: v.sum(axis=0), "sum_keepdims": lambda v: v.sum(1, keepdims=True),
    "mean": lambda v: v.mean(axis=1), "max": lambda v: v.max(axis=0), "min": lambda v: v.min(),
    "prod": lambda v: v.prod(axis=1), "any": lambda v: (v > 3).any(axis=0), "all": lambda v: (v > 0).all(),
    "std": lambda v: v.std(axis=0), "var": lambda v: v.var(ddof=1), "argmax": lambda v: v.argmax(axis=0),
    "argmin": lambda v: v.argmin(), "cumsum": lambda v: v.cumsum(axis=1), "reshape": lambda v: v.reshape(4, 8),
    "reshape_tuple": lambda v: v.reshape((32,)), "astype": lambda v: v.astype(np.int32),
    "transpose": lambda v: v.transpose(), "transpose_axes": lambda v: v.transpose(1, 0), "T": lambda v: v.T,
    "mT": lambda v: v.mT, "flatten": lambda v: v.flatten(), "ravel": lambda v: v.ravel(),
    "squeeze": lambda v: v.reshape(8, 1, 4).squeeze(1), "swapaxes": lambda v: v.swapaxes(0, 1),
    "clip": lambda v: v.clip(1.0, 3.0), "round": lambda v: v.round(2), "conj": lambda v: v.conj(),
    "real": lambda v: v.real, "imag": lambda v: v.imag, "dot": lambda v: v.dot(v.T),
    "nonzero": lambda v: (v > 4).nonzero()[1], "sort": lambda v: (-v).sort(axis=0), "argsort": lambda v: (-v).argsort(axis=1),
    "take": lambda v: v.take(np.array([0, 2]), axis=1), "repeat": lambda v: v.repeat(2, axis=1),
    "at_set": lambda v: v.at[0, 1].set(5.0), "at_add": lambda v: v.at[:, 0].add(1.0),
}
# Methods whose shardlab.numpy function does not yet do on global ShardedArrays what JAX does
# (the jnp rules are other work of issue #24); xfail(strict=False) so they count once it lands.
PENDING: dict = {}


def _method_params():
    for name in METHODS:
        marks = [pytest.mark.xfail(strict=False, reason=PENDING[name])] if name in PENDING else []
        yield pytest.param(name, marks=[jaxmark, *marks], id=name)


@pytest.mark.parametrize("name", list(_method_params()))
def test_methods_give_jax_s_values_and_dtypes(name, jax):
    a, j = _pair(jax, _x(), P("X", "Y"))
    with jax.set_mesh(j.sharding.mesh):  # explicit-sharding programs run under set_mesh
        try:
            theirs = METHODS[name](j)
        except Exception as e:  # noqa: BLE001 - a call JAX refuses must be refused with the same class
            with sl.set_mesh(a.sharding.mesh), pytest.raises(Exception) as ours:
                METHODS[name](a)
            assert type(ours.value).__name__ == type(e).__name__
            return
    with sl.set_mesh(a.sharding.mesh):
        ours = METHODS[name](a)
    assert isinstance(ours, sl.Array)
    assert np.asarray(ours).dtype == np.asarray(theirs).dtype
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-5, atol=1e-6)


def test_methods_have_jax_s_signatures():
    import inspect

    assert list(inspect.signature(sl.ShardedArray.sum).parameters) == [
        "self", "axis", "dtype", "out", "keepdims", "initial", "where", "promote_integers"]
    assert list(inspect.signature(sl.ShardedArray.argsort).parameters) == [
        "self", "axis", "kind", "order", "stable", "descending"]


def test_a_method_passes_only_the_options_it_was_given(monkeypatch):
    calls = []
    monkeypatch.setattr(jnp, "cumsum", lambda x, **kw: calls.append(kw) or "called", raising=False)
    a = sl.device_put(_x(), NamedSharding(sl.make_mesh((2,), ("X",)), P("X")))
    assert a.cumsum() == "called" and a.cumsum(axis=1, dtype=np.float32) == "called"
    assert calls == [{}, {"axis": 1, "dtype": np.float32}]
    # required parameters go by position (numpy and jax.numpy name them differently)
    monkeypatch.setattr(jnp, "swapaxes", lambda x, a, b: (a, b))
    assert a.swapaxes(0, 1) == (0, 1) and a.swapaxes(axis2=0, axis1=1) == (1, 0)
    with pytest.raises(TypeError):
        a.swapaxes(0, 1, 2)  # JAX's signature is checked


# -- device_put ------------------------------------------------------------------------------------
@jaxmark
def test_device_put_of_a_pytree_with_a_pytree_of_shardings(jax):
    mesh, jmesh = sl.make_mesh((2, 4), ("X", "Y")), jax.make_mesh((2, 4), ("X", "Y"))
    tree = {"w": np.ones((8, 4)), "b": [np.arange(4), np.float64(2.0)]}
    specs = {"w": P("X", "Y"), "b": [P("Y"), P()]}
    ours = sl.device_put(tree, {"w": NamedSharding(mesh, specs["w"]), "b": [NamedSharding(mesh, s) for s in specs["b"]]})
    theirs = jax.device_put(tree, {"w": jax.sharding.NamedSharding(jmesh, jax.P("X", "Y")),
                                   "b": [jax.sharding.NamedSharding(jmesh, jax.P(*s.partitions)) for s in specs["b"]]})
    for o, t in zip(sl.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        assert isinstance(o, sl.ShardedArray) and o.dtype == t.dtype and o.shape == t.shape
        assert o.sharding.spec.partitions == t.sharding.spec.partitions
        np.testing.assert_array_equal(np.asarray(o), np.asarray(t))
    with sl.set_mesh(mesh), jax.set_mesh(jmesh):  # bare specs under set_mesh; a prefix pytree
        ours = sl.device_put(tree, {"w": P("X"), "b": P()})
        theirs = jax.device_put(tree, {"w": jax.P("X"), "b": jax.P()})
    assert [(o.sharding.spec.partitions, o.dtype) for o in sl.tree_util.tree_leaves(ours)] == \
        [(t.sharding.spec.partitions, t.dtype) for t in jax.tree_util.tree_leaves(theirs)]


@jaxmark
def test_device_put_without_a_sharding_or_to_one_device(jax):
    mesh, jmesh = sl.make_mesh((2, 4), ("X", "Y")), jax.make_mesh((2, 4), ("X", "Y"))
    x = np.arange(6.0).reshape(2, 3)
    for ours, theirs in ((sl.device_put(x), jax.device_put(x)),
                         (sl.device_put(x, sl.devices()[3]), jax.device_put(x, jax.devices()[3])),
                         (sl.device_put(x, SingleDeviceSharding(sl.devices()[1])),
                          jax.device_put(x, jax.sharding.SingleDeviceSharding(jax.devices()[1])))):
        assert isinstance(ours, np.ndarray) and ours.dtype == theirs.dtype == np.float32  # host data, canonical dtype
        np.testing.assert_array_equal(ours, np.asarray(theirs))
    with sl.set_mesh(mesh), jax.set_mesh(jmesh):
        ours, theirs = sl.device_put(x), jax.device_put(x)
    assert ours.dtype == theirs.dtype and isinstance(theirs.sharding, jax.sharding.SingleDeviceSharding)
    a = sl.device_put(x, NamedSharding(mesh, P("X")))
    assert sl.device_put(a) is a and sl.device_put(a, NamedSharding(mesh, P("X"))) is a
    lst, jlst = sl.device_put([1.0, 2.0]), jax.device_put([1.0, 2.0])  # a list is a pytree, as in JAX
    assert isinstance(lst, list) and len(lst) == len(jlst) == 2 and [float(v) for v in lst] == [float(v) for v in jlst]
    np.testing.assert_array_equal(sl.device_get({"a": a})["a"], x.astype(np.float32))


@jaxmark
def test_device_put_errors(jax):
    mesh = sl.make_mesh((2, 4), ("X", "Y"))
    with pytest.raises(ValueError) as theirs:
        jax.device_put(np.ones(8), jax.sharding.NamedSharding(jax.make_mesh((2, 4), ("X", "Y")), jax.P("Z")))
    with pytest.raises(ValueError, match="unknown mesh axis 'Z'"):
        sl.device_put(np.ones(8), NamedSharding(mesh, P("Z")))
    assert "Z" in str(theirs.value)
    with pytest.raises(ValueError, match="no mesh is set"):  # a bare spec without set_mesh (JAX: ValueError too)
        sl.device_put(np.ones(8), P("X"))
    with pytest.raises(ValueError, match=r"^\[device_put\] the device argument dict keys \['b'\] differ"):
        sl.device_put({"a": np.ones(2)}, {"b": NamedSharding(mesh, P())})
    with pytest.raises(ValueError):
        jax.device_put({"a": np.ones(2)}, {"b": jax.sharding.NamedSharding(jax.make_mesh((2, 4), ("X", "Y")), jax.P())})


# -- the jax namespace functions and config ------------------------------------------------------
@jaxmark
def test_device_and_process_functions_match_jax(jax):
    assert [d.id for d in sl.devices()] == [d.id for d in jax.devices()]
    assert [d.id for d in sl.local_devices()] == [d.id for d in jax.local_devices()]
    assert (sl.device_count(), sl.local_device_count(), sl.process_index(), sl.process_count(), sl.default_backend()) \
        == (jax.device_count(), jax.local_device_count(), jax.process_index(), jax.process_count(), jax.default_backend())
    assert sl.devices("cpu") == sl.devices() and sl.devices()[0].platform == jax.devices()[0].platform
    assert sl.devices()[0].process_index == jax.devices()[0].process_index
    with pytest.raises(RuntimeError):
        jax.devices("tpu")
    with pytest.raises(RuntimeError, match="Unknown backend 'tpu'"):
        sl.devices("tpu")


@jaxmark
def test_config_accepts_platform_flags_and_rejects_unknown_ones_as_jax(jax):
    for name, value in (("jax_platforms", "cpu"), ("jax_platform_name", "cpu"), ("jax_use_shardy_partitioner", True)):
        jax.config.update(name, value)  # JAX accepts each (the values are its defaults here)
        sl.config.update(name, value)
        assert getattr(sl.config, name) == value
    with pytest.raises(AttributeError) as theirs:
        jax.config.update("jax_no_such_flag", 1)
    with pytest.raises(AttributeError) as ours:
        sl.config.update("jax_no_such_flag", 1)
    assert str(ours.value).startswith(str(theirs.value))
    sl.config.update("jax_num_cpu_devices", 4)
    try:
        assert sl.device_count() == 4 == sl.config.jax_num_cpu_devices and len(sl.devices()) == 4
    finally:
        sl.config.update("jax_num_cpu_devices", 8)
