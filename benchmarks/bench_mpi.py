"""shardlab over MPI ranks: 256 MiB all_gather, psum and all_to_all across 2 ranks against raw
mpi4py calls on the same bytes, and a training step on 64 virtual devices with 1, 2 and 4
ranks (peak memory per rank, step time).

    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \\
        mpirun -n 2 --oversubscribe python benchmarks/bench_mpi.py collectives
    for n in 1 2 4; do mpirun -n $n --oversubscribe python benchmarks/bench_mpi.py train; done

Rank 0 prints one line per figure: ours, raw mpi4py's (into a preallocated output, and into
a new one as ours is), and the ratio (raw time / ours). Each call of ours returns a new 256 MiB
array whose pages the kernel maps on first touch; glibc gives such large blocks back to the
system when freed, so every call pays those page faults again. With
``mpirun -x MALLOC_MMAP_MAX_=0 -x MALLOC_TRIM_THRESHOLD_=68719476736`` (and both variables set)
freed memory is reused and that cost goes away (docs/mpi.md).
"""

from __future__ import annotations

import resource
import sys
import time

import numpy as np
from mpi4py import MPI

import shardlab as sl
from shardlab import P, lax
from shardlab import train as tr
from shardlab.models import ModelConfig, transformer

MiB = 1 << 20
COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def best(fn, reps: int = 5) -> float:
    """The slowest rank's time of one call, best of `reps` (every rank starts together)."""
    times = []
    for _ in range(reps):
        COMM.Barrier()
        t = time.perf_counter()
        fn()
        times.append(COMM.allreduce(time.perf_counter() - t, op=MPI.MAX))
    return min(times)


def say(*args) -> None:
    if RANK == 0:
        print(*args, flush=True)


def collectives() -> None:
    if SIZE != 2:
        say("run the collectives under mpirun -n 2")
        return
    mesh = sl.make_mesh((2,), ("x",), devices=sl.devices()[:2])  # one virtual device per rank
    n = 256 * MiB // 4
    rng = np.random.default_rng(0)
    glob = rng.standard_normal(2 * n, dtype=np.float32)  # every rank passes the same global array

    def resident(global_array):  # a value living on the ranks (each rank holds its block)
        return sl.shard_map(lambda a: a, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(
            sl.device_put(global_array, sl.NamedSharding(mesh, P("x"))))

    cases = []
    # all_gather: 256 MiB gathered (128 MiB per device)
    x = resident(glob[:n])
    send, recv = np.ascontiguousarray(glob[RANK * n // 2:(RANK + 1) * n // 2]), np.empty(n, np.float32)
    ag = sl.shard_map(lambda a: lax.all_gather(a, "x", tiled=True), mesh=mesh, in_specs=P("x"), out_specs=P())
    cases.append(("all_gather, 256 MiB gathered", lambda: ag(x), lambda: COMM.Allgather(send, recv),
                  lambda: COMM.Allgather(send, np.empty(n, np.float32))))
    # psum: 256 MiB per device
    y = resident(glob)
    send2, recv2 = np.ascontiguousarray(glob[RANK * n:(RANK + 1) * n]), np.empty(n, np.float32)
    ps = sl.shard_map(lambda a: lax.psum(a, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())
    cases.append(("psum, 256 MiB per device", lambda: ps(y), lambda: COMM.Allreduce(send2, recv2),
                  lambda: COMM.Allreduce(send2, np.empty(n, np.float32))))
    # all_to_all: 256 MiB per device
    to = sl.shard_map(lambda a: lax.all_to_all(a, "x", 0, 0, tiled=True), mesh=mesh, in_specs=P("x"),
                      out_specs=P("x"))
    cases.append(("all_to_all, 256 MiB per device", lambda: to(y), lambda: COMM.Alltoall(send2, recv2),
                  lambda: COMM.Alltoall(send2, np.empty(n, np.float32))))
    # the values first: ours equal the raw calls' bytes
    np.testing.assert_array_equal(np.asarray(ag(x)), glob[:n])
    COMM.Allreduce(send2, recv2)
    mine = ps(y).addressable_shards[0].data
    np.testing.assert_array_equal(np.asarray(mine), recv2)
    say(f"CPU: {cpu_model()}; {SIZE} ranks, Open MPI {MPI.Get_library_version().split(',')[0]}")
    for name, ours, raw, raw_alloc in cases:
        t_ours, t_raw, t_alloc = [], [], []
        for _ in range(5):  # interleaved, so a busy moment of the machine hits all three alike
            t_ours.append(best(ours, 1))
            t_raw.append(best(raw, 1))
            t_alloc.append(best(raw_alloc, 1))
        t_ours, t_raw, t_alloc = min(t_ours), min(t_raw), min(t_alloc)
        say(f"{name:32s} shardlab {t_ours * 1e3:7.1f} ms | raw mpi4py, preallocated output {t_raw * 1e3:7.1f} ms, "
            f"ratio {t_raw / t_ours:4.2f}x | raw mpi4py, new output {t_alloc * 1e3:7.1f} ms, ratio "
            f"{t_alloc / t_ours:4.2f}x")


def train() -> None:
    cfg = ModelConfig(num_layers=2, d_model=512, ffw_dim=2048, num_heads=8, vocab_size=4096, max_seq_len=64)
    mesh = sl.make_mesh((16, 4), ("data", "model"))  # 64 virtual devices
    rng = np.random.default_rng(0)
    tok, tgt = rng.integers(0, cfg.vocab_size, (64, 64)), rng.integers(0, cfg.vocab_size, (64, 64))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = tr.Trainer(cfg, "fsdp_tp", mesh, optimizer=tr.AdamW(lr=1e-3))
    state = t.init(transformer.init_params(cfg, seed=0))
    state, loss = t.step(state, tok, tgt)
    times = []
    for _ in range(2):
        COMM.Barrier()
        t0 = time.perf_counter()
        state, loss = t.step(state, tok, tgt)
        times.append(COMM.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    peak = COMM.allreduce(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, op=MPI.MAX)
    base = COMM.allreduce(base, op=MPI.MAX)
    say(f"training step, 64 virtual devices (fsdp_tp 16x4), {SIZE} rank(s): step {min(times):.2f} s, "
        f"peak RSS per rank {peak / 1024:.0f} MiB ({(peak - base) / 1024:.0f} MiB above the "
        f"{base / 1024:.0f} MiB after import), loss {float(loss):.4f}")


if __name__ == "__main__":
    {"collectives": collectives, "train": train}[sys.argv[1] if len(sys.argv) > 1 else "collectives"]()
