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
import warnings
from typing import Sequence

import numpy as np

import shardlab._core as _core

from . import hardware as _hardware
from .config import config
from . import views
from .context import CTX, new_ledger
from .processes import PROCESS

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
    process_index = 0
    host_id = 0

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


def devices(backend=None) -> list[Device]:
    """The default virtual devices: ``config.num_devices`` of them (8 unless changed), as
    ``jax.devices()``. `backend` is accepted for JAX's signature ("cpu" or None)."""
    _check_backend(backend, "devices")
    _check_count(config.num_devices, "devices", abstract=False)
    return [_device(i) for i in range(config.num_devices)]


def _check_backend(backend, op: str) -> None:
    if backend is not None and getattr(backend, "platform", backend) not in ("cpu", "shardlab"):
        raise RuntimeError(f"Unknown backend {backend!r} [{op}]: shardlab's virtual devices are one "
                           f"'cpu' backend; pass backend=None or 'cpu'")


def local_devices(process_index=None, backend=None) -> list[Device]:
    """The devices of this process: all of them (shardlab emulates one process), as
    ``jax.local_devices()``.

    Example:
        >>> import shardlab as sl
        >>> sl.local_devices() == sl.devices(), sl.device_count(), sl.local_device_count()
        (True, 8, 8)
    """
    if process_index not in (None, 0):
        raise ValueError(f"[local_devices] process_index={process_index}: shardlab runs one process (index 0)")
    return devices(backend)


def device_count(backend=None) -> int:
    """How many devices there are (``config.num_devices``), as ``jax.device_count()``."""
    _check_backend(backend, "device_count")
    return config.num_devices


def local_device_count(backend=None) -> int:
    """How many devices this process has: all of them, as ``jax.local_device_count()``."""
    return device_count(backend)


def process_index(backend=None) -> int:
    """This process's index: 0, or the MPI rank under ``mpirun`` (see docs/mpi.md)."""
    _check_backend(backend, "process_index")
    return PROCESS.index


def process_count(backend=None) -> int:
    """How many processes: 1, or the MPI ranks under ``mpirun``, as ``jax.process_count()``."""
    _check_backend(backend, "process_count")
    return PROCESS.count


