"""The per-device fallback: any numpy function applied to each device's local block.

For numpy functions without a rule of their own (``jnp.median``, ``jnp.unique``, the
permutation of ``jnp.argsort``, ...). It runs once per distinct block (an invariant value
once), or with ``vectorised=True`` once on the whole mesh-factorized storage (for functions
that treat leading dims as a batch: elementwise ones, or ones along a negative ``axis``).
It is not differentiable, and in abstract mode finds its output shape by running on one
device's block of zeros.

Example:
    >>> from shardlab._src.primitives.fallback import FALLBACK
    >>> FALLBACK.name
    'numpy_fallback'
"""

from __future__ import annotations

import numpy as np

from ..core import dtypes
from .primitive import Primitive


def mesh_dims(storages, k):
    return tuple(np.broadcast_shapes(*(tuple(s.shape[:k]) for s in storages if hasattr(s, "shape"))))


def _shape(avals, mesh, *, fn, kwargs, vectorised=False):
    k = mesh.ndim
    probes = [np.zeros(tuple(a.shape[k:]), a.dtype) if hasattr(a, "shape") else a for a in avals]
    with np.errstate(all="ignore"):
        out = np.asarray(fn(*probes, **dict(kwargs)))
    dt = out.dtype
    if dt in dtypes.DTYPES:
        dt = dtypes.canonicalize_dtype(dt)  # numpy's float64 results are float32 with x64 off, as in JAX
    return [(mesh_dims(avals, k) + out.shape, dt)]


FALLBACK = Primitive("numpy_fallback", shape_rule=_shape)
