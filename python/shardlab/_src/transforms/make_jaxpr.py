"""``make_jaxpr``: the ClosedJaxpr (``jaxpr.py``) of a function for given arguments, recorded
shape-only by ``jit(f).trace``.

Example:
    >>> import numpy as np, shardlab as sl
    >>> sl.make_jaxpr(lambda x: x + 1.0)(np.ones(3, np.float32)).out_avals
    [ShapedArray(float32[3])]
"""

from __future__ import annotations

from .jaxpr import ClosedJaxpr
from .jit import jit


def make_jaxpr(fun, static_argnums=(), axis_env=None, return_shape: bool = False):
    """``jax.make_jaxpr``: a function returning the ClosedJaxpr of `fun` for given arguments
    (arrays or ShapeDtypeStructs), recorded shape-only; with ``return_shape=True`` also the
    ShapeDtypeStructs of the results. ``axis_env`` is not supported (pass a shard_map'd
    function instead)."""
    if axis_env:
        raise NotImplementedError("[make_jaxpr] axis_env is not supported: trace a shard_map'd function, whose "
                                  "mesh binds the axis names")
    jitted = jit(fun, static_argnums=static_argnums)

    def wrapped(*args, **kwargs):
        traced = jitted.trace(*args, **kwargs)
        cj = ClosedJaxpr(traced.program)
        return (cj, traced.out_info) if return_shape else cj

    wrapped.__name__ = f"make_jaxpr({getattr(fun, '__name__', 'fun')})"
    return wrapped

