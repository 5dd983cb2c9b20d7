"""Collectives inside shard_map, as ``jax.lax``, plus MPI-style rooted ones.

`axis_name` is a mesh axis name or a tuple of names (flattened major-to-minor). Every call
really moves the data between the virtual devices and is recorded in the ledger; every
call is differentiable (the transposes are JAX's).

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

import contextlib
import math
import warnings

import numpy as np

from ..arrays.local_array import LocalArray, lift
from ..core import tree
from ..core.context import CTX, current_shard_map_mesh
from ..core.dtypes import bfloat16, canonicalize
from ..primitives import collectives as col
from ..primitives import grouped as gp
from ..primitives import structural as st
from ..primitives.primitive import bind
from . import numpy as jnp
from .numpy.sorting import top_k  # noqa: F401  (jax.lax.top_k)


_AXES: dict = {}  # (mesh axis names, axis_name, manual axes) -> the validated tuple of names

# The manual axes of each running shard_map body, innermost last (pushed by shard_map beside
# its mesh frame; a partially manual shard_map binds only its `axis_names`).
MANUAL: list = []


def _manual():
    """The manual axes of the innermost shard_map, or None when all of its mesh's axes are."""
    if MANUAL and len(MANUAL) == len(CTX.meshes):
        return MANUAL[-1]
    return None


@contextlib.contextmanager
def manual_axes(axes):
    """Marks `axes` as the manual axes while a shard_map body runs (inside its mesh frame)."""
    MANUAL.append(frozenset(axes) if axes is not None else None)
    try:
        yield
    finally:
        MANUAL.pop()


def _axes(axis_name, op: str):
    meshes = CTX.meshes
    mesh = meshes[-1] if meshes else None
    manual = _manual()
    if mesh is not None and type(axis_name) is str:
        names = _AXES.get((mesh.axis_names, axis_name, manual))
        if names is not None:
            return mesh, names
    names = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    mesh = current_shard_map_mesh(op, names[0] if names else None)
    if not names:
        raise ValueError(f"[{op}] axis_name is empty; name at least one mesh axis")
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"[{op}] axis names must be strings, got {n!r}")
        if n not in mesh.shape:
            raise NameError(f"unbound axis name: {n!r}. [{op}] the mesh has axes {mesh.axis_names}")
        if manual is not None and n not in manual:
            raise NameError(f"Found an unbound axis name: {n}. [{op}] {n!r} is not a manual axis of this "
                            f"shard_map (axis_names={sorted(manual)}): add it to axis_names, or nest a "
                            f"shard_map over it")
    if len(set(names)) != len(names):
        raise ValueError(f"[{op}] axis name repeated in {names}")
    if type(axis_name) is str:
        _AXES[(mesh.axis_names, axis_name, manual)] = names
    return mesh, names


# Dtypes a collective takes as they are (native byte order, at most 32-bit integers).
_NATIVE_OK = frozenset(np.dtype(t) for t in (np.float32, np.float16, np.int32, np.int16, np.int8, np.uint8, np.uint16,
                                             np.uint32, np.bool_)) | {bfloat16}


def _groups(axis_index_groups, mesh, names, op: str, *, equal: bool = True):
    """`axis_index_groups` as a tuple of tuples of ints covering the devices along `names`
    exactly once (None stays None)."""
    if axis_index_groups is None:
        return None
    n = math.prod(mesh.shape[a] for a in names)
    try:
        groups = tuple(tuple(_int(i, "an axis index", op) for i in grp) for grp in axis_index_groups)
    except TypeError:
        raise TypeError(f"[{op}] axis_index_groups must be a list of lists of axis indices, got "
                        f"{axis_index_groups!r}") from None
    if not groups or sorted(i for grp in groups for i in grp) != list(range(n)):
        raise ValueError(f"axis_index_groups must cover all indices exactly once. [{op}] got {axis_index_groups!r} "
                         f"for the {n} devices along {names}")
    if equal and len({len(grp) for grp in groups}) != 1:
        raise ValueError(f"[{op}] axis_index_groups {axis_index_groups!r} must all have the same size")
    return groups


