"""shardlab over MPI ranks, as ``jax.distributed``: a mesh's virtual devices spread over the
processes of ``mpirun -n R``, each holding its own devices' data (see docs/mpi.md).

Launched by mpirun (or any MPI launcher) with more than one rank, ``import shardlab``
initializes it (set SHARDLAB_MPI=0 to opt out); ``initialize()`` does so explicitly, with
options. Nothing else changes: the same program gives the same values and the same ledger
on 1, 2 or 4 ranks. ``np.asarray`` of a value gathers every rank's devices, so it is
*collective* (every rank must call it), as ``jax.experimental.multihost_utils.process_allgather``.

Example (one process here: nothing is spread):
    >>> import shardlab as sl
    >>> sl.distributed.is_initialized(), sl.process_index(), sl.process_count()
    (False, 0, 1)
"""

from __future__ import annotations

import numpy as np

from ._src.backends.mpi import dispatch as _dispatch
from ._src.backends.mpi import runtime as _runtime
from ._src.core.processes import PROCESS as _PROCESS
from ._src.backends.mpi.storage import RankStorage as _RankStorage

is_initialized = _runtime.is_initialized
shutdown = _runtime.shutdown


def initialize(*, axis_order=None, check_programs: bool = True, comm=None, timeout: float | None = None) -> None:
    """Spreads every real mesh's virtual devices over the MPI ranks (contiguous blocks of
    device ids), as ``jax.distributed.initialize``.

    Args:
        axis_order: mesh axis names in the order they are split over the ranks (default: the
            mesh's order, so each rank holds a contiguous block of device ids).
        check_programs: before each collective, check that every rank runs the same one; a
            mismatch raises RuntimeError listing each rank's collective.
        comm: an mpi4py communicator (default ``MPI.COMM_WORLD``).
        timeout: seconds a collective may wait for the other ranks before the job is aborted with
            a message naming this rank and the collective (default: the SHARDLAB_MPI_TIMEOUT
            environment variable, else 600). A rank that dies ends the job too: mpirun names it,
            and each stopped rank prints the collective it was in.

    Raises ImportError naming ``pip install shardlab[mpi]`` when mpi4py is missing. A mesh
    whose device count is not divisible by the rank count raises ValueError at its first use.
    """
    _runtime.initialize(axis_order=axis_order, check_programs=check_programs, comm=comm, timeout=timeout)
    _dispatch.register_all()


def process_allgather(x) -> np.ndarray:
    """The global value of `x` (a ShardedArray, or a LocalArray's per-device storage) on every
    rank: ``np.asarray(x)``, named as JAX's ``multihost_utils.process_allgather``. Collective."""
    return np.asarray(x)


def addressable_devices(mesh) -> list:
    """The virtual devices of `mesh` whose data this process holds (all of them on one
    process), in the mesh's order.

    Example:
        >>> import shardlab as sl
        >>> len(sl.distributed.addressable_devices(sl.make_mesh((4, 2), ("x", "y"))))
        8
    """
    devices = np.asarray(mesh.devices).ravel()
    return [devices[i] for i in _PROCESS.addressable_positions(mesh)]


def holds_block(storage) -> bool:
    """True when `storage` holds only this rank's block (it came from the MPI backend)."""
    return type(storage) is _RankStorage


if _runtime.launched_ranks() > 1 and not is_initialized():
    _runtime.auto_initialize()
    if is_initialized():
        _dispatch.register_all()

__all__ = ["addressable_devices", "holds_block", "initialize", "is_initialized", "process_allgather", "shutdown"]
