"""Fused elementwise primitives (silu and its vjp, swiglu and its vjp, RMSNorm, rotary embedding, the AdamW
update): the C++ kernels against a float64 reference, the primitives inside shard_map against
JAX (values, gradients, second derivatives) and against the composite expression, abstract
mode, and bad input."""

import ml_dtypes
import numpy as np
import pytest

import shardlab as sl
import shardlab._core as _core
import shardlab.nn as snn
import shardlab.numpy as jnp
from shardlab import P
from shardlab.models import ModelConfig
from shardlab.models.layers import apply_rotary, rotary_tables
from shardlab._src.primitives.fused import EXP_SUM, EXP_SUM_VJP, RMS_NORM, SILU_VJP, SWIGLU, SWIGLU_VJP
from shardlab._src.primitives.primitive import bind

jax = pytest.importorskip("jax")


def _sigmoid64(x):
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


@pytest.mark.parametrize("n", [1, 7, 33, 1001, 70_001])
def test_core_silu_kernels_match_float64(n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 8).astype(np.float32)
    dy = rng.standard_normal(n).astype(np.float32)
    s = _sigmoid64(x)
    np.testing.assert_allclose(_core.silu_forward(x), x * s, rtol=1e-6, atol=1e-37)
    want = dy * s * (1 + x * (1 - s))
    # float32 cancellation near the derivative's zero: error relative to the terms' size
    tol = 1e-6 * np.abs(dy) * s * (1 + np.abs(x)) + 1e-37
    assert np.all(np.abs(_core.silu_backward(x, dy) - want) <= tol)


def test_core_kernels_reject_what_they_cannot_run():
    with pytest.raises(ValueError, match=r"\[silu\] x must be a C-contiguous float32 array; got dtype float64"):
        _core.silu_forward(np.ones(3))
    with pytest.raises(ValueError, match=r"\[silu\] x must be a C-contiguous float32"):
        _core.silu_forward(np.ones((4, 4), np.float32).T)
    with pytest.raises(ValueError, match=r"\[silu_vjp\] shapes differ: \(3,\) and \(4,\)"):
        _core.silu_backward(np.ones(3, np.float32), np.ones(4, np.float32))
    z = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match=r"\[adamw_update\] shapes differ"):
        _core.adamw_update(z, z, z, np.zeros(2, np.float32), lr=1e-3, b1=0.9, b2=0.999, eps=1e-8,
                           weight_decay=0.0, c1=0.1, c2=0.001)


def _on_mesh(f, mesh, n_in=1):
    return sl.shard_map(f, mesh=mesh, in_specs=(P("x"),) * n_in, out_specs=P("x"))


def test_silu_in_shard_map_matches_jax_values_gradients_and_second_derivatives():
    mesh = sl.make_mesh((4,), ("x",))
    x = (np.random.default_rng(0).standard_normal((8, 33)) * 4).astype(np.float32)
    ref = jax.nn.silu
    f = _on_mesh(snn.silu, mesh)
    np.testing.assert_allclose(np.asarray(f(x)), np.asarray(ref(x)), rtol=2e-6, atol=1e-7)
    loss = lambda x: jnp.sum(f(x) ** 2)  # noqa: E731
    g = np.asarray(sl.grad(loss)(x))
    g_ref = np.asarray(jax.grad(lambda x: jax.numpy.sum(ref(x) ** 2))(x))
    np.testing.assert_allclose(g, g_ref, rtol=2e-5, atol=1e-6)
    # the second derivative: grad of grad runs silu_vjp's own rule
    h = np.asarray(sl.grad(lambda x: jnp.sum(sl.grad(lambda y: jnp.sum(f(y)))(x)))(x))
    h_ref = np.asarray(jax.grad(lambda x: jax.numpy.sum(jax.grad(lambda y: jax.numpy.sum(ref(y)))(x)))(x))
    np.testing.assert_allclose(h, h_ref, rtol=2e-4, atol=1e-5)
    # silu_vjp's own rule with a general cotangent, against jax.grad of the same expression dy * silu'(x)
    dy = np.random.default_rng(3).standard_normal(x.shape).astype(np.float32)
    vjp_of = _on_mesh(lambda x, dy: bind(SILU_VJP, [x, dy], x.mesh), mesh, n_in=2)
    gx, gdy = sl.grad(lambda x, dy: jnp.sum(vjp_of(x, dy) ** 2), argnums=(0, 1))(x, dy)
    d_silu = jax.vmap(jax.grad(ref))
    jx, jdy = jax.grad(lambda x, dy: jax.numpy.sum((dy * d_silu(x.ravel()).reshape(x.shape)) ** 2),
                       argnums=(0, 1))(x, dy)
    np.testing.assert_allclose(np.asarray(gx), np.asarray(jx), rtol=2e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gdy), np.asarray(jdy), rtol=2e-5, atol=1e-6)


