"""shardlab.random against jax.random 0.10.2: the same bits for the same key, JAX's dtypes,
errors and output shardings."""

import warnings

import ml_dtypes
import numpy as np
import pytest

import shardlab as sl
from shardlab import P
from shardlab import random as R

jax = pytest.importorskip("jax")
jr = jax.random

pytestmark = pytest.mark.jax

SEEDS = [0, 2 ** 31 + 5]
SHAPES = [(), (7,), (2, 0, 3), (33, 129)]


def _bits_of(x):
    x = np.asarray(x)
    if x.dtype.kind == "f" or x.dtype == ml_dtypes.bfloat16:
        return x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.itemsize])
    return x


def assert_same(ours, theirs):
    """Same dtype, shape and bits (NaNs included)."""
    a, b = np.asarray(ours), np.asarray(theirs)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_array_equal(_bits_of(a), _bits_of(b))


def both(fn_name, *args, key_seed=0, **kwargs):
    return (getattr(R, fn_name)(R.key(key_seed), *args, **kwargs),
            getattr(jr, fn_name)(jr.key(key_seed), *args, **kwargs))


# --- keys -----------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, -1, 2 ** 31, 2 ** 32 + 5, 2 ** 40 + 7, -2 ** 40, 2 ** 63 - 1,
                                  np.int64(2 ** 40 + 7), np.uint32(2 ** 32 - 1), np.int32(-5), np.uint8(200), True])
def test_seed_data_matches_jax(seed):
    assert_same(R.PRNGKey(seed), jr.PRNGKey(seed))
    assert_same(R.key_data(R.key(seed)), jr.key_data(jr.key(seed)))


@pytest.mark.parametrize("seed", [2 ** 64, 1.5, np.float32(1), [1, 2], "seed"])
def test_bad_seeds_raise_jax_error_class(seed):
    with pytest.raises(Exception) as theirs:
        jr.PRNGKey(seed)
    with pytest.raises(type(theirs.value)):
        R.PRNGKey(seed)


def test_key_seed_of_a_key_is_a_type_error():
    with pytest.raises(TypeError, match="given a PRNG key"):
        R.key(R.key(0))


def test_typed_key_array_behaves_as_jax():
    k = R.key(0)
    jk = jr.key(0)
    assert str(k.dtype) == str(jk.dtype) == "key<fry>"
    assert k.shape == jk.shape == () and k.dtype.itemsize == jk.dtype.itemsize
    assert repr(k).splitlines()[0] == repr(jk).splitlines()[0]
    ks, jks = R.split(k, 3), jr.split(jk, 3)
    assert ks.shape == jks.shape == (3,)
    assert repr(ks).splitlines()[0] == repr(jks).splitlines()[0]
    assert_same(R.key_data(ks[1]), jr.key_data(jks[1]))
    assert_same(R.key_data(ks[1:]), jr.key_data(jks[1:]))
    assert [np.asarray(R.key_data(x)).tolist() for x in ks] == [np.asarray(jr.key_data(x)).tolist() for x in jks]
    assert len(ks) == 3
    np.testing.assert_array_equal(ks == ks, np.asarray(jks == jks))
    assert bool(R.key(5) == R.key(5)) and not bool(R.key(5) == R.key(6))
    assert R.key_impl(k) == jr.key_impl(jk) == "threefry2x32"
    assert R.key_impl(R.PRNGKey(0)) == "threefry2x32"
    assert str(R.key_dtype()) == str(jr.key_dtype()) == "key<fry>"
    with pytest.raises(TypeError, match="key_data"):
        np.asarray(k)
    with pytest.raises(TypeError):
        len(k)
    wrapped = R.wrap_key_data(np.asarray(R.key_data(ks)))
    assert wrapped.shape == (3,)
    assert_same(R.key_data(wrapped), jr.key_data(jr.wrap_key_data(jr.key_data(jks))))
    assert R.split(k, (2, 3)).reshape(6).shape == (6,)


