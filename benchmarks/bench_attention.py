"""Flash attention speed: shardlab's kernel against torch.nn.functional.scaled_dot_product_attention.

    python benchmarks/bench_attention.py            # B=1 H=8 T=2048 D=128, fp32
    python benchmarks/bench_attention.py --json out.json

Both run on the CPU with the same number of threads (torch.set_num_threads = the OpenMP
thread count shardlab uses), in the same process, interleaved, best of --reps after a warm-up.
torch gets its native [B, H, T, D] contiguous layout; shardlab gets JAX's [B, T, H, D]. The
backward times only the backward: shardlab's flash_attention_backward from (out, lse), torch's
autograd backward of SDPA with the graph retained. Targets (issue 4): forward >= 1.3x torch,
causal forward >= 1.5x, backward >= 1.2x.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import threadpoolctl
from rich.console import Console
from rich.table import Table

from shardlab import _core
from shardlab.kernels import flash_attention, flash_attention_backward


def omp_threads() -> int:
    for info in threadpoolctl.threadpool_info():
        if info["internal_api"] == "openmp":
            return int(info["num_threads"])
    return int(os.environ.get("OMP_NUM_THREADS", os.cpu_count()))


def best_pair(ours, theirs, reps: int) -> tuple[float, float]:
    ours()
    theirs()
    a = b = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        ours()
        a = min(a, time.perf_counter() - t0)
        t0 = time.perf_counter()
        theirs()
        b = min(b, time.perf_counter() - t0)
    return a, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    threads = omp_threads()
    torch.set_num_threads(threads)
    B, H, T, D = args.batch, args.heads, args.seq, args.head_dim
    rng = np.random.default_rng(0)
    q, k, v, dout = (rng.standard_normal((B, T, H, D), dtype=np.float32) for _ in range(4))
    tq, tk, tv, tdo = (torch.from_numpy(x.transpose(0, 2, 1, 3).copy()) for x in (q, k, v, dout))

    rows = []
    for causal in (False, True):
        with torch.no_grad():
            fwd = best_pair(
                lambda: flash_attention(q, k, v, is_causal=causal),
                lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal),
                args.reps,
            )
        rows.append(("forward", causal, *fwd, 4.0))
        out, lse = flash_attention(q, k, v, is_causal=causal, return_lse=True)
        g = [x.clone().requires_grad_() for x in (tq, tk, tv)]
        tout = F.scaled_dot_product_attention(*g, is_causal=causal)
        bwd = best_pair(
            lambda: flash_attention_backward(q, k, v, out, lse, dout, is_causal=causal),
            lambda: torch.autograd.grad(tout, g, tdo, retain_graph=True),
            args.reps,
        )
        rows.append(("backward", causal, *bwd, 10.0))

    console = Console()
    table = Table(
        title=f"flash attention fp32, B={B} H={H} T={T} D={D}, {threads} threads "
        f"(shardlab ISA {_core.active_isa()}, torch {torch.__version__} "
        f"{torch.backends.cpu.get_cpu_capability()})"
    )
    for col in ("pass", "causal", "shardlab ms", "torch ms", "speedup", "shardlab GFLOP/s"):
        table.add_column(col, justify="right")
    results = []
    for name, causal, ours, theirs, flops_per in rows:
        flops = flops_per * B * H * T * T * D * (0.5 if causal else 1.0)
        table.add_row(name, str(causal), f"{ours * 1e3:.1f}", f"{theirs * 1e3:.1f}",
                      f"{theirs / ours:.2f}x", f"{flops / ours / 1e9:.0f}")
        results.append(dict(pass_=name, causal=causal, shardlab_s=ours, torch_s=theirs,
                            speedup=theirs / ours, shardlab_gflops=flops / ours / 1e9))
    console.print(table)
    console.print(f"load average: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(B=B, H=H, T=T, D=D, threads=threads, results=results), f, indent=1)


if __name__ == "__main__":
    main()