def test_silu_runs_the_fused_primitive_only_for_float32():
    """bfloat16 (and plain numpy) take the composite: the result dtype is JAX's."""
    mesh = sl.make_mesh((2,), ("x",))
    xb = np.linspace(-3, 3, 8).astype(ml_dtypes.bfloat16)
    out = _on_mesh(snn.silu, mesh)(xb)
    assert out.dtype == ml_dtypes.bfloat16
    want = np.asarray(jax.nn.silu(jax.numpy.asarray(xb)))
    np.testing.assert_allclose(np.asarray(out, np.float32), want.astype(np.float32), rtol=2e-2)
    assert snn.silu(np.float32(1.0)).dtype == np.float32


def test_silu_gradient_of_an_invariant_input_is_summed_where_it_fans_out():
    """x replicated over the mesh, the cotangent varying: silu_vjp broadcasts the mesh dims
    and the gradient equals JAX's of the whole program."""
    mesh = sl.make_mesh((4,), ("x",))
    rng = np.random.default_rng(1)
    x = rng.standard_normal(6).astype(np.float32)
    w = rng.standard_normal((4, 6)).astype(np.float32)
    f = sl.shard_map(lambda x, w: jnp.sum(snn.silu(x) * w, axis=1), mesh=mesh, in_specs=(P(), P("x")),
                     out_specs=P("x"))
    g = np.asarray(sl.grad(lambda x: jnp.sum(f(x, w)))(x))
    g_ref = np.asarray(jax.grad(lambda x: jax.numpy.sum(jax.nn.silu(x)[None] * w))(x))
    np.testing.assert_allclose(g, g_ref, rtol=2e-5, atol=1e-6)


def test_silu_in_abstract_mode_records_the_same_shapes():
    mesh = sl.make_mesh((4,), ("x",))
    f = _on_mesh(lambda x: sl.grad(lambda y: jnp.sum(snn.silu(y)))(x), mesh)
    out = sl.eval_shape(f, sl.ShapeDtypeStruct((8, 5), np.float32))
    assert (out.shape, out.dtype) == ((8, 5), np.float32)


@pytest.mark.parametrize("f", [1, 7, 33, 1001])
def test_core_swiglu_kernels_match_float64_on_rows_at_any_strides(f):
    rng = np.random.default_rng(f)
    # [gate | up] rows read in place: a slice of a wider array with its leading dims swapped
    store = (rng.standard_normal((5, 3, 2 * f + 3)) * 8).astype(np.float32)
    x = store.transpose(1, 0, 2)[..., :2 * f]
    dz = rng.standard_normal((3, 5, f)).astype(np.float32)
    g, u = x[..., :f].astype(np.float64), x[..., f:].astype(np.float64)
    s = _sigmoid64(g)
    np.testing.assert_allclose(_core.swiglu_forward(x), g * s * u, rtol=2e-6, atol=1e-37)
    dx = _core.swiglu_backward(x, dz)
    assert dx.shape == x.shape
    np.testing.assert_allclose(dx[..., f:], dz * g * s, rtol=2e-6, atol=1e-37)
    tol = 2e-6 * np.abs(dz * u) * s * (1 + np.abs(g)) + 1e-37
    assert np.all(np.abs(dx[..., :f] - dz * u * s * (1 + g * (1 - s))) <= tol)


def test_core_swiglu_kernels_reject_what_they_cannot_run():
    with pytest.raises(ValueError, match=r"\[swiglu\] x has shape \(2, 3\); its last dim must hold \[gate \| up\]"):
        _core.swiglu_forward(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"\[swiglu\] x must be a float32 array with a contiguous last dim"):
        _core.swiglu_forward(np.ones((4, 4), np.float32).T)
    with pytest.raises(ValueError, match=r"\[swiglu_vjp\] x has shape \(2, 4\) and dz \(2, 4\); dz must be"):
        _core.swiglu_backward(np.ones((2, 4), np.float32), np.ones((2, 4), np.float32))


