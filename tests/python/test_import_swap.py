"""Code from the JAX docs runs after changing the imports (README's promise)."""

from functools import partial

import numpy as np


def test_jax_docs_matmul_runs_with_shardlab_imports():
    import shardlab as jax
    import shardlab.numpy as jnp
    from shardlab.experimental.shard_map import shard_map
    from shardlab.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: F401

    mesh = jax.make_mesh((4, 2), ("x", "y"))
    a = jnp.arange(8 * 16.0).reshape(8, 16)
    b = jnp.arange(16 * 4.0).reshape(16, 4)

    @partial(shard_map, mesh=mesh, in_specs=(P("x", "y"), P("y", None)), out_specs=P("x", None))
    def matmul_basic(a_block, b_block):
        c_partialsum = jnp.dot(a_block, b_block)
        return jax.lax.psum(c_partialsum, "y")

    c = matmul_basic(a, b)
    np.testing.assert_allclose(np.asarray(c), a @ b)

    @jax.jit
    def reduce_scatter(x):
        return jax.shard_map(lambda x: jax.lax.psum_scatter(x, "x", tiled=True), mesh=mesh,
                             in_specs=P(None, "y"), out_specs=P("x", "y"))(x)

    y = jax.block_until_ready(reduce_scatter(jnp.ones((8, 16), dtype=jnp.float32)))
    assert y.sharding.spec == P("x", "y")
    np.testing.assert_array_equal(np.asarray(y), np.full((8, 16), 4.0))  # each block summed over 4 x-devices
    q = np.ones((1, 4, 2, 8), np.float32)
    assert jax.nn.dot_product_attention(q, q, q).shape == (1, 4, 2, 8)