def _int(value, name: str, op: str) -> int:
    """`value` as an int; floats, strings and bools are rejected (as JAX rejects them)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"[{op}] {name} must be an int, got {value!r}")
    if not -2**31 <= value < 2**31:  # no rank, axis size or index is this large
        raise ValueError(f"[{op}] {name} {value} is out of range")
    return int(value)


def _root(root, mesh, names, op: str) -> int:
    """`root` as an int index along `names` (checked here, so the core never sees an index it
    cannot hold)."""
    root = _int(root, "root", op)
    n = math.prod(mesh.shape[a] for a in names)
    if not 0 <= root < n:
        raise ValueError(f"[{op}] root {root} is outside [0, {n}), the devices along {names}")
    return root


def _lift(v, mesh, op: str) -> LocalArray:
    """`v` as a LocalArray of a supported dtype (int64 → int32 as JAX with x64 off)."""
    if type(v) is LocalArray and v.dtype in _NATIVE_OK:
        return v
    if isinstance(v, LocalArray):
        if v.dtype.kind in "iu" and v.dtype.itemsize > 4:
            return jnp.astype(v, np.int32)
        if not v.dtype.isnative:
            return jnp.astype(v, v.dtype.newbyteorder("="))
        return v
    arr = np.asarray(v)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return lift(canonicalize(arr, op), mesh)


def _tree_map(fn, x):
    if isinstance(x, LocalArray):
        return fn(x)
    leaves, treedef = tree.flatten(x, lambda v: isinstance(v, LocalArray))
    return tree.unflatten(treedef, [fn(v) for v in leaves])


def axis_size(axis_name) -> int:
    """Number of devices along `axis_name` (product over a tuple of names)."""
    mesh, names = _axes(axis_name, "axis_size")
    return int(math.prod(mesh.shape[n] for n in names))


def axis_index(axis_name) -> LocalArray:
    """Each device's int32 index along `axis_name` (major-to-minor over a tuple)."""
    mesh, names = _axes(axis_name, "axis_index")
    return bind(col.AXIS_INDEX, [], mesh, axes=names)


def _reduce_collective(x, axis_name, op: str, reduction: str, axis_index_groups=None):
    mesh, names = _axes(axis_name, op)
    groups = _groups(axis_index_groups, mesh, names, op, equal=False)
    if groups is not None:
        def grouped(v):
            if not isinstance(v, LocalArray) and isinstance(v, (int, float)) and not isinstance(v, bool):
                return v * len(groups[0]) if reduction == "sum" else v  # a constant: no communication, as JAX
            return bind(gp.GROUPED_PSUM, [_lift(v, mesh, op)], mesh, axes=names, groups=groups, reduction=reduction)

        return _tree_map(grouped, x)
    if type(x) is LocalArray:  # the common case, without the pytree walk
        return bind(col.PSUM, [_lift(x, mesh, op)], mesh, axes=names, reduction=reduction)
    n = math.prod(mesh.shape[a] for a in names)

    def one(v):
        if not isinstance(v, LocalArray) and isinstance(v, (int, float)) and not isinstance(v, bool):
            # A constant is invariant: psum multiplies by the group size, with no communication.
            return v * n if reduction == "sum" else v  # stays weakly typed, as in JAX
        return bind(col.PSUM, [_lift(v, mesh, op)], mesh, axes=names, reduction=reduction)

    return _tree_map(one, x)


def psum(x, axis_name, *, axis_index_groups=None):
    """All-reduce sum over `axis_name`: every device gets the sum of all devices' values
    (of the devices of its group, with ``axis_index_groups``)."""
    return _reduce_collective(x, axis_name, "psum", "sum", axis_index_groups)


def pmean(x, axis_name, *, axis_index_groups=None):
    """All-reduce mean over `axis_name` (integers give float32, as JAX)."""
    return _reduce_collective(x, axis_name, "pmean", "mean", axis_index_groups)


def pmax(x, axis_name, *, axis_index_groups=None):
    """All-reduce max over `axis_name`."""
    return _reduce_collective(x, axis_name, "pmax", "max", axis_index_groups)


def pmin(x, axis_name, *, axis_index_groups=None):
    """All-reduce min over `axis_name`."""
    return _reduce_collective(x, axis_name, "pmin", "min", axis_index_groups)


_AG_TO = ("varying", "reduced", "invarying")


