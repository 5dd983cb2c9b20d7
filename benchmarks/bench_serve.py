"""shardlab.serve: simulating 100,000 requests, and decoding 64 tokens on 8 virtual devices.

1. The serving simulator (step times from serve.StepModel) on 100,000 Poisson requests to two
   interleaved replicas of LLaMA-3 8B on 8 TPU v5e each (goal: under 10 s), and the same trace
   disaggregated (one prefill + one decode replica). The reference is the same simulator as
   SimPy processes (its previous engine, kept by tests/python/test_serve_sim_simpy.py), run on
   the same trace; the two must give identical per-request times (checked here).
2. Megatron decode of a 2-layer D=256 model, batch 8, 64 tokens, inside shardlab.shard_map on 8
   virtual devices (goal: under 2 s), with the contiguous and with the paged KV cache, beside
   the same tokens decoded unsharded (the reference the sharded run must equal token for token).

vLLM needs a GPU and Vidur profiles operators on a GPU before it can simulate, so neither
starts on this machine. The GEMM kernel's OpenMP threads matter on a loaded machine: the
table's title names OMP_NUM_THREADS and the load.

    python benchmarks/bench_serve.py [--requests 100000] [--tokens 64] [--no-simpy] [--json out.json]
                                                # writes benchmarks/results/serve.json
"""

from __future__ import annotations

import argparse
import json
import os
import importlib
import pathlib
import sys
import time

import numpy as np

import shardlab as sl
from shardlab.models import ModelConfig, presets, transformer
from shardlab.serve import ServingConfig, StepModel, generate, poisson_requests, simulate
from shardlab.serve.sharded import generate_sharded
from common import report

CONFIGS = {"interleaved": ServingConfig(replicas=2, max_batch=128, chunk_size=256, prefix_cache_blocks=8192),
           "disaggregated": ServingConfig(mode="disaggregated", max_batch=256, prefix_cache_blocks=8192)}


def _simpy_reference():
    """The SimPy version of the simulator (the test oracle tests/python/simpy_reference.py), or None
    without SimPy."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "python"))
    try:
        return importlib.import_module("simpy_reference").simpy_simulate
    except ImportError:
        return None


def bench_simulator(n: int, with_simpy: bool) -> dict:
    model = StepModel(presets.get("llama3-8b"), "tpu-v5e", {"x": 8})
    reqs = poisson_requests(n, 30.0, prompt_len=("lognormal", 1000, 0.6), output_len=("exponential", 150),
                            shared_prefixes=16, prefix_len=256, prefix_fraction=0.5, seed=0)
    ref = _simpy_reference() if with_simpy else None
    out = {}
    for name, cfg in CONFIGS.items():
        t = time.perf_counter()
        r = simulate(reqs, model, cfg)
        dt = time.perf_counter() - t
        row = {"seconds": dt, "simpy_seconds": None, **{k: v for k, v in r.summary().items() if k != "mode"}}
        if ref is not None:
            t = time.perf_counter()
            s = ref(reqs, model, cfg)
            row["simpy_seconds"] = time.perf_counter() - t
            assert np.array_equal(s.finish, r.finish, equal_nan=True) and \
                np.array_equal(s.first_token, r.first_token, equal_nan=True), "the SimPy reference differs"
        out[name] = row
    return out


def bench_decode(tokens: int) -> dict:
    cfg = ModelConfig(num_layers=2, d_model=256, ffw_dim=1024, num_heads=8, vocab_size=1024)
    params = transformer.init_params(cfg, seed=0)
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, (8, 16))
    mesh = sl.make_mesh((8,), ("x",))
    t = time.perf_counter()
    ref = generate(params, cfg, prompt, tokens)
    out = {"unsharded_s": time.perf_counter() - t, "tokens": tokens, "batch": 8}
    for cache in ("contiguous", "paged"):
        t = time.perf_counter()
        got = generate_sharded(params, cfg, prompt, tokens, mesh, "megatron", cache=cache)
        out[f"{cache}_s"] = time.perf_counter() - t
        assert (got == ref).all(), f"sharded decode ({cache} cache) differs from the unsharded model"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--no-simpy", action="store_true", help="skip the SimPy reference runs")
    ap.add_argument("--json", help="also write every figure (latencies, throughput) here")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    sim = bench_simulator(args.requests, not args.no_simpy)
    dec = bench_decode(args.tokens)
    rows = []
    for name, r in sim.items():
        ref = f"{r['simpy_seconds']:.2f} s (SimPy processes)" if r["simpy_seconds"] else "vLLM / Vidur: GPU needed"
        rows.append((f"simulate {args.requests:,} requests, {name} (goal < 10 s)", f"{r['seconds']:.2f} s", ref,
                     (r["simpy_seconds"] / r["seconds"]) if r["simpy_seconds"] else float("nan")))
    for cache in ("contiguous", "paged"):
        rows.append((f"decode {dec['tokens']} tokens, D=256 L=2, batch 8, 8 devices, {cache} KV (goal < 2 s)",
                     f"{dec[cache + '_s']:.2f} s", f"{dec['unsharded_s']:.2f} s (unsharded, same tokens)",
                     dec["unsharded_s"] / dec[cache + "_s"]))
    report("serve", f"shardlab.serve (load before {load:.2f})", rows)
    for name, r in sim.items():
        print(f"  {name}: {r['completed']} done, {r['throughput_tok_s']:.0f} tok/s simulated, TTFT p50 "
              f"{r['ttft_p50'] * 1e3:.1f} ms, TPOT p50 {r['tpot_p50'] * 1e3:.2f} ms, prefix hits {r['prefix_hit_rate']:.1%}"
              + (" (identical to SimPy)" if r["simpy_seconds"] else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"simulate": sim, "decode": dec, "load_before": load}, f, indent=2)


if __name__ == "__main__":
    main()
