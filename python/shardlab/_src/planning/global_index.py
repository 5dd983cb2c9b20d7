"""Indexing, gathers and ``.at[]`` scatters on global ShardedArrays, with JAX's rules.

JAX lowers ``x[idx]``, ``jnp.take`` and ``jnp.take_along_axis`` to a ``gather`` and
``x.at[idx].set/add/...`` to a ``scatter``. Their explicit-sharding rules (JAX 0.10.2,
``lax/slicing.py``) come down to:

- a dimension that is indexed (an int, an index array, a boolean mask) must be unsharded; a
  whole slice ``:`` keeps its sharding, and so does a reverse ``::-1`` (one ppermute puts the
  blocks back in order); with no index array, any other slice of a sharded dim keeps it too
  when the axes divide its length (JAX's ``slice`` rule, as under ``jit``; JAX's eager
  indexing gathers and refuses it; here the dim is all-gathered, sliced and re-split);
  ``None`` adds an unsharded dim; the dims an index array makes are unsharded, and an index
  array must itself be replicated (``take_along_axis``'s may be sharded like the operand,
  batch-wise);
- anything else is refused with JAX's ShardingTypeError, which asks for
  ``x.at[idx].get(out_sharding=...)`` (or ``.set(..., out_sharding=...)``): with it the op
  runs as JAX's ``auto_axes`` would (the indexed dims are all-gathered) and the result is
  resharded to ``out_sharding``;
- a scatter's values are broadcast to the indexed slice sharded as the operand's kept dims
  (JAX's ValueError "Incompatible types for broadcasting" otherwise) and the result keeps the
  operand's sharding.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((2, 4), ("X", "Y"))
    >>> x = sl.device_put(np.arange(64.0, dtype=np.float32).reshape(8, 8), sl.NamedSharding(mesh, P("X", None)))
    >>> x[:, 3].sharding.spec, np.asarray(x[:, 3])[:3].tolist()
    (P('X',), [3.0, 11.0, 19.0])
    >>> x.at[0].get(out_sharding=P("Y")).sharding.spec
    P('Y',)
    >>> y = x.at[:, 0].add(100.0)
    >>> y.sharding.spec, float(np.asarray(y)[1, 0])
    (P('X', None), 108.0)
"""

from __future__ import annotations

import math

import numpy as np

from ..arrays.index_update import IndexOps, at_property
from ..arrays.local_array import LocalArray
from ..arrays.sharded_array import ShardedArray, device_put
from ..core.errors import ShardingTypeError
from ..core.sharding import NamedSharding, P
from ..ops import lax
from ..ops import numpy as jnp
from ..primitives import structural as st
from ..primitives.primitive import bind
from .global_common import (as_global, axes_of, check_reduced, free_dims, gather_dims, norm_axis, run, same_mesh,
                            slice_dims, spec_of, type_str, with_spec)
from .global_shapes import broadcast_to, ravel
from .global_ops import reshard as _plan_reshard


def _gather_error(x, what="") -> ShardingTypeError:
    return ShardingTypeError(
        "[getitem] Use `.at[...].get(out_sharding=)` to provide output PartitionSpec for the gather indexing as "
        "out sharding could not be resolved unambiguously (or would require collectives on inputs). Got "
        f"operand={type_str(x)}{what}. Index only unsharded dims, reshard first (shardlab.reshard), or pass "
        "out_sharding=")


def _scatter_error(x, what="") -> ShardingTypeError:
    return ShardingTypeError(
        "[scatter] Use `.at[...].set/add/mul/...(out_sharding=)` to provide output PartitionSpec for the scatter "
        "update as out sharding could not be resolved unambiguously (or would require collectives on inputs). "
        f"Got operand={type_str(x)}{what}. Update only unsharded dims, reshard first, or pass out_sharding=")


