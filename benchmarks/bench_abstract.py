"""Abstract mode at scale: forward and backward of an 80-layer, 73-billion-parameter dense
transformer under FSDP + tensor parallelism on a full TPU v5p pod (8,960 chips, mesh
16 x 20 x 28), run shape-only with shardlab.eval_shape. Prints the time, the peak RSS, the
ledger's totals and the per-step estimate, and the same program's real run on a small mesh
checked event for event against its abstract run.

The model: D = 8960 (64 heads of 140), grouped-query attention with 8 KV heads, F = 26880,
vocab 32000, sequence 4096. Tensor parallelism over 'x' (16): heads and F split 16 ways, the
KV projection replicated and each device slicing its KV head (4 query heads share one). FSDP
over ('y', 'z') (560): every weight's D dimension split 560 ways, gathered before use; the
batch (560 sequences) split the same way.

    python benchmarks/bench_abstract.py          # writes benchmarks/results/abstract.json
"""

from __future__ import annotations

import json
import os
import pathlib
import resource
import sys
import time

import numpy as np
from rich.console import Console
from rich.table import Table

import shardlab as sl
import shardlab.numpy as jnp
from shardlab import P
from shardlab.train import tree_map

from common import cpu_model


class Config:
    def __init__(self, layers, d, heads, kv_heads, head_dim, f, vocab, seq, batch):
        self.layers, self.d, self.heads, self.kv_heads, self.head_dim = layers, d, heads, kv_heads, head_dim
        self.f, self.vocab, self.seq, self.batch = f, vocab, seq, batch

    def params(self) -> int:
        nh, kh = self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = 2 * self.d * nh + 2 * self.d * kh + 3 * self.d * self.f + 2 * self.d
        return self.layers * per_layer + 2 * self.vocab * self.d + self.d


BIG = Config(layers=80, d=8960, heads=64, kv_heads=8, head_dim=140, f=26880, vocab=32000, seq=4096, batch=560)
SMALL = Config(layers=2, d=64, heads=8, kv_heads=2, head_dim=8, f=96, vocab=32, seq=8, batch=4)
FSDP, TP = ("y", "z"), "x"


def specs(cfg: Config) -> dict:
    layer = {"wq": P(FSDP, TP), "wk": P(FSDP, None), "wv": P(FSDP, None), "wo": P(TP, FSDP),
             "w1": P(FSDP, TP), "w3": P(FSDP, TP), "w2": P(TP, FSDP), "norm1": P(), "norm2": P()}
    return {"layers": [layer] * cfg.layers, "head": P(FSDP, TP), "final_norm": P()}


def shapes(cfg: Config) -> dict:
    nh, kh = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    layer = {"wq": (cfg.d, nh), "wk": (cfg.d, kh), "wv": (cfg.d, kh), "wo": (nh, cfg.d), "w1": (cfg.d, cfg.f),
             "w3": (cfg.d, cfg.f), "w2": (cfg.f, cfg.d), "norm1": (cfg.d,), "norm2": (cfg.d,)}
    return {"layers": [layer] * cfg.layers, "head": (cfg.d, cfg.vocab), "final_norm": (cfg.d,)}


def gather(w, dim):
    return sl.lax.all_gather(w, FSDP, axis=dim, tiled=True)


