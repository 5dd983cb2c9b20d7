"""The row scatter-add (a row gather's gradient) against numpy's np.add.at and against JAX."""

import numpy as np
import pytest

import shardlab as sl
import shardlab._core as _core
import shardlab.numpy as jnp
from shardlab import P
from shardlab.models.transformer import embedding_lookup


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (3, 17, 40, 33), (2, 5, 301, 129)])
def test_core_kernel_matches_add_at(dtype, shape):
    p, r, n, c = shape
    rng = np.random.default_rng(sum(shape))
    out = rng.standard_normal((p, r, c)).astype(dtype)
    idx = rng.integers(0, r, (p, n)).astype(np.int32)
    src = rng.standard_normal((p, n, c)).astype(dtype)
    want = out.copy()
    for q in range(p):
        np.add.at(want[q], idx[q], src[q])
    _core.scatter_add_rows(out, idx, src[:, :, ::-1][:, :, ::-1])  # a strided (but equal) source
    np.testing.assert_allclose(out, want, rtol=1e-6 if dtype == np.float32 else 1e-12)


def test_core_kernel_errors_name_the_op_and_the_bad_value():
    out = np.zeros((1, 4, 2), np.float32)
    with pytest.raises(IndexError, match=r"\[scatter_add_rows\] index 4 .* outside the 4 rows"):
        _core.scatter_add_rows(out, np.array([[0, 4]], np.int32), np.ones((1, 2, 2), np.float32))
    assert not out.any()
    with pytest.raises(ValueError, match=r"\[scatter_add_rows\] dst and src must both be float32"):
        _core.scatter_add_rows(out, np.array([[0, 1]], np.int32), np.ones((1, 2, 2), np.float64))
    with pytest.raises(ValueError, match=r"\[scatter_add_rows\] dst is read-only"):
        _core.scatter_add_rows(np.broadcast_to(out, out.shape), np.array([[0, 1]], np.int32),
                               np.ones((1, 2, 2), np.float32))


def _embedding_loss(table, ids, w):
    return jnp.sum(embedding_lookup(table, ids) * w)


@pytest.mark.parametrize("negative", [False, True])
def test_embedding_gradient_per_device_matches_jax(negative):
    """Each device gathers rows of its own vocabulary shard with repeated ids (and, like numpy and
    JAX, -1 means the last row); the table's gradient matches jax.grad of the same program."""
    jax = pytest.importorskip("jax")
    mesh = sl.make_mesh((4,), ("x",))
    rng = np.random.default_rng(0)
    table = rng.standard_normal((4 * 6, 5)).astype(np.float32)       # 6 rows per device
    ids = rng.integers(0, 6, (4 * 3, 7)).astype(np.int32)             # 3 sequences per device
    ids[0, :3] = ids[0, 3]                                             # repeats on one device
    if negative:
        ids[1, 0] = -1
    w = rng.standard_normal((4 * 3, 7, 5)).astype(np.float32)
    f = sl.shard_map(lambda t, i, w: _embedding_loss(t, i, w)[None], mesh=mesh,
                     in_specs=(P("x"), P("x"), P("x")), out_specs=P("x"))
    g = np.asarray(sl.grad(lambda t: jnp.sum(f(t, ids, w)))(table))

    def ref_loss(t):
        per = [jax.numpy.sum(jax.numpy.take(t[6 * d:6 * d + 6], ids[3 * d:3 * d + 3], axis=0, mode="wrap")
                             * w[3 * d:3 * d + 3]) for d in range(4)]
        return sum(per)

    np.testing.assert_allclose(g, np.asarray(jax.grad(ref_loss)(table)), rtol=1e-5, atol=1e-6)


def test_general_scatter_still_handles_an_index_that_varies_along_the_row():
    """Not a row gather (the index differs across the trailing axis): the element path."""
    jax = pytest.importorskip("jax")
    x = np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32)
    idx = np.array([[5, 0, 2, 2], [1, 1, 0, 5], [3, 3, 3, 3]], np.int32)
    g = sl.grad(lambda x: jnp.sum(jnp.take_along_axis(x, idx, axis=0) ** 2))(x)
    ref = jax.grad(lambda x: jax.numpy.sum(jax.numpy.take_along_axis(x, idx, axis=0) ** 2))(x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(ref), rtol=1e-6)


def test_row_gather_matches_numpy_take_along_axis_per_device():
    """The forward of the lookup: rows per device (the fast path), negatives counting from the
    end as numpy's; an index past the table raises as numpy's does."""
    mesh = sl.make_mesh((2, 2), ("x", "y"))
    rng = np.random.default_rng(3)
    table = rng.standard_normal((2 * 5, 3)).astype(np.float32)
    idx = rng.integers(-5, 5, (2 * 7, 1)).astype(np.int32)
    f = sl.shard_map(lambda t, i: jnp.take_along_axis(t, i, axis=0), mesh=mesh, in_specs=(P("x"), P("y")),
                     out_specs=P(("x", "y")))
    got = np.asarray(f(table, idx))
    want = np.concatenate([np.take_along_axis(table[5 * a:5 * a + 5], idx[7 * b:7 * b + 7], axis=0)
                           for a in range(2) for b in range(2)])
    np.testing.assert_array_equal(got, want)
    with pytest.raises(IndexError):
        f(table, np.full((14, 1), 5, np.int32))


def test_take_along_axis_errors_speak_of_local_shapes():
    jax = pytest.importorskip("jax")
    mesh = sl.make_mesh((2,), ("x",))
    f = sl.shard_map(lambda t, i: jnp.take_along_axis(t, i, axis=0), mesh=mesh, in_specs=(P("x"), P("x")),
                     out_specs=P("x"))
    table = np.ones((10, 3), np.float32)
    with pytest.raises(ValueError, match=r"\[take_along_axis\] index local shape \(2, 2\) does not broadcast "
                                         r"against the array's local shape \(5, 3\) in dim 1"):
        f(table, np.zeros((4, 2), np.int32))
    with pytest.raises(ValueError):  # JAX refuses the same shapes
        jax.numpy.take_along_axis(table[:5], np.zeros((2, 2), np.int32), axis=0)
    with pytest.raises(ValueError, match=r"\[take_along_axis\] indices of local rank 3 for a value of local rank 2"):
        f(table, np.zeros((4, 3, 1), np.int32))
