"""Collectives inside shard_map, as ``jax.lax``, plus MPI-style rooted ones.

`axis_name` is a mesh axis name or a tuple of names (flattened major-to-minor). Every call
really moves the data between the virtual devices and is recorded in the ledger.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((4,), ("x",))
    >>> f = sl.shard_map(lambda a: sl.lax.all_gather(a, "x", tiled=True), mesh=mesh,
    ...                  in_specs=P("x"), out_specs=P())
    >>> np.asarray(f(np.arange(8.0))).tolist()
    [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
"""

from __future__ import annotations

import math

import numpy as np

from . import _core, _tree
from .dtypes import canonicalize
from .ledger import record
from .local_array import LocalArray, lift
from .shard_map import current_mesh


def _axes(axis_name, op: str):
    names = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    mesh = current_mesh(op, names[0] if names else None)
    if not names:
        raise ValueError(f"[{op}] axis_name is empty; name at least one mesh axis")
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"[{op}] axis names must be strings, got {n!r}")
        if n not in mesh.shape:
            raise NameError(f"unbound axis name: {n!r}. [{op}] the mesh has axes {mesh.axis_names}")
    if len(set(names)) != len(names):
        raise ValueError(f"[{op}] axis name repeated in {names}")
    return mesh, list(names)


def _no_groups(axis_index_groups, op):
    if axis_index_groups is not None:
        raise NotImplementedError(f"[{op}] axis_index_groups is not supported; use a mesh axis")


def _lift(v, mesh, op: str) -> LocalArray:
    """`v` as a LocalArray; a constant must be an array of a supported dtype (named in the error)."""
    if isinstance(v, LocalArray):
        return v
    return lift(canonicalize(np.asarray(v), op), mesh)


def _tree_map(fn, x):
    if isinstance(x, LocalArray):
        return fn(x)
    leaves, treedef = _tree.flatten(x, lambda v: isinstance(v, LocalArray))
    return _tree.unflatten(treedef, [fn(v) for v in leaves])


def _run(core_fn, mesh, x: LocalArray, *args) -> LocalArray:
    storage = x.storage
    if storage.dtype.kind in "iu" and storage.dtype.itemsize > 4:
        storage = canonicalize(storage, core_fn.__name__)  # int64 from numpy arithmetic → int32, as JAX
    out, event = core_fn(mesh._core, storage, *args)
    record(event, mesh)
    return LocalArray(out, mesh)


def axis_size(axis_name) -> int:
    """Number of devices along `axis_name` (product over a tuple of names)."""
    mesh, names = _axes(axis_name, "axis_size")
    return int(np.prod([mesh.shape[n] for n in names]))


def axis_index(axis_name) -> LocalArray:
    """Each device's int32 index along `axis_name` (major-to-minor over a tuple)."""
    mesh, names = _axes(axis_name, "axis_index")
    return LocalArray(_core.axis_index(mesh._core, names), mesh)


def _reduce_collective(x, axis_name, op: str, reduction: str):
    mesh, names = _axes(axis_name, op)
    n = math.prod(mesh.shape[a] for a in names)

    def one(v):
        if not isinstance(v, LocalArray):
            # A constant is invariant: psum multiplies by the group size, with no communication.
            arr = canonicalize(np.asarray(v), op)
            if isinstance(v, (int, float)):
                return v * n if reduction == "sum" else v  # stays weakly typed, as in JAX
            return arr * n if reduction == "sum" else arr
        if reduction == "mean" and v.dtype.kind in "iub":
            v = LocalArray(v.storage.astype(np.float32), mesh)
        return _run(_core.all_reduce, mesh, v, names, reduction)

    return _tree_map(one, x)


def psum(x, axis_name, *, axis_index_groups=None):
    """All-reduce sum over `axis_name`: every device gets the sum of all devices' values."""
    _no_groups(axis_index_groups, "psum")
    return _reduce_collective(x, axis_name, "psum", "sum")


