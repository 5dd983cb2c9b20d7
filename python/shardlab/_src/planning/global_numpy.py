"""jax.numpy reductions, cumulative ops, ``where``, ``clip`` and ``sort`` on global ShardedArrays,
with JAX's explicit-sharding rules ("sharding in types").

Each op computes its output sharding by JAX 0.10.2's rule for the primitive it lowers to
(``reduce_*``, ``argmax``, ``cumsum``/``cummax``/..., ``select_n`` after
``broadcast_shardings``, ``sort``) or refuses with JAX's ShardingTypeError and JAX's reason,
then runs inside one ``shard_map`` (recorded in the ledger, differentiable):

- reductions run locally, then a psum (sum, mean, var, std, any, all) or an all_gather of the
  shards' partial results (max, min, prod, argmax, argmin: differentiable, where pmax is not)
  combines the shards of every reduced dimension that was sharded;
- cumulative ops and sorts run along an unsharded dim only (JAX refuses a sharded one);
- ``where`` selects locally once its operands share the result's sharding.

Where the offending mesh axes are ``Auto`` axes (``Mesh(...)``'s default, or inside
``auto_axes``), shardlab plays the compiler: it all-gathers those dims and goes on, with the
gather in the ledger. Shape ops live in ``global_shapes``, indexing in ``global_index``.

Example:
    >>> import numpy as np, shardlab as sl
    >>> import shardlab.numpy as jnp
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((2, 4), ("X", "Y"))
    >>> a = sl.device_put(np.arange(64.0, dtype=np.float32).reshape(8, 8), sl.NamedSharding(mesh, P("X", "Y")))
    >>> float(np.asarray(jnp.sum(a))), np.asarray(jnp.mean(a, axis=0))[:2].tolist()
    (2016.0, [28.0, 29.0])
    >>> jnp.argmax(a, axis=1).sharding.spec
    P('X',)
    >>> try:
    ...     jnp.cumsum(a, axis=0)
    ... except sl.sharding.ShardingTypeError as e:
    ...     print(str(e)[:62])
    [cumsum] Input should be unsharded over the axis being reduced
"""

from __future__ import annotations

import math

import numpy as np

from ..arrays.local_array import LocalArray
from ..arrays.sharded_array import ShardedArray
from ..core import dtypes as _dt
from ..core.errors import ShardingTypeError
from ..core.sharding import NamedSharding, P
from ..ops import lax
from ..ops import numpy as jnp
from ..ops.numpy.conversion import _inexact
from ..ops import numpy_fallback as _fb
from .global_common import (as_global, axes_of, check_reduced, free_dims, norm_axis, run, same_mesh, sharding_str,
                            spec_of, type_str, with_spec, _norm_axes)
from .global_ops import global_fallback
from .global_ops import reshard as _plan_reshard
from .global_shapes import broadcast_to, concatenate, ravel, reshape


# -- reductions ------------------------------------------------------------------------------------
_IDENTITY = {np.sum: 0, np.prod: 1, np.any: False, np.all: True}


def _reduce(np_fn):
    name = np_fn.__name__

    def impl(x: ShardedArray, axis=None, dtype=None, out=None, keepdims=False, *, ddof=0, where=None,
             initial=None, **kw):
        check_reduced(x, name)
        if out is not None:
            raise TypeError(f"[{name}] out= is not supported (JAX arrays are immutable)")
        if "correction" in kw and np_fn in (np.var, np.std):
            ddof = kw.pop("correction")  # the array API's name for ddof (jnp.var/std take both)
        if kw:
            raise TypeError(f"[{name}] got unexpected keyword arguments {sorted(kw)}")
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
                    y = combine(jnp.sum(v, axis=axes, keepdims=keepdims), lax.psum)
                    return y if initial is None else y + v.dtype.type(initial)
                if np_fn is np.prod:
                    y = jnp.prod(v, axis=axes, keepdims=keepdims)
                    y = jnp.prod(lax.all_gather(y, reduced, axis=0), axis=0) if reduced else y
                    return y if initial is None else y * v.dtype.type(initial)
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
            v = _inexact(v)
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
            v = jnp.flip(v, axis=ax)
        y = local(v, ax)
        return jnp.flip(y, axis=ax) if reverse else y

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
        # JAX concatenates a replicated constant: a sharded result refuses, as concatenate does
        init = as_global(np.full(shape, 0 if kind == "cumsum" else 1, y.dtype), y.sharding.mesh)
        return concatenate([init, y], axis=ax)

    impl.__name__ = f"cumulative_{kind[3:]}"
    return impl


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
    arrs = same_mesh(arrs, "where")
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
        fn = jnp.sort if kind_name == "sort" else jnp.argsort
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
        if not isinstance(operand, LocalArray):
            v = np.asarray(operand)
            f = {"cumsum": np.cumsum, "cumprod": np.cumprod, "cummax": np.maximum.accumulate,
                 "cummin": np.minimum.accumulate, "cumlogsumexp": np.logaddexp.accumulate}[kind]
            v = np.flip(v, axis) if reverse else v
            y = f(v, axis=axis)
            return np.flip(y, axis) if reverse else y
        v = jnp.flip(operand, axis=axis) if reverse else operand
        y = local(v, axis)
        return jnp.flip(y, axis=axis) if reverse else y

    fn.__name__ = kind
    fn.__doc__ = (f"``jax.lax.{kind}(operand, axis=0, reverse=False)``: on a global array, JAX's rule (the "
                  f"axis must be unsharded); on per-device values, along the local axis.")
    return fn


