"""jax.numpy on global ShardedArrays, with JAX's explicit-sharding rules ("sharding in types").

Every function runs inside one ``shard_map`` (so it is differentiable and its collectives are
recorded) and returns a ShardedArray that carries a sharding:

- reductions (sum, mean, max, min, prod, any, all, var, std) run the local reduction on every
  shard, then a collective (psum / pmax / pmin, or an all_gather for prod) combines the shards
  of every reduced dimension that was sharded; the remaining dims keep their sharding;
- transpose permutes the spec; reshape keeps the sharding where JAX does (a sharded dim split
  with the sharding on its leading part, or merged as the major dim of a group), indexing
  keeps it on the dims taken whole, concatenate along an unsharded dim keeps it; anything else
  raises and asks for ``shardlab.reshard`` first, as JAX does.

Example:
    >>> import numpy as np, shardlab as sl
    >>> import shardlab.numpy as jnp
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((4,), ("x",))
    >>> a = sl.device_put(np.arange(8.0, dtype=np.float32).reshape(4, 2), sl.NamedSharding(mesh, P("x")))
    >>> float(np.asarray(jnp.sum(a))), np.asarray(jnp.mean(a, axis=0)).tolist()
    (28.0, [3.0, 4.0])
    >>> jnp.reshape(a, (8,)).sharding.spec, jnp.transpose(a).sharding.spec
    (PartitionSpec('x'), PartitionSpec(None, 'x'))
"""

from __future__ import annotations

import math

import numpy as np

from ..arrays.sharded_array import ShardedArray
from ..core.sharding import P
from ..ops import lax
from ..ops import numpy as jnp
from ..transforms.shard_map import shard_map


def _entry(axes: tuple):
    return None if not axes else (axes[0] if len(axes) == 1 else tuple(axes))


def _spec(x: ShardedArray) -> list:
    return [tuple(e) for e in x.sharding.spec.normalized(x.ndim)]


def _check(x: ShardedArray, op: str) -> None:
    if x.unreduced:
        raise ValueError(f"[{op}] the array is unreduced along {sorted(x.unreduced)}; reshard it first")


def _run(body, x: ShardedArray, out_spec, *others):
    specs = (x.sharding.spec,) + tuple(o.sharding.spec for o in others)
    return shard_map(body, mesh=x.sharding.mesh, in_specs=specs, out_specs=out_spec)(x, *others)


