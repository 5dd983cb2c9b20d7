"""One element of a mapped axis, and elements stacked back along it: what ``vmap`` and
``lax.scan`` / ``lax.map`` do to their inputs and outputs, for every kind of array.

- per-device values (LocalArray, inside shard_map or under grad): ``x[..., i]`` and
  ``jnp.stack``, both recorded primitives, so a gradient flows through them;
- global ShardedArrays whose mapped dim is not sharded: the same ops run shard by shard
  inside one shard_map (no collective, differentiable);
- global ShardedArrays whose mapped dim is sharded: element ``i`` is read from the devices that
  hold it and treated as the same on every device along the mapped axis's mesh axes (each
  device really computes only its own elements; nothing moves), and the stacked result is
  sharded over those axes again. This path is not differentiable;
- host values (numpy arrays, Python numbers): numpy indexing and ``np.stack`` in JAX's
  canonical dtypes (float32 / int32 with x64 off).

Example:
    >>> import numpy as np
    >>> from shardlab._src.ops import batch_axis
    >>> x = np.arange(6.0).reshape(2, 3)
    >>> batch_axis.take(x, 1, 1).tolist(), batch_axis.stack([x[0], x[1]], 1).shape
    ([1.0, 4.0], (3, 2))
"""

from __future__ import annotations

import math

import numpy as np

from ..arrays.host_array import as_host
from ..arrays.layout import storage_shape
from ..arrays.local_array import LocalArray
from ..arrays.sharded_array import ShardedArray, device_put
from ..arrays.storage import AbstractStorage, is_abstract
from ..core.context import CTX
from ..core.dtypes import bfloat16, canonicalize
from ..core.sharding import NamedSharding, P
from . import numpy as jnp

_shard_map = None   # shardlab.shard_map: register_shard_map


def register_shard_map(shard_map) -> None:
    """The ``shard_map`` this module runs per-device functions in; ``transforms/vmap.py``
    registers it (the transforms layer sits above this one)."""
    global _shard_map
    _shard_map = shard_map


def is_array(x) -> bool:
    """True for the values a mapped axis can be taken from."""
    return isinstance(x, (LocalArray, ShardedArray, np.ndarray, np.generic, bool, int, float, complex))


def as_array(x, op: str):
    """`x` as an array: per-device and global values as they are, host values canonical
    HostArrays (a Python scalar weakly typed, as JAX's)."""
    if isinstance(x, (LocalArray, ShardedArray)):
        return x
    try:
        arr = np.asarray(x)
    except Exception as e:  # noqa: BLE001
        raise TypeError(f"[{op}] {type(x).__name__} is not an array: {e}") from None
    if arr.dtype == object:
        raise TypeError(f"[{op}] a leaf of type {type(x).__name__} is not an array ({x!r:.60})")
    return as_host(canonicalize(arr, op), weak=type(x) in (int, float))  # JAX's one-device Array


def shape_of(x) -> tuple:
    return tuple(x.shape) if isinstance(x, (LocalArray, ShardedArray, np.ndarray, np.generic)) else np.shape(x)


def dtype_of(x) -> np.dtype:
    if isinstance(x, (LocalArray, ShardedArray)):
        return np.dtype(x.dtype)
    return as_array(x, "dtype").dtype


def type_str(x) -> str:
    """JAX's short type: ``float32[8,4]``."""
    dt = dtype_of(x)
    name = "bfloat16" if dt == bfloat16 else dt.name
    return f"{name}[{','.join(str(s) for s in shape_of(x))}]"


def _spec_entries(x: ShardedArray) -> list:
    return [tuple(e) for e in x.sharding.spec.normalized(x.ndim)]


def _entry(axes):
    return None if not axes else (axes[0] if len(axes) == 1 else tuple(axes))


def _live(x) -> bool:
    return any(id(x) in t.live for t in CTX.tapes)


def take(x, i: int, axis: int, op: str = "vmap"):
    """Element `i` of `x` along `axis` (the axis removed)."""
    if isinstance(x, LocalArray):
        return x[(slice(None),) * axis + (i,)]
    if isinstance(x, ShardedArray):
        return _take_global(x, i, axis, op)
    arr = as_array(x, op)
    return arr[(slice(None),) * axis + (i,)]


