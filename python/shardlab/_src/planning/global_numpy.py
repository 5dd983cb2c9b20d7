"""jax.numpy on global ShardedArrays, with JAX's explicit-sharding rules for reductions: the
local reduction runs on every shard, then a collective (a real, recorded psum / pmax / pmin)
combines the shards of every reduced dimension that was sharded. The result keeps the
sharding of the dimensions that remain.

Example:
    >>> import numpy as np, shardlab as sl
    >>> import shardlab.numpy as jnp
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((4,), ("x",))
    >>> a = sl.device_put(np.arange(8.0, dtype=np.float32).reshape(4, 2), sl.NamedSharding(mesh, P("x")))
    >>> float(np.asarray(jnp.sum(a))), np.asarray(jnp.mean(a, axis=0)).tolist()
    (28.0, [3.0, 4.0])
"""

from __future__ import annotations

import numpy as np

from ..arrays.sharded_array import ShardedArray
from ..core.sharding import P
from ..ops import lax
from ..ops import numpy as jnp
from ..transforms.shard_map import shard_map

_COMBINE = {np.sum: lax.psum, np.max: lax.pmax, np.min: lax.pmin, np.mean: lax.psum}


def _reduce(np_fn, local_fn):
    def impl(x: ShardedArray, *, axis=None, keepdims=False, dtype=None):
        if x.unreduced:
            raise ValueError(f"[{np_fn.__name__}] the array is unreduced along {sorted(x.unreduced)}; "
                             f"reshard it first")
        r = x.ndim
        axes = tuple(range(r)) if axis is None else tuple(a % r for a in ((axis,) if isinstance(axis, int) else axis))
        spec = x.sharding.spec.normalized(r)
        reduced_axes = tuple(a for d in axes for a in spec[d])
        keep = [spec[d] for d in range(r) if d not in axes] if not keepdims else \
            [() if d in axes else spec[d] for d in range(r)]
        out_spec = P(*[None if not e else (e[0] if len(e) == 1 else e) for e in keep])
        in_spec = x.sharding.spec
        count = np.prod([x.shape[d] for d in axes], dtype=np.int64)

        def body(v):
            kw = {} if dtype is None else {"dtype": dtype}
            if np_fn is np.mean:
                v = jnp._inexact(v) if dtype is None else jnp.astype(v, dtype)
                y = jnp.sum(v, axis=axes, keepdims=keepdims)
            else:
                y = local_fn(v, axis=axes, keepdims=keepdims, **kw)
            if reduced_axes:
                y = _COMBINE[np_fn](y, reduced_axes)
            if np_fn is np.mean:
                y = y / y.dtype.type(count)
            return y

        return shard_map(body, mesh=x.sharding.mesh, in_specs=in_spec, out_specs=out_spec)(x)

    return impl


jnp.GLOBAL[np.sum] = _reduce(np.sum, jnp.sum)
jnp.GLOBAL[np.max] = _reduce(np.max, lambda v, **kw: jnp.max(v, **kw))
jnp.GLOBAL[np.min] = _reduce(np.min, lambda v, **kw: jnp.min(v, **kw))
jnp.GLOBAL[np.mean] = _reduce(np.mean, None)