def pmean(x, axis_name, *, axis_index_groups=None):
    """All-reduce mean over `axis_name`."""
    _no_groups(axis_index_groups, "pmean")
    return _reduce_collective(x, axis_name, "pmean", "mean")


def pmax(x, axis_name, *, axis_index_groups=None):
    """All-reduce max over `axis_name`."""
    _no_groups(axis_index_groups, "pmax")
    return _reduce_collective(x, axis_name, "pmax", "max")


def pmin(x, axis_name, *, axis_index_groups=None):
    """All-reduce min over `axis_name`."""
    _no_groups(axis_index_groups, "pmin")
    return _reduce_collective(x, axis_name, "pmin", "min")


def all_gather(x, axis_name, *, axis_index_groups=None, axis=0, tiled=False):
    """Gathers every device's value along `axis` (a new dim of the axis size unless tiled)."""
    _no_groups(axis_index_groups, "all_gather")
    mesh, names = _axes(axis_name, "all_gather")
    return _tree_map(lambda v: _run(_core.all_gather, mesh, _lift(v, mesh, "all_gather"), names, int(axis),
                                    bool(tiled)), x)


def psum_scatter(x, axis_name, *, scatter_dimension=0, axis_index_groups=None, tiled=False):
    """Reduce-scatter: sums over `axis_name` and leaves device i with chunk i of
    `scatter_dimension` (which must equal the axis size unless tiled)."""
    _no_groups(axis_index_groups, "psum_scatter")
    mesh, names = _axes(axis_name, "psum_scatter")
    return _tree_map(lambda v: _run(_core.psum_scatter, mesh, _lift(v, mesh, "psum_scatter"), names,
                                    int(scatter_dimension), bool(tiled)), x)


def all_to_all(x, axis_name, split_axis, concat_axis, *, axis_index_groups=None, tiled=False):
    """Splits `split_axis` into axis-size chunks, sends chunk j to device j, and concatenates
    the received chunks along `concat_axis` (shapes exactly as ``jax.lax.all_to_all``)."""
    _no_groups(axis_index_groups, "all_to_all")
    mesh, names = _axes(axis_name, "all_to_all")
    return _tree_map(lambda v: _run(_core.all_to_all, mesh, _lift(v, mesh, "all_to_all"), names,
                                    int(split_axis), int(concat_axis), bool(tiled)), x)


def ppermute(x, axis_name, perm):
    """Sends device src's value to device dst for each (src, dst) in `perm`; devices that
    receive nothing get zeros."""
    mesh, names = _axes(axis_name, "ppermute")
    try:
        pairs = [(int(s), int(d)) for s, d in perm]
    except (TypeError, ValueError):
        raise TypeError(f"[ppermute] perm must be a sequence of (source, destination) int pairs, "
                        f"got {perm!r}") from None
    return _tree_map(lambda v: _run(_core.ppermute, mesh, _lift(v, mesh, "ppermute"), names, pairs), x)


def pshuffle(x, axis_name, perm):
    """Device i receives the value of device perm[i] (perm must be a permutation)."""
    if sorted(perm) != list(range(len(perm))):
        raise ValueError(f"[pshuffle] perm {perm!r} is not a permutation of range({len(perm)})")
    return ppermute(x, axis_name, [(src, dst) for dst, src in enumerate(perm)])


def pvary(x, axis_name):
    """Marks `x` as varying along `axis_name` (no data moves; the values are unchanged)."""
    return pcast(x, axis_name, to="varying")