# -- the index, in JAX's terms -------------------------------------------------------------------
class _Index:
    """A numpy index on a global array: per operand dim whether it is kept whole ("whole"),
    reversed ("rev") or indexed, the output spec, and the key each device applies locally."""

    def __init__(self, x: ShardedArray, key, op: str):
        self.x = x
        if isinstance(key, list):
            raise TypeError(f"[{op}] Using a non-tuple sequence for multidimensional indexing is not allowed; use "
                            f"`arr[array(seq)]` instead of `arr[seq]`. See https://github.com/jax-ml/jax/issues/4564 "
                            f"for more information.")
        key = key if isinstance(key, tuple) else (key,)
        entries = []
        for k in key:
            if isinstance(k, LocalArray):
                raise TypeError(f"[{op}] a per-device (shard_map) value cannot index a global array")
            if isinstance(k, ShardedArray):
                if any(spec_of(k)):
                    raise _gather_error(x, f", indices={type_str(k)} (index arrays must be replicated)")
                k = np.asarray(k)
            elif isinstance(k, (list, tuple)):
                k = np.asarray(k)
            if isinstance(k, np.ndarray) and k.dtype.kind not in "iub":
                raise IndexError(f"[{op}] index arrays must be integers or booleans, got dtype {k.dtype}")
            if isinstance(k, np.ndarray) and k.ndim == 0 and k.dtype.kind in "iu":
                k = int(k)
            if isinstance(k, (bool, np.bool_)):
                raise NotImplementedError(f"[{op}] a scalar boolean index on a global array is not supported")
            entries.append(k)
        ells = [i for i, k in enumerate(entries) if k is Ellipsis]
        if len(ells) > 1:
            raise IndexError(f"[{op}] an index can only have a single ellipsis ('...')")
        def width(k):  # the operand dims an entry consumes (a boolean mask: its rank)
            return 0 if k is None or k is Ellipsis else k.ndim if isinstance(k, np.ndarray) and k.dtype == np.bool_ \
                else 1
        real = sum(width(k) for k in entries)
        if real > x.ndim:
            raise IndexError(f"[{op}] too many indices for array: array is {x.ndim}-dimensional, but {real} were "
                             f"indexed")
        if ells:
            e = ells[0]
            entries = entries[:e] + [slice(None)] * (x.ndim - real) + entries[e + 1:]
        else:
            entries = entries + [slice(None)] * (x.ndim - real)
        masks, d = [], 0
        for i, k in enumerate(entries):
            if isinstance(k, np.ndarray) and k.dtype == np.bool_:
                if k.shape != tuple(x.shape[d:d + k.ndim]):
                    raise IndexError(f"[{op}] boolean index did not match shape of indexed array in index {i}: got "
                                     f"{k.shape}, expected {list(x.shape[d:d + k.ndim])}")
                masks.append((i, np.nonzero(k)))
            d += width(k)
        for i, parts in reversed(masks):
            entries = entries[:i] + list(parts) + entries[i + 1:]
        arrays = [np.shape(k) for k in entries if isinstance(k, np.ndarray)]
        try:
            np.broadcast_shapes(*arrays)
        except ValueError:
            raise ValueError(f"[{op}] Incompatible shapes for broadcasting: shapes={arrays}") from None
        probe = np.broadcast_to(np.zeros((), np.int8), x.shape)
        try:
            self.shape = probe[tuple(entries)].shape
        except IndexError as err:
            raise IndexError(f"[{op}] {err} (shape {x.shape})") from None
        spec = spec_of(x)
        self.kind, dims = {}, []
        d = 0
        for k in entries:
            if k is None:
                dims.append(None)
                continue
            n = x.shape[d]
            if isinstance(k, slice):
                # with index arrays JAX gathers, and a reversed or partial slice is then indexed
                rng = k.indices(n)
                size = len(range(*rng))
                self.kind[d] = "whole" if rng == (0, n, 1) else \
                    "rev" if rng == (n - 1, -1, -1) and not arrays else \
                    "sliced" if not arrays and spec[d] is not None and size % _axes_size(x, spec[d]) == 0 else \
                    "indexed"
            else:
                self.kind[d] = "indexed"
            dims.append(d)
            d += 1
        self.entries = entries
        adv = [i for i, k in enumerate(entries) if isinstance(k, np.ndarray) or arrays and isinstance(k, int)]
        b = np.broadcast_shapes(*[np.shape(entries[i]) for i in adv]) if adv else ()
        out, self.out_dim = [], {}
        for i, k in enumerate(entries):
            if adv and i == adv[0] and adv == list(range(adv[0], adv[-1] + 1)):
                out += [None] * len(b)
            if k is None:
                out.append(None)
            elif isinstance(k, slice):
                self.out_dim[dims[i]] = len(out)
                out.append(spec[dims[i]] if self.kind[dims[i]] != "indexed" else None)
        if adv and adv != list(range(adv[0], adv[-1] + 1)):
            self.out_dim = {d: o + len(b) for d, o in self.out_dim.items()}
            out = [None] * len(b) + out
        assert len(out) == len(self.shape), (out, self.shape)
        self.out_spec = out
        self.indexed = [d for d, kd in self.kind.items() if kd == "indexed"]
        self.rev = [d for d, kd in self.kind.items() if kd == "rev" and spec[d] is not None]
        self.sliced = [d for d, kd in self.kind.items() if kd == "sliced"]

    def local_key(self):
        """The key on a device's block: whole and reversed dims keep the device's part."""
        out, d = [], 0
        for k in self.entries:
            if k is None:
                out.append(None)
                continue
            kd = self.kind[d]  # "sliced" dims are gathered whole first, so they take the global slice
            out.append(slice(None) if kd == "whole" else slice(None, None, -1) if kd == "rev" else k)
            d += 1
        return tuple(out)

    def local_plan(self):
        """(a permutation of the block's dims or None, the key after it). Index arrays split by
        slices put their dims first (numpy's rule); moving the dims they index to the front
        first gives the same result with the arrays side by side."""
        key = self.local_key()
        pos = [i for i, k in enumerate(key) if isinstance(k, (np.ndarray, int))]
        if not any(isinstance(key[i], np.ndarray) for i in pos) or pos == list(range(pos[0], pos[-1] + 1)):
            return None, key
        dim_of, d = {}, 0
        for i, k in enumerate(key):
            if k is not None:
                dim_of[i] = d
                d += 1
        rest = [i for i in range(len(key)) if i not in pos]
        perm = [dim_of[i] for i in pos] + [dim_of[i] for i in rest if i in dim_of]
        return perm, tuple(key[i] for i in pos) + tuple(key[i] for i in rest)

    def sliced_spec(self):
        """The spec of ``x[idx]``'s slice shape where a scatter's values go (JAX's
        ``slice_sharding``): the operand's entry on whole dims, None elsewhere."""
        return self.out_spec


