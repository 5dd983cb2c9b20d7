"""shardlab.kernels.flash_attention against float64 numpy, the C++ reference and itself."""


import ml_dtypes
import numpy as np
import pytest

from shardlab import _core
from shardlab.kernels import flash_attention, flash_attention_backward
from shardlab.kernels.attention import attention_reference, attention_reference_backward

BF16 = ml_dtypes.bfloat16
SIZES = [1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 65, 127, 129, 143, 145, 257, 287, 289]  # 64/144-row tiles


# ---- float64 numpy reference (the definition) -------------------------------------------------

def _full_mask(B, Hq, Tq, Tk, is_causal, mask):
    keep = np.ones((B, Hq, Tq, Tk), bool)
    if is_causal:
        keep &= np.tril(np.ones((Tq, Tk), bool))
    if mask is not None:
        keep &= np.broadcast_to(mask.reshape((1,) * (4 - mask.ndim) + mask.shape), keep.shape)
    return keep


def ref_probs(q, k, is_causal=False, scale=None, mask=None):
    q, k = q.astype(np.float64), k.astype(np.float64)
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    scale = 1 / np.sqrt(D) if scale is None else scale
    kk = np.repeat(k, Hq // Hkv, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, kk) * scale
    keep = _full_mask(B, Hq, Tq, Tk, is_causal, mask)
    s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(keep, np.exp(s - m), 0.0)
    l = e.sum(-1, keepdims=True)
    p = np.where(l > 0, e / np.where(l > 0, l, 1), 0.0)
    lse = np.where(l[..., 0] > 0, np.log(np.where(l[..., 0] > 0, l[..., 0], 1)) + m[..., 0], -np.inf)
    return p, lse, keep


def ref_forward(q, k, v, **kw):
    p, lse, _ = ref_probs(q, k, **kw)
    Hq, Hkv = q.shape[2], k.shape[2]
    vv = np.repeat(v.astype(np.float64), Hq // Hkv, axis=2)
    return np.einsum("bhij,bjhd->bihd", p, vv), lse


def ref_backward(q, k, v, dout, is_causal=False, scale=None, mask=None):
    p, _, _ = ref_probs(q, k, is_causal=is_causal, scale=scale, mask=mask)
    B, Tq, Hq, D = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    scale = 1 / np.sqrt(D) if scale is None else scale
    q64, do = q.astype(np.float64), dout.astype(np.float64)
    kk = np.repeat(k.astype(np.float64), G, axis=2)
    vv = np.repeat(v.astype(np.float64), G, axis=2)
    dv = np.einsum("bhij,bihd->bjhd", p, do)
    dp = np.einsum("bihd,bjhd->bhij", do, vv)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True)) * scale
    dq = np.einsum("bhij,bjhd->bihd", ds, kk)
    dk = np.einsum("bhij,bihd->bjhd", ds, q64)
    fold = lambda g: g.reshape(B, g.shape[1], Hkv, G, D).sum(3)
    return dq, fold(dk), fold(dv)


def rand(rng, *shape, sd=1.0):
    return (rng.standard_normal(shape) * sd).astype(np.float32)


def _close(a, b, tol, what):
    a = np.asarray(a, np.float64)
    err = np.max(np.abs(a - b)) if a.size else 0.0
    assert not np.isnan(a).any(), what
    assert err <= tol * (np.max(np.abs(b), initial=0.0) + 1e-2), f"{what}: max error {err}"


@pytest.fixture(params=[n for n in ("scalar", "avx2", "avx512")])
def isa(request):
    order = ["scalar", "avx2", "avx512", "avx512bf16"]
    if order.index(request.param) > order.index(_core.detected_isa()):
        pytest.skip(f"this CPU has no {request.param}")
    saved = _core.active_isa()
    _core.set_active_isa(request.param)
    yield request.param
    _core.set_active_isa(saved)


