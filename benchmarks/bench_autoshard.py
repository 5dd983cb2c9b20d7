"""autoshard on a traced program: the 24-layer example transformer's training step (global-view
attention and MLP blocks, value_and_grad, SGD update) on a TPU v5p mesh, abstract (no data).

Times, in one run: tracing and pricing (``trace_program``), the ILP (``solve``, after the exact
shrinking), and the greedy baseline on the same problem; then prices the hand-written
strategies (dp, fsdp, tp, fsdp_tp imposed on the arguments, the rest searched) with the same
model and prints the found plan's estimated step against the best of them.

    SHARDLAB_CORE_DIR=build/core PYTHONPATH=python python benchmarks/bench_autoshard.py \
        [--layers 24] [--mesh 8x8] [--batch 16] [--seq 512] [--d-model 1024] [--heads 16] \
        [--ffw 4096] [--memory-gib G] [--carry] [--no-strategies] [--json out.json]

``--carry``: the updated parameters are the next step's (``autoshard(..., carry=[(1, 0)])``):
each comes back in its argument's layout, the resharding priced. In a terminal the tracing and
the solve draw progress bars (the solve's: the share of HiGHS's optimality gap closed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import shardlab as sl  # noqa: E402
from shardlab.autoshard import autoshard, examples, greedy, solve, trace_program  # noqa: E402

from common import cpu_model  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--mesh", default="8x8")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--ffw", type=int, default=4096)
    ap.add_argument("--hardware", default="tpu-v5p")
    ap.add_argument("--memory-gib", type=float, default=None)
    ap.add_argument("--carry", action="store_true", help="carry the new parameters to the next step")
    ap.add_argument("--no-strategies", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    shape = tuple(int(n) for n in a.mesh.split("x"))
    mesh = sl.make_mesh(shape, ("x", "y"), hardware=a.hardware, abstract=True)
    params, x = examples.abstract(a.layers, a.batch, a.seq, a.d_model, a.heads, a.d_model // a.heads, a.ffw)
    limit = None if a.memory_gib is None else a.memory_gib * 2**30
    print(f"CPU: {cpu_model()}")
    print(f"autoshard: {a.layers}-layer transformer training step, batch {a.batch}x{a.seq}, D={a.d_model}, "
          f"F={a.ffw}, on {a.hardware} {a.mesh}" + ("" if limit is None else f", memory {a.memory_gib} GiB/device")
          + (", parameters carried" if a.carry else ""))

    t0 = time.perf_counter()
    carry = [(1, 0)] if a.carry else None
    prog = trace_program(examples.train_step, params, x, mesh=mesh, memory_limit_bytes=limit, carry=carry)
    t_trace = time.perf_counter() - t0
    t1 = time.perf_counter()
    ilp = solve(prog.problem)
    t_ilp = time.perf_counter() - t1
    t2 = time.perf_counter()
    gr = greedy(prog.problem)
    t_greedy = time.perf_counter() - t2
    print(f"  problem: {prog.problem.size}; solved as {ilp.size_after}")
    print(f"  trace + pricing   {t_trace:8.2f} s")
    print(f"  ILP (HiGHS)       {t_ilp:8.2f} s  estimate {ilp.objective * 1e3:.4g} ms "
          f"({'proven optimal' if ilp.proven_optimal else 'not proven'})")
    print(f"  greedy baseline   {t_greedy:8.2f} s  estimate {gr.objective * 1e3:.4g} ms "
          f"(ILP / greedy = {ilp.objective / gr.objective:.3f})")
    print(f"  total (trace + ILP) {t_trace + t_ilp:.2f} s")
    out = {"cpu": cpu_model(), "layers": a.layers, "mesh": a.mesh, "memory_gib": a.memory_gib, "carry": a.carry, "trace_s": t_trace, "ilp_s": t_ilp,
           "greedy_s": t_greedy, "ilp_estimate_s": ilp.objective, "greedy_estimate_s": gr.objective,
           "size": str(prog.problem.size), "size_after": str(ilp.size_after)}
    if not a.no_strategies:
        best = None
        for name, specs in examples.strategies(params).items():
            try:
                p = autoshard(examples.train_step, params, x, mesh=mesh, memory_limit_bytes=limit, in_specs=specs,
                              carry=carry, pricer=prog.pricer)
            except ValueError as err:
                print(f"  {name:8s} -  ({str(err).splitlines()[0][:100]})")
                continue
            print(f"  {name:8s} {p.estimate_s * 1e3:8.4g} ms  memory {p.solution.memory_bytes / 2**30:.3g} GiB")
            out[f"{name}_estimate_s"] = p.estimate_s
            if best is None or p.estimate_s < best[1]:
                best = (name, p.estimate_s)
        if best is not None:
            print(f"  found plan {ilp.objective * 1e3:.4g} ms vs best hand-written ({best[0]}) {best[1] * 1e3:.4g} ms: "
                  f"ratio {ilp.objective / best[1]:.3f}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return out


if __name__ == "__main__":
    main()
