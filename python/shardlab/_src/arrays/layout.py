"""Global array ↔ mesh-factorized storage for a NamedSharding (``device_put`` and back).

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> from shardlab._src.arrays.layout import to_storage
    >>> s = sl.NamedSharding(sl.make_mesh((4, 2), ("x", "y")), P(None, "x"))
    >>> to_storage(np.zeros((6, 8)), s).shape      # x varies, y does not; local (6, 2)
    (4, 1, 6, 2)
"""

from __future__ import annotations

import numpy as np


from ..core.sharding import NamedSharding
from ..kernels.native import copy
from .storage import AbstractStorage, is_abstract


def storage_shape(global_shape, sharding: NamedSharding) -> tuple:
    """The storage shape ``to_storage`` gives, without data: mesh dims (the axis size where the
    spec names the axis, else 1) then the shard shape."""
    mesh = sharding.mesh
    named = set(sharding.spec.mesh_axes())
    return tuple(mesh.shape[a] if a in named else 1 for a in mesh.axis_names) + \
        sharding.shard_shape(global_shape)


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
    return copy(v).reshape(global_shape)


def global_value(storage, sharding: NamedSharding, global_shape: tuple):
    """`from_storage`, or an AbstractStorage of the global shape for abstract storage."""
    if is_abstract(storage):
        return AbstractStorage(global_shape, storage.dtype)
    return from_storage(storage, sharding, global_shape)


def local_storage(x, sharding: NamedSharding):
    """`to_storage` of a global value (numpy array or AbstractStorage)."""
    if is_abstract(x):
        return AbstractStorage(storage_shape(x.shape, sharding), x.dtype)
    return to_storage(x, sharding)


def full_storage(storage, sharding: NamedSharding, global_shape: tuple):
    """`storage` broadcast to the storage shape `sharding` gives (a cotangent may be the same
    on every device where its sharding varies: stride 0 there, no copy)."""
    target = storage_shape(global_shape, sharding)
    if tuple(storage.shape) == target:
        return storage
    if is_abstract(storage):
        return AbstractStorage(target, storage.dtype)
    return np.broadcast_to(storage, target)
