"""shardlab.nn.dot_product_attention against jax.nn.dot_product_attention and torch SDPA."""

import ml_dtypes
import numpy as np
import pytest

import shardlab.nn as snn

jax = pytest.importorskip("jax")
jnp = jax.numpy

BF16 = ml_dtypes.bfloat16


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def jax_attention(q, k, v, **kw):
    return np.asarray(jax.nn.dot_product_attention(q, k, v, implementation="xla", **kw))


def jax_vjp(q, k, v, dout, **kw):
    _, f = jax.vjp(lambda a, b, c: jax.nn.dot_product_attention(a, b, c, **kw), q, k, v)
    return [np.asarray(g) for g in f(dout)]


def _visible_mask(rng, shape):
    """Random boolean mask that keeps key 0 for every query, so no row is fully masked
    (JAX and shardlab differ there on purpose: see test_fully_masked_rows_differ_from_jax)."""
    m = rng.random(shape) < 0.7
    m[..., 0] = True
    return m


CASES = [
    # (B, Tq, Tk, Hq, Hkv, D, is_causal, mask shape or None)
    (2, 37, 50, 4, 2, 24, False, None),
    (2, 37, 50, 4, 2, 24, True, None),
    (1, 65, 33, 6, 1, 16, True, None),  # Tq > Tk, multi-query attention
    (2, 17, 129, 2, 2, 64, False, "b1ts"),
    (1, 31, 31, 4, 4, 8, True, "1nts"),
    (1, 9, 65, 3, 3, 33, False, "ts"),
]


def _mask(rng, kind, B, Hq, Tq, Tk):
    shapes = {"b1ts": (B, 1, Tq, Tk), "1nts": (1, Hq, Tq, Tk), "ts": (1, 1, Tq, Tk)}
    return None if kind is None else _visible_mask(rng, shapes[kind])


@pytest.mark.jax
@pytest.mark.parametrize("case", CASES)
def test_forward_and_residual_match_jax(case):
    B, Tq, Tk, Hq, Hkv, D, is_causal, kind = case
    rng = np.random.default_rng(Tq * Tk + Hq)
    q, k, v = rand(rng, B, Tq, Hq, D), rand(rng, B, Tk, Hkv, D), rand(rng, B, Tk, Hkv, D)
    mask = _mask(rng, kind, B, Hq, Tq, Tk)
    out, res = snn.dot_product_attention(q, k, v, mask=mask, is_causal=is_causal,
                                         return_residual=True)
    jout, jres = jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=is_causal,
                                              return_residual=True)
    np.testing.assert_allclose(out, np.asarray(jout), atol=3e-6)
    assert res.shape == jres.shape == (B, Tq, Hq)
    np.testing.assert_allclose(res, np.asarray(jres), atol=3e-6, rtol=1e-6)


@pytest.mark.jax
@pytest.mark.parametrize("case", CASES)
def test_vjp_matches_jax(case):
    B, Tq, Tk, Hq, Hkv, D, is_causal, kind = case
    rng = np.random.default_rng(Tq + Tk * 7 + D)
    q, k, v = rand(rng, B, Tq, Hq, D), rand(rng, B, Tk, Hkv, D), rand(rng, B, Tk, Hkv, D)
    dout = rand(rng, B, Tq, Hq, D)
    mask = _mask(rng, kind, B, Hq, Tq, Tk)
    ours = snn.dot_product_attention_vjp(q, k, v, dout, mask=mask, is_causal=is_causal,
                                         scale=0.3)
    theirs = jax_vjp(q, k, v, dout, mask=mask, is_causal=is_causal, scale=0.3)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape and a.dtype == np.float32
        np.testing.assert_allclose(a, b, atol=2e-5 * max(1.0, np.abs(b).max()))


@pytest.mark.jax
def test_three_dimensional_inputs_match_jax():
    rng = np.random.default_rng(0)
    q, k, v = rand(rng, 21, 4, 16), rand(rng, 40, 2, 16), rand(rng, 40, 2, 16)
    out, res = snn.dot_product_attention(q, k, v, is_causal=True, return_residual=True)
    jout, jres = jax.nn.dot_product_attention(q, k, v, is_causal=True, return_residual=True)
    assert out.shape == (21, 4, 16) and res.shape == (21, 4)
    np.testing.assert_allclose(out, np.asarray(jout), atol=3e-6)
    np.testing.assert_allclose(res, np.asarray(jres), atol=3e-6)
    dout = rand(rng, 21, 4, 16)
    for a, b in zip(snn.dot_product_attention_vjp(q, k, v, dout, is_causal=True),
                    jax_vjp(q, k, v, dout, is_causal=True)):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=2e-5)


