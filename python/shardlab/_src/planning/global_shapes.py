"""Shape ops on global arrays with JAX's explicit-sharding rules: reshape (JAX's
``_reshape_sharding_rule``, ``out_sharding=``), transpose, swapaxes, moveaxis, squeeze,
expand_dims, broadcast_to (``out_sharding=``), concatenate, stack and split.

A reshape whose groups of merged or split dims keep every device's block one contiguous run in
device order is local; otherwise (JAX allows ``8@X,8@Y -> 64@(X,Y)``) the dims concerned are
all-gathered, reshaped and sliced to the output sharding. Concatenate and split along a sharded
dim do the same. The rest is local.

Example:
    >>> import numpy as np, shardlab as sl
    >>> import shardlab.numpy as jnp
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((2, 4), ("X", "Y"))
    >>> a = sl.device_put(np.arange(64.0, dtype=np.float32).reshape(8, 8), sl.NamedSharding(mesh, P("X", None)))
    >>> with sl.Ledger() as ledger:
    ...     b = jnp.reshape(a, (4, 2, 8))
    >>> b.sharding.spec, ledger.events
    (P('X', None, None), [])
    >>> jnp.concatenate([a, a], axis=0).sharding.spec
    P('X', None)
"""

from __future__ import annotations

import math

import numpy as np

from ..arrays.sharded_array import ShardedArray
from ..core import dtypes as _dt
from ..core.errors import ShardingTypeError
from ..core.mesh import AxisType
from ..core.sharding import NamedSharding, P
from ..ops import numpy as jnp
from .global_common import (as_global, axes_of, check_reduced, entry, gather_dims, norm_axis, run, same_mesh,
                            sharding_str, slice_dims, spec_of, type_str, with_spec, _norm_axes)


# -- reshape ---------------------------------------------------------------------------------------
class _Explicit(Exception):
    pass


def _reshape_error(x, new):
    return ShardingTypeError(
        f"[reshape] This reshape is not supported. Please specify the sharding of the output via the "
        f"`out_sharding` argument of jax.lax.reshape (shardlab.numpy.reshape(..., out_sharding=P(...))) or "
        f"reshard first. Got operand type: {type_str(x)}, new sizes: {tuple(new)}")


def _split_on_one_axis(op_shape, new_sizes):
    """JAX's ``_split_on_one_axis`` (lax.py), verbatim."""
    if len(new_sizes) <= len(op_shape):
        return False, []
    orig = op_shape
    num_1s = 0
    while op_shape and new_sizes and op_shape[-1] == 1 and new_sizes[-1] == 1:
        num_1s += 1
        op_shape, new_sizes = op_shape[:-1], new_sizes[:-1]
    i, j, count, out = 0, 0, 0, []
    while j < len(new_sizes):
        if op_shape[i] == new_sizes[j]:
            out.append(op_shape[i])
        else:
            count += 1
            if count > 1:
                raise _Explicit()
            temp = [new_sizes[j]]
            next_j, next_i = j + 1, i + 1
            while math.prod(temp) != op_shape[i] or (next_j < len(new_sizes) and new_sizes[next_j] == 1):
                if math.prod(temp) > op_shape[i]:
                    return False, []
                if (math.prod(temp) == op_shape[i] and next_i < len(op_shape)
                        and new_sizes[next_j] == op_shape[next_i]):
                    break
                j += 1
                if j >= len(new_sizes):
                    return False, []
                temp.append(new_sizes[j])
                next_j += 1
            out.append(temp)
        i += 1
        j += 1
    out.extend([1] * num_1s)
    if len(orig) != len(out):
        return False, []
    return True, out


def _split_partitions(mesh, tup, out, err):
    it = iter(tup)
    parts = []
    for o in out:
        dim = []
        while o > 1:
            ns = next(it, None)
            if ns is None:
                break
            o, rem = divmod(o, mesh.shape[ns])
            if rem:
                raise err
            dim.append(ns)
        parts.append(entry(dim))
    if next(it, None) is not None:
        raise err
    return parts


