"""The small closed forms of the book's part 7, each a function of a hardware preset.

* :func:`critical_batch` -- B_crit = (peak / HBM BW) x (bytes per param / bytes per activation):
  240 on TPU v5e in bf16, 120 with int8 weights and bf16 math, 240 again with int8 math;
* :func:`attention_intensity` -- 4BSTD / (4BSD + 4BTD) = ST / (S + T): T/2 for prefill, ~1
  for decode;
* :func:`model_parallel_limit` -- decode stays HBM-bound while Y < F / (B beta), beta =
  W_hbm / W_ici;
* :func:`latency_bound_bytes` -- a collective is latency-bound below W_ici x 1 us x n;
* :func:`weight_stationary_2d` -- problem 7: the 1-D vs 2-D weight-stationary communication and
  the chip count above which 2-D wins.

Example:
    >>> from shardlab.serve.roofline import critical_batch, attention_intensity
    >>> [round(critical_batch("tpu-v5e", c, w)) for c, w in [("bfloat16", None), ("bfloat16", "int8"), ("int8", "int8")]]
    [240, 120, 240]
    >>> attention_intensity(8192, 8192), round(attention_intensity(8192, 1), 3)
    (4096.0, 1.0)
"""

from __future__ import annotations

import math

import shardlab.cost as cost
import shardlab.hardware as hardware_presets
from shardlab.models.dtypes import dtype_bytes

__all__ = ["critical_batch", "attention_intensity", "model_parallel_limit", "latency_bound_bytes",
           "weight_stationary_2d", "hbm_ici_ratio"]


def critical_batch(hardware, compute_dtype="bfloat16", weight_dtype=None) -> float:
    """Tokens per replica above which a weight-streaming matmul is compute-bound.

    Loading one weight costs ``bytes(weight) / W_hbm``; a token does 2 FLOPs with it at
    ``peak(compute_dtype)``, so B_crit = peak x bytes(weight) / (2 W_hbm). On TPU v5e: 240 in
    bf16, 120 with int8 weights and bf16 math, 240 with int8 weights and int8 math (the int8
    peak is twice the bf16 one). The book's ``beta x alpha`` with beta = bits(param) /
    bits(activation) gives 480 for int8 x int8, contradicting its own 240.
    """
    hw = hardware_presets.get(hardware)
    peak, _ = cost.peak_flops(hw, compute_dtype)
    w = dtype_bytes(weight_dtype or compute_dtype, "critical_batch")
    return peak * w / (2 * hw.hbm_bandwidth)


def attention_intensity(kv_len: int, q_len: int) -> float:
    """FLOPs per byte of one attention head: 4BSTD / (4BSD + 4BTD) = ST / (S + T)."""
    return kv_len * q_len / (kv_len + q_len)


def hbm_ici_ratio(hardware) -> float:
    """beta = W_hbm / W_ici (bidirectional ICI of one axis)."""
    hw = hardware_presets.get(hardware)
    return hw.hbm_bandwidth / (2 * hw.ici_link_bandwidth)


def model_parallel_limit(ffw_dim: int, batch: int, hardware) -> float:
    """Largest model-parallel degree Y before ICI (2BD / W_ici) outlasts loading the weights
    (2DF / (Y W_hbm)): Y < F / (B beta)."""
    return ffw_dim / (batch * hbm_ici_ratio(hardware))


def latency_bound_bytes(hardware, shards: int, hop_seconds: float | None = None) -> float:
    """Total bytes below which a collective over ``shards`` devices is latency-bound: each hop
    moves bytes / shards, which takes less than one hop latency when bytes < W_ici x t_hop x n
    (the book's appendix C: 360 kB for 8-way on TPU v5e)."""
    hw = hardware_presets.get(hardware)
    t = hw.hop_latency if hop_seconds is None else hop_seconds
    return hw.ici_link_bandwidth * t * shards


def weight_stationary_2d(batch: int, d_model: int, ffw_dim: int, chips: int, w_ici: float) -> dict:
    """Problem 7. With X x YZ = N chips, X = sqrt(N F / (32 D)) ... in the book's F = 4D case
    X = sqrt(N / 8):

    T_2D = 2BD / (X W) + 4BF / (YZ W) (bf16 bytes folded in, as the book writes it),
    T_1D = 4BD / (3 W) (copied from the book), and 2-D wins for N > 32 (F / D) (3/4)^2.

    Returns the optimal X, YZ, both times and the threshold chip count.
    """
    B, D, F, N = batch, d_model, ffw_dim, chips
    x = math.sqrt(D * N / (2 * F))                  # d/dX [2BD/X + 4BFX/N] = 0
    yz = N / x
    t2d = 2 * B * D / (x * w_ici) + 4 * B * F / (yz * w_ici)
    t1d = 4 * B * D / (3 * w_ici)
    return {"X": x, "YZ": yz, "t_2d": t2d, "t_1d": t1d, "threshold_chips": 32 * (F / D) * (3 / 4) ** 2,
            "t_2d_closed_form": math.sqrt(32 * F / D) * B * D / (math.sqrt(N) * w_ici)}