# ---- correctness ------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_random_odd_sizes_every_path(isa, seed):
    rng = np.random.default_rng(seed)
    Tq, Tk, D = (int(rng.choice(SIZES)) for _ in range(3))
    D = min(D, 129)
    Hkv = int(rng.integers(1, 3))
    Hq = Hkv * int(rng.integers(1, 4))
    B = int(rng.integers(1, 3))
    is_causal = bool(seed % 2)
    mask = rng.random((B, 1, Tq, Tk)) < 0.8 if seed % 3 == 0 else None
    q, k, v = rand(rng, B, Tq, Hq, D), rand(rng, B, Tk, Hkv, D), rand(rng, B, Tk, Hkv, D)
    out, lse = flash_attention(q, k, v, is_causal=is_causal, mask=mask, return_lse=True)
    ro, rl = ref_forward(q, k, v, is_causal=is_causal, mask=mask)
    _close(out, ro, 1e-5, "out")
    np.testing.assert_allclose(lse, rl, rtol=1e-5, atol=1e-5)
    dout = rand(rng, *out.shape)
    grads = flash_attention_backward(q, k, v, out, lse, dout, is_causal=is_causal, mask=mask)
    for g, r, name in zip(grads, ref_backward(q, k, v, dout, is_causal=is_causal, mask=mask),
                          ("dq", "dk", "dv")):
        assert g.dtype == np.float32 and g.shape == r.shape
        _close(g, r, 1e-4, name)


def test_matches_cpp_reference_backward():
    rng = np.random.default_rng(11)
    q, k, v = rand(rng, 2, 33, 4, 17), rand(rng, 2, 65, 2, 17), rand(rng, 2, 65, 2, 17)
    mask = rng.random((33, 65)) < 0.7
    out, lse = flash_attention(q, k, v, is_causal=True, mask=mask, scale=0.3, return_lse=True)
    ro, rl = attention_reference(q, k, v, is_causal=True, mask=mask, scale=0.3)
    np.testing.assert_allclose(out, ro, atol=2e-6)
    np.testing.assert_allclose(lse, rl, atol=2e-6, rtol=1e-6)
    dout = rand(rng, *out.shape)
    fast = flash_attention_backward(q, k, v, out, lse, dout, is_causal=True, mask=mask, scale=0.3)
    slow = attention_reference_backward(q, k, v, dout, is_causal=True, mask=mask, scale=0.3)
    for a, b in zip(fast, slow):
        np.testing.assert_allclose(a, b, atol=2e-5 * np.abs(b).max())


def test_fully_masked_rows_give_zeros_and_zero_grads():
    rng = np.random.default_rng(1)
    q, k, v = rand(rng, 1, 9, 2, 8), rand(rng, 1, 70, 2, 8), rand(rng, 1, 70, 2, 8)
    mask = rng.random((1, 2, 9, 70)) < 0.5
    mask[0, 0, 3] = False
    mask[0, 1, :] = False
    out, lse = flash_attention(q, k, v, mask=mask, return_lse=True)
    assert not np.isnan(out).any()
    assert np.all(out[0, 3, 0] == 0) and np.all(out[0, :, 1] == 0)
    assert lse[0, 0, 3] == -np.inf and np.all(lse[0, 1] == -np.inf)
    dq, dk, dv = flash_attention_backward(q, k, v, out, lse, rand(rng, *out.shape), mask=mask)
    for g in (dq, dk, dv):
        assert np.isfinite(g).all()
    assert np.all(dq[0, 3, 0] == 0) and np.all(dq[0, :, 1] == 0)
    # Head 1 sees nothing at all, so its kv head (GQA off: head 1) gets no gradient.
    assert np.all(dk[0, :, 1] == 0) and np.all(dv[0, :, 1] == 0)
    ro, _ = ref_forward(q, k, v, mask=mask)
    np.testing.assert_allclose(out, ro, atol=1e-5)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_huge_logits_are_stable(sign):
    rng = np.random.default_rng(2)
    q = rand(rng, 1, 40, 2, 16)
    k = rand(rng, 1, 77, 2, 16)
    # Logits of magnitude ~1e4: scale chosen so scale * |q.k| reaches 1e4.
    scale = sign * 1e4 / np.abs(np.einsum("bihd,bjhd->bhij", q, k)).max()
    v = rand(rng, 1, 77, 2, 16)
    out, lse = flash_attention(q, k, v, scale=scale, is_causal=True, return_lse=True)
    ro, rl = ref_forward(q, k, v, scale=scale, is_causal=True)
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    np.testing.assert_allclose(out, ro, atol=1e-4)
    np.testing.assert_allclose(lse, rl, rtol=1e-5)
    dout = rand(rng, *out.shape)
    grads = flash_attention_backward(q, k, v, out, lse, dout, scale=scale, is_causal=True)
    dq, dk, dv = ref_backward(q, k, v, dout, scale=scale, is_causal=True)
    for g in grads:
        assert np.isfinite(g).all()
    # The softmax is nearly one-hot, so dq and dk are tiny differences dP - rowsum(P * dP) of
    # O(|dout| |v|) terms, multiplied by the ~1e3 scale: fp32 rounding of those terms is the
    # natural error floor (JAX and torch have it too), so the tolerance is relative to it.
    floor = abs(scale) * 16 * np.abs(dout).max() * np.abs(v).max() * np.abs(k).max()
    assert np.max(np.abs(grads[0] - dq)) <= 1e-6 * floor
    assert np.max(np.abs(grads[1] - dk)) <= 1e-6 * floor
    # ulp(1e4) in fp32 is ~1e-3, so recomputed probabilities carry ~1e-3 relative error.
    _close(grads[2], dv, 2e-3, "dv")