def test_split_and_fold_in_chains_match_jax():
    for seed in SEEDS:
        k, jk = R.key(seed), jr.key(seed)
        rk, rjk = R.PRNGKey(seed), jr.PRNGKey(seed)
        for step in range(4):
            assert_same(R.key_data(k), jr.key_data(jk))
            assert_same(rk, rjk)
            k = R.fold_in(R.split(k, 5)[step], 17 * step + 3)
            jk = jr.fold_in(jr.split(jk, 5)[step], 17 * step + 3)
            rk = R.split(R.fold_in(rk, 2 ** 32 - 1 - step), 3)[step % 3]
            rjk = jr.split(jr.fold_in(rjk, 2 ** 32 - 1 - step), 3)[step % 3]
    for shape in [(), (1,), (2, 3), (0,), (2, 1, 3)]:
        assert_same(R.split(R.PRNGKey(7), shape), jr.split(jr.PRNGKey(7), shape))
        assert_same(R.key_data(R.split(R.key(7), shape)), jr.key_data(jr.split(jr.key(7), shape)))
    assert_same(R.fold_in(R.PRNGKey(1), 2.7), jr.fold_in(jr.PRNGKey(1), 2.7))
    assert_same(R.fold_in(R.PRNGKey(1), np.uint32(9)), jr.fold_in(jr.PRNGKey(1), np.uint32(9)))


# --- bits -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", None])
@pytest.mark.parametrize("shape", SHAPES)
def test_bits_match_jax(dtype, shape):
    for seed in SEEDS:
        assert_same(R.bits(R.key(seed), shape, dtype), jr.bits(jr.key(seed), shape, dtype))
    assert_same(R.bits(R.PRNGKey(3), shape, dtype), jr.bits(jr.PRNGKey(3), shape, dtype))


# --- float samplers -------------------------------------------------------------------------

FLOAT_SAMPLERS = {
    "uniform": lambda m, k, s, d: m.uniform(k, s, d),
    "uniform_range": lambda m, k, s, d: m.uniform(k, s, d, -2.5, 3.7),
    "normal": lambda m, k, s, d: m.normal(k, s, d),
    "exponential": lambda m, k, s, d: m.exponential(k, s, d),
    "laplace": lambda m, k, s, d: m.laplace(k, s, d),
    "gumbel": lambda m, k, s, d: m.gumbel(k, s, d),
    "logistic": lambda m, k, s, d: m.logistic(k, s, d),
    "truncated_normal": lambda m, k, s, d: m.truncated_normal(k, -1.3, 2.1, s, d),
}


@pytest.mark.parametrize("name", sorted(FLOAT_SAMPLERS))
@pytest.mark.parametrize("shape", SHAPES)
def test_float32_samplers_are_bit_equal(name, shape):
    fn = FLOAT_SAMPLERS[name]
    for seed in SEEDS:
        assert_same(fn(R, R.key(seed), shape, None), fn(jr, jr.key(seed), shape, None))
    assert_same(fn(R, R.PRNGKey(5), shape, "float32"), fn(jr, jr.PRNGKey(5), shape, "float32"))


BIT_EQUAL_SMALL = [("uniform", "float16"), ("uniform", "bfloat16"), ("uniform_range", "float16"),
                   ("uniform_range", "bfloat16"), ("normal", "float16"), ("normal", "bfloat16"),
                   ("exponential", "float16"), ("exponential", "bfloat16"), ("laplace", "float16"),
                   ("laplace", "bfloat16"), ("gumbel", "bfloat16"), ("logistic", "bfloat16"),
                   ("truncated_normal", "float16"), ("truncated_normal", "bfloat16"), ("gumbel", "float16"),
                   ("logistic", "float16")]


@pytest.mark.parametrize("name,dtype", BIT_EQUAL_SMALL)
def test_half_precision_samplers_are_bit_equal(name, dtype):
    fn = FLOAT_SAMPLERS[name]
    for seed in SEEDS[:2]:
        for shape in [(), (40, 25)]:
            assert_same(fn(R, R.key(seed), shape, dtype), fn(jr, jr.key(seed), shape, dtype))


def test_uniform_broadcasts_minval_and_maxval_as_jax():
    lo = np.array([[0.0], [10.0], [-5.0]], np.float32)
    hi = np.array([1.0, 2.0, 30.0, 40.0], np.float32)
    assert_same(R.uniform(R.key(3), (3, 4), minval=lo, maxval=hi), jr.uniform(jr.key(3), (3, 4), minval=lo, maxval=hi))
    with pytest.raises(ValueError, match="broadcast"):
        R.uniform(R.key(0), (3,), minval=np.zeros(4))


def test_complex_normal_matches_jax():
    assert_same(R.normal(R.key(2), (5, 7), "complex64"), jr.normal(jr.key(2), (5, 7), "complex64"))


