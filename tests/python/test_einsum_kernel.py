"""einsum_arrays (the GEMM lowering of jnp.einsum) against numpy's einsum on random terms,
letter orders and odd sizes: the grouped views it hands the GEMM must equal the definition."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlab._src.kernels.einsum import _operand_view, _unmerged_prefix, einsum_arrays


@st.composite
def contraction(draw):
    letters = list("abcdefg")
    n = draw(st.integers(2, 6))
    used = letters[:n]
    roles = {c: draw(st.sampled_from(["batch", "a", "b", "contract", "sum_a"])) for c in used}
    ta = [c for c in used if roles[c] in ("batch", "a", "contract", "sum_a")]
    tb = [c for c in used if roles[c] in ("batch", "b", "contract")]
    out = [c for c in used if roles[c] in ("batch", "a", "b")]
    ta = "".join(draw(st.permutations(ta))) if ta else ""
    tb = "".join(draw(st.permutations(tb))) if tb else ""
    out = "".join(draw(st.permutations(out))) if out else ""
    sizes = {c: draw(st.integers(1, 7)) for c in used}
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    return ta, tb, out, sizes, dtype


@settings(max_examples=120, deadline=None)
@given(contraction(), st.integers(0, 2**31 - 1))
def test_einsum_arrays_matches_numpy(case, seed):
    ta, tb, out, sizes, dtype = case
    rng = np.random.default_rng(seed)
    a = rng.standard_normal([sizes[c] for c in ta]).astype(dtype)
    b = rng.standard_normal([sizes[c] for c in tb]).astype(dtype)
    got = einsum_arrays([ta, tb], out, [a, b])
    ref = np.einsum(f"{ta},{tb}->{out}", a.astype(np.float64), b.astype(np.float64))
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5)


def test_operand_view_is_a_view_for_a_weight_gradient():
    # x^T of a weight gradient: [b, t, d] contracted over (b, t) needs no copy.
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    v = _operand_view(x, "btd", [], ["d"], ["b", "t"], {"b": 2, "t": 3, "d": 4})
    assert v.shape == (4, 6) and np.shares_memory(v, x)
    np.testing.assert_array_equal(v, x.reshape(6, 4).T)


def test_mesh_dims_stay_batch_dims_without_copies():
    """Storage [data, model, m, k] against a weight invariant along data: 'data' becomes a
    batch dim broadcast in the weight instead of being merged into M by a copy."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 5, 6)).astype(np.float32)       # letters b a m k
    w = rng.standard_normal((1, 4, 6, 3)).astype(np.float32)[0]    # letters a k n
    v = _operand_view(x, "bamk", ["a", "b"], ["m"], ["k"], {"a": 4, "b": 2, "m": 5, "k": 6})
    assert v.shape == (4, 2, 5, 6) and np.shares_memory(v, x)
    np.testing.assert_allclose(einsum_arrays(["bamk", "akn"], "bamn", [x, w]),
                               np.einsum("bamk,akn->bamn", x, w), rtol=1e-5, atol=1e-5)


def test_weight_gradient_with_a_mesh_letter_apart_from_its_feature_letter():
    """'bcamn,bamk->bckn' (the gradient of a weight: c a mesh letter, n the features, apart in
    the operand): c becomes a GEMM batch letter instead of being merged with n by a copy, and
    the operands swap so the output comes out contiguous in 'bckn' order."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 3, 4, 5, 6)).astype(np.float32)   # b c a m n
    b = rng.standard_normal((2, 4, 5, 7)).astype(np.float32)      # b a m k
    got = einsum_arrays(["bcamn", "bamk"], "bckn", [a, b])
    np.testing.assert_allclose(got, np.einsum("bcamn,bamk->bckn", a, b), rtol=1e-5, atol=1e-5)
    assert got.flags.c_contiguous
    assert _unmerged_prefix(a, "bcamn", ["c", "n"]) == ["c"]      # c and n do not chain
    assert _unmerged_prefix(a, "bcamn", ["a", "m"]) == []         # a and m do