def test_swiglu_in_shard_map_matches_jax_values_gradients_and_second_derivatives():
    mesh = sl.make_mesh((4,), ("x",))
    x = (np.random.default_rng(5).standard_normal((8, 2, 66)) * 4).astype(np.float32)

    def ref(x):
        g, u = jax.numpy.split(x, 2, axis=-1)
        return jax.nn.silu(g) * u

    f = _on_mesh(snn.swiglu, mesh)
    np.testing.assert_allclose(np.asarray(f(x)), np.asarray(ref(x)), rtol=2e-6, atol=1e-7)
    w = np.random.default_rng(6).standard_normal((8, 2, 33)).astype(np.float32)
    got = sl.grad(lambda x: jnp.sum(f(x) * w))(x)
    want = jax.grad(lambda x: jax.numpy.sum(ref(x) * w))(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=1e-6)
    # second derivatives (grad of grad takes the rule written with split, silu, silu_vjp)
    h = sl.grad(lambda x: jnp.sum(sl.grad(lambda x: jnp.sum(f(x) * w))(x) ** 2))(x)
    h_ref = jax.grad(lambda x: jax.numpy.sum(jax.grad(lambda x: jax.numpy.sum(ref(x) * w))(x) ** 2))(x)
    np.testing.assert_allclose(np.asarray(h), np.asarray(h_ref), rtol=2e-4, atol=1e-5)


def test_swiglu_runs_the_fused_primitives_forward_and_backward():
    """One swiglu and one swiglu_vjp bind on float32 shards, even on a slice of a wider array;
    bfloat16, another axis and plain numpy take the composite with JAX's dtypes."""
    mesh = sl.make_mesh((2,), ("x",))
    calls = []
    orig = (SWIGLU.impl["emulated"], SWIGLU_VJP.impl["emulated"])
    SWIGLU.impl["emulated"] = lambda s, m: calls.append("swiglu") or orig[0](s, m)
    SWIGLU_VJP.impl["emulated"] = lambda s, m: calls.append("swiglu_vjp") or orig[1](s, m)
    try:
        x = np.linspace(-3, 3, 24).astype(np.float32).reshape(4, 6)
        g = sl.grad(lambda x: jnp.sum(_on_mesh(lambda x: snn.swiglu(x[:, 1:5]), mesh)(x)))(x)
    finally:
        SWIGLU.impl["emulated"], SWIGLU_VJP.impl["emulated"] = orig
    assert calls == ["swiglu", "swiglu_vjp"]
    want = jax.grad(lambda x: jax.numpy.sum(jax.nn.silu(x[:, 1:3]) * x[:, 3:5]))(x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(want), rtol=2e-6)
    xb = x.astype(ml_dtypes.bfloat16)
    out = _on_mesh(snn.swiglu, mesh)(xb)
    assert out.dtype == ml_dtypes.bfloat16
    want_b = jax.nn.silu(xb[:, :3]) * xb[:, 3:]
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want_b, np.float32), rtol=2e-2)
    col = _on_mesh(lambda x: snn.swiglu(x, axis=0), mesh)(np.ones((8, 3), np.float32))
    np.testing.assert_allclose(np.asarray(col), np.asarray(jax.nn.silu(np.ones((2, 3))) * np.ones((2, 3))).repeat(2, 0),
                               rtol=1e-6)
    assert snn.swiglu(np.array([1.0, 2.0], np.float32)).dtype == np.float32


def test_swiglu_names_an_odd_or_missing_axis():
    with pytest.raises(ValueError, match=r"\[swiglu\] x has local shape \(3,\); its axis -1 must hold"):
        snn.swiglu(np.ones(3, np.float32))
    with pytest.raises(ValueError, match=r"\[swiglu\] x has local shape \(2, 4\); its axis 2 must hold"):
        snn.swiglu(np.ones((2, 4), np.float32), axis=2)
    with pytest.raises(ValueError, match=r"\[swiglu\] x has local shape \(2, 3\); its axis -1"):
        _on_mesh(snn.swiglu, sl.make_mesh((2,), ("x",)))(np.ones((4, 3), np.float32))


