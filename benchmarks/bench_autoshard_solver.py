"""The intra-op solver of shardlab.autoshard on a synthetic 24-layer transformer training step.

The problem is built by hand, so the solver is measured alone (bench_autoshard.py builds the
problem from a traced global-view program, tracing and pricing included): per layer 10 nodes (ln1, qkv, attention, out-proj, add, ln2, up, gelu, down, add) on
a 2-D mesh; each matmul has 12 strategies (every assignment of the two mesh axes to its M, K or N
dimension, and the FSDP form of MM, MN and MK), each elementwise op and the attention 9 (every
assignment of the axes to the tensor's two dims or none). Seconds come from shardlab.cost on the mesh's hardware:
3x the forward FLOPs for compute; all-reduces of partial sums (forward over K's axes, dX over
N's, dW over M's: the data-parallel gradient sync); resharding on every edge (all-gather of an
axis that leaves the tensor, all-to-all of an axis that moves dims) forward and back. Memory:
16 bytes per parameter (bf16 weight, f32 master, gradient, two Adam moments) plus the activations
kept for the backward pass, under the chip's HBM.

Solved in the same run: with shrinking (24 layers tied: one set of variables per position),
without shrinking (one variable per node, the ties as equality rows), the greedy baseline, and
the hand-written plans (data parallel, Megatron 2-D) priced by the same objective.

    SHARDLAB_CORE_DIR=build/core PYTHONPATH=python python benchmarks/bench_autoshard_solver.py \
        [--layers 24] [--mesh 8x8] [--batch 16] [--hardware tpu-v5p] [--memory-gib G] \
        [--untied] [--no-shrink-limit 300] [--json out.json]

The model: d_model 4096, d_ff 16384, sequences of 2048 tokens, bf16 (a 6.7B-parameter GPT shape).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402
from rich.table import Table  # noqa: E402

import shardlab.cost as cost  # noqa: E402
import shardlab.hardware as hardware  # noqa: E402
from shardlab.sharding import PartitionSpec as P  # noqa: E402
from shardlab.autoshard import Edge, Node, Problem, Strategy, greedy, solve  # noqa: E402

from common import cpu_model  # noqa: E402

DT = "bfloat16"
BYTES = 2
PARAM_BYTES = 16


class Model:
    def __init__(self, mesh, hw, *, batch=16, seq=2048, d=4096, f=16384):
        self.mesh = mesh  # {"x": 8, "y": 8}
        self.axes = tuple(mesh)
        self.hw = hw
        self.peak = cost.peak_flops(hw, DT)[0]
        self.M, self.S, self.D, self.F = batch * seq, seq, d, f
        self.batch = batch
        self._edge_cache = {}

    def shards(self, axes):
        return int(np.prod([self.mesh[a] for a in axes])) if axes else 1

    def spec(self, dims):
        return P(*[(tuple(a) if len(a) > 1 else a[0]) if a else None for a in dims])

    def tensor_specs(self):
        """Every assignment of each mesh axis to dim 0, dim 1 or neither: 9 on a 2-D mesh."""
        out = []
        for where in itertools.product((0, 1, None), repeat=len(self.axes)):
            dims = [tuple(a for a, w in zip(self.axes, where) if w == d) for d in (0, 1)]
            out.append(tuple(dims))
        return out

    def name(self, dims):
        """The book's notation: [M@xy,D] is dim 0 split over x and y, dim 1 whole."""
        return "[" + ",".join(n + ("@" + "".join(a) if a else "") for n, a in zip("MD", dims)) + "]"

    def _seconds(self, c):
        return float(getattr(c, "seconds", c))

    def all_reduce(self, shape, dims, axes):
        if not axes:
            return 0.0
        return self._seconds(cost.all_reduce_time(shape, DT, self.spec(dims), axes=tuple(axes),
                                                  mesh_shape=self.mesh, hardware=self.hw))

    def reshard(self, shape, a, b):
        """Seconds to turn a tensor sharded as ``a`` into ``b`` (all-gather of the axes that
        leave it, all-to-all of the axes that move to the other dim)."""
        key = (shape, a, b)
        if key in self._edge_cache:
            return self._edge_cache[key]
        t = 0.0
        if a != b:
            where_b = {ax: d for d in (0, 1) for ax in b[d]}
            gone = tuple(ax for d in (0, 1) for ax in a[d] if ax not in where_b)
            moved = tuple(ax for d in (0, 1) for ax in a[d] if ax in where_b and where_b[ax] != d)
            if gone:
                t += self._seconds(cost.all_gather_time(shape, DT, self.spec(a), axes=gone,
                                                        mesh_shape=self.mesh, hardware=self.hw))
            if moved:
                t += self._seconds(cost.all_to_all_time(shape, DT, self.spec(a), axes=moved,
                                                        mesh_shape=self.mesh, hardware=self.hw))
        self._edge_cache[key] = t
        return t

    def matmul(self, name, k_dim, n_dim, layer):
        """X[M, K] @ W[K, N]: each mesh axis shards M, K or N (9 strategies; replicated compute
        is not offered, as in Alpa), plus the FSDP form of MM, MN and MK: the weight also
        sharded over M's axes, all-gathered for the forward and backward pass, its gradient
        reduce-scattered instead of all-reduced (12 strategies)."""
        M, K, N = self.M, k_dim, n_dim
        strategies, ins, outs = [], [], []
        picks = [(p, False) for p in itertools.product("MKN", repeat=len(self.axes))]
        picks += [(tuple(p), True) for p in ("MM", "MN", "MK")]
        for pick, fsdp in picks:
            m_ax = tuple(a for a, w in zip(self.axes, pick) if w == "M")
            k_ax = tuple(a for a, w in zip(self.axes, pick) if w == "K")
            n_ax = tuple(a for a, w in zip(self.axes, pick) if w == "N")
            m, k, n = self.shards(m_ax), self.shards(k_ax), self.shards(n_ax)
            compute = 3 * cost.matmul_time(M // m, K // k, N // n, DT, hardware=self.hw).seconds
            comm = (self.all_reduce((M, N), (m_ax, n_ax), k_ax)      # forward partial sums
                    + self.all_reduce((M, K), (m_ax, k_ax), n_ax))   # dX
            w_shards = k * n
            if fsdp:
                w_spec = self.spec((k_ax + m_ax, n_ax))
                comm += 2 * self._seconds(cost.all_gather_time((K, N), DT, w_spec, axes=m_ax,
                                                               mesh_shape=self.mesh, hardware=self.hw))
                comm += self._seconds(cost.reduce_scatter_time((K, N), DT, self.spec((k_ax, n_ax)),
                                                               axes=m_ax, mesh_shape=self.mesh,
                                                               hardware=self.hw))
                w_shards *= m
            else:
                comm += self.all_reduce((K, N), (k_ax, n_ax), m_ax)  # dW: gradient sync
            memory = K * N / w_shards * PARAM_BYTES + M * K / (m * k) * BYTES
            label = "MKN:" + "".join(pick) + ("+fsdp" if fsdp else "")
            strategies.append(Strategy(label, compute_s=compute, comm_s=comm, memory_bytes=memory,
                                       spec=(self.spec((m_ax, k_ax)), self.spec((k_ax, n_ax)))))
            ins.append((m_ax, k_ax))
            outs.append((m_ax, n_ax))
        return Node(f"{name}.{layer}", strategies, layer_class="block", position=name), ins, outs

    def elementwise(self, name, width, layer, *, flops_per_elem=0.0, reduce_dim1=False,
                    attention=False):
        strategies, specs = [], []
        for dims in self.tensor_specs():
            sh = self.shards(dims[0] + dims[1])
            elems = self.M * width / sh
            if attention:  # softmax(QK^T)V over the heads of the shard
                flops = 4 * self.M * self.S * self.D / sh
                compute = 3 * flops / self.peak
                memory = 4 * elems * BYTES
            else:
                compute = 3 * (2 * elems * BYTES / self.hw.hbm_bandwidth + elems * flops_per_elem / self.peak)
                memory = elems * BYTES
            comm = 3 * self.all_reduce((self.M, 2), (dims[0], ()), dims[1]) if reduce_dim1 else 0.0
            strategies.append(Strategy(self.name(dims), compute_s=compute, comm_s=comm,
                                       memory_bytes=memory, spec=self.spec(dims)))
            specs.append(dims)
        return Node(f"{name}.{layer}", strategies, layer_class="block", position=name), specs, specs

    def edge(self, src, dst, width):
        (sn, _, s_out), (dn, d_in, _) = src, dst
        shape = (self.M, width)
        mat = [[self.reshard(shape, a, b) + self.reshard(shape, b, a) for b in d_in] for a in s_out]
        return Edge(sn.name, dn.name, mat)


def build(layers, mesh, hw, memory_limit, batch=16, tied=True):
    m = Model(mesh, hw, batch=batch)
    D, F = m.D, m.F
    embed_specs = m.tensor_specs()
    embed = (Node("embed", [Strategy(m.name(s), memory_bytes=m.M * D * BYTES / m.shards(s[0] + s[1]),
                                     spec=m.spec(s)) for s in embed_specs]), embed_specs, embed_specs)
    nodes, edges = [embed[0]], []
    prev = embed
    for layer in range(layers):
        ln1 = m.elementwise("ln1", D, layer, flops_per_elem=8, reduce_dim1=True)
        qkv = m.matmul("qkv", D, 3 * D, layer)
        att = m.elementwise("attn", D, layer, attention=True)
        out = m.matmul("out", D, D, layer)
        add1 = m.elementwise("add1", D, layer, flops_per_elem=1)
        ln2 = m.elementwise("ln2", D, layer, flops_per_elem=8, reduce_dim1=True)
        up = m.matmul("up", D, F, layer)
        gelu = m.elementwise("gelu", F, layer, flops_per_elem=10)
        down = m.matmul("down", F, D, layer)
        add2 = m.elementwise("add2", D, layer, flops_per_elem=1)
        nodes += [n[0] for n in (ln1, qkv, att, out, add1, ln2, up, gelu, down, add2)]
        edges += [m.edge(prev, ln1, D), m.edge(ln1, qkv, D), m.edge(qkv, att, 3 * D),
                  m.edge(att, out, D), m.edge(out, add1, D), m.edge(prev, add1, D),
                  m.edge(add1, ln2, D), m.edge(ln2, up, D), m.edge(up, gelu, F),
                  m.edge(gelu, down, F), m.edge(down, add2, D), m.edge(add1, add2, D)]
        prev = add2
    if not tied:  # every layer its own plan: only follow-the-leader and pruning shrink it
        nodes = [Node(n.name, n.strategies) for n in nodes]
    return Problem(nodes, edges, memory_limit_bytes=memory_limit)


def hand_written(problem, mesh):
    """The book's strategies as choices: DP (batch on every axis), FSDP, Megatron 2-D (batch on
    x, model on y) and FSDP + TP (the same with the weights also sharded over x)."""
    x, y = tuple(mesh)
    dp = {"matmul": "MKN:MM", "elementwise": f"[M@{x}{y},D]"}
    tp = {"qkv": "MKN:MN", "up": "MKN:MN", "out": "MKN:MK", "down": "MKN:MK",
          "elementwise": f"[M@{x},D]", "attn": f"[M@{x},D@{y}]", "gelu": f"[M@{x},D@{y}]"}
    plans = {
        "data parallel": dp,
        "FSDP": dict(dp, matmul="MKN:MM+fsdp"),
        "Megatron (data x, model y)": tp,
        "FSDP + TP (x, y)": dict(tp, **{k: v + "+fsdp" for k, v in tp.items() if v.startswith("MKN")}),
    }
    out = {}
    for name, plan in plans.items():
        choice = {}
        for n in problem.nodes:
            pos = n.name.split(".")[0]  # the op's place in the block (or "embed")
            want = plan.get(pos) or (plan["matmul"] if n.strategies[0].name.startswith("MKN")
                                     else plan["elementwise"])
            choice[n.name] = [s.name for s in n.strategies].index(want)
        out[name] = (problem.objective(choice), problem.is_feasible(choice),
                     problem.breakdown(choice)["memory_bytes"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--mesh", default="8x8")
    ap.add_argument("--batch", type=int, default=16, help="sequences of 2048 tokens per step")
    ap.add_argument("--hardware", default="tpu-v5p")
    ap.add_argument("--memory-gib", type=float, default=None, help="default: the chip's HBM")
    ap.add_argument("--no-shrink-limit", type=float, default=300.0)
    ap.add_argument("--untied", action="store_true", help="no layer tags: a plan per layer")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    hw = hardware.get(args.hardware)
    sx, sy = (int(v) for v in args.mesh.split("x"))
    mesh = {"x": sx, "y": sy}
    limit = args.memory_gib * 2**30 if args.memory_gib else float(hw.hbm_capacity)
    console = Console(highlight=False, width=124)
    rows = {}
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("building the problem", total=5)
        t0 = time.perf_counter()
        problem = build(args.layers, mesh, hw, limit, args.batch, tied=not args.untied)
        rows["build"] = time.perf_counter() - t0
        bar.update(task, advance=1, description="solving with shrinking")
        shrunk = solve(problem)
        bar.update(task, advance=1, description="solving without shrinking")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            full = solve(problem, shrink=False, time_limit_s=args.no_shrink_limit)
        bar.update(task, advance=1, description="greedy baseline")
        t0 = time.perf_counter()
        base = greedy(problem)
        base.solve_seconds = time.perf_counter() - t0
        bar.update(task, advance=1, description="hand-written plans")
        hands = hand_written(problem, mesh)
        bar.update(task, advance=1)

    table = Table(title=f"autoshard intra-op solve: {args.layers}-layer transformer step on "
                        f"{args.hardware} {sx}x{sy}, batch {args.batch}x2048{', untied' if args.untied else ''}, memory {limit / 2**30:.0f} GiB/device")
    for col in ("solver", "solve time", "variables (nodes / one-hot / edge)", "step time (est.)",
                "vs ILP", "proven"):
        table.add_column(col)

    def size(s):
        z = s.size_after
        return "-" if z is None else f"{z.nodes} / {z.strategies} / {z.edge_entries}"

    for label, s in (("ILP, shrunk", shrunk), ("ILP, no shrinking", full), ("greedy", base)):
        table.add_row(label, f"{s.solve_seconds:.3f} s", size(s), f"{s.objective * 1e3:.2f} ms",
                      f"{s.objective / shrunk.objective:.3f}x", "yes" if s.proven_optimal else "no")
    for label, (obj, ok, mem) in hands.items():
        table.add_row(label, "-", "-", f"{obj * 1e3:.2f} ms" + ("" if ok else f" (needs {mem / 2**30:.0f} GiB)"),
                      f"{obj / shrunk.objective:.3f}x", "-")
    console.print(table)
    console.print(f"problem: {problem.size}; shrunk to {shrunk.size_after}; built in {rows['build']:.2f} s")
    console.print(f"CPU: {cpu_model()}, {os.cpu_count()} logical CPUs, load average "
                  f"{os.getloadavg()[0]:.2f}")
    if caught:
        console.print(f"no-shrink solve: {caught[0].message}")
    per_pos = {}
    for n in problem.nodes[1:]:  # layer 0's plan (every layer's, when tied)
        per_pos.setdefault(n.name.split(".")[0], shrunk.strategies[n.name])
    console.print("ILP plan of layer 0: " + ", ".join(f"{k} {v}" for k, v in per_pos.items()),
                  markup=False)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"layers": args.layers, "mesh": mesh, "hardware": args.hardware, "cpu": cpu_model(),
                       "shrunk": {"seconds": shrunk.solve_seconds, "objective": shrunk.objective},
                       "no_shrink": {"seconds": full.solve_seconds, "objective": full.objective,
                                     "proven": full.proven_optimal},
                       "greedy": {"seconds": base.solve_seconds, "objective": base.objective},
                       "hand_written": {k: v[0] for k, v in hands.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
