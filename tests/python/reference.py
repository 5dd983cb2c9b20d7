"""Definition-level numpy references for the collectives, written from JAX's documented
semantics and independent of shardlab's implementation.

A per-device value is an ndarray ``vals`` of shape ``mesh_shape + local_shape``:
``vals[c]`` is the value held by the device at mesh coordinate ``c``. Every function loops
over devices and, for each, over the members of its group, exactly as the definitions read:
the group of a device along axes ``names`` is the set of devices that differ from it only in
those axes, ordered by the flattened index of ``names`` taken major-to-minor (the first name
is the most major).

Example:
    >>> import numpy as np
    >>> vals = np.arange(4.0).reshape(2, 2, 1)          # mesh (2, 2), local shape (1,)
    >>> psum(vals, ("x", "y"), "x")[:, :, 0].tolist()    # sums over x, per y
    [[2.0, 4.0], [2.0, 4.0]]
"""

from __future__ import annotations

import itertools

import numpy as np


def _names(axis_name) -> tuple:
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _devices(mesh_shape):
    return itertools.product(*(range(s) for s in mesh_shape))


def group(coord, mesh_names, mesh_shape, axis_name):
    """(index of `coord` in its group, list of the group's coords in group order)."""
    names = _names(axis_name)
    pos = [mesh_names.index(n) for n in names]
    sizes = [mesh_shape[p] for p in pos]
    members = []
    for sub in itertools.product(*(range(s) for s in sizes)):  # first name varies slowest
        c = list(coord)
        for p, v in zip(pos, sub):
            c[p] = v
        members.append(tuple(c))
    index = 0
    for p, s in zip(pos, sizes):
        index = index * s + coord[p]
    return index, members


def group_size(mesh_names, mesh_shape, axis_name) -> int:
    return int(np.prod([mesh_shape[mesh_names.index(n)] for n in _names(axis_name)]))


def _per_device(vals, mesh_names, fn):
    """Applies fn(coord) → local ndarray on every device and stacks the results."""
    mesh_shape = vals.shape[: len(mesh_names)]
    outs = {c: np.asarray(fn(c)) for c in _devices(mesh_shape)}
    first = next(iter(outs.values()))
    out = np.empty(tuple(mesh_shape) + first.shape, first.dtype)
    for c, v in outs.items():
        out[c] = v
    return out


def _mesh_shape(vals, mesh_names):
    return tuple(vals.shape[: len(mesh_names)])


# -- all-reduce ---------------------------------------------------------------------------
def _reduce_values(values, op: str, dtype):
    """Reduces in float64 (exact for the small integers the tests use), then casts back."""
    wide = np.stack([np.asarray(v).astype(np.float64) for v in values])
    if op == "sum":
        r = wide.sum(0)
    elif op == "max":
        r = wide.max(0)
    elif op == "min":
        r = wide.min(0)
    elif op == "mean":
        r = wide.mean(0)
        # pmean is psum / n: integer inputs give floating output (float32 without x64).
        dtype = np.float32 if np.dtype(dtype).kind in "iub" else dtype
    else:
        raise ValueError(op)
    return r.astype(dtype)


def all_reduce(vals, mesh_names, axis_name, op: str = "sum"):
    mesh_shape = _mesh_shape(vals, mesh_names)
    return _per_device(vals, mesh_names, lambda c: _reduce_values(
        [vals[m] for m in group(c, mesh_names, mesh_shape, axis_name)[1]], op, vals.dtype))


def psum(vals, mesh_names, axis_name):
    return all_reduce(vals, mesh_names, axis_name, "sum")


def pmean(vals, mesh_names, axis_name):
    return all_reduce(vals, mesh_names, axis_name, "mean")


def pmax(vals, mesh_names, axis_name):
    return all_reduce(vals, mesh_names, axis_name, "max")


def pmin(vals, mesh_names, axis_name):
    return all_reduce(vals, mesh_names, axis_name, "min")


# -- gathers and scatters -----------------------------------------------------------------
def _gathered(values, axis: int, tiled: bool):
    # untiled: a new dim of the group size at `axis`; tiled: concatenated along `axis`.
    return np.concatenate(values, axis=axis) if tiled else np.stack(values, axis=axis)


def all_gather(vals, mesh_names, axis_name, axis: int = 0, tiled: bool = False):
    mesh_shape = _mesh_shape(vals, mesh_names)
    return _per_device(vals, mesh_names, lambda c: _gathered(
        [vals[m] for m in group(c, mesh_names, mesh_shape, axis_name)[1]], axis, tiled))


def _chunk(value, i: int, n: int, dim: int, tiled: bool):
    """Chunk i of `value` along `dim`: one of n equal pieces (tiled) or index i (untiled,
    where the dim must equal n and disappears)."""
    if tiled:
        assert value.shape[dim] % n == 0
        return np.split(value, n, axis=dim)[i]
    assert value.shape[dim] == n
    return np.take(value, i, axis=dim)


