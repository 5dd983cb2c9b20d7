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
from .mesh import AxisType, Device, Mesh, get_mesh

DuplicateSpecError = _core.DuplicateSpecError


class _Unconstrained:
    def __repr__(self):
        return "UNCONSTRAINED"

    def __reduce__(self):
        return (_unconstrained, ())


def _unconstrained():
    return PartitionSpec.UNCONSTRAINED


_NO_AXES: frozenset = frozenset()


def _axis_set(value, name: str) -> frozenset:
    if isinstance(value, frozenset):
        out = value
    elif isinstance(value, set):
        out = frozenset(value)
    else:
        raise TypeError(f"{name} argument of PartitionSpec should of type `frozenset` or `set`. "
                        f"Got type {value}")
    if None in out:
        raise ValueError(f"{name} cannot contain None. All elements in {name} should refer to the mesh axes.")
    return out


def _canonical_entry(e):
    """JAX's canonical partition: a list becomes a tuple, a 1-tuple its one name."""
    if isinstance(e, list):
        e = tuple(e)
    if isinstance(e, tuple) and len(e) == 1:
        return e[0]
    return e


class PartitionSpec(tuple):
    """Which mesh axes split each array dimension, as ``jax.sharding.PartitionSpec`` (``P``).

    Entries are None (not split), a mesh axis name, or a tuple of names (major-to-minor).
    Missing trailing entries mean None. ``unreduced=`` names mesh axes along which the value
    is held as partial sums not yet added (the book's {U_X}); ``reduced=`` names axes whose
    cotangent will be unreduced (JAX's ``reduced``). Equality and repr are JAX's: ``P('x')``
    differs from ``P('x', None)`` and from the tuple ``('x',)``.

    Example:
        >>> from shardlab import P
        >>> P("x", ("y", "z"), None), P(("x",)) == P("x")
        (P('x', ('y', 'z'), None), True)
        >>> P(None, unreduced={"y"})
        P(None, unreduced={'y'})
    """

    UNCONSTRAINED = _Unconstrained()

    def __new__(cls, *entries, unreduced=_NO_AXES, reduced=_NO_AXES):
        for e in entries:
            if e is not None and type(e) is not str:  # the common case (names, None) needs no work
                entries = tuple(_canonical_entry(e) for e in entries)
                for e in entries:
                    ok = e is None or isinstance(e, str) or e is cls.UNCONSTRAINED or (
                        isinstance(e, tuple) and all(isinstance(n, str) for n in e))
                    if not ok:
                        raise TypeError(f"[PartitionSpec] entries must be None, an axis name or a tuple of "
                                        f"names, got {e!r}")
                break
        self = super().__new__(cls, entries)
        if unreduced is _NO_AXES and reduced is _NO_AXES:
            self.unreduced = self.reduced = _NO_AXES
            return self
        unreduced = _axis_set(unreduced, "unreduced")
        reduced = _axis_set(reduced, "reduced")
        if unreduced or reduced:
            if unreduced & reduced:
                raise ValueError(f"`unreduced` and `reduced` argument to PartitionSpec cannot overlap. "
                                 f"Got unreduced: {unreduced} and reduced: {reduced}")
            for name in self.mesh_axes():
                if name in unreduced:
                    raise ValueError(f"partitions cannot overlap with unreduced axes passed to PartitionSpec. "
                                     f"Got partitions: {entries} and unreduced axes: {unreduced}")
                if name in reduced:
                    raise ValueError(f"partitions cannot overlap with reduced axes passed to PartitionSpec. "
                                     f"Got partitions: {entries} and reduced axes: {reduced}")
        self.unreduced = unreduced
        self.reduced = reduced
        return self

    @property
    def partitions(self) -> tuple:
        """The per-dimension entries, as a plain tuple."""
        return tuple.__getitem__(self, slice(None))

    def __repr__(self):
        pr = repr(self.partitions)[1:-1]
        if not self.unreduced and not self.reduced:
            return f"P({pr})"
        parts = []
        if self.unreduced:
            parts.append(f"unreduced={set(self.unreduced)!r}")
        if self.reduced:
            parts.append(f"reduced={set(self.reduced)!r}")
        pr = '' if not pr else f"{pr} " if pr.endswith(',') else f"{pr}, "
        return f"P({pr}{', '.join(parts)})"

    __str__ = __repr__

    def __eq__(self, other):
        if not isinstance(other, PartitionSpec):
            return False
        return (self.partitions == other.partitions and self.unreduced == other.unreduced
                and self.reduced == other.reduced)

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash((self.partitions, self.unreduced, self.reduced))

    def __add__(self, other):
        if isinstance(other, PartitionSpec):
            return PartitionSpec(*self.partitions, *other.partitions, unreduced=self.unreduced | other.unreduced,
                                 reduced=self.reduced | other.reduced)
        if isinstance(other, tuple):
            if self.unreduced or self.reduced:
                raise TypeError(f"other {other} cannot be of instance `tuple` when self {self} has "
                                f"unreduced or reduced axes in `__add__` of PartitionSpec.")
            return PartitionSpec(*self.partitions, *other)
        return NotImplemented

    def __radd__(self, other):
        if not isinstance(other, tuple):
            return NotImplemented
        if self.unreduced or self.reduced:
            raise TypeError(f"other {other} cannot be of instance `tuple` when self {self} has "
                            f"unreduced or reduced axes in `__radd__` of PartitionSpec.")
        return PartitionSpec(*other, *self.partitions)

    def index(self, value):
        return self.partitions.index(_canonical_entry(value))

    def count(self, value):
        return self.partitions.count(_canonical_entry(value))

    def update(self, partitions=None, unreduced=None, reduced=None) -> "PartitionSpec":
        """A spec with some fields replaced, as JAX's ``P.update``."""
        return PartitionSpec(*(self.partitions if partitions is None else partitions),
                             unreduced=self.unreduced if unreduced is None else unreduced,
                             reduced=self.reduced if reduced is None else reduced)

    def axes_of(self, dim: int) -> tuple:
        """Mesh axes splitting dimension `dim`, major-to-minor (() if none)."""
        if dim >= len(self):
            return ()
        e = tuple.__getitem__(self, dim)
        if e is None or e is PartitionSpec.UNCONSTRAINED:
            return ()
        return (e,) if isinstance(e, str) else tuple(e)

    def normalized(self, rank: int | None = None) -> tuple:
        """Entries as tuples of names, padded with () to `rank`."""
        n = len(self) if rank is None else max(rank, len(self))
        return tuple(self.axes_of(d) for d in range(n))

    def padded(self, rank: int) -> "PartitionSpec":
        """The spec padded with None to `rank` entries, as JAX pads an aval's sharding
        (``_normalized_spec_for_aval``)."""
        out = [None if e is PartitionSpec.UNCONSTRAINED else e for e in self.partitions]
        out.extend([None] * (rank - len(out)))
        return self.update(partitions=out)

    def mesh_axes(self) -> tuple:
        return tuple(a for d in range(len(self)) for a in self.axes_of(d))

    def __reduce__(self):
        return (_make_spec, (self.partitions, self.unreduced, self.reduced))