def test_swiglu_in_abstract_mode_records_the_same_shapes():
    mesh = sl.make_mesh((4,), ("x",))
    f = _on_mesh(lambda x: sl.grad(lambda x: jnp.sum(snn.swiglu(x)))(x), mesh)
    out = sl.eval_shape(f, sl.ShapeDtypeStruct((8, 6), np.float32))
    assert (out.shape, out.dtype) == ((8, 6), np.float32)
    with pytest.raises(ValueError, match=r"\[swiglu\] x has local shape \(2, 5\); its axis -1 must hold"):
        sl.eval_shape(_on_mesh(snn.swiglu, mesh), sl.ShapeDtypeStruct((8, 5), np.float32))


def test_core_exp_sum_kernels_match_float64_over_the_float_range():
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((3, 5, 40)) * 30).astype(np.float32).transpose(1, 0, 2)[..., 3:]
    shift = (x.max(-1) - rng.random(x.shape[:-1]) * 5).astype(np.float32)  # some x - shift > 0
    ct = rng.standard_normal(x.shape[:-1]).astype(np.float32)
    e = np.exp((x - shift[..., None]).astype(np.float64))
    np.testing.assert_allclose(_core.exp_sum_forward(x, shift), e.sum(-1), rtol=1e-5)
    np.testing.assert_allclose(_core.exp_sum_backward(x, shift, ct), ct[..., None] * e, rtol=2e-6, atol=1e-37)
    edge = np.array([[-200.0, 0.0, 88.5, 89.0, np.inf]], np.float32)
    got = _core.exp_sum_backward(edge, np.zeros(1, np.float32), np.ones(1, np.float32))
    np.testing.assert_allclose(got[0, :3], np.exp(edge[0, :3].astype(np.float64)).astype(np.float32), rtol=3e-7)
    assert np.isinf(got[0, 3:]).all()
    with pytest.raises(ValueError, match=r"\[exp_sum\] x has shape \(2, 3\) and shift \(3,\); shift must be"):
        _core.exp_sum_forward(np.ones((2, 3), np.float32), np.ones(3, np.float32))


@pytest.mark.parametrize("keepdims", [False, True])
def test_logsumexp_in_shard_map_runs_exp_sum_and_matches_jax(keepdims):
    """Values, first and second derivatives against jax.nn.logsumexp, one exp_sum and one
    exp_sum_vjp bind, and a row of -inf gives -inf as in JAX."""
    mesh = sl.make_mesh((4,), ("x",))
    x = (np.random.default_rng(4).standard_normal((8, 3, 37)) * 10).astype(np.float32)
    x[0, 1] = -np.inf
    f = _on_mesh(lambda x: snn.logsumexp(x, axis=-1, keepdims=keepdims), mesh)
    want = jax.nn.logsumexp(x, axis=-1, keepdims=keepdims)
    np.testing.assert_allclose(np.asarray(f(x)), np.asarray(want), rtol=1e-6)
    xf = x.copy()
    xf[0, 1] = 0.0  # finite input for the gradients
    w = np.random.default_rng(5).standard_normal(np.shape(want)).astype(np.float32)
    calls = []
    saved = (EXP_SUM.impl["emulated"], EXP_SUM_VJP.impl["emulated"])
    EXP_SUM.impl["emulated"] = lambda s, m: calls.append("exp_sum") or saved[0](s, m)
    EXP_SUM_VJP.impl["emulated"] = lambda s, m: calls.append("exp_sum_vjp") or saved[1](s, m)
    try:
        g = sl.grad(lambda x: jnp.sum(f(x) * w))(xf)
    finally:
        EXP_SUM.impl["emulated"], EXP_SUM_VJP.impl["emulated"] = saved
    assert calls == ["exp_sum", "exp_sum_vjp"]
    g_ref = jax.grad(lambda x: jax.numpy.sum(jax.nn.logsumexp(x, axis=-1, keepdims=keepdims) * w))(xf)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=2e-5, atol=1e-7)
    h = sl.grad(lambda x: jnp.sum(sl.grad(lambda x: jnp.sum(f(x) * w))(x) ** 2))(xf)
    h_ref = jax.grad(lambda x: jax.numpy.sum(jax.grad(
        lambda x: jax.numpy.sum(jax.nn.logsumexp(x, axis=-1, keepdims=keepdims) * w))(x) ** 2))(xf)
    np.testing.assert_allclose(np.asarray(h), np.asarray(h_ref), rtol=2e-4, atol=1e-6)


