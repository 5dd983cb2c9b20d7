"""shardlab.models timings: every calculator on every preset, and a small transformer's forward
pass on 8 virtual devices.

No other library computes these calculators from a checked model, so there is no competitor
column for them: the figures printed are ours only. Targets from the issue: all calculators
for all presets together < 100 ms; the forward of a 2-layer D=256 model on 8 virtual devices
< 50 ms (the target is printed beside the measurement, never asserted).

Run:  PYTHONPATH=python python benchmarks/bench_models.py
      OMP_NUM_THREADS=1 PYTHONPATH=python python benchmarks/bench_models.py

On a loaded machine the GEMM's OpenMP threads can wait on each other far longer than the small
matmuls of this model take; the header prints the thread setting so runs can be compared.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import numpy as np

import shardlab as sl
from shardlab import P
from shardlab.models import (ModelConfig, flops_per_token, kv_cache_bytes, mfu, param_count, presets,
                             step_time_lower_bound, training_memory, transformer)


def _best(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def all_calculators():
    for name in presets.names():
        c = presets.get(name)
        param_count(c)
        flops_per_token(c, 4096, training=True, remat="attention")
        kv_cache_bytes(c, 8192, "int8")
        training_memory(c, "fsdp+tp", {"data": 16, "model": 8}, batch=256, context=4096, remat="full")
        mfu(c, 1e6, "h100", 1024, context=4096)
        step_time_lower_bound(c, 4_000_000, "tpu-v5p", 1024, context=4096)


def forward_case(batch: int, seq: int):
    cfg = ModelConfig(num_layers=2, d_model=256, ffw_dim=1024, num_heads=4, vocab_size=1024, max_seq_len=seq)
    params = transformer.init_params(cfg, seed=0)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, seq))
    mesh = sl.make_mesh((8,), ("x",))
    f = sl.shard_map(lambda p, t: transformer.forward(p, t, cfg), mesh=mesh, in_specs=(P(), P("x")),
                     out_specs=P("x"))
    f(params, tokens)
    return lambda: f(params, tokens), cfg


def main() -> None:
    results = []
    best, med = _best(all_calculators)
    n = len(presets.names())
    print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    print(f"{'case':58s} {'best':>10s} {'median':>10s} {'target':>8s}")
    print(f"{'6 calculators x ' + str(n) + ' presets (ours; no competitor exists)':58s} "
          f"{best * 1e3:8.2f}ms {med * 1e3:8.2f}ms {'100ms':>8s}")
    results.append({"case": "all calculators, all presets", "best_s": best, "median_s": med, "target_s": 0.1})
    for batch, seq in ((8, 16), (8, 64), (8, 128)):
        fn, cfg = forward_case(batch, seq)
        best, med = _best(fn)
        gflop = flops_per_token(cfg, seq, training=False).for_tokens(batch) / 1e9
        label = f"forward L=2 D=256 F=1024 V=1024, {batch}x{seq} tokens, 8 devices"
        print(f"{label:58s} {best * 1e3:8.2f}ms {med * 1e3:8.2f}ms {'50ms':>8s}  "
              f"({gflop:.3f} GFLOP, {gflop / best:.1f} GFLOP/s)")
        results.append({"case": label, "best_s": best, "median_s": med, "target_s": 0.05, "gflop": gflop})
    if "--json" in sys.argv:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
