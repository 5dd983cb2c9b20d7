"""shardlab.numpy covers jax.numpy: the generated coverage table is current, the compositions
and the fallback agree with numpy on every device's block, gradients agree with JAX and with
finite differences, shardlab.nn agrees with jax.nn, and the collective matmul written with
jnp.tile runs as in JAX."""

import pathlib
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import shardlab as sl
import shardlab.nn as snn
import shardlab.numpy as snp
from shardlab import P

ROOT = pathlib.Path(__file__).resolve().parents[2]
MESH = sl.make_mesh((2,), ("x",))


def per_device(fn, *arrays, out_spec=P("x"), check_vma=False):
    """fn inside shard_map on arrays split over x (one block per device), and the numpy
    reference applied block by block."""
    f = sl.shard_map(fn, mesh=MESH, in_specs=(P("x"),) * len(arrays), out_specs=out_spec, check_vma=check_vma)
    return f(*arrays)


def blocks(a):
    return np.split(np.asarray(a), 2)


RNG = np.random.default_rng(0)
X = RNG.normal(size=(4, 3, 5)).astype(np.float32)
SQ = RNG.normal(size=(6, 3, 3)).astype(np.float32)


# -- the table ------------------------------------------------------------------------------------
@pytest.mark.jax
def test_coverage_table_is_current_and_complete():
    pytest.importorskip("jax")
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import gen_numpy_coverage as gen
    finally:
        sys.path.pop(0)
    rows = gen.table()
    assert [r[0] for r in rows if r[1] == "missing"] == []
    counts = {s: sum(r[1] == s for r in rows) for s in ("fast", "fallback", "unsupported")}
    assert len(rows) >= 340 and counts["fast"] > counts["fallback"] > counts["unsupported"] > 0
    assert (ROOT / "docs" / "numpy_coverage.md").read_text() == gen.render(), \
        "docs/numpy_coverage.md is stale: run python docs/gen_numpy_coverage.py"


def test_unsupported_functions_raise_with_their_reason():
    f = lambda v: snp.put(v, [0], 1.0)  # noqa: E731
    with pytest.raises(TypeError, match=r"\[put\] is not supported on per-device values: mutates"):
        per_device(f, X)
    assert snp.coverage("put")[0] == "unsupported"


