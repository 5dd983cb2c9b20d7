"""The mpi backend: a mesh's virtual devices spread over MPI ranks (``mpirun -n R``), each rank
holding its block of devices; collectives are the core's local movement plus MPI collectives
on communicators cached per (mesh, axes). See docs/mpi.md.

Launched by mpirun with more than one rank, importing shardlab initializes it (unless
SHARDLAB_MPI=0); ``shardlab.distributed.initialize()`` does so explicitly.
"""

from . import runtime, placement, storage, dispatch, collectives  # noqa: F401