def all_gather(x, axis_name, *, axis_index_groups=None, axis=0, tiled=False, to="varying"):
    """Gathers every device's value along `axis` (a new dim of the axis size unless tiled).

    ``to`` is JAX's output type along the axes: 'varying' (the default), 'invarying' or
    'reduced'. The values are the same for all three (every device holds the gathered array).
    """
    if to not in _AG_TO:
        raise ValueError(f"Got unexpected `to` value for `jax.lax.all_gather`. Allowed `to` values are: "
                         f"{set(_AG_TO)}")
    mesh, names = _axes(axis_name, "all_gather")
    groups = _groups(axis_index_groups, mesh, names, "all_gather")
    if groups is not None and to != "varying":
        raise NotImplementedError(f"[all_gather] axis_index_groups with to={to!r} is not supported (as in JAX); "
                                  f"use to='varying'")
    axis = _int(axis, "axis", "all_gather")
    if groups is not None:
        return _tree_map(lambda v: bind(gp.GROUPED_ALL_GATHER, [_lift(v, mesh, "all_gather")], mesh, axes=names,
                                        groups=groups, axis=axis, tiled=bool(tiled)), x)
    return _tree_map(lambda v: bind(col.ALL_GATHER, [_lift(v, mesh, "all_gather")], mesh, axes=names,
                                    axis=axis, tiled=bool(tiled)), x)


def psum_scatter(x, axis_name, *, scatter_dimension=0, axis_index_groups=None, tiled=False):
    """Reduce-scatter: sums over `axis_name` and leaves device i with chunk i of
    `scatter_dimension` (which must equal the axis size unless tiled)."""
    mesh, names = _axes(axis_name, "psum_scatter")
    groups = _groups(axis_index_groups, mesh, names, "psum_scatter")
    dim = _int(scatter_dimension, "scatter_dimension", "psum_scatter")
    if groups is not None:
        return _tree_map(lambda v: bind(gp.GROUPED_PSUM_SCATTER, [_lift(v, mesh, "psum_scatter")], mesh,
                                        axes=names, groups=groups, dim=dim, tiled=bool(tiled)), x)
    return _tree_map(lambda v: bind(col.PSUM_SCATTER, [_lift(v, mesh, "psum_scatter")], mesh, axes=names,
                                    dim=dim, tiled=bool(tiled)), x)


def all_to_all(x, axis_name, split_axis, concat_axis, *, axis_index_groups=None, tiled=False):
    """Splits `split_axis` into axis-size chunks, sends chunk j to device j, and concatenates
    the received chunks along `concat_axis` (shapes exactly as ``jax.lax.all_to_all``)."""
    mesh, names = _axes(axis_name, "all_to_all")
    groups = _groups(axis_index_groups, mesh, names, "all_to_all")
    split = _int(split_axis, "split_axis", "all_to_all")
    concat = _int(concat_axis, "concat_axis", "all_to_all")
    if groups is not None:
        return _tree_map(lambda v: bind(gp.GROUPED_ALL_TO_ALL, [_lift(v, mesh, "all_to_all")], mesh, axes=names,
                                        groups=groups, split=split, concat=concat, tiled=bool(tiled)), x)
    return _tree_map(lambda v: bind(col.ALL_TO_ALL, [_lift(v, mesh, "all_to_all")], mesh, axes=names,
                                    split=split, concat=concat, tiled=bool(tiled)), x)


def pswapaxes(x, axis_name, axis, *, axis_index_groups=None):
    """Swaps the mapped axis `axis_name` with the local axis `axis` (whose size must be the
    axis size): ``all_to_all(x, axis_name, axis, axis)``, as ``jax.lax.pswapaxes``."""
    return all_to_all(x, axis_name, axis, axis, axis_index_groups=axis_index_groups)


def ppermute(x, axis_name, perm):
    """Sends device src's value to device dst for each (src, dst) in `perm`; devices that
    receive nothing get zeros."""
    mesh, names = _axes(axis_name, "ppermute")
    n = math.prod(mesh.shape[a] for a in names)
    label = repr(names[0]) if len(names) == 1 else repr(names)
    pairs = []
    try:
        for pair in perm:
            src, dst = pair
            if any(isinstance(i, bool) or not isinstance(i, (int, np.integer)) for i in (src, dst)):
                raise TypeError
            pairs.append((int(src), int(dst)))
    except (TypeError, ValueError):
        raise TypeError(f"[ppermute] perm must be a sequence of (source, destination) int pairs, "
                        f"got {perm!r}") from None
    for pair in pairs:
        for i in pair:
            if not 0 <= i < n:
                raise ValueError(f"[ppermute] index {i} in perm pair {pair} is outside [0, {n}), the size of {label}")
    pairs = tuple(pairs)
    return _tree_map(lambda v: bind(col.PPERMUTE, [_lift(v, mesh, "ppermute")], mesh, axes=names, perm=pairs), x)