def test_gqa_equals_repeated_heads():
    rng = np.random.default_rng(3)
    q, k, v = rand(rng, 2, 31, 6, 20), rand(rng, 2, 45, 2, 20), rand(rng, 2, 45, 2, 20)
    kr, vr = np.repeat(k, 3, axis=2), np.repeat(v, 3, axis=2)
    out, lse = flash_attention(q, k, v, is_causal=True, return_lse=True)
    out_r, lse_r = flash_attention(q, kr, vr, is_causal=True, return_lse=True)
    np.testing.assert_allclose(out, out_r, atol=1e-6)
    np.testing.assert_allclose(lse, lse_r, atol=1e-6)
    dout = rand(rng, *out.shape)
    dq, dk, dv = flash_attention_backward(q, k, v, out, lse, dout, is_causal=True)
    dq_r, dk_r, dv_r = flash_attention_backward(q, kr, vr, out_r, lse_r, dout, is_causal=True)
    np.testing.assert_allclose(dq, dq_r, atol=1e-5)
    np.testing.assert_allclose(dk, dk_r.reshape(2, 45, 2, 3, 20).sum(3), atol=1e-5)
    np.testing.assert_allclose(dv, dv_r.reshape(2, 45, 2, 3, 20).sum(3), atol=1e-5)


@pytest.mark.parametrize("Tq,Tk", [(70, 70), (33, 129), (129, 33), (1, 65)])
def test_causal_equals_explicit_tril_mask(Tq, Tk):
    rng = np.random.default_rng(Tq * 1000 + Tk)
    q, k, v = rand(rng, 1, Tq, 2, 24), rand(rng, 1, Tk, 2, 24), rand(rng, 1, Tk, 2, 24)
    tril = np.tril(np.ones((Tq, Tk), bool))  # top-left aligned, as jax.nn and torch SDPA
    a, la = flash_attention(q, k, v, is_causal=True, return_lse=True)
    b, lb = flash_attention(q, k, v, mask=tril, return_lse=True)
    np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(la, lb, atol=1e-6)
    dout = rand(rng, *a.shape)
    for x, y in zip(flash_attention_backward(q, k, v, a, la, dout, is_causal=True),
                    flash_attention_backward(q, k, v, b, lb, dout, mask=tril)):
        np.testing.assert_allclose(x, y, atol=1e-5)


