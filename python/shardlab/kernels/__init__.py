"""The two hot kernels on plain numpy arrays: GEMM (:func:`gemm`, a function) and flash attention
(the module :mod:`shardlab.kernels.attention`, with its references)."""

from . import attention  # noqa: F401
from .._src.kernels.gemm import gemm
from .attention import flash_attention, flash_attention_backward

__all__ = ["flash_attention", "flash_attention_backward", "gemm"]
