"""The element types shardlab moves: float32, float64, bfloat16 (ml_dtypes), int32, int8, bool."""

import ml_dtypes
import numpy as np

bfloat16 = np.dtype(ml_dtypes.bfloat16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int32 = np.dtype(np.int32)
int8 = np.dtype(np.int8)
bool_ = np.dtype(np.bool_)

SUPPORTED = (float32, float64, bfloat16, int32, int8, bool_)


def check_dtype(dtype, op: str) -> np.dtype:
    """Returns `dtype` as np.dtype, or raises TypeError naming `op` and the supported types."""
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED:
        raise TypeError(f"[{op}] dtype {dtype} is not supported; use one of "
                        f"{', '.join(str(d) for d in SUPPORTED)} (cast with .astype)")
    return dtype


def canonicalize(arr: np.ndarray, op: str) -> np.ndarray:
    """Applies JAX's default (x64-off) integer canonicalization: int64/uint → int32."""
    if arr.dtype.kind in "iu" and arr.dtype not in (int32, int8):
        if arr.size and (arr.max() > np.iinfo(np.int32).max or arr.min() < np.iinfo(np.int32).min):
            raise OverflowError(f"[{op}] integer values do not fit in int32, shardlab's integer type")
        return arr.astype(np.int32)
    check_dtype(arr.dtype, op)
    return arr