def _make_spec(partitions, unreduced, reduced):
    return PartitionSpec(*partitions, unreduced=unreduced, reduced=reduced)


P = PartitionSpec


class Sharding:
    """The base of every sharding, as ``jax.sharding.Sharding``: ``NamedSharding`` and
    ``SingleDeviceSharding`` subclass it, so ``isinstance(s, Sharding)`` holds for both.

    Example:
        >>> import shardlab as sl
        >>> from shardlab.sharding import Sharding, SingleDeviceSharding
        >>> isinstance(sl.NamedSharding(sl.make_mesh((2,), ("x",)), sl.P("x")), Sharding)
        True
        >>> isinstance(SingleDeviceSharding(sl.devices()[0]), Sharding)
        True
    """

    @property
    def device_set(self) -> set:
        """The devices that hold some of the array."""
        raise NotImplementedError

    @property
    def addressable_devices(self) -> set:
        """Every device of this process (shardlab emulates one process, so all of them)."""
        return self.device_set

    @property
    def is_fully_addressable(self) -> bool:
        """True: this one process addresses every virtual device."""
        return True

    @property
    def num_devices(self) -> int:
        """How many devices hold some of the array."""
        return len(self.device_set)

    @property
    def memory_kind(self):
        """JAX's memory kind: "device" for a concrete placement, None on an abstract mesh."""
        return getattr(self, "_memory_kind", None)

    def addressable_devices_indices_map(self, global_shape) -> dict:
        """``devices_indices_map`` (every device is addressable)."""
        return self.devices_indices_map(global_shape)

    def shard_shape(self, global_shape) -> tuple:
        """The shape of one device's block."""
        return tuple(global_shape)


