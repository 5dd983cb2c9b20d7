"""``jit`` and ``block_until_ready`` so code written for ``jax.jit`` runs unchanged.

shardlab executes eagerly: there is nothing to compile and every value is ready when it is
returned. ``jit`` therefore calls the function directly, then places the results with
``out_shardings`` when given, as ``jax.jit`` would lay them out.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((4,), ("x",))
    >>> f = sl.jit(lambda a: a * 2, out_shardings=sl.NamedSharding(mesh, P("x")))
    >>> f(np.ones(8)).sharding.spec
    PartitionSpec('x')
"""

from __future__ import annotations

import functools

from ..core import tree as _tree
from ..arrays.sharded_array import ShardedArray, device_put
from ..core.sharding import NamedSharding, PartitionSpec


def _is_sharding(x) -> bool:
    return isinstance(x, (NamedSharding, PartitionSpec))


def jit(fun=None, /, *, in_shardings=None, out_shardings=None, static_argnums=None,
        static_argnames=None, donate_argnums=None, donate_argnames=None, keep_unused=False,
        inline=False):
    """Runs `fun` eagerly (shardlab has no compiler); places outputs per `out_shardings`.

    `in_shardings` places array arguments first (a sharding or a tuple, one per argument);
    static and donated arguments are accepted and need no special treatment here.
    Usable as ``@jit`` and ``@jit(out_shardings=...)``.
    """
    if fun is None:
        return lambda f: jit(f, in_shardings=in_shardings, out_shardings=out_shardings)
    if not callable(fun):
        raise TypeError(f"[jit] expected a function, got {type(fun).__name__}")

    @functools.wraps(fun)
    def wrapped(*args, **kwargs):
        if in_shardings is not None:
            specs = in_shardings if isinstance(in_shardings, (tuple, list)) else (in_shardings,) * len(args)
            if len(specs) != len(args):
                raise ValueError(f"[jit] {len(specs)} in_shardings for {len(args)} arguments")
            args = tuple(a if s is None else device_put(a, s) for a, s in zip(args, specs))
        out = fun(*args, **kwargs)
        if out_shardings is None:
            return out
        leaves, treedef = _tree.flatten(out, lambda x: isinstance(x, ShardedArray))
        specs = _tree.broadcast_prefix(out_shardings, out, _is_sharding, "out_shardings")
        return _tree.unflatten(treedef, [v if s is None else device_put(v, s) for v, s in zip(leaves, specs)])

    return wrapped


def block_until_ready(x):
    """Returns `x`: shardlab's values are ready as soon as they exist."""
    return x