@pytest.mark.parametrize("Tq,Tk", [(200, 200), (333, 129), (129, 333)])
def test_causal_forward_is_bit_identical_to_the_tril_mask_on_every_path(isa, Tq, Tk):
    # Tiles above the diagonal are skipped under is_causal and fully masked under tril; a
    # masked tile must not rescale O or l at all (the rescale is exactly 1 when the max holds).
    rng = np.random.default_rng(Tq + Tk)
    q, k, v = rand(rng, 1, Tq, 2, 32), rand(rng, 1, Tk, 2, 32), rand(rng, 1, Tk, 2, 32)
    tril = np.tril(np.ones((Tq, Tk), bool))
    a, la = flash_attention(q, k, v, is_causal=True, return_lse=True)
    b, lb = flash_attention(q, k, v, mask=tril, return_lse=True)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(la, lb)


def test_gradients_match_finite_differences():
    # Central differences of the float64 numpy definition along random directions, against
    # the kernel's float32 gradients: checks the backward formulas, not just agreement with a
    # second implementation of them.
    rng = np.random.default_rng(5)
    q, k, v = rand(rng, 1, 19, 4, 12), rand(rng, 1, 23, 2, 12), rand(rng, 1, 23, 2, 12)
    mask = rng.random((19, 23)) < 0.8
    dout = rand(rng, 1, 19, 4, 12)
    kw = dict(is_causal=True, mask=mask, scale=0.4)
    out, lse = flash_attention(q, k, v, return_lse=True, **kw)
    grads = flash_attention_backward(q, k, v, out, lse, dout, **kw)
    loss = lambda qq, kk, vv: float((ref_forward(qq, kk, vv, **kw)[0] * dout).sum())
    base = [x.astype(np.float64) for x in (q, k, v)]
    for which in range(3):
        for _ in range(3):
            d = rng.standard_normal(base[which].shape)
            eps = 1e-4
            plus = [x.copy() for x in base]
            minus = [x.copy() for x in base]
            plus[which] += eps * d
            minus[which] -= eps * d
            fd = (loss(*plus) - loss(*minus)) / (2 * eps)
            an = float((grads[which].astype(np.float64) * d).sum())
            assert abs(fd - an) <= 1e-4 * (abs(fd) + 1), (which, fd, an)


def test_bfloat16_within_tolerance():
    rng = np.random.default_rng(6)
    q, k, v = (rand(rng, 2, 65, 4, 32).astype(BF16), rand(rng, 2, 129, 2, 32).astype(BF16),
               rand(rng, 2, 129, 2, 32).astype(BF16))
    out, lse = flash_attention(q, k, v, is_causal=True, return_lse=True)
    assert out.dtype == BF16 and lse.dtype == np.float32
    ro, rl = ref_forward(q, k, v, is_causal=True)
    # Statistics are fp32, so only the final bf16 rounding of out (2^-9 relative) remains.
    assert np.max(np.abs(out.astype(np.float64) - ro)) <= np.abs(ro).max() / 256
    np.testing.assert_allclose(lse, rl, rtol=1e-5, atol=1e-5)
    dout = rand(rng, *out.shape).astype(BF16)
    grads = flash_attention_backward(q, k, v, out, lse, dout, is_causal=True)
    # Gradients see the bf16-rounded out (through rowsum(dout * out)) and are rounded to bf16.
    for g, r in zip(grads, ref_backward(q, k, v, dout, is_causal=True)):
        assert g.dtype == BF16
        assert np.max(np.abs(g.astype(np.float64) - r)) <= 2e-2 * np.abs(r).max()


def test_non_contiguous_inputs():
    rng = np.random.default_rng(7)
    base = rand(rng, 2, 40, 3, 16)
    q = np.swapaxes(rand(rng, 2, 3, 40, 16), 1, 2)  # [B, T, H, D] view of [B, H, T, D]
    k = base[:, ::2]
    v = np.asfortranarray(rand(rng, 2, 20, 3, 16))
    mask = (rng.random((40, 20)) < 0.8).T.copy().T
    out = flash_attention(q, k, v, mask=mask)
    ref = flash_attention(*(np.ascontiguousarray(x) for x in (q, k, v)), mask=np.ascontiguousarray(mask))
    np.testing.assert_array_equal(out, ref)


