"""Throughput questions: model FLOPs utilisation, a step-time lower bound, and the batch at
which an MoE layer becomes compute-bound. Peak FLOP/s and HBM figures come from
``shardlab.hardware`` presets (or a number you pass for a chip that has no preset).

Example:
    >>> from shardlab.models import mfu
    >>> u = mfu(37e9, tokens_per_s=14.8e12 / (2.79e6 / 2048 * 3600), hardware=1.513e15, chips=2048)
    >>> round(u.total, 4)   # DeepSeek-V3 as the book computes it (6 x 37B x tokens)
    0.2162
"""

from __future__ import annotations

import shardlab.cost as _cost
import shardlab.hardware as _hw
from shardlab import units

from .config import ModelConfig
from .dtypes import dtype_bytes
from .flops import flops_per_token
from .params import param_count
from .report import Report

__all__ = ["mfu", "step_time_lower_bound", "moe_compute_bound_batch", "peak_flops", "get_hardware"]


def get_hardware(hardware, op: str = "hardware"):
    """The :class:`~shardlab.hardware.Hardware` of a preset name or a Hardware; for a chip without
    a preset the error says how to build one.

    Example:
        >>> get_hardware("v5p").name
        'tpu-v5p'
    """
    if hardware is None:
        raise ValueError(f"[{op}] hardware is required: a preset ({', '.join(_hw.names())}) or a "
                         f"shardlab.hardware.Hardware")
    try:
        return _hw.get(hardware)
    except ValueError as err:
        why = str(err).removeprefix("[hardware] ")
        raise ValueError(f"[{op}] {why}. For another chip build one with the figures of its data sheet: "
                         f"shardlab.hardware.Hardware(name='my-chip', family='gpu', peak_flops={{'bfloat16': 1e15}}, "
                         f"hbm_capacity=80e9, hbm_bandwidth=3e12, node_size=8, nvlink_link_bandwidth=25e9, "
                         f"nvlink_links=18, ib_bandwidth=50e9), or change a preset: "
                         f"shardlab.hardware.get('h100').replace(hbm_capacity=96e9)") from None


def peak_flops(hardware, dtype="bfloat16", op: str = "peak_flops") -> tuple[float, str]:
    """(peak FLOP/s, a label) of a preset name, a Hardware, or a number of FLOP/s."""
    if isinstance(hardware, (int, float)) and not isinstance(hardware, bool):
        if hardware <= 0:
            raise ValueError(f"[{op}] hardware peak {hardware} FLOP/s must be > 0")
        return float(hardware), units.fmt_flop_rate(hardware)
    hw = get_hardware(hardware, op)
    peak, _note = _cost.peak_flops(hw, dtype)
    return peak, f"{hw.name} {dtype}"


def _model_flops_per_token(cfg, context, include_attention, op) -> tuple[float, str]:
    if isinstance(cfg, ModelConfig):
        f = flops_per_token(cfg, context or cfg.max_seq_len, causal=True, training=True)
        return (f.total if include_attention else f.matmul), (
            "flops_per_token(training) " + ("matmul + attention" if include_attention else "matmul"))
    if isinstance(cfg, (int, float)) and not isinstance(cfg, bool) and cfg > 0:
        return 6.0 * cfg, "6 x params"
    raise TypeError(f"[{op}] expected a ModelConfig or an active parameter count > 0, got {cfg!r}")


def mfu(cfg, tokens_per_s: float, hardware, chips: int, *, context: int | None = None,
        dtype="bfloat16", include_attention: bool = False) -> Report:
    """Model FLOPs utilisation: model FLOP/s achieved over the chips' peak.

    Args:
        cfg: a ModelConfig (training matmul FLOPs per token from :func:`flops_per_token`,
            = 6 x active matmul params) or a number of active parameters (6N per token).
        tokens_per_s: training throughput of the whole job.
        hardware: a preset name / Hardware (peak of ``dtype``) or a peak FLOP/s number.
        chips: how many chips.
        context: sequence length for the attention term (defaults to cfg.max_seq_len).
        dtype: the matmul dtype whose peak counts ("bfloat16", "float8", ...).
        include_attention: add attention FLOPs to the model FLOPs.

    Returns:
        A Report whose ``.total`` is the utilisation (0..1), with the figures used in ``extra``.
    """
    op = "mfu"
    if tokens_per_s <= 0 or chips < 1:
        raise ValueError(f"[{op}] tokens_per_s {tokens_per_s} must be > 0 and chips {chips} >= 1")
    per_token, how = _model_flops_per_token(cfg, context, include_attention, op)
    peak, label = peak_flops(hardware, dtype, op)
    achieved = per_token * tokens_per_s
    return Report(f"mfu({getattr(cfg, 'name', '') or cfg}, {chips} x {label})", {}, total=achieved / (chips * peak),
                  unit="%", formula=f"({how}) x tokens/s / (chips x peak)",
                  extra_units={"model_flops_per_token": "flops", "model_flops_per_s": "flop_rate",
                               "peak_flops_per_chip": "flop_rate"},
                  extra={"model_flops_per_token": per_token, "model_flops_per_s": achieved,
                         "peak_flops_per_chip": peak, "chips": chips})


