"""Dtypes, partition specs and the bytes of a sharded array: what every cost function reads its
arguments with.

Example:
    >>> from shardlab._src.cost.layout import shard_bytes, itemsize
    >>> itemsize("bfloat16"), shard_bytes((1024, 1024), "bfloat16").bytes_per_device
    (2, 2097152)
"""

from __future__ import annotations

import dataclasses
import math

import ml_dtypes
import numpy as np

from ..core import dtypes as _dtypes
from ..core import hardware as _hw

__all__ = ["ShardBytes", "shard_bytes", "itemsize"]


def _np_dtype(dtype) -> np.dtype:
    if isinstance(dtype, str) and dtype.startswith(("bfloat16", "float8")):
        name = {"float8": "float8_e4m3fn"}.get(dtype, dtype)
        return np.dtype(getattr(ml_dtypes, name))
    try:
        return np.dtype(dtype)
    except TypeError:
        raise ValueError(f"[cost] unknown dtype {dtype!r}: use e.g. 'float32', 'bfloat16', 'int8'") from None


def _require_hw(op: str, hardware):
    """The Hardware for `hardware` (a preset name or Hardware); None is an error naming `op`."""
    hw = _hw.get(hardware)
    if hw is None:
        raise ValueError(f"[{op}] hardware=None: pass a preset name such as hardware='tpu-v5e' (shardlab.hardware."
                         f"names() lists them) or a custom chip, shardlab.hardware.Hardware(...)")
    return hw


def itemsize(dtype) -> int:
    """Bytes per element of ``dtype`` ("bfloat16" is 2, "float32" 4, "int8" 1): the one table,
    ``core.dtypes.itemsize``'s."""
    return _dtypes.itemsize(dtype, "cost")


def _dtype_name(dtype) -> str:
    return _np_dtype(dtype).name


def _check_shape(op: str, shape) -> tuple[int, ...]:
    if isinstance(shape, (str, bytes)) or not isinstance(shape, (tuple, list)) or \
            any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) for d in shape):
        raise ValueError(f"[{op}] shape {shape!r} must be a sequence of ints")
    dims = tuple(int(d) for d in shape)
    for d in dims:
        if d < 0:
            raise ValueError(f"[{op}] shape {dims} has a negative dimension {d}; sizes must be >= 0")
    return dims


def _spec_entries(op: str, spec, rank: int) -> list[tuple[str, ...]]:
    if spec is None:
        spec = ()
    if isinstance(spec, (str, bytes)) or not isinstance(spec, (tuple, list)):
        raise TypeError(f"[{op}] spec must be a PartitionSpec or a tuple of entries (None, an axis name or a "
                        f"tuple of names), got {spec!r}")
    entries = list(spec)
    if len(entries) > rank:
        raise ValueError(f"[{op}] spec {tuple(spec)} has {len(entries)} entries for an array of rank {rank}")
    out = []
    for e in entries + [None] * (rank - len(entries)):
        if e is None:
            out.append(())
        elif isinstance(e, str):
            out.append((e,))
        elif isinstance(e, (tuple, list)) and all(isinstance(a, str) for a in e):
            out.append(tuple(e))
        else:
            raise TypeError(f"[{op}] spec entry {e!r} must be None, an axis name or a tuple of names")
    seen: set[str] = set()
    for e in out:
        for a in e:
            if a in seen:
                raise ValueError(f"[{op}] mesh axis {a!r} appears twice in spec {tuple(spec)}")
            seen.add(a)
    return out


def _mesh_shape(op: str, mesh_shape=None, mesh=None) -> dict[str, int]:
    if mesh is not None:
        mesh_shape = mesh.shape
    if mesh_shape is None:
        raise ValueError(f"[{op}] pass mesh_shape={{'X': 8, ...}} or mesh=...")
    try:
        items = dict(mesh_shape).items()
    except (TypeError, ValueError):
        raise TypeError(f"[{op}] mesh_shape must be a dict from axis name to size, got {mesh_shape!r}") from None
    for k, v in items:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"[{op}] mesh axis {k!r} has size {v!r}; sizes must be ints")
    shape = {str(k): int(v) for k, v in items}
    for k, v in shape.items():
        if v < 1:
            raise ValueError(f"[{op}] mesh axis {k!r} has size {v}; sizes must be >= 1")
    return shape


@dataclasses.dataclass(frozen=True)
class ShardBytes:
    """How an array is laid out: local shape, bytes per device and over all devices."""

    local_shape: tuple[int, ...]
    bytes_per_device: int
    total_bytes: int  # summed over every device of the mesh (replicas counted)
    array_bytes: int  # one copy of the global array
    replication: int  # devices holding each element


def shard_bytes(shape, dtype, spec=None, *, mesh_shape=None, mesh=None) -> ShardBytes:
    """Local shape and bytes of ``shape``/``dtype`` sharded as ``spec`` over the mesh.

    An unsharded array (no ``spec``, or a spec of Nones) needs no mesh: it is priced as one
    device holding all of it.

    Example:
        >>> shard_bytes((1024, 1024), "bfloat16").bytes_per_device
        2097152
        >>> shard_bytes((128, 2048), "int8", (("X", "Y"), None), mesh_shape={"X": 2, "Y": 8, "Z": 2})
        ShardBytes(local_shape=(8, 2048), bytes_per_device=16384, total_bytes=524288, array_bytes=262144, replication=2)
    """
    dims = _check_shape("shard_bytes", shape)
    entries = _spec_entries("shard_bytes", spec, len(dims))
    if mesh is None and mesh_shape is None and not any(entries):
        mesh_shape = {}  # an unsharded array needs no mesh: one device holds all of it
    mshape = _mesh_shape("shard_bytes", mesh_shape, mesh)
    local = _local_dims("shard_bytes", dims, entries, mshape)
    n_dev = math.prod(mshape.values())
    per = math.prod(local) * itemsize(dtype)
    used = {a for e in entries for a in e}
    return ShardBytes(tuple(local), per, per * n_dev, math.prod(dims) * itemsize(dtype),
                      math.prod(v for k, v in mshape.items() if k not in used))



def _local_dims(op: str, dims, entries, mshape: dict) -> list[int]:
    """Each dim's size on one device under spec `entries` over a mesh of axis sizes `mshape`;
    ValueError for an axis the mesh lacks or a dim its axes do not divide."""
    local = []
    for d, e in zip(dims, entries):
        for a in e:
            if a not in mshape:
                raise ValueError(f"[{op}] spec axis {a!r} is not in the mesh axes {tuple(mshape)}")
        k = math.prod(mshape[a] for a in e)
        if d % k:
            raise ValueError(f"[{op}] dimension of size {d} is not divisible by {k} (axes {e})")
        local.append(d // k)
    return local