def _reverse_blocks(v, spec_entries):
    for e in spec_entries:
        a = axes_of(e)
        name = a if len(a) > 1 else a[0]
        n = lax.axis_size(name)
        v = lax.ppermute(v, name, [(i, n - 1 - i) for i in range(n)])
    return v


def _axes_size(x, e) -> int:
    return math.prod(x.sharding.mesh.shape[a] for a in axes_of(e))


def _gather(x: ShardedArray, ix: _Index) -> ShardedArray:
    perm, key = ix.local_plan()
    spec = spec_of(x)
    rev = [spec[d] for d in ix.rev]
    out_spec = list(ix.out_spec)
    sliced_out = [ix.out_dim[d] for d in ix.sliced]

    def body(v):
        # a static slice of a sharded dim (JAX's slice rule, when its size divides): the dim is
        # gathered, sliced, and each device keeps its block of the result
        v = gather_dims(v, spec, ix.sliced)
        y = (jnp.transpose(v, perm) if perm else v)[key]
        y = slice_dims(y, out_spec, sliced_out)
        return _reverse_blocks(y, rev) if rev else y

    return run(body, [x], P(*ix.out_spec))


def getitem(x: ShardedArray, key, *, out_sharding=None, mode=None, fill_value=None, indices_are_sorted=False,
            unique_indices=False, wrap_negative_indices=True):
    """``x[key]`` / ``x.at[key].get(...)`` on a global array (JAX's gather rule)."""
    check_reduced(x, "getitem")
    ix = _Index(x, key, "getitem")
    if 0 in ix.shape and out_sharding is None:
        # nothing to gather: JAX checks no sharding either, and slices keep the operand's
        spec, out = spec_of(x), list(ix.out_spec)
        for d, o in ix.out_dim.items():
            if ix.shape[o] % _axes_size(x, spec[d]):
                raise ValueError(f"[getitem] Sharding spec {spec[d]!r} of dim {d} does not evenly divide the size "
                                 f"{ix.shape[o]} of the result's dim {o} (result shape {ix.shape})")
            out[o] = spec[d]
        return device_put(np.zeros(ix.shape, x.dtype), NamedSharding(x.sharding.mesh, P(*out)))
    if out_sharding is None:
        x2 = free_dims(x, ix.indexed, lambda: _gather_error(x))
        if x2 is not x:
            ix = _Index(x2, key, "getitem")
        return _gather(x2, ix)
    x2 = with_spec(x, [None if d in ix.indexed else e for d, e in enumerate(spec_of(x))]) if ix.indexed else x
    res = _gather(x2, _Index(x2, key, "getitem") if x2 is not x else ix)
    return _plan_reshard(res, _as_sharding(out_sharding, x))