@pytest.mark.jax
def test_bfloat16_matches_jax():
    rng = np.random.default_rng(1)
    q, k, v = (rand(rng, 2, 33, 4, 32).astype(BF16), rand(rng, 2, 65, 2, 32).astype(BF16),
               rand(rng, 2, 65, 2, 32).astype(BF16))
    out, res = snn.dot_product_attention(q, k, v, is_causal=True, return_residual=True)
    jout, jres = jax.nn.dot_product_attention(q, k, v, is_causal=True, return_residual=True)
    jout = np.asarray(jout)
    assert out.dtype == BF16 and jout.dtype == BF16
    assert res.dtype == np.asarray(jres).dtype == BF16
    np.testing.assert_allclose(res.astype(np.float32), np.asarray(jres).astype(np.float32),
                               rtol=2**-7)
    # JAX rounds the probabilities to bf16 before P @ V; shardlab keeps them fp32. Both round
    # the output to bf16: a few bf16 ulps (2^-8 relative) apart.
    diff = np.abs(out.astype(np.float32) - jout.astype(np.float32)).max()
    assert diff <= 4 * 2.0**-8 * np.abs(jout.astype(np.float32)).max()


@pytest.mark.jax
def test_fully_masked_rows_differ_from_jax_by_design():
    rng = np.random.default_rng(2)
    q, k, v = rand(rng, 1, 4, 1, 8), rand(rng, 1, 6, 1, 8), rand(rng, 1, 6, 1, 8)
    mask = np.ones((1, 1, 4, 6), bool)
    mask[..., 2, :] = False
    out = snn.dot_product_attention(q, k, v, mask=mask)
    jout = jax_attention(q, k, v, mask=mask)
    np.testing.assert_array_equal(out[0, 2], 0.0)  # shardlab (and torch SDPA): zeros
    np.testing.assert_allclose(jout[0, 2, 0], v[0, :, 0].mean(0), atol=1e-6)  # JAX: mean of v
    np.testing.assert_allclose(np.delete(out, 2, 1), np.delete(jout, 2, 1), atol=3e-6)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"bias": np.zeros((1, 1, 4, 4), np.float32)},
        {"query_seq_lengths": np.array([3], np.int32)},
        {"key_value_seq_lengths": np.array([3], np.int32)},
        {"local_window_size": 2},
        {"implementation": "cudnn"},
    ],
)
def test_unsupported_options_raise(kwargs):
    x = np.zeros((1, 4, 2, 8), np.float32)
    name = next(iter(kwargs))
    with pytest.raises(NotImplementedError, match=r"\[dot_product_attention\] .*" + name):
        snn.dot_product_attention(x, x, x, **kwargs)


def test_bad_input_names_the_op():
    x = np.zeros((1, 4, 3, 8), np.float32)
    with pytest.raises(ValueError, match=r"query heads 3 is not a multiple .* 2"):
        snn.dot_product_attention(x, x[:, :, :2], x[:, :, :2])
    with pytest.raises(TypeError, match=r"\[dot_product_attention\] q has dtype float64"):
        snn.dot_product_attention(x.astype(np.float64), x, x)


# ---- torch SDPA -------------------------------------------------------------------------------

def _torch():
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        pytest.skip(f"torch does not import: {e}")
    return torch


@pytest.mark.parametrize("is_causal,Tq,Tk", [(False, 40, 40), (True, 40, 40), (True, 23, 57)])
def test_matches_torch_sdpa(is_causal, Tq, Tk):
    torch = _torch()
    rng = np.random.default_rng(Tq + Tk)
    q, k, v = rand(rng, 2, Tq, 4, 16), rand(rng, 2, Tk, 2, 16), rand(rng, 2, Tk, 2, 16)
    dout = rand(rng, 2, Tq, 4, 16)
    t = [torch.from_numpy(x.transpose(0, 2, 1, 3).copy()).requires_grad_() for x in (q, k, v)]
    tout = torch.nn.functional.scaled_dot_product_attention(*t, is_causal=is_causal,
                                                            enable_gqa=True)
    tout.backward(torch.from_numpy(dout.transpose(0, 2, 1, 3).copy()))
    out = snn.dot_product_attention(q, k, v, is_causal=is_causal)
    np.testing.assert_allclose(out, tout.detach().numpy().transpose(0, 2, 1, 3), atol=3e-6)
    grads = snn.dot_product_attention_vjp(q, k, v, dout, is_causal=is_causal)
    for a, tt in zip(grads, t):
        np.testing.assert_allclose(a, tt.grad.numpy().transpose(0, 2, 1, 3), atol=3e-5)


def test_fully_masked_rows_match_torch():
    torch = _torch()
    rng = np.random.default_rng(3)
    q, k, v = rand(rng, 1, 8, 2, 16), rand(rng, 1, 12, 2, 16), rand(rng, 1, 12, 2, 16)
    mask = rng.random((1, 2, 8, 12)) < 0.6
    mask[0, 1, 5] = False
    t = [torch.from_numpy(x.transpose(0, 2, 1, 3).copy()) for x in (q, k, v)]
    tout = torch.nn.functional.scaled_dot_product_attention(*t, attn_mask=torch.from_numpy(mask))
    out = snn.dot_product_attention(q, k, v, mask=mask)
    np.testing.assert_allclose(out, tout.numpy().transpose(0, 2, 1, 3), atol=3e-6)


# ---- inside shard_map -------------------------------------------------------------------------

def _mesh():
    import shardlab

    return shardlab, shardlab.make_mesh((2, 2), ("data", "model"))


