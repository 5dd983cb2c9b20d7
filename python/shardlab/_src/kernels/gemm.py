"""shardlab's GEMM kernel on plain numpy arrays: float32 and bfloat16, batched, strided."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

import shardlab._core as _core

from ..core import memory

_BF16 = np.dtype(ml_dtypes.bfloat16)
_F32 = np.dtype(np.float32)
_SUPPORTED = (_F32, _BF16)


def _check_dtype(x: np.ndarray, name: str) -> None:
    if x.dtype not in _SUPPORTED:
        raise TypeError(
            f"[gemm] {name} has dtype {x.dtype}; the GEMM kernel takes float32 or bfloat16 "
            f"(ml_dtypes.bfloat16). Cast with {name}.astype(np.float32), or use np.matmul for "
            f"{x.dtype} (shardlab.numpy.matmul falls back to numpy for dtypes the kernel lacks)"
        )


def _packable(x: np.ndarray) -> np.ndarray:
    """Returns `x` itself unless its strides or address are not whole elements (rare views of
    structured or byte buffers), in which case a contiguous copy."""
    if x.ctypes.data % x.itemsize or any(s % x.itemsize for s in x.strides):
        return np.ascontiguousarray(x)
    return x


def gemm(a, b, *, preferred_element_type=None) -> np.ndarray:
    """Matrix product ``a @ b`` on shardlab's packed, multi-threaded GEMM kernel.

    Shapes follow ``np.matmul``: ``[..., M, K] @ [..., K, N] -> [..., M, N]`` with numpy
    broadcasting of the batch dims, and a 1-D operand is a row (``a``) or column (``b``)
    vector whose unit dim is dropped from the result. Transposed and strided views are read
    in place, without copies. Accumulation is always float32; bfloat16 inputs are multiplied
    exactly (AVX512_BF16 dot products where the CPU has them).

    Args:
        a: float32 or bfloat16 (``ml_dtypes.bfloat16``) array, at least 1-D.
        b: array of the same dtype as ``a``, at least 1-D.
        preferred_element_type: dtype of the result. ``None`` gives the input dtype (a
            bfloat16 result is the float32 accumulator rounded to nearest even, as
            ``jnp.matmul`` does); ``np.float32`` keeps the float32 accumulator.

    Returns:
        A new C-contiguous array of shape ``np.matmul(a, b).shape`` (a scalar for two 1-D
        operands).

    Raises:
        TypeError: a dtype other than float32/bfloat16 (float64 callers should use
            ``np.matmul``), or ``a`` and ``b`` of different dtypes.
        ValueError: a 0-d operand, inner dimensions that differ, or batch dims that do not
            broadcast.

    Example:
        >>> import numpy as np
        >>> from shardlab.kernels import gemm
        >>> a = np.arange(6, dtype=np.float32).reshape(2, 3)
        >>> gemm(a, a.T)
        array([[ 5., 14.],
               [14., 50.]], dtype=float32)
    """
    a = np.asarray(a)
    b = np.asarray(b)
    _check_dtype(a, "a")
    _check_dtype(b, "b")
    if a.dtype != b.dtype:
        raise TypeError(
            f"[gemm] a has dtype {a.dtype} and b {b.dtype}; cast both to float32 or both to "
            "bfloat16"
        )
    out_dtype = a.dtype if preferred_element_type is None else np.dtype(preferred_element_type)
    if out_dtype not in _SUPPORTED:
        raise TypeError(
            f"[gemm] preferred_element_type {out_dtype} is not supported; use None, "
            "np.float32 or ml_dtypes.bfloat16"
        )
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(
            f"[gemm] a has shape {a.shape} and b {b.shape}: matmul needs operands of at least "
            "one dimension; multiply by a scalar with `*`"
        )
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(
            f"[gemm] a has shape {a.shape} and b {b.shape}: inner dimensions "
            f"{a2.shape[-1]} and {b2.shape[-2]} differ"
        )
    nd = max(a2.ndim, b2.ndim)
    a2 = a2[(None,) * (nd - a2.ndim)]
    b2 = b2[(None,) * (nd - b2.ndim)]
    try:
        batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    except ValueError:
        raise ValueError(
            f"[gemm] a has shape {a.shape} and b {b.shape}: batch dims {a.shape[:-2]} and "
            f"{b.shape[:-2]} do not broadcast"
        ) from None
    out_elems = math.prod(batch) * a2.shape[-2] * b2.shape[-1]
    memory.check_alloc("gemm", out_elems * (4 + (out_dtype.itemsize if out_dtype != _F32 else 0)),
                       f"the result of {a.shape} @ {b.shape} is that large; multiply in blocks of rows")
    out = _core.gemm(_packable(a2), _packable(b2))
    if a.ndim == 1:
        out = out[..., 0, :]
    if b.ndim == 1:
        out = out[..., 0]
    if out_dtype != _F32:
        out = out.astype(out_dtype)
    return out[()] if out.ndim == 0 else out  # 1-D @ 1-D is a scalar, as in np.matmul
