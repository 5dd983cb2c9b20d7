"""shardlab.serve: simulating 100,000 requests, and decoding 64 tokens on 8 virtual devices.

1. The serving simulator (SimPy, step times from serve.StepModel) on 100,000 Poisson requests to
   two interleaved replicas of LLaMA-3 8B on 8 TPU v5e each (goal: under 10 s), and the same
   trace disaggregated (one prefill + one decode replica).
2. Megatron decode of a 2-layer D=256 model, batch 8, 64 tokens, inside shardlab.shard_map on 8
   virtual devices (goal: under 2 s), beside the same tokens decoded unsharded (the reference
   the sharded run must equal; it is printed as the ratio).

No competitor runs here: vLLM needs a GPU and Vidur profiles operators on a GPU before it can
simulate, so neither starts on this machine; the table says so instead of printing a number.

    python benchmarks/bench_serve.py [--requests 100000] [--tokens 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import shardlab as sl
from shardlab.models import ModelConfig, presets, transformer
from shardlab.serve import ServingConfig, StepModel, generate, poisson_requests, simulate
from shardlab.serve.sharded import generate_sharded


def bench_simulator(n: int) -> dict:
    model = StepModel(presets.get("llama3-8b"), "tpu-v5e", {"x": 8})
    reqs = poisson_requests(n, 30.0, prompt_len=("lognormal", 1000, 0.6), output_len=("exponential", 150),
                            shared_prefixes=16, prefix_len=256, prefix_fraction=0.5, seed=0)
    out = {}
    for name, cfg in (("interleaved", ServingConfig(replicas=2, max_batch=128, chunk_size=256, prefix_cache_blocks=8192)),
                      ("disaggregated", ServingConfig(mode="disaggregated", max_batch=256, prefix_cache_blocks=8192))):
        t = time.perf_counter()
        r = simulate(reqs, model, cfg)
        dt = time.perf_counter() - t
        out[name] = {"seconds": dt, "completed": r.completed, **{k: v for k, v in r.summary().items() if k != "mode"}}
    return out


def bench_decode(tokens: int) -> dict:
    cfg = ModelConfig(num_layers=2, d_model=256, ffw_dim=1024, num_heads=8, vocab_size=1024)
    params = transformer.init_params(cfg, seed=0)
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, (8, 16))
    mesh = sl.make_mesh((8,), ("x",))
    t = time.perf_counter()
    got = generate_sharded(params, cfg, prompt, tokens, mesh, "megatron")
    t_sharded = time.perf_counter() - t
    t = time.perf_counter()
    ref = generate(params, cfg, prompt, tokens)
    t_plain = time.perf_counter() - t
    assert (got == ref).all(), "sharded decode differs from the unsharded model"
    return {"sharded_s": t_sharded, "unsharded_s": t_plain, "tokens": tokens, "batch": 8}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--json")
    args = ap.parse_args()
    sim = bench_simulator(args.requests)
    dec = bench_decode(args.tokens)
    print(f"{'benchmark':52s} {'shardlab':>10s} {'goal':>8s}  competitor")
    for name, r in sim.items():
        print(f"{'simulate ' + format(args.requests, ',') + ' requests, ' + name:52s} {r['seconds']:9.2f}s "
              f"{'< 10 s':>8s}  vLLM / Vidur: do not run here (GPU needed)")
        print(f"    {r['completed']} done, {r['throughput_tok_s']:.0f} tok/s simulated, TTFT p50 "
              f"{r['ttft_p50'] * 1e3:.1f} ms, TPOT p50 {r['tpot_p50'] * 1e3:.2f} ms, prefix hits {r['prefix_hit_rate']:.1%}")
    print(f"{'decode ' + str(dec['tokens']) + ' tokens, D=256 L=2, batch 8, 8 devices':52s} {dec['sharded_s']:9.2f}s "
          f"{'< 2 s':>8s}  none runs here")
    print(f"    same tokens unsharded: {dec['unsharded_s']:.2f} s (sharded / unsharded = "
          f"{dec['sharded_s'] / dec['unsharded_s']:.2f}); tokens identical")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"simulate": sim, "decode": dec}, f, indent=2)


if __name__ == "__main__":
    main()