def test_exp_sum_gradient_in_its_shift_and_abstract_mode():
    """d/d shift of sum(exp(x - shift)) is -sum(exp(x - shift)); eval_shape runs the rules."""
    mesh = sl.make_mesh((2,), ("x",))
    x = np.random.default_rng(8).standard_normal((4, 6)).astype(np.float32)
    shift = np.random.default_rng(9).standard_normal(4).astype(np.float32)
    f = sl.shard_map(lambda x, m: bind(EXP_SUM, [x, m], x.mesh), mesh=mesh, in_specs=(P("x"), P("x")),
                     out_specs=P("x"))
    gx, gm = sl.grad(lambda x, m: jnp.sum(f(x, m)), argnums=(0, 1))(x, shift)
    jx, jm = jax.grad(lambda x, m: jax.numpy.sum(jax.numpy.exp(x - m[:, None])), argnums=(0, 1))(x, shift)
    np.testing.assert_allclose(np.asarray(gx), np.asarray(jx), rtol=2e-6)
    np.testing.assert_allclose(np.asarray(gm), np.asarray(jm), rtol=2e-6)
    out = sl.eval_shape(f, sl.ShapeDtypeStruct((4, 6), np.float32), sl.ShapeDtypeStruct((4,), np.float32))
    assert (out.shape, out.dtype) == ((4,), np.float32)
    with pytest.raises(ValueError, match=r"\[exp_sum\] x has local shape \(2, 6\) and shift \(2, 1\)"):
        sl.eval_shape(sl.shard_map(lambda x, m: bind(EXP_SUM, [x, m], x.mesh), mesh=mesh, in_specs=(P("x"), P("x")),
                                   out_specs=P("x")),
                      sl.ShapeDtypeStruct((4, 6), np.float32), sl.ShapeDtypeStruct((4, 1), np.float32))


def _adamw_composite(p, g, m, v, lr, b1, b2, eps, wd, step):
    """The definition in float64."""
    p, g, m, v = (a.astype(np.float64) for a in (p, g, m, v))
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    upd = (m / (1 - b1 ** step)) / (np.sqrt(v / (1 - b2 ** step)) + eps) + wd * p
    return p - lr * upd, m, v


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adamw_update_on_shards_matches_the_definition_over_steps(wd):
    mesh = sl.make_mesh((2, 2), ("x", "y"))
    rng = np.random.default_rng(2)
    shape = (6, 10)
    p = rng.standard_normal(shape).astype(np.float32)
    m = np.zeros(shape, np.float32)
    v = np.zeros(shape, np.float32)
    p64, m64, v64 = p.astype(np.float64), m.astype(np.float64), v.astype(np.float64)
    kw = dict(lr=1e-2, b1=0.9, b2=0.99, eps=1e-8, weight_decay=wd)
    for step in range(1, 4):
        g = rng.standard_normal(shape).astype(np.float32)
        f = sl.shard_map(lambda p, g, m, v: snn.adamw_update(p, g, m, v, step=step, **kw), mesh=mesh,
                         in_specs=(P("x", "y"),) * 4, out_specs=(P("x", "y"),) * 3)
        p, m, v = (np.asarray(a) for a in f(p, g, m, v))
        p64, m64, v64 = _adamw_composite(p64, g, m64, v64, kw["lr"], kw["b1"], kw["b2"], kw["eps"], wd, step)
        np.testing.assert_allclose(m, m64, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(v, v64, rtol=1e-5, atol=1e-9)
        np.testing.assert_allclose(p, p64, rtol=1e-5, atol=1e-7)
    # and the plain-array (composite) path of the same function agrees with the fused one
    g = rng.standard_normal(shape).astype(np.float32)
    plain = snn.adamw_update(p, g, m, v, step=4, **kw)
    f = sl.shard_map(lambda p, g, m, v: snn.adamw_update(p, g, m, v, step=4, **kw), mesh=mesh,
                     in_specs=(P("x", "y"),) * 4, out_specs=(P("x", "y"),) * 3)
    for a, b in zip(f(p, g, m, v), plain):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-8)  # FMA contraction: ulps


