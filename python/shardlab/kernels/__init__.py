"""The two hot kernels on plain numpy arrays: GEMM and flash attention."""

from .gemm import gemm
from .attention import flash_attention, flash_attention_backward

__all__ = ["flash_attention", "flash_attention_backward", "gemm"]
