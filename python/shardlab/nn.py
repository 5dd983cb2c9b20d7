"""Neural-network functions with jax.nn's names, running shardlab's own kernels.

``dot_product_attention`` takes JAX's arguments and layout (``[batch, seq, heads, head_dim]`` or
``[seq, heads, head_dim]``) and runs the flash-attention kernel; its gradients come from
``dot_product_attention_vjp``. Both accept numpy arrays, and LocalArrays inside ``shard_map``
(the leading mesh dims are folded into the batch, so every device's block is computed in one
kernel call).
"""

from __future__ import annotations

import numpy as np

from .kernels.attention import run_backward, run_forward
from .local_array import LocalArray
from .numpy import _record_compute

__all__ = ["dot_product_attention", "dot_product_attention_vjp"]


def _unsupported(name: str, value, op: str) -> None:
    if value is not None:
        raise NotImplementedError(
            f"[{op}] {name} is not supported by shardlab's flash attention; pass {name}=None "
            f"(for padding, build a boolean mask instead)"
        )


def _to4d(x):
    """Prepends unit dims as jax.nn.dot_product_attention does for 3-D [T, N, H] inputs."""
    x = np.asarray(x)
    return x.reshape((1,) * (4 - x.ndim) + x.shape) if x.ndim < 4 else x


class _Folded:
    """Arguments with the leading mesh dims of LocalArrays folded into the batch dim.

    Inside shard_map every device holds one block; stacking the blocks along the batch lets
    one kernel call serve them all. Mesh dims are broadcast to a common shape first (a value
    that is the same on every device along an axis stores 1 there).
    """

    def __init__(self, op, arrays, batch_of):
        # arrays[-1] is the mask, the only argument whose batch dim may broadcast.
        is_local = [isinstance(a, LocalArray) for a in arrays]
        self.mesh = None
        self.lead = ()
        self.arrays = arrays
        if not any(is_local):
            return
        locals_ = [a for a, loc in zip(arrays, is_local) if loc]
        self.mesh = locals_[0].mesh
        for a in locals_[1:]:
            if a.mesh != self.mesh:
                raise ValueError(f"[{op}] the arguments are LocalArrays of different meshes")
        nd = self.mesh.ndim
        self.lead = tuple(np.broadcast_shapes(*(a.storage.shape[:nd] for a in locals_)))
        n = int(np.prod(self.lead, dtype=np.int64))
        batch = batch_of(
            [a.storage.shape[nd:] if loc else np.shape(a) for a, loc in zip(arrays, is_local)]
        )
        folded = []
        for i, (a, loc) in enumerate(zip(arrays, is_local)):
            if a is None:
                folded.append(None)
                continue
            if loc:
                local = a.storage.shape[nd:]
                x = np.broadcast_to(a.storage, self.lead + local)
                x = x.reshape(self.lead + (1,) * (4 - len(local)) + local)
            else:
                x = _to4d(a)
                x = x.reshape((1,) * nd + x.shape)
            if x.shape[nd] != batch and not (i == len(arrays) - 1 and x.shape[nd] == 1):
                raise ValueError(
                    f"[{op}] the local batch of query is {batch} but an argument has local "
                    f"shape {x.shape[nd:]}"
                )
            x = np.broadcast_to(x, self.lead + (batch,) + x.shape[nd + 1:])
            folded.append(x.reshape((n * batch,) + x.shape[nd + 1:]))
        self.arrays = folded

    def unfold(self, x, local_shape):
        """The kernel's [n * batch, ...] result as a LocalArray of the given local shape."""
        if self.mesh is None:
            return x.reshape(local_shape)
        return LocalArray.from_storage(x.reshape(self.lead + tuple(local_shape)), self.mesh)


def _attention_flops(q_local, k_local, is_causal, passes):
    """Per-device FLOPs: 4 per (query, key, head_dim) pair forward, 10 backward (FA-2 count),
    over the pairs causal masking leaves (a boolean mask is not discounted)."""
    q4 = (1,) * (4 - len(q_local)) + tuple(q_local)
    B, Tq, Hq, D = q4
    Tk = k_local[-3]
    pairs = sum(min(i + 1, Tk) for i in range(Tq)) if is_causal else Tq * Tk
    return passes * B * Hq * D * pairs


def _record(op, f, arrays, flops):
    """Writes the call into the ledger as event `op` ("attention" or "attention_vjp", names the
    cost model prices) when it ran inside shard_map (one event per device);
    the bytes are what one device reads and writes: `arrays` and the outputs."""
    if f.mesh is None:
        return
    nbytes = sum(int(np.prod(_local_shape(x))) * np.dtype(_dtype(x)).itemsize for x in arrays)
    _record_compute(op, f.mesh, flops, nbytes, _dtype(arrays[0]))


