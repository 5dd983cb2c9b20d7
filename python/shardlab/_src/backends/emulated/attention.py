"""The emulated backend's flash attention (forward and backward): every device's block
folded into the batch dim of one kernel call."""

from __future__ import annotations

import math

import numpy as np

from ...kernels.attention import run_backward, run_forward
from ...primitives import attention as att
from ...primitives.fallback import mesh_dims
from .common import _impl


def _fold(storages, k):
    """Mesh dims broadcast to one shape and folded into the batch dim, so one kernel call
    serves every device's block."""
    dims = mesh_dims(storages, k)
    n = math.prod(dims)
    out = []
    for s in storages:
        s = np.broadcast_to(s, dims + tuple(s.shape[k:]))
        out.append(s.reshape((n * s.shape[k],) + tuple(s.shape[k + 1:])))
    return dims, out


@_impl(att.ATTENTION)
def _attention(storages, mesh, *, is_causal, scale, has_mask):
    k = mesh.ndim
    dims, (q, kk, v) = _fold(storages[:3], k)
    mask = None
    if has_mask:
        mask = _fold_mask(storages[3], dims, storages[0].shape[k], k)
    out, lse = run_forward("dot_product_attention", q, kk, v, is_causal, scale, mask)
    b = storages[0].shape[k]
    return [out.reshape(dims + (b,) + out.shape[1:]), lse.reshape(dims + (b,) + lse.shape[1:])]


def _fold_mask(m, dims, batch, k):
    m = np.broadcast_to(m, dims + tuple(m.shape[k:]))
    if m.shape[k] == 1 and batch != 1:
        m = np.broadcast_to(m, dims + (batch,) + tuple(m.shape[k + 1:]))
    return m.reshape((math.prod(dims) * m.shape[k],) + tuple(m.shape[k + 1:]))


@_impl(att.ATTENTION_BWD)
def _attention_bwd(storages, mesh, *, is_causal, scale, has_mask, recompute):
    k = mesh.ndim
    n = 4 if recompute else 6
    op = "dot_product_attention_vjp" if recompute else "dot_product_attention"
    dims, folded = _fold(storages[:n], k)
    mask = _fold_mask(storages[n], dims, storages[0].shape[k], k) if has_mask else None
    if recompute:
        q, kk, v, do = folded
        o, lse = run_forward(op, q, kk, v, is_causal, scale, mask)
    else:
        q, kk, v, o, lse, do = folded
    grads = run_backward(op, q, kk, v, o, lse, do, is_causal, scale, mask)
    b = storages[0].shape[k]
    return [g.reshape(dims + (b,) + g.shape[1:]) for g in grads]