def test_adamw_update_bad_input():
    z = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match=r"\[adamw_update\] step must be an integer >= 1.*got 0"):
        snn.adamw_update(z, z, z, z, lr=1e-3, step=0)
    mesh = sl.make_mesh((2,), ("x",))
    f = sl.shard_map(lambda p, v: snn.adamw_update(p, p, p, v, lr=1e-3, step=1)[0], mesh=mesh,
                     in_specs=(P("x"), P("x")), out_specs=P("x"))
    with pytest.raises(ValueError, match=r"\[adamw_update\] param, grad, m and v have local shapes \(2,\), \(2,\), \(2,\), \(3,\)"):
        f(np.zeros(4, np.float32), np.zeros(6, np.float32))


def _jax_rms_norm(x, scale, eps):
    return x / jax.numpy.sqrt(jax.numpy.mean(x * x, axis=-1, keepdims=True) + eps) * scale


@pytest.mark.parametrize("scale_spec", [P(), P("y")])
def test_rms_norm_in_shard_map_matches_jax_values_gradients_and_second_derivatives(scale_spec):
    """Rows sharded over x; the scale replicated (its gradient sums every device's rows) or
    sharded along y with the features."""
    mesh = sl.make_mesh((2, 2), ("x", "y"))
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((4, 6, 10)) * 2).astype(np.float32)
    scale = rng.standard_normal(10).astype(np.float32)
    w = rng.standard_normal((4, 6, 10)).astype(np.float32)
    xspec = P("x", None, scale_spec[0] if len(scale_spec) else None)
    if len(scale_spec):  # features sharded: each device normalises its own slice of the last dim
        ref_fn = lambda x, s: jax.numpy.concatenate(  # noqa: E731
            [_jax_rms_norm(x[..., :5], s[:5], 1e-5), _jax_rms_norm(x[..., 5:], s[5:], 1e-5)], axis=-1)
    else:
        ref_fn = lambda x, s: _jax_rms_norm(x, s, 1e-5)  # noqa: E731
    f = sl.shard_map(lambda x, s: snn.rms_norm(x, s, eps=1e-5), mesh=mesh, in_specs=(xspec, scale_spec),
                     out_specs=xspec)
    np.testing.assert_allclose(np.asarray(f(x, scale)), np.asarray(ref_fn(x, scale)), rtol=1e-5, atol=1e-6)
    loss = lambda x, s: jnp.sum(f(x, s) * w)  # noqa: E731
    gx, gs = sl.grad(loss, argnums=(0, 1))(x, scale)
    jx, js = jax.grad(lambda x, s: jax.numpy.sum(ref_fn(x, s) * w), argnums=(0, 1))(x, scale)
    np.testing.assert_allclose(np.asarray(gx), np.asarray(jx), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gs), np.asarray(js), rtol=1e-4, atol=1e-5)
    h = sl.grad(lambda x: jnp.sum(sl.grad(lambda y: loss(y, scale))(x) ** 2))(x)
    h_ref = jax.grad(lambda x: jax.numpy.sum(jax.grad(lambda y: jax.numpy.sum(ref_fn(y, scale) * w))(x) ** 2))(x)
    np.testing.assert_allclose(np.asarray(h), np.asarray(h_ref), rtol=1e-3, atol=1e-4)