def test_inside_shard_map_batch_and_heads_sharded():
    sl, mesh = _mesh()
    rng = np.random.default_rng(4)
    q, k, v = rand(rng, 4, 19, 4, 8), rand(rng, 4, 33, 2, 8), rand(rng, 4, 33, 2, 8)
    mask = _visible_mask(rng, (4, 1, 19, 33))
    spec, mspec = sl.P("data", None, "model"), sl.P("data")

    def f(q, k, v, mask):
        assert isinstance(q, sl.LocalArray) and q.shape == (2, 19, 2, 8)
        return snn.dot_product_attention(q, k, v, mask=mask, is_causal=True,
                                         return_residual=True)

    out, res = sl.shard_map(f, mesh=mesh, in_specs=(spec, spec, spec, mspec),
                            out_specs=(spec, spec))(q, k, v, mask)
    want, want_res = snn.dot_product_attention(q, k, v, mask=mask, is_causal=True,
                                               return_residual=True)
    np.testing.assert_allclose(np.asarray(out), want, atol=1e-6)
    np.testing.assert_allclose(np.asarray(res), want_res, atol=1e-6)

    dout = rand(rng, 4, 19, 4, 8)

    def g(q, k, v, dout, mask):
        return snn.dot_product_attention_vjp(q, k, v, dout, mask=mask, is_causal=True)

    grads = sl.shard_map(g, mesh=mesh, in_specs=(spec, spec, spec, spec, mspec),
                         out_specs=(spec, spec, spec))(q, k, v, dout, mask)
    for a, b in zip(grads, snn.dot_product_attention_vjp(q, k, v, dout, mask=mask,
                                                         is_causal=True)):
        np.testing.assert_allclose(np.asarray(a), b, atol=1e-5)


def test_inside_shard_map_replicated_kv_and_numpy_mask():
    # k, v are the same on every device (their storage has 1 along both mesh axes) and the
    # mask is a plain numpy array: both broadcast against the sharded query.
    sl, mesh = _mesh()
    rng = np.random.default_rng(5)
    q, k, v = rand(rng, 4, 12, 2, 16), rand(rng, 2, 20, 1, 16), rand(rng, 2, 20, 1, 16)
    mask = _visible_mask(rng, (12, 20))

    def f(q, k, v):
        return snn.dot_product_attention(q, k, v, mask=mask)

    out = sl.shard_map(f, mesh=mesh, in_specs=(sl.P("data"), sl.P(), sl.P()),
                       out_specs=sl.P("data"))(q, k, v)
    want = np.concatenate([snn.dot_product_attention(q[:2], k, v, mask=mask),
                           snn.dot_product_attention(q[2:], k, v, mask=mask)])
    np.testing.assert_allclose(np.asarray(out), want, atol=1e-6)


def test_inside_shard_map_three_dimensional():
    sl, mesh = _mesh()
    rng = np.random.default_rng(6)
    q, k, v = rand(rng, 24, 4, 8), rand(rng, 24, 2, 8), rand(rng, 24, 2, 8)
    spec = sl.P(None, "model")
    out = sl.shard_map(lambda q, k, v: snn.dot_product_attention(q, k, v, is_causal=True),
                       mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec)(q, k, v)
    np.testing.assert_allclose(np.asarray(out),
                               snn.dot_product_attention(q, k, v, is_causal=True), atol=1e-6)


def test_inside_shard_map_is_recorded_in_the_ledger():
    sl, mesh = _mesh()
    rng = np.random.default_rng(7)
    q, k, v = rand(rng, 4, 16, 4, 8), rand(rng, 4, 16, 2, 8), rand(rng, 4, 16, 2, 8)
    spec = sl.P("data", None, "model")
    with sl.Ledger() as ledger:
        sl.shard_map(lambda q, k, v: snn.dot_product_attention(q, k, v, is_causal=True),
                     mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec)(q, k, v)
    (event,) = [e for e in ledger.events if e["op"] == "attention"]
    # Local problem: B=2, Hq=2, D=8; causal 16x16 leaves 136 (query, key) pairs; 4 FLOPs each.
    assert event["flops"] == 4 * 2 * 2 * 8 * 136
    assert event["num_groups"] == mesh.size


def test_attention_events_are_priced_on_a_mesh_with_hardware():
    import shardlab as sl

    mesh = sl.make_mesh((2,), ("x",), hardware="tpu-v5e")
    rng = np.random.default_rng(8)
    q = rand(rng, 2, 16, 4, 8)
    spec = sl.P(None, None, "x")
    with sl.Ledger() as ledger:
        sl.shard_map(lambda q: snn.dot_product_attention(q, q, q), mesh=mesh, in_specs=spec, out_specs=spec)(q)
        sl.shard_map(lambda q: snn.dot_product_attention_vjp(q, q, q, q), mesh=mesh, in_specs=spec,
                     out_specs=(spec, spec, spec))(q)
    ops = [e["op"] for e in ledger.events]
    assert ops == ["attention", "attention_vjp"]
    assert all(e["seconds"] is not None and e["seconds"] > 0 for e in ledger.events)
    assert ledger.roofline().bound in ("compute", "memory", "communication")
