"""The book's part 5 closed forms: when each training strategy is compute-bound.

With ``α = C / W`` the critical intensity of a link (peak FLOP/s over the bandwidth a
collective gets from it: both directions of a torus axis, a GPU's NVLink or InfiniBand egress,
a chip's share of the DCN) and ``M`` the number of mesh axes a strategy's collectives run over:

* data parallelism and FSDP (ZeRO-1/2/3) are compute-bound above ``B/N > α / M_X`` tokens
  per chip (850 on a v5p cube: 2550 / 3);
* tensor parallelism does not depend on the batch: compute-bound while ``Y < M_Y · F / α``;
* FSDP + TP, at the book's ``X_opt = sqrt(B·M_X·N / (F·M_Y))``, above
  ``B/N > α² / (M_X · M_Y · F)`` (about 99 for F = 32,768 on a v5p cube);
* across slices, pure data parallelism over the DCN above ``α_dcn`` tokens per slice (71,360
  in the book's TPU v5p numbers).

:func:`crossover_batches` gives each strategy's threshold on a mesh; ``train.search`` shows them
beside its answer.

Example:
    >>> from shardlab import train
    >>> round(train.critical_intensity("tpu-v5p"))              # 4.59e14 / (2 x 9e10)
    2550
    >>> round(train.fsdp_tp_min_batch_per_chip(32768, "tpu-v5p", m_x=2, m_y=1))   # the book's ~99
    99
    >>> round(train.x_opt(48000, 32768, 64), 1)
    9.7
"""

from __future__ import annotations

import math

from shardlab.models import get_hardware

__all__ = ["critical_intensity", "crossover_batches", "dp_min_batch_per_chip", "fsdp_tp_min_batch_per_chip",
           "max_tensor_parallelism", "x_opt", "LINKS"]

#: the links a critical intensity can be asked for
LINKS = ("ici", "nvlink", "ib", "dcn")


def critical_intensity(hardware, link: str = "ici", dtype: str = "bfloat16") -> float:
    """``α = C / W``: peak FLOP/s of ``dtype`` over the bandwidth one collective gets from
    ``link`` ("ici": both directions of one torus axis; "nvlink" / "ib": a GPU's egress;
    "dcn": a chip's share of the data-centre network).

    Example:
        >>> round(critical_intensity("tpu-v5p", "dcn"))        # 4.59e14 / 6.25e9
        73440
        >>> round(critical_intensity("h100", "nvlink"))        # 9.89e14 / 4.5e11
        2198
    """
    op = "critical_intensity"
    hw = get_hardware(hardware, op)
    if link not in LINKS:
        raise ValueError(f"[{op}] link {link!r} is not one of {', '.join(LINKS)}")
    bandwidth = {"ici": 2 * hw.ici_link_bandwidth, "nvlink": hw.nvlink_bandwidth, "ib": hw.ib_bandwidth,
                 "dcn": hw.dcn_bandwidth}[link]
    if bandwidth <= 0:
        have = [k for k in LINKS if {"ici": hw.ici_link_bandwidth, "nvlink": hw.nvlink_bandwidth,
                                     "ib": hw.ib_bandwidth, "dcn": hw.dcn_bandwidth}[k] > 0]
        raise ValueError(f"[{op}] {hw.name} has no {link} bandwidth; its links: {', '.join(have) or 'none'}")
    return hw.peak(dtype) / bandwidth


def _alpha(hardware, link, op):
    if isinstance(hardware, (int, float)) and not isinstance(hardware, bool):
        if hardware <= 0:
            raise ValueError(f"[{op}] the critical intensity {hardware} must be > 0")
        return float(hardware)
    return critical_intensity(hardware, link)


def _axes(op: str, **counts) -> None:
    for name, v in counts.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise ValueError(f"[{op}] {name}={v!r} must be a number > 0 (mesh axes a strategy's collectives use)")


def dp_min_batch_per_chip(hardware, m_x: int = 1, link: str = "ici") -> float:
    """Tokens per chip above which data parallelism or FSDP is compute-bound: ``α / M_X``.

    ``hardware`` may be a chip (its ``link``'s α) or α itself.

    Example:
        >>> round(dp_min_batch_per_chip("tpu-v5p", m_x=3))    # the book: "BS=850 per TPU"
        850
    """
    _axes("dp_min_batch_per_chip", m_x=m_x)
    return _alpha(hardware, link, "dp_min_batch_per_chip") / m_x