def reshape_rule(x: ShardedArray, new: tuple) -> list:
    """JAX's ``_reshape_sharding_rule`` (out_sharding=None): the output spec, or ShardingTypeError."""
    shape, spec, mesh = tuple(x.shape), spec_of(x), x.sharding.mesh
    err = _reshape_error(x, new)
    if all(e is None for e in spec):
        return [None] * len(new)
    if [s for s in shape if s != 1] == [s for s in new if s != 1]:
        it = iter(e for n, e in zip(shape, spec) if n != 1)
        return [None if n == 1 else next(it) for n in new]
    try:
        is_split, out_split = _split_on_one_axis(shape, new)
    except (_Explicit, IndexError, AssertionError):
        # IndexError / AssertionError: JAX 0.10.2's own walk trips on some splits beside
        # trailing 1s ((8, 8@Y) -> (2, 4, 8, 1)); shardlab refuses those with the reason instead
        raise err from None
    if is_split:
        out = []
        for o, e in zip(out_split, spec):
            if isinstance(o, list):
                out.extend([None] * len(o) if e is None else _split_partitions(mesh, axes_of(e), o, err))
            else:
                out.append(e)
        return out
    try:
        is_merge, op_merge = (False, []) if len(new) >= len(shape) else _split_on_one_axis(new, shape)
    except (_Explicit, IndexError, AssertionError):
        raise err from None
    if not is_merge:
        raise err
    out, it = [], iter(spec)
    for n, o in zip(new, op_merge):
        if isinstance(o, list):
            tup = [next(it) for _ in o]
            if all(e is None for e in tup):
                out.append(None)
                continue
            flat = [a for e in tup for a in ((None,) if e is None else axes_of(e))]
            while flat and flat[-1] is None:
                flat.pop()
            if None in flat:
                raise err
            out.extend(_split_partitions(mesh, flat, [n], err))
        else:
            out.append(next(it))
    return out


def _groups(old: tuple, new: tuple):
    """Pairs of (old dims, new dims) with equal products, each as small as possible."""
    if 0 in old or 0 in new:
        return [(list(range(len(old))), list(range(len(new))))]
    i = j = 0
    out = []
    while i < len(old) or j < len(new):
        gi, gj = [i] if i < len(old) else [], [j] if j < len(new) else []
        po = old[i] if i < len(old) else 1
        pn = new[j] if j < len(new) else 1
        i, j = i + len(gi), j + len(gj)
        while po != pn:
            if po < pn:
                po *= old[i]
                gi.append(i)
                i += 1
            else:
                pn *= new[j]
                gj.append(j)
                j += 1
        out.append((gi, gj))
    return out


