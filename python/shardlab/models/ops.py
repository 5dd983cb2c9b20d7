"""Small array functions the model needs that ``shardlab.numpy`` does not have yet (softmax,
log-softmax, activations, an inclusive prefix sum, top-k by repeated argmax).

They are built from ``shardlab.numpy`` / numpy ufuncs only, so they run on plain arrays and
on per-device values inside ``shard_map``, and none of them is a matmul: the ledger records
no FLOPs for them (they are the book's O(BTD) elementwise terms).

Example:
    >>> import numpy as np
    >>> from shardlab.models import ops
    >>> ops.cumsum(np.array([[1, 0, 1, 1]]), axis=1).tolist()
    [[1, 1, 2, 3]]
    >>> vals, idx = ops.top_k(np.array([[0.1, 0.7, 0.2]]), 2)
    >>> [i.tolist() for i in idx]
    [[1], [2]]
"""

from __future__ import annotations

import numpy as np

import shardlab.nn as snn
import shardlab.numpy as jnp

__all__ = ["softmax", "log_softmax", "activation", "gated_activation", "cumsum", "top_k", "one_hot"]


def softmax(x, axis: int = -1):
    m = jnp.max(x, axis=axis, keepdims=True)
    e = jnp.exp(x - m)
    return e / jnp.sum(e, axis=axis, keepdims=True)


def log_softmax(x, axis: int = -1):
    m = jnp.max(x, axis=axis, keepdims=True)
    s = x - m
    return s - jnp.log(jnp.sum(jnp.exp(s), axis=axis, keepdims=True))


def activation(name: str, x):
    """silu, relu, gelu and gelu_tanh (numpy has no erf ufunc, so "gelu" is computed with the
    tanh approximation too; the FLOP count does not depend on it)."""
    if name == "silu":
        return snn.silu(x)
    if name == "relu":
        return jnp.maximum(x, 0.0)
    c = np.float32(np.sqrt(2.0 / np.pi))
    return 0.5 * x * (1.0 + jnp.tanh(c * (x + 0.044715 * x * x * x)))


def gated_activation(name: str, x):
    """act(gate) * up for ``x = [gate | up]`` on its last axis (one projection by the
    concatenated weights): the gated MLP's hidden value. SwiGLU (``name == "silu"``) is one
    fused ``shardlab.nn.swiglu`` pass.

    Example:
        >>> import numpy as np
        >>> from shardlab.models import ops
        >>> x = np.array([[1.0, -2.0, 3.0, 0.5]], np.float32)  # gate [1, -2], up [3, 0.5]
        >>> ops.gated_activation("relu", x).tolist()
        [[3.0, 0.0]]
    """
    if name == "silu":
        return snn.swiglu(x)
    gate, up = jnp.split(x, 2, axis=-1)
    return activation(name, gate) * up


def _shift(x, s: int, axis: int):
    """x shifted by s along axis (zeros enter at the front)."""
    n = x.shape[axis]
    idx = [slice(None)] * len(x.shape)
    idx[axis] = slice(0, n - s)
    pad_shape = list(x.shape)
    pad_shape[axis] = s
    return jnp.concatenate([jnp.zeros(tuple(pad_shape), x.dtype), x[tuple(idx)]], axis=axis)


def cumsum(x, axis: int):
    """Inclusive prefix sum along ``axis`` (Hillis-Steele: log2(n) shifted adds)."""
    axis = axis % len(x.shape)
    s = 1
    while s < x.shape[axis]:
        x = x + _shift(x, s, axis)
        s *= 2
    return x


def one_hot(idx, n: int):
    """[..., n] 0/1 int32 from integer indices [...]."""
    return jnp.equal(jnp.expand_dims(idx, -1), np.arange(n, dtype=np.int32)).astype(np.int32)


def top_k(scores, k: int):
    """The k largest entries along the last axis, largest first, as two lists of k arrays
    ``values[j]`` and ``indices[j]`` of shape ``scores.shape[:-1]`` (ties: lowest index)."""
    n = scores.shape[-1]
    values, indices = [], []
    masked = scores
    for _ in range(k):
        i = jnp.argmax(masked, axis=-1)
        values.append(jnp.take_along_axis(masked, jnp.expand_dims(i, -1), axis=-1)[..., 0])
        indices.append(i)
        masked = jnp.where(one_hot(i, n) > 0, -np.inf, masked)
    return values, indices
