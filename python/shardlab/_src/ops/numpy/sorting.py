"""Sorting: ``sort``, ``argsort`` and ``top_k`` on per-device values.
"""

from __future__ import annotations

import functools

import numpy as np

from ...core import dtypes as _dt
from ...primitives.fallback import FALLBACK
from ...primitives.primitive import bind
from .dispatch import _axes, _implements, _local
from .conversion import astype
from .manipulation import reshape
from .indexing import take_along_axis

__all__ = ["argsort", "sort", "top_k"]


def _argsort_local(x, axis, descending=False):
    src = -x if descending and x.dtype.kind != "b" else x
    fn = functools.partial(np.argsort, kind="stable")
    out = bind(FALLBACK, [src], x.mesh, fn=fn, kwargs=(("axis", axis - x.ndim),), vectorised=True)
    return astype(out, _dt.default_int_dtype())


@_implements(np.argsort)
def argsort(x, axis=-1, kind=None, order=None, *, stable=True, descending=False):
    """Indices that sort `x` along a local axis (stable, as jnp.argsort)."""
    if not _local(x):
        return np.argsort(x, axis=axis, kind="stable")
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    (ax,) = _axes(axis, x, "argsort")
    return _argsort_local(x, ax, descending)


@_implements(np.sort)
def sort(x, axis=-1, kind=None, order=None, *, stable=True, descending=False):
    """``x`` sorted along a local axis: the permutation from argsort applied with
    take_along_axis, so the values are differentiable (as jnp.sort's)."""
    if not _local(x):
        return np.sort(x, axis=axis)
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    (ax,) = _axes(axis, x, "sort")
    return take_along_axis(x, _argsort_local(x, ax, descending), ax)


def top_k(x, k: int):
    """The `k` largest entries along the last axis and their indices, as ``jax.lax.top_k``
    (values differentiable; ties keep the lower index first).

    Example:
        >>> import numpy as np, shardlab.numpy as jnp
        >>> v, i = jnp.top_k(np.array([1.0, 5.0, 3.0], np.float32), 2)
        >>> v.tolist(), i.tolist()
        ([5.0, 3.0], [1, 2])
    """
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 0:
        raise ValueError(f"[top_k] k must be a non-negative int, got {k!r}")
    if not _local(x):
        x = np.asarray(x)
        if k > x.shape[-1]:
            raise ValueError(f"[top_k] k={k} is more than the last axis' size {x.shape[-1]}")
        idx = np.argsort(-x, axis=-1, kind="stable")[..., :k].astype(_dt.default_int_dtype())
        return np.take_along_axis(x, idx, -1), idx
    if x.ndim == 0 or k > x.shape[-1]:
        raise ValueError(f"[top_k] k={k} is more than the last local axis of shape {x.shape}")
    idx = _argsort_local(x, x.ndim - 1, descending=True)[..., :k]
    return take_along_axis(x, idx, -1), idx