class SingleDeviceSharding(Sharding):
    """A sharding that places the whole array on one device, as
    ``jax.sharding.SingleDeviceSharding``. ``device_put(x, SingleDeviceSharding(d))`` (or
    ``device_put(x, d)``) gives host data: a numpy array in JAX's canonical dtype.

    Example:
        >>> import shardlab as sl
        >>> from shardlab.sharding import SingleDeviceSharding
        >>> SingleDeviceSharding(sl.devices()[0])
        SingleDeviceSharding(device=VirtualDevice(id=0), memory_kind=device)
    """

    def __init__(self, device, *, memory_kind=None):
        if not isinstance(device, Device):
            raise TypeError(f"[SingleDeviceSharding] device must be a shardlab Device (shardlab.devices()[i]), "
                            f"got {device!r}")
        self._device = device
        self._memory_kind = "device" if memory_kind is None else memory_kind

    def __repr__(self):
        return f"SingleDeviceSharding(device={self._device!r}, memory_kind={self._memory_kind})"

    def __eq__(self, other):
        return isinstance(other, SingleDeviceSharding) and other._device == self._device \
            and other._memory_kind == self._memory_kind

    def __hash__(self):
        return hash((self._device, self._memory_kind))

    @property
    def device_set(self) -> set:
        """The one device."""
        return {self._device}

    @property
    def is_fully_replicated(self) -> bool:
        """True: the one device holds the whole array."""
        return True

    def with_memory_kind(self, kind: str) -> "SingleDeviceSharding":
        """The same device with another memory kind."""
        return SingleDeviceSharding(self._device, memory_kind=kind)

    def devices_indices_map(self, global_shape) -> dict:
        """The device → the whole array."""
        return {self._device: (slice(None),) * len(global_shape)}

    def is_equivalent_to(self, other, ndim: int) -> bool:
        """Whether `other` also puts the whole array on this device alone."""
        return isinstance(other, Sharding) and other.device_set == self.device_set and \
            bool(getattr(other, "is_fully_replicated", False))


