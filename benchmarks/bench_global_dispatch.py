"""Dispatch of one global-view (explicit-sharding) op against JAX's eager dispatch of the same op.

Two ops on an 8-device 2 x 4 mesh ('X', 'Y'), float32 [512, 512] operands sharded P('X', 'Y'):
``x + y`` (the broadcasting sharding rule, then each device's block) and
``jnp.einsum('ij,jk->ik', x, y, out_sharding=P('X', 'Y'))`` (the dot_general rule, then the
planner's collectives and the local GEMMs), and the einsum again on [64, 64] operands, where
the per-call work is small and dispatch dominates. Each is timed per call, sharding propagation
included, with shardlab and with JAX (8 CPU devices, ``jax_num_cpu_devices``) in the same run;
JAX's call waits for its result (``block_until_ready``), as shardlab's call returns a computed
array. Prints both times and the ratio (JAX / shardlab: at least 1 meets the goal), names the
CPU, and writes benchmarks/results/global_dispatch.json.

    python benchmarks/bench_global_dispatch.py
"""

from __future__ import annotations

import numpy as np

from common import report, settled_seconds

N = 512
SMALL = 64


def _shardlab_ops(n=N):
    import shardlab as sl
    import shardlab.numpy as jnp
    from shardlab import P

    mesh = sl.make_mesh((2, 4), ("X", "Y"))
    s = sl.NamedSharding(mesh, P("X", "Y"))
    rng = np.random.default_rng(0)
    x = sl.device_put(rng.standard_normal((n, n), dtype=np.float32), s)
    y = sl.device_put(rng.standard_normal((n, n), dtype=np.float32), s)
    return (lambda: x + y), (lambda: jnp.einsum("ij,jk->ik", x, y, out_sharding=s)), (x, y)


def _jax_ops(n=N):
    import jax
    jax.config.update("jax_num_cpu_devices", 8)
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = jax.make_mesh((2, 4), ("X", "Y"))
    s = NamedSharding(mesh, P("X", "Y"))
    rng = np.random.default_rng(0)
    x = jax.device_put(rng.standard_normal((n, n), dtype=np.float32), s)
    y = jax.device_put(rng.standard_normal((n, n), dtype=np.float32), s)
    return ((lambda: (x + y).block_until_ready()),
            (lambda: jnp.einsum("ij,jk->ik", x, y, out_sharding=s).block_until_ready()), (x, y))


def main() -> None:
    ours_add, ours_einsum, (ox, oy) = _shardlab_ops()
    jax_add, jax_einsum, _ = _jax_ops()
    a, b = np.asarray(ox), np.asarray(oy)
    np.testing.assert_allclose(np.asarray(ours_add()), np.asarray(jax_add()), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ours_einsum()), a @ b, rtol=1e-3, atol=1e-3)
    _, small_ours, _ = _shardlab_ops(SMALL)
    _, small_jax, _ = _jax_ops(SMALL)
    rows = []
    for case, ours, theirs, settle, window in (
            ("x + y, f32[512@X,512@Y]", ours_add, jax_add, 0.2, 0.5),
            ("einsum ij,jk->ik, f32[512@X,512@Y] x2, out P('X','Y')", ours_einsum, jax_einsum, 0.2, 2.0),
            ("the same einsum on f32[64@X,64@Y] (dispatch-bound)", small_ours, small_jax, 0.2, 1.0)):
        t_ours = settled_seconds(ours, settle, warm=0.2, window=window)
        t_jax = settled_seconds(theirs, settle, warm=0.2, window=window)
        rows.append((case, f"{t_ours * 1e6:.0f} us", f"JAX {t_jax * 1e6:.0f} us", t_jax / t_ours))
    report("global_dispatch", "Global-view dispatch on an 8-device 2x4 mesh (median per call)", rows)


if __name__ == "__main__":
    main()
