"""Abstract mode: ``ShapeDtypeStruct`` and ``eval_shape``.

``eval_shape(f, *args)`` runs `f` with values that have shapes, dtypes and shardings but no
data. Every primitive applies its shape rule instead of computing, and records the same
ledger event it records for real, so a program can be costed at a scale that cannot run here
(thousands of devices, a 70B model) in seconds and without memory.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((16, 20, 28), ("x", "y", "z"), hardware="tpu-v5p", abstract=True)
    >>> w = sl.ShapeDtypeStruct((8192, 28672), np.float32, sharding=sl.NamedSharding(mesh, P("x", "z")))
    >>> f = sl.shard_map(lambda a: sl.lax.all_gather(a, "x", tiled=True), mesh=mesh,
    ...                  in_specs=P("x", "z"), out_specs=P(None, "z"))
    >>> with sl.Ledger() as ledger:
    ...     out = sl.eval_shape(f, w)
    >>> out.shape, ledger.events[0]["op"], ledger.events[0]["bytes_out"]
    ((8192, 28672), 'all_gather', 33554432.0)
"""

from __future__ import annotations

import numpy as np

from ..arrays.local_array import LocalArray
from ..arrays.sharded_array import ShardedArray, abstract_array
from ..arrays.storage import AbstractStorage
from ..core import tree
from ..core.dtypes import canonicalize
from ..core.mesh import UNIT_MESH
from ..core.mesh import get_mesh
from ..core.sharding import NamedSharding, PartitionSpec, as_sharding


class ShapeDtypeStruct:
    """Shape, dtype and (optionally) sharding of an array, with no data (``jax.ShapeDtypeStruct``)."""

    __slots__ = ("shape", "dtype", "sharding")

    def __init__(self, shape, dtype, *, sharding=None):
        try:
            self.shape = tuple(int(s) for s in shape)
        except TypeError:
            raise TypeError(f"[ShapeDtypeStruct] shape must be a sequence of ints, got {shape!r}") from None
        if any(s < 0 for s in self.shape):
            raise ValueError(f"[ShapeDtypeStruct] shape {self.shape} has a negative dimension")
        self.dtype = np.dtype(dtype)
        if isinstance(sharding, PartitionSpec) and get_mesh() is not None:
            sharding = NamedSharding(get_mesh(), sharding)  # as JAX: a bare spec takes the set mesh
        if sharding is not None and not isinstance(sharding, (NamedSharding, PartitionSpec)):
            raise TypeError(f"[ShapeDtypeStruct] sharding must be a NamedSharding (or a PartitionSpec with a mesh "
                            f"set by shardlab.set_mesh), got {sharding!r}")
        self.sharding = sharding

    @property
    def ndim(self) -> int:
        """The rank."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    def __repr__(self):
        s = "" if self.sharding is None else f", sharding={self.sharding!r}"
        return f"ShapeDtypeStruct(shape={self.shape}, dtype={self.dtype}{s})"

    def __eq__(self, other):
        return isinstance(other, ShapeDtypeStruct) and (self.shape, self.dtype, self.sharding) == \
            (other.shape, other.dtype, other.sharding)

    def __hash__(self):
        return hash((self.shape, self.dtype))


def _abstract(x):
    if isinstance(x, ShapeDtypeStruct):
        if x.sharding is not None:
            return abstract_array(x.shape, x.dtype, as_sharding(x.sharding, "ShapeDtypeStruct"))
        return LocalArray(AbstractStorage(x.shape, x.dtype), UNIT_MESH)
    if isinstance(x, ShardedArray):
        return abstract_array(x.shape, x.dtype, x.sharding)
    if isinstance(x, LocalArray):
        return LocalArray(AbstractStorage(x.storage.shape, x.dtype), x.mesh)
    if isinstance(x, (np.ndarray, np.generic, int, float, bool)):
        arr = np.asarray(x)
        return LocalArray(AbstractStorage(arr.shape, canonicalize(arr[()] if arr.ndim == 0 else arr[:0], "eval_shape").dtype),
                          UNIT_MESH)
    return x


def _is_leaf(x) -> bool:
    return isinstance(x, (ShapeDtypeStruct, ShardedArray, LocalArray))


def _describe(v):
    if isinstance(v, ShardedArray):
        return ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding)
    if isinstance(v, LocalArray):
        return ShapeDtypeStruct(v.shape if v.mesh is not UNIT_MESH else v.storage.shape, v.dtype)
    if isinstance(v, np.ndarray):
        return ShapeDtypeStruct(v.shape, v.dtype)
    return v


def eval_shape(fun, *args, **kwargs):
    """Runs `fun` on abstract values; returns ShapeDtypeStructs (a pytree like `fun`'s output).

    Arguments may be ShapeDtypeStructs (with a sharding, they enter shard_map sharded),
    arrays or ShardedArrays (their data is not used). Ledger events are recorded as for a real
    run, so ``with Ledger():`` around it costs the program.
    """
    if not callable(fun):
        raise TypeError(f"[eval_shape] fun must be callable, got {type(fun).__name__}")
    leaves, treedef = tree.flatten(args, _is_leaf)
    out = fun(*tree.unflatten(treedef, [_abstract(x) for x in leaves]), **kwargs)
    out_leaves, out_def = tree.flatten(out, _is_leaf)
    return tree.unflatten(out_def, [_describe(v) for v in out_leaves])