# -- compositions: equal to numpy on each device's block ------------------------------------------
COMPOSITIONS = {
    "flip": (lambda v: snp.flip(v, 1), lambda b: np.flip(b, 1)),
    "flip_all": (lambda v: snp.flip(v), lambda b: np.flip(b)),
    "roll": (lambda v: snp.roll(v, 2, axis=2), lambda b: np.roll(b, 2, axis=2)),
    "roll_flat": (lambda v: snp.roll(v, -3), lambda b: np.roll(b, -3)),
    "rot90": (lambda v: snp.rot90(v, 1, axes=(1, 2)), lambda b: np.rot90(b, 1, axes=(1, 2))),
    "rot90_3": (lambda v: snp.rot90(v, 3, axes=(1, 2)), lambda b: np.rot90(b, 3, axes=(1, 2))),
    "diff": (lambda v: snp.diff(v, n=2, axis=-1), lambda b: np.diff(b, n=2, axis=-1)),
    "hstack": (lambda v: snp.hstack([v, v]), lambda b: np.hstack([b, b])),
    "vstack": (lambda v: snp.vstack([v, v]), lambda b: np.vstack([b, b])),
    "dstack": (lambda v: snp.dstack([v, v]), lambda b: np.dstack([b, b])),
    "take": (lambda v: snp.take(v, np.array([4, 0, -1]), axis=2), lambda b: np.take(b, [4, 0, -1], axis=2)),
    "take_flat": (lambda v: snp.take(v, np.array([[1, 7]])), lambda b: np.take(b, [[1, 7]])),
    "diagonal": (lambda v: snp.diagonal(v, 1, 1, 2), lambda b: np.diagonal(b, 1, 1, 2)),
    "trace": (lambda v: snp.trace(v, 0, 1, 2), lambda b: np.trace(b, 0, 1, 2)),
    "sort": (lambda v: snp.sort(v, axis=1), lambda b: np.sort(b, axis=1)),
    "argsort": (lambda v: snp.argsort(v, axis=-1), lambda b: np.argsort(b, axis=-1, kind="stable")),
    "nansum": (lambda v: snp.nansum(snp.where(v > 1, np.nan, v), axis=1),
               lambda b: np.nansum(np.where(b > 1, np.nan, b), axis=1)),
    "nanmax": (lambda v: snp.nanmax(snp.where(v > 1, np.nan, v), axis=2),
               lambda b: np.nanmax(np.where(b > 1, np.nan, b), axis=2)),
    "nanmean": (lambda v: snp.nanmean(snp.where(v > 1, np.nan, v), axis=2),
                lambda b: np.nanmean(np.where(b > 1, np.nan, b), axis=2)),
    "ptp": (lambda v: snp.ptp(v, axis=1), lambda b: np.ptp(b, axis=1)),
    "isclose": (lambda v: snp.isclose(v, v + 1e-9), lambda b: np.isclose(b, b + 1e-9)),
    "tensordot": (lambda v: snp.tensordot(v, v, axes=([1, 2], [1, 2])),
                  lambda b: np.tensordot(b, b, axes=([1, 2], [1, 2]))),
    "kron": (lambda v: snp.kron(v[0], v[1]), lambda b: np.kron(b[0], b[1])),
    "average": (lambda v: snp.average(v, axis=2, weights=np.arange(1.0, 6.0, dtype=np.float32)),
                lambda b: np.average(b, axis=2, weights=np.arange(1.0, 6.0))),
    "select": (lambda v: snp.select([v < -1, v > 1], [v * 2, v * 3], 0.0),
               lambda b: np.select([b < -1, b > 1], [b * 2, b * 3], 0.0)),
    "count_nonzero": (lambda v: snp.count_nonzero(v > 0, axis=1), lambda b: np.count_nonzero(b > 0, axis=1)),
    "nan_to_num": (lambda v: snp.nan_to_num(snp.log(v)), lambda b: np.nan_to_num(np.log(b))),
    "sinc": (lambda v: snp.sinc(v), lambda b: np.sinc(b)),
    "matvec": (lambda v: snp.matvec(v, v[:, 0]), lambda b: np.matvec(b, b[:, 0])),
    "meshgrid": (lambda v: snp.stack(snp.meshgrid(v[0, 0], v[0, 1][:3])),
                 lambda b: np.stack(np.meshgrid(b[0, 0], b[0, 1][:3]))),
    "median_axis": (lambda v: snp.median(v, axis=1), lambda b: np.median(b, axis=1)),
    "cumprod_axis": (lambda v: snp.cumprod(v, axis=2), lambda b: np.cumprod(b, axis=2)),
    "round": (lambda v: snp.round(v, 1), lambda b: np.round(b, 1)),
    "pad": (lambda v: snp.pad(v, ((0, 0), (1, 2), (0, 1))), lambda b: np.pad(b, ((0, 0), (1, 2), (0, 1)))),
    "percentile": (lambda v: snp.percentile(v, 30.0, axis=2), lambda b: np.percentile(b, 30.0, axis=2)),
}


@pytest.mark.parametrize("name", sorted(COMPOSITIONS))
def test_function_matches_numpy_on_every_block(name):
    ours, ref = COMPOSITIONS[name]
    x = SQ if name in ("rot90", "rot90_3", "diagonal", "trace", "kron") else X
    got = np.asarray(per_device(lambda v: snp.expand_dims(ours(v), 0), x))
    for i, b in enumerate(blocks(x)):
        want = ref(b)
        assert got[i].shape == np.shape(want)
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-6)


def test_vectorised_fallback_equals_per_device_and_is_one_call():
    calls = []

    def spy(a, axis):
        calls.append(a.shape)
        return np.median(a, axis=axis)

    from shardlab.numpy import fallback  # the public face of the per-device fallback
    f_axis, f_dev = fallback(spy, "axis"), fallback(spy, "device")
    a = per_device(lambda v: f_axis(v, axis=1), X)
    assert len(calls) == 2 and calls[-1] == (2, 2, 3, 5)  # the probe, then one call on the whole storage
    calls.clear()
    b = per_device(lambda v: f_dev(v, axis=1), X)
    assert len(calls) == 3  # the probe, then one call per device
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fallback_with_shapes_differing_between_devices_is_a_clear_error():
    x = np.array([1.0, 1.0, 1.0, 2.0], np.float32)
    with pytest.raises(ValueError, match=r"\[unique\] gives local shape \(1,\) on one device and \(2,\)"):
        per_device(lambda v: snp.unique(v), x)