def _as_sharding(s, x) -> NamedSharding:
    if isinstance(s, NamedSharding):
        return s
    if isinstance(s, P):
        return NamedSharding(x.sharding.mesh, s)
    raise TypeError(f"out_sharding must be a PartitionSpec or NamedSharding, got {s!r}")


# -- scatter (.at[].set / add / ...) ------------------------------------------------------------------
def _values(x: ShardedArray, ix: _Index, values, op: str) -> ShardedArray:
    """The update values broadcast to the indexed slice, sharded as JAX's ``slice_sharding``."""
    mesh = x.sharding.mesh
    spec = P(*ix.sliced_spec())
    if isinstance(values, ShardedArray):
        check_reduced(values, op)
        v = same_mesh([x, values], op)[1]
        v = broadcast_to(v, ix.shape, out_sharding=spec)
        return v if v.dtype == x.dtype else run(lambda a: jnp.astype(a, x.dtype), [v], v.sharding.spec)
    arr = np.asarray(values)
    if arr.ndim > len(ix.shape) or any(a not in (1, b) for a, b in zip(arr.shape[::-1], ix.shape[::-1])):
        raise ValueError(f"[{op}] Incompatible shapes for broadcasting: values of shape {arr.shape} into the "
                         f"indexed slice of shape {ix.shape}")
    return device_put(np.broadcast_to(arr.astype(x.dtype), ix.shape), NamedSharding(mesh, spec))


