"""GEMM throughput: shardlab's kernel against numpy's OpenBLAS sgemm, and against peak.

Run OpenBLAS with its best kernel for this CPU (the machine pins an old core type for safety):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_gemm.py

For each n and thread count it prints, from the same run:
  * fp32: ours vs numpy (OpenBLAS) sgemm, goal >= 0.95x;
  * bf16 in, fp32 accumulate: ours vs OpenBLAS fp32, goal >= 0.9x where bf16 is widened while
    packing (AVX2, AVX-512 without BF16), >= 1.7x with AVX512_BF16 dot products;
  * fp32 with the AVX2 path forced as a fraction of this machine's AVX2 FMA peak, measured in
    the same invocation with the same thread count by a register-only FMA loop
    (`_core.measure_fma_peak_gflops`, before and after every run; the best is the peak, as a
    loaded moment lowers a measurement, never raises it), goal >= 0.85.
Each figure is the best of several timed runs (at least --reps, more while they fit in
--budget seconds) after one warm-up; numpy and ours alternate run by run for each size and
thread count, so load from other processes hits both alike, each timed call after a --settle
pause (OpenBLAS's and libgomp's idle threads spin after a call and would take a core from the
other library's next call), then untimed calls of the same function for 20 ms, and the figure is
the median of the calls timed over the next 10 ms (a call straight after an idle pause waits for
the idle cores to wake; a single untimed call was not enough for a 1.3 ms GEMM:
common.settled_seconds). The whole table is repeated --runs times and the spread of each ratio
is printed (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os

import ml_dtypes
import numpy as np
import threadpoolctl
from rich.console import Console
from rich.table import Table

from common import cpu_model, openblas_info, settled_seconds
from shardlab import _core
from shardlab.kernels import gemm


# Seconds to pause before each timed call. After a call OpenBLAS's pthreads (and libgomp's
# threads) keep spinning for a while (OpenBLAS: ~2^28 TSC ticks, about 0.1 s here); a call timed
# right after the other library's then shares the cores with those spinners. Measured at n = 1024
# on two threads: shardlab 79 GFLOP/s timed right after numpy, 135 after a 0.2 s pause (numpy
# 106 and 141 likewise). Set by --settle.
SETTLE = 0.15


def best_seconds(fn, reps: int, budget: float) -> float:
    """Best of at least `reps` runs, more while they fit in `budget` seconds: on a shared
    machine a short run is often preempted, and the best run is the one that was not."""
    return best_interleaved([fn], reps, budget)[0]


def timed(fn) -> float:
    return settled_seconds(fn, SETTLE)


def best_interleaved(fns, reps: int, budget: float) -> list[float]:
    """Best time of each function, the functions called in turn (a, b, a, b, ...) so that load
    from other processes hits them alike, each after a SETTLE pause; at least `reps` rounds,
    more while they fit in `budget` s (pauses included)."""
    best = [timed(fn) for fn in fns]  # warm-up, and a first timing
    rounds = max(reps, min(50, int(budget / (sum(best) + SETTLE * len(fns)))))
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], timed(fn))
    return best


def main() -> None:
    global SETTLE  # set from --settle
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--runs", type=int, default=3, help="repeat the square-GEMM table this many times")
    parser.add_argument("--reps", type=int, default=3, help="minimum timed runs per figure")
    parser.add_argument("--budget", type=float, default=1.5, help="seconds of runs per figure")
    parser.add_argument(
        "--batched", type=lambda t: tuple(map(int, t.split("x"))), nargs="*",
        default=[(64, 128, 128, 128), (16, 512, 512, 512)], help="BxMxKxN batched cases",
    )
    parser.add_argument("--settle", type=float, default=SETTLE,
                        help="seconds to pause before each timed call (other libraries' threads spin)")
    parser.add_argument("--layout-n", type=int, default=2048, help="n of the transposed-operand table")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    SETTLE = args.settle

    console = Console(width=200)  # wide tables stay whole when piped to a file
    np.ones((64, 64), np.float32) @ np.ones((64, 64), np.float32)  # load OpenBLAS for threadpoolctl
    pinned = [v for v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if v in os.environ]
    console.print(f"numpy {np.__version__}: {openblas_info()}")
    if pinned:
        console.print(f"[yellow]warning: {', '.join(pinned)} set; OpenBLAS may not run its best kernel[/]")
    console.print(
        f"CPU: {cpu_model()}; shardlab ISA {_core.detected_isa()} (active {_core.active_isa()}); "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    native_bf16 = _core.active_isa() == "avx512bf16"
    bf16_goal = 1.7 if native_bf16 else 0.9

    rng = np.random.default_rng(0)
    rows = []
    saved_isa = _core.active_isa()
    best_peak = {t: 0.0 for t in args.threads}
    for run in range(args.runs):
        peaks = {t: _core.measure_fma_peak_gflops(t) for t in args.threads}
        for n in args.sizes:
            a = rng.standard_normal((n, n), dtype=np.float32)
            b = rng.standard_normal((n, n), dtype=np.float32)
            a16, b16 = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
            gflop = 2.0 * n**3 / 1e9

            def ours_avx2():
                _core.set_active_isa("avx2")
                try:
                    gemm(a, b)
                finally:
                    _core.set_active_isa(saved_isa)

            for threads in args.threads:
                with threadpoolctl.threadpool_limits(threads):
                    fns = [lambda: a @ b, lambda: gemm(a, b), lambda: gemm(a16, b16, preferred_element_type=np.float32)]
                    if saved_isa != "avx2":  # on an AVX2 machine "ours f32" is the AVX2 path already
                        fns.append(ours_avx2)
                    times = best_interleaved(fns, args.reps, args.budget)
                    t_np, t_f32, t_bf16, t_avx2 = times if len(times) == 4 else (*times, times[1])
                rows.append(dict(run=run, n=n, threads=threads, numpy_f32=gflop / t_np, ours_f32=gflop / t_f32,
                                 ours_bf16=gflop / t_bf16, ours_avx2_f32=gflop / t_avx2))
        for t in args.threads:
            best_peak[t] = max(best_peak[t], peaks[t], _core.measure_fma_peak_gflops(t))
    for r in rows:
        r["avx2_peak"] = best_peak[r["threads"]]
    for run in range(args.runs):
        peaks_s = ", ".join(f"{t} thr {p:.0f}" for t, p in best_peak.items())
        table = Table(title=f"run {run + 1}/{args.runs}: GEMM GFLOP/s (square n x n x n, best of runs); "
                      f"best FMA peak of the invocation {peaks_s}")
        for col in ["n", "thr", "numpy f32", "ours f32", "ratio", "ours bf16", "bf16/numpy", "ours AVX2",
                    "AVX2 peak", "of peak"]:
            table.add_column(col, justify="right")
        for r in (r for r in rows if r["run"] == run):
            table.add_row(
                str(r["n"]), str(r["threads"]), f"{r['numpy_f32']:.0f}", f"{r['ours_f32']:.0f}",
                f"{r['ours_f32'] / r['numpy_f32']:.2f}x", f"{r['ours_bf16']:.0f}",
                f"{r['ours_bf16'] / r['numpy_f32']:.2f}x", f"{r['ours_avx2_f32']:.0f}", f"{r['avx2_peak']:.0f}",
                f"{r['ours_avx2_f32'] / r['avx2_peak']:.2f}",
            )
        console.print(table)

    summary = Table(title=f"over {args.runs} runs (min–max): goals f32 >= 0.95x numpy, bf16 >= {bf16_goal}x "
                    "numpy f32, AVX2 f32 >= 0.85 of the FMA peak")
    for col in ["n", "thr", "f32 / numpy", "bf16 / numpy f32", "AVX2 of peak", "numpy of peak"]:
        summary.add_column(col, justify="right")
    for n in args.sizes:
        for threads in args.threads:
            rs = [r for r in rows if r["n"] == n and r["threads"] == threads]

            def span(f):
                xs = [f(r) for r in rs]
                return f"{min(xs):.2f}–{max(xs):.2f}"

            summary.add_row(str(n), str(threads), span(lambda r: r["ours_f32"] / r["numpy_f32"]),
                            span(lambda r: r["ours_bf16"] / r["numpy_f32"]),
                            span(lambda r: r["ours_avx2_f32"] / r["avx2_peak"]),
                            span(lambda r: r["numpy_f32"] / r["avx2_peak"]))
    console.print(summary)

    # Batched fp32 GEMMs (numpy's matmul loops over the batch calling sgemm).
    batched = []
    for batch, m, k, n in args.batched:
        a = rng.standard_normal((batch, m, k), dtype=np.float32)
        b = rng.standard_normal((batch, k, n), dtype=np.float32)
        gflop = 2.0 * batch * m * n * k / 1e9
        for threads in args.threads:
            with threadpoolctl.threadpool_limits(threads):
                t_np = best_seconds(lambda: a @ b, args.reps, args.budget)
                t_f32 = best_seconds(lambda: gemm(a, b), args.reps, args.budget)
            batched.append(dict(shape=[batch, m, k, n], threads=threads, numpy_f32=gflop / t_np, ours_f32=gflop / t_f32))
    table = Table(title="batched fp32 GEMM GFLOP/s: [B, M, K] @ [B, K, N]")
    for col in ["B x M x K x N", "thr", "numpy f32", "ours f32", "ratio"]:
        table.add_column(col, justify="right")
    for r in batched:
        ratio = r["ours_f32"] / r["numpy_f32"]
        table.add_row(" x ".join(map(str, r["shape"])), str(r["threads"]), f"{r['numpy_f32']:.0f}", f"{r['ours_f32']:.0f}", f"{ratio:.2f}x")
    if batched:
        console.print(table)

    # Transposed operands are read in place by the packing; numpy passes them to sgemm as
    # transpose flags. One thread, n = --layout-n.
    layouts = []
    n = args.layout_n
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    gflop = 2.0 * n**3 / 1e9
    with threadpoolctl.threadpool_limits(1):
        for name, x, y in [("a @ b", a, b), ("a @ b.T", a, b.T), ("a.T @ b", a.T, b), ("a.T @ b.T", a.T, b.T)]:
            x16, y16 = x.astype(ml_dtypes.bfloat16), y.astype(ml_dtypes.bfloat16)  # keeps the layout
            t_np = best_seconds(lambda: x @ y, args.reps, args.budget)
            t_f32 = best_seconds(lambda: gemm(x, y), args.reps, args.budget)
            t_bf16 = best_seconds(lambda: gemm(x16, y16, preferred_element_type=np.float32), args.reps, args.budget)
            layouts.append(dict(layout=name, numpy_f32=gflop / t_np, ours_f32=gflop / t_f32, ours_bf16=gflop / t_bf16))
    table = Table(title=f"layouts, n = {n}, 1 thread, GFLOP/s")
    for col in ["layout", "numpy f32", "ours f32", "ratio", "ours bf16", "bf16/numpy"]:
        table.add_column(col, justify="right")
    for r in layouts:
        table.add_row(
            r["layout"], f"{r['numpy_f32']:.0f}", f"{r['ours_f32']:.0f}", f"{r['ours_f32'] / r['numpy_f32']:.2f}x",
            f"{r['ours_bf16']:.0f}", f"{r['ours_bf16'] / r['numpy_f32']:.2f}x",
        )
    console.print(table)

    if args.json:
        with open(args.json, "w") as f:
            record = dict(cpu=cpu_model(), openblas=openblas_info(), rows=rows, batched=batched, layouts=layouts)
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
