"""Flash attention speed: shardlab's kernel against torch.nn.functional.scaled_dot_product_attention.

    python benchmarks/bench_attention.py            # B=1 H=8 T=2048 D=128, fp32, 3 runs
    python benchmarks/bench_attention.py --json out.json

Both run on the CPU with the same number of threads (torch.set_num_threads = the OpenMP
thread count shardlab uses), in the same process, interleaved (ours, torch, ours, ...), best of
--reps after a warm-up, each timed call after a --settle pause (a library's idle OpenMP threads
spin for a while after a call and would take a core from the other's next call) and one untimed
call of the same function (common.settled_seconds: a call straight after an idle pause waits for
the idle cores to wake). torch gets its native [B, H, T, D] contiguous layout; shardlab gets
JAX's [B, T, H, D]. The backward times only the backward: shardlab's flash_attention_backward
from (out, lse), torch's autograd backward of SDPA with the graph retained.

Every run also measures the fp32 FMA peak of this machine with the same thread count
(`_core.measure_fma_peak_gflops`, a register-only loop of 256-bit FMAs) before and after its
timings, and both libraries are reported as a fraction of the best peak measured in the whole
invocation (a loaded moment lowers a measurement, never raises it). On a shared machine the
absolute figures move from run to run; the whole comparison is repeated --runs times and the
spread of each ratio is printed.
Goals (issue 14, AVX2): forward >= 1.15x torch, causal forward >= 1.25x, backward >= 1.2x.
To force the AVX2 paths on an AVX-512 machine: SHARDLAB_ISA=avx2 ATEN_CPU_CAPABILITY=avx2.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import threadpoolctl
from rich.console import Console
from rich.table import Table

from common import cpu_model, settled_seconds
from shardlab import _core
from shardlab.kernels import flash_attention, flash_attention_backward

GOALS = {("forward", False): 1.15, ("forward", True): 1.25, ("backward", False): 1.2, ("backward", True): 1.2}


def omp_threads() -> int:
    for info in threadpoolctl.threadpool_info():
        if info["internal_api"] == "openmp":
            return int(info["num_threads"])
    return int(os.environ.get("OMP_NUM_THREADS", os.cpu_count()))


# Seconds to pause before each timed call: after a call the other library's OpenMP threads
# (torch ships its own libgomp) keep spinning for a while and would share the two cores with the
# next timed call. Set by --settle.
SETTLE = 0.15


def timed(fn) -> float:
    return settled_seconds(fn, SETTLE)


def best_pair(ours, theirs, reps: int) -> tuple[float, float]:
    ours()
    theirs()
    a = b = float("inf")
    for _ in range(reps):
        a = min(a, timed(ours))
        b = min(b, timed(theirs))
    return a, b


def one_run(torch, F, q, k, v, dout, reps: int) -> list[tuple[str, bool, float, float]]:
    tq, tk, tv, tdo = (torch.from_numpy(x.transpose(0, 2, 1, 3).copy()) for x in (q, k, v, dout))
    rows = []
    for causal in (False, True):
        with torch.no_grad():
            fwd = best_pair(
                lambda: flash_attention(q, k, v, is_causal=causal),
                lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal),
                reps,
            )
        rows.append(("forward", causal, *fwd))
        out, lse = flash_attention(q, k, v, is_causal=causal, return_lse=True)
        g = [x.clone().requires_grad_() for x in (tq, tk, tv)]
        tout = F.scaled_dot_product_attention(*g, is_causal=causal)
        bwd = best_pair(
            lambda: flash_attention_backward(q, k, v, out, lse, dout, is_causal=causal),
            lambda: torch.autograd.grad(tout, g, tdo, retain_graph=True),
            reps,
        )
        rows.append(("backward", causal, *bwd))
    return rows


def main() -> None:
    global SETTLE  # set from --settle
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--runs", type=int, default=3, help="repeat the whole comparison this many times")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--settle", type=float, default=SETTLE,
                    help="seconds to pause before each timed call (the other library's threads spin)")
    args = ap.parse_args()
    SETTLE = args.settle

    import torch
    import torch.nn.functional as F

    threads = omp_threads()
    torch.set_num_threads(threads)
    B, H, T, D = args.batch, args.heads, args.seq, args.head_dim
    rng = np.random.default_rng(0)
    q, k, v, dout = (rng.standard_normal((B, T, H, D), dtype=np.float32) for _ in range(4))
    console = Console(width=200)  # wide tables stay whole when piped to a file
    console.print(f"CPU: {cpu_model()}; shardlab ISA {_core.active_isa()}; torch {torch.__version__} "
                  f"capability {torch.backends.cpu.get_cpu_capability()}; {threads} threads")

    results, runs = [], []
    for run in range(args.runs):
        before = _core.measure_fma_peak_gflops(threads)
        rows = one_run(torch, F, q, k, v, dout, args.reps)
        runs.append((rows, before, _core.measure_fma_peak_gflops(threads), os.getloadavg()[0]))
    peak = max(max(b, a) for _, b, a, _ in runs)
    for run, (rows, before, after, load) in enumerate(runs):
        table = Table(title=f"run {run + 1}/{args.runs}: flash attention fp32, B={B} H={H} T={T} D={D}, "
                      f"{threads} threads, FMA peak measured {before:.0f} before / {after:.0f} after "
                      f"(best {peak:.0f}) GFLOP/s, load {load:.2f}")
        for col in ("pass", "causal", "shardlab ms", "torch ms", "speedup", "goal",
                    "shardlab GFLOP/s", "torch GFLOP/s", "shardlab of peak", "torch of peak"):
            table.add_column(col, justify="right")
        for name, causal, ours, theirs in rows:
            flops = (4.0 if name == "forward" else 10.0) * B * H * T * T * D * (0.5 if causal else 1.0)
            r = dict(run=run, pass_=name, causal=causal, shardlab_s=ours, torch_s=theirs, speedup=theirs / ours,
                     goal=GOALS[name, causal], shardlab_gflops=flops / ours / 1e9,
                     torch_gflops=flops / theirs / 1e9, peak_gflops=peak)
            results.append(r)
            table.add_row(name, str(causal), f"{ours * 1e3:.1f}", f"{theirs * 1e3:.1f}", f"{r['speedup']:.2f}x",
                          f"{r['goal']:.2f}x", f"{r['shardlab_gflops']:.0f}", f"{r['torch_gflops']:.0f}",
                          f"{r['shardlab_gflops'] / peak:.2f}", f"{r['torch_gflops'] / peak:.2f}")
        console.print(table)

    summary = Table(title=f"over {args.runs} runs: speedup over torch and fraction of the FMA peak (min–max)")
    for col in ("pass", "causal", "speedup", "goal", "met in", "shardlab of peak", "torch of peak"):
        summary.add_column(col, justify="right")
    for (name, causal), goal in GOALS.items():
        rs = [r for r in results if r["pass_"] == name and r["causal"] == causal]
        sp = [r["speedup"] for r in rs]
        ours = [r["shardlab_gflops"] / r["peak_gflops"] for r in rs]
        theirs = [r["torch_gflops"] / r["peak_gflops"] for r in rs]
        summary.add_row(name, str(causal), f"{min(sp):.2f}–{max(sp):.2f}x", f"{goal:.2f}x",
                        f"{sum(s >= goal for s in sp)}/{len(sp)}", f"{min(ours):.2f}–{max(ours):.2f}",
                        f"{min(theirs):.2f}–{max(theirs):.2f}")
    console.print(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(cpu=cpu_model(), B=B, H=H, T=T, D=D, threads=threads, results=results), f, indent=1)


if __name__ == "__main__":
    main()