cumsum_lax, cumprod_lax, cummax, cummin, cumlogsumexp = (
    _lax_cum("cumsum"), _lax_cum("cumprod"), _lax_cum("cummax"), _lax_cum("cummin"), _lax_cum("cumlogsumexp"))


# -- nonzero and repeat: JAX's refusals on sharded arrays --------------------------------------------
def _nonzero_like(np_fn, name: str):
    def fn(a, *args, **kwargs):
        """``jnp.{name}`` on a global array: JAX computes it with a cumulative sum over the flat
        array, which its rule allows only on a fully replicated input (ShardingTypeError
        otherwise, as JAX); a replicated input runs once (a recorded fallback)."""
        a = as_global(a, name)
        if any(axes_of(e) for e in spec_of(a)):
            raise ShardingTypeError(f"[{name}] The input should be fully replicated when axis is not specified to "
                                    f"cumsum. Got input type={type_str(a)}; reshard it to P() first "
                                    f"(shardlab.reshard(x, P()))")
        return global_fallback(np_fn, name, (a, *args), kwargs)

    fn.__name__ = name
    fn.__doc__ = fn.__doc__.format(name=name)
    return fn


def repeat(a, repeats, axis=None, *, total_repeat_length=None, out_sharding=None):
    """``jnp.repeat`` on a global array, with JAX's explicit-sharding rule: repeating along an
    unsharded dim keeps the input's sharding and each device repeats its own block (no
    communication); along a sharded dim (or with ``axis=None``, on the flattened array, when it
    is sharded) JAX asks for ``out_sharding=`` (ValueError), and with it the result is computed
    once and placed there (a recorded fallback, then the move).

    Example:
        >>> import numpy as np, shardlab as sl, shardlab.numpy as jnp
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((2,), ("X",))
        >>> a = sl.device_put(np.arange(4.0).reshape(2, 2), sl.NamedSharding(mesh, P("X")))
        >>> r = jnp.repeat(a, 2, axis=1)
        >>> np.asarray(r).tolist(), r.sharding.spec
        ([[0.0, 0.0, 1.0, 1.0], [2.0, 2.0, 3.0, 3.0]], P('X', None))
    """
    op = "repeat"
    a = as_global(a, op)
    if axis is None:
        a, axis = ravel(a), 0
    axis = norm_axis(axis, a.ndim, op)
    sharded = bool(axes_of(spec_of(a)[axis]))
    if out_sharding is None and sharded:
        raise ValueError(f"[{op}] Please pass sharding to `jnp.repeat` via `out_sharding` parameter. The repeated "
                         f"dim {axis} of {type_str(a)} is sharded, so the result's sharding is yours to choose "
                         f"(e.g. out_sharding=P())")
    if out_sharding is None and total_repeat_length is None and np.ndim(repeats) == 0:
        spec = a.sharding.spec.padded(a.ndim)
        return run(lambda v: jnp.repeat(v, int(repeats), axis=axis), [a], spec, op)

    def whole(x, r, axis):
        out = np.repeat(x, r, axis=axis)
        if total_repeat_length is not None:  # JAX pads with the last value, or cuts
            n = out.shape[axis]
            if total_repeat_length <= n:
                out = np.take(out, np.arange(total_repeat_length), axis=axis)
            else:
                last = np.take(out, [n - 1], axis=axis)
                out = np.concatenate([out] + [last] * (total_repeat_length - n), axis=axis)
        return out

    res = global_fallback(whole, op, (a, np.asarray(repeats), axis), {})
    target = out_sharding if out_sharding is not None else a.sharding
    if isinstance(target, P):
        target = NamedSharding(a.sharding.mesh, target)
    return _plan_reshard(res, target)


# -- registration ------------------------------------------------------------------------------------
for _fn in (np.sum, np.mean, np.max, np.min, np.prod, np.any, np.all, np.var, np.std):
    jnp.register_global(_fn, _reduce(_fn))
jnp.register_global(np.amax, jnp.GLOBAL[np.max])
jnp.register_global(np.amin, jnp.GLOBAL[np.min])
jnp.register_global(np.argmax, _arg_reduce(np.argmax))
jnp.register_global(np.argmin, _arg_reduce(np.argmin))
jnp.register_global(np.cumsum, _np_cum("cumsum"))
jnp.register_global(np.cumprod, _np_cum("cumprod"))
if hasattr(np, "cumulative_sum"):
    jnp.register_global(np.cumulative_sum, _cumulative_np("cumsum"))
    jnp.register_global(np.cumulative_prod, _cumulative_np("cumprod"))
for _fn, _impl in ((np.where, where), (np.clip, clip), (np.sort, sort), (np.argsort, argsort)):
    jnp.register_global(_fn, _impl)
for _fn in (np.nonzero, np.flatnonzero, np.argwhere):
    jnp.register_global(_fn, _nonzero_like(_fn, _fn.__name__))
jnp.register_global(np.repeat, repeat)
