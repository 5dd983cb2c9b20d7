"""Neural-network functions with jax.nn's names: activations, softmax, normalisation, and
``dot_product_attention`` on shardlab's flash kernel. Every one is differentiable with
``shardlab.grad`` and works on numpy arrays and on LocalArrays inside ``shard_map``.

Example:
    >>> import numpy as np
    >>> import shardlab.nn as snn
    >>> snn.softmax(np.array([0.0, 0.0], np.float32)).tolist()
    [0.5, 0.5]
"""

from __future__ import annotations

import numpy as np

from ..arrays.local_array import LocalArray, lift, mesh_of
from ..core.mesh import UNIT_MESH
from ..primitives import attention as att
from ..primitives import fused as fu
from ..primitives.primitive import bind
from . import numpy as jnp
from .numpy.elementwise import erf

__all__ = ["dot_product_attention", "dot_product_attention_vjp", "relu", "gelu", "silu", "swish", "sigmoid",
           "softmax", "log_softmax", "logsumexp", "one_hot", "rms_norm", "layer_norm", "softplus", "tanh",
           "rotary_embedding", "adamw_update", "swiglu"]

tanh = np.tanh


# -- activations -----------------------------------------------------------------------------
def relu(x):
    """max(x, 0)."""
    return jnp.maximum(x, 0.0) if isinstance(x, LocalArray) else np.maximum(x, np.zeros((), np.asarray(x).dtype))


def sigmoid(x):
    """1 / (1 + exp(-x))."""
    return 1.0 / (1.0 + np.exp(-x))


def _fusable(*xs) -> bool:
    """float32 LocalArrays of one mesh: what the fused kernels take."""
    return all(isinstance(x, LocalArray) and x.dtype == np.float32 for x in xs) and \
        all(x.mesh is xs[0].mesh for x in xs)


def silu(x):
    """x · sigmoid(x) (swish). On float32 values inside ``shard_map`` one fused pass forward
    and one backward (the composite takes four and seven).

    Example:
        >>> import numpy as np, shardlab.nn as snn
        >>> [round(float(v), 4) for v in snn.silu(np.array([-1.0, 0.0, 2.0], np.float32))]
        [-0.2689, 0.0, 1.7616]
    """
    if _fusable(x):
        return bind(fu.SILU, [x], x.mesh)
    return x * sigmoid(x)


swish = silu


def swiglu(x, axis: int = -1):
    """SwiGLU: ``silu(a) * b`` with ``a, b = split(x, 2, axis)``, the gated MLP's hidden value
    when ``x = h @ [W_gate | W_up]`` (LLaMA). ``jax.nn.glu``'s layout with silu as the gate;
    not in ``jax.nn``. On float32 values inside ``shard_map`` (last axis) one fused pass
    forward and one backward, reading the two halves in place and writing the gradient of
    both in one buffer; anything else runs the composite.

    Example:
        >>> import numpy as np, shardlab.nn as snn
        >>> [round(float(v), 4) for v in snn.swiglu(np.array([-1.0, 2.0, 2.0, 0.5], np.float32))]
        [-0.5379, 0.8808]
    """
    shape = tuple(np.shape(x))
    if not shape or not -len(shape) <= axis < len(shape) or shape[axis] % 2:
        raise ValueError(f"[swiglu] x has local shape {shape}; its axis {axis} must hold [gate | up], an even size")
    if _fusable(x) and axis in (-1, x.ndim - 1):
        return bind(fu.SWIGLU, [x], x.mesh)
    a, b = jnp.split(x, 2, axis=axis)
    return silu(a) * b


def softplus(x):
    """log(1 + exp(x)), computed stably."""
    return np.logaddexp(x, 0.0)


def gelu(x, approximate: bool = True):
    """GELU. ``approximate=True`` (jax.nn's default) is the tanh form; ``False`` the exact
    x·Φ(x) = x/2·(1 + erf(x/√2)), with erf a primitive (derivative 2/√π·exp(-x²)).

    Example:
        >>> import numpy as np, shardlab.nn as snn
        >>> round(float(snn.gelu(np.float32(1.0), approximate=False)), 5)
        0.84134
    """
    if not approximate:
        return 0.5 * x * (1.0 + erf(x * np.float32(1.0 / np.sqrt(2.0))))
    c = np.float32(np.sqrt(2.0 / np.pi))
    return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * (x * x * x))))


