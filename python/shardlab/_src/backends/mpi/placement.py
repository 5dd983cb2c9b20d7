"""Where a mesh's virtual devices live among the MPI ranks: a grid of ranks over the mesh
axes (a Cartesian communicator), each rank holding one block of devices, and the
communicators a collective over some axes runs on (built once per mesh and axes).

The rank grid splits the mesh axes in order (``initialize(axis_order=...)`` changes the order):
an axis is split over as many ranks as still need devices, so with the default order each
rank holds a contiguous block of device ids. A mesh of 8 devices (2, 4) over 4 ranks: a rank
grid (2, 2), blocks of (1, 2) devices.

Example:
    >>> from shardlab._src.backends.mpi.placement import rank_grid
    >>> rank_grid(("x", "y"), (2, 4), 4, None), rank_grid(("x", "y"), (2, 4), 2, ("y", "x"))
    ((2, 2), (1, 2))
"""

from __future__ import annotations

import math

import numpy as np

import shardlab._core as _core

from ...core.mesh import Mesh
from ...core.processes import PROCESS
from .runtime import STATE


def rank_grid(axis_names, sizes, ranks: int, axis_order) -> tuple:
    """Ranks per mesh axis (their product is `ranks`); ValueError naming the mesh when its
    devices cannot be split into `ranks` equal blocks along its axes."""
    total = math.prod(sizes)
    where = f"a mesh of {total} devices {dict(zip(axis_names, sizes))} over {ranks} MPI ranks"
    if total % ranks:
        raise ValueError(f"[mpi] {where}: {total} devices are not divisible by {ranks} ranks; use a mesh "
                         f"whose device count is a multiple of the rank count (or mpirun -n <a divisor "
                         f"of {total}>)")
    order = tuple(axis_order) if axis_order else tuple(axis_names)
    unknown = [a for a in order if a not in axis_names]
    if unknown:
        raise ValueError(f"[mpi] axis_order {order} names {unknown}, not axes of {where}")
    order = order + tuple(a for a in axis_names if a not in order)
    grid = dict.fromkeys(axis_names, 1)
    left = ranks
    for a in order:
        n = sizes[axis_names.index(a)]
        r = math.gcd(n, left)
        if left > 1 and r not in (n, left):
            raise ValueError(f"[mpi] {where}: axis {a!r} of size {n} cannot be split evenly among the "
                             f"{left} ranks still to place; reorder the axes (initialize(axis_order=...)) "
                             f"or change the rank count")
        grid[a] = r
        left //= r
    return tuple(grid[a] for a in axis_names)


class Placement:
    """The rank grid of one mesh: this rank's coordinates, its block of devices, the block
    mesh (the mesh of this rank's devices, for the core's local work) and the communicators."""

    def __init__(self, mesh: Mesh, comm):
        self.names = mesh.axis_names
        self.sizes = mesh.axis_sizes
        self.k = mesh.ndim
        self.comm = comm
        self.grid = rank_grid(self.names, self.sizes, comm.Get_size(), STATE.axis_order)
        self.block = tuple(n // r for n, r in zip(self.sizes, self.grid))
        self.cart = comm.Create_cart(list(self.grid), periods=[False] * self.k, reorder=False)
        self.coords = tuple(self.cart.Get_coords(self.cart.Get_rank()))
        self.block_mesh = _partial_mesh(self.names, self.block)
        self._subs: dict = {}
        self._meshes: dict = {}

    def split_axes(self, axes) -> tuple:
        """The mesh axis indices among `axes` that are split over more than one rank."""
        return tuple(sorted(j for j in (self.names.index(a) for a in axes) if self.grid[j] > 1))

    def sub(self, dims: tuple):
        """The communicator among the ranks that differ only along mesh dims `dims` (cached)."""
        c = self._subs.get(dims)
        if c is None:
            c = self._subs[dims] = self.cart.Sub([j in dims for j in range(self.k)])
        return c

    def mesh_over(self, dims: tuple) -> Mesh:
        """A mesh with the full size along `dims` and this rank's block along the others."""
        m = self._meshes.get(dims)
        if m is None:
            m = self._meshes[dims] = _partial_mesh(
                self.names, tuple(self.sizes[j] if j in dims else self.block[j] for j in range(self.k)))
        return m

    def offsets(self) -> tuple:
        return tuple(c * b for c, b in zip(self.coords, self.block))

    def block_slices(self, shape, dims=None, coords=None) -> tuple:
        """Index of this rank's block (or of the rank at grid `coords`) in a storage of `shape`
        (mesh dims of size 1 kept whole), only along `dims` when given."""
        coords = self.coords if coords is None else coords
        out = []
        for j in range(self.k):
            if shape[j] != 1 and (dims is None or j in dims) and self.grid[j] > 1:
                o = coords[j] * self.block[j]
                out.append(slice(o, o + self.block[j]))
            else:
                out.append(slice(None))
        return tuple(out)

    def positions(self) -> list:
        """Row-major positions in the mesh of this rank's devices."""
        grid = np.arange(math.prod(self.sizes)).reshape(self.sizes)
        return [int(i) for i in grid[tuple(slice(o, o + b) for o, b in zip(self.offsets(), self.block))].ravel()]

    def block_shape(self, shape) -> tuple:
        """The shape of this rank's block of a storage of global `shape`."""
        return tuple(b if s != 1 else 1 for s, b in zip(shape[:self.k], self.block)) + tuple(shape[self.k:])


class _PartialMesh(Mesh):
    """A mesh of one rank's devices (or of a group's): only the core's local work sees it."""


def _partial_mesh(names, sizes) -> Mesh:
    m = Mesh.__new__(_PartialMesh)
    m.axis_names = tuple(names)
    m.shape = dict(zip(names, sizes))
    m.axis_sizes = tuple(sizes)
    m.ndim = len(names)
    m.size = math.prod(sizes)
    m.abstract = False
    m.hardware = None
    m.physical_axes = None
    m._devices = m._device_ids = None
    m._ledger = None
    m.records = False
    m._core = _core.Mesh(list(names), [int(s) for s in sizes]) if names else None
    return m


_PLACEMENTS: dict = {}


def addressable_positions(mesh) -> list:
    """Row-major positions of `mesh`'s devices this rank holds."""
    return placement(mesh).positions()


PROCESS.positions = addressable_positions  # consulted while more than one process runs


def placement(mesh: Mesh):
    """The Placement of `mesh` on the current communicator, or None for a mesh without axes
    (nothing to split: every rank runs it whole)."""
    if mesh.ndim == 0:
        return None
    key = (id(STATE.comm), mesh.axis_names, mesh.axis_sizes, STATE.axis_order)
    p = _PLACEMENTS.get(key)
    if p is None:
        p = _PLACEMENTS[key] = Placement(mesh, STATE.comm)
    return p