def step_time_lower_bound(cfg: ModelConfig, batch_tokens: int, hardware, chips: int, *,
                          context: int | None = None, dtype="bfloat16", param_dtype="bfloat16",
                          training: bool = True, include_attention: bool = True, remat=None) -> Report:
    """The fastest a step can be: compute at peak, or reading each chip's weight shard from HBM
    (once forward, once more backward), whichever is longer. Communication is not counted.

    ``include_attention=False`` counts the matmuls only: the book's ``6·P·B / (N·C)`` (part 5,
    question 3: 6 x 3e6 x 13e9 / (4096 x 4.6e14) = 120 ms, "300 ms" at 40% MFU). ``remat`` adds
    the recompute of a policy (``shardlab.models.remat``).

    Returns:
        A Report in seconds with ``compute`` and ``hbm`` in ``extra`` and ``.total`` the max;
        ``extra['bound']`` says which.

    Example:
        >>> from shardlab.models import presets, step_time_lower_bound
        >>> t = step_time_lower_bound(presets.get("llama3-70b"), 4_000_000, "tpu-v5p", 8960, context=4096)
        >>> t.bound
        'compute'
    """
    op = "step_time_lower_bound"
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"[{op}] expected a ModelConfig, got {type(cfg).__name__}")
    if batch_tokens < 1 or chips < 1:
        raise ValueError(f"[{op}] batch_tokens {batch_tokens} and chips {chips} must be >= 1")
    T = context or cfg.max_seq_len
    f = flops_per_token(cfg, T, causal=True, training=training, remat=remat)
    peak, label = peak_flops(hardware, dtype, op)
    per_token = f.total if include_attention else f.total - f.attention
    t_compute = per_token * batch_tokens / (chips * peak)
    hw = get_hardware(hardware, op) if not isinstance(hardware, (int, float)) else None
    weights = param_count(cfg).total * dtype_bytes(param_dtype, op) / chips
    t_hbm = (2 if training else 1) * weights / hw.hbm_bandwidth if hw is not None else 0.0
    return Report(f"{op}({cfg.name or 'model'}, {batch_tokens} tokens, {chips} x {label})", {},
                  unit="s", total=max(t_compute, t_hbm),
                  formula=(f"max(flops_per_token ({'matmul + attention' if include_attention else 'matmul'}) x tokens "
                           f"/ (chips x peak), reads x weights/chip / HBM BW)"),
                  extra={"compute": t_compute, "hbm": t_hbm,
                         "bound": "compute" if t_compute >= t_hbm else "memory"}, extra_units={"compute": "s", "hbm": "s"})


def moe_compute_bound_batch(cfg, hardware, *, weight_dtype="int8", dtype="bfloat16",
                            top_k: int | None = None) -> float:
    """Tokens per batch above which an MoE layer's expert matmuls are compute-bound.

    Loading all E experts costs ``E x D x F x bytes``; the tokens do ``2 x k x B x D x F``
    FLOPs, so the arithmetic intensity ``2kB / (E x bytes)`` must exceed the chip's peak over
    HBM bandwidth: ``B > critical_batch x E / k`` with ``critical_batch`` the dense
    weight-streaming threshold (:func:`shardlab.cost.critical_batch_size`).

    Args:
        cfg: a MoE ModelConfig, or the number of experts E (then pass ``top_k``).
        hardware: preset name or Hardware.
        weight_dtype, dtype: weight storage and matmul dtypes.

    Example:
        >>> from shardlab.models import moe_compute_bound_batch
        >>> round(moe_compute_bound_batch(256, "tpu-v5e", top_k=8))   # v5e: 1.97e14 / 8.2e11 = 240.2
        3844
    """
    op = "moe_compute_bound_batch"
    if isinstance(cfg, ModelConfig):
        if not cfg.is_moe:
            raise ValueError(f"[{op}] {cfg.name or 'the model'} has no experts (num_experts 0)")
        E, k = cfg.num_experts, top_k or cfg.top_k
    else:
        E, k = cfg, top_k
        if not isinstance(E, int) or E < 1 or not isinstance(k, int) or not 1 <= k <= E:
            raise ValueError(f"[{op}] experts {E!r} and top_k {k!r} must satisfy 1 <= top_k <= experts")
    return _cost.critical_batch_size(hardware, dtype, weight_dtype=weight_dtype) * E / k
