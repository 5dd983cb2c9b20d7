"""ShardedArray: a global array held as real per-device shards in mesh-factorized storage.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((4, 2), ("x", "y"))
    >>> a = sl.device_put(np.ones((8, 1024), np.float32), sl.NamedSharding(mesh, P("x")))
    >>> a.nbytes_per_device, a.emulated_nbytes, a.host_nbytes
    (8192, 65536, 32768)
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

import numpy as np


from ..core import memory, views
from ..core.dtypes import canonicalize
from ..core.mesh import Device
from ..core.sharding import NamedSharding, as_sharding
from ..kernels.native import copy
from .layout import from_storage, storage_shape, to_storage
from .storage import AbstractStorage, host_nbytes, is_abstract

# [handler(ufunc, inputs, kwargs)] for global-view ufuncs (set by the planning layer).
GLOBAL_UFUNC: list = [None]


@dataclass(frozen=True)
class Shard:
    """One device's piece of a ShardedArray, as ``jax.Shard``."""

    device: Device
    index: tuple
    data: np.ndarray
    replica_id: int


class ShardedArray(np.lib.mixins.NDArrayOperatorsMixin):
    """A global array sharded over a mesh; each virtual device holds its real shard.

    ``np.asarray(arr)`` gives the global value. Replicated data is held once on the host
    (``host_nbytes``) while ``emulated_nbytes`` counts what every device would hold.

    ``unreduced`` names mesh axes the value is unreduced along (the book's {U_X}): for each
    such axis the storage dim has the full axis size and holds every device's partial sum.
    ``np.asarray`` of an unreduced array sums the partials (what psum would give).
    """

    __array_priority__ = 100

    def __init__(self, storage: np.ndarray, sharding: NamedSharding, shape: tuple,
                 unreduced: frozenset = frozenset()):
        if not isinstance(storage, (np.ndarray, AbstractStorage)):
            raise TypeError(f"[ShardedArray] storage must be a numpy array in mesh-factorized layout, got "
                            f"{type(storage).__name__}; use shardlab.device_put(x, sharding) to make one")
        if not isinstance(sharding, NamedSharding):
            raise TypeError(f"[ShardedArray] sharding must be a NamedSharding, got {sharding!r}")
        self._storage = storage
        self.sharding = sharding
        self.shape = tuple(int(s) for s in shape)
        self.unreduced = frozenset(unreduced)
        _check_storage(storage, sharding, self.shape, self.unreduced)

    # -- array-like ------------------------------------------------------------------------
    @property
    def dtype(self):
        return self._storage.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def storage(self) -> np.ndarray:
        """The mesh-factorized storage (read-only view): mesh dims, then the shard dims."""
        v = self._storage.view()
        v.flags.writeable = False
        return v

    def __array__(self, dtype=None, copy=None):
        storage = self._storage
        if is_abstract(storage):
            raise TypeError(f"[ShardedArray] this array of shape {self.shape} is abstract (from an "
                            f"abstract mesh or eval_shape): it has a shape and dtype but no data")
        if self.unreduced:
            dims = tuple(self.sharding.mesh.axis_names.index(a) for a in self.unreduced)
            storage = storage.sum(axis=dims, keepdims=True, dtype=storage.dtype)
        out = from_storage(storage, self.sharding, self.shape)
        return out if dtype is None else out.astype(dtype)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """Global-view arithmetic, as on a jax.Array: elementwise ufuncs keep the sharding and
        run shard by shard; ``@`` is planned and run by ``shardlab.matmul``."""
        if method != "__call__" or kwargs.get("out") is not None:
            return NotImplemented
        return GLOBAL_UFUNC[0](ufunc, inputs, kwargs)

    @property
    def is_abstract(self) -> bool:
        return is_abstract(self._storage)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of unsized ShardedArray")
        return self.shape[0]

    # -- shards ----------------------------------------------------------------------------
    def _local(self, pos: int) -> np.ndarray:
        if is_abstract(self._storage):
            raise TypeError(f"[ShardedArray] this array of shape {self.shape} is abstract: its shards "
                            f"have shapes ({self.sharding.shard_shape(self.shape)}) but no data")
        coords = np.unravel_index(pos, self.sharding.mesh.devices.shape)
        idx = tuple(int(c) if s != 1 else 0 for c, s in zip(coords, self._storage.shape))
        v = self._storage[idx + (Ellipsis,)]  # Ellipsis: a 0-d view, not a scalar, for rank-0 arrays
        v = v.view()
        v.flags.writeable = False
        return v

    @property
    def addressable_shards(self) -> list[Shard]:
        """One Shard per device in mesh (row-major) order."""
        out = []
        for pos, dev in enumerate(self.sharding.mesh.devices.ravel()):
            out.append(Shard(dev, self.sharding._index(pos, self.shape), self._local(pos),
                             self.sharding.replica_id(pos)))
        return out

    def addressable_data(self, index: int) -> np.ndarray:
        n = self.sharding.mesh.size
        if not 0 <= index < n:
            raise IndexError(f"[addressable_data] index {index} is outside the {n} devices")
        return self._local(index)

    @property
    def nbytes_per_device(self) -> int:
        return math.prod(self.sharding.shard_shape(self.shape)) * self.dtype.itemsize

    @property
    def emulated_nbytes(self) -> int:
        """Bytes summed over every device, as real hardware would hold them."""
        return self.nbytes_per_device * self.sharding.mesh.size

    @property
    def host_nbytes(self) -> int:
        """Bytes of host memory this array really holds."""
        return host_nbytes(self._storage)

    def __repr__(self):
        if is_abstract(self._storage):
            return f"ShapeDtypeStruct(shape={self.shape}, dtype={self.dtype}, sharding={self.sharding!r})"
        u = f", unreduced={set(sorted(self.unreduced))}" if self.unreduced else ""
        return (f"ShardedArray(shape={self.shape}, dtype={self.dtype}, "
                f"spec={self.sharding.spec!r}{u}, mesh={self.sharding.mesh!r})")

    def _repr_html_(self):
        view = views.html_view(self)
        return view if view is not None else f"<code>{html.escape(repr(self))}</code>"


