"""The emulated backend's numpy fallback: a numpy function run per device block (once per
distinct block), or once on the whole storage when it is vectorised."""

from __future__ import annotations

import numpy as np

from ...primitives.fallback import FALLBACK, mesh_dims
from ...primitives.shapes import align
from .common import _impl, _src


def _fallback_name(fn) -> str:
    return getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", "numpy_fallback")


@_impl(FALLBACK)
def _fallback(storages, mesh, *, fn, kwargs, vectorised=False):
    k = mesh.ndim
    dims = mesh_dims(storages, k)
    kw = dict(kwargs)
    ((want, want_dtype),) = FALLBACK.shape_rule(storages, mesh, fn=fn, kwargs=kwargs)
    if vectorised:
        arrays = align(storages, k)
        out = np.asarray(fn(*arrays, **kw))
        if out.shape[k:] == tuple(want[k:]) and out.ndim == len(want):
            return [out.astype(want_dtype, copy=False)]
    blocks = {}
    results = None
    for coords in np.ndindex(*dims):
        args = [s[_src(coords, s.shape, k)] if hasattr(s, "shape") and np.ndim(s) >= k else s for s in storages]
        key = tuple(_src(coords, s.shape, k) if hasattr(s, "shape") else None for s in storages)
        r = blocks.get(key)
        if r is None:
            r = blocks[key] = np.asarray(fn(*args, **kw))
        if results is None:
            results = np.empty(dims + r.shape, want_dtype)
        elif r.shape != results.shape[k:]:
            raise ValueError(f"[{_fallback_name(fn)}] gives local shape {results.shape[k:]} on one device and "
                             f"{r.shape} on another; shardlab needs one local shape (as JAX does: pass a "
                             f"fixed size, e.g. jnp.nonzero(x, size=n) in JAX)")
        results[coords] = r
    return [results]