def pcast(x, axis_name, *, to="varying"):
    """Changes how `x` is typed along `axis_name`: to="varying" (as pvary) or "invariant"
    (which requires the value to already be the same on every device along the axes)."""
    mesh, names = _axes(axis_name, "pcast")
    idx = [mesh.axis_names.index(n) for n in names]

    def one(v):
        v = _lift(v, mesh, "pcast")
        s = v.storage
        if to == "varying":
            shape = tuple(mesh.axis_sizes[a] if a in idx else d for a, d in enumerate(s.shape[:mesh.ndim]))
            return LocalArray(np.broadcast_to(s, shape + s.shape[mesh.ndim:]), mesh)
        if to == "invariant":
            for a in idx:
                if s.shape[a] != 1 and not (s.strides[a] == 0 or (s == s[(slice(None),) * a + (slice(0, 1),)]).all()):
                    raise ValueError(f"[pcast] the value differs between devices along "
                                     f"{mesh.axis_names[a]!r}; psum or all_gather it first")
                s = s[(slice(None),) * a + (slice(0, 1),)]
            return LocalArray(s, mesh)
        raise ValueError(f"[pcast] to={to!r}; use 'varying' or 'invariant'")

    return _tree_map(one, x)


# -- MPI-style rooted collectives ------------------------------------------------------------

def broadcast(x, axis_name, root: int = 0):
    """Every device along `axis_name` gets device `root`'s value (MPI_Bcast)."""
    mesh, names = _axes(axis_name, "broadcast")
    return _tree_map(lambda v: _run(_core.broadcast, mesh, _lift(v, mesh, "broadcast"), names, int(root)),
                     x)


def reduce(x, axis_name, root: int = 0, op: str = "sum"):
    """Device `root` gets the reduction (op: sum, max, min, mean); the others hold zeros (MPI_Reduce)."""
    mesh, names = _axes(axis_name, "reduce")
    return _tree_map(lambda v: _run(_core.reduce, mesh, _lift(v, mesh, "reduce"), names, int(root), op), x)


def gather(x, axis_name, root: int = 0, *, axis=0, tiled=False):
    """Device `root` gets every device's value (as all_gather); the others hold zeros (MPI_Gather)."""
    mesh, names = _axes(axis_name, "gather")
    return _tree_map(lambda v: _run(_core.gather, mesh, _lift(v, mesh, "gather"), names, int(root), int(axis),
                                    bool(tiled)), x)


def scatter(x, axis_name, root: int = 0, *, scatter_dimension=0, tiled=False):
    """Device i gets chunk i of device `root`'s value along `scatter_dimension` (MPI_Scatter)."""
    mesh, names = _axes(axis_name, "scatter")
    return _tree_map(lambda v: _run(_core.scatter, mesh, _lift(v, mesh, "scatter"), names, int(root),
                                    int(scatter_dimension), bool(tiled)), x)


# -- per-device slicing (jax.lax.dynamic_slice family) ----------------------------------------

def _starts(start_indices, operand: LocalArray, op: str):
    if len(start_indices) != operand.ndim:
        raise ValueError(f"[{op}] {len(start_indices)} start indices for an operand of rank {operand.ndim}")
    mesh = operand.mesh
    starts = []
    for s in start_indices:
        v = lift(s, mesh)
        if v.ndim != 0 or v.dtype.kind not in "iu":
            raise TypeError(f"[{op}] start indices must be integer scalars, got {v.dtype} of shape {v.shape}")
        starts.append(v.storage.reshape(v.storage.shape[:mesh.ndim]))
    return starts


def _per_device(operand: LocalArray, starts, sizes, op: str):
    """Mesh shape of the result and, per device coordinate, the clamped slices (as JAX clamps)."""
    mesh = operand.mesh
    k = mesh.ndim
    shape = np.broadcast_shapes(operand.storage.shape[:k], *(s.shape for s in starts))
    for size, dim in zip(sizes, operand.shape):
        if not 0 <= size <= dim:
            raise ValueError(f"[{op}] slice size {size} does not fit in a dimension of size {dim}")
    starts = [np.broadcast_to(s, shape) for s in starts]
    for coords in np.ndindex(*shape):
        yield coords, tuple(slice(b, b + n) for b, n in
                            ((int(min(max(int(s[coords]), 0), dim - n)), n)
                             for s, n, dim in zip(starts, sizes, operand.shape)))


