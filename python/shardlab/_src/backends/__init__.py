"""Backends: where primitives run on real data. ``emulated`` runs them on the C++ core and numpy
in one process; ``mpi`` spreads the virtual devices over MPI ranks (``shardlab.distributed``
starts it). Each registers a primitive's implementation (``prim.impl["emulated"]``) beside the
implementation; importing this package (``shardlab/__init__.py`` does, once) makes them exist.

The abstract backend (shapes, dtypes and varying axes, no data) is not here: a primitive's
abstract implementation is its own shape rule (``Primitive.abstract_impl``), so every
primitive, wherever and whenever it is defined, runs shape-only on an abstract mesh and
under ``eval_shape``, recording the same ledger events as the real run.
"""

from . import emulated  # noqa: F401
from . import fused  # noqa: F401
from . import grouped  # noqa: F401
