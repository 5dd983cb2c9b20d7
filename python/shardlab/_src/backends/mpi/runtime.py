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
import select
import signal
import sys
import threading
import time
import warnings

from ...core.processes import PROCESS
from ...primitives.primitive import use_backend

# Environment variables through which launchers give the world size (Open MPI, MPICH/PMI, PMIx).
_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")


class _State:
    __slots__ = ("comm", "MPI", "axis_order", "check_programs", "timeout", "current", "since", "watchdog", "wakeup")

    def __init__(self):
        self.comm = None
        self.MPI = None
        self.axis_order = None  # mesh axes in the order they are split over ranks (None: mesh order)
        self.check_programs = True
        self.timeout = None  # seconds a collective may take before the job is aborted
        self.current = None  # the collective this rank is in (for the fault messages), or None
        self.since = 0.0
        self.watchdog = None
        self.wakeup = None  # the pipe the watchdog reads signals from while MPI blocks the main thread


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


def enter(desc: str) -> None:
    """Marks this rank as inside collective `desc` (named if the job dies or times out there)."""
    STATE.current, STATE.since = desc, time.monotonic()


def leave() -> None:
    STATE.current = None


def _fault(why: str) -> str:
    rank = STATE.comm.Get_rank() if STATE.comm is not None else "?"
    where = f"in collective {STATE.current}" if STATE.current else "outside any collective"
    return f"[mpi] rank {rank} {why} {where}"


def _on_term(signum, frame):  # mpirun stops the other ranks with SIGTERM when one dies
    sys.stderr.write(_fault("was stopped (another rank ended: mpirun's message above names it)") + "\n")
    sys.stderr.flush()
    os._exit(128 + signum)


def _watch():
    while STATE.comm is not None:
        interval = min(1.0, STATE.timeout / 4)
        if STATE.wakeup is None:
            time.sleep(interval)
        elif select.select([STATE.wakeup], [], [], interval)[0]:
            # a signal arrived while the main thread may be blocked in an MPI call (Python runs
            # signal handlers only between bytecodes of the main thread)
            if signal.SIGTERM in os.read(STATE.wakeup, 64):
                _on_term(signal.SIGTERM, None)
        if STATE.current is not None and time.monotonic() - STATE.since > STATE.timeout:
            sys.stderr.write(_fault(f"waited more than {STATE.timeout:g} s") + "; a rank is missing from it "
                             "(dead, stuck, or running another program): aborting the job\n")
            sys.stderr.flush()
            STATE.comm.Abort(124)


def initialize(*, axis_order=None, check_programs: bool = True, comm=None, timeout: float | None = None) -> None:
    """Switches shardlab to the MPI backend: every real mesh's virtual devices are spread over
    the ranks of `comm` (MPI.COMM_WORLD by default) in contiguous blocks.

    Args:
        axis_order: mesh axis names in the order they are split over ranks (default: the mesh's
            own order, which gives each rank a contiguous block of device ids).
        check_programs: before each collective, check that every rank runs the same one
            (op, axes, shape, dtype); a mismatch raises naming the ranks and their ops.
        comm: an mpi4py communicator (a sub-communicator to run on part of the world).
        timeout: seconds one collective may wait for the other ranks before the job is aborted
            with a message naming this rank and the collective (default: SHARDLAB_MPI_TIMEOUT,
            else 600).
    """
    MPI = _mpi()
    STATE.MPI = MPI
    STATE.comm = comm if comm is not None else MPI.COMM_WORLD
    STATE.comm.Set_errhandler(MPI.ERRORS_RETURN)  # errors become exceptions (mpi4py raises them)
    STATE.axis_order = None if axis_order is None else tuple(axis_order)
    STATE.check_programs = bool(check_programs)
    PROCESS.index = STATE.comm.Get_rank()
    PROCESS.count = STATE.comm.Get_size()
    use_backend("mpi")
    STATE.timeout = float(timeout if timeout is not None else os.environ.get("SHARDLAB_MPI_TIMEOUT", 600))
    if threading.current_thread() is threading.main_thread() and STATE.wakeup is None:
        signal.signal(signal.SIGTERM, _on_term)
        r, w = os.pipe()
        os.set_blocking(w, False)
        if signal.set_wakeup_fd(w, warn_on_full_buffer=False) == -1:
            STATE.wakeup = r  # both ends stay open as long as the process
        else:  # another wakeup fd (an asyncio loop, say) is in use: leave it
            signal.set_wakeup_fd(-1)
            os.close(r)
            os.close(w)
    if STATE.watchdog is None or not STATE.watchdog.is_alive():
        STATE.watchdog = threading.Thread(target=_watch, name="shardlab-mpi-watchdog", daemon=True)
        STATE.watchdog.start()


def shutdown() -> None:
    """Back to the one-process emulated backend (the MPI library stays initialized)."""
    STATE.comm = None
    PROCESS.index, PROCESS.count = 0, 1
    use_backend("emulated")


def is_initialized() -> bool:
    """True while the MPI backend runs this process's programs."""
    return STATE.comm is not None


def auto_initialize() -> None:
    """``initialize()`` when launched by mpirun with more than one rank, unless
    SHARDLAB_MPI=0; a RuntimeWarning (and one process per rank, as without MPI) when mpi4py is
    missing."""
    if os.environ.get("SHARDLAB_MPI", "1") != "0" and launched_ranks() > 1:
        try:
            initialize()
        except ImportError as e:  # without mpi4py nothing changes: each rank runs on its own
            warnings.warn(f"{e}; started by an MPI launcher with {launched_ranks()} ranks, each rank runs the "
                          f"whole program on its own", RuntimeWarning, stacklevel=2)