def dynamic_slice(operand, start_indices, slice_sizes):
    """``operand[start : start + size]`` per dimension, where starts may differ per device
    (LocalArray scalars, e.g. from axis_index); starts are clamped so the slice fits, as JAX.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((4,), ("x",))
        >>> f = sl.shard_map(lambda a: sl.lax.dynamic_slice(a, (sl.lax.axis_index("x") * 2,), (2,)),
        ...                  mesh=mesh, in_specs=P(), out_specs=P("x"))
        >>> np.asarray(f(np.arange(8))).tolist()
        [0, 1, 2, 3, 4, 5, 6, 7]
    """
    mesh = current_mesh("dynamic_slice")
    x = lift(operand, mesh)
    starts = _starts(start_indices, x, "dynamic_slice")
    sizes = tuple(int(n) for n in slice_sizes)
    if len(sizes) != x.ndim:
        raise ValueError(f"[dynamic_slice] {len(sizes)} slice sizes for an operand of rank {x.ndim}")
    blocks = list(_per_device(x, starts, sizes, "dynamic_slice"))
    shape = np.broadcast_shapes(x.storage.shape[:mesh.ndim], *(s.shape for s in starts))
    out = np.empty(shape + sizes, dtype=x.dtype)
    k = mesh.ndim
    for coords, idx in blocks:
        src = tuple(c if d != 1 else 0 for c, d in zip(coords, x.storage.shape[:k]))
        out[coords] = x.storage[src][idx]
    return LocalArray(out, mesh)


def dynamic_update_slice(operand, update, start_indices):
    """A copy of `operand` with `update` written at `start_indices` (per device, clamped)."""
    mesh = current_mesh("dynamic_update_slice")
    x, u = lift(operand, mesh), lift(update, mesh)
    if u.ndim != x.ndim:
        raise ValueError(f"[dynamic_update_slice] update of rank {u.ndim} for an operand of rank {x.ndim}")
    starts = _starts(start_indices, x, "dynamic_update_slice")
    k = mesh.ndim
    shape = np.broadcast_shapes(x.storage.shape[:k], u.storage.shape[:k], *(s.shape for s in starts))
    out = np.array(np.broadcast_to(x.storage, shape + x.shape), dtype=np.result_type(x.dtype, u.dtype))
    for coords, idx in _per_device(LocalArray(out, mesh), starts, u.shape, "dynamic_update_slice"):
        src = tuple(c if d != 1 else 0 for c, d in zip(coords, u.storage.shape[:k]))
        out[coords][idx] = u.storage[src]
    return LocalArray(out.astype(x.dtype, copy=False), mesh)


def dynamic_slice_in_dim(operand, start_index, slice_size, axis=0):
    """dynamic_slice along one axis."""
    mesh = current_mesh("dynamic_slice_in_dim")
    x = lift(operand, mesh)
    axis = axis % x.ndim
    starts = [0] * x.ndim
    starts[axis] = start_index
    sizes = list(x.shape)
    sizes[axis] = slice_size
    return dynamic_slice(x, starts, sizes)


def dynamic_update_slice_in_dim(operand, update, start_index, axis):
    """dynamic_update_slice along one axis."""
    mesh = current_mesh("dynamic_update_slice_in_dim")
    x = lift(operand, mesh)
    axis = axis % x.ndim
    starts = [0] * x.ndim
    starts[axis] = start_index
    return dynamic_update_slice(x, update, starts)


def fori_loop(lower, upper, body_fun, init_val):
    """``for i in range(lower, upper): val = body_fun(i, val)``, as jax.lax.fori_loop (values
    are concrete here, so this is a Python loop; every collective inside is still recorded)."""
    val = init_val
    for i in range(int(lower), int(upper)):
        val = body_fun(i, val)
    return val
