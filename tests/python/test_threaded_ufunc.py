"""Elementwise ufuncs split over threads give numpy's answer, element for element."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlab._src.kernels import threaded
from shardlab._src.kernels.threaded import MIN_PARALLEL_SIZE, ufunc_call


@st.composite
def broadcast_case(draw):
    rank = draw(st.integers(1, 4))
    shape = [draw(st.integers(1, 9)) for _ in range(rank)]
    shape[draw(st.integers(0, rank - 1))] *= 97  # large enough to reach the threaded path often
    shapes = []
    for _ in range(draw(st.integers(1, 3))):
        drop = draw(st.integers(0, rank - 1))  # right-aligned broadcasting: fewer leading dims
        shapes.append(tuple(1 if draw(st.booleans()) else n for n in shape[drop:]))
    return tuple(shape), shapes


@settings(max_examples=60, deadline=None)
@given(case=broadcast_case(), seed=st.integers(0, 2**16), min_size=st.sampled_from([1, 64, MIN_PARALLEL_SIZE]))
def test_matches_numpy_with_broadcasting(case, seed, min_size):
    _, shapes = case
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    ufunc = {1: np.exp, 2: np.multiply, 3: np.clip}[len(args)]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(threaded, "MIN_PARALLEL_SIZE", min_size)
        got = ufunc_call(ufunc, args)
    want = ufunc(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("args", [
    [np.arange(200_000, dtype=np.int32).reshape(2, 100_000), np.float32(0.5)],  # numpy scalar: strong type
    [np.arange(200_000, dtype=np.int8).reshape(400, 500), 3],                    # Python scalar: weak
    [np.ones((1, 1, 300_000), np.float32), np.ones((3, 1, 1), np.float64)],
])
def test_result_dtype_is_numpys(monkeypatch, args):
    monkeypatch.setattr(threaded, "MIN_PARALLEL_SIZE", 1)
    got, want = ufunc_call(np.add, args), np.add(*args)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_splits_work_over_every_worker(monkeypatch):
    """Each worker writes its own slab: the thread that computed each row is recorded."""
    import threading

    if threaded.WORKERS < 2:
        pytest.skip("one CPU: nothing to split")
    seen = set()

    class Spy:
        def __init__(self, f):
            self.f = f

        def __call__(self, *a, **k):
            seen.add(threading.get_ident())
            return self.f(*a, **k)

    a = np.ones((8, MIN_PARALLEL_SIZE), np.float32)
    out = ufunc_call(Spy(np.negative), [a])
    np.testing.assert_array_equal(out, -a)
    assert len(seen) == threaded.WORKERS


def test_small_and_zero_size_outputs():
    assert ufunc_call(np.add, [np.float32(1), np.float32(2)]) == np.float32(3)
    z = ufunc_call(np.multiply, [np.ones((0, MIN_PARALLEL_SIZE), np.float32), np.float32(2)])
    assert z.shape == (0, MIN_PARALLEL_SIZE)


def test_a_forked_child_still_runs_threaded_ufuncs():
    """The pool's threads do not survive fork; the child gets a pool of its own instead of
    waiting forever on workers that do not exist."""
    import multiprocessing as mp

    if threaded.WORKERS < 2:
        pytest.skip("one CPU: no pool")
    a = np.ones((4, MIN_PARALLEL_SIZE), np.float32)
    ufunc_call(np.negative, [a])  # the parent's workers are running
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        total = pool.apply_async(_child_sum, (a,)).get(timeout=60)
    assert total == -a.size


def _child_sum(a):
    return float(ufunc_call(np.negative, [a]).sum())