def _dtype(x):
    return x.storage.dtype if isinstance(x, LocalArray) else np.asarray(x).dtype


def _local_shape(x):
    if isinstance(x, LocalArray):
        return x.storage.shape[x.mesh.ndim:]
    return np.shape(x)


def _query_batch(shapes):
    q = shapes[0]
    return q[0] if len(q) == 4 else 1


def dot_product_attention(
    query,
    key,
    value,
    bias=None,
    mask=None,
    *,
    scale=None,
    is_causal=False,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
    local_window_size=None,
    implementation=None,
    return_residual=False,
):
    """Scaled dot-product attention, jax.nn.dot_product_attention's signature and semantics.

    ``softmax(scale * q k^T + masking) v`` per head, computed by the tiled flash kernel
    (float32 or bfloat16, float32 statistics, memory O(seq)). Shapes are JAX's: query
    ``(B, T, N, H)`` or ``(T, N, H)``, key and value ``(B, S, K, H)`` or ``(S, K, H)`` with
    ``N % K == 0`` (grouped-query attention). ``is_causal`` is top-left aligned: query ``i``
    attends to keys ``j <= i``, as in JAX. ``mask`` is boolean (``True`` = attend) and
    broadcastable to ``(B, N, T, S)``.

    Differences from JAX: ``bias``, ``query_seq_lengths``, ``key_value_seq_lengths``,
    ``local_window_size`` and ``implementation='cudnn'`` raise NotImplementedError; a query
    whose keys are all masked gets zeros (JAX, which masks with a large finite negative, returns
    the mean of ``value``).

    Args:
      query, key, value: arrays as above (numpy arrays, or LocalArrays inside shard_map).
      bias: unsupported, must be None.
      mask: optional boolean mask broadcastable to ``(B, N, T, S)``.
      scale: logit scale; defaults to ``1 / sqrt(H)``.
      is_causal: apply the causal mask.
      query_seq_lengths, key_value_seq_lengths, local_window_size: unsupported, must be None.
      implementation: None or ``'xla'`` (both run the flash kernel).
      return_residual: also return the logsumexp, shape ``(B, T, N)`` (or ``(T, N)``), in the
        inputs' dtype as JAX returns it.

    Returns:
      The attention output with query's shape and dtype, or ``(output, logsumexp)``.

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
        raise NotImplementedError(
            f"[{op}] implementation={implementation!r} is not available on the CPU; use None"
        )
    f = _Folded(op, [query, key, value, mask], _query_batch)
    q, k, v, m = f.arrays
    out, lse = run_forward(op, _to4d(q), _to4d(k), _to4d(v), is_causal, scale,
                           None if m is None else _to4d(m))
    q_local = _local_shape(query)
    # JAX's residual: layout (B, T, N), dtype of the inputs (the kernel's lse is fp32).
    res = f.unfold(np.swapaxes(lse, 1, 2).astype(out.dtype), q_local[:-1])
    out = f.unfold(out, q_local)
    flops = _attention_flops(q_local, _local_shape(key), is_causal, 4)
    _record("attention", f, [query, key, value, query], flops)  # the output is query-sized
    return (out, res) if return_residual else out


def dot_product_attention_vjp(query, key, value, dout, *, mask=None, scale=None,
                              is_causal=False):
    """Gradients of :func:`dot_product_attention` with respect to query, key and value.

    Recomputes the forward (output and logsumexp), then runs the FlashAttention-2 backward.
    Equivalent to ``jax.vjp(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, ...), ...)``
    applied to ``dout``.

    Args:
      query, key, value: as for :func:`dot_product_attention`.
      dout: gradient of the output, query's shape.
      mask, scale, is_causal: as for :func:`dot_product_attention`.

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
    f = _Folded(op, [query, key, value, dout, mask], _query_batch)
    q4, k4, v4, g4 = (_to4d(x) for x in f.arrays[:4])
    m4 = None if f.arrays[4] is None else _to4d(f.arrays[4])
    out, lse = run_forward(op, q4, k4, v4, is_causal, scale, m4)
    grads = run_backward(op, q4, k4, v4, out, lse, g4, is_causal, scale, m4)
    grads = tuple(f.unfold(g, _local_shape(x)) for g, x in zip(grads, (query, key, value)))
    flops = _attention_flops(_local_shape(query), _local_shape(key), is_causal, 14)
    _record("attention_vjp", f, [query, key, value, dout, query, key, value], flops)  # + the gradients
    return grads
