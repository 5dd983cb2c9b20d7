"""The emulated backend's fused elementwise primitives (``primitives/fused.py``), on the C++
kernels of ``shardlab/fused.hpp``: one pass per call, on every core.

Operands of one local shape whose mesh dims differ (one invariant along an axis the other
varies along) are broadcast to the common storage shape first.
"""

from __future__ import annotations

import numpy as np

import shardlab._core as _core

from ..primitives import fused as fu


def _full_shape_contiguous(storages):
    """The storages broadcast to one shape, each C-contiguous (the kernels' layout)."""
    shape = np.broadcast_shapes(*(s.shape for s in storages))
    return [np.ascontiguousarray(np.broadcast_to(s, shape)) for s in storages]


def _silu(storages, mesh):
    return [_core.silu_forward(np.ascontiguousarray(storages[0]))]


def _silu_vjp(storages, mesh):
    x, dy = _full_shape_contiguous(storages)
    return [_core.silu_backward(x, dy)]


def _rows(a):
    """`a` as the row kernels take it: any strides, but a contiguous last dim."""
    return a if a.ndim and a.strides[-1] == a.itemsize else np.ascontiguousarray(a)


def _swiglu(storages, mesh):
    return [_core.swiglu_forward(_rows(storages[0]))]


def _swiglu_vjp(storages, mesh):
    _, (x, dz) = _common_dims(storages, mesh)
    return [_core.swiglu_backward(_rows(x), _rows(dz))]


def _exp_sum(storages, mesh):
    _, (x, shift) = _common_dims(storages, mesh)
    return [_core.exp_sum_forward(_rows(x), np.ascontiguousarray(shift))]


def _exp_sum_vjp(storages, mesh):
    _, (x, shift, ct) = _common_dims(storages, mesh)
    return [_core.exp_sum_backward(_rows(x), np.ascontiguousarray(shift), np.ascontiguousarray(ct))]


def _common_dims(storages, mesh):
    """(dims, views): each storage broadcast, without a copy, to the operands' common mesh
    dims."""
    k = mesh.ndim
    dims = tuple(np.broadcast_shapes(*(s.shape[:k] for s in storages)))
    return dims, [np.broadcast_to(s, dims + s.shape[k:]) for s in storages]


def _per_device(storages, mesh):
    """(P, storages): each storage broadcast to the operands' common mesh dims (P devices in
    all) and made contiguous, so it reshapes to [P, ...] without a copy."""
    dims, views = _common_dims(storages, mesh)
    return int(np.prod(dims)), [np.ascontiguousarray(v) for v in views]


def _rms_norm(storages, mesh, *, eps):
    p, (x, scale) = _per_device(storages, mesh)
    c = x.shape[-1]
    y, rstd = _core.rms_norm_forward(x.reshape(p, -1, c), scale.reshape(p, c), eps)
    return [y.reshape(x.shape), rstd.reshape(x.shape[:-1] + (1,))]


def _rms_norm_vjp(storages, mesh):
    p, (x, scale, rstd, dy) = _per_device(storages, mesh)
    c = x.shape[-1]
    dx, dscale = _core.rms_norm_backward(x.reshape(p, -1, c), scale.reshape(p, c), rstd.reshape(p, -1),
                                         dy.reshape(p, -1, c))
    return [dx.reshape(x.shape), dscale.reshape(scale.shape)]


def _rotary_embedding(storages, mesh, *, inverse):
    p, (x, cos, sin) = _per_device(storages, mesh)
    t, n, h = x.shape[-3:]
    out = _core.rotary_embedding(x.reshape(p, -1, t, n, h), cos.reshape(p, t, -1), sin.reshape(p, t, -1), inverse)
    return [out.reshape(x.shape)]


def _adamw_update(storages, mesh, *, lr, b1, b2, eps, weight_decay, step):
    p, g, m, v = _full_shape_contiguous(storages)
    return list(_core.adamw_update(p, g, m, v, lr=lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                                   c1=1.0 - b1 ** step, c2=1.0 - b2 ** step))


fu.SILU.impl["emulated"] = _silu
fu.SILU_VJP.impl["emulated"] = _silu_vjp
fu.SWIGLU.impl["emulated"] = _swiglu
fu.SWIGLU_VJP.impl["emulated"] = _swiglu_vjp
fu.EXP_SUM.impl["emulated"] = _exp_sum
fu.EXP_SUM_VJP.impl["emulated"] = _exp_sum_vjp
fu.RMS_NORM.impl["emulated"] = _rms_norm
fu.RMS_NORM_VJP.impl["emulated"] = _rms_norm_vjp
fu.ROTARY_EMBEDDING.impl["emulated"] = _rotary_embedding
fu.ADAMW_UPDATE.impl["emulated"] = _adamw_update