def test_top_k_values_indices_and_gradient():
    x = np.array([[1.0, 5.0, 3.0, 5.0], [0.0, -1.0, 2.0, 7.0]], np.float32)
    v, i = per_device(lambda a: snp.top_k(a, 2), x, out_spec=(P("x"), P("x")))
    assert np.asarray(v).tolist() == [[5.0, 5.0], [7.0, 2.0]]
    assert np.asarray(i).tolist() == [[1, 3], [3, 2]] and np.asarray(i).dtype == np.int32
    g = sl.grad(lambda a: snp.sum(snp.top_k(a, 2)[0] * np.float32(3.0)))(x)
    assert np.asarray(g).tolist() == [[0, 3, 0, 3], [0, 0, 3, 3]]
    with pytest.raises(ValueError, match=r"\[top_k\] k=5 is more than"):
        snp.top_k(x, 5)


# -- gradients against JAX ---------------------------------------------------------------------------
GRAD_FUNCS = {
    "sort": lambda m, x: m.sum(m.sort(x, axis=-1) * m.arange(5.0, dtype=np.float32)),
    "take": lambda m, x: m.sum(m.take(x, np.array([0, 2, 2]), axis=1) ** 2),
    "roll_flip_diff": lambda m, x: m.sum(m.diff(m.flip(m.roll(x, 1, axis=2), 1), axis=2) ** 2),
    "erf": lambda m, x: m.sum(m.erf(x) * x) if m is snp else m.sum(jax.scipy.special.erf(x) * x),
    "nanmax_tensordot": lambda m, x: m.nanmax(m.tensordot(x, x, axes=([0, 2], [0, 2]))),
    "trace_kron": lambda m, x: m.trace(m.kron(x[0], x[1])),
    "cbrt_arctanh": lambda m, x: m.sum(m.cbrt(x * x + 1.0) + m.arctanh(x * 0.1)),
}


@pytest.mark.jax
@pytest.mark.parametrize("name", sorted(GRAD_FUNCS))
def test_gradient_matches_jax(name):
    global jax
    jax = pytest.importorskip("jax")
    fn = GRAD_FUNCS[name]
    x = X[:, :3, :3] if name == "trace_kron" else X
    want = jax.grad(lambda v: fn(jax.numpy, v))(x)
    got = sl.grad(lambda v: fn(snp, v))(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-4, atol=2e-5)


# -- shardlab.nn against jax.nn -----------------------------------------------------------------------
def _nn_cases(jnn, m):
    scale = np.linspace(0.5, 1.5, 5, dtype=np.float32)
    bias = np.linspace(-0.2, 0.2, 5, dtype=np.float32)

    def rms(x, s):
        return x / m.sqrt(m.mean(x * x, axis=-1, keepdims=True) + 1e-6) * s

    def ln(x, s, b):
        mu = m.mean(x, axis=-1, keepdims=True)
        d = x - mu
        return d / m.sqrt(m.mean(d * d, axis=-1, keepdims=True) + 1e-5) * s + b

    ours = jnn is None
    return {
        "relu": (snn.relu if ours else jnn.relu),
        "gelu_tanh": (snn.gelu if ours else jnn.gelu),
        "gelu_exact": (lambda x: (snn if ours else jnn).gelu(x, approximate=False)),
        "silu": (snn.silu if ours else jnn.silu),
        "softmax": (lambda x: (snn if ours else jnn).softmax(x, axis=1)),
        "log_softmax": (snn.log_softmax if ours else jnn.log_softmax),
        "logsumexp": (lambda x: (snn if ours else jax.scipy.special).logsumexp(x, axis=-1)),
        "one_hot": (lambda x: x * (snn if ours else jnn).one_hot(m.argmax(x, axis=-1), 5)),
        "rms_norm": (lambda x: snn.rms_norm(x, scale) if ours else rms(x, scale)),
        "layer_norm": (lambda x: snn.layer_norm(x, scale, bias) if ours else ln(x, scale, bias)),
    }


@pytest.mark.jax
@pytest.mark.parametrize("name", sorted(_nn_cases(None, snp)))
def test_nn_values_and_gradients_match_jax(name):
    global jax
    jax = pytest.importorskip("jax")
    ours = _nn_cases(None, snp)[name]
    theirs = _nn_cases(jax.nn, jax.numpy)[name]
    want_value = np.asarray(theirs(X))
    w = np.cos(np.arange(want_value.size, dtype=np.float32)).reshape(want_value.shape)
    np.testing.assert_allclose(np.asarray(per_device(ours, X)), want_value, rtol=1e-5, atol=1e-6)
    want = jax.grad(lambda v: jax.numpy.sum(theirs(v) * w))(X)
    f = sl.shard_map(ours, mesh=MESH, in_specs=P("x"), out_specs=P("x"))
    got = sl.grad(lambda v: snp.sum(f(v) * w))(X)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)


