"""Virtual devices and meshes.

Example:
    >>> import shardlab as sl
    >>> mesh = sl.make_mesh((4, 2), ("x", "y"))
    >>> mesh.shape
    {'x': 4, 'y': 2}
    >>> int(mesh.devices[1, 1].id)  # row-major: 2*i + j
    3
"""

from __future__ import annotations

import contextlib
import enum
import math
from typing import Sequence

import numpy as np

import shardlab._core as _core

from . import hardware as _hardware
from .config import config
from . import views
from .context import CTX, LEDGER_FACTORY

# A real (emulated) mesh holds every device's data on this host; past this many devices that
# cannot fit anyway. Abstract meshes (no data) go up to MAX_ABSTRACT_DEVICES.
MAX_DEVICES = 1 << 20
MAX_ABSTRACT_DEVICES = (1 << 31) - 1


class AxisType(enum.Enum):
    """How the sharding along a mesh axis is decided, as ``jax.sharding.AxisType``.

    ``Explicit``: the sharding is part of each value's type and every op's output sharding
    follows JAX's sharding rules (ambiguous cases raise ShardingTypeError). ``Auto``: the
    compiler (here: shardlab's planner) is free to choose. ``Manual``: inside ``shard_map``,
    the program sees per-device values. ``make_mesh`` defaults to ``Explicit`` (JAX >= 0.8);
    ``Mesh(...)`` defaults to ``Auto``, as JAX's.

    Example:
        >>> import shardlab as sl
        >>> from shardlab.sharding import AxisType
        >>> sl.make_mesh((2, 4), ("x", "y"), (AxisType.Explicit, AxisType.Auto)).axis_types
        (Explicit, Auto)
    """

    Auto = enum.auto()
    Explicit = enum.auto()
    Manual = enum.auto()

    def __repr__(self):
        return self.name


def normalize_axis_types(axis_names: tuple, axis_types, default: AxisType, op: str) -> tuple:
    """One AxisType per axis name (``default`` for each when None), checked as JAX checks them."""
    if axis_types is None:
        return (default,) * len(axis_names)
    if not isinstance(axis_types, (tuple, list)):
        axis_types = (axis_types,)
    axis_types = tuple(axis_types)
    if not all(isinstance(a, AxisType) for a in axis_types):
        raise TypeError(f"[{op}] axis_types must be jax.sharding.AxisType entries (shardlab.sharding.AxisType), "
                        f"got {axis_types}")
    if len(axis_types) != len(axis_names):
        raise ValueError(f"[{op}] {len(axis_types)} axis_types {axis_types} for {len(axis_names)} axis names "
                         f"{axis_names}; give one AxisType per axis")
    return axis_types


class Device:
    """One virtual device. ``platform`` is "cpu", as JAX's CPU devices."""

    __slots__ = ("id",)
    platform = "cpu"
    device_kind = "shardlab virtual device"

    def __init__(self, id: int):
        self.id = int(id)

    def __repr__(self):
        return f"VirtualDevice(id={self.id})"

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(("shardlab.Device", self.id))


_DEVICE_CACHE: list[Device] = []


def _device(i: int) -> Device:
    while len(_DEVICE_CACHE) <= i:
        _DEVICE_CACHE.append(Device(len(_DEVICE_CACHE)))
    return _DEVICE_CACHE[i]


def devices() -> list[Device]:
    """The default virtual devices: ``config.num_devices`` of them (8 unless changed)."""
    _check_count(config.num_devices, "devices", abstract=False)
    return [_device(i) for i in range(config.num_devices)]


def _check_count(n: int, op: str, *, abstract: bool) -> None:
    limit = MAX_ABSTRACT_DEVICES if abstract else MAX_DEVICES
    if n > limit:
        kind = "an abstract" if abstract else "a real"
        hint = "" if abstract else "; for costing at that scale use make_mesh(..., abstract=True)"
        raise ValueError(f"[{op}] {n} devices is more than {kind} mesh supports ({limit}){hint}")