def layer_fn(cfg: Config, tp: int):
    group = cfg.heads // cfg.kv_heads                      # query heads per KV head
    local_heads = cfg.heads // tp

    def layer(x, p):
        b, t, _ = x.shape
        h = sl.nn.rms_norm(x, p["norm1"])
        q = jnp.reshape(h @ gather(p["wq"], 0), (b, t, local_heads, cfg.head_dim))
        # This device's query heads share one KV head: slice its columns of the replicated K/V.
        kv_start = (sl.lax.axis_index(TP) * local_heads // group) * cfg.head_dim
        wk = sl.lax.dynamic_slice_in_dim(gather(p["wk"], 0), kv_start, cfg.head_dim, axis=1)
        wv = sl.lax.dynamic_slice_in_dim(gather(p["wv"], 0), kv_start, cfg.head_dim, axis=1)
        k = jnp.reshape(h @ wk, (b, t, 1, cfg.head_dim))
        v = jnp.reshape(h @ wv, (b, t, 1, cfg.head_dim))
        a = sl.nn.dot_product_attention(q, k, v, is_causal=True)
        x = x + sl.lax.psum(jnp.reshape(a, (b, t, -1)) @ gather(p["wo"], 1), TP)
        h = sl.nn.rms_norm(x, p["norm2"])
        g = sl.nn.silu(h @ gather(p["w1"], 0)) * (h @ gather(p["w3"], 0))
        return x + sl.lax.psum(g @ gather(p["w2"], 1), TP)

    return layer


def loss_fn(cfg: Config, mesh):
    tp = mesh.shape[TP]
    layer = layer_fn(cfg, tp)

    def body(x, params):
        for i, p in enumerate(params["layers"]):
            with sl.named_scope(f"layer{i}"):
                x = layer(x, p)
        h = sl.nn.rms_norm(x, params["final_norm"])
        logits = h @ gather(params["head"], 0)            # vocab split over TP
        return sl.lax.psum(jnp.sum(logits * logits), (TP,) + FSDP) / logits.size

    f = sl.shard_map(body, mesh=mesh, in_specs=(P(FSDP), specs(cfg)), out_specs=P())
    return lambda x, params: jnp.sum(f(x, params))


def structs(cfg: Config, mesh):
    sp, sh = specs(cfg), shapes(cfg)

    def one(shape, spec):
        return sl.ShapeDtypeStruct(shape, np.float32, sharding=sl.NamedSharding(mesh, spec))

    params = {"layers": [{k: one(s[k], q[k]) for k in s} for s, q in zip(sh["layers"], sp["layers"])],
              "head": one(sh["head"], sp["head"]), "final_norm": one(sh["final_norm"], sp["final_norm"])}
    return one((cfg.batch, cfg.seq, cfg.d), P(FSDP)), params


def small_check() -> str:
    """The same program on a 2x2x2 mesh: real run and abstract run, event for event."""
    mesh = sl.make_mesh((2, 2, 2), ("x", "y", "z"), hardware="tpu-v5p")
    x_s, p_s = structs(SMALL, mesh)
    rng = np.random.default_rng(0)
    real_x = sl.device_put(rng.standard_normal(x_s.shape).astype(np.float32) * 0.1, x_s.sharding)
    real_p = tree_map(lambda s: sl.device_put(rng.standard_normal(s.shape).astype(np.float32) * 0.1, s.sharding), p_s)
    step = sl.value_and_grad(loss_fn(SMALL, mesh), argnums=1)
    with sl.Ledger() as real:
        step(real_x, real_p)
    with sl.Ledger() as abstract:
        sl.eval_shape(step, x_s, p_s)
    same = real.program_events() == abstract.program_events()
    return f"{len(real)} events, abstract == real: {same}"


def main() -> int:
    check = small_check()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    mesh = sl.make_mesh((16, 20, 28), ("x", "y", "z"), hardware="tpu-v5p", abstract=True)
    x, params = structs(BIG, mesh)
    step = sl.value_and_grad(loss_fn(BIG, mesh), argnums=1)
    with sl.Ledger() as ledger:
        sl.eval_shape(step, x, params)
    seconds = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    roof = ledger.roofline(overlap="max")
    by_phase = ledger.by_phase()
    table = Table(title=f"abstract mode on {cpu_model()} ({os.cpu_count()} cores, load {os.getloadavg()[0]:.2f})")
    table.add_column("case")
    table.add_column("shardlab")
    table.add_column("goal")
    rows = [
        ("model", f"{BIG.layers} layers, {BIG.params() / 1e9:.1f}B parameters, D={BIG.d}, F={BIG.f}", ""),
        ("mesh", f"TPU v5p {mesh.size} chips {tuple(mesh.axis_sizes)}: TP over x, FSDP over (y, z)", ""),
        ("forward + backward, shape-only", f"{seconds:.2f} s", "< 10 s"),
        ("peak RSS of the process", f"{rss / 2**30:.2f} GiB (before: {rss0 / 2**30:.2f} GiB)", "< 1 GiB"),
        ("ledger events", f"{len(ledger)} ({by_phase['forward']['count']} forward, "
                          f"{by_phase['backward']['count']} backward)", ""),
        ("bytes sent per device", sl.units.fmt_bytes(ledger.total_bytes_sent), ""),
        ("FLOPs per device", sl.units.fmt_flops(ledger.total_flops), ""),
        ("estimated step (roofline, overlap=max)", f"{sl.units.fmt_seconds(roof.total_seconds)}, {roof.bound}-bound",
         ""),
        ("same program, 2x2x2 mesh", check, "abstract == real"),
    ]
    for r in rows:
        table.add_row(*r)
    Console(width=200).print(table)
    out = pathlib.Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "abstract.json").write_text(json.dumps({"seconds": seconds, "rss_bytes": rss, "events": len(ledger),
                                                   "params": BIG.params(), "step_seconds": roof.total_seconds},
                                                  indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
