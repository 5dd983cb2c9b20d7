"""jax.numpy on global ShardedArrays, with JAX's explicit-sharding rules ("sharding in types").

Each op first computes its output sharding by JAX 0.10.2's rule for the primitive it lowers to
(``reduce_*``, ``cumsum``, ``reshape``, ``transpose``, ``squeeze``, ``broadcast_in_dim``,
``concatenate``, ``split``, ``select_n``, ``sort``) or refuses with JAX's ShardingTypeError and
JAX's reason. It then runs inside one ``shard_map`` with exactly the collectives the move needs
(``shardlab.lax`` calls: recorded in the ledger, differentiable):

- reductions run locally, then a psum (sum, mean, var, std, any, all) or an all_gather of the
  shards' partial results (max, min, prod, argmax, argmin: differentiable, where pmax is not)
  combines the shards of every reduced dimension that was sharded;
- reshape, concatenate and split along a sharded dimension, and reverse (``x[::-1]``) are
  legal in JAX even where a device's block must change: the dims concerned are all-gathered,
  reshaped / joined / split locally, and sliced back to the output sharding (free);
- everything else (transpose, squeeze, expand_dims, stack, where, sort along an unsharded
  dim, cumulative ops along an unsharded dim) is local.

Where the offending mesh axes are ``Auto`` axes (``Mesh(...)``'s default, or inside
``auto_axes``), shardlab plays the compiler: it all-gathers those dims and goes on, so the
same program runs in Auto mode with the gather in the ledger.

Example:
    >>> import numpy as np, shardlab as sl
    >>> import shardlab.numpy as jnp
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((2, 4), ("X", "Y"))
    >>> a = sl.device_put(np.arange(64.0, dtype=np.float32).reshape(8, 8), sl.NamedSharding(mesh, P("X", "Y")))
    >>> float(np.asarray(jnp.sum(a))), np.asarray(jnp.mean(a, axis=0))[:2].tolist()
    (2016.0, [28.0, 29.0])
    >>> jnp.reshape(a, (64,)).sharding.spec, jnp.transpose(a).sharding.spec
    (P(('X', 'Y'),), P('Y', 'X'))
"""

from __future__ import annotations

import math

import numpy as np

from ..arrays.sharded_array import ShardedArray, device_put
from ..core import dtypes as _dt
from ..core.errors import ShardingTypeError
from ..core.mesh import AxisType
from ..core.sharding import NamedSharding, P
from ..ops import lax
from ..ops import numpy as jnp
from ..ops import numpy_fallback as _fb
from ..ops import numpy_more as _more
from ..transforms.shard_map import shard_map
from .global_ops import reshard as _plan_reshard


# -- specs ---------------------------------------------------------------------------------------
def entry(axes) -> object:
    """A tuple of axis names as JAX writes a spec entry: None, 'X' or ('X', 'Y')."""
    axes = tuple(axes or ())
    return None if not axes else (axes[0] if len(axes) == 1 else axes)


def axes_of(e) -> tuple:
    return () if e is None else (e,) if isinstance(e, str) else tuple(e)


def spec_of(x: ShardedArray) -> list:
    """One entry per dim (None / name / tuple of names)."""
    return [entry(a) for a in x.sharding.spec.normalized(x.ndim)]


def type_str(x, shape=None, spec=None) -> str:
    """The book's notation of a type (JAX's ``str_short`` with short dtypes): ``f32[8@X,8@(X,Y)]``;
    ``shape`` / ``spec`` give another type of ``x``'s dtype."""
    shape = np.shape(x) if shape is None else shape
    spec = (spec_of(x) if isinstance(x, ShardedArray) else [None] * len(shape)) if spec is None else spec
    dims = []
    for n, e in zip(shape, spec):
        a = axes_of(e)
        dims.append(str(n) if not a else f"{n}@{a[0]}" if len(a) == 1 else f"{n}@({','.join(a)})")
    name = np.dtype(x.dtype).name
    short = name.replace("float", "f").replace("uint", "u").replace("int", "i").replace("complex", "c")
    return f"{short}[{','.join(dims)}]"


