"""The demo (``python -m shardlab.demo``): an 8-device mesh, a sharded matrix drawn, an
FSDP-style and a Megatron-style matmul under shard_map checked against numpy, and the ledger
with the time each step would take on an 8-chip TPU v5e slice.
"""

from __future__ import annotations

import numpy as np
from rich.console import Console

import shardlab as sl
from shardlab import P


def fsdp_matmul(mesh):
    """x[B_X, D] @ W[D_X, F]: all_gather the weight shards, then multiply locally."""

    @sl.shard_map(mesh=mesh, in_specs=(P("x", None), P("x", None)), out_specs=P("x", None))
    def step(x, w):
        w_full = sl.lax.all_gather(w, "x", tiled=True)
        return x @ w_full

    return step


def megatron_mlp(mesh):
    """y = relu(x @ W1[D, F_X]) @ W2[F_X, D]: column- then row-parallel, one psum."""

    @sl.shard_map(mesh=mesh, in_specs=(P(), P(None, "x"), P("x", None)), out_specs=P())
    def mlp(x, w1, w2):
        h = np.maximum(x @ w1, 0)
        return sl.lax.psum(h @ w2, "x")

    return mlp


def main() -> int:
    console = Console(width=110)
    mesh = sl.make_mesh((8,), ("x",), hardware="tpu-v5e")
    rng = np.random.default_rng(0)
    console.rule(f"shardlab {sl.__version__}: {mesh.size} virtual devices, mesh {mesh.shape}")

    a = sl.device_put(rng.standard_normal((16, 8)).astype(np.float32), sl.NamedSharding(mesh, P("x")))
    console.print(f"A: {a.shape} {a.dtype} sharded {a.sharding.spec}, local shape "
                  f"{a.addressable_shards[0].data.shape}, {a.nbytes_per_device} B per device")
    sl.debug.visualize_array_sharding(a)

    b, d, f = 64, 256, 512
    x = rng.standard_normal((b, d)).astype(np.float32)
    w = (rng.standard_normal((d, f)) / np.sqrt(d)).astype(np.float32)
    w1 = (rng.standard_normal((d, f)) / np.sqrt(d)).astype(np.float32)
    w2 = (rng.standard_normal((f, d)) / np.sqrt(f)).astype(np.float32)

    with sl.Ledger() as ledger:
        y_fsdp = np.asarray(fsdp_matmul(mesh)(x, w))
        y_tp = np.asarray(megatron_mlp(mesh)(x, w1, w2))

    ref_fsdp = x.astype(np.float64) @ w
    ref_tp = np.maximum(x.astype(np.float64) @ w1, 0) @ w2
    err_fsdp = float(np.max(np.abs(y_fsdp - ref_fsdp)) / np.max(np.abs(ref_fsdp)))
    err_tp = float(np.max(np.abs(y_tp - ref_tp)) / np.max(np.abs(ref_tp)))
    ok = err_fsdp < 1e-5 and err_tp < 1e-5
    console.print(f"FSDP matmul     {x.shape} @ {w.shape}: max rel. error vs numpy {err_fsdp:.2e}")
    console.print(f"Megatron MLP    {x.shape} -> {f} -> {d}: max rel. error vs numpy {err_tp:.2e}")
    console.print(ledger)
    console.print(ledger.roofline().text(), markup=False)
    console.print("[bold green]all checks passed[/]" if ok else "[bold red]MISMATCH against numpy[/]")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
