"""einsum_arrays (the GEMM lowering of jnp.einsum) against numpy's einsum on random terms,
letter orders and odd sizes: the grouped views it hands the GEMM must equal the definition."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlab._src.kernels.einsum import _grouped, einsum_arrays


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


def test_grouped_is_a_view_when_groups_are_contiguous():
    # x^T of a weight gradient: [b, t, d] contracted over (b, t) needs no copy.
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    g = _grouped(x, "btd", ([], ["d"], ["b", "t"]), {"b": 2, "t": 3, "d": 4})
    assert g.shape == (1, 4, 6) and np.shares_memory(g, x)
    np.testing.assert_array_equal(g[0], x.reshape(6, 4).T)


def test_grouped_copies_when_a_group_is_split():
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    g = _grouped(x, "btd", ([], ["t"], ["b", "d"]), {"b": 2, "t": 3, "d": 4})
    np.testing.assert_array_equal(g[0], x.transpose(1, 0, 2).reshape(3, 8))
