"""shardlab over MPI ranks: 256 MiB all_gather, psum and all_to_all across 2 ranks against raw
mpi4py calls on the same bytes, and a training step on 64 virtual devices with 1, 2 and 4
ranks (peak memory per rank, step time).

    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \\
        mpirun -n 2 --oversubscribe python benchmarks/bench_mpi.py collectives
    python benchmarks/bench_mpi.py train      # runs mpirun -n 1, 2 and 4 itself, one table

**Collectives.** Ours is the user's program: a shard_map over a mesh of one virtual device per
rank, returning a new shardlab array per call (shardlab's default checks included: one 16-byte
allreduce per collective that every rank runs the same one). The raw mpi4py baselines move the
same bytes between the same numpy arrays:

- *preallocated output*: ``COMM.Allgather(send, recv)`` / ``Allreduce`` / ``Alltoall`` with
  ``send`` this rank's numpy array and ``recv`` one numpy array allocated once before the timing
  and written by every call: the fastest a user can write, and the figure of the ratio (goal
  >= 0.8x);
- *new output*: the same call into ``np.empty(...)`` allocated by each call, as a function that
  returns its result does (its pages are mapped anew by every call).

Each figure is the slowest rank's time of one call, best of 7 rounds; a round times ours and
both baselines back to back, so a busy moment of the machine hits all three alike. Nothing in
the environment is set (default malloc).

**Training.** One AdamW step of a 2-layer transformer (d_model 512) on a 16x4 ``(data, model)``
mesh, FSDP + tensor parallel, batch 64 x 64 tokens: per rank, the peak resident memory and the
part of it above the memory after import (Python, numpy, shardlab, MPI), the state (params and
Adam moments) this rank holds, and the step time. The ranks split the ``data`` axis: a value
that varies along it is split over the ranks, a value the same along it (the replicated
``data``-axis copies: all-gathered weights, the loss) is held once on each rank. Every rank also
builds the host copy of the initial params (``transformer.init_params``, as a multi-process JAX
program does) before ``device_put`` keeps its block.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time

import numpy as np

MiB = 1 << 20
ROUNDS = 7


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def machine() -> str:
    return f"CPU: {cpu_model()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"


# mpi4py and shardlab are imported inside the modes that run under mpirun: the `train` driver
# starts mpirun itself, and a process that has initialized MPI should not.


def collectives() -> None:
    from mpi4py import MPI

    import shardlab as sl
    from shardlab import P, lax

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()

    def say(*args) -> None:
        if rank == 0:
            print(*args, flush=True)

    def timed(fn) -> float:
        """The slowest rank's time of one call (every rank starts together)."""
        comm.Barrier()
        t = time.perf_counter()
        fn()
        return comm.allreduce(time.perf_counter() - t, op=MPI.MAX)

    if size != 2:
        say("run the collectives under mpirun -n 2")
        return
    mesh = sl.make_mesh((2,), ("x",), devices=sl.devices()[:2])  # one virtual device per rank
    n = 256 * MiB // 4
    rng = np.random.default_rng(0)
    glob = rng.standard_normal(2 * n, dtype=np.float32)  # every rank passes the same global array

    def resident(global_array):  # a value living on the ranks (each rank holds its block)
        return sl.device_put(global_array, sl.NamedSharding(mesh, P("x")))

    cases = []
    # all_gather: 256 MiB gathered (128 MiB per device)
    x = resident(glob[:n])
    half = np.ascontiguousarray(glob[rank * n // 2:(rank + 1) * n // 2])
    recv = np.empty(n, np.float32)
    ag = sl.shard_map(lambda a: lax.all_gather(a, "x", tiled=True), mesh=mesh, in_specs=P("x"), out_specs=P())
    cases.append(("all_gather, 256 MiB gathered", lambda: ag(x), lambda: comm.Allgather(half, recv),
                  lambda: comm.Allgather(half, np.empty(n, np.float32))))
    # psum and all_to_all: 256 MiB per device
    y = resident(glob)
    full = np.ascontiguousarray(glob[rank * n:(rank + 1) * n])
    ps = sl.shard_map(lambda a: lax.psum(a, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())
    cases.append(("psum, 256 MiB per device", lambda: ps(y), lambda: comm.Allreduce(full, recv),
                  lambda: comm.Allreduce(full, np.empty(n, np.float32))))
    to = sl.shard_map(lambda a: lax.all_to_all(a, "x", 0, 0, tiled=True), mesh=mesh, in_specs=P("x"),
                      out_specs=P("x"))
    cases.append(("all_to_all, 256 MiB per device", lambda: to(y), lambda: comm.Alltoall(full, recv),
                  lambda: comm.Alltoall(full, np.empty(n, np.float32))))
    # the values first: ours equal the raw calls' bytes
    np.testing.assert_array_equal(np.asarray(ag(x)), glob[:n])
    comm.Allreduce(full, recv)
    np.testing.assert_array_equal(np.asarray(ps(y).addressable_shards[0].data), recv)
    comm.Alltoall(full, recv)
    np.testing.assert_array_equal(np.asarray(to(y).addressable_shards[0].data), recv)
    say(f"{machine()}; {size} ranks, {MPI.Get_library_version().splitlines()[0].split(',')[0]}, "
        f"mpi4py {sys.modules['mpi4py'].__version__}, numpy {np.__version__}")
    for name, ours, raw, raw_new in cases:
        t_ours, t_raw, t_new = [], [], []
        for _ in range(ROUNDS):
            t_ours.append(timed(ours))
            t_raw.append(timed(raw))
            t_new.append(timed(raw_new))
        t_ours, t_raw, t_new = min(t_ours), min(t_raw), min(t_new)
        say(f"{name:31s} shardlab {t_ours * 1e3:6.1f} ms | raw mpi4py, preallocated output {t_raw * 1e3:6.1f} ms: "
            f"ratio {t_raw / t_ours:4.2f}x | raw mpi4py, new output {t_new * 1e3:6.1f} ms: ratio {t_new / t_ours:4.2f}x")


def _rss() -> int:
    """Resident bytes now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def train_ranks() -> None:
    """One line of JSON (rank 0): this rank count's figures (the slowest / largest rank's)."""
    from mpi4py import MPI

    import shardlab as sl
    from shardlab import train as tr
    from shardlab._src.backends.mpi.storage import rank_nbytes
    from shardlab.models import ModelConfig, transformer

    comm = MPI.COMM_WORLD
    imported = _rss()
    cfg = ModelConfig(num_layers=2, d_model=512, ffw_dim=2048, num_heads=8, vocab_size=4096, max_seq_len=64)
    mesh = sl.make_mesh((16, 4), ("data", "model"))  # 64 virtual devices
    rng = np.random.default_rng(0)
    tok, tgt = rng.integers(0, cfg.vocab_size, (64, 64)), rng.integers(0, cfg.vocab_size, (64, 64))
    t = tr.Trainer(cfg, "fsdp_tp", mesh, optimizer=tr.AdamW(lr=1e-3))
    state = t.init(transformer.init_params(cfg, seed=0))
    held = np.zeros(2, np.int64)
    for leaf in sl.tree_util.tree_leaves((state.params, state.master, state.opt_state, state.grads)):
        if isinstance(leaf, sl.Array):
            held += rank_nbytes(leaf._storage)
    after_init = _rss()
    state, loss = t.step(state, tok, tgt)
    times = []
    for _ in range(2):
        comm.Barrier()
        t0 = time.perf_counter()
        state, loss = t.step(state, tok, tgt)
        times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    mine = {"imported": imported, "after_init": after_init, "peak": _peak(), "state_split": int(held[0]),
            "state_replicated": int(held[1])}
    worst = {k: comm.allreduce(v, op=MPI.MAX) for k, v in mine.items()}
    if comm.Get_rank() == 0:
        print("RESULT " + json.dumps(dict(worst, ranks=comm.Get_size(), step=min(times), loss=float(loss))), flush=True)


def train() -> None:
    """Runs train_ranks under mpirun -n 1, 2 and 4 and prints one table."""
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if mpirun is None:
        sys.exit("bench_mpi.py train needs mpirun (apt-get install openmpi-bin)")
    env = dict(os.environ)
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # Open MPI refuses root unless told (a container)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    print(f"{machine()}; training step, 64 virtual devices (fsdp_tp over a 16x4 data x model mesh); "
          "memory per rank, the largest rank's", flush=True)
    rows = []
    for ranks in (1, 2, 4):
        out = subprocess.run([mpirun, "--oversubscribe", "-n", str(ranks), sys.executable, os.path.abspath(__file__),
                              "train-ranks"], env=env, capture_output=True, text=True, timeout=1800)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if out.returncode or not lines:
            sys.exit(f"mpirun -n {ranks} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        rows.append(json.loads(lines[0][len("RESULT "):]))
    one = rows[0]
    for r in rows:
        used = r["peak"] - r["imported"]
        step_mem = r["peak"] - r["after_init"]
        print(f"{r['ranks']} rank(s): step {r['step']:.2f} s | peak RSS {r['peak'] / MiB:5.0f} MiB, "
              f"{used / MiB:5.0f} MiB above import ({used / (one['peak'] - one['imported']):.2f} of 1 rank's, "
              f"1/R = {1 / r['ranks']:.2f}); the step's own {step_mem / MiB:4.0f} MiB above the state after init "
              f"({step_mem / (one['peak'] - one['after_init']):.2f}) | state held {r['state_split'] / MiB:4.1f} MiB "
              f"split + {r['state_replicated'] / MiB:.1f} MiB replicated | loss {r['loss']:.4f}")


if __name__ == "__main__":
    modes = {"collectives": collectives, "train": train, "train-ranks": train_ranks}
    mode = sys.argv[1] if len(sys.argv) > 1 else "collectives"
    if mode not in modes:
        sys.exit(f"bench_mpi.py: unknown mode {mode!r}; one of {', '.join(modes)}")
    modes[mode]()