def test_float64_request_is_float32_with_jax_warning():
    with pytest.warns(UserWarning, match="Explicitly requested dtype float64") as ours:
        x = R.uniform(R.key(0), (3,), np.float64)
    with pytest.warns(UserWarning, match="Explicitly requested dtype float64"):
        y = jr.uniform(jr.key(0), (3,), np.float64)
    assert_same(x, y)
    assert "truncated to dtype float32" in str(ours[0].message)


# --- integers and discrete ------------------------------------------------------------------

@pytest.mark.parametrize("dtype,lo,hi", [("int32", -3, 200), ("int32", -2 ** 31, 2 ** 31 - 1), ("int8", -100, 100),
                                         ("uint8", 0, 256), ("int16", 5, 5), ("uint32", 7, 3), ("uint16", 0, 70000)])
def test_randint_matches_jax(dtype, lo, hi):
    for shape in [(0,), (20, 31)]:
        assert_same(R.randint(R.key(1), shape, lo, hi, dtype), jr.randint(jr.key(1), shape, lo, hi, dtype))


def test_randint_array_and_float_bounds():
    lo = np.array([0, 10, 100], np.int32)
    assert_same(R.randint(R.key(2), (4, 3), lo, 1000), jr.randint(jr.key(2), (4, 3), lo, 1000))
    assert_same(R.randint(R.key(2), (5,), 0.5, 5.7), jr.randint(jr.key(2), (5,), 0.5, 5.7))
    with pytest.raises(TypeError, match="integer dtypes"):
        R.randint(R.key(0), (2,), 0, 5, "float32")


@pytest.mark.parametrize("mode", ["low", "high"])
def test_bernoulli_and_rademacher_match_jax(mode):
    for shape in [(30, 11)]:
        assert_same(R.bernoulli(R.key(4), 0.3, shape, mode), jr.bernoulli(jr.key(4), 0.3, shape, mode))
    p = np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4)
    assert_same(R.bernoulli(R.key(4), p, mode=mode), jr.bernoulli(jr.key(4), p, mode=mode))
    assert_same(R.rademacher(R.key(4), (9, 3)), jr.rademacher(jr.key(4), (9, 3)))
    with pytest.raises(TypeError, match="floating dtype"):
        R.bernoulli(R.key(0), 1, (2,))


def test_permutation_matches_jax():
    for n in [0, 5, 3000]:  # 3000 elements take two sorting rounds
        assert_same(R.permutation(R.key(6), n), jr.permutation(jr.key(6), n))
    x = np.arange(60.0, dtype=np.float32).reshape(5, 12)
    for axis in [0, 1, -1]:
        for independent in [False, True]:
            assert_same(R.permutation(R.key(6), x, axis, independent), jr.permutation(jr.key(6), x, axis, independent))
    with pytest.raises(TypeError, match="at least 1-dimensional"):
        R.permutation(R.key(0), 3.5)


def test_choice_matches_jax():
    k, jk = R.key(8), jr.key(8)
    a = np.arange(40, dtype=np.int32).reshape(10, 4)
    p = np.linspace(0.1, 1.0, 10, dtype=np.float32)
    p /= p.sum()
    for kwargs in [{}, {"replace": False}, {"p": p}, {"p": p, "replace": False}]:
        for shape in [(), (2, 3)]:
            assert_same(R.choice(k, 10, shape, **kwargs), jr.choice(jk, 10, shape, **kwargs))
        assert_same(R.choice(k, a, (3,), **kwargs), jr.choice(jk, a, (3,), **kwargs))
    assert_same(R.choice(k, a, (2,), axis=1, replace=False), jr.choice(jk, a, (2,), axis=1, replace=False))
    assert_same(R.choice(k, 5, (0,)), jr.choice(jk, 5, (0,)))
    with pytest.raises(ValueError, match="larger sample"):
        R.choice(k, 3, (5,), replace=False)
    with pytest.raises(ValueError, match="p must be None or a 1D vector"):
        R.choice(k, 3, (2,), p=np.ones(4) / 4)


def test_categorical_matches_jax():
    logits = np.log(np.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]], np.float32))
    for kwargs in [{}, {"axis": 0}, {"shape": (5, 2)}, {"shape": (2, 2), "replace": False}]:
        assert_same(R.categorical(R.key(9), logits, **kwargs), jr.categorical(jr.key(9), logits, **kwargs))


