"""The MPI suite: run under ``mpirun -n R`` (R = 1, 2 or 4), e.g.
``mpirun --allow-run-as-root --oversubscribe -n 2 python -m pytest -q tests/mpi``.
Every rank runs every test in the same order; a test compares the MPI run with the
one-process run of the same program on each rank."""

import pytest

mpi4py = pytest.importorskip("mpi4py")


def pytest_configure(config):
    import shardlab as sl  # noqa: F401  (initializes the MPI backend when launched by mpirun)
    from mpi4py import MPI
    if MPI.COMM_WORLD.Get_rank() != 0:  # one report: rank 0's (every rank asserts the same)
        config.option.verbose = -2
        config.option.reportchars = ""
