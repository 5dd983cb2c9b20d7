"""shardlab's GEMM on plain arrays (see ``shardlab._src.kernels.gemm``)."""

from .._src.kernels.gemm import *  # noqa: F401,F403
from .._src.kernels.gemm import gemm  # noqa: F401