def test_high_dynamic_range_modes_match_jax():
    for dtype in ["float32", "bfloat16", "float16"]:
        assert_same(R.gumbel(R.key(1), (300,), dtype, mode="high"), jr.gumbel(jr.key(1), (300,), dtype, mode="high"))
    logits = np.log(np.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]], np.float32))
    assert_same(R.categorical(R.key(9), logits, shape=(4, 2), mode="high"),
                jr.categorical(jr.key(9), logits, shape=(4, 2), mode="high"))
    p = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    assert_same(R.choice(R.key(3), 4, (2,), replace=False, p=p, mode="high"),
                jr.choice(jr.key(3), 4, (2,), replace=False, p=p, mode="high"))


def test_x64_seeds_keep_the_high_word():
    jax.config.update("jax_enable_x64", True)
    try:
        with sl.dtypes.x64_scope(True):
            for seed in [2 ** 40 + 7, -1, -2 ** 40, np.int32(-5), np.uint32(7), np.int64(-3)]:
                assert_same(R.PRNGKey(seed), jr.PRNGKey(seed))
    finally:
        jax.config.update("jax_enable_x64", False)


def test_multivariate_normal_and_orthogonal_close_to_jax():
    mean = np.array([1.0, -2.0, 0.5], np.float32)
    cov = np.array([[2.0, 0.3, 0.1], [0.3, 1.0, 0.2], [0.1, 0.2, 0.5]], np.float32)
    for method in ["cholesky", "svd"]:
        ours = R.multivariate_normal(R.key(1), mean, cov, (50,), method=method)
        theirs = jr.multivariate_normal(jr.key(1), mean, cov, (50,), method=method)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        if method == "cholesky":  # svd/eigh factors are unique only up to signs and order
            np.testing.assert_allclose(ours, theirs, rtol=2e-5, atol=2e-5)
    q, jq = R.orthogonal(R.key(2), 4, (2,)), jr.orthogonal(jr.key(2), 4, (2,))
    np.testing.assert_allclose(q, jq, atol=2e-5)
    assert R.orthogonal(R.key(2), 3, m=5).shape == jr.orthogonal(jr.key(2), 3, m=5).shape == (3, 5)


@pytest.mark.parametrize("name", ["gamma", "loggamma", "beta", "dirichlet", "poisson"])
def test_unmatched_samplers_say_what_to_use(name):
    with pytest.raises(NotImplementedError, match=f"jax.random.{name}.*JAX"):
        getattr(R, name)(R.key(0), 2.0)


# --- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [0, [0, 0], np.zeros(2, np.float32), np.zeros(3, np.uint32)])
def test_non_keys_raise_jax_error_class(bad):
    with pytest.raises(Exception) as theirs:
        jr.normal(bad, (2,))
    with pytest.raises(type(theirs.value)) as ours:
        R.normal(bad, (2,))
    assert str(ours.value).split(":")[0] == str(theirs.value).split(":")[0]


def test_batched_keys_where_jax_refuses_them():
    for fn in [lambda k: R.normal(k, (2,)), lambda k: R.split(k), lambda k: R.fold_in(k, 1)]:
        with pytest.raises(ValueError, match=r"accepts a single key, but was given a key array of shape \(2,\)"):
            fn(R.split(R.key(0)))
    with pytest.raises(TypeError, match="fold_in accepts a scalar"):
        R.fold_in(R.key(0), np.arange(3))
    with pytest.raises(ValueError, match="non-negative"):
        R.split(R.key(0), -1)
    with pytest.raises(TypeError):
        R.split(R.key(0), 2.5)


@pytest.mark.parametrize("call", [lambda m: m.uniform(m.key(0), (2,), "int32"),
                                  lambda m: m.normal(m.key(0), (2,), "int32"),
                                  lambda m: m.bits(m.key(0), (2,), "int32"),
                                  lambda m: m.randint(m.key(0), (2,), 0, 5, "float32"),
                                  lambda m: m.gumbel(m.key(0), (2,), mode="medium")])
def test_bad_dtypes_raise_as_jax(call):
    with pytest.raises(Exception) as theirs:
        call(jr)
    with pytest.raises(type(theirs.value)) as ours:
        call(R)
    assert str(ours.value) == str(theirs.value)


def test_non_numeric_parameters_are_type_errors_as_jax():
    for call in [lambda m: m.uniform(m.key(0), (2,), minval="a"), lambda m: m.randint(m.key(0), (2,), "a", 5)]:
        with pytest.raises(TypeError):
            call(jr)
        with pytest.raises(TypeError):
            call(R)
    assert_same(R.randint(R.key(0), (3,), 1j, 5), jr.randint(jr.key(0), (3,), 1j, 5))


# --- sharding -------------------------------------------------------------------------------