def default_backend() -> str:
    """The platform name of the default backend: "cpu", as JAX on a machine without
    accelerators (shardlab's virtual devices run on the CPU).

    Example:
        >>> import shardlab as sl
        >>> sl.default_backend(), sl.process_index(), sl.process_count()
        ('cpu', 0, 1)
    """
    return "cpu"


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

    ``axis_types`` (one ``AxisType`` per axis) defaults to ``Auto``, as ``jax.sharding.Mesh``;
    ``make_mesh`` defaults to ``Explicit``. ``repr`` and ``str`` are JAX's
    (``Mesh(axis_sizes=(2, 4), axis_names=('data', 'model'), axis_types=(Auto, Auto))`` and
    ``Mesh('data': 2, 'model': 4, axis_types=(Auto, Auto))``), with the hardware preset after.

    An *abstract* mesh (``AbstractMesh``, ``make_mesh(..., abstract=True)``, ``mesh.abstract_mesh``)
    has the same axes and hardware but holds no data: programs on it run shape-only (see
    ``shardlab.eval_shape``), so a mesh of thousands of devices costs nothing until its
    ``devices`` are asked for.

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
            self._ledger = new_ledger()
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
        """True for JAX's empty mesh ``Mesh()`` (no axes, no devices: what
        ``sharding.get_mesh()`` gives when no mesh is set)."""
        return self.size == 0

    def axis_size(self, name: str) -> int:
        if name not in self.shape:
            raise NameError(f"unbound axis name: {name!r}; the mesh has axes {self.axis_names}")
        return self.shape[name]

    def device_at(self, coords: Sequence[int]) -> Device:
        return self.devices[tuple(coords)]

    def __eq__(self, other):
        if not isinstance(other, Mesh) or self.axis_names != other.axis_names \
                or self.axis_sizes != other.axis_sizes or self.abstract != other.abstract \
                or self.axis_types != other.axis_types:
            return False
        if self.abstract or self._device_ids is None and other._device_ids is None:
            return True
        return np.array_equal(self.device_ids, other.device_ids)

    def __hash__(self):
        return hash((self.axis_names, self.axis_sizes, self.axis_types, self.abstract))

    def __reduce__(self):
        devices = _RowMajor(self.axis_sizes) if self._devices is None else self._devices
        return (_rebuild_mesh, (devices, self.axis_names, self.axis_types, self.hardware, self.physical_axes,
                                self.abstract))

    # -- axis types, as JAX's BaseMesh -----------------------------------------------------------
    @property
    def auto_axes(self) -> tuple:
        """Names of the Auto axes, in mesh order."""
        return tuple(n for n, t in zip(self.axis_names, self.axis_types) if t == AxisType.Auto)

    @property
    def explicit_axes(self) -> tuple:
        """Names of the Explicit axes, in mesh order."""
        return tuple(n for n, t in zip(self.axis_names, self.axis_types) if t == AxisType.Explicit)

    @property
    def manual_axes(self) -> tuple:
        """Names of the Manual axes (inside shard_map), in mesh order."""
        return tuple(n for n, t in zip(self.axis_names, self.axis_types) if t == AxisType.Manual)

    @property
    def are_all_axes_auto(self) -> bool:
        """Whether the mesh has axes and all of them are Auto."""
        return bool(self.axis_types) and all(t == AxisType.Auto for t in self.axis_types)

    @property
    def are_all_axes_explicit(self) -> bool:
        """Whether the mesh has axes and all of them are Explicit."""
        return bool(self.axis_types) and all(t == AxisType.Explicit for t in self.axis_types)

    @property
    def are_all_axes_manual(self) -> bool:
        """Whether the mesh has axes and all of them are Manual."""
        return bool(self.axis_types) and all(t == AxisType.Manual for t in self.axis_types)

    @property
    def _name_to_type(self) -> dict:
        return dict(zip(self.axis_names, self.axis_types))

    def update(self, devices=None, axis_names=None, axis_types=None):
        """A mesh like this one with some fields replaced, as ``jax.sharding.Mesh.update``."""
        return Mesh(self.devices if devices is None else devices,
                    self.axis_names if axis_names is None else axis_names,
                    self.axis_types if axis_types is None else axis_types,
                    hardware=self.hardware, physical_axes=self.physical_axes, abstract=self.abstract)

    def update_axis_types(self, name_to_type: dict):
        """A mesh with the axes named in `name_to_type` given those types."""
        types = tuple(name_to_type.get(n, t) for n, t in zip(self.axis_names, self.axis_types))
        return self.update(axis_types=types)

    @property
    def abstract_mesh(self) -> "AbstractMesh":
        """This mesh without devices: axis sizes, names and types (and the hardware preset),
        as ``jax.sharding.Mesh.abstract_mesh``.

        Example:
            >>> import shardlab as sl
            >>> sl.make_mesh((2, 4), ("X", "Y")).abstract_mesh
            AbstractMesh('X': 2, 'Y': 4, axis_types=(Explicit, Explicit))
        """
        am = self.__dict__.get("_abstract_mesh")
        if am is None:
            am = AbstractMesh(self.axis_sizes, self.axis_names, self.axis_types, hardware=self.hardware,
                              physical_axes=self.physical_axes)
            self.__dict__["_abstract_mesh"] = am
        return am

    def _extras(self) -> str:
        """shardlab's additions to JAX's repr: the hardware preset."""
        return f", hardware={self.hardware.name!r}" if self.hardware is not None else ""

    def __str__(self):
        if not self.axis_names:
            return "Mesh()"
        axes = ", ".join(f"'{n}': {s}" for n, s in self.shape.items())
        ab = ", abstract=True" if self.abstract else ""
        return f"Mesh({axes}, axis_types={self.axis_types}{self._extras()}{ab})"

    def __repr__(self):
        if not self.axis_names:
            return "Mesh(axis_sizes=(), axis_names=())"
        ab = ", abstract=True" if self.abstract else ""
        return (f"Mesh(axis_sizes={self.axis_sizes}, axis_names={self.axis_names!r}, "
                f"axis_types={self.axis_types}{self._extras()}{ab})")

    def _repr_html_(self) -> str:
        view = views.html_view(self)
        return view if view is not None else f"<code>{self!r}</code>"

    def __enter__(self):
        """``with mesh:`` as JAX 0.10 treats it: deprecated (a DeprecationWarning) in favour of
        ``with shardlab.set_mesh(mesh):``; it sets only the legacy mesh context that bare
        PartitionSpecs in ``lax.with_sharding_constraint`` read (``legacy_mesh()``), not the
        mesh that ``get_mesh``, ``device_put``, ``shard_map`` or ``jit`` use."""
        warnings.warn("`with mesh:` context manager has been deprecated. Please use `with"
                      " jax.set_mesh(mesh):` instead.", category=DeprecationWarning, stacklevel=2)
        CTX.mesh_stack.append(self)
        return self

    def __exit__(self, *exc):
        CTX.mesh_stack.pop()
        return False