def scatter(x: ShardedArray, key, values, how: str, *, out_sharding=None, mode=None, indices_are_sorted=False,
            unique_indices=False, wrap_negative_indices=True) -> ShardedArray:
    """``x.at[key].<how>(values)``: how in set, add, subtract, multiply, divide, power, min, max."""
    op = f".at[].{how if isinstance(how, str) else 'apply'}"
    check_reduced(x, op)
    if how in ("divide", "power") and out_sharding is not None:
        # JAX: x / ones_like(x).at[idx].mul(values, out_sharding=...): the division then follows
        # the elementwise broadcasting rule between x and that factor
        ones = run(lambda v: jnp.ones_like(v), [x], x.sharding.spec)
        factor = scatter(ones, key, values, "multiply", out_sharding=out_sharding)
        return np.divide(x, factor) if how == "divide" else np.power(x, factor)
    ix = _Index(x, key, op)
    if 0 in ix.shape:
        return x  # an empty update, as JAX's (which checks nothing either)
    target = None
    # a scatter into a slice or a reverse of a sharded dim is refused even where a gather keeps it;
    # JAX's apply scatters unsharded updates, so any sharded dim of the operand refuses it
    moving = ix.indexed + ix.sliced + ix.rev if isinstance(how, str) else list(range(x.ndim))
    if out_sharding is not None:
        target = _as_sharding(out_sharding, x)
        if moving:
            x = with_spec(x, [None if d in moving else e for d, e in enumerate(spec_of(x))])
            ix = _Index(x, key, op)
    vals = _values(x, ix, values, op)
    if out_sharding is None:
        x2 = free_dims(x, moving, lambda: _scatter_error(x, f", updates={type_str(vals)}"))
        if x2 is not x:
            x, ix = x2, _Index(x2, key, op)
            vals = _values(x, ix, values, op)
    key_local = ix.local_key()  # every updated dim is unsharded here, so global = local indices

    def body(xv, vv):
        mask = np.zeros(xv.shape, bool)
        mask[key_local] = True
        placed = bind(st.SCATTER_ADD, [vv], xv.mesh, key=key_local, local_shape=xv.shape)
        if how == "add":
            return xv + placed
        if how == "subtract":
            return xv - placed
        if how == "set":
            return jnp.where(mask, placed, xv)
        if how in ("multiply", "divide", "power"):
            factor = jnp.where(mask, placed, xv.dtype.type(1))
            return xv * factor if how == "multiply" else xv / factor if how == "divide" else xv ** factor
        if how in ("min", "max"):
            best = (np.minimum if how == "min" else np.maximum)(xv, placed)
            return jnp.where(mask, best, xv)
        if callable(how):  # .apply(func): func on the updated elements, once each
            return jnp.where(mask, how(xv), xv)
        raise ValueError(f"[scatter] unknown update {how!r}")

    res = run(body, [x, vals], x.sharding.spec)
    return res if target is None else _plan_reshard(res, target)


def _at_get(x: ShardedArray, key, *, mode=None, fill_value=None, out_sharding=None):
    return getitem(x, key, out_sharding=out_sharding, mode=mode, fill_value=fill_value)


def _at_scatter(x: ShardedArray, key, values, how, *, mode=None, out_sharding=None):
    """``.at[key].<how>``; ``.apply(func)`` (how a function): JAX scatters unsharded updates, so a
    sharded operand is refused, and a repeated index applies ``func`` once here."""
    if isinstance(how, str):
        return scatter(x, key, values, how, out_sharding=out_sharding, mode=mode)
    return scatter(x, key, 0, how, mode=mode)


# -- take, take_along_axis -----------------------------------------------------------------------------
def _index_array(x, indices, op, allow_spec=False):
    if isinstance(indices, ShardedArray):
        if any(spec_of(indices)) and not allow_spec:
            raise _gather_error(x, f", indices={type_str(indices)} (index arrays must be replicated)")
        return indices if allow_spec else np.asarray(indices)
    arr = np.asarray(indices)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"[{op}] indices must be integers, got dtype {arr.dtype}")
    return arr