def _contiguous_axes(shape, spec, dims, mesh):
    """The axes (in order) sharding ``dims`` if every device's block of the group is one
    contiguous run of its row-major order, else None."""
    local = [shape[d] // math.prod(mesh.shape[a] for a in axes_of(spec[d])) for d in dims]
    sharded = [k for k, d in enumerate(dims) if local[k] != shape[d]]
    if sharded and any(local[k] != 1 for k in range(sharded[-1])):
        return None
    return tuple(a for d in dims for a in axes_of(spec[d]))


def _carrying(shape, dims, axes: tuple, mesh):
    """Spec entries for ``dims`` that hold ``axes`` (major to minor) so that every device's block
    of the group is one contiguous run in device order, or None if the sizes do not allow it."""
    todo, out = list(axes), {}
    for d in dims:
        n, taken = shape[d], []
        while todo and n > 1 and n % mesh.shape[todo[0]] == 0:
            n //= mesh.shape[todo[0]]
            taken.append(todo.pop(0))
        out[d] = entry(taken)
        if n != 1 and todo:
            return None
    return None if todo else out


def _plan_groups(x, new, out_spec):
    """(groups that reshape locally, groups that need their dims whole) for ``x`` as it is laid out."""
    mesh, spec = x.sharding.mesh, spec_of(x)
    local, whole = [], []
    for gi, gj in _groups(tuple(x.shape), tuple(new)):
        a = _contiguous_axes(x.shape, spec, gi, mesh)
        b = _contiguous_axes(new, out_spec, gj, mesh)
        (local if a is not None and a == b else whole).append((gi, gj, b))
    return local, whole


def reshape_to(x: ShardedArray, new: tuple, out_spec: list) -> ShardedArray:
    """Runs the reshape of ``x`` into ``new`` sharded as ``out_spec``.

    A group of merged/split dims whose every device's block is one contiguous run in device
    order, in the input and the output alike, reshapes locally. Otherwise the group's input is
    first resharded (the planner's cheapest moves, e.g. one AllToAll for ``8@X,8@Y -> 64@(X,Y)``)
    to the layout that carries the output's axes that way; where no such layout exists the
    group's dims are all-gathered, reshaped, and sliced to ``out_spec``."""
    mesh = x.sharding.mesh
    local, whole = _plan_groups(x, new, out_spec)
    if whole:
        target = spec_of(x)
        movable = True
        for gi, gj, b in whole:
            carry = _carrying(x.shape, gi, b, mesh) if b is not None else None
            if carry is None:
                movable = False
                break
            for d, e in carry.items():
                target[d] = e
        if movable:
            try:
                moved = with_spec(x, target)
            except (ValueError, NotImplementedError):
                moved = None
            if moved is not None:
                x = moved
                local, whole = _plan_groups(x, new, out_spec)
    spec = spec_of(x)
    gather_in = [d for gi, _, _ in whole for d in gi]
    slice_out = [d for _, gj, _ in whole for d in gj]
    mid = tuple(n if d in slice_out else n // math.prod(mesh.shape[a] for a in axes_of(out_spec[d]))
                for d, n in enumerate(new))

    def body(v):
        v = gather_dims(v, spec, gather_in)
        v = jnp.reshape(v, mid)
        return slice_dims(v, out_spec, slice_out)

    return run(body, [x], P(*out_spec), "reshape")


def _new_shape(x, shape, op="reshape") -> tuple:
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    if list(shape).count(-1) > 1:
        raise ValueError(f"[{op}] can only specify one unknown dimension, got shape {shape}")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or x.size % known:
            raise TypeError(f"[{op}] cannot reshape array of shape {x.shape} (size {x.size}) into shape {shape}")
        shape = tuple(x.size // known if s == -1 else s for s in shape)
    if math.prod(shape) != x.size or any(s < 0 for s in shape):
        raise TypeError(f"[{op}] cannot reshape array of shape {x.shape} (size {x.size}) into shape {shape} "
                        f"(size {math.prod(shape)})")
    return shape


def _out_spec(out_sharding, x, rank, op):
    if isinstance(out_sharding, NamedSharding):
        spec = out_sharding.spec
    elif isinstance(out_sharding, P):
        spec = out_sharding
    else:
        raise TypeError(f"[{op}] out_sharding must be a PartitionSpec or NamedSharding, got {out_sharding!r}")
    if len(spec) > rank:
        raise ValueError(f"[{op}] out_sharding {spec} is longer than the output's rank {rank}")
    NamedSharding(x.sharding.mesh, spec)  # validates axis names
    return [entry(axes_of(e)) for e in spec] + [None] * (rank - len(spec))


def reshape(a: ShardedArray, shape=None, order="C", *, copy=None, out_sharding=None, newshape=None):
    """``jnp.reshape`` on a global array (JAX's reshape sharding rule; ``out_sharding=``)."""
    check_reduced(a, "reshape")
    if shape is None:
        shape = newshape
    if order != "C":
        raise NotImplementedError(f"[reshape] order={order!r}: global arrays reshape in C order only")
    new = _new_shape(a, shape)
    if out_sharding is not None:
        return reshape_to(a, new, _out_spec(out_sharding, a, len(new), "reshape"))
    if new == tuple(a.shape):
        return a
    try:
        out_spec = reshape_rule(a, new)
    except ShardingTypeError:
        auto = all(t == AxisType.Auto for n, t in zip(a.sharding.mesh.axis_names, a.sharding.mesh.axis_types)
                   if n in a.sharding.spec.mesh_axes())
        if not auto:
            raise
        out_spec = [None] * len(new)
    return reshape_to(a, new, out_spec)


def ravel(a: ShardedArray, order="C", *, out_sharding=None):
    return reshape(a, (-1,), order, out_sharding=out_sharding)


# -- transpose, squeeze, expand_dims, broadcast_to ---------------------------------------------
def transpose(a: ShardedArray, axes=None):
    check_reduced(a, "transpose")
    r = a.ndim
    perm = tuple(range(r))[::-1] if axes is None else tuple(norm_axis(x, r, "transpose") for x in axes)
    if sorted(perm) != list(range(r)):
        raise ValueError(f"[transpose] axes {axes} are not a permutation of rank {r}")
    spec = spec_of(a)
    return run(lambda v: jnp.transpose(v, perm), [a], P(*[spec[p] for p in perm]))


def swapaxes(a: ShardedArray, axis1, axis2):
    perm = list(range(a.ndim))
    i, j = norm_axis(axis1, a.ndim, "swapaxes"), norm_axis(axis2, a.ndim, "swapaxes")
    perm[i], perm[j] = perm[j], perm[i]
    return transpose(a, perm)


def moveaxis(a: ShardedArray, source, destination):
    src = [norm_axis(s, a.ndim, "moveaxis") for s in np.atleast_1d(source).tolist()]
    dst = [norm_axis(s, a.ndim, "moveaxis") for s in np.atleast_1d(destination).tolist()]
    if len(src) != len(dst):
        raise ValueError("[moveaxis] source and destination must have the same number of elements")
    perm = [d for d in range(a.ndim) if d not in src]
    for d, s in sorted(zip(dst, src)):
        perm.insert(d, s)
    return transpose(a, perm)


def squeeze(a: ShardedArray, axis=None):
    check_reduced(a, "squeeze")
    dims = [d for d, n in enumerate(a.shape) if n == 1] if axis is None else list(_norm_axes(axis, a.ndim, "squeeze"))
    for d in dims:
        if a.shape[d] != 1:
            raise ValueError(f"[squeeze] cannot select an axis to squeeze out which has size not equal to one, "
                             f"got shape={a.shape} and dimensions={tuple(dims)}")
    spec = spec_of(a)
    shape = tuple(n for d, n in enumerate(a.shape) if d not in dims)
    return run(lambda v: jnp.reshape(v, tuple(n for d, n in enumerate(v.shape) if d not in dims)), [a],
               P(*[e for d, e in enumerate(spec) if d not in dims])) if shape != a.shape else a


def expand_dims(a: ShardedArray, axis):
    check_reduced(a, "expand_dims")
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    r = a.ndim + len(axes)
    new = sorted(norm_axis(x, r, "expand_dims") for x in axes)
    if len(set(new)) != len(new):
        raise ValueError(f"[expand_dims] repeated axis in {axes}")
    it = iter(spec_of(a))
    spec = [None if d in new else next(it) for d in range(r)]
    return run(lambda v: jnp.expand_dims(v, tuple(new)), [a], P(*spec))


def broadcast_to(array, shape, *, out_sharding=None):
    """``jnp.broadcast_to``: leading dims and broadcast size-1 dims unsharded (JAX's
    broadcast_in_dim rule); with ``out_sharding``, each operand dim must be unsharded or
    sharded as asked (else JAX's ValueError), and the broadcast copy is sliced to it."""
    x = array
    check_reduced(x, "broadcast_to")
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    nlead = len(shape) - x.ndim
    spec = spec_of(x)
    ok = nlead >= 0 and all(a in (1, b) for a, b in zip(x.shape, shape[nlead:]))
    if out_sharding is None:
        if tuple(shape) == tuple(x.shape):
            return x
        out_spec = [None] * nlead + spec
    else:
        out_spec = _out_spec(out_sharding, x, len(shape), "broadcast_to")
        if tuple(shape) == tuple(x.shape) and out_spec == spec:
            return x
        ok = ok and all(e is None or e == o for e, o in zip(spec, out_spec[max(nlead, 0):]))
    if not ok:
        want = type_str(x, shape, out_spec if out_sharding is not None else [None] * len(shape))
        raise ValueError(f"[broadcast_to] Incompatible types for broadcasting: input type={type_str(x)} and "
                         f"requested type={want}")
    mesh = x.sharding.mesh
    # dims where the output is sharded but the operand's block is whole: sliced after the broadcast
    slice_out = [d for d in range(len(shape)) if out_spec[d] is not None
                 and (d < nlead or spec[d - nlead] is None or x.shape[d - nlead] == 1)]
    mid = tuple(n if d in slice_out else n // math.prod(mesh.shape[a] for a in axes_of(out_spec[d]))
                for d, n in enumerate(shape))

    def body(v):
        return slice_dims(jnp.broadcast_to(v, mid), out_spec, slice_out)

    return run(body, [x], P(*out_spec))


# -- concatenate, stack, split -----------------------------------------------------------------
def _same_sharding_error(arrays):
    return ShardingTypeError(
        "[concatenate] All operands should have the same sharding. Got shardings "
        + ", ".join(sharding_str(a) for a in arrays)
        + "; reshard them to one sharding first (shardlab.reshard)")


def _operands(arrays, op):
    arrays = list(arrays)
    if not arrays:
        raise ValueError(f"[{op}] need at least one array to {op}")
    first = next(a for a in arrays if isinstance(a, ShardedArray))
    out = [as_global(a, first.sharding.mesh) for a in arrays]
    for a in out:
        check_reduced(a, op)
    return same_mesh(out, op)


def concatenate(arrays, axis=0, dtype=None):
    """``jnp.concatenate``: all operands in one sharding (JAX's rule), which the result keeps;
    along a sharded dim the shards are all-gathered, joined and sliced back."""
    xs = _operands(arrays, "concatenate")
    if axis is None:
        xs, axis = [ravel(x) for x in xs], 0
    if len({x.ndim for x in xs}) != 1:
        raise ValueError(f"[concatenate] arrays must have the same number of dimensions, got "
                         f"{[x.ndim for x in xs]}")
    ax = norm_axis(axis, xs[0].ndim, "concatenate")
    specs = [spec_of(x) for x in xs]
    if any(s != specs[0] for s in specs[1:]):
        types = dict(zip(xs[0].sharding.mesh.axis_names, xs[0].sharding.mesh.axis_types))
        if not all(types[a] == AxisType.Auto for s in specs for e in s for a in axes_of(e)):
            raise _same_sharding_error(xs)
        xs = [with_spec(x, specs[0]) for x in xs]
    spec = specs[0]
    dt = _dt.result_type(*[x.dtype for x in xs]) if dtype is None else _dt.canonicalize_dtype(dtype)
    sharded = [ax] if spec[ax] is not None else []

    def body(*vs):
        vs = [gather_dims(jnp.astype(v, dt), spec, sharded) for v in vs]
        return slice_dims(jnp.concatenate(vs, axis=ax), spec, sharded)

    return run(body, xs, P(*spec))


def stack(arrays, axis=0, out=None, dtype=None):
    xs = _operands(arrays, "stack")
    shapes = {x.shape for x in xs}
    if len(shapes) != 1:
        raise ValueError(f"[stack] all input arrays must have the same shape, got {sorted(shapes)}")
    ax = norm_axis(axis, xs[0].ndim + 1, "stack")
    return concatenate([expand_dims(x, ax) for x in xs], axis=ax, dtype=dtype)


def split(ary: ShardedArray, indices_or_sections, axis=0):
    """``jnp.split``: every piece keeps the operand's sharding (JAX's rule); along a sharded dim
    the dim is all-gathered, split, and each piece sliced back."""
    x = ary
    check_reduced(x, "split")
    ax = norm_axis(axis, x.ndim, "split")
    n = x.shape[ax]
    if isinstance(indices_or_sections, (int, np.integer)):
        k = int(indices_or_sections)
        if k <= 0 or n % k:
            raise ValueError(f"[split] array split does not result in an equal division: axis {ax} of size {n} "
                             f"into {k} sections")
        bounds = list(range(0, n + 1, n // k))
    else:
        bounds = [0] + [min(max(int(i) if i >= 0 else int(i) + n, 0), n) for i in indices_or_sections] + [n]
    sizes = tuple(max(b - a, 0) for a, b in zip(bounds[:-1], bounds[1:]))
    spec = spec_of(x)
    sharded = [ax] if spec[ax] is not None else []
    mesh = x.sharding.mesh
    if sharded:
        k = math.prod(mesh.shape[a] for a in axes_of(spec[ax]))
        for s in sizes:
            if s % k:
                shape = tuple(s if d == ax else n for d, n in enumerate(x.shape))
                raise ShardingTypeError(
                    f"[split] split on sharded dims where out dim ({s}) is not divisible by mesh axes ({k}) with "
                    f"spec ({spec[ax]!r}) is not implemented. Got input type={type_str(x)} and output shape={shape}; "
                    f"reshard that dim first (shardlab.reshard)")
    bounds = np.cumsum((0,) + sizes)

    def body(v):
        v = gather_dims(v, spec, sharded)
        pieces = [v[(slice(None),) * ax + (slice(int(a), int(b)),)] for a, b in zip(bounds[:-1], bounds[1:])]
        return tuple(slice_dims(p, spec, sharded) for p in pieces)

    return list(run(body, [x], tuple(P(*spec) for _ in sizes)))


for _fn, _impl in ((np.transpose, transpose), (np.reshape, reshape), (np.ravel, ravel), (np.swapaxes, swapaxes),
                   (np.moveaxis, moveaxis), (np.squeeze, squeeze), (np.expand_dims, expand_dims),
                   (np.broadcast_to, broadcast_to), (np.concatenate, concatenate), (np.stack, stack),
                   (np.split, split)):
    jnp.register_global(_fn, _impl)