class Mesh:
    """A named grid of virtual devices, as ``jax.sharding.Mesh``.

    Args:
        devices: ndarray of Device (or of ints), one axis per mesh axis.
        axis_names: one name per axis of ``devices``.
        hardware: optional preset name (e.g. "tpu-v5e") or Hardware for cost estimates.
        physical_axes: optional map from mesh axis to physical links (see shardlab.hardware).

    An *abstract* mesh (``make_mesh(..., abstract=True)``) has the same axes and hardware but
    holds no data: programs on it run shape-only (see ``shardlab.eval_shape``), so a mesh of
    thousands of devices costs nothing until its ``devices`` are asked for.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> m = sl.Mesh(np.array(sl.devices()).reshape(2, 4), ("data", "model"))
        >>> m.size, m.axis_names
        (8, ('data', 'model'))
    """

    def __init__(self, devices, axis_names, axis_types=None, *, hardware=None, physical_axes=None,
                 abstract: bool = False):
        if isinstance(axis_names, str):
            axis_names = (axis_names,)
        axis_names = tuple(axis_names)
        if isinstance(devices, _RowMajor):
            shape, self._devices, self._device_ids = devices.shape, None, None
        else:
            arr = np.asarray(devices, dtype=object)
            if arr.ndim == 0 or arr.size == 0:
                raise ValueError(f"[Mesh] devices must be a non-empty array of devices, got shape {arr.shape}")
            if arr.ndim != len(axis_names):
                raise ValueError(f"[Mesh] devices has {arr.ndim} dims {arr.shape} but {len(axis_names)} axis "
                                 f"names {axis_names} were given; give one name per dim")
            flat = [d if isinstance(d, Device) else _as_device(d) for d in arr.ravel()]
            ids = [d.id for d in flat]
            if len(set(ids)) != len(ids):
                raise ValueError(f"[Mesh] device ids repeat in {sorted(ids)}; each device may appear once")
            shape = arr.shape
            self._devices = np.empty(arr.shape, dtype=object)
            self._devices.ravel()[:] = flat
            self._device_ids = np.array(ids, dtype=np.int64).reshape(arr.shape)
        for name in axis_names:
            if not isinstance(name, str) or not name:
                raise TypeError(f"[Mesh] axis names must be non-empty strings, got {name!r}")
        if len(set(axis_names)) != len(axis_names):
            raise ValueError(f"[Mesh] axis names repeat in {axis_names}; each axis needs its own name")
        # The unit mesh (no axes) runs no collectives, so it needs no core mesh.
        self._core = _core.Mesh(list(axis_names), [int(s) for s in shape]) if axis_names else None
        self.axis_names = axis_names
        self.axis_types = normalize_axis_types(axis_names, axis_types, AxisType.Auto, "Mesh")
        self.shape = dict(zip(axis_names, (int(s) for s in shape)))
        self.axis_sizes = tuple(self.shape.values())
        self.ndim = len(axis_names)
        self.size = math.prod(self.axis_sizes)
        self.abstract = bool(abstract)
        self.hardware = None
        self.physical_axes = physical_axes
        if hardware is not None:
            self.hardware = _hardware.get(hardware)
            _hardware.validate_axes(self.hardware, axis_names, tuple(shape), physical_axes)
        self._ledger = None
        self.records = True

    @property
    def ledger(self):
        """The mesh's own ledger: every event on this mesh is recorded here too."""
        if self._ledger is None:
            self._ledger = LEDGER_FACTORY[0]()
        return self._ledger

    @property
    def devices(self) -> np.ndarray:
        """ndarray of Device, one axis per mesh axis (built on first use)."""
        if self._devices is None:
            _check_count(self.size, "Mesh.devices", abstract=False)
            self._devices = np.empty(self.size, dtype=object)
            self._devices[:] = [_device(i) for i in range(self.size)]
            self._devices = self._devices.reshape(self.axis_sizes)
        return self._devices

    @property
    def device_ids(self) -> np.ndarray:
        if self._device_ids is None:
            _check_count(self.size, "Mesh.device_ids", abstract=False)
            self._device_ids = np.arange(self.size, dtype=np.int64).reshape(self.axis_sizes)
        return self._device_ids

    @property
    def shape_tuple(self) -> tuple:
        return tuple(self.shape.items())

    @property
    def empty(self) -> bool:
        return False

    def axis_size(self, name: str) -> int:
        if name not in self.shape:
            raise NameError(f"unbound axis name: {name!r}; the mesh has axes {self.axis_names}")
        return self.shape[name]

    def device_at(self, coords: Sequence[int]) -> Device:
        return self.devices[tuple(coords)]

    def _key(self):
        if self._device_ids is None:
            return (self.axis_names, self.axis_sizes, self.abstract)
        return (self.axis_names, self.axis_sizes, self.abstract, self._device_ids.tobytes())

    def __eq__(self, other):
        if not isinstance(other, Mesh) or self.axis_names != other.axis_names \
                or self.axis_sizes != other.axis_sizes or self.abstract != other.abstract:
            return False
        if self._device_ids is None and other._device_ids is None:
            return True
        return np.array_equal(self.device_ids, other.device_ids)

    def __hash__(self):
        return hash((self.axis_names, self.axis_sizes, self.abstract))

    def __repr__(self):
        hw = f", hardware={self.hardware.name!r}" if self.hardware is not None else ""
        ab = ", abstract=True" if self.abstract else ""
        return f"Mesh({self.shape!r}{hw}{ab})"

    def _repr_html_(self) -> str:
        view = views.html_view(self)
        return view if view is not None else f"<code>{self!r}</code>"

    def __enter__(self):
        CTX.mesh_stack.append(self)
        return self

    def __exit__(self, *exc):
        CTX.mesh_stack.pop()
        return False


