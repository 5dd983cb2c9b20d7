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
import math
import threading
from typing import Sequence

import numpy as np

from . import _core
from .config import config


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
    return [_device(i) for i in range(config.num_devices)]


class Mesh:
    """A named grid of virtual devices, as ``jax.sharding.Mesh``.

    Args:
        devices: ndarray of Device (or of ints), one axis per mesh axis.
        axis_names: one name per axis of ``devices``.
        hardware: optional preset name (e.g. "tpu-v5e") or Hardware for cost estimates.
        physical_axes: optional map from mesh axis to physical links (see shardlab.hardware).

    Example:
        >>> import numpy as np, shardlab as sl
        >>> m = sl.Mesh(np.array(sl.devices()).reshape(2, 4), ("data", "model"))
        >>> m.size, m.axis_names
        (8, ('data', 'model'))
    """

    def __init__(self, devices, axis_names, *, axis_types=None, hardware=None, physical_axes=None):
        if isinstance(axis_names, str):
            axis_names = (axis_names,)
        axis_names = tuple(axis_names)
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
        self.devices = np.empty(arr.shape, dtype=object)
        self.devices.ravel()[:] = flat
        self.device_ids = np.array(ids, dtype=np.int64).reshape(arr.shape)
        self._core = _core.Mesh(list(axis_names), list(arr.shape))
        self.axis_names = axis_names
        self.axis_types = axis_types
        self.shape = dict(zip(axis_names, (int(s) for s in arr.shape)))
        self.hardware = None
        self.physical_axes = physical_axes
        if hardware is not None:
            from . import hardware as _hardware

            self.hardware = _hardware.get(hardware)
            _hardware.validate_axes(self.hardware, axis_names, tuple(arr.shape), physical_axes)
        from .ledger import Ledger

        self.ledger = Ledger()  # every collective on this mesh is recorded here too

    @property
    def size(self) -> int:
        return int(self.devices.size)

    @property
    def axis_sizes(self) -> tuple:
        return tuple(self.shape.values())

    @property
    def shape_tuple(self) -> tuple:
        return tuple(self.shape.items())

    @property
    def ndim(self) -> int:
        return len(self.axis_names)

    @property
    def empty(self) -> bool:
        return False

    def axis_size(self, name: str) -> int:
        if name not in self.shape:
            raise NameError(f"unbound axis name: {name!r}; the mesh has axes {self.axis_names}")
        return self.shape[name]

    def device_at(self, coords: Sequence[int]) -> Device:
        return self.devices[tuple(coords)]

    def __eq__(self, other):
        return (isinstance(other, Mesh) and self.axis_names == other.axis_names
                and np.array_equal(self.device_ids, other.device_ids))

    def __hash__(self):
        return hash((self.axis_names, self.device_ids.tobytes(), self.device_ids.shape))

    def __repr__(self):
        hw = f", hardware={self.hardware.name!r}" if self.hardware is not None else ""
        return f"Mesh({self.shape!r}{hw})"

    def __enter__(self):
        _STATE.stack.append(self)
        return self

    def __exit__(self, *exc):
        _STATE.stack.pop()
        return False


def _as_device(d) -> Device:
    if isinstance(d, (int, np.integer)) and d >= 0:
        return _device(int(d))
    raise TypeError(f"[Mesh] expected Device objects or non-negative ints, got {d!r}")


def make_mesh(axis_shapes: Sequence[int], axis_names: Sequence[str], *, devices=None,
              axis_types=None, hardware=None, physical_axes=None) -> Mesh:
    """Creates a mesh of ``prod(axis_shapes)`` virtual devices, row-major, as ``jax.make_mesh``.

    Example:
        >>> import shardlab as sl
        >>> sl.make_mesh((2, 4), ("x", "y")).device_ids.tolist()
        [[0, 1, 2, 3], [4, 5, 6, 7]]
    """
    if isinstance(axis_names, str):
        axis_names = (axis_names,)
    shape = tuple(axis_shapes)
    for s in shape:
        if not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s <= 0:
            raise ValueError(f"[make_mesh] axis sizes must be positive ints, got {shape}")
    if len(shape) != len(tuple(axis_names)):
        raise ValueError(f"[make_mesh] {len(shape)} axis sizes {shape} but {len(tuple(axis_names))} "
                         f"axis names {tuple(axis_names)}; give one name per axis")
    n = math.prod(shape)
    if devices is None:
        devs = [_device(i) for i in range(n)]
    else:
        devs = list(devices)
        if len(devs) != n:
            raise ValueError(f"[make_mesh] mesh shape {shape} needs {n} devices, got {len(devs)}")
    arr = np.empty(n, dtype=object)
    arr[:] = devs
    return Mesh(arr.reshape(shape), axis_names, axis_types=axis_types, hardware=hardware,
                physical_axes=physical_axes)


class _State(threading.local):
    def __init__(self):
        self.stack: list[Mesh] = []
        self.global_mesh: Mesh | None = None


_STATE = _State()


def get_mesh() -> Mesh | None:
    """The mesh set by ``with mesh:`` or ``set_mesh``, or None."""
    if _STATE.stack:
        return _STATE.stack[-1]
    return _STATE.global_mesh


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
        self._previous = _STATE.global_mesh
        _STATE.global_mesh = mesh

    def __exit__(self, *exc):
        _STATE.global_mesh = self._previous
        return False
