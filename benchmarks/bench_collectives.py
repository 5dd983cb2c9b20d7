"""Collective throughput, per-call overhead, big meshes, replicated memory, and an FSDP MLP
step against JAX-CPU with 8 host devices, all in one run.

    python benchmarks/bench_collectives.py            # writes benchmarks/results/collectives.json
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import numpy as np  # noqa: E402

import shardlab as sl  # noqa: E402
from shardlab import P  # noqa: E402
from common import best, report  # noqa: E402

MB = 1 << 20


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def collective_bandwidth(rows):
    mesh = sl.make_mesh((8,), ("x",))
    n = 64 * MB // 4
    src = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    dst = np.empty_like(src)
    t_memcpy = best(lambda: np.copyto(dst, src))
    memcpy_bw = 2 * src.nbytes / t_memcpy  # bytes read + written per second
    x = sl.device_put(src, sl.NamedSharding(mesh, P("x")))  # 64 MB global, 8 MB per device
    progs = {
        "all_gather (64 MB gathered)": (lambda a: sl.lax.all_gather(a, "x", tiled=True), P(), 2 * 64 * MB),
        "psum (8 MB per device)": (lambda a: sl.lax.psum(a, "x"), P(), 64 * MB + 8 * MB),
        "all_to_all (8 MB per device)": (lambda a: sl.lax.all_to_all(a, "x", 0, 0, tiled=True), P("x"), 2 * 64 * MB),
    }
    for name, (body, out_spec, touched) in progs.items():
        f = sl.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=out_spec)
        t = best(lambda: f(x))
        bw = touched / t
        rows.append((name, f"{bw / 1e9:.2f} GB/s", f"memcpy {memcpy_bw / 1e9:.2f} GB/s", bw / memcpy_bw))


def per_call_overhead(rows):
    mesh = sl.make_mesh((8,), ("x",))
    calls = 2000

    def body(a):
        for _ in range(calls):
            a = sl.lax.psum(a, "x") * 0.125
            a = sl.lax.pvary(a, "x")
        return a

    f = sl.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    x = np.ones((8, 4), np.float32)
    mesh.ledger.clear()
    t = best(lambda: f(x), repeat=3)
    mesh.ledger.clear()

    def baseline(a):
        for _ in range(calls):
            a = a * 0.125
            a = sl.lax.pvary(a, "x")
        return a

    g = sl.shard_map(baseline, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    t0 = best(lambda: g(x), repeat=3)
    us = (t - t0) / calls * 1e6
    rows.append(("psum overhead, f32[4] per device", f"{us:.2f} us/call", "target 20 us", 20 / us))


def big_mesh(rows):
    mesh = sl.make_mesh((16, 16, 16), ("x", "y", "z"))

    def body(a):
        s = sl.lax.psum(a, ("x", "y", "z"))
        g = sl.lax.all_gather(a, "z", tiled=True)
        return s, g

    f = sl.shard_map(body, mesh=mesh, in_specs=P(("x", "y", "z")), out_specs=(P(), P(("x", "y"))))
    x = np.arange(4096 * 4, dtype=np.float32)
    t = best(lambda: f(x), repeat=3)
    rows.append(("16x16x16 mesh: psum + all_gather", f"{t * 1e3:.1f} ms", "target 1000 ms", 1.0 / t))


def replicated_memory(rows):
    mesh = sl.make_mesh((64,), ("x",))
    big = np.ones(1 << 28, np.float32)  # 1 GiB
    before = rss_bytes()
    arr = sl.device_put(big, sl.NamedSharding(mesh, P()))
    grown = rss_bytes() - before
    rows.append(("replicated 1 GiB on 64 devices", f"host {arr.host_nbytes / 2**30:.2f} GiB, RSS +{grown / 2**30:.2f} GiB",
                 f"emulated {arr.emulated_nbytes / 2**30:.0f} GiB", arr.emulated_nbytes / max(grown, 1)))
    del arr, big


def fsdp_step(lib, lax, shard_map, mesh, P_):
    """One FSDP MLP step: forward, manual backward, reduce-scattered weight gradients."""

    def step(x, w1, w2):
        w1f = lax.all_gather(w1, "x", tiled=True)          # W1[D_X, F] -> W1[D, F]
        w2f = lax.all_gather(w2, "x", tiled=True)          # W2[F_X, D] -> W2[F, D]
        h = x @ w1f
        a = lib.maximum(h, 0)
        y = a @ w2f
        dy = y                                             # d(0.5 * |y|^2)
        dw2 = lax.psum_scatter(a.T @ dy, "x", scatter_dimension=0, tiled=True)
        da = dy @ w2f.T
        dh = lib.where(h > 0, da, 0)
        dw1 = lax.psum_scatter(x.T @ dh, "x", scatter_dimension=0, tiled=True)
        return y, dw1, dw2

    spec = P_("x", None)
    return shard_map(step, mesh=mesh, in_specs=(spec, spec, spec), out_specs=(spec, spec, spec))


def vs_jax(rows):
    b, d, f = 256, 1024, 4096
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, d)).astype(np.float32)
    w1 = (rng.standard_normal((d, f)) / np.sqrt(d)).astype(np.float32)
    w2 = (rng.standard_normal((f, d)) / np.sqrt(f)).astype(np.float32)
    mesh = sl.make_mesh((8,), ("x",))
    ours = fsdp_step(np, sl.lax, sl.shard_map, mesh, P)
    t_ours = best(lambda: ours(x, w1, w2), repeat=5)
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        rows.append(("FSDP MLP step (8 devices)", f"{t_ours * 1e3:.1f} ms", "jax not installed", float("nan")))
        return
    jmesh = jax.make_mesh((8,), ("x",))
    theirs = jax.jit(fsdp_step(jnp, jax.lax, jax.shard_map, jmesh, jax.sharding.PartitionSpec))
    xs = [jax.device_put(v, jax.sharding.NamedSharding(jmesh, jax.sharding.PartitionSpec("x", None)))
          for v in (x, w1, w2)]
    t_jax = best(lambda: jax.block_until_ready(theirs(*xs)), repeat=5)
    ref = [np.asarray(v) for v in theirs(*xs)]
    got = [np.asarray(v) for v in ours(x, w1, w2)]
    err = max(float(np.max(np.abs(g - r)) / np.max(np.abs(r))) for g, r in zip(got, ref))
    rows.append((f"FSDP MLP step (8 dev, B={b} D={d} F={f}), rel err {err:.1e}", f"{t_ours * 1e3:.1f} ms",
                 f"JAX-CPU {t_jax * 1e3:.1f} ms", t_jax / t_ours))


def main() -> int:
    rows: list = []
    for part in (collective_bandwidth, per_call_overhead, big_mesh, replicated_memory, vs_jax):
        part(rows)
    report("collectives", "shardlab collectives", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