# -- softmax family --------------------------------------------------------------------------
def logsumexp(x, axis=-1, keepdims=False):
    """log(sum(exp(x))) over `axis`, shifted by the max for stability (a row of -inf gives
    -inf, as JAX). Over the last axis of float32 values inside ``shard_map`` the sum is one
    fused pass (``exp_sum``) that keeps no exponentials, and so is its gradient.

    Example:
        >>> import numpy as np, shardlab.nn as snn
        >>> round(float(snn.logsumexp(np.log(np.array([1.0, 3.0], np.float32)))), 5)
        1.38629
    """
    if _fusable(x) and axis in (-1, x.ndim - 1) and x.ndim:
        m = jnp.max(x, axis=-1)
        m = _stop(jnp.where(jnp.isfinite(m), m, jnp.zeros_like(m)))
        out = jnp.log(bind(fu.EXP_SUM, [x, m], x.mesh)) + m
        return jnp.expand_dims(out, -1) if keepdims else out
    m = jnp.max(x, axis=axis, keepdims=True)
    m = _stop(m)
    s = jnp.sum(np.exp(x - m), axis=axis, keepdims=True)
    out = np.log(s) + m
    return out if keepdims else jnp.squeeze(out, axis=axis)


def _stop(x):
    """The max shift of logsumexp/softmax is a constant for gradients (it cancels exactly)."""
    if isinstance(x, LocalArray):
        return LocalArray(x.storage, x.mesh)  # a fresh value the tape does not know
    return x


def softmax(x, axis=-1):
    """exp(x) / sum(exp(x)) over `axis`."""
    m = _stop(jnp.max(x, axis=axis, keepdims=True))
    e = np.exp(x - m)
    return e / jnp.sum(e, axis=axis, keepdims=True)


def log_softmax(x, axis=-1):
    """x - logsumexp(x) over `axis`."""
    return x - logsumexp(x, axis=axis, keepdims=True)


def one_hot(x, num_classes: int, *, dtype=np.float32, axis=-1):
    """One-hot encoding of integer `x` (out-of-range values give all zeros, as JAX)."""
    if not isinstance(num_classes, (int, np.integer)) or num_classes < 0:
        raise ValueError(f"[one_hot] num_classes must be a non-negative int, got {num_classes!r}")
    classes = np.arange(num_classes, dtype=np.int32)
    if axis != -1:
        raise NotImplementedError("[one_hot] only axis=-1 is supported")
    return jnp.astype(jnp.expand_dims(x, -1) == classes, dtype)


# -- normalisation ---------------------------------------------------------------------------
def rms_norm(x, scale=None, *, axis=-1, eps: float = 1e-6):
    """x / sqrt(mean(x²) + eps) · scale (RMSNorm). On float32 values inside ``shard_map``,
    normalising the last axis, one fused pass forward and one backward.

    Example:
        >>> import numpy as np, shardlab.nn as snn
        >>> snn.rms_norm(np.array([[3.0, -3.0]], np.float32), eps=0.0).tolist()
        [[1.0, -1.0]]
    """
    if _fusable(x) and x.ndim >= 1 and axis in (-1, x.ndim - 1):
        c = x.shape[-1]
        if scale is None:
            scale = lift(np.ones(c, np.float32), x.mesh)
        elif isinstance(scale, np.ndarray) and scale.dtype == np.float32:
            scale = lift(scale, x.mesh)
        if _fusable(x, scale) and scale.shape == (c,):
            return bind(fu.RMS_NORM, [x, scale], x.mesh, eps=float(eps))[0]
    y = x / np.sqrt(jnp.mean(x * x, axis=axis, keepdims=True) + eps)
    return y if scale is None else y * scale


def layer_norm(x, scale=None, bias=None, *, axis=-1, eps: float = 1e-5):
    """(x - mean) / sqrt(var + eps) · scale + bias (LayerNorm)."""
    mu = jnp.mean(x, axis=axis, keepdims=True)
    d = x - mu
    y = d / np.sqrt(jnp.mean(d * d, axis=axis, keepdims=True) + eps)
    if scale is not None:
        y = y * scale
    return y if bias is None else y + bias


def rotary_embedding(x, cos, sin):
    """Rotary position embedding in the "rotate half" layout of LLaMA and GPT-NeoX (a shardlab
    extension): x ``[..., T, heads, head_dim]``, tables ``cos``, ``sin`` ``[T, half]``. The first
    ``half`` dims pair with the next ``half``; dims past ``2·half`` pass through::

        out[:half] = x1·cos − x2·sin,   out[half:2·half] = x2·cos + x1·sin

    On float32 values inside ``shard_map`` one fused pass (its gradient is the same kernel
    rotating back); otherwise the expression above.

    Example:
        >>> import numpy as np, shardlab.nn as snn
        >>> x = np.array([[[1.0, 0.0]]], np.float32)          # T=1, one head, head_dim 2
        >>> c, s = np.zeros((1, 1), np.float32), np.ones((1, 1), np.float32)   # 90 degrees
        >>> snn.rotary_embedding(x, c, s).tolist()
        [[[0.0, 1.0]]]
    """
    fu.check_rotary_shapes(tuple(np.shape(x)), tuple(np.shape(cos)), tuple(np.shape(sin)))
    if _fusable(x):
        tables = [lift(t, x.mesh) if isinstance(t, np.ndarray) and t.dtype == np.float32 else t for t in (cos, sin)]
        if _fusable(x, *tables):
            return bind(fu.ROTARY_EMBEDDING, [x, *tables], x.mesh, inverse=False)
    half = cos.shape[-1]
    c, s = jnp.expand_dims(cos, -2), jnp.expand_dims(sin, -2)  # [T, 1, half]: one row for every head
    x1, x2 = x[..., :half], x[..., half:2 * half]
    parts = [x1 * c - x2 * s, x2 * c + x1 * s]
    if 2 * half < x.shape[-1]:
        parts.append(x[..., 2 * half:])
    return jnp.concatenate(parts, axis=-1)


