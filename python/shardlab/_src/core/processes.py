"""Which process this is among the processes running one shardlab program (``mpirun -n R``).

One process (index 0 of 1) unless a distributed backend sets it (``backends/mpi``);
``shardlab.process_index()`` and ``process_count()`` read it, as JAX's.

Example:
    >>> from shardlab._src.core.processes import PROCESS
    >>> PROCESS.index, PROCESS.count
    (0, 1)
"""

from __future__ import annotations


class _Process:
    __slots__ = ("index", "count")

    def __init__(self):
        self.index = 0
        self.count = 1


PROCESS = _Process()