def pshuffle(x, axis_name, perm):
    """Device i receives the value of device perm[i] (perm must be a permutation)."""
    if sorted(perm) != list(range(len(perm))):
        raise ValueError(f"[pshuffle] perm {perm!r} is not a permutation of range({len(perm)})")
    return ppermute(x, axis_name, [(src, dst) for dst, src in enumerate(perm)])


_PVARY_MSG = ("jax.lax.pvary was deprecated in JAX v0.8.2 and removed in JAX v0.10.0; "
              "use `jax.lax.pcast(..., to='varying')")


def pvary(x, axis_name):
    """Deprecated (removed from JAX in v0.10.0): ``pcast(x, axis_name, to='varying')``."""
    warnings.warn(_PVARY_MSG, DeprecationWarning, stacklevel=2)
    return pcast(x, axis_name, to="varying")


_PCAST_TO = ("varying", "reduced", "unreduced")


def pcast(x, axis_name, *, to):
    """Changes how `x` is typed along `axis_name`, as ``jax.lax.pcast``; no data moves.

    - ``to='varying'``: an invariant value becomes per-device (its transpose is a psum);
    - ``to='reduced'``: an invariant value stays replicated; its cotangent is left unreduced
      (per-device partial sums) instead of being summed;
    - ``to='unreduced'``: each device's value is taken as a partial sum of the global value
      (a later psum adds them up).

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((2,), ("x",))
        >>> f = sl.shard_map(lambda a: sl.lax.pcast(a, "x", to="varying") * sl.lax.axis_index("x"),
        ...                  mesh=mesh, in_specs=P(), out_specs=P("x"))
        >>> np.asarray(f(np.ones(2, np.float32))).tolist()
        [0.0, 0.0, 1.0, 1.0]
    """
    if isinstance(axis_name, (set, frozenset)):
        raise TypeError(f"axis_name={axis_name!r} must be a tuple or a str. Got {axis_name}")
    if not axis_name:
        return x
    if to not in _PCAST_TO:
        raise ValueError(f"Got unexpected `to` value. Allowed `to` values are: {set(_PCAST_TO)}")
    mesh, names = _axes(axis_name, "pcast")
    if to == "reduced":  # from invariant only: a value that differs between devices cannot be reduced
        def one(v):
            v = _lift(v, mesh, "pcast")
            if not any(a in v.varying_axes for a in names):
                return v
            return bind(col.PCAST, [v], mesh, axes=names, to="invariant")  # checks the values agree
        return _tree_map(one, x)
    return _tree_map(lambda v: bind(col.PCAST, [_lift(v, mesh, "pcast")], mesh, axes=names, to="varying"), x)


def pbroadcast(x, axis_name, source):
    """Every device along `axis_name` gets the value of device `source` (JAX's
    CollectiveBroadcast, ``jax.lax.pbroadcast``)."""
    mesh, names = _axes(axis_name, "pbroadcast")
    source = _root(source, mesh, names, "pbroadcast")
    return _tree_map(lambda v: bind(col.PBROADCAST, [_lift(v, mesh, "pbroadcast")], mesh, axes=names,
                                    root=source), x)


class _Token:
    """What psend returns: the values sent and where to (``precv`` receives them)."""

    __slots__ = ("value", "axes", "perm")

    def __init__(self, value, axes, perm):
        self.value, self.axes, self.perm = value, axes, perm

    def __repr__(self):
        return f"Token(psend over {self.axes}, perm={self.perm})"


def psend(x, axis_name, perm):
    """Sends `x` along `perm` ((source, destination) pairs); returns a token for ``precv``.
    The data moves (and is recorded as a ppermute) when the matching ``precv`` runs."""
    mesh, names = _axes(axis_name, "psend")
    return _Token(_tree_map(lambda v: _lift(v, mesh, "psend"), x), names, tuple(tuple(p) for p in perm))