def psum_scatter(vals, mesh_names, axis_name, scatter_dimension: int = 0, tiled: bool = False):
    mesh_shape = _mesh_shape(vals, mesh_names)
    n = group_size(mesh_names, mesh_shape, axis_name)

    def one(c):
        i, members = group(c, mesh_names, mesh_shape, axis_name)
        total = _reduce_values([vals[m] for m in members], "sum", vals.dtype)
        return _chunk(total, i, n, scatter_dimension, tiled)

    return _per_device(vals, mesh_names, one)


def all_to_all(vals, mesh_names, axis_name, split_axis: int, concat_axis: int, tiled: bool = False):
    """Device i receives chunk i of every device j's split_axis and puts the chunk from j
    j-th along concat_axis (untiled: split_axis has size n and is removed, and a new dim of
    size n is inserted at concat_axis of what remains, as jax.lax.all_to_all)."""
    mesh_shape = _mesh_shape(vals, mesh_names)
    n = group_size(mesh_names, mesh_shape, axis_name)

    def one(c):
        i, members = group(c, mesh_names, mesh_shape, axis_name)
        received = [_chunk(vals[m], i, n, split_axis, tiled) for m in members]
        return _gathered(received, concat_axis, tiled)

    return _per_device(vals, mesh_names, one)


def ppermute(vals, mesh_names, axis_name, perm):
    """Device with group index dst gets the value of group index src for (src, dst) in perm;
    devices no pair sends to get zeros."""
    mesh_shape = _mesh_shape(vals, mesh_names)
    source = {d: s for s, d in perm}

    def one(c):
        i, members = group(c, mesh_names, mesh_shape, axis_name)
        if i not in source:
            return np.zeros(vals.shape[len(mesh_names):], vals.dtype)
        return vals[members[source[i]]]

    return _per_device(vals, mesh_names, one)


def axis_index(mesh_names, mesh_shape, axis_name):
    """int32 per device: its index in the group along `axis_name` (mesh_shape + ())."""
    out = np.empty(tuple(mesh_shape), np.int32)
    for c in _devices(mesh_shape):
        out[c] = group(c, mesh_names, mesh_shape, axis_name)[0]
    return out


# -- MPI-style rooted collectives ---------------------------------------------------------
def broadcast(vals, mesh_names, axis_name, root: int = 0):
    mesh_shape = _mesh_shape(vals, mesh_names)
    return _per_device(vals, mesh_names,
                       lambda c: vals[group(c, mesh_names, mesh_shape, axis_name)[1][root]])


def reduce(vals, mesh_names, axis_name, root: int = 0, op: str = "sum"):
    """The root gets the reduction; every other device holds zeros."""
    full = all_reduce(vals, mesh_names, axis_name, op)
    mesh_shape = _mesh_shape(vals, mesh_names)
    return _per_device(vals, mesh_names, lambda c: full[c] if group(
        c, mesh_names, mesh_shape, axis_name)[0] == root else np.zeros_like(full[c]))


def gather(vals, mesh_names, axis_name, root: int = 0, axis: int = 0, tiled: bool = False):
    """The root gets the all_gather result; every other device holds zeros."""
    full = all_gather(vals, mesh_names, axis_name, axis, tiled)
    mesh_shape = _mesh_shape(vals, mesh_names)
    return _per_device(vals, mesh_names, lambda c: full[c] if group(
        c, mesh_names, mesh_shape, axis_name)[0] == root else np.zeros_like(full[c]))


def scatter(vals, mesh_names, axis_name, root: int = 0, scatter_dimension: int = 0, tiled: bool = False):
    """Group index i gets chunk i of the root's value along scatter_dimension."""
    mesh_shape = _mesh_shape(vals, mesh_names)
    n = group_size(mesh_names, mesh_shape, axis_name)

    def one(c):
        i, members = group(c, mesh_names, mesh_shape, axis_name)
        return _chunk(vals[members[root]], i, n, scatter_dimension, tiled)

    return _per_device(vals, mesh_names, one)


# -- global arrays ------------------------------------------------------------------------
def shard_index(coord, mesh_names, mesh_shape, spec, global_shape):
    """The tuple of slices of the global array that the device at `coord` holds under
    `spec` (entries None, a name, or a tuple of names major-to-minor), as
    jax.sharding.NamedSharding.devices_indices_map."""
    idx = []
    for d, size in enumerate(global_shape):
        entry = spec[d] if d < len(spec) else None
        names = () if entry is None else _names(entry)
        if not names:
            idx.append(slice(None))
            continue
        k, _ = group(coord, mesh_names, mesh_shape, names)
        n = group_size(mesh_names, mesh_shape, names)
        step = size // n
        idx.append(slice(k * step, (k + 1) * step))
    return tuple(idx)


def replica_id(coord, mesh_names, mesh_shape, spec):
    """Index of the device among those holding the same shard: its flattened coordinate
    along the mesh axes the spec does not use (in mesh order)."""
    used = {n for e in spec if e is not None for n in _names(e)}
    free = [n for n in mesh_names if n not in used]
    return group(coord, mesh_names, mesh_shape, free)[0] if free else 0