# -- the collective matmul written with jnp.tile --------------------------------------------------------
def _tile_collective_matmul(m):
    """All-gather collective matmul (A [M, K] sharded on M, B [K, N] sharded on N): the
    circulating A block is multiplied by the local B and placed in its row block with a one-hot
    mask built by jnp.tile; the A blocks move with ppermute."""

    def f(a, b):
        n = m.lax.psum(1, "x")
        i = m.lax.axis_index("x")
        rows = a.shape[0]
        out = m.jnp.zeros((8 * rows, b.shape[1]), a.dtype)
        block = a
        for s in range(8):
            part = block @ b
            hot = (m.jnp.arange(8 * rows) // rows == (i + s) % n).astype(a.dtype)[:, None]
            out = out + hot * m.jnp.tile(part, (8, 1))
            block = m.lax.ppermute(block, "x", [(j, (j - 1) % 8) for j in range(8)])
        return out

    return f


@pytest.mark.jax
def test_collective_matmul_with_tile_matches_jax():
    global jax
    jax = pytest.importorskip("jax")
    import types

    if len(jax.devices()) < 8:
        pytest.skip("JAX started with fewer than 8 CPU devices")
    rng = np.random.default_rng(3)
    a = rng.normal(size=(16, 12)).astype(np.float32)
    b = rng.normal(size=(12, 16)).astype(np.float32)
    results = []
    for lib in ("jax", "shardlab"):
        m = types.SimpleNamespace(lax=jax.lax, jnp=jax.numpy, shard_map=jax.shard_map, P=jax.sharding.PartitionSpec,
                                  NS=jax.sharding.NamedSharding, put=jax.device_put,
                                  mesh=jax.make_mesh((8,), ("x",))) if lib == "jax" else \
            types.SimpleNamespace(lax=sl.lax, jnp=snp, shard_map=sl.shard_map, P=P, NS=sl.NamedSharding,
                                  put=sl.device_put, mesh=sl.make_mesh((8,), ("x",)))
        specs = (m.P("x"), m.P(None, "x"))
        f = m.shard_map(_tile_collective_matmul(m), mesh=m.mesh, in_specs=specs, out_specs=m.P(None, "x"))
        results.append(np.asarray(f(*[m.put(v, m.NS(m.mesh, s)) for v, s in zip((a, b), specs)])))
    np.testing.assert_allclose(results[1], results[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(results[1], a @ b, rtol=1e-4, atol=1e-4)


# -- random compositions: grad against finite differences ----------------------------------------------
UNARY = [lambda m, v: m.tanh(v), lambda m, v: m.sin(v), lambda m, v: m.exp(v * 0.3), lambda m, v: m.sort(v, axis=-1),
         lambda m, v: m.roll(v, 1, axis=-1), lambda m, v: m.flip(v, 0), lambda m, v: m.cumsum(v, axis=-1),
         lambda m, v: v * m.mean(v, axis=-1, keepdims=True), lambda m, v: m.erf(v),
         lambda m, v: m.concatenate([v[:, 1:], v[:, :1] * 2.0], axis=1), lambda m, v: m.take(v, [2, 0, 1], axis=1),
         lambda m, v: snn.gelu(v, approximate=False), lambda m, v: snn.softmax(v, axis=-1) * 3.0,
         lambda m, v: m.maximum(v, 0.1) + m.square(v)]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, len(UNARY) - 1), min_size=1, max_size=4), st.integers(0, 2**16))
def test_random_compositions_grad_equals_finite_differences(ops, seed):
    x0 = np.random.default_rng(seed).uniform(-1, 1, size=(2, 3)).astype(np.float64)

    def f(v):
        for k in ops:
            v = UNARY[k](snp, v)
        return snp.sum(v * np.float32(0.7))

    g = np.asarray(sl.grad(f)(x0.astype(np.float32)), np.float64)
    eps = 1e-3
    fd = np.zeros_like(x0)
    for idx in np.ndindex(x0.shape):
        e = np.zeros_like(x0)
        e[idx] = eps
        hi = float(np.asarray(f((x0 + e).astype(np.float32)), np.float64))
        lo = float(np.asarray(f((x0 - e).astype(np.float32)), np.float64))
        fd[idx] = (hi - lo) / (2 * eps)
    np.testing.assert_allclose(g, fd, rtol=3e-2, atol=3e-2)
