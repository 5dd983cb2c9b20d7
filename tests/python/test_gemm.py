"""shardlab.kernels.gemm against numpy (float64 reference) on every ISA path of this CPU.

Tolerance. The kernel accumulates in float32, so against the exact (float64) product of the
same inputs each element is within (K + 2) * 2^-24 * (|a| @ |b|). bfloat16 inputs are exact
in float32 and so are their products; a bfloat16 result adds one rounding to nearest even,
at most 2^-8 |c| (8 significant bits: unit roundoff 2^-8). Errors from a wrong
index or a lost k-block are of order |a| @ |b|, far outside both bounds.
"""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest
import threadpoolctl
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlab import _core
from shardlab.kernels import gemm

BF16 = ml_dtypes.bfloat16
ALL_ISAS = ["scalar", "avx2", "avx512", "avx512bf16"]
ISAS = ALL_ISAS[: ALL_ISAS.index(_core.detected_isa()) + 1]
ODD_SIZES = [1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 65, 127, 129, 257]


@pytest.fixture(params=ISAS)
def isa(request):
    saved = _core.active_isa()
    _core.set_active_isa(request.param)
    yield request.param
    _core.set_active_isa(saved)


def reference(a, b):
    """np.matmul in float64 of the values actually stored, and the magnitude |a| @ |b|."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.matmul(a64, b64), np.matmul(np.abs(a64), np.abs(b64))


def assert_close(got, a, b, *, bf16_out=False):
    want, mag = reference(a, b)
    k = np.shape(a)[-1]
    tol = (k + 2) * 2.0**-24 * mag
    if bf16_out:
        tol = tol * (1 + 2.0**-8) + 2.0**-8 * np.abs(want)
    err = np.abs(np.asarray(got, np.float64) - want)
    assert np.shape(got) == np.shape(want)
    bad = err > tol
    assert not bad.any(), f"{bad.sum()} elements off, worst err/tol {np.max(err / np.maximum(tol, 1e-300)):.3g}"


def rand(rng, shape, dtype):
    return rng.uniform(-1, 1, shape).astype(np.float32).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_odd_sizes(isa, dtype):
    rng = np.random.default_rng(ISAS.index(isa))
    for _ in range(6):
        m, n, k = rng.choice(ODD_SIZES, 3)
        a, b = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype)
        out = gemm(a, b)
        assert out.dtype == np.dtype(dtype)
        assert_close(out, a, b, bf16_out=dtype is BF16)
        f32 = gemm(a, b, preferred_element_type=np.float32)
        assert f32.dtype == np.float32
        assert_close(f32, a, b)


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    isa=st.sampled_from(ISAS),
    dtype=st.sampled_from([np.float32, BF16]),
    m=st.integers(1, 70),
    n=st.integers(1, 70),
    k=st.integers(1, 70),
    a_t=st.booleans(),
    b_t=st.booleans(),
)
def test_hypothesis_shapes_and_layouts(data, isa, dtype, m, n, k, a_t, b_t):
    # Batch dims: up to two, each either shared or broadcast (1 or missing) on one side.
    batch = data.draw(st.lists(st.integers(1, 3), max_size=2))
    a_batch = [d if data.draw(st.booleans()) else 1 for d in batch]
    b_batch = [d if data.draw(st.booleans()) else 1 for d in batch]
    if data.draw(st.booleans()) and b_batch:
        b_batch = b_batch[1:]  # rank difference, broadcast as numpy does
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    a = rand(rng, (*a_batch, k, m), dtype).swapaxes(-1, -2) if a_t else rand(rng, (*a_batch, m, k), dtype)
    b = rand(rng, (*b_batch, n, k), dtype).swapaxes(-1, -2) if b_t else rand(rng, (*b_batch, k, n), dtype)
    saved = _core.active_isa()
    _core.set_active_isa(isa)
    try:
        got = gemm(a, b, preferred_element_type=np.float32)
    finally:
        _core.set_active_isa(saved)
    assert_close(got, a, b)


def test_views_are_read_in_place(isa):
    rng = np.random.default_rng(1)
    base = rand(rng, (40, 66), np.float32)
    a = base[::-2, 1::2]                       # negative and non-unit strides
    b = np.broadcast_to(rand(rng, (33,), np.float32)[:, None], (33, 17))  # stride 0
    assert_close(gemm(a, b), a, b)
    a3 = np.broadcast_to(a, (4, *a.shape))     # stride-0 batch dim
    assert_close(gemm(a3, b), a3, b)
    fortran = np.asfortranarray(rand(rng, (19, 33), np.float32))
    assert_close(gemm(fortran, a.T), fortran, a.T)


def test_views_with_byte_strides_are_copied_not_rejected():
    rng = np.random.default_rng(6)
    rec = np.zeros((12, 9), dtype=[("x", np.float32), ("pad", np.uint8)])
    rec["x"] = rand(rng, (12, 9), np.float32)
    a = rec["x"]                               # byte strides 45 and 5: not whole float32s
    raw = np.zeros(4 * 9 * 7 + 2, np.uint8)
    raw[2:] = np.frombuffer(rand(rng, 63, np.float32).tobytes(), np.uint8)
    b = np.frombuffer(raw.data, np.float32, count=63, offset=2).reshape(9, 7)  # misaligned
    assert a.strides[1] % 4 and b.ctypes.data % 4
    assert_close(gemm(a, b), a, b)


def test_one_dimensional_operands_follow_np_matmul():
    rng = np.random.default_rng(2)
    v, w = rand(rng, (5,), np.float32), rand(rng, (5,), np.float32)
    m, s = rand(rng, (5, 3), np.float32), rand(rng, (2, 4, 5), np.float32)
    for x, y in [(v, m), (m.T, v), (v, w), (s, v), (v, s.swapaxes(-1, -2))]:
        got = gemm(x, y)
        assert np.shape(got) == np.matmul(x, y).shape
        assert_close(got, x, y)


def test_empty_dimensions():
    a = np.ones((0, 3), np.float32)
    assert gemm(a, np.ones((3, 4), np.float32)).shape == (0, 4)
    z = gemm(np.ones((2, 0), np.float32), np.ones((0, 3), np.float32))
    np.testing.assert_array_equal(z, np.zeros((2, 3), np.float32))
    assert gemm(np.ones((0, 2, 3), BF16), np.ones((3, 4), BF16)).shape == (0, 2, 4)


def test_bf16_result_is_rounded_to_nearest_even():
    rng = np.random.default_rng(3)
    a, b = rand(rng, (17, 33), BF16), rand(rng, (33, 9), BF16)
    f32 = gemm(a, b, preferred_element_type=np.float32)
    np.testing.assert_array_equal(gemm(a, b).view(np.uint16), f32.astype(BF16).view(np.uint16))


@pytest.mark.parametrize(
    "a, b, error, words",
    [
        (np.ones((2, 2)), np.ones((2, 2)), TypeError, ["float64", "np.matmul", "astype"]),
        (np.ones((2, 2), np.int32), np.ones((2, 2), np.int32), TypeError, ["int32"]),
        (np.ones((2, 2), np.float32), np.ones((2, 2), BF16), TypeError, ["float32", "bfloat16"]),
        (np.ones((3, 4), np.float32), np.ones((5, 6), np.float32), ValueError, ["inner dimensions 4 and 5"]),
        (np.ones((2, 3, 4), np.float32), np.ones((3, 4, 5), np.float32), ValueError, ["broadcast"]),
        (np.float32(2.0), np.ones((2, 2), np.float32), ValueError, ["at least one dimension"]),
    ],
)
def test_bad_input_raises_clear_errors(a, b, error, words):
    with pytest.raises(error, match=r"^\[gemm\]") as info:
        gemm(a, b)
    for w in words:
        assert w in str(info.value)


def test_bad_preferred_element_type():
    x = np.ones((2, 2), np.float32)
    with pytest.raises(TypeError, match="preferred_element_type float64"):
        gemm(x, x, preferred_element_type=np.float64)


def test_core_rejects_what_the_python_layer_would_fix():
    x = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match="same rank"):
        _core.gemm(x, x[None])
    with pytest.raises(TypeError, match="float64"):
        _core.gemm(x.astype(np.float64), x)


@pytest.mark.parametrize("threads", [1, 2])
def test_thread_counts_give_identical_results(threads):
    rng = np.random.default_rng(4)
    a, b = rand(rng, (3, 129, 65), np.float32), rand(rng, (65, 257), np.float32)
    big_a, big_b = rand(rng, (300, 200), np.float32), rand(rng, (200, 150), np.float32)
    with threadpoolctl.threadpool_limits(1, user_api="openmp"):
        one, big_one = gemm(a, b), gemm(big_a, big_b)
    with threadpoolctl.threadpool_limits(threads, user_api="openmp"):
        got, big_got = gemm(a, b), gemm(big_a, big_b)
    # Work is split over rows/columns of C, never over K, so the sums are the same.
    np.testing.assert_array_equal(got, one)
    np.testing.assert_array_equal(big_got, big_one)
    assert_close(got, a, b)


def test_concurrent_python_threads():
    # The binding releases the GIL; calls from several threads must not interfere.
    rng = np.random.default_rng(5)
    pairs = [(rand(rng, (64, 48), np.float32), rand(rng, (48, 80), np.float32)) for _ in range(8)]
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda p: gemm(*p), pairs))
    for (a, b), out in zip(pairs, outs):
        assert_close(out, a, b)


@pytest.mark.skipif("avx2" not in ISAS, reason="CPU has no AVX2")
def test_shardlab_isa_environment_variable_caps_the_path():
    code = "from shardlab import _core; print(_core.active_isa())"
    env = dict(os.environ, SHARDLAB_ISA="avx2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "avx2"


def test_fma_peak_is_a_positive_rate_and_rejects_bad_thread_counts():
    with pytest.raises(ValueError, match=r"\[measure_fma_peak_gflops\] threads 0"):
        _core.measure_fma_peak_gflops(0)
    if _core.detected_isa() == "scalar":
        with pytest.raises(RuntimeError, match="no AVX2"):
            _core.measure_fma_peak_gflops(1)
        return
    peak = _core.measure_fma_peak_gflops(1)
    assert np.isfinite(peak) and peak > 0


def test_arrays_with_their_own_float32_dtype_object_take_the_kernel():
    """An unpickled or np.load-ed array carries a float32 dtype equal to, not identical with,
    numpy's: the kernels take it (they used to refuse it as 'float32 is not float32')."""
    import io
    import pickle

    a = pickle.loads(pickle.dumps(np.arange(12, dtype=np.float32).reshape(3, 4)))
    buf = io.BytesIO()
    np.save(buf, np.ones((4, 2), np.float32))
    buf.seek(0)
    b = np.load(buf)
    assert a.dtype is not np.dtype(np.float32)
    np.testing.assert_allclose(gemm(a, b), np.asarray(a) @ np.asarray(b), rtol=1e-6)
