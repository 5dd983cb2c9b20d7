"""The per-device fallback: any numpy function applied to each device's local block.

For numpy functions without a rule of their own (``jnp.sort``, ``jnp.unique`` of fixed size,
...). It runs once per distinct block (an invariant value once), is not differentiable, and in
abstract mode finds its output shape by running on one device's block of zeros.

Example:
    >>> from shardlab._src.primitives.fallback import FALLBACK
    >>> FALLBACK.name
    'numpy_fallback'
"""

from __future__ import annotations

import numpy as np

from .primitive import Primitive


def mesh_dims(storages, k):
    return tuple(np.broadcast_shapes(*(tuple(s.shape[:k]) for s in storages if hasattr(s, "shape"))))


def _shape(avals, mesh, *, fn, kwargs):
    k = mesh.ndim
    probes = [np.zeros(tuple(a.shape[k:]), a.dtype) if hasattr(a, "shape") else a for a in avals]
    out = np.asarray(fn(*probes, **dict(kwargs)))
    return [(mesh_dims(avals, k) + out.shape, out.dtype)]


FALLBACK = Primitive("numpy_fallback", shape_rule=_shape)