def precv(token, out_shape, axis_name, perm):
    """Receives what the matching ``psend`` sent (zeros on devices that receive nothing),
    with the shape and dtype of `out_shape` (a ShapeDtypeStruct)."""
    mesh, names = _axes(axis_name, "precv")
    shape, dtype = tuple(out_shape.shape), np.dtype(out_shape.dtype)
    perm = tuple(tuple(p) for p in perm)
    if not isinstance(token, _Token):  # a token from create_token: nothing was sent
        return lift(np.zeros(shape, dtype), mesh)
    if token.axes != names or token.perm != perm:
        raise ValueError(f"[precv] axis_name {names} and perm {perm} do not match the psend's "
                         f"{token.axes} and {token.perm}")
    value = token.value
    if not isinstance(value, LocalArray) or tuple(value.shape) != shape or value.dtype != dtype:
        raise ValueError(f"[precv] out_shape {dtype}{list(shape)} does not match what psend sent")
    return ppermute(value, axis_name, perm)


def ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *, axis_name,
                      axis_index_groups=None):
    """Sends ragged slices between devices, as ``jax.lax.ragged_all_to_all``.

    Slice i of a device's `operand` (rows ``input_offsets[i]`` to ``+ send_sizes[i]``) goes to
    device ``i // (len(input_offsets) / axis_size)`` along `axis_name`, which writes it at the
    sender's ``output_offsets[i]``. The result is `output` with the received rows written in.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((2,), ("x",))
        >>> def f(operand, output, in_off, send, out_off, recv):
        ...     return sl.lax.ragged_all_to_all(operand, output, in_off, send, out_off, recv, axis_name="x")
        >>> args = (np.array([1, 2, 2, 3, 4, 0], np.int32), np.zeros(8, np.int32),
        ...         np.array([0, 1, 0, 1], np.int32), np.array([1, 2, 1, 1], np.int32),
        ...         np.array([0, 0, 1, 2], np.int32), np.array([1, 1, 2, 1], np.int32))
        >>> np.asarray(sl.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(*args)).tolist()
        [1, 3, 0, 0, 2, 2, 4, 0]
    """
    mesh, names = _axes(axis_name, "ragged_all_to_all")
    groups = _groups(axis_index_groups, mesh, names, "ragged_all_to_all")
    if groups is None:
        groups = (tuple(range(math.prod(mesh.shape[a] for a in names))),)
    args = [_lift(v, mesh, "ragged_all_to_all") for v in (operand, output)]
    for v in (input_offsets, send_sizes, output_offsets, recv_sizes):
        v = v if isinstance(v, LocalArray) else lift(np.asarray(v), mesh)
        args.append(v)
    return bind(gp.RAGGED_ALL_TO_ALL, args, mesh, axes=names, groups=groups)


# -- MPI-style rooted collectives ------------------------------------------------------------

def broadcast(x, axis_name, root: int = 0):
    """Every device along `axis_name` gets device `root`'s value (MPI_Bcast)."""
    mesh, names = _axes(axis_name, "broadcast")
    root = _root(root, mesh, names, "broadcast")
    return _tree_map(lambda v: bind(col.PBROADCAST, [_lift(v, mesh, "broadcast")], mesh, axes=names, root=root), x)


def reduce(x, axis_name, root: int = 0, op: str = "sum"):
    """Device `root` gets the reduction (op: sum, max, min, mean); the others hold zeros (MPI_Reduce)."""
    mesh, names = _axes(axis_name, "reduce")
    root = _root(root, mesh, names, "reduce")
    if op not in ("sum", "max", "min", "mean"):
        raise ValueError(f"[reduce] op={op!r}; use sum, max, min or mean")
    return _tree_map(lambda v: bind(col.REDUCE, [_lift(v, mesh, "reduce")], mesh, axes=names, root=root,
                                    reduction=op), x)


def gather(x, axis_name, root: int = 0, *, axis=0, tiled=False):
    """Device `root` gets every device's value (as all_gather); the others hold zeros (MPI_Gather)."""
    mesh, names = _axes(axis_name, "gather")
    root, axis = _root(root, mesh, names, "gather"), _int(axis, "axis", "gather")
    return _tree_map(lambda v: bind(col.GATHER, [_lift(v, mesh, "gather")], mesh, axes=names, root=root,
                                    axis=axis, tiled=bool(tiled)), x)


