"""Elementwise numpy ufuncs on all cores: a large output is cut into one slab per worker along
its first axis long enough to split, and each slab runs on its own thread (numpy releases the
GIL inside a ufunc's inner loop), so the emulator's elementwise work is not one-core-bound
while its GEMMs and collectives use every core.

Operands broadcast as usual: an operand of size 1 along the split axis (or without that axis)
is given whole to every slab. Small outputs, where a thread hand-off costs more than it saves,
run on the calling thread unchanged.

Example:
    >>> import numpy as np
    >>> from shardlab._src.kernels.threaded import ufunc_call
    >>> a = np.arange(6.0).reshape(2, 3)
    >>> ufunc_call(np.add, [a, np.float64(1.0)]).tolist()
    [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# Below this many output elements one thread is faster: a hand-off costs ~20 us, about what
# a ufunc spends on 2**16 float32 elements.
MIN_PARALLEL_SIZE = 1 << 16


def _worker_count() -> int:
    env = os.environ.get("OMP_NUM_THREADS", "")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, int(env))) if env.isdigit() and int(env) > 0 else cpus


WORKERS = _worker_count()


def _new_pool():
    return ThreadPoolExecutor(max_workers=WORKERS - 1, thread_name_prefix="shardlab-ufunc") if WORKERS > 1 else None


_POOL = _new_pool()


def _after_fork_in_child() -> None:
    # A forked child has none of the parent's worker threads, but the executor would believe
    # it has and never start new ones: every threaded call would wait forever.
    global _POOL
    _POOL = _new_pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _split_axis(shape: tuple) -> int:
    """The first axis with at least one slab's worth of rows per worker, else the longest."""
    for ax, n in enumerate(shape):
        if n >= WORKERS:
            return ax
    return max(range(len(shape)), key=lambda ax: shape[ax])


def _slab(arg, ax: int, rank: int, lo: int, hi: int):
    """Rows lo:hi of broadcast axis `ax` of `arg` (right-aligned to `rank` dims)."""
    if not isinstance(arg, np.ndarray):
        return arg
    a = ax - (rank - arg.ndim)
    if a < 0 or arg.shape[a] == 1:
        return arg
    return arg[(slice(None),) * a + (slice(lo, hi),)]


def ufunc_call(ufunc: np.ufunc, args: list) -> np.ndarray:
    """``ufunc(*args)`` with the work split over `WORKERS` threads when the output is large.

    Args:
        ufunc: a numpy ufunc with one output.
        args: its operands (arrays and scalars), already of the dtypes wanted.

    Returns:
        The result, equal element for element to ``ufunc(*args)``.
    """
    shape = np.broadcast_shapes(*(np.shape(a) for a in args))
    size = math.prod(shape)
    if _POOL is None or size < MIN_PARALLEL_SIZE or not shape:
        return np.asarray(ufunc(*args))
    ax = _split_axis(shape)
    rank = len(shape)
    # The result dtype, from the operands' empty slabs (numpy's own resolution, no arithmetic).
    dtype = ufunc(*(_slab(a, ax, rank, 0, 0) for a in args)).dtype
    out = np.empty(shape, dtype)
    bounds = [shape[ax] * i // WORKERS for i in range(WORKERS + 1)]
    index = (slice(None),) * ax

    def run(i: int) -> None:
        lo, hi = bounds[i], bounds[i + 1]
        if hi > lo:
            ufunc(*(_slab(a, ax, rank, lo, hi) for a in args), out=out[index + (slice(lo, hi),)])

    pending = [_POOL.submit(run, i) for i in range(1, WORKERS)]
    run(0)
    for p in pending:
        p.result()
    return out