def test_out_sharding_and_set_mesh_match_jax():
    mesh, jmesh = sl.make_mesh((4, 2), ("x", "y")), jax.make_mesh((4, 2), ("x", "y"))
    JP = jax.sharding.PartitionSpec
    cases = [lambda m, k, P: m.normal(k, (8, 4), out_sharding=P("x", "y")),
             lambda m, k, P: m.uniform(k, (8, 4), out_sharding=P("x")),
             lambda m, k, P: m.bernoulli(k, 0.5, (8, 4), out_sharding=P(None, "y")),
             lambda m, k, P: m.randint(k, (8,), 0, 9, out_sharding=P("x")),
             lambda m, k, P: m.permutation(k, 8, out_sharding=P("x")),
             lambda m, k, P: m.normal(k, (8, 4)),
             lambda m, k, P: m.normal(k, ()),
             lambda m, k, P: m.bits(k, (8,)),
             lambda m, k, P: m.PRNGKey(3)]
    for case in cases:
        with sl.set_mesh(mesh):
            ours = case(R, R.key(0), P)
        with jax.set_mesh(jmesh):
            theirs = case(jr, jr.key(0), JP)
        assert isinstance(ours, sl.ShardedArray)
        assert tuple(ours.sharding.spec) == tuple(theirs.sharding.spec)
        assert_same(ours, theirs)
        assert_same(ours, case(R, R.key(0), lambda *_: None) if case is not cases[-1] else R.PRNGKey(3))
    named = sl.NamedSharding(mesh, P("y"))
    assert R.normal(R.key(0), (4,), out_sharding=named).sharding == named
    assert isinstance(R.normal(R.key(0), (4,)), np.ndarray)
    with pytest.raises(ValueError, match="not under a mesh context"):
        R.normal(R.key(0), (8,), out_sharding=P("x"))


def test_auto_meshes_and_mesh_mismatch_as_jax():
    from shardlab.sharding import AxisType
    auto = sl.make_mesh((4, 2), ("x", "y"), (AxisType.Auto,) * 2)
    jauto = jax.make_mesh((4, 2), ("x", "y"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    with sl.set_mesh(auto):
        ours = R.normal(R.key(0), (8, 4))
        with pytest.raises(ValueError, match="cannot contain axis names that are of type Auto"):
            R.normal(R.key(0), (8, 4), out_sharding=P("x"))
    with jax.set_mesh(jauto):
        theirs = jr.normal(jr.key(0), (8, 4))
    assert tuple(ours.sharding.spec) == tuple(theirs.sharding.spec)
    assert_same(ours, theirs)
    with sl.set_mesh(sl.make_mesh((4, 2), ("x", "y"))):
        with pytest.raises(ValueError, match="should match the mesh"):
            R.normal(R.key(0), (8, 4), out_sharding=sl.NamedSharding(sl.make_mesh((2, 4), ("x", "y")), P("x")))
    with pytest.raises(TypeError, match="only supports instances of `NamedSharding` or `PartitionSpec`"):
        R.normal(R.key(0), (8,), out_sharding="x")


def test_keys_inside_shard_map_and_jit():
    mesh = sl.make_mesh((4, 2), ("x", "y"))
    key = R.PRNGKey(3)
    out = sl.shard_map(lambda k: R.normal(k, (2,)), mesh=mesh, in_specs=P(), out_specs=P())(key)
    assert_same(out, jr.normal(jr.PRNGKey(3), (2,)))

    def per_device(k):
        return R.normal(R.fold_in(k, sl.lax.axis_index("x")), (1, 2))
    out = sl.shard_map(per_device, mesh=mesh, in_specs=P(), out_specs=P("x"))(key)
    expect = np.concatenate([np.asarray(jr.normal(jr.fold_in(jr.PRNGKey(3), i), (1, 2))) for i in range(4)])
    assert_same(out, expect)

    keys = R.split(key, 4)
    out = sl.shard_map(lambda k: R.uniform(k[0], (1, 3)), mesh=mesh, in_specs=P("x"), out_specs=P("x"))(keys)
    expect = np.concatenate([np.asarray(jr.uniform(k, (1, 3))) for k in jr.split(jr.PRNGKey(3), 4)])
    assert_same(out, expect)

    assert_same(sl.jit(lambda k: R.normal(k, (3,)))(key), jr.normal(jr.PRNGKey(3), (3,)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(sl.jit(lambda k: R.uniform(R.wrap_key_data(k), (3,)))(key), jr.uniform(jr.PRNGKey(3), (3,)))