def scatter(x, axis_name, root: int = 0, *, scatter_dimension=0, tiled=False):
    """Device i gets chunk i of device `root`'s value along `scatter_dimension` (MPI_Scatter)."""
    mesh, names = _axes(axis_name, "scatter")
    root, dim = _root(root, mesh, names, "scatter"), _int(scatter_dimension, "scatter_dimension", "scatter")
    return _tree_map(lambda v: bind(col.SCATTER, [_lift(v, mesh, "scatter")], mesh, axes=names, root=root,
                                    dim=dim, tiled=bool(tiled)), x)


# -- per-device slicing (jax.lax.dynamic_slice family) ----------------------------------------

def _seq(value, name: str, op: str) -> tuple:
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list, np.ndarray)):
        raise TypeError(f"[{op}] {name} must be a sequence with one entry per dimension, got {value!r}")
    return tuple(value)


def _starts(start_indices, operand: LocalArray, op: str) -> list:
    start_indices = _seq(start_indices, "start_indices", op)
    if len(start_indices) != operand.ndim:
        raise ValueError(f"[{op}] {len(start_indices)} start indices for an operand of rank {operand.ndim} "
                         f"(local shape {operand.shape})")
    starts = []
    for s in start_indices:
        v = lift(s, operand.mesh)
        if v.ndim != 0 or v.dtype.kind not in "iu":
            raise TypeError(f"[{op}] start indices must be integer scalars, got {v.dtype} of shape {v.shape}")
        starts.append(jnp.astype(v, np.int32))
    return starts


def _sizes(slice_sizes, x: LocalArray, op: str) -> tuple:
    sizes = tuple(_int(n, "a slice size", op) for n in _seq(slice_sizes, "slice_sizes", op))
    if len(sizes) != x.ndim:
        raise ValueError(f"[{op}] {len(sizes)} slice sizes for an operand of rank {x.ndim} (local shape {x.shape})")
    for size, dim in zip(sizes, x.shape):
        if not 0 <= size <= dim:
            raise ValueError(f"[{op}] slice size {size} does not fit in a dimension of size {dim} "
                             f"(local shape {x.shape})")
    return sizes


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
    mesh = current_shard_map_mesh("dynamic_slice")
    x = _lift(operand, mesh, "dynamic_slice")
    starts = _starts(start_indices, x, "dynamic_slice")
    return bind(st.DYNAMIC_SLICE, [x, *starts], mesh, sizes=_sizes(slice_sizes, x, "dynamic_slice"))


def dynamic_update_slice(operand, update, start_indices):
    """A copy of `operand` with `update` written at `start_indices` (per device, clamped)."""
    mesh = current_shard_map_mesh("dynamic_update_slice")
    x, u = _lift(operand, mesh, "dynamic_update_slice"), _lift(update, mesh, "dynamic_update_slice")
    if u.ndim != x.ndim:
        raise ValueError(f"[dynamic_update_slice] update of local rank {u.ndim} for an operand of local rank {x.ndim}")
    _sizes(u.shape, x, "dynamic_update_slice")
    starts = _starts(start_indices, x, "dynamic_update_slice")
    return bind(st.DYNAMIC_UPDATE_SLICE, [x, jnp.astype(u, x.dtype), *starts], mesh)


def _in_dim(axis, x: LocalArray, op: str) -> int:
    axis = _int(axis, "axis", op)
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"[{op}] axis {axis} is out of range for local rank {x.ndim} (local shape {x.shape})")
    return axis % x.ndim


def dynamic_slice_in_dim(operand, start_index, slice_size, axis=0):
    """dynamic_slice along one axis."""
    mesh = current_shard_map_mesh("dynamic_slice_in_dim")
    x = _lift(operand, mesh, "dynamic_slice_in_dim")
    axis = _in_dim(axis, x, "dynamic_slice_in_dim")
    starts = [0] * x.ndim
    starts[axis] = start_index
    sizes = list(x.shape)
    sizes[axis] = slice_size
    return dynamic_slice(x, starts, sizes)


def dynamic_update_slice_in_dim(operand, update, start_index, axis):
    """dynamic_update_slice along one axis."""
    mesh = current_shard_map_mesh("dynamic_update_slice_in_dim")
    x = _lift(operand, mesh, "dynamic_update_slice_in_dim")
    axis = _in_dim(axis, x, "dynamic_update_slice_in_dim")
    starts = [0] * x.ndim
    starts[axis] = start_index
    return dynamic_update_slice(x, update, starts)
