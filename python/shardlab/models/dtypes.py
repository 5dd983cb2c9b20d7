"""Bytes per element of the dtypes the calculators take (names, numpy dtypes, ml_dtypes).

Example:
    >>> from shardlab.models.dtypes import dtype_bytes
    >>> dtype_bytes("int8"), dtype_bytes("bf16"), dtype_bytes("float32"), dtype_bytes("fp8")
    (1, 2, 4, 1)
"""

from __future__ import annotations

import numpy as np

__all__ = ["dtype_bytes"]

_NAMED = {"int8": 1, "uint8": 1, "fp8": 1, "float8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
          "int4": 0.5, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2,
          "fp32": 4, "float32": 4, "float": 4, "int32": 4, "fp64": 8, "float64": 8}


def dtype_bytes(dtype, op: str = "dtype") -> float:
    """Bytes per element of ``dtype`` (``"int4"`` is 0.5)."""
    if isinstance(dtype, str):
        key = dtype.lower()
        if key in _NAMED:
            return _NAMED[key]
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        raise ValueError(f"[{op}] unknown dtype {dtype!r}; use one of {', '.join(_NAMED)} "
                         f"or a numpy dtype") from None
