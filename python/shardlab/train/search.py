"""Which strategy and mesh to train on: the estimate's fastest fitting plan, beside the book's X_opt.

:func:`search` tries the built-in strategies over mesh factorizations, prices each with
:func:`~shardlab.train.estimate` and keeps the fastest that fits, next to the book's
X_opt = sqrt(B·M_X·N / (F·M_Y)) (:func:`x_opt`).

Example:
    >>> from shardlab import train
    >>> round(train.x_opt(48000, 32768, 64), 1)    # the book's N=64 example
    9.7
"""

from __future__ import annotations

import math

import shardlab.hardware as hw_mod
from shardlab import units

from . import strategy as _strategy
from .estimate import estimate

__all__ = ["search", "x_opt"]


def x_opt(batch_tokens: float, ffw_dim: int, chips: int, m_x: int = 1, m_y: int = 1) -> float:
    """The book's optimal FSDP degree for FSDP + TP: sqrt(B·M_X·N / (F·M_Y))."""
    return math.sqrt(batch_tokens * m_x * chips / (ffw_dim * m_y))


def search(cfg, hardware, chips: int, batch: int, seq: int, *, remat="full", strategies=None) -> dict:
    """The fastest strategy and mesh factorization that fits in HBM.

    Returns ``{"best": Estimate, "table": [Estimate, ...], "skipped": [(strategy, mesh, reason)],
    "x_opt": float}`` (``skipped``: plans the model cannot be split by, e.g. heads over a model
    axis that does not divide them); raises ValueError saying by how much the smallest
    footprint is over HBM when nothing fits.
    """
    names = strategies or ("dp", "fsdp", "tp", "fsdp_tp")
    table, skipped = [], []
    for name in names:
        s = _strategy.get(name)
        meshes = []
        if s.model and s.data:
            y = 1
            while y <= chips:
                if chips % y == 0 and y > 1 and chips // y > 1:
                    meshes.append({s.data[0]: chips // y, s.model: y})
                y *= 2
        elif s.model:
            meshes.append({s.model: chips})
        else:
            meshes.append({s.data[0]: chips})
        for mesh in meshes:
            try:
                table.append(estimate(cfg, s, mesh, hardware, batch, seq, remat=remat))
            except ValueError as err:
                skipped.append((s.name, mesh, str(err)))
    fitting = [e for e in table if e.fits]
    best = min(fitting, key=lambda e: e.step_seconds) if fitting else None
    if best is None and table:
        least = min(table, key=lambda e: e.memory_per_device)
        over = least.memory_per_device - hw_mod.get(hardware).hbm_capacity
        raise ValueError(f"[search] nothing fits: the smallest footprint ({least.strategy} on {least.mesh}) is "
                         f"{units.fmt_bytes(over)} over the HBM of {hardware}")
    return {"best": best, "table": table, "skipped": skipped, "x_opt": x_opt(batch * seq, cfg.ffw_dim, chips)}
