"""Which process this is among the processes running one shardlab program (``mpirun -n R``).

One process (index 0 of 1) unless a distributed backend sets it (``backends/mpi``);
``shardlab.process_index()`` and ``process_count()`` read it, as JAX's.

Example:
    >>> from shardlab._src.core.processes import PROCESS
    >>> import shardlab as sl
    >>> PROCESS.index, PROCESS.count, list(PROCESS.addressable_positions(sl.make_mesh((4,), ("x",))))
    (0, 1, [0, 1, 2, 3])
"""

from __future__ import annotations


class _Process:
    __slots__ = ("index", "count", "positions", "scatter")

    def __init__(self):
        self.index = 0
        self.count = 1
        self.positions = None  # mesh -> row-major positions of its devices held here (set by backends/mpi)
        # (storage, mesh, shape, same=) -> process 0's host value of `shape` laid out on mesh (every process's
        # when `same`: they hold the same), this process keeping its devices' part: device_put's, while several
        # processes run (set by backends/mpi)
        self.scatter = None

    def addressable_positions(self, mesh):
        """Row-major positions of `mesh`'s devices whose data this process holds (all of them
        on one process), as ``addressable_shards`` lists them."""
        if self.positions is None or self.count == 1 or mesh.ndim == 0:
            return range(mesh.size)
        return self.positions(mesh)


PROCESS = _Process()
