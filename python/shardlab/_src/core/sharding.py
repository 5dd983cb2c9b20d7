"""PartitionSpec and NamedSharding.

Example:
    >>> import shardlab as sl
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((4, 2), ("x", "y"))
    >>> s = sl.NamedSharding(mesh, P("x", None))
    >>> s.shard_shape((8, 6))
    (2, 6)
"""

from __future__ import annotations

import math
from typing import Any

import shardlab._core as _core
from .mesh import Mesh, get_mesh

DuplicateSpecError = _core.DuplicateSpecError


class _Unconstrained:
    def __repr__(self):
        return "UNCONSTRAINED"


class PartitionSpec(tuple):
    """Which mesh axes split each array dimension, as ``jax.sharding.PartitionSpec``.

    Entries are None (not split), a mesh axis name, or a tuple of names (major-to-minor).
    Missing trailing entries mean None.

    Example:
        >>> from shardlab import P
        >>> P("x", ("y", "z"), None)
        PartitionSpec('x', ('y', 'z'), None)
    """

    UNCONSTRAINED = _Unconstrained()

    def __new__(cls, *entries):
        for e in entries:
            ok = e is None or isinstance(e, str) or e is cls.UNCONSTRAINED or (
                isinstance(e, (tuple, list)) and all(isinstance(n, str) for n in e))
            if not ok:
                raise TypeError(f"[PartitionSpec] entries must be None, an axis name or a tuple of "
                                f"names, got {e!r}")
        return super().__new__(cls, tuple(tuple(e) if isinstance(e, list) else e for e in entries))

    def __repr__(self):
        return f"PartitionSpec{tuple.__repr__(self)}" if len(self) != 1 else \
            f"PartitionSpec({self[0]!r})"

    def axes_of(self, dim: int) -> tuple:
        """Mesh axes splitting dimension `dim`, major-to-minor (() if none)."""
        if dim >= len(self) or self[dim] is None:
            return ()
        e = self[dim]
        return (e,) if isinstance(e, str) else tuple(e)

    def normalized(self, rank: int | None = None) -> tuple:
        """Entries as tuples of names, padded with () to `rank`."""
        n = len(self) if rank is None else max(rank, len(self))
        return tuple(self.axes_of(d) for d in range(n))

    def mesh_axes(self) -> tuple:
        return tuple(a for d in range(len(self)) for a in self.axes_of(d))

    def __reduce__(self):
        return (PartitionSpec, tuple(self))


P = PartitionSpec


