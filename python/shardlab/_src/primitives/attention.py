"""Flash attention as a primitive: forward (output and logsumexp) and its backward.

Local layout [batch, seq, heads, head_dim]; grouped KV heads; an optional boolean mask. The
vjp runs the FlashAttention-2 backward kernel from the saved output and logsumexp.

Example:
    >>> from shardlab._src.primitives.attention import ATTENTION, ATTENTION_BWD
    >>> ATTENTION.name, ATTENTION_BWD.name
    ('attention', 'attention_vjp')
"""

from __future__ import annotations

import math

import numpy as np

from ..cost import formulas
from .contractions import compute_event
from .primitive import Primitive, bind


def _mesh_dims(avals, k):
    return tuple(np.broadcast_shapes(*(tuple(a.shape[:k]) for a in avals)))


def _fwd_shape(avals, mesh, *, is_causal, scale, has_mask):
    k = mesh.ndim
    q = avals[0]
    dims = _mesh_dims(avals[:3], k)
    b, t, n, _ = q.shape[k:]
    return [(dims + tuple(q.shape[k:]), q.dtype), (dims + (b, n, t), np.dtype(np.float32))]


def _flops(q_local, k_local, is_causal, passes) -> float:
    b, t, n, d = q_local
    return float(formulas.attention_flops(b, n, d, formulas.attention_pairs(t, k_local[1], is_causal), passes))


def _local_bytes(avals, k) -> float:
    return float(sum(math.prod(a.shape[k:]) * a.dtype.itemsize for a in avals))


def _fwd_cost(ins, outs, mesh, *, is_causal, scale, has_mask):
    k = mesh.ndim
    q, kk, v = ins[:3]
    nbytes = _local_bytes([q, kk, v, q], k)  # the output is query-sized
    return compute_event("attention", mesh, _flops(q.shape[k:], kk.shape[k:], is_causal, 4), nbytes, q.dtype)


def _fwd_vjp(cts, ins, outs, mesh, *, is_causal, scale, has_mask):
    q, k, v = ins[:3]
    mask = ins[3:] if has_mask else []
    dout = cts[0]
    if dout is None:
        return [None] * len(ins)
    dq, dk, dv = bind(ATTENTION_BWD, [q, k, v, outs[0], outs[1], dout, *mask], mesh,
                      is_causal=is_causal, scale=scale, has_mask=has_mask, recompute=False)
    return [dq, dk, dv] + [None] * len(mask)


ATTENTION = Primitive("attention", shape_rule=_fwd_shape, cost=_fwd_cost, vjp=_fwd_vjp, multiple_results=True)


def _bwd_inputs(ins, recompute):
    """(q, k, v, dout) of the backward's inputs: [q, k, v, dout] when it recomputes the
    forward, else [q, k, v, out, lse, dout]."""
    return (*ins[:3], ins[3] if recompute else ins[5])


def _bwd_shape(avals, mesh, *, is_causal, scale, has_mask, recompute):
    k = mesh.ndim
    dims = _mesh_dims(_bwd_inputs(avals, recompute), k)
    return [(dims + tuple(a.shape[k:]), a.dtype) for a in avals[:3]]


def _bwd_cost(ins, outs, mesh, *, is_causal, scale, has_mask, recompute):
    k = mesh.ndim
    q, kk, v, dout = _bwd_inputs(ins, recompute)
    nbytes = _local_bytes([q, kk, v, dout, q, kk, v], k)  # inputs + the three gradients
    passes = 14 if recompute else 10  # recomputing the forward adds its 4
    return compute_event("attention_vjp", mesh, _flops(q.shape[k:], kk.shape[k:], is_causal, passes), nbytes,
                         q.dtype)


ATTENTION_BWD = Primitive("attention_vjp", shape_rule=_bwd_shape, cost=_bwd_cost, multiple_results=True)