def _norm_axes(axis, r: int, op: str) -> tuple:
    axes = tuple(range(r)) if axis is None else (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    for a in axes:
        if not -r <= a < r:
            raise np.exceptions.AxisError(f"[{op}] axis {a} is out of bounds for an array of rank {r}")
    return tuple(sorted(a % r for a in axes))


# -- reductions ------------------------------------------------------------------------------------
def _reduce(np_fn):
    name = np_fn.__name__

    def impl(x: ShardedArray, *, axis=None, keepdims=False, dtype=None, ddof=0):
        _check(x, name)
        r = x.ndim
        axes = _norm_axes(axis, r, name)
        spec = _spec(x)
        reduced = tuple(a for d in axes for a in spec[d])
        keep = [() if d in axes else spec[d] for d in range(r)] if keepdims else \
            [spec[d] for d in range(r) if d not in axes]
        count = math.prod(x.shape[d] for d in axes)

        def combine(y, op):
            return op(y, reduced) if reduced else y

        def body(v):
            if dtype is not None:
                v = jnp.astype(v, dtype)
            if np_fn in (np.sum, np.prod):
                y = (jnp.sum if np_fn is np.sum else jnp.prod)(v, axis=axes, keepdims=keepdims)
                if np_fn is np.sum:
                    return combine(y, lax.psum)
                if not reduced:
                    return y
                return jnp.prod(lax.all_gather(y, reduced, axis=0, tiled=False), axis=0)
            if np_fn in (np.max, np.min):
                y = (jnp.max if np_fn is np.max else jnp.min)(v, axis=axes, keepdims=keepdims)
                return combine(y, lax.pmax if np_fn is np.max else lax.pmin)
            if np_fn in (np.any, np.all):
                hits = jnp.sum(jnp.astype(v != 0 if np_fn is np.any else v == 0, np.int32), axis=axes,
                               keepdims=keepdims)
                hits = combine(hits, lax.psum)
                return hits > 0 if np_fn is np.any else hits == 0
            v = jnp._inexact(v)
            mu = combine(jnp.sum(v, axis=axes, keepdims=True), lax.psum) / v.dtype.type(count)
            if np_fn is np.mean:
                return mu if keepdims else jnp.squeeze(mu, axis=axes)
            d = v - mu
            var = combine(jnp.sum(d * d, axis=axes, keepdims=keepdims), lax.psum) / v.dtype.type(max(count - ddof, 0))
            return var if np_fn is np.var else np.sqrt(var)

        return _run(body, x, P(*[_entry(e) for e in keep]))

    impl.__name__ = name
    return impl


# -- transpose, reshape, indexing, concatenate --------------------------------------------------------
def _transpose(x: ShardedArray, axes=None):
    _check(x, "transpose")
    r = x.ndim
    perm = tuple(range(r))[::-1] if axes is None else tuple(a % r for a in axes)
    if sorted(perm) != list(range(r)):
        raise ValueError(f"[transpose] axes {axes} are not a permutation of rank {r}")
    spec = _spec(x)
    return _run(lambda v: jnp.transpose(v, perm), x, P(*[_entry(spec[p]) for p in perm]))


def _groups(old: tuple, new: tuple):
    """Pairs of (old dims, new dims) with equal products, each as small as possible."""
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


def _reshape(x: ShardedArray, shape, order="C"):
    _check(x, "reshape")
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    shape = np.empty(x.shape, dtype=np.int8).reshape(shape).shape if -1 in shape else shape
    if math.prod(shape) != x.size:
        raise ValueError(f"[reshape] cannot reshape shape {x.shape} into {shape}")
    spec = _spec(x)
    mesh = x.sharding.mesh
    new_spec = [()] * len(shape)
    for gi, gj in _groups(x.shape, shape):
        sharded = [d for d in gi if spec[d]]
        if not sharded:
            continue
        head = sharded[0]
        n = math.prod(mesh.shape[a] for a in spec[head])
        ok = len(sharded) == 1 and gj and (head == gi[0] or all(x.shape[d] == 1 for d in gi[:gi.index(head)]))
        first = next((d for d in gj if shape[d] != 1), gj[0] if gj else None)
        if not ok or first is None or shape[first] % n:
            raise ValueError(f"[reshape] reshaping {x.shape} sharded as {x.sharding.spec} into {shape} would move "
                             f"data between devices; reshard first (shardlab.reshard(x, P(...)) so the "
                             f"dims being split or merged are unsharded or the major dim of their group)")
        new_spec[first] = spec[head]
    local = tuple(s // math.prod(mesh.shape[a] for a in e) for s, e in zip(shape, new_spec))
    return _run(lambda v: jnp.reshape(v, local), x, P(*[_entry(e) for e in new_spec]))


def _getitem(x: ShardedArray, key):
    _check(x, "getitem")
    key = key if isinstance(key, tuple) else (key,)
    if any(not isinstance(k, (int, np.integer, slice, type(None), type(Ellipsis))) for k in key):
        raise TypeError("[getitem] a global ShardedArray takes ints, slices, None and ... as indices; "
                        "for array indices use jnp.take inside shard_map")
    if sum(k is Ellipsis for k in key) > 1:
        raise IndexError("[getitem] an index can only have a single ellipsis ('...')")
    n_real = sum(k is not None and k is not Ellipsis for k in key)
    if n_real > x.ndim:
        raise IndexError(f"[getitem] too many indices for an array of rank {x.ndim}")
    if Ellipsis in key:
        e = key.index(Ellipsis)
        key = key[:e] + (slice(None),) * (x.ndim - n_real) + key[e + 1:]
    else:
        key = key + (slice(None),) * (x.ndim - n_real)
    spec = _spec(x)
    out_spec, d = [], 0
    for k in key:
        if k is None:
            out_spec.append(())
            continue
        whole = isinstance(k, slice) and k.indices(x.shape[d]) == (0, x.shape[d], 1)
        if spec[d] and not whole:
            raise ValueError(f"[getitem] index {k!r} on dim {d} of shape {x.shape}, which is sharded over "
                             f"{spec[d]}; reshard so the dim is unsharded first (shardlab.reshard)")
        if isinstance(k, slice):
            out_spec.append(spec[d])
        d += 1
    return _run(lambda v: v[key], x, P(*[_entry(e) for e in out_spec]))


def _concatenate(arrays, axis=0, dtype=None):
    arrays = list(arrays)
    first = next(a for a in arrays if isinstance(a, ShardedArray))
    others = [a if isinstance(a, ShardedArray) else None for a in arrays]
    if any(o is None for o in others):
        raise TypeError("[concatenate] mixes global ShardedArrays with other values; device_put them first")
    for a in arrays:
        _check(a, "concatenate")
        if a.sharding != first.sharding or a.ndim != first.ndim:
            raise ValueError(f"[concatenate] operands have shardings {[str(b.sharding.spec) for b in arrays]}; "
                             f"reshard them to one sharding first")
    ax = axis % first.ndim
    if _spec(first)[ax]:
        raise ValueError(f"[concatenate] axis {axis} is sharded over {_spec(first)[ax]}; reshard so it is "
                         f"unsharded first (shardlab.reshard)")
    spec = first.sharding.spec
    return shard_map(lambda *vs: jnp.concatenate(vs, axis=ax, dtype=dtype), mesh=first.sharding.mesh,
                     in_specs=(spec,) * len(arrays), out_specs=spec)(*arrays)


for _fn in (np.sum, np.mean, np.max, np.min, np.prod, np.any, np.all, np.var, np.std):
    jnp.GLOBAL[_fn] = _reduce(_fn)
jnp.GLOBAL[np.transpose] = _transpose
jnp.GLOBAL[np.reshape] = _reshape
jnp.GLOBAL[np.concatenate] = _concatenate
jnp.GLOBAL["getitem"] = _getitem
ShardedArray.__getitem__ = _getitem  # registered here, as LocalArray's methods are by the ops layer