def test_empty_sequences():
    q = np.zeros((1, 0, 2, 8), np.float32)
    k = np.zeros((1, 5, 2, 8), np.float32)
    out, lse = flash_attention(q, k, k, return_lse=True)
    assert out.shape == (1, 0, 2, 8) and lse.shape == (1, 2, 0)
    out = flash_attention(np.ones((1, 3, 2, 8), np.float32), k[:, :0], k[:, :0])
    assert out.shape == (1, 3, 2, 8) and not out.any()


# ---- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "q_shape,k_shape,v_shape,match",
    [
        ((1, 4, 3, 8), (1, 4, 2, 8), (1, 4, 2, 8), r"query heads 3 is not a multiple .* 2"),
        ((1, 4, 2, 8), (1, 4, 2, 8), (1, 5, 2, 8), r"k has shape \(1, 4, 2, 8\) but v has"),
        ((1, 4, 2, 8), (2, 4, 2, 8), (2, 4, 2, 8), r"batch 1 but k has batch 2"),
        ((1, 4, 2, 8), (1, 4, 2, 16), (1, 4, 2, 16), r"head_dim 8 but k has head_dim 16"),
        ((4, 2, 8), (4, 2, 8), (4, 2, 8), r"q must be 4-D .* got shape \(4, 2, 8\)"),
    ],
)
def test_shape_errors(q_shape, k_shape, v_shape, match):
    with pytest.raises(ValueError, match=r"\[flash_attention\] .*" + match):
        flash_attention(np.zeros(q_shape, np.float32), np.zeros(k_shape, np.float32),
                        np.zeros(v_shape, np.float32))


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.float16])
def test_dtype_errors(dtype):
    x = np.zeros((1, 4, 2, 8), dtype)
    with pytest.raises(TypeError, match=r"\[flash_attention\] q has dtype .*supported"):
        flash_attention(x, x, x)


def test_mixed_dtype_and_mask_errors():
    x = np.zeros((1, 4, 2, 8), np.float32)
    with pytest.raises(TypeError, match="q has dtype float32 but k has dtype bfloat16"):
        flash_attention(x, x.astype(BF16), x)
    with pytest.raises(TypeError, match="mask must be boolean"):
        flash_attention(x, x, x, mask=np.ones((4, 4), np.float32))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 4\) does not broadcast to .*\(1, 2, 4, 4\)"):
        flash_attention(x, x, x, mask=np.ones((3, 4), bool))
    with pytest.raises(ValueError, match=r"\[flash_attention_backward\] lse has shape"):
        flash_attention_backward(x, x, x, x, np.zeros((1, 4, 2), np.float32), x)
    with pytest.raises(ValueError, match=r"\[flash_attention_backward\] dout has shape"):
        flash_attention_backward(x, x, x, x, np.zeros((1, 2, 4), np.float32), x[:, :3])


@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_nan_inputs_propagate(isa, where):
    # NaN must not be silently dropped (a NaN score clamped to exp2(-127) = 0 would be).
    rng = np.random.default_rng(8)
    arrays = {n: rand(rng, 1, 20, 1, 16) for n in ("q", "k", "v")}
    arrays[where][0, 3, 0, 2] = np.nan
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    out, lse = flash_attention(q, k, v, is_causal=True, return_lse=True)
    # Causal: a NaN query poisons its own row; a NaN key or value every row that sees it.
    # (A NaN value may also reach rows that give it probability 0, as 0 * NaN does in JAX's
    # and torch's P @ V.)
    seen_by = [3] if where == "q" else list(range(3, 20))
    assert np.isnan(out[0, seen_by]).any(axis=(1, 2)).all()
    if where != "v":
        assert not np.isnan(np.delete(out, seen_by, axis=1)).any()
        assert np.isnan(lse[0, 0, seen_by]).all()
    dq, dk, _ = flash_attention_backward(q, k, v, out, lse, np.ones_like(out), is_causal=True)
    assert np.isnan(dq).any() and np.isnan(dk).any()