def sharding_str(x: ShardedArray, spec=None) -> str:
    spec = P(*spec_of(x)) if spec is None else spec
    return f"NamedSharding(mesh={x.sharding.mesh!r}, spec={_pstr(spec)})"


def _pstr(spec) -> str:
    return "P(" + ", ".join(repr(e) for e in spec) + ")"


def check_reduced(x: ShardedArray, op: str) -> None:
    if x.unreduced:
        raise ValueError(f"[{op}] the array {type_str(x)} is unreduced along {sorted(x.unreduced)}; reshard it "
                         f"first (shardlab.reshard(x, x.sharding) sums the partials)")


def with_spec(x: ShardedArray, spec) -> ShardedArray:
    """``x`` resharded to ``spec`` on its mesh (the planner's collectives; no-op if equal)."""
    spec = P(*spec)
    if P(*spec_of(x)) == P(*[entry(axes_of(e)) for e in spec]) + (None,) * (x.ndim - len(spec)) and not x.unreduced:
        return x
    return _plan_reshard(x, NamedSharding(x.sharding.mesh, spec))


def free_dims(x: ShardedArray, dims, make_error) -> ShardedArray:
    """``x`` with ``dims`` unsharded. JAX refuses (``make_error()``) where an Explicit axis
    shards them; where every such axis is Auto, the dims are all-gathered (the compiler's job
    in JAX; here a recorded collective)."""
    spec = spec_of(x)
    bad = [a for d in dims for a in axes_of(spec[d])]
    if not bad:
        return x
    types = dict(zip(x.sharding.mesh.axis_names, x.sharding.mesh.axis_types))
    if any(types[a] != AxisType.Auto for a in bad):
        raise make_error()
    return with_spec(x, [None if d in dims else e for d, e in enumerate(spec)])


def same_mesh(arrays) -> list:
    """Operands on equal meshes (a mesh that differs only in axis types counts as the same
    devices, as inside auto_axes / explicit_axes)."""
    first = arrays[0].sharding.mesh
    out = []
    for a in arrays:
        m = a.sharding.mesh
        if m is not first and m != first:
            if m.axis_names != first.axis_names or m.axis_sizes != first.axis_sizes:
                raise ValueError(f"[shardlab] operands live on different meshes {first!r} and {m!r}; "
                                 f"device_put them onto one mesh")
            a = ShardedArray(a._storage, NamedSharding(first, a.sharding.spec), a.shape, a.unreduced)
        out.append(a)
    return out


def run(body, arrays, out_specs):
    """``body`` on the shards of ``arrays`` (each in its own spec) inside one shard_map."""
    arrays = same_mesh(list(arrays))
    specs = tuple(a.sharding.spec for a in arrays)
    return shard_map(body, mesh=arrays[0].sharding.mesh, in_specs=specs, out_specs=out_specs)(*arrays)


def gather_dims(v, spec: list, dims):
    """Inside a shard_map body: all-gather local dims ``dims`` over the axes that shard them."""
    for d in dims:
        a = axes_of(spec[d])
        if a:
            v = lax.all_gather(v, a if len(a) > 1 else a[0], axis=d, tiled=True)
    return v


def slice_dims(v, spec: list, dims):
    """Inside a shard_map body: keep this device's chunk of whole local dims ``dims`` (no data
    moves)."""
    for d in dims:
        a = axes_of(spec[d])
        if a:
            name = a if len(a) > 1 else a[0]
            size = v.shape[d] // lax.axis_size(name)
            v = lax.dynamic_slice_in_dim(v, lax.axis_index(name) * size, size, axis=d)
    return v


def as_global(v, mesh, spec=None) -> ShardedArray:
    """A non-ShardedArray operand placed on ``mesh`` (replicated, as JAX's constants)."""
    if isinstance(v, ShardedArray):
        return v
    arr = np.asarray(v)
    if arr.dtype == np.float64 and not isinstance(v, np.ndarray):
        arr = arr.astype(np.float32)
    return device_put(arr, NamedSharding(mesh, P() if spec is None else spec))


