"""``make_jaxpr``: the recorded program printed as a jaxpr.

The program is the one ``jit(f).trace`` records (``program.py``): every primitive bind in
order, shape-only. It prints in JAX's jaxpr form, with JAX's primitive names where shardlab's
differ (``mul`` for multiply, ``dot_general`` for einsum, ``reduce_scatter`` for
psum_scatter). Values inside shard_map show their per-device shape and the mesh axes they
vary along (``f32[2,4]{V:x}``), as JAX prints a shard_map body; the program is flat: a
shard_map's body is not nested under a ``shard_map`` equation.

Example:
    >>> import numpy as np, shardlab as sl
    >>> print(sl.make_jaxpr(lambda x: x * 2.0)(np.ones((8, 4), np.float32)))
    { lambda ; a:f32[8,4]. let b:f32[8,4] = mul a 2.0:f32[] in (b,) }
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

