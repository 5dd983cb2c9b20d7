"""Bytes per element of the dtypes the calculators take (names, numpy dtypes, ml_dtypes): the
one table is ``shardlab.dtypes.itemsize``'s; ``dtype_bytes`` is that function.

Example:
    >>> from shardlab.models.dtypes import dtype_bytes
    >>> dtype_bytes("int8"), dtype_bytes("bf16"), dtype_bytes("float32"), dtype_bytes("fp8")
    (1, 2, 4, 1)
"""

from __future__ import annotations

from shardlab.dtypes import itemsize as dtype_bytes

__all__ = ["dtype_bytes"]