def test_rms_norm_uses_the_fused_primitive_only_where_it_applies():
    """Another axis, a bfloat16 input or a scale of another shape take the composite; results
    still equal JAX's."""
    mesh = sl.make_mesh((2,), ("x",))
    x = np.random.default_rng(5).standard_normal((4, 3, 8)).astype(np.float32)
    f = sl.shard_map(lambda x: snn.rms_norm(x, axis=1), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    want = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(np.asarray(f(x)), want, rtol=1e-5)
    with sl.Ledger():
        f_none = sl.shard_map(lambda x: snn.rms_norm(x), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
        np.testing.assert_allclose(np.asarray(f_none(x)), x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6),
                                   rtol=1e-5)


def test_rms_norm_primitive_rejects_a_scale_of_the_wrong_local_shape():
    mesh = sl.make_mesh((2,), ("x",))
    x = sl.LocalArray(np.zeros((2, 3, 8), np.float32), mesh)
    s = sl.LocalArray(np.zeros((1, 4), np.float32), mesh)
    with pytest.raises(ValueError, match=r"\[rms_norm\] scale has local shape \(4,\); it must be \(8,\)"):
        RMS_NORM.shape_rule([x.storage, s.storage], mesh, eps=1e-6)


def test_rms_norm_in_abstract_mode():
    mesh = sl.make_mesh((2,), ("x",))
    f = sl.shard_map(lambda x, s: sl.grad(lambda y: jnp.sum(snn.rms_norm(y, s)))(x), mesh=mesh,
                     in_specs=(P("x"), P()), out_specs=P("x"))
    out = sl.eval_shape(f, sl.ShapeDtypeStruct((4, 8), np.float32), sl.ShapeDtypeStruct((8,), np.float32))
    assert (out.shape, out.dtype) == ((4, 8), np.float32)


def _jax_rotary(x, c, s):
    half = c.shape[-1]
    c, s = c[:, None, :], s[:, None, :]
    x1, x2 = x[..., :half], x[..., half:2 * half]
    return jax.numpy.concatenate([x1 * c - x2 * s, x2 * c + x1 * s, x[..., 2 * half:]], axis=-1)


@pytest.mark.parametrize("per_device_tables", [False, True])
def test_rotary_embedding_in_shard_map_matches_jax_values_and_gradients(per_device_tables):
    """Batch sharded over x and heads over y; tables either constants or per-device values
    (sequence-sharded tables, as context parallelism makes them)."""
    mesh = sl.make_mesh((2, 2), ("x", "y"))
    rng = np.random.default_rng(6)
    B, T, N, H, half = 4, 6, 4, 10, 3     # 2·half < H: the last dims pass through
    x = rng.standard_normal((B, T, N, H)).astype(np.float32)
    ang = rng.uniform(0, 6, (T, half))
    c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    w = rng.standard_normal((B, T, N, H)).astype(np.float32)
    spec = P("x", None, "y")
    if per_device_tables:
        f = sl.shard_map(lambda x, c, s: snn.rotary_embedding(x, c, s), mesh=mesh, in_specs=(spec, P(), P()),
                         out_specs=spec)
        run = lambda x: f(x, c, s)  # noqa: E731
    else:
        f = sl.shard_map(lambda x: snn.rotary_embedding(x, c, s), mesh=mesh, in_specs=spec, out_specs=spec)
        run = f
    np.testing.assert_allclose(np.asarray(run(x)), np.asarray(_jax_rotary(x, c, s)), rtol=1e-5, atol=1e-6)
    g = sl.grad(lambda x: jnp.sum(run(x) * w))(x)
    g_ref = jax.grad(lambda x: jax.numpy.sum(_jax_rotary(x, c, s) * w))(x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-5, atol=1e-6)


def test_rotary_embedding_gradient_wrt_tables_is_refused_clearly():
    mesh = sl.make_mesh((2,), ("x",))
    x = np.ones((2, 3, 1, 4), np.float32)
    c = np.ones((3, 2), np.float32)
    f = sl.shard_map(lambda x, c: jnp.sum(snn.rotary_embedding(x, c, c))[None], mesh=mesh, in_specs=(P("x"), P()),
                     out_specs=P("x"))
    with pytest.raises(NotImplementedError, match=r"\[grad\] rotary_embedding is not differentiable with respect"):
        sl.grad(lambda c: jnp.sum(f(x, c)))(c)
    assert np.asarray(sl.grad(lambda x: jnp.sum(f(x, c)))(x)).shape == x.shape  # x alone is fine


def test_rotary_embedding_bad_table_shape():
    mesh = sl.make_mesh((2,), ("x",))
    f = sl.shard_map(lambda x: snn.rotary_embedding(x, np.ones((5, 2), np.float32), np.ones((5, 2), np.float32)),
                     mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    with pytest.raises(ValueError, match=r"\[rotary_embedding\] x has local shape \(1, 3, 1, 4\)"):
        f(np.ones((2, 3, 1, 4), np.float32))


def test_model_rotary_rejects_tables_of_the_wrong_width():
    cfg = ModelConfig(num_layers=1, d_model=32, ffw_dim=64, num_heads=4, vocab_size=16)
    x = np.zeros((1, 5, 4, 8), np.float32)
    cos, sin = rotary_tables(cfg, np.arange(5))
    assert apply_rotary(x, cos, sin, cfg).shape == x.shape
    with pytest.raises(ValueError, match=r"\[apply_rotary\] tables of width 3 do not match rotary_dim 8"):
        apply_rotary(x, cos[:, :3], sin[:, :3], cfg)