class _RowMajor:
    """Devices 0..n-1 in row-major order, not materialized (see Mesh.devices)."""

    def __init__(self, shape):
        self.shape = tuple(shape)


def _as_device(d) -> Device:
    if isinstance(d, (int, np.integer)) and d >= 0:
        return _device(int(d))
    raise TypeError(f"[Mesh] expected Device objects or non-negative ints, got {d!r}")


def make_mesh(axis_shapes: Sequence[int], axis_names: Sequence[str], axis_types=None, *, devices=None,
              hardware=None, physical_axes=None, abstract: bool = False) -> Mesh:
    """Creates a mesh of ``prod(axis_shapes)`` virtual devices, row-major, as ``jax.make_mesh``.

    ``abstract=True`` makes a mesh for shape-only programs (no data; any size up to 2**31-1
    devices), to cost a program at a scale that cannot run here.

    Example:
        >>> import shardlab as sl
        >>> sl.make_mesh((2, 4), ("x", "y")).device_ids.tolist()
        [[0, 1, 2, 3], [4, 5, 6, 7]]
        >>> sl.make_mesh((16, 20, 28), ("x", "y", "z"), hardware="tpu-v5p", abstract=True).size
        8960
    """
    if isinstance(axis_names, str):
        axis_names = (axis_names,)
    shape = tuple(axis_shapes) if isinstance(axis_shapes, (tuple, list)) else (axis_shapes,)
    if not shape:
        raise ValueError("[make_mesh] a mesh needs at least one axis, got axis sizes ()")
    for s in shape:
        if not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s <= 0:
            raise ValueError(f"[make_mesh] axis sizes must be positive ints, got {shape}")
    if len(shape) != len(tuple(axis_names)):
        raise ValueError(f"[make_mesh] {len(shape)} axis sizes {shape} but {len(tuple(axis_names))} "
                         f"axis names {tuple(axis_names)}; give one name per axis")
    n = math.prod(int(s) for s in shape)
    _check_count(n, "make_mesh", abstract=abstract)
    axis_types = normalize_axis_types(tuple(axis_names), axis_types, AxisType.Explicit, "make_mesh")
    if devices is None:
        return Mesh(_RowMajor(shape), axis_names, axis_types=axis_types, hardware=hardware,
                    physical_axes=physical_axes, abstract=abstract)
    devs = list(devices)
    if len(devs) != n:
        raise ValueError(f"[make_mesh] mesh shape {shape} needs {n} devices, got {len(devs)}")
    arr = np.empty(n, dtype=object)
    arr[:] = devs
    return Mesh(arr.reshape(shape), axis_names, axis_types=axis_types, hardware=hardware,
                physical_axes=physical_axes, abstract=abstract)


def get_mesh() -> Mesh | None:
    """The mesh set by ``with mesh:`` or ``set_mesh``, or None."""
    if CTX.mesh_stack:
        return CTX.mesh_stack[-1]
    return CTX.global_mesh


class set_mesh(contextlib.AbstractContextManager):
    """Sets the current mesh (used by ``P``-only shardings and shard_map without ``mesh=``).

    Works as a statement and as a context manager that restores the previous mesh, as
    ``jax.set_mesh``.

    Example:
        >>> import shardlab as sl
        >>> with sl.set_mesh(sl.make_mesh((8,), ("x",))):
        ...     sl.get_mesh().shape["x"]
        8
    """

    def __init__(self, mesh: Mesh):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"[set_mesh] expected a Mesh, got {type(mesh).__name__}")
        self._previous = CTX.global_mesh
        CTX.global_mesh = mesh

    def __exit__(self, *exc):
        CTX.global_mesh = self._previous
        return False


# The mesh of no axes: one device. Plain arrays that must run through primitives (jnp on numpy
# arrays under shardlab.grad, attention outside shard_map) are LocalArrays on it.
# It records no ledger events: it is not a mesh the user made.
UNIT_MESH = Mesh(_RowMajor(()), ())
UNIT_MESH.records = False