class AbstractMesh(Mesh):
    """A mesh of axis sizes, names and types with no devices, as ``jax.sharding.AbstractMesh``.

    It is shardlab's abstract mesh: what ``make_mesh(..., abstract=True)`` returns and what
    ``Mesh.abstract_mesh`` gives. Programs on it run shape-only (``shardlab.eval_shape``,
    abstract arrays from ``ShapeDtypeStruct``) and record the same ledger events as a real mesh,
    at any size up to 2**31-1 devices. ``axis_types`` defaults to ``Auto`` as in JAX. It may
    carry a hardware preset for cost estimates (a shardlab addition).

    Example:
        >>> from shardlab.sharding import AbstractMesh, AxisType
        >>> m = AbstractMesh((16, 16), ("x", "y"), (AxisType.Explicit,) * 2)
        >>> m, m.size, m.shape["y"]
        (AbstractMesh('x': 16, 'y': 16, axis_types=(Explicit, Explicit)), 256, 16)
    """

    def __init__(self, axis_sizes, axis_names, axis_types=None, *, abstract_device=None, hardware=None,
                 physical_axes=None):
        if isinstance(axis_names, str):
            axis_names = (axis_names,)
        axis_names = tuple(axis_names)
        sizes = tuple(axis_sizes) if isinstance(axis_sizes, (tuple, list)) else (axis_sizes,)
        for s in sizes:
            if not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s <= 0:
                raise ValueError(f"[AbstractMesh] axis sizes must be positive ints, got {sizes}")
        if len(sizes) != len(axis_names):
            raise ValueError(f"[AbstractMesh] {len(sizes)} axis sizes {sizes} but {len(axis_names)} axis names "
                             f"{axis_names}; give one name per axis")
        _check_count(math.prod(int(s) for s in sizes), "AbstractMesh", abstract=True)
        axis_types = normalize_axis_types(axis_names, axis_types, AxisType.Auto, "AbstractMesh")
        super().__init__(_RowMajor(tuple(int(s) for s in sizes)), axis_names, axis_types, hardware=hardware,
                         physical_axes=physical_axes, abstract=True)
        self.abstract_device = abstract_device
        if not axis_names:
            self.size = 0  # JAX's empty abstract mesh has size 0

    @property
    def empty(self) -> bool:
        """True for the mesh of no axes, ``AbstractMesh((), ())`` (size 0, as in JAX)."""
        return self.size == 0

    @property
    def abstract_mesh(self) -> "AbstractMesh":
        return self

    def __reduce__(self):
        return (_rebuild_abstract_mesh, (self.axis_sizes if self.axis_names else (), self.axis_names,
                                         self.axis_types, self.hardware, self.physical_axes))

    def update(self, axis_sizes=None, axis_names=None, axis_types=None, **kwargs):
        """An abstract mesh like this one with some fields replaced, as JAX's."""
        return AbstractMesh(self.axis_sizes if axis_sizes is None else axis_sizes,
                            self.axis_names if axis_names is None else axis_names,
                            self.axis_types if axis_types is None else axis_types,
                            abstract_device=kwargs.get("abstract_device", self.abstract_device),
                            hardware=kwargs.get("hardware", self.hardware),
                            physical_axes=kwargs.get("physical_axes", self.physical_axes))

    def __str__(self):
        axes = ", ".join(f"'{n}': {s}" for n, s in self.shape.items()) if self.axis_names else "()"
        return f"AbstractMesh({axes}, axis_types={self.axis_types}{self._extras()})"

    __repr__ = __str__

    def __enter__(self):
        raise ValueError("AbstractMesh does not implement __enter__; use "
                         "shardlab.sharding.use_abstract_mesh(mesh) or shardlab.set_mesh(mesh)")

    def __exit__(self, *exc):
        raise ValueError("AbstractMesh does not implement __exit__")


def _rebuild_mesh(devices, axis_names, axis_types, hardware, physical_axes, abstract):
    return Mesh(devices, axis_names, axis_types, hardware=hardware, physical_axes=physical_axes, abstract=abstract)


def _rebuild_abstract_mesh(axis_sizes, axis_names, axis_types, hardware, physical_axes):
    return AbstractMesh(axis_sizes, axis_names, axis_types, hardware=hardware, physical_axes=physical_axes)


