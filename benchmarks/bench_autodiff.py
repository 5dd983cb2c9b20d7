"""Primitive dispatch overhead and the cost of a gradient, against JAX in the same run.

- dispatch: one bind on a tiny array (an elementwise op, a reduction, a psum inside shard_map)
  against JAX's eager dispatch of the same op;
- value_and_grad of the FSDP MLP (autodiff through shard_map: all_gathers forward,
  reduce-scatters backward) as a multiple of its forward, and against
  jax.jit(jax.value_and_grad(...)) on 8 host CPU devices.

    python benchmarks/bench_autodiff.py     # writes benchmarks/results/autodiff.json
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import numpy as np  # noqa: E402

import shardlab as sl  # noqa: E402
import shardlab.numpy as snp  # noqa: E402
from shardlab import P  # noqa: E402
from common import best, report  # noqa: E402


def dispatch(rows, jax, jnp):
    """Per-call CPU time (time.process_time: single-threaded work, so a busy machine's
    descheduling does not count), best of 15 x n calls, both sides."""
    cpu = time.process_time
    if jax:  # JAX's first eager ops compile on background threads, whose CPU time would count
        for _ in range(3):
            (jnp.ones(8, np.float32) + 1.0).block_until_ready()
            jnp.sum(jnp.ones(8, np.float32)).block_until_ready()
        time.sleep(0.5)
    mesh = sl.make_mesh((8,), ("x",))
    n = 2000
    cases = {}

    def body(a):
        cases["add"] = best(lambda: a + 1.0, number=n, repeat=15, clock=cpu)
        cases["sum"] = best(lambda: snp.sum(a), number=n, repeat=15, clock=cpu)
        cases["psum"] = best(lambda: sl.lax.psum(a, "x"), number=n, repeat=15, clock=cpu)
        return a

    sl.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(np.ones(64, np.float32))
    priced = sl.make_mesh((8,), ("x",), hardware="tpu-v5e")

    def priced_body(a):  # the same psum with its ledger event priced on the chip
        cases["psum, event priced on tpu-v5e"] = best(lambda: sl.lax.psum(a, "x"), number=n, repeat=15, clock=cpu)
        return a

    sl.shard_map(priced_body, mesh=priced, in_specs=P("x"), out_specs=P("x"))(np.ones(64, np.float32))
    ja = jnp.ones(8, np.float32) if jax else None
    theirs = {"add": (lambda: (ja + 1.0).block_until_ready()) if jax else None,
              "sum": (lambda: jnp.sum(ja).block_until_ready()) if jax else None}
    for op, t in cases.items():
        ref = theirs.get(op)
        t_ref = best(ref, number=n, repeat=15, clock=cpu) if ref else float("nan")
        label = f"JAX eager {t_ref * 1e6:.1f} µs" if ref else "(no eager JAX equivalent outside shard_map)"
        rows.append((f"dispatch: {op} on a tiny per-device value (8 devices), CPU µs per call", f"{t * 1e6:.1f} µs", label,
                     t_ref / t if ref else float("nan")))


def fsdp_loss(lib, lax, shard_map, mesh, P_):
    spec = P_("x", None)

    def fwd(x, w1, w2):
        h = lib.maximum(x @ lax.all_gather(w1, "x", tiled=True), 0.0)
        return h @ lax.all_gather(w2, "x", tiled=True)

    f = shard_map(fwd, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec)
    return lambda x, w1, w2: 0.5 * lib.sum(f(x, w1, w2) ** 2)


def gradient_step(rows, jax, jnp):
    b, d, f = 256, 1024, 4096
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, d)).astype(np.float32)
    w1 = (rng.standard_normal((d, f)) / np.sqrt(d)).astype(np.float32)
    w2 = (rng.standard_normal((f, d)) / np.sqrt(f)).astype(np.float32)
    mesh = sl.make_mesh((8,), ("x",))
    loss = fsdp_loss(snp, sl.lax, sl.shard_map, mesh, P)
    step = sl.value_and_grad(loss, argnums=(1, 2))
    t_fwd = best(lambda: loss(x, w1, w2), repeat=5)
    t_step = best(lambda: step(x, w1, w2), repeat=5)
    rows.append((f"value_and_grad / forward, FSDP MLP (B={b} D={d} F={f}, 8 devices)",
                 f"{t_step * 1e3:.1f} ms / {t_fwd * 1e3:.1f} ms", "goal <= 3.5x", t_step / t_fwd))
    if not jax:
        rows.append(("value_and_grad FSDP MLP vs JAX", f"{t_step * 1e3:.1f} ms", "jax not installed", float("nan")))
        return
    jmesh = jax.make_mesh((8,), ("x",))
    jloss = fsdp_loss(jnp, jax.lax, jax.shard_map, jmesh, jax.sharding.PartitionSpec)
    jstep = jax.jit(jax.value_and_grad(jloss, argnums=(1, 2)))
    sh = jax.sharding.NamedSharding(jmesh, jax.sharding.PartitionSpec("x", None))
    xs = [jax.device_put(v, sh) for v in (x, w1, w2)]
    with jax.set_mesh(jmesh):
        t_jax = best(lambda: jax.block_until_ready(jstep(*xs)), repeat=5)
        ref = jstep(*xs)
    got = step(x, w1, w2)
    err = max(float(np.max(np.abs(np.asarray(g) - np.asarray(r))) / np.max(np.abs(np.asarray(r))))
              for g, r in zip(got[1], ref[1]))
    rows.append((f"value_and_grad FSDP MLP vs jax.jit(value_and_grad), rel err {err:.1e}",
                 f"{t_step * 1e3:.1f} ms", f"JAX-CPU {t_jax * 1e3:.1f} ms", t_jax / t_step))


def main() -> int:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        jax = jnp = None
    rows: list = []
    dispatch(rows, jax, jnp)
    gradient_step(rows, jax, jnp)
    report("autodiff", "shardlab autodiff", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