# -- attention -------------------------------------------------------------------------------
def _unsupported(name: str, value, op: str) -> None:
    if value is not None:
        raise NotImplementedError(
            f"[{op}] {name} is not supported by shardlab's flash attention; pass {name}=None "
            f"(for padding, build a boolean mask instead)"
        )


def _to4d(x):
    """Prepends unit dims as jax.nn.dot_product_attention does for 3-D [T, N, H] inputs."""
    return x if x.ndim >= 4 else jnp.reshape(x, (1,) * (4 - x.ndim) + x.shape)


def _as_local(values):
    """The arguments as LocalArrays of one mesh; plain arrays run on a one-device mesh whose
    events are not recorded."""
    present = [v for v in values if v is not None]
    if any(isinstance(v, LocalArray) for v in present):
        mesh = mesh_of(present)
        return mesh, [None if v is None else lift(v, mesh) for v in values], True
    return UNIT_MESH, [None if v is None else lift(np.asarray(v), UNIT_MESH) for v in values], False


def _check_ranks(op, *xs):
    for x in xs:
        if x.ndim not in (3, 4):
            raise ValueError(f"[{op}] query, key and value must be [batch, seq, heads, head_dim] or "
                             f"[seq, heads, head_dim], got local shapes {[tuple(v.shape) for v in xs]}")


def _check_mask(mask, op):
    if mask is not None and mask.dtype != np.bool_:
        raise TypeError(f"[{op}] mask must be boolean (True = attend), got {mask.dtype}")


def _plain(x, local: bool):
    return x if local else np.asarray(x.storage)


def dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                          query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
                          implementation=None, return_residual=False):
    """Scaled dot-product attention, jax.nn.dot_product_attention's signature and semantics.

    ``softmax(scale * q k^T + masking) v`` per head, computed by the tiled flash kernel
    (float32 or bfloat16, float32 statistics, memory O(seq)). Shapes are JAX's: query
    ``(B, T, N, H)`` or ``(T, N, H)``, key and value ``(B, S, K, H)`` or ``(S, K, H)`` with
    ``N % K == 0`` (grouped-query attention). ``is_causal`` is top-left aligned: query ``i``
    attends to keys ``j <= i``, as in JAX. ``mask`` is boolean (``True`` = attend) and
    broadcastable to ``(B, N, T, S)``. Differentiable: its gradient runs the flash backward.

    Differences from JAX: ``bias``, ``query_seq_lengths``, ``key_value_seq_lengths``,
    ``local_window_size`` and ``implementation='cudnn'`` raise NotImplementedError; a query
    whose keys are all masked gets zeros (JAX, which masks with a large finite negative, returns
    the mean of ``value``).

    Returns:
      The attention output with query's shape and dtype, or ``(output, logsumexp)`` with the
      logsumexp laid out ``(B, T, N)`` in the inputs' dtype, as JAX returns it.

    Example:
      >>> import numpy as np
      >>> import shardlab.nn
      >>> q = np.random.rand(2, 16, 4, 32).astype(np.float32)
      >>> kv = np.random.rand(2, 16, 2, 32).astype(np.float32)
      >>> shardlab.nn.dot_product_attention(q, kv, kv, is_causal=True).shape
      (2, 16, 4, 32)
    """
    op = "dot_product_attention"
    _unsupported("bias", bias, op)
    _unsupported("query_seq_lengths", query_seq_lengths, op)
    _unsupported("key_value_seq_lengths", key_value_seq_lengths, op)
    _unsupported("local_window_size", local_window_size, op)
    if implementation not in (None, "xla"):
        raise NotImplementedError(f"[{op}] implementation={implementation!r} is not available on the CPU; use None")
    mesh, (q, k, v, m), local = _as_local([query, key, value, mask])
    _check_ranks(op, q, k, v)
    _check_mask(m, op)
    q4, k4, v4 = _to4d(q), _to4d(k), _to4d(v)
    mask_args = [] if m is None else [_mask4(m)]
    out, lse = bind(att.ATTENTION, [q4, k4, v4, *mask_args], mesh, is_causal=bool(is_causal), scale=scale,
                    has_mask=m is not None)
    out = jnp.reshape(out, q.shape)
    if not return_residual:
        return _plain(out, local)
    res = jnp.astype(jnp.swapaxes(lse, 1, 2), q.dtype)
    res = jnp.reshape(res, q.shape[:-1])
    return _plain(out, local), _plain(res, local)