def norm_axis(axis, r: int, op: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"[{op}] axis must be an int, got {axis!r}")
    if not -r <= axis < r:
        raise np.exceptions.AxisError(f"[{op}] axis {axis} is out of bounds for an array of rank {r}")
    return int(axis) % r


def _norm_axes(axis, r: int, op: str) -> tuple:
    axes = tuple(range(r)) if axis is None else (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = tuple(sorted(norm_axis(a, r, op) for a in axes))
    if len(set(out)) != len(out):
        raise ValueError(f"[{op}] axis {axis!r} repeats a dimension")
    return out


# -- reductions ------------------------------------------------------------------------------------
_IDENTITY = {np.sum: 0, np.prod: 1, np.any: False, np.all: True}


def _reduce(np_fn):
    name = np_fn.__name__

    def impl(x: ShardedArray, axis=None, dtype=None, out=None, keepdims=False, *, ddof=0, where=None,
             initial=None, **kw):
        check_reduced(x, name)
        if out is not None:
            raise TypeError(f"[{name}] out= is not supported (JAX arrays are immutable)")
        r = x.ndim
        axes = _norm_axes(axis, r, name)
        spec = spec_of(x)
        reduced = tuple(a for d in axes for a in axes_of(spec[d]))
        keep = [None if d in axes else spec[d] for d in range(r)] if keepdims else \
            [spec[d] for d in range(r) if d not in axes]
        count = math.prod(x.shape[d] for d in axes)
        operands = [x]
        if where is not None:
            if np_fn in (np.max, np.min) and initial is None:
                raise ValueError(f"[{name}] reduction operation {name!r} does not have an identity, so to use a "
                                 f"where mask one has to specify 'initial'")
            w = where if isinstance(where, ShardedArray) else np.broadcast_to(np.asarray(where, bool), x.shape)
            operands.append(with_spec(broadcast_to(as_global(w, x.sharding.mesh), x.shape), spec))

        def combine(y, op):
            return op(y, reduced) if reduced else y

        def body(v, *w):
            if dtype is not None:
                v = jnp.astype(v, dtype)
            m = w[0] if w else None
            if np_fn in _IDENTITY:
                if m is not None:
                    v = jnp.where(m, v, v.dtype.type(_IDENTITY[np_fn]) if np_fn in (np.sum, np.prod) else v)
                if np_fn is np.sum:
                    return combine(jnp.sum(v, axis=axes, keepdims=keepdims), lax.psum)
                if np_fn is np.prod:
                    y = jnp.prod(v, axis=axes, keepdims=keepdims)
                    return jnp.prod(lax.all_gather(y, reduced, axis=0), axis=0) if reduced else y
                hit = (v != 0) if np_fn is np.any else (v == 0)
                if m is not None:
                    hit = jnp.logical_and(hit, m)
                hits = combine(jnp.sum(jnp.astype(hit, np.int32), axis=axes, keepdims=keepdims), lax.psum)
                return hits > 0 if np_fn is np.any else hits == 0
            if np_fn in (np.max, np.min):
                if m is not None:
                    v = jnp.where(m, v, v.dtype.type(initial))
                pick = jnp.max if np_fn is np.max else jnp.min
                y = pick(v, axis=axes, keepdims=keepdims)
                if reduced:
                    # the shards' extremes gathered, then picked locally: differentiable (pmax has no
                    # transpose); n/2 times an all-reduce's bytes, on the reduced (small) value
                    y = pick(lax.all_gather(y, reduced, axis=0), axis=0)
                if initial is not None:
                    y = (np.maximum if np_fn is np.max else np.minimum)(y, v.dtype.type(initial))
                return y
            v = jnp._inexact(v)
            if m is not None:
                mf = jnp.astype(m, v.dtype)
                n = combine(jnp.sum(mf, axis=axes, keepdims=True), lax.psum)
                s = combine(jnp.sum(v * mf, axis=axes, keepdims=True), lax.psum)
            else:
                mf, n = None, v.dtype.type(count)
                s = combine(jnp.sum(v, axis=axes, keepdims=True), lax.psum)
            mu = s / n
            if np_fn is np.mean:
                return mu if keepdims else jnp.squeeze(mu, axis=axes)
            d = v - mu
            dd = d * d if mf is None else d * d * mf
            var = combine(jnp.sum(dd, axis=axes, keepdims=True), lax.psum) / np.maximum(n - ddof, 0)
            var = var if keepdims else jnp.squeeze(var, axis=axes)
            return var if np_fn is np.var else np.sqrt(var)

        return run(body, operands, P(*keep))

    impl.__name__ = name
    return impl


def _arg_reduce(np_fn):
    """argmax / argmin: the local winner and its global index, then an all_gather of both over
    the reduced dim's axes picks the first global winner (JAX: int32, reduced dim dropped)."""
    name = np_fn.__name__
    local_fn = jnp.argmax if np_fn is np.argmax else jnp.argmin
    best_fn = jnp.max if np_fn is np.argmax else jnp.min

    def impl(x: ShardedArray, axis=None, out=None, keepdims=None):
        check_reduced(x, name)
        if axis is None:
            y = impl(reshape(x, (-1,)), 0)
            return reshape(y, (1,) * x.ndim) if keepdims else y
        ax = norm_axis(axis, x.ndim, name)
        spec = spec_of(x)
        axes = axes_of(spec[ax])
        keep = [None if d == ax else spec[d] for d in range(x.ndim)] if keepdims else \
            [spec[d] for d in range(x.ndim) if d != ax]

        def body(v):
            i = jnp.astype(local_fn(v, axis=ax, keepdims=True), np.int32)
            if axes:
                name_ = axes if len(axes) > 1 else axes[0]
                best = best_fn(v, axis=ax, keepdims=True)
                i = i + lax.axis_index(name_) * np.int32(v.shape[ax])
                bs = lax.all_gather(best, name_, axis=ax, tiled=True)
                ix = lax.all_gather(i, name_, axis=ax, tiled=True)
                win = jnp.astype(local_fn(bs, axis=ax, keepdims=True), np.int32)
                i = jnp.take_along_axis(ix, win, ax)
            return i if keepdims else jnp.squeeze(i, axis=ax)

        return run(body, [x], P(*keep))

    impl.__name__ = name
    return impl


# -- cumulative ops --------------------------------------------------------------------------------
def _cum_local(kind: str):
    if kind == "cumsum":
        return lambda v, ax: jnp.cumsum(v, axis=ax)
    fns = {"cumprod": np.cumprod, "cummax": np.maximum.accumulate, "cummin": np.minimum.accumulate,
           "cumlogsumexp": np.logaddexp.accumulate}
    np_fn = fns[kind]

    def fn(a, axis):
        return np_fn(a, axis=axis)

    fn.__name__ = kind
    fb = _fb.fallback(fn, "axis")
    return lambda v, ax: fb(v, axis=ax)


def cumulative(kind: str, x: ShardedArray, axis, *, reverse=False, dtype=None, flatten_none=True) -> ShardedArray:
    """cumsum / cumprod / cummax / cummin / cumlogsumexp of a global array along ``axis``:
    local along an unsharded dim; JAX refuses a sharded one (its ``cumsum`` sharding rule)."""
    check_reduced(x, kind)
    if axis is None and flatten_none:
        if any(spec_of(x)):
            raise ShardingTypeError(f"[{kind}] The input should be fully replicated when axis is not specified to "
                                    f"{kind}. Got input type={type_str(x)}; reshard it to P() first "
                                    f"(shardlab.reshard) or pass axis=")
        x, axis = reshape(x, (-1,)), 0
    ax = norm_axis(axis, x.ndim, kind)
    x = free_dims(x, [ax], lambda: ShardingTypeError(
        f"[{kind}] Input should be unsharded over the axis being reduced. Got input type={type_str(x)} and "
        f"axis={ax}; reshard that dim to None first (shardlab.reshard)"))
    if dtype is None and kind in ("cumsum", "cumprod") and x.dtype.kind == "b":
        dtype = _dt.default_int_dtype()  # JAX: booleans count in int32; other integers keep their dtype
    local = _cum_local(kind)

    def body(v):
        if dtype is not None:
            v = jnp.astype(v, dtype)
        if reverse:
            v = _more.flip(v, axis=ax)
        y = local(v, ax)
        return _more.flip(y, axis=ax) if reverse else y

    return run(body, [x], x.sharding.spec)


def _np_cum(kind):
    def impl(a, axis=None, dtype=None, out=None):
        if out is not None:
            raise TypeError(f"[{kind}] out= is not supported (JAX arrays are immutable)")
        return cumulative(kind, a, axis, dtype=dtype)

    impl.__name__ = kind
    return impl


def _cumulative_np(kind):
    def impl(x, /, *, axis=None, dtype=None, include_initial=False):
        if axis is None:
            if x.ndim != 1:
                raise ValueError(f"[cumulative_{kind[3:]}] axis must be specified for arrays of rank != 1")
            axis = 0
        y = cumulative(kind, x, axis, dtype=dtype)
        if not include_initial:
            return y
        ax = norm_axis(axis, x.ndim, kind)
        shape = list(y.shape)
        shape[ax] = 1
        init = as_global(np.full(shape, 0 if kind == "cumsum" else 1, y.dtype), y.sharding.mesh, y.sharding.spec)
        return concatenate([init, y], axis=ax)

    impl.__name__ = f"cumulative_{kind[3:]}"
    return impl


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
    except _Explicit:
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
    except _Explicit:
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


def reshape_to(x: ShardedArray, new: tuple, out_spec: list) -> ShardedArray:
    """Runs the reshape of ``x`` into ``new`` sharded as ``out_spec``: local where each group
    of merged/split dims keeps every device's block contiguous and in device order; otherwise
    that group's dims are all-gathered, reshaped, and sliced to ``out_spec``."""
    mesh, spec = x.sharding.mesh, spec_of(x)
    gather_in, slice_out = [], []
    for gi, gj in _groups(tuple(x.shape), tuple(new)):
        a = _contiguous_axes(x.shape, spec, gi, mesh)
        b = _contiguous_axes(new, out_spec, gj, mesh)
        if a is None or b is None or a != b:
            gather_in += gi
            slice_out += gj
    mid = tuple(n if d in slice_out else n // math.prod(mesh.shape[a] for a in axes_of(out_spec[d]))
                for d, n in enumerate(new))

    def body(v):
        v = gather_dims(v, spec, gather_in)
        v = jnp.reshape(v, mid)
        return slice_dims(v, out_spec, slice_out)

    return run(body, [x], P(*out_spec))


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
    return same_mesh(out)


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


# -- where, clip, sort -----------------------------------------------------------------------------
def broadcast_shardings(xs) -> list:
    """JAX's ``lax.broadcast_shardings`` on global operands: the result spec, or ShardingTypeError."""
    nd = max(x.ndim for x in xs)
    res = spec_of(max(xs, key=lambda x: x.ndim))
    if nd == 0 or all(res[nd - x.ndim:] == spec_of(x) for x in xs):
        return res
    specs = [[None] * (nd - x.ndim) + spec_of(x) for x in xs]
    shapes = [(1,) * (nd - x.ndim) + tuple(x.shape) for x in xs]
    out = []
    for d in range(nd):
        ss = [s[d] for s in specs]
        if all(s == ss[0] for s in ss):
            out.append(ss[0])
            continue
        nontrivial = [s for s, sh in zip(ss, shapes) if not (sh[d] == 1 and s is None)]
        if not nontrivial or all(s == nontrivial[0] for s in nontrivial):
            out.append(nontrivial[0] if nontrivial else None)
            continue
        r = None
        for s in ss:
            if r is None and s is not None:
                r = s
            elif r is not None and s is not None and r != s:
                raise ShardingTypeError(
                    f"[broadcast_shardings] broadcast_shardings got incompatible shardings for broadcasting: "
                    f"{', '.join(str(tuple(sp)) for sp in specs)}; reshard the operands to one sharding first")
        out.append(r)
    return out


def where(condition, x=None, y=None, /, *, size=None, fill_value=None):
    """``jnp.where(condition, x, y)`` on global arrays: operands of different shapes broadcast
    to ``broadcast_shardings``; then JAX's select rule (cases of one sharding, the condition a
    scalar or sharded as they are)."""
    if x is None or y is None:
        raise NotImplementedError("[where] the one-argument form has a data-dependent shape; pass x and y")
    ops = [condition, x, y]
    mesh = next(o for o in ops if isinstance(o, ShardedArray)).sharding.mesh
    scalar = [not isinstance(o, ShardedArray) and np.ndim(o) == 0 for o in ops]
    g = [as_global(o, mesh) if not s else None for o, s in zip(ops, scalar)]
    dt = _dt.result_type(*[o.dtype if isinstance(o, ShardedArray) else o for o in (x, y)])
    group = (0, 1, 2) if np.ndim(condition) != 0 else (1, 2)
    arrs = [g[i] if g[i] is not None else as_global(np.asarray(ops[i], dt if i else bool), mesh) for i in range(3)]
    # Host data (numpy arrays, scalars) are constants without a mesh in JAX's jitted where: they
    # take no part in the select rule and are laid out as the result, unless operands of
    # different shapes were broadcast (JAX gives each the broadcast sharding).
    host = [not isinstance(o, ShardedArray) for o in ops]
    shapes = [arrs[i].shape for i in group]
    if any(s != shapes[0] for s in shapes):
        shape = np.broadcast_shapes(*shapes)
        spec = broadcast_shardings([arrs[i] for i in group])
        for i in group:
            arrs[i] = broadcast_to(arrs[i], shape, out_sharding=P(*spec))
            host[i] = False
    for a in arrs:
        check_reduced(a, "where")
    arrs = same_mesh(arrs)
    cases = [arrs[i] for i in (1, 2) if not host[i]]
    if len(cases) == 2 and spec_of(cases[0]) != spec_of(cases[1]):
        raise ShardingTypeError(f"[where] select cases must have the same shardings, got "
                                f"[{sharding_str(cases[0])}, {sharding_str(cases[1])}]; reshard them to one "
                                f"sharding first (shardlab.reshard)")
    spec = spec_of(cases[0]) if cases else [None] * arrs[1].ndim
    c = arrs[0]
    if cases and not host[0] and c.ndim and spec_of(c) != spec:
        raise ShardingTypeError(f"[where] select `which` must be scalar or have the same sharding as cases, got "
                                f"`which` sharding {sharding_str(c)} but case sharding {sharding_str(cases[0])}")
    c, xv, yv = [with_spec(a, spec) if a.ndim else a for a in arrs]

    def body(cv, a, b):
        if cv.dtype != np.bool_:
            cv = cv != 0
        return jnp.where(cv, jnp.astype(a, dt), jnp.astype(b, dt))

    return run(body, [c, xv, yv], P(*spec))


def clip(arr=None, /, min=None, max=None, *, a_min=None, a_max=None):  # noqa: A002
    """``jnp.clip``: ``minimum(maximum(arr, min), max)``, with the elementwise sharding rules."""
    lo = min if min is not None else a_min
    hi = max if max is not None else a_max
    out = arr
    if lo is not None:
        out = np.maximum(out, lo)
    if hi is not None:
        out = np.minimum(out, hi)
    return out


def _sort_error(x, ax, spec=None):
    return ShardingTypeError(f"[sort] Arguments to sort must be unsharded over the sorting dimension. Got arg "
                             f"sharding={sharding_str(x, spec)} and sorting dimension={ax}; reshard that dim to "
                             f"None first (shardlab.reshard)")


def _sorting(kind):
    def impl(a, axis=-1, *, kind=None, order=None, stable=True, descending=False, dtype=None):
        x = a
        check_reduced(x, kind_name)
        if axis is None:
            x, axis = ravel(x), 0
        ax = norm_axis(axis, x.ndim, kind_name)
        x = free_dims(x, [ax], lambda: _sort_error(x, ax))
        fn = _more.sort if kind_name == "sort" else _more.argsort
        return run(lambda v: fn(v, axis=ax, descending=descending), [x], x.sharding.spec)

    kind_name = kind
    impl.__name__ = kind
    return impl


sort = _sorting("sort")
argsort = _sorting("argsort")

# -- lax-style cumulative functions (shardlab.lax re-exports them) ------------------------------


def _lax_cum(kind):
    def fn(operand, axis: int = 0, reverse: bool = False):
        if isinstance(operand, ShardedArray):
            return cumulative(kind, operand, axis, reverse=reverse, flatten_none=False)
        local = _cum_local(kind)
        from ..arrays.local_array import LocalArray  # noqa: PLC0415  (one import, only on this path)
        if not isinstance(operand, LocalArray):
            v = np.asarray(operand)
            f = {"cumsum": np.cumsum, "cumprod": np.cumprod, "cummax": np.maximum.accumulate,
                 "cummin": np.minimum.accumulate, "cumlogsumexp": np.logaddexp.accumulate}[kind]
            v = np.flip(v, axis) if reverse else v
            y = f(v, axis=axis)
            return np.flip(y, axis) if reverse else y
        v = _more.flip(operand, axis=axis) if reverse else operand
        y = local(v, axis)
        return _more.flip(y, axis=axis) if reverse else y

    fn.__name__ = kind
    fn.__doc__ = (f"``jax.lax.{kind}(operand, axis=0, reverse=False)``: on a global array, JAX's rule (the "
                  f"axis must be unsharded); on per-device values, along the local axis.")
    return fn


cumsum_lax, cumprod_lax, cummax, cummin, cumlogsumexp = (
    _lax_cum("cumsum"), _lax_cum("cumprod"), _lax_cum("cummax"), _lax_cum("cummin"), _lax_cum("cumlogsumexp"))


# -- registration ------------------------------------------------------------------------------------
for _fn in (np.sum, np.mean, np.max, np.min, np.prod, np.any, np.all, np.var, np.std):
    jnp.GLOBAL[_fn] = _reduce(_fn)
jnp.GLOBAL[np.amax], jnp.GLOBAL[np.amin] = jnp.GLOBAL[np.max], jnp.GLOBAL[np.min]
jnp.GLOBAL[np.argmax] = _arg_reduce(np.argmax)
jnp.GLOBAL[np.argmin] = _arg_reduce(np.argmin)
jnp.GLOBAL[np.cumsum] = _np_cum("cumsum")
jnp.GLOBAL[np.cumprod] = _np_cum("cumprod")
if hasattr(np, "cumulative_sum"):
    jnp.GLOBAL[np.cumulative_sum] = _cumulative_np("cumsum")
    jnp.GLOBAL[np.cumulative_prod] = _cumulative_np("cumprod")
for _fn, _impl in ((np.transpose, transpose), (np.reshape, reshape), (np.ravel, ravel), (np.swapaxes, swapaxes),
                   (np.moveaxis, moveaxis), (np.squeeze, squeeze), (np.expand_dims, expand_dims),
                   (np.broadcast_to, broadcast_to), (np.concatenate, concatenate), (np.stack, stack),
                   (np.split, split), (np.where, where), (np.clip, clip), (np.sort, sort), (np.argsort, argsort)):
    jnp.GLOBAL[_fn] = _impl
