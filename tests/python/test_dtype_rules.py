"""jax.numpy's dtype rules on per-device values, compared with JAX itself (x64 off, and on).

LocalArrays are built directly on their storage, so every dtype JAX has on the CPU reaches
the ops as it is (what enters shard_map is canonicalized by the transforms layer).
"""

import ml_dtypes
import numpy as np
import pytest

import shardlab as sl
import shardlab.numpy as snp

jax = pytest.importorskip("jax")
jnp = jax.numpy
pytestmark = pytest.mark.jax

DTYPES = [np.dtype(d) for d in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                np.uint32, np.uint64, np.float16, ml_dtypes.bfloat16, np.float32, np.float64)]
MESH = sl.make_mesh((2,), ("x",))


def values(dtype, n=3):
    base = np.array([1, 2, 3][:n])
    return (base % 2).astype(dtype) if dtype == np.bool_ else base.astype(dtype)


def local(a):
    """A LocalArray varying along x: device i holds a + i."""
    a = np.asarray(a)
    st = np.stack([a, a if a.dtype == np.bool_ else a + a.dtype.type(1)])
    return sl.LocalArray(st, MESH)


def sds(a):
    return jax.ShapeDtypeStruct(np.shape(a), jnp.asarray(a).dtype)


def jax_dtype(fn, *args):
    """JAX's result dtype, traced without compiling (fast)."""
    return jax.eval_shape(fn, *[sds(a) for a in args]).dtype


# Values are compared with JAX on these dtypes (compiling every dtype would take minutes).
VALUE_DTYPES = (np.dtype(np.int32), np.dtype(np.uint8), np.dtype(np.bool_), np.dtype(ml_dtypes.bfloat16))


def check(got, fn, a):
    a = np.asarray(a)
    assert got.dtype == jax_dtype(fn, a), (got.dtype, jax_dtype(fn, a))
    if a.dtype in VALUE_DTYPES:
        b = a if a.dtype == np.bool_ else a + a.dtype.type(1)
        for i, v in enumerate((a, b)):
            w = np.asarray(fn(jnp.asarray(v)))
            np.testing.assert_allclose(got.storage[i].astype(np.float64), w.astype(np.float64), rtol=1e-2)


BINARY = [(np.add, jnp.add), (np.multiply, jnp.multiply), (np.maximum, jnp.maximum), (np.true_divide, jnp.true_divide)]


@pytest.mark.parametrize("da", DTYPES, ids=str)
def test_binary_promotion_of_every_pair_matches_jax(da):
    """Every pair of dtypes, through add, multiply, maximum, true_divide and equal."""
    for db in DTYPES:
        a, b = values(da), values(db)
        for ours, theirs in BINARY:
            if da == db == np.bool_ and ours in (np.add, np.true_divide):
                continue
            got = ours(local(a), local(b))
            want_dtype = jax_dtype(theirs, a, b)
            assert got.dtype == want_dtype, (ours.__name__, da, db, got.dtype, want_dtype)
        assert np.equal(local(a), local(b)).dtype == np.bool_


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_weak_python_scalars_match_jax(dtype):
    a = values(dtype)
    for scalar in (2, 2.0):
        if dtype == np.bool_ and scalar == 2:
            continue
        got = local(a) * scalar
        want = jax_dtype(lambda v: v * scalar, a)
        assert got.dtype == want, (dtype, scalar, got.dtype, want)
        got = scalar + local(a)
        assert got.dtype == jax_dtype(lambda v: scalar + v, a)


UNARY = ["tanh", "exp", "sqrt", "log1p", "sin", "negative", "absolute", "floor", "square", "reciprocal", "sign"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unary_functions_match_jax(dtype):
    for name in UNARY:
        if dtype == np.bool_ and name in ("negative", "sign", "square"):
            continue
        a = values(dtype)
        got = getattr(snp, name)(local(a))
        check(got, getattr(jnp, name), a)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reductions_match_jax(dtype):
    a = values(dtype)
    for name in ("sum", "mean", "prod", "max", "argmax", "cumsum", "var"):
        got = getattr(snp, name)(local(a), axis=0)
        check(got, lambda v: getattr(jnp, name)(v, axis=0), a)


def test_named_cases_from_the_fuzz_run():
    i32 = local(np.array([1, 2, 4], np.int32))
    assert snp.mean(i32).dtype == np.float32
    assert np.tanh(i32).dtype == np.float32
    assert (local(np.array([1, 2], np.uint8)) + 3).dtype == np.uint8
    assert snp.sum(local(np.array([1, 2], np.int8))).dtype == np.int32
    assert (local(np.ones(2, np.float64)) * 2.0).dtype == np.float32
    assert snp.astype(i32, np.float64).dtype == np.float32


def test_where_and_concatenate_promote_as_jax():
    a, b = values(np.int8), values(np.uint8)
    got = snp.where(local(a) > 1, local(a), local(b))
    assert got.dtype == jnp.where(jnp.asarray(a) > 1, jnp.asarray(a), jnp.asarray(b)).dtype
    got = snp.concatenate([local(values(ml_dtypes.bfloat16)), local(values(np.float16))])
    assert got.dtype == jnp.concatenate([jnp.asarray(values(ml_dtypes.bfloat16)), jnp.asarray(values(np.float16))]).dtype


def test_enable_x64_follows_jax():
    pairs = [(np.int32, np.int64), (np.float32, np.float64), (np.uint32, np.int32), (np.int8, np.uint64)]
    sl.config.update("enable_x64", True)
    try:
        assert sl.config.enable_x64
        with jax.enable_x64(True):
            for da, db in pairs:
                got = np.add(local(values(da)), local(values(db)))
                assert got.dtype == jnp.add(jnp.asarray(values(da)), jnp.asarray(values(db))).dtype
            a = values(np.int32)
            assert snp.sum(local(a)).dtype == jnp.sum(jnp.asarray(a)).dtype == np.int64
            assert snp.mean(local(a)).dtype == jnp.mean(jnp.asarray(a)).dtype
            assert (local(a) * 1.5).dtype == (jnp.asarray(a) * 1.5).dtype == np.float64
    finally:
        sl.config.update("enable_x64", False)
    assert not sl.config.enable_x64
    assert np.add(local(values(np.int32)), local(values(np.int64))).dtype == np.int32


def test_bad_x64_value_and_unknown_dtype_are_clear():
    with pytest.raises(ValueError, match=r"\[config.update\] enable_x64 must be True or False"):
        sl.config.update("enable_x64", 1)
    with pytest.raises(TypeError, match=r"\[add\].*complex"):
        np.add(local(values(np.float32)), local(np.ones(3, np.complex64)))
