"""The MPI runtime: the world communicator, this process's rank, and switching shardlab's
real-data backend to ``mpi``.

mpi4py is optional: it is imported only when shardlab runs under ``mpirun`` with more than one
rank (or when ``initialize`` is called), so a plain ``import shardlab`` never loads it.

Example:
    >>> from shardlab._src.backends.mpi import runtime
    >>> runtime.launched_ranks() if not runtime.is_initialized() else 1   # no mpirun here
    1
"""

from __future__ import annotations

import os

from ...core.processes import PROCESS
from ...primitives.primitive import REAL_BACKEND

# Environment variables through which launchers give the world size (Open MPI, MPICH/PMI, PMIx).
_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")


class _State:
    __slots__ = ("comm", "MPI", "axis_order", "check_programs")

    def __init__(self):
        self.comm = None
        self.MPI = None
        self.axis_order = None  # mesh axes in the order they are split over ranks (None: mesh order)
        self.check_programs = True


STATE = _State()


def launched_ranks() -> int:
    """How many ranks the launcher started (1 when not under mpirun)."""
    for var in _SIZE_VARS:
        v = os.environ.get(var)
        if v and v.isdigit():
            return int(v)
    return 1


def _mpi():
    try:
        from mpi4py import MPI  # optional dependency: pip install shardlab[mpi]
    except ImportError as e:
        raise ImportError("[shardlab.distributed] the MPI backend needs mpi4py and an MPI library: "
                          "pip install shardlab[mpi] (or apt-get install openmpi-bin libopenmpi-dev; "
                          "pip install mpi4py)") from e
    return MPI


def initialize(*, axis_order=None, check_programs: bool = True, comm=None) -> None:
    """Switches shardlab to the MPI backend: every real mesh's virtual devices are spread over
    the ranks of `comm` (MPI.COMM_WORLD by default) in contiguous blocks.

    Args:
        axis_order: mesh axis names in the order they are split over ranks (default: the mesh's
            own order, which gives each rank a contiguous block of device ids).
        check_programs: before each collective, check that every rank runs the same one
            (op, axes, shape, dtype); a mismatch raises naming the ranks and their ops.
        comm: an mpi4py communicator (a sub-communicator to run on part of the world).
    """
    MPI = _mpi()
    STATE.MPI = MPI
    STATE.comm = comm if comm is not None else MPI.COMM_WORLD
    STATE.comm.Set_errhandler(MPI.ERRORS_RETURN)  # errors become exceptions (mpi4py raises them)
    STATE.axis_order = None if axis_order is None else tuple(axis_order)
    STATE.check_programs = bool(check_programs)
    PROCESS.index = STATE.comm.Get_rank()
    PROCESS.count = STATE.comm.Get_size()
    REAL_BACKEND[0] = "mpi"


def shutdown() -> None:
    """Back to the one-process emulated backend (the MPI library stays initialized)."""
    STATE.comm = None
    PROCESS.index, PROCESS.count = 0, 1
    REAL_BACKEND[0] = "emulated"


def is_initialized() -> bool:
    """True while the MPI backend runs this process's programs."""
    return STATE.comm is not None


def auto_initialize() -> None:
    """``initialize()`` when launched by mpirun with more than one rank, unless
    SHARDLAB_MPI=0."""
    if os.environ.get("SHARDLAB_MPI", "1") != "0" and launched_ranks() > 1:
        initialize()