def _check_storage(storage, sharding: NamedSharding, shape: tuple, unreduced: frozenset) -> None:
    """Raises ValueError unless `storage` is the mesh-factorized layout of a `shape` array
    sharded as `sharding` (mesh dims: the axis size where the spec or `unreduced` names the
    axis, else 1; then the shard shape)."""
    mesh = sharding.mesh
    sharding.check_shape(shape, "ShardedArray")
    named = set(sharding.spec.mesh_axes())
    for a in unreduced:
        if a not in mesh.axis_names or a in named:
            raise ValueError(f"[ShardedArray] unreduced axis {a!r} must be a mesh axis {mesh.axis_names} "
                             f"that the spec {sharding.spec!r} does not use")
    want = tuple(mesh.shape[a] if a in named or a in unreduced else 1 for a in mesh.axis_names) + \
        sharding.shard_shape(shape)
    if tuple(storage.shape) != want:
        raise ValueError(f"[ShardedArray] storage of shape {tuple(storage.shape)} does not hold a {shape} array "
                         f"sharded as {sharding.spec!r} on {mesh!r}: the layout needs {want} (mesh dims "
                         f"{want[:mesh.ndim]}, then the shard shape {want[mesh.ndim:]}); use "
                         f"shardlab.device_put(x, sharding) to make one")


def device_put(x, device=None, *, may_alias=None, donate=None) -> ShardedArray:
    """Places `x` on the mesh with a sharding, as ``jax.device_put``.

    Args:
        x: array-like (numpy array, list, scalar) or ShardedArray.
        device: a NamedSharding, or a PartitionSpec with a mesh set by ``set_mesh``.

    Raises:
        ValueError: a dim not divisible by the product of the axes splitting it, or a spec
            longer than the rank.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((2,), ("x",))
        >>> [s.data.tolist() for s in sl.device_put(np.arange(4), sl.NamedSharding(mesh, P("x"))).addressable_shards]
        [[0, 1], [2, 3]]
    """
    if device is None:
        raise TypeError("[device_put] pass a NamedSharding or PartitionSpec to place the array with")
    sharding = as_sharding(device, "device_put")
    if isinstance(x, ShardedArray):
        if x.sharding == sharding and not x.unreduced:
            return x
        x = np.asarray(x)
    arr = np.asarray(x)
    if not arr.dtype.isnative:  # big-endian data: the core reads native byte order only
        arr = arr.astype(arr.dtype.newbyteorder("="))
    arr = canonicalize(arr, "device_put")
    sharding.check_shape(arr.shape, "device_put")
    view = to_storage(arr, sharding)
    memory.check_alloc("device_put", view.size * view.dtype.itemsize,
                       f"a {arr.shape} {arr.dtype} array sharded as {sharding.spec!r} is that large on this mesh; "
                       f"shard it over more axes, or use an abstract mesh (make_mesh(..., abstract=True))")
    storage = copy(view)
    return ShardedArray(storage, sharding, arr.shape)


def abstract_array(shape, dtype, sharding: NamedSharding) -> ShardedArray:
    """A ShardedArray with shape, dtype and sharding but no data (abstract mode)."""
    shape = tuple(int(s) for s in shape)
    sharding.check_shape(shape, "ShapeDtypeStruct")
    return ShardedArray(AbstractStorage(storage_shape(shape, sharding), dtype), sharding, shape)
