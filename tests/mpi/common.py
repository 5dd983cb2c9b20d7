"""Helpers of the MPI suite: run a program on the MPI backend and on one process, compare."""

from __future__ import annotations

import numpy as np

import shardlab as sl


def run_both(program):
    """(mpi, one_process): each the program's values (as numpy, gathered) and ledger events.
    `program()` builds its inputs itself and returns a pytree of arrays."""
    return _run(program, mpi=True), _run(program, mpi=False)


def _run(program, *, mpi: bool):
    was = sl.distributed.is_initialized()
    if was and not mpi:
        sl.distributed.shutdown()
    try:
        with sl.Ledger() as led:
            out = program()
        vals = [np.asarray(v) for v in sl.tree_util.tree_leaves(out)]
        return vals, led.events
    finally:
        if was and not mpi:
            sl.distributed.initialize()


def assert_same(program, *, exact=True, events=True):
    (v1, e1), (v0, e0) = run_both(program)
    assert len(v1) == len(v0)
    for a, b in zip(v1, v0):
        assert a.shape == b.shape and a.dtype == b.dtype
        if exact:
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert e1 == e0
    assert bool(e1) == events, "the program recorded no event" if events else e1
    return v1, e1
