"""GEMM on the training step's shapes and strides: shardlab against numpy (OpenBLAS).

The FSDP + TP training step (benchmarks/bench_train.py) spends most of its time in the batched
GEMMs below, several of them on transposed views (a weight gradient reads its activation
column-major, a backward product reads the weight transposed). shardlab reads such views in
place and absorbs the layout while packing; numpy's matmul copies a non-contiguous batched
operand or passes transpose flags. Run OpenBLAS with its best kernel for this CPU:

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_gemm_train.py

For each case it prints, from the same run, GFLOP/s of numpy's `a @ b`, of shardlab's
`gemm(a, b)` on the same views, and of `gemm` on contiguous copies of them (so the last two
columns differ only by the packing of the transposed operand), the ratio ours / numpy and
ours as a fraction of the FMA peak measured in the same invocation. Each figure is the best of
several calls, the three functions called in turn. Before each timed call: a --settle pause
(OpenBLAS's idle threads spin for about 0.1 s after a call and would take a core from the next
library's call), then untimed calls of the same function for 20 ms (at least one), and the
figure is the median of the calls timed over the next 10 ms (common.settled_seconds). On this
2-vCPU VM a call right after an idle pause runs 10-20% slower (the idle cores wake and ramp up;
a 15 ms GEMM timed straight after the pause scattered by +-15% between identical calls), which
would swamp the differences between these cases; the untimed calls take that hit for both
libraries.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import threadpoolctl
from rich.console import Console
from rich.table import Table

from common import cpu_model, openblas_info, settled_seconds
from shardlab import _core
from shardlab.kernels import gemm


def col_major(rng, batch: tuple[int, ...], rows: int, cols: int) -> np.ndarray:
    """A [*batch, rows, cols] view whose matrices are column-major (row stride one element)."""
    return np.swapaxes(rng.standard_normal((*batch, cols, rows), dtype=np.float32), -1, -2)


def row_major(rng, batch: tuple[int, ...], rows: int, cols: int) -> np.ndarray:
    return rng.standard_normal((*batch, rows, cols), dtype=np.float32)


# (name, a factory, b factory): the eight costliest GEMMs of the training step, ordered by their
# share of its time (d_model 512, ffw 2048, 8 heads, batch 8 x 128 tokens on a 2 x 4 mesh).
CASES = [
    ("plain, a broadcast over 4", lambda r: row_major(r, (1,), 1024, 512), lambda r: row_major(r, (4,), 512, 512)),
    ("A column-major", lambda r: col_major(r, (2, 1), 512, 512), lambda r: row_major(r, (2, 4), 512, 512)),
    ("B transposed", lambda r: row_major(r, (4, 2), 512, 512), lambda r: col_major(r, (4, 1), 512, 512)),
    ("plain 8 x 512^3", lambda r: row_major(r, (4, 2), 512, 512), lambda r: row_major(r, (4, 1), 512, 512)),
    ("A column-major, b broadcast", lambda r: col_major(r, (2, 4), 512, 512), lambda r: row_major(r, (2, 1), 512, 512)),
    ("N = 128", lambda r: row_major(r, (1,), 1024, 512), lambda r: row_major(r, (4,), 512, 128)),
    ("A column-major, N = 128", lambda r: col_major(r, (2, 1), 512, 512), lambda r: row_major(r, (2, 4), 512, 128)),
    ("B transposed, K = 128", lambda r: row_major(r, (4, 2), 512, 128), lambda r: col_major(r, (4, 1), 128, 512)),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=8, help="timed calls per function and case")
    parser.add_argument("--settle", type=float, default=0.15, help="seconds to pause before each timed call")
    parser.add_argument("--runs", type=int, default=1, help="repeat the table this many times")
    args = parser.parse_args()

    console = Console(width=200)
    np.ones((64, 64), np.float32) @ np.ones((64, 64), np.float32)  # load OpenBLAS for threadpoolctl
    blas = openblas_info()
    pinned = [v for v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if v in os.environ]
    console.print(f"numpy {np.__version__}: {blas}" + (f" [yellow](warning: {', '.join(pinned)} set)[/]" if pinned else ""))
    console.print(f"CPU: {cpu_model()}; shardlab ISA {_core.active_isa()}; {args.threads} threads; "
                  f"load average {os.getloadavg()[0]:.2f}")

    def timed(fn) -> float:
        return settled_seconds(fn, args.settle)

    rng = np.random.default_rng(0)
    operands = [(name, fa(rng), fb(rng)) for name, fa, fb in CASES]
    for run in range(args.runs):
        peak = _core.measure_fma_peak_gflops(args.threads)
        rows = []
        with threadpoolctl.threadpool_limits(args.threads):
            for name, a, b in operands:
                ac, bc = np.ascontiguousarray(a), np.ascontiguousarray(b)
                np.testing.assert_allclose(gemm(a, b), a @ b, rtol=1e-3, atol=1e-2)
                fns = [lambda: a @ b, lambda: gemm(a, b), lambda: gemm(ac, bc)]
                best = [timed(f) for f in fns]
                for _ in range(args.reps):
                    best = [min(t, timed(f)) for t, f in zip(best, fns)]
                batch = int(np.prod(np.broadcast_shapes(a.shape[:-2], b.shape[:-2])))
                gflop = 2.0 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1] / 1e9
                rows.append((name, a, b, *(gflop / t for t in best)))
        peak = max(peak, _core.measure_fma_peak_gflops(args.threads))
        table = Table(title=f"run {run + 1}/{args.runs}: training-step GEMMs, fp32, {args.threads} threads, GFLOP/s; "
                      f"FMA peak {peak:.0f}; load {os.getloadavg()[0]:.2f}")
        for col in ["case", "a shape / strides (B)", "b shape / strides (B)", "numpy", "ours", "ratio",
                    "ours contiguous", "ours of peak"]:
            table.add_column(col, justify="right")
        for name, a, b, g_np, g_ours, g_cont in rows:
            table.add_row(name, f"{a.shape} {a.strides[-2:]}", f"{b.shape} {b.strides[-2:]}", f"{g_np:.0f}",
                          f"{g_ours:.0f}", f"{g_ours / g_np:.2f}x", f"{g_cont:.0f}", f"{g_ours / peak:.2f}")
        console.print(table)


if __name__ == "__main__":
    main()