class _RowMajor:
    """Devices 0..n-1 in row-major order, not materialized (see Mesh.devices)."""

    def __init__(self, shape):
        self.shape = tuple(shape)


def _as_device(d) -> Device:
    if isinstance(d, (int, np.integer)) and d >= 0:
        return _device(int(d))
    raise TypeError(f"[Mesh] expected Device objects or non-negative ints, got {d!r}")


def make_mesh(axis_shapes: Sequence[int] | None = None, axis_names: Sequence[str] | None = None,
              axis_types=None, *, devices=None, axis_sizes: Sequence[int] | None = None, hardware=None,
              physical_axes=None, abstract: bool = False) -> Mesh:
    """Creates a mesh of ``prod(axis_shapes)`` virtual devices, row-major, as ``jax.make_mesh``.

    The sizes may be given positionally or by either keyword JAX has used, ``axis_shapes=``
    (JAX 0.4-0.10) or ``axis_sizes=`` (newer releases). ``axis_types`` defaults to
    ``AxisType.Explicit`` for every axis, as in JAX 0.10. ``abstract=True`` returns an
    ``AbstractMesh`` for shape-only programs (no data; any size up to 2**31-1 devices), to
    cost a program at a scale that cannot run here.

    Example:
        >>> import shardlab as sl
        >>> sl.make_mesh((2, 4), ("x", "y")).device_ids.tolist()
        [[0, 1, 2, 3], [4, 5, 6, 7]]
        >>> sl.make_mesh(axis_sizes=(2, 4), axis_names=("X", "Y"))
        Mesh(axis_sizes=(2, 4), axis_names=('X', 'Y'), axis_types=(Explicit, Explicit))
        >>> sl.make_mesh((16, 20, 28), ("x", "y", "z"), hardware="tpu-v5p", abstract=True).size
        8960
    """
    if axis_sizes is not None:
        if axis_shapes is not None:
            raise TypeError(f"[make_mesh] got the axis sizes twice: axis_shapes={axis_shapes} and "
                            f"axis_sizes={axis_sizes}; pass one of them")
        axis_shapes = axis_sizes
    if axis_shapes is None or axis_names is None:
        missing = "axis_shapes (or axis_sizes)" if axis_shapes is None else "axis_names"
        raise TypeError(f"[make_mesh] missing required argument {missing}")
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
    if abstract:
        if devices is not None:
            raise ValueError("[make_mesh] an abstract mesh has no devices; drop devices= or abstract=True")
        return AbstractMesh(shape, axis_names, axis_types, hardware=hardware, physical_axes=physical_axes)
    if devices is None:
        return Mesh(_RowMajor(shape), axis_names, axis_types=axis_types, hardware=hardware,
                    physical_axes=physical_axes)
    devs = list(devices)
    if len(devs) != n:
        raise ValueError(f"[make_mesh] mesh shape {shape} needs {n} devices, got {len(devs)}")
    arr = np.empty(n, dtype=object)
    arr[:] = devs
    return Mesh(arr.reshape(shape), axis_names, axis_types=axis_types, hardware=hardware,
                physical_axes=physical_axes)


def get_mesh() -> Mesh | None:
    """The mesh set by ``set_mesh``, or None (``jax.sharding.get_mesh`` returns an empty mesh
    there). ``with mesh:`` does not set it, as in JAX 0.10 (see ``Mesh.__enter__``)."""
    return CTX.global_mesh


def context_mesh() -> Mesh:
    """``jax.sharding.get_mesh()``: the mesh set by ``set_mesh``, else the empty ``Mesh()``
    (``.empty`` is True). ``shardlab.get_mesh()`` gives None there instead.

    Example:
        >>> import shardlab as sl
        >>> sl.sharding.get_mesh(), sl.sharding.get_mesh().empty
        (Mesh(axis_sizes=(), axis_names=()), True)
    """
    return CTX.global_mesh if CTX.global_mesh is not None else EMPTY_MESH


def legacy_mesh() -> Mesh | None:
    """The innermost ``with mesh:`` mesh (JAX's legacy resource env), else the set_mesh mesh:
    what a bare PartitionSpec in ``lax.with_sharding_constraint`` resolves against."""
    if CTX.mesh_stack:
        return CTX.mesh_stack[-1]
    return CTX.global_mesh