def take(a: ShardedArray, indices, axis=None, out=None, mode=None, unique_indices=False, indices_are_sorted=False,
         fill_value=None):
    """``jnp.take``: the taken dim must be unsharded; the index dims are unsharded."""
    check_reduced(a, "take")
    if axis is None:
        a, axis = ravel(a), 0
    ax = norm_axis(axis, a.ndim, "take")
    idx = _index_array(a, indices, "take")
    a = free_dims(a, [ax], lambda: _gather_error(a))
    spec = spec_of(a)
    out_spec = spec[:ax] + [None] * idx.ndim + spec[ax + 1:]
    n = a.shape[ax]
    if mode == "clip":
        idx = np.clip(idx, -n, n - 1)
    elif idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"[take] index out of range for axis {ax} of size {n} (shardlab has no mode='fill'); "
                         f"pass mode='clip'")
    idx = np.where(idx < 0, idx + n, idx)
    return run(lambda v: v[(slice(None),) * ax + (idx,)], [a], P(*out_spec))


def take_along_axis(arr: ShardedArray, indices, axis=-1, mode=None, fill_value=None, *, wrap_negative_indices=None):
    """``jnp.take_along_axis``: the axis must be unsharded in both; other dims of the operand
    and the index resolve batch-wise (equal, or one unsharded)."""
    check_reduced(arr, "take_along_axis")
    x = arr
    mesh = x.sharding.mesh
    idx = _index_array(x, indices, "take_along_axis", allow_spec=True)
    if axis is None:
        x, axis = ravel(x), 0
        idx = ravel(idx) if isinstance(idx, ShardedArray) else np.reshape(idx, (-1,))
    ax = norm_axis(axis, x.ndim, "take_along_axis")
    if np.ndim(idx) != x.ndim:
        raise ValueError(f"[take_along_axis] indices and array must have the same number of dimensions; "
                         f"{np.ndim(idx)} vs {x.ndim}")
    x = free_dims(x, [ax], lambda: _gather_error(x, f", indices of shape {np.shape(idx)}"))
    gi = idx if isinstance(idx, ShardedArray) else as_global(idx.astype(np.int32), mesh)
    check_reduced(gi, "take_along_axis")
    gi = same_mesh([x, gi], "take_along_axis")[1]
    gi = free_dims(gi, [ax], lambda: _gather_error(x, f", indices={type_str(gi)}"))
    xs, ispec = spec_of(x), spec_of(gi)
    out = []
    for d in range(x.ndim):
        if d == ax:
            out.append(None)
        elif xs[d] is not None and ispec[d] is not None and xs[d] != ispec[d]:
            raise _gather_error(x, f", indices={type_str(gi)}")
        else:
            out.append(xs[d] if xs[d] is not None and gi.shape[d] != 1 or ispec[d] is None else ispec[d])
    xspec = [out[d] if x.shape[d] != 1 else None for d in range(x.ndim)]
    ispec2 = [out[d] if gi.shape[d] != 1 else None for d in range(x.ndim)]
    x = with_spec(x, xspec)
    gi = with_spec(gi, ispec2)
    n = x.shape[ax]

    def body(v, i):
        i = jnp.astype(i, np.int32)
        i = jnp.where(i < 0, i + np.int32(n), i)
        return jnp.take_along_axis(v, i, ax)

    return run(body, [x, gi], P(*out))


def _iterate(x: ShardedArray):
    """``iter(x)``, as ``jax.Array.__iter__``: a fully replicated array yields its rows (each
    replicated); a sharded one is read back to the host and each row placed again, replicated
    (JAX places it on one device; no collective either way)."""
    if x.ndim == 0:
        raise TypeError("iteration over a 0-d array")
    if not any(spec_of(x)) and not x.unreduced:
        return (getitem(x, i) for i in range(x.shape[0]))
    value = np.asarray(x)
    rep = NamedSharding(x.sharding.mesh, P())
    return (device_put(value[i], rep) for i in range(x.shape[0]))


jnp.register_global("getitem", getitem)
jnp.register_global(np.take, take)
jnp.register_global(np.take_along_axis, take_along_axis)
ShardedArray.__getitem__ = getitem  # registered here, as LocalArray's methods are by the ops layer
ShardedArray.__iter__ = _iterate
ShardedArray.at = at_property(IndexOps(get=_at_get, scatter=_at_scatter))
