"""``kv_cache_bytes``: the size of a key/value cache, ``2 * T * L * K * H`` elements.

Example:
    >>> from shardlab.models import kv_cache_bytes, presets
    >>> kv_cache_bytes(presets.get("book-part4-q1"), tokens=1, dtype="int8").total  # 512 kB
    524288
"""

from __future__ import annotations

from .config import ModelConfig
from .dtypes import dtype_bytes
from .report import Report

__all__ = ["kv_cache_bytes"]


def kv_cache_bytes(cfg: ModelConfig, tokens: int = 1, dtype="bfloat16", *, batch: int = 1) -> Report:
    """Bytes of the KV cache of ``batch`` sequences of ``tokens`` tokens.

    Each layer keeps one key and one value vector per KV head: ``[2, batch, tokens, L, K, H]``.

    Args:
        cfg: the model.
        tokens: cached tokens per sequence.
        dtype: element type ("int8", "bfloat16", ...).
        batch: sequences.

    Returns:
        A :class:`~shardlab.models.report.Report` with parts ``keys`` and ``values`` (bytes);
        ``extra['per_token']`` and ``extra['per_token_per_layer']``.

    Example:
        >>> from shardlab.models import presets
        >>> kv_cache_bytes(presets.get("llama3-8b"), 8192, "bfloat16").total / 2**30  # GiB
        1.0
    """
    op = "kv_cache_bytes"
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"[{op}] expected a ModelConfig, got {type(cfg).__name__}")
    for name, v in (("tokens", tokens), ("batch", batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"[{op}] {name} {v!r} must be an int >= 0")
    b = dtype_bytes(dtype, op)
    per_layer = cfg.num_kv_heads * cfg.head_dim * b
    one = batch * tokens * cfg.num_layers * per_layer
    one = int(one) if float(one).is_integer() else one
    return Report(f"{op}({cfg.name or 'model'}, {tokens} tokens x {batch}, {dtype})",
                  {"keys": one, "values": one}, unit="bytes",
                  formula=f"2 * B * T * L * K * H * bytes = 2*{batch}*{tokens}*{cfg.num_layers}*"
                          f"{cfg.num_kv_heads}*{cfg.head_dim}*{b:g}",
                  extra={"per_token": int(2 * cfg.num_layers * per_layer),
                         "per_token_per_layer": int(2 * per_layer)},
                  extra_units={"per_token": "bytes", "per_token_per_layer": "bytes"})
