"""Flash attention on numpy arrays: the C++ kernel and its materialized reference.

Layout is JAX's: ``q`` is ``[batch, q_len, q_heads, head_dim]``, ``k`` and ``v`` are
``[batch, kv_len, kv_heads, head_dim]`` with ``q_heads`` a multiple of ``kv_heads`` (grouped
query attention). ``is_causal`` is top-left aligned like ``jax.nn.dot_product_attention`` and
``torch.nn.functional.scaled_dot_product_attention``: query ``i`` sees keys ``j <= i`` (also when
``q_len != kv_len``). ``mask`` is boolean, ``True`` = attend, broadcastable to
``[batch, q_heads, q_len, kv_len]``. A query row with every key masked gets output 0 and a
logsumexp of ``-inf`` (JAX instead returns the mean of ``v`` for such rows, because it masks with
a large finite negative number), and zero gradients.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

import shardlab._core as _core

__all__ = [
    "flash_attention",
    "flash_attention_backward",
    "attention_reference",
    "attention_reference_backward",
]

_BF16 = np.dtype(ml_dtypes.bfloat16)
_SUPPORTED = (np.dtype(np.float32), _BF16)


def _shape(x) -> str:
    return "(" + ", ".join(str(d) for d in x.shape) + ("," if len(x.shape) == 1 else "") + ")"


def _check(op, q, k, v, mask, scale, *, out=None, dout=None, lse=None):
    """Validates and prepares arguments; returns arrays ready for the C++ core."""
    arrays = {"q": q, "k": k, "v": v}
    if out is not None:
        arrays.update(out=out, dout=dout)
    arrays = {n: np.asarray(a) for n, a in arrays.items()}
    for name, a in arrays.items():
        if a.ndim != 4:
            raise ValueError(
                f"[{op}] {name} must be 4-D [batch, seq, heads, head_dim], got shape {_shape(a)}"
            )
        if a.dtype not in _SUPPORTED:
            raise TypeError(
                f"[{op}] {name} has dtype {a.dtype}; supported are float32 and bfloat16 "
                f"(cast with {name}.astype(np.float32))"
            )
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    for name, a in arrays.items():
        if a.dtype != q.dtype:
            raise TypeError(f"[{op}] q has dtype {q.dtype} but {name} has dtype {a.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"[{op}] k has shape {_shape(k)} but v has shape {_shape(v)}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(
            f"[{op}] q has batch {q.shape[0]} but k has batch {k.shape[0]} "
            f"(q {_shape(q)}, k {_shape(k)})"
        )
    if q.shape[3] != k.shape[3]:
        raise ValueError(
            f"[{op}] q has head_dim {q.shape[3]} but k has head_dim {k.shape[3]} "
            f"(q {_shape(q)}, k {_shape(k)})"
        )
    if k.shape[2] == 0 or q.shape[2] % k.shape[2] != 0:
        raise ValueError(
            f"[{op}] the number of query heads {q.shape[2]} is not a multiple of the number of "
            f"key/value heads {k.shape[2]} (q {_shape(q)}, k {_shape(k)})"
        )
    if out is not None:
        for name in ("out", "dout"):
            if arrays[name].shape != q.shape:
                raise ValueError(
                    f"[{op}] {name} has shape {_shape(arrays[name])} but q has {_shape(q)}"
                )
    B, Tq, Hq, D = q.shape
    Tk = k.shape[1]
    if scale is None:
        scale = 1.0 / math.sqrt(D) if D else 1.0
    if isinstance(scale, bool) or not (isinstance(scale, (int, float, np.integer, np.floating))
                                       or (isinstance(scale, np.ndarray) and scale.ndim == 0)):
        raise TypeError(f"[{op}] scale must be a Python or numpy scalar, got {type(scale).__name__}"
                        f"{' of shape ' + str(scale.shape) if hasattr(scale, 'shape') else ''}; one scale "
                        f"multiplies every logit (scale per head: multiply q by it first)")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"[{op}] scale must be finite, got {scale}")
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise TypeError(
                f"[{op}] mask must be boolean (True = attend), got dtype {mask.dtype}; for an "
                f"additive mask use a bias"
            )
        if mask.ndim > 4:
            raise ValueError(f"[{op}] mask must have at most 4 dims, got shape {_shape(mask)}")
        try:
            mask = np.broadcast_to(mask.reshape((1,) * (4 - mask.ndim) + mask.shape),
                                   (B, Hq, Tq, Tk))
        except ValueError:
            raise ValueError(
                f"[{op}] mask of shape {_shape(mask)} does not broadcast to "
                f"[batch, q_heads, q_len, kv_len] = ({B}, {Hq}, {Tq}, {Tk})"
            ) from None
    prepared = [_raw(a) for a in arrays.values()]
    if lse is not None:
        lse = np.ascontiguousarray(lse, dtype=np.float32)
        if lse.shape != (B, Hq, Tq):
            raise ValueError(
                f"[{op}] lse has shape {_shape(lse)}, expected [batch, q_heads, q_len] = "
                f"({B}, {Hq}, {Tq})"
            )
    return prepared, mask, scale, lse


def _raw(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.uint16) if a.dtype == _BF16 else a


def _empty(q, k) -> bool:
    return q.size == 0 or k.shape[1] == 0


def run_forward(op, q, k, v, is_causal, scale, mask, reference=False):
    """Checks and runs the forward for `op` (named in errors); returns (out, lse)."""
    (q_, k_, v_), mask, scale, _ = _check(op, q, k, v, mask, scale)
    dtype = np.asarray(q).dtype
    if _empty(q_, k_):
        B, Tq, Hq, _ = q_.shape
        return np.zeros(q_.shape, dtype), np.full((B, Hq, Tq), -np.inf, np.float32)
    out, lse = _core.attention_forward(q_, k_, v_, bool(is_causal), scale, mask, reference)
    return (out.view(_BF16) if dtype == _BF16 else out), lse


def run_backward(op, q, k, v, out, lse, dout, is_causal, scale, mask, reference=False):
    """Checks and runs the backward for `op` (named in errors); returns (dq, dk, dv)."""
    arrays, mask, scale, lse = _check(op, q, k, v, mask, scale, out=out, dout=dout, lse=lse)
    q_, k_, v_, out_, dout_ = arrays
    dtype = np.asarray(q).dtype
    if _empty(q_, k_):
        return np.zeros(q_.shape, dtype), np.zeros(k_.shape, dtype), np.zeros(k_.shape, dtype)
    grads = _core.attention_backward(
        q_, k_, v_, out_, dout_, lse, bool(is_causal), scale, mask, reference
    )
    return tuple(g if dtype == np.float32 else g.astype(dtype) for g in grads)


def flash_attention(q, k, v, *, is_causal=False, scale=None, mask=None, return_lse=False):
    """Scaled dot-product attention with the tiled flash kernel (memory O(seq) per thread).

    Args:
      q: ``[batch, q_len, q_heads, head_dim]``, float32 or bfloat16.
      k: ``[batch, kv_len, kv_heads, head_dim]``, same dtype; ``q_heads % kv_heads == 0``.
      v: same shape and dtype as ``k``.
      is_causal: query ``i`` attends to keys ``j <= i`` (top-left aligned, as in JAX).
      scale: multiplies the logits; defaults to ``1 / sqrt(head_dim)``.
      mask: optional boolean array broadcastable to ``[batch, q_heads, q_len, kv_len]``;
        ``True`` means attend.
      return_lse: also return the float32 logsumexp ``[batch, q_heads, q_len]`` of the scaled,
        masked logits (what the backward pass needs).

    Returns:
      ``out`` with the shape and dtype of ``q`` (bfloat16 rounded from float32), or
      ``(out, lse)`` when ``return_lse``.

    Example:
      >>> import numpy as np
      >>> from shardlab.kernels import flash_attention
      >>> q = np.random.rand(1, 128, 8, 64).astype(np.float32)
      >>> kv = np.random.rand(1, 128, 2, 64).astype(np.float32)
      >>> flash_attention(q, kv, kv, is_causal=True).shape
      (1, 128, 8, 64)
    """
    out, lse = run_forward("flash_attention", q, k, v, is_causal, scale, mask, False)
    return (out, lse) if return_lse else out


def flash_attention_backward(q, k, v, out, lse, dout, *, is_causal=False, scale=None, mask=None):
    """Gradients of :func:`flash_attention` (FlashAttention-2: P is recomputed from ``lse``).

    Args:
      q, k, v, is_causal, scale, mask: as given to :func:`flash_attention`.
      out, lse: the forward's output and logsumexp (``return_lse=True``).
      dout: gradient with respect to ``out`` (shape and dtype of ``q``).

    Returns:
      ``(dq, dk, dv)`` in the dtype of ``q``; ``dk`` and ``dv`` are summed over the query heads
      that share each key/value head.

    Example:
      >>> import numpy as np
      >>> from shardlab.kernels import flash_attention, flash_attention_backward
      >>> q = k = v = np.random.rand(1, 16, 2, 8).astype(np.float32)
      >>> out, lse = flash_attention(q, k, v, return_lse=True)
      >>> dq, dk, dv = flash_attention_backward(q, k, v, out, lse, np.ones_like(out))
    """
    return run_backward(
        "flash_attention_backward", q, k, v, out, lse, dout, is_causal, scale, mask, False
    )


def attention_reference(q, k, v, *, is_causal=False, scale=None, mask=None):
    """The materialized-softmax reference (double accumulation): returns ``(out, lse)``.

    Needs ``q_len * kv_len`` doubles per head; for tests and small inputs only.

    Example:
      >>> import numpy as np
      >>> x = np.ones((1, 4, 1, 8), np.float32)
      >>> out, lse = attention_reference(x, x, x)
    """
    return run_forward("attention_reference", q, k, v, is_causal, scale, mask, True)


def attention_reference_backward(q, k, v, dout, *, is_causal=False, scale=None, mask=None):
    """Gradients from the materialized reference: returns float32-accurate ``(dq, dk, dv)``.

    Example:
      >>> import numpy as np
      >>> x = np.ones((1, 4, 1, 8), np.float32)
      >>> dq, dk, dv = attention_reference_backward(x, x, x, x)
    """
    B, Tq, Hq, _ = np.shape(q)
    lse = np.zeros((B, Hq, Tq), np.float32)  # unused: the reference recomputes the softmax
    return run_backward(
        "attention_reference_backward", q, k, v, q, lse, dout, is_causal, scale, mask, True
    )
