"""Compute costs on one chip at the preset's peaks: FLOP counts, the roofline of a piece of work
(:func:`compute_time`), one matmul's roofline and the critical intensities.

FLOP formulas live in :mod:`shardlab._src.cost.formulas`; the functions here check their
arguments and call them.

Example:
    >>> from shardlab import cost
    >>> c = cost.matmul_time(512, 4096, 8192, "bfloat16", hardware="b200")
    >>> round(c.t_math * 1e6, 1), c.bound
    (15.3, 'compute')
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np

from ..core import units
from ..core.einsum_spec import parse
from . import formulas
from .layout import _check_shape, _dtype_name, _require_hw, itemsize

__all__ = ["ComputeTime", "compute_time", "hbm_load_time", "peak_flops", "matmul_flops", "einsum_flops",
           "attention_flops", "MatmulCost", "matmul_time", "critical_batch_size", "ici_critical_intensity",
           "COMPUTE"]

#: The ledger's compute event ops.
COMPUTE = frozenset(formulas.COMPUTE)


def hbm_load_time(nbytes: float, hardware) -> float:
    """Seconds to read ``nbytes`` from HBM once at the chip's HBM bandwidth (``nbytes / W_hbm``).

    Example:
        >>> from shardlab import hardware
        >>> chip = hardware.get("tpu-v5e").replace(hbm_bandwidth=3.4e12)   # the quiz's custom chip
        >>> round(hbm_load_time(2 * 13e9, chip) * 1e3, 2)                  # 13B bf16 parameters, ms
        7.65
    """
    hw = _require_hw("hbm_load_time", hardware)
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float, np.integer, np.floating)) \
            or not nbytes >= 0 or not math.isfinite(nbytes):
        raise ValueError(f"[hbm_load_time] nbytes {nbytes!r} must be a finite number >= 0")
    return float(nbytes) / hw.hbm_bandwidth


def peak_flops(hardware, dtype) -> tuple[float, str | None]:
    """Peak FLOP/s for a matmul in ``dtype`` and a note when a stand-in figure is used.

    bf16-class types (bfloat16, float16) use the bf16 figure; float8 types the fp8 figure.
    When the vendor publishes no figure for the dtype (fp32 on TPUs, float64 everywhere) the
    bf16 peak is used and the note says so.
    """
    hw = _require_hw("peak_flops", hardware)
    name = _dtype_name(dtype) if not isinstance(dtype, str) or not dtype.startswith("float8") else "float8"
    key = {"float16": "bfloat16", "uint8": "int8"}.get(name, name)
    if key.startswith("float8"):
        key = "float8"
    if hw.has_peak(key):
        return hw.peak(key), None
    return hw.peak("bfloat16"), f"{hw.name} publishes no {name} matmul peak; priced at the bf16 peak"


class ComputeTime(NamedTuple):
    """The roofline of one piece of work on one chip (see :func:`compute_time`)."""

    seconds: float       # max(math_seconds, hbm_seconds)
    math_seconds: float  # flops / peak(dtype)
    hbm_seconds: float   # hbm_bytes / HBM bandwidth
    bound: str           # "compute" or "memory"
    note: str | None     # set when the dtype has no published peak and the bf16 one stands in


def compute_time(flops: float, hbm_bytes: float, dtype, hardware) -> ComputeTime:
    """The roofline of ``flops`` FLOPs that move ``hbm_bytes`` bytes of HBM on one chip:
    ``max(flops / peak(dtype), hbm_bytes / HBM bandwidth)`` at the preset's peaks.

    The one place that formula is written: the ledger's compute events, the roofline, the
    planner's contractions, :func:`matmul_time` and the pipeline's durations all call it. The
    calibrated price of the same work (what the chip reaches, not its peak) is
    :func:`shardlab.cost.price_event` with the chip's :func:`shardlab.cost.price_list`.

    Example:
        >>> t = compute_time(2 * 4096**3, 3 * 2 * 4096**2, "bfloat16", "h100")
        >>> round(t.seconds * 1e6, 1), t.bound
        (139.0, 'compute')
    """
    hw = _require_hw("compute_time", hardware)
    peak, note = peak_flops(hw, dtype or "bfloat16")
    t_math, t_hbm = float(flops) / peak, float(hbm_bytes) / hw.hbm_bandwidth
    return ComputeTime(max(t_math, t_hbm), t_math, t_hbm, "compute" if t_math >= t_hbm else "memory", note)


def matmul_flops(m: int, k: int, n: int, *, batch: int = 1) -> int:
    """2 x batch x m x k x n: one multiply and one add per term (:func:`formulas.matmul_flops`)."""
    for name, v in (("m", m), ("k", k), ("n", n), ("batch", batch)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"[matmul_flops] {name}={v!r} must be an int")
        if v < 0:
            raise ValueError(f"[matmul_flops] {name}={v} must be >= 0")
    return formulas.matmul_flops(m, k, n, batch=batch)


def einsum_flops(subscripts: str, *shapes) -> int:
    """2 x the product of every distinct index size (``einsum_flops("bd,df->bf", (B, D), (D, F))``)."""
    dims = [_check_shape("einsum_flops", shape) for shape in shapes]
    terms, _ = parse(subscripts, dims, "einsum_flops")
    sizes = {c: d for t, shape in zip(terms, dims) for c, d in zip(t, shape)}
    return formulas.einsum_flops(sizes)


def attention_flops(batch: int, q_len: int, kv_len: int, heads: int, head_dim: int, *, causal: bool = False) -> float:
    """FLOPs of the forward softmax(Q K^T) V: 4 FLOPs per (query, key, head_dim) over the
    (query, key) pairs the kernel computes (:func:`shardlab.cost.formulas.attention_pairs`: all
    ``q_len x kv_len`` of them, or the ``T(T+1)/2`` causal masking keeps), the count the ledger's
    attention events carry.

    Example:
        >>> attention_flops(1, 4, 4, 1, 1), attention_flops(1, 4, 4, 1, 1, causal=True)   # 16 pairs, 10 kept
        (64.0, 40.0)
    """
    for name, v in (("batch", batch), ("q_len", q_len), ("kv_len", kv_len), ("heads", heads), ("head_dim", head_dim)):
        if v < 0:
            raise ValueError(f"[attention_flops] {name}={v} must be >= 0")
    pairs = formulas.attention_pairs(int(q_len), int(kv_len), bool(causal))
    return float(formulas.attention_flops(batch, heads, head_dim, pairs, 4))


@dataclasses.dataclass(frozen=True)
class MatmulCost:
    flops: float
    hbm_bytes: float
    t_math: float
    t_hbm: float
    seconds: float  # max(t_math, t_hbm)
    arithmetic_intensity: float
    critical_intensity: float
    bound: str  # "compute" or "memory"


def matmul_time(m: int, k: int, n: int, dtype="bfloat16", *, hardware, batch: int = 1,
                out_dtype=None) -> MatmulCost:
    """Roofline of one [m, k] x [k, n] matmul on one chip: FLOPs over peak vs bytes over HBM.

    HBM bytes are the two inputs read and the output written once.

    Example:
        >>> c = matmul_time(512, 4096, 8192, "bfloat16", hardware="b200")
        >>> round(c.t_math * 1e6, 1), c.bound
        (15.3, 'compute')
    """
    flops = matmul_flops(m, k, n, batch=batch)
    size = itemsize(dtype)
    hbm = batch * (m * k + k * n) * size + batch * m * n * itemsize(out_dtype or dtype)
    hw = _require_hw("matmul_time", hardware)
    t = compute_time(flops, hbm, dtype, hw)
    return MatmulCost(flops, hbm, t.math_seconds, t.hbm_seconds, t.seconds, flops / hbm if hbm else math.inf,
                      peak_flops(hw, dtype)[0] / hw.hbm_bandwidth, t.bound)


def critical_batch_size(hardware, dtype="bfloat16", *, weight_dtype=None) -> float:
    """Tokens per device above which a weight-streaming matmul is compute-bound: peak / HBM BW.

    With weights stored in a narrower ``weight_dtype`` the threshold falls in proportion
    (int8 weights with bf16 math halve it).

    Example:
        >>> round(critical_batch_size("tpu-v5e"))
        240
    """
    hw = _require_hw("critical_batch_size", hardware)
    peak, _ = peak_flops(hw, dtype)
    scale = itemsize(weight_dtype) / itemsize("bfloat16") if weight_dtype is not None else itemsize(dtype) / 2
    return peak / hw.hbm_bandwidth * scale


def ici_critical_intensity(hardware, dtype="bfloat16") -> float:
    """Peak FLOP/s over bidirectional ICI bandwidth of one axis (2550 on TPU v5p in bf16)."""
    hw = _require_hw("ici_critical_intensity", hardware)
    if hw.family != "tpu":
        raise ValueError(f"[cost] {hw.name} has no ICI; use the NVLink bandwidth ({units.fmt_bandwidth(hw.nvlink_bandwidth)})")
    return peak_flops(hw, dtype)[0] / (2 * hw.ici_link_bandwidth)