def _take_global(x: ShardedArray, i: int, axis: int, op: str) -> ShardedArray:
    if x.unreduced:
        raise ValueError(f"[{op}] the array is unreduced along {sorted(x.unreduced)}; reshard it first")
    entries = _spec_entries(x)
    mesh = x.sharding.mesh
    rest = P(*[_entry(e) for d, e in enumerate(entries) if d != axis], reduced=x.sharding.spec.reduced)
    if not entries[axis]:
        key = (slice(None),) * axis + (i,)
        return _shard_map(lambda v: v[key], mesh=mesh, in_specs=(P(*[_entry(e) for e in entries]),),
                              out_specs=rest)(x)
    if _live(x):
        raise NotImplementedError(
            f"[{op}] differentiating through a mapped dim that is sharded over {entries[axis]} is not "
            f"supported; reshard the array so dim {axis} is unsharded (shardlab.reshard), or map inside "
            f"shard_map")
    # Element i sits on the devices whose coordinates along the mapped axes select its block.
    sizes = [mesh.shape[a] for a in entries[axis]]
    per_block = x.shape[axis] // math.prod(sizes)
    block, local = divmod(i, per_block)
    coords = np.unravel_index(block, sizes) if sizes else ()
    names = list(mesh.axis_names)
    idx = [slice(None)] * len(names)
    for a, c in zip(entries[axis], coords):
        idx[names.index(a)] = slice(int(c), int(c) + 1)
    idx += [slice(None)] * axis + [local]
    st = x._storage
    if is_abstract(st):
        shape = [1 if isinstance(s, slice) and s != slice(None) else n for s, n in zip(idx, st.shape)]
        storage = AbstractStorage(tuple(shape[:len(names)]) + tuple(
            n for d, n in enumerate(st.shape[len(names):]) if d != axis), st.dtype)
    else:
        storage = st[tuple(idx)]
    shape = tuple(s for d, s in enumerate(x.shape) if d != axis)
    return ShardedArray(storage, NamedSharding(mesh, rest), shape)


def stack(values: list, axis: int, batch_axes: tuple = (), op: str = "vmap"):
    """`values` stacked along a new `axis`; for global values, the new dim is sharded over
    `batch_axes` (the mesh axes the mapped input dim was sharded over) when given."""
    if any(isinstance(v, ShardedArray) for v in values):
        return _stack_global(values, axis, tuple(batch_axes), op)
    if any(isinstance(v, LocalArray) for v in values):
        return jnp.stack(values, axis=axis)
    return as_host(np.stack([as_array(v, op) for v in values], axis=axis))  # JAX's one-device Array


def _stack_global(values: list, axis: int, batch_axes: tuple, op: str) -> ShardedArray:
    ref = next(v for v in values if isinstance(v, ShardedArray))
    mesh = ref.sharding.mesh
    vals = []
    for v in values:
        if not isinstance(v, ShardedArray) or v.sharding != ref.sharding or v.unreduced:
            v = device_put(np.asarray(v) if isinstance(v, ShardedArray) else as_array(v, op), ref.sharding)
        vals.append(v)
    entries = [_entry(e) for e in _spec_entries(ref)]
    out_entries = entries[:axis] + [None] + entries[axis:]
    spec = P(*entries)
    out = _shard_map(lambda *vs: jnp.stack(list(vs), axis=axis), mesh=mesh, in_specs=(spec,) * len(vals),
                         out_specs=P(*out_entries))(*vals)
    used = set(ref.sharding.spec.mesh_axes())
    if batch_axes and not used & set(batch_axes):
        out_entries[axis] = _entry(batch_axes)
        if out.is_abstract:
            target = NamedSharding(mesh, P(*out_entries))
            return ShardedArray(AbstractStorage(storage_shape(out.shape, target), out.dtype), target, out.shape)
        out = device_put(np.asarray(out), NamedSharding(mesh, P(*out_entries)))
    return out