def fsdp_tp_min_batch_per_chip(ffw_dim, hardware, m_x: int = 2, m_y: int = 1, link: str = "ici") -> float:
    """Tokens per chip above which FSDP + TP (at X_opt) is compute-bound: ``α² / (M_X·M_Y·F)``.

    Args:
        ffw_dim: F, or a ModelConfig (its ``ffw_dim``).
        hardware: a chip (its ``link``'s α) or α itself.
        m_x, m_y: mesh axes of the FSDP and the TP collectives.

    Example:
        >>> round(fsdp_tp_min_batch_per_chip(13824, 2550, m_x=2, m_y=1))   # LLaMA-2 13B: "235"
        235
    """
    op = "fsdp_tp_min_batch_per_chip"
    F = getattr(ffw_dim, "ffw_dim", ffw_dim)
    _axes(op, m_x=m_x, m_y=m_y, ffw_dim=F)
    return _alpha(hardware, link, op) ** 2 / (m_x * m_y * F)


def max_tensor_parallelism(ffw_dim, hardware, m_y: int = 1, link: str = "ici") -> float:
    """The largest model-axis size Y at which tensor parallelism stays compute-bound:
    ``M_Y · F / α`` (the book: between 8 and 16 for most models).

    Example:
        >>> round(max_tensor_parallelism(32768, "tpu-v5p"), 1)
        12.9
    """
    op = "max_tensor_parallelism"
    F = getattr(ffw_dim, "ffw_dim", ffw_dim)
    _axes(op, m_y=m_y, ffw_dim=F)
    return m_y * F / _alpha(hardware, link, op)


def x_opt(batch_tokens: float, ffw_dim: int, chips: int, m_x: int = 1, m_y: int = 1) -> float:
    """The book's optimal FSDP degree for FSDP + TP: sqrt(B·M_X·N / (F·M_Y)).

    Example:
        >>> round(x_opt(3e6, 13824, 4096, m_x=2))   # part 5, question 3: "1333"
        1333
    """
    _axes("x_opt", batch_tokens=batch_tokens, ffw_dim=ffw_dim, chips=chips, m_x=m_x, m_y=m_y)
    return math.sqrt(batch_tokens * m_x * chips / (ffw_dim * m_y))


def crossover_batches(ffw_dim, hardware, chips: int, *, mesh_axes: int = 3, m_y: int = 1,
                      model_size: int | None = None, link: str = "ici", dcn_slices: int = 1) -> dict:
    """The global batch (tokens) above which each strategy is compute-bound on ``chips`` chips
    whose mesh has ``mesh_axes`` axes (the book's part 5 plot of T_math against T_comms).

    Args:
        ffw_dim: F, or a ModelConfig.
        hardware: a chip or α.
        chips: N.
        mesh_axes: axes of the mesh: DP / FSDP use them all (``M_X = mesh_axes``), FSDP + TP
            gives ``m_y`` of them to TP (``M_X = mesh_axes - m_y``).
        model_size: Y of pure tensor parallelism (default: all chips); its threshold is 0 while
            ``Y < M_Y·F/α`` and infinite beyond.
        dcn_slices: with more than one slice, ``"dcn"`` is the batch above which pure data
            parallelism across the slices is compute-bound (``α_dcn`` tokens per slice).

    Returns:
        ``{"dp", "fsdp", "tp", "fsdp_tp"[, "dcn"]: tokens}``.

    Example:
        >>> c = crossover_batches(32768, "tpu-v5p", 4096)   # the book: all comms-bound below ~4e5
        >>> round(c["fsdp_tp"], -3), round(c["dp"], -4)
        (406000.0, 3480000.0)
    """
    op = "crossover_batches"
    F = getattr(ffw_dim, "ffw_dim", ffw_dim)
    _axes(op, chips=chips, mesh_axes=mesh_axes, m_y=m_y, ffw_dim=F)
    if m_y >= mesh_axes:
        raise ValueError(f"[{op}] m_y={m_y} leaves no mesh axis for FSDP (mesh_axes={mesh_axes})")
    alpha = _alpha(hardware, link, op)
    dp = chips * alpha / mesh_axes
    Y = chips if model_size is None else model_size
    out = {"dp": dp, "fsdp": dp, "tp": 0.0 if Y < m_y * F / alpha else math.inf,
           "fsdp_tp": chips * alpha ** 2 / ((mesh_axes - m_y) * m_y * F)}
    if dcn_slices > 1:
        out["dcn"] = dcn_slices * _alpha(hardware, "dcn", op)
    return out
