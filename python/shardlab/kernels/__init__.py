"""The two hot kernels on plain numpy arrays: GEMM and flash attention."""

from . import attention, gemm  # noqa: F401
from .attention import flash_attention, flash_attention_backward
from .gemm import gemm  # noqa: F811

__all__ = ["flash_attention", "flash_attention_backward", "gemm"]