class set_mesh(contextlib.AbstractContextManager):
    """Sets the current mesh (used by ``P``-only shardings and shard_map without ``mesh=``).

    Works as a statement and as a context manager that restores the previous mesh, as
    ``jax.set_mesh``. It also sets the abstract mesh (``get_abstract_mesh``) that ``typeof``
    and the sharding rules read.

    Example:
        >>> import shardlab as sl
        >>> with sl.set_mesh(sl.make_mesh((8,), ("x",))):
        ...     sl.get_mesh().shape["x"], sl.sharding.get_abstract_mesh()
        (8, AbstractMesh('x': 8, axis_types=(Explicit,)))
    """

    def __init__(self, mesh: Mesh):
        if not isinstance(mesh, Mesh):
            raise ValueError(f"[set_mesh] expected mesh of type `shardlab.sharding.Mesh`, got "
                             f"{type(mesh).__name__}")
        self._previous = CTX.global_mesh
        CTX.global_mesh = mesh

    def __exit__(self, *exc):
        CTX.global_mesh = self._previous
        return False


_EMPTY_ABSTRACT: list = []


def empty_abstract_mesh() -> "AbstractMesh":
    """``AbstractMesh((), ())``, what ``get_abstract_mesh`` gives with no mesh in context."""
    if not _EMPTY_ABSTRACT:
        _EMPTY_ABSTRACT.append(AbstractMesh((), ()))
    return _EMPTY_ABSTRACT[0]


def get_abstract_mesh() -> AbstractMesh:
    """The abstract mesh in context, as ``jax.sharding.get_abstract_mesh``: inside a shard_map
    body its mesh with the axes Manual; else the one ``use_abstract_mesh`` set; else the
    ``set_mesh`` mesh's; else the empty ``AbstractMesh((), ())``.

    Example:
        >>> import shardlab as sl
        >>> sl.sharding.get_abstract_mesh()
        AbstractMesh((), axis_types=())
    """
    if CTX.meshes:
        return manual_view(CTX.meshes[-1])
    am = getattr(CTX, "abstract_mesh", None)
    if am is not None:
        return am
    if CTX.global_mesh is not None:
        return CTX.global_mesh.abstract_mesh
    return empty_abstract_mesh()


def manual_view(mesh: Mesh) -> "AbstractMesh":
    """The abstract mesh a shard_map body on `mesh` sees: its axes Manual (a mesh that already
    has Manual axes, from a partially manual shard_map, keeps its types)."""
    am = mesh.abstract_mesh
    if not am.axis_names or am.manual_axes:
        return am
    return am.update_axis_types({n: AxisType.Manual for n in am.axis_names})


class use_abstract_mesh:
    """Sets an abstract mesh in a thread-local context, as ``jax.sharding.use_abstract_mesh``
    (a context manager). It cannot change the mesh's size.

    Example:
        >>> from shardlab.sharding import AbstractMesh, get_abstract_mesh, use_abstract_mesh
        >>> with use_abstract_mesh(AbstractMesh((4,), ("x",))):
        ...     get_abstract_mesh().shape
        {'x': 4}
    """

    __slots__ = ("mesh", "prev")

    def __init__(self, mesh: AbstractMesh):
        if not isinstance(mesh, AbstractMesh):
            raise ValueError(f"[use_abstract_mesh] expected mesh of type `jax.sharding.AbstractMesh`. Got type: "
                             f"{type(mesh).__name__}; pass mesh.abstract_mesh")
        self.mesh = mesh

    def __enter__(self):
        self.prev = getattr(CTX, "abstract_mesh", None)
        if self.prev is not None and not self.prev.empty and not self.mesh.empty \
                and self.prev.size != self.mesh.size:
            raise ValueError(f"use_abstract_mesh cannot change the size of the mesh. Got new mesh: {self.mesh} "
                             f"with size={self.mesh.size} and prev mesh: {self.prev} with size={self.prev.size}")
        CTX.abstract_mesh = self.mesh
        return self.mesh

    def __exit__(self, *exc):
        CTX.abstract_mesh = self.prev
        return False


# The mesh of no axes: one device. Plain arrays that must run through primitives (jnp on numpy
# arrays under shardlab.grad, attention outside shard_map) are LocalArrays on it.
# It records no ledger events: it is not a mesh the user made.
UNIT_MESH = Mesh(_RowMajor(()), ())
UNIT_MESH.records = False

# JAX's empty mesh, ``Mesh()``: no axes and size 0 (``sharding.get_mesh()`` with no mesh set).
EMPTY_MESH = Mesh(_RowMajor(()), ())
EMPTY_MESH.size = 0
EMPTY_MESH.records = False