def _mask4(m):
    return m if m.ndim >= 4 else jnp.reshape(m, (1,) * (4 - m.ndim) + m.shape)


def dot_product_attention_vjp(query, key, value, dout, *, mask=None, scale=None, is_causal=False):
    """Gradients of :func:`dot_product_attention` with respect to query, key and value.

    Recomputes the forward (output and logsumexp), then runs the FlashAttention-2 backward.
    Equivalent to ``jax.vjp(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, ...), ...)``
    applied to ``dout``; ``shardlab.grad`` of a function that calls dot_product_attention
    gives the same without the recomputation.

    Returns:
      ``(dquery, dkey, dvalue)`` with the shapes and dtype of the inputs.

    Example:
      >>> import numpy as np
      >>> import shardlab.nn
      >>> x = np.random.rand(8, 2, 16).astype(np.float32)
      >>> dq, dk, dv = shardlab.nn.dot_product_attention_vjp(x, x, x, np.ones_like(x))
      >>> dk.shape
      (8, 2, 16)
    """
    op = "dot_product_attention_vjp"
    mesh, (q, k, v, g, m), local = _as_local([query, key, value, dout, mask])
    _check_ranks(op, q, k, v)
    _check_mask(m, op)
    mask_args = [] if m is None else [_mask4(m)]
    grads = bind(att.ATTENTION_BWD, [_to4d(q), _to4d(k), _to4d(v), _to4d(g), *mask_args], mesh,
                 is_causal=bool(is_causal), scale=scale, has_mask=m is not None, recompute=True)
    return tuple(_plain(jnp.reshape(d, x.shape), local) for d, x in zip(grads, (q, k, v)))


# -- optimizer update ------------------------------------------------------------------------
def adamw_update(param, grad, m, v, *, lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                 weight_decay: float = 0.0, step: int):
    """One AdamW step of one parameter (a shardlab extension: optax.adamw's per-leaf update)::

        m' = b1·m + (1 − b1)·g;   v' = b2·v + (1 − b2)·g²
        p' = p − lr·((m' / (1 − b1^step)) / (sqrt(v' / (1 − b2^step)) + eps) + weight_decay·p)

    Returns ``(p', m', v')``. On float32 LocalArrays inside ``shard_map`` it is one fused pass
    over the four arrays (the composite takes about a dozen); on anything else the expression
    above, term by term.

    Example:
        >>> import numpy as np, shardlab.nn as snn
        >>> p, g, z = np.ones(2, np.float32), np.array([0.5, -2.0], np.float32), np.zeros(2, np.float32)
        >>> p2, m2, v2 = snn.adamw_update(p, g, z, z, lr=0.1, step=1)
        >>> [round(float(x), 4) for x in p2]   # the first step moves each weight by lr
        [0.9, 1.1]
    """
    if not isinstance(step, (int, np.integer)) or step < 1:
        raise ValueError(f"[adamw_update] step must be an integer >= 1 (the bias corrections divide by "
                         f"1 - b**step); got {step!r}")
    shapes = [tuple(np.shape(a)) for a in (param, grad, m, v)]
    if len(set(shapes)) > 1:
        raise ValueError(f"[adamw_update] param, grad, m and v have local shapes {', '.join(map(str, shapes))}; "
                         f"they must be equal (m and v start as zeros of the param's shape)")
    if _fusable(param, grad, m, v):
        return tuple(bind(fu.ADAMW_UPDATE, [param, grad, m, v], param.mesh, lr=float(lr), b1=float(b1),
                          b2=float(b2), eps=float(eps), weight_decay=float(weight_decay), step=int(step)))
    g = grad.astype(np.float32)
    m = m * np.float32(b1) + g * np.float32(1 - b1)
    v = v * np.float32(b2) + g * g * np.float32(1 - b2)
    c1, c2 = 1 - b1 ** step, 1 - b2 ** step
    upd = (m / np.float32(c1)) / (np.sqrt(v / np.float32(c2)) + np.float32(eps))
    if weight_decay:
        upd = upd + param * np.float32(weight_decay)
    return param - upd * np.float32(lr), m, v