class NamedSharding:
    """An array sharding: a mesh and a PartitionSpec, as ``jax.sharding.NamedSharding``.

    Raises DuplicateSpecError (a ValueError) if a mesh axis appears twice and ValueError for
    an unknown axis.

    Example:
        >>> import shardlab as sl
        >>> from shardlab import P
        >>> s = sl.NamedSharding(sl.make_mesh((2, 2), ("x", "y")), P("x"))
        >>> s.devices_indices_map((4, 2))[s.mesh.devices[1, 0]]
        (slice(2, 4, None), slice(None, None, None))
    """

    def __init__(self, mesh: Mesh, spec: PartitionSpec | None = None, *, memory_kind=None):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"[NamedSharding] mesh must be a shardlab Mesh, got {type(mesh).__name__}")
        spec = P() if spec is None else spec
        if not isinstance(spec, PartitionSpec):
            if isinstance(spec, (tuple, list)):
                spec = P(*spec)
            else:
                raise TypeError(f"[NamedSharding] spec must be a PartitionSpec, got {spec!r}")
        if any(e is P.UNCONSTRAINED for e in spec):
            raise ValueError(f"[NamedSharding] {spec} uses P.UNCONSTRAINED, which only auto-sharding "
                             f"accepts; name the axes")
        self.mesh = mesh
        self.spec = spec
        self.memory_kind = memory_kind
        self._core = _core.NamedSharding(mesh._core, [list(a) for a in spec.normalized()])

    # -- JAX's sharding interface -------------------------------------------------------------
    def check_shape(self, shape, op: str = "NamedSharding") -> None:
        """Raises ValueError unless `shape` is a tuple of ints >= 0 this sharding divides."""
        if isinstance(shape, (str, bytes)) or not isinstance(shape, (tuple, list)):
            raise TypeError(f"[{op}] shape must be a tuple of ints, got {shape!r}")
        dims = list(shape)
        for d, size in enumerate(dims):
            if isinstance(size, bool) or not isinstance(size, int) and not hasattr(size, "__index__"):
                raise TypeError(f"[{op}] dimension {d} of shape {tuple(dims)} is {size!r}; sizes must be ints")
            if size < 0:
                raise ValueError(f"[{op}] dimension {d} of shape {tuple(dims)} has size {size}; "
                                 f"sizes must be >= 0")
        self._core.check_shape([int(s) for s in dims], op)

    def shard_shape(self, global_shape) -> tuple:
        return tuple(self._core.shard_shape(list(global_shape)))

    def devices_indices_map(self, global_shape) -> dict:
        """Device → tuple of slices into the global array, in mesh (row-major) order."""
        self.check_shape(global_shape, "devices_indices_map")
        global_shape = tuple(global_shape)
        out = {}
        for pos, dev in enumerate(self.mesh.devices.ravel()):
            out[dev] = self._index(pos, global_shape)
        return out

    def _index(self, pos: int, global_shape) -> tuple:
        idx = []
        for (start, stop), size in zip(self._core.device_indices(pos, list(global_shape)), global_shape):
            idx.append(slice(None) if (start, stop) == (0, size) else slice(start, stop))
        return tuple(idx)

    def replica_id(self, pos: int) -> int:
        return self._core.replica_id(pos)

    @property
    def varying_axes(self) -> tuple:
        """Mesh axes that split some dimension, in mesh order."""
        return tuple(n for n, v in zip(self.mesh.axis_names, self._core.varying()) if v)

    @property
    def is_fully_replicated(self) -> bool:
        return self._core.is_fully_replicated

    @property
    def num_devices(self) -> int:
        return self.mesh.size

    @property
    def device_set(self) -> set:
        return set(self.mesh.devices.ravel())

    def num_shards(self, global_shape) -> int:
        return math.prod(self.mesh.shape[a] for a in self.spec.mesh_axes())

    def storage_shape(self, global_shape) -> tuple:
        """Shape of the mesh-factorized storage: mesh dims (1 if replicated) + shard shape."""
        vary = set(self.varying_axes)
        return tuple(self.mesh.shape[a] if a in vary else 1 for a in self.mesh.axis_names) + \
            self.shard_shape(global_shape)

    def is_equivalent_to(self, other: Any, ndim: int) -> bool:
        return (isinstance(other, NamedSharding) and other.mesh == self.mesh
                and self.spec.normalized(ndim) == other.spec.normalized(ndim))

    def __eq__(self, other):
        return (isinstance(other, NamedSharding) and other.mesh == self.mesh
                and _strip(self.spec) == _strip(other.spec))

    def __hash__(self):
        return hash((self.mesh, _strip(self.spec)))

    def __repr__(self):
        return f"NamedSharding(mesh={self.mesh!r}, spec={self.spec!r})"


def _strip(spec: PartitionSpec) -> tuple:
    n = spec.normalized()
    while n and n[-1] == ():
        n = n[:-1]
    return n


def as_sharding(sharding_or_spec, op: str) -> NamedSharding:
    """A NamedSharding from a NamedSharding, or from a PartitionSpec and the current mesh."""
    if isinstance(sharding_or_spec, NamedSharding):
        return sharding_or_spec
    if isinstance(sharding_or_spec, PartitionSpec):
        mesh = get_mesh()
        if mesh is None:
            raise ValueError(f"[{op}] got a bare {sharding_or_spec!r} but no mesh is set; pass "
                             f"NamedSharding(mesh, spec) or call shardlab.set_mesh(mesh) first")
        return NamedSharding(mesh, sharding_or_spec)
    raise TypeError(f"[{op}] expected a NamedSharding or PartitionSpec, got "
                    f"{type(sharding_or_spec).__name__}")