class NamedSharding(Sharding):
    """An array sharding: a mesh and a PartitionSpec, as ``jax.sharding.NamedSharding``.

    Raises DuplicateSpecError (a ValueError) if a mesh axis appears twice and ValueError for
    an unknown axis. A spec with ``unreduced=`` (or ``reduced=``) axes needs them to be
    mesh axes of type Explicit, as in JAX; an unreduced sharding describes an array held as
    partial sums along those axes (``ShardedArray.unreduced``).

    Example:
        >>> import shardlab as sl
        >>> from shardlab import P
        >>> s = sl.NamedSharding(sl.make_mesh((2, 2), ("x", "y")), P("x"))
        >>> s
        NamedSharding(mesh=Mesh('x': 2, 'y': 2, axis_types=(Explicit, Explicit)), spec=P('x',), memory_kind=device)
        >>> s.devices_indices_map((4, 2))[s.mesh.devices[1, 0]]
        (slice(2, 4, None), slice(None, None, None))
    """

    def __init__(self, mesh: Mesh, spec: PartitionSpec | None = None, *, memory_kind=None,
                 _check_axis_types: bool = True):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"[NamedSharding] mesh must be a shardlab Mesh, got {type(mesh).__name__}")
        spec = P() if spec is None else spec
        if not isinstance(spec, PartitionSpec):
            if isinstance(spec, (tuple, list)):
                spec = P(*spec)
            else:
                raise TypeError(f"[NamedSharding] spec must be a PartitionSpec, got {spec!r}")
        if any(e is P.UNCONSTRAINED for e in spec.partitions):
            raise ValueError(f"[NamedSharding] {spec} uses P.UNCONSTRAINED, which only auto-sharding "
                             f"accepts; name the axes")
        for kind, axes in (("Unreduced", spec.unreduced), ("Reduced", spec.reduced)):
            for u in sorted(axes):
                if u not in mesh.axis_names:
                    raise ValueError(f"[NamedSharding] {kind} axes {u} is not found in "
                                     f"mesh.axis_names={mesh.axis_names}. Got pspec={spec}")
                if _check_axis_types and mesh._name_to_type[u] != AxisType.Explicit:
                    raise ValueError(f"[NamedSharding] {kind} axes can only refer to mesh axes that is of type "
                                     f"`Explicit`. Got {kind.lower()} axes: {set(axes)} and mesh: {mesh}")
        self.mesh = mesh
        self.spec = spec
        self._memory_kind = memory_kind if memory_kind is not None or mesh.abstract else "device"
        self._core = _core.NamedSharding(mesh._core, [list(a) for a in spec.normalized()]) \
            if mesh._core is not None else None

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
        if self._core is None:
            if len(self.spec) > len(dims):
                raise ValueError(f"[{op}] spec {self.spec} is longer than the rank {len(dims)} of shape "
                                 f"{tuple(dims)}")
            return
        self._core.check_shape([int(s) for s in dims], op)

    def shard_shape(self, global_shape) -> tuple:
        if self._core is None:
            return tuple(global_shape)
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
        if self._core is None:
            return (slice(None),) * len(global_shape)
        idx = []
        for (start, stop), size in zip(self._core.device_indices(pos, list(global_shape)), global_shape):
            idx.append(slice(None) if (start, stop) == (0, size) else slice(start, stop))
        return tuple(idx)

    def replica_id(self, pos: int) -> int:
        return self._core.replica_id(pos) if self._core is not None else 0

    @property
    def varying_axes(self) -> tuple:
        """Mesh axes that split some dimension, in mesh order."""
        if self._core is None:
            return ()
        return tuple(n for n, v in zip(self.mesh.axis_names, self._core.varying()) if v)

    @property
    def is_fully_replicated(self) -> bool:
        if self.spec.unreduced:
            return False
        return self._core.is_fully_replicated if self._core is not None else True

    @property
    def num_devices(self) -> int:
        return self.mesh.size

    @property
    def device_set(self) -> set:
        return set(self.mesh.devices.ravel())

    @property
    def memory_kind(self):
        return self._memory_kind

    def num_shards(self, global_shape) -> int:
        return math.prod(self.mesh.shape[a] for a in self.spec.mesh_axes())

    def storage_shape(self, global_shape) -> tuple:
        """Shape of the mesh-factorized storage: mesh dims (1 if replicated) + shard shape."""
        vary = set(self.varying_axes)
        return tuple(self.mesh.shape[a] if a in vary else 1 for a in self.mesh.axis_names) + \
            self.shard_shape(global_shape)

    def update(self, **kwargs) -> "NamedSharding":
        """A sharding with ``mesh=``, ``spec=`` or ``memory_kind=`` replaced, as JAX's."""
        spec = kwargs.pop("spec", self.spec)
        if not isinstance(spec, PartitionSpec):
            spec = PartitionSpec(*spec)
        out = NamedSharding(kwargs.pop("mesh", self.mesh), spec,
                            memory_kind=kwargs.pop("memory_kind", self._memory_kind),
                            _check_axis_types=(spec.unreduced, spec.reduced) != (self.spec.unreduced, self.spec.reduced))
        if kwargs:
            raise TypeError(f"[NamedSharding.update] unknown fields {sorted(kwargs)}")
        return out

    def with_spec(self, spec) -> "NamedSharding":
        """The same mesh with another spec (``jax.sharding.NamedSharding.with_spec``)."""
        return self.update(spec=spec)

    def with_memory_kind(self, kind: str) -> "NamedSharding":
        """The same sharding with another memory kind."""
        return self.update(memory_kind=kind)

    def is_equivalent_to(self, other: Any, ndim: int) -> bool:
        """Whether both place the blocks of an `ndim`-d array on the same devices (trailing None
        entries and spellings aside), as JAX's. Unreduced axes are not compared: they say what
        the blocks hold, not where they are."""
        if isinstance(other, SingleDeviceSharding):
            return self.mesh.size == 1 and not self.mesh.abstract and self.device_set == other.device_set
        return (isinstance(other, NamedSharding) and other.mesh == self.mesh
                and self.spec.normalized(ndim) == other.spec.normalized(ndim))

    def __eq__(self, other):
        return (isinstance(other, NamedSharding) and other.mesh == self.mesh
                and _strip(self.spec) == _strip(other.spec)
                and self.spec.unreduced == other.spec.unreduced and self.spec.reduced == other.spec.reduced)

    def __hash__(self):
        return hash((self.mesh, _strip(self.spec), self.spec.unreduced))

    def __reduce__(self):
        return (_rebuild_named_sharding, (self.mesh, self.spec, self._memory_kind))

    def __repr__(self):
        mem = "" if self._memory_kind is None else f", memory_kind={self._memory_kind}"
        return f"NamedSharding(mesh={self.mesh}, spec={self.spec}{mem})"


def _rebuild_named_sharding(mesh, spec, memory_kind):
    return NamedSharding(mesh, spec, memory_kind=memory_kind, _check_axis_types=False)


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
