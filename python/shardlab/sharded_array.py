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

from . import _core
from .dtypes import canonicalize
from .mesh import Device
from .sharding import NamedSharding, as_sharding


@dataclass(frozen=True)
class Shard:
    """One device's piece of a ShardedArray, as ``jax.Shard``."""

    device: Device
    index: tuple
    data: np.ndarray
    replica_id: int


def host_nbytes(storage: np.ndarray) -> int:
    """Bytes of host memory behind a (possibly broadcast) view: stride-0 dims count once."""
    n = math.prod(s for s, st in zip(storage.shape, storage.strides) if st != 0)
    return int(n) * storage.dtype.itemsize if storage.size else 0


def to_storage(x: np.ndarray, sharding: NamedSharding) -> np.ndarray:
    """Global array → mesh-factorized storage (a view where possible, see ``from_storage``)."""
    mesh = sharding.mesh
    shard = sharding.shard_shape(x.shape)
    split, axis_pos, local_pos = [], {}, []
    for d in range(x.ndim):
        for name in sharding.spec.axes_of(d):
            axis_pos[name] = len(split)
            split.append(mesh.shape[name])
        local_pos.append(len(split))
        split.append(shard[d])
    v = x.reshape(split)
    used = [n for n in mesh.axis_names if n in axis_pos]
    v = v.transpose([axis_pos[n] for n in used] + local_pos)
    missing = [i for i, n in enumerate(mesh.axis_names) if n not in axis_pos]
    return np.expand_dims(v, missing) if missing else v


def from_storage(storage: np.ndarray, sharding: NamedSharding, global_shape: tuple) -> np.ndarray:
    """Mesh-factorized storage → the global array (a new contiguous array)."""
    mesh = sharding.mesh
    k = mesh.ndim
    order = []  # storage dims in split order: per global dim, its axes then its local dim
    for d in range(len(global_shape)):
        order += [mesh.axis_names.index(n) for n in sharding.spec.axes_of(d)] + [k + d]
    unused = [i for i, n in enumerate(mesh.axis_names) if n not in sharding.spec.mesh_axes()]
    v = storage.transpose(order + unused)
    v = v.reshape(v.shape[: len(order)]) if unused else v  # unused dims have size 1
    return _core.copy(v).reshape(global_shape)


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
        self._storage = storage
        self.sharding = sharding
        self.shape = tuple(int(s) for s in shape)
        self.unreduced = frozenset(unreduced)

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
        if ufunc is np.matmul:
            from .global_ops import matmul

            return matmul(*inputs)
        arrays = [x for x in inputs if isinstance(x, ShardedArray)]
        first = arrays[0]
        scalar = lambda x: isinstance(x, (int, float, bool, complex, np.generic))  # noqa: E731
        if all(x.sharding == first.sharding and x.shape == first.shape and not x.unreduced for x in arrays) \
                and all(isinstance(x, ShardedArray) or scalar(x) for x in inputs):
            # Same layout everywhere: the storages line up element for element.
            out = ufunc(*[x._storage if isinstance(x, ShardedArray) else x for x in inputs], **kwargs)
            return ShardedArray(out, first.sharding, first.shape)
        # Different layouts or broadcasting: compute globally, lay out like the first operand.
        out = ufunc(*[np.asarray(x) for x in inputs], **kwargs)
        if out.shape != first.shape:
            return out
        return device_put(out, first.sharding)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of unsized ShardedArray")
        return self.shape[0]

    # -- shards ----------------------------------------------------------------------------
    def _local(self, pos: int) -> np.ndarray:
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
        u = f", unreduced={set(sorted(self.unreduced))}" if self.unreduced else ""
        return (f"ShardedArray(shape={self.shape}, dtype={self.dtype}, "
                f"spec={self.sharding.spec!r}{u}, mesh={self.sharding.mesh!r})")

    def _repr_html_(self):
        from .debug import sharding_diagram

        head = html.escape(repr(self))
        if self.ndim <= 2:
            return f"<div><code>{head}</code>{sharding_diagram(self.shape, self.sharding)._repr_html_()}</div>"
        return f"<code>{head}</code>"


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
    arr = canonicalize(np.asarray(x), "device_put")
    sharding.check_shape(arr.shape, "device_put")
    storage = _core.copy(to_storage(arr, sharding))
    return ShardedArray(storage, sharding, arr.shape)
