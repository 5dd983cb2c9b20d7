"""One function prices every ledger event on a chip with a price list: :func:`price_event`.

Compute events (matmul, einsum, attention, attention_vjp, elementwise, reduction) and
collectives go through the same function; the training estimate, the serving step model and
:func:`shardlab.cost.roofline`'s callers read their seconds from it. With :data:`IDEAL` it gives
the ledger's own peak-rate seconds.

Example:
    >>> from shardlab import cost
    >>> gemm = {"op": "matmul", "flops": 2 * 4096**3, "hbm_bytes": 3 * 2 * 4096**2, "dtype": "bfloat16"}
    >>> round(cost.price_event(gemm, "h100", "ideal") * 1e6, 1), round(cost.price_event(gemm, "h100") * 1e6, 1)
    (139.0, 220.5)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..core import hardware as _hw
from . import formulas
from .collectives import COLLECTIVES, collective_time
from .compute import COMPUTE, peak_flops
from .prices import PriceList, price_list

__all__ = ["price_event", "memory_seconds"]

_MEMORY_OPS = frozenset({"elementwise", "reduction", "numpy_fallback"})
_CACHE: dict = {}


def _get(event, name, default=None):
    if isinstance(event, Mapping):
        v = event.get(name, default)
    else:
        v = getattr(event, name, default)
    return default if v is None else v


def memory_seconds(nbytes: float, hardware, prices=None, *, kernels: int = 1) -> float:
    """Seconds to move ``nbytes`` of HBM in ``kernels`` memory-bound kernels: bytes over the
    reached bandwidth plus the fixed cost of each kernel.

    Example:
        >>> round(memory_seconds(1e9, "h100") * 1e6, 1)
        337.4
    """
    hw = _hw.get(hardware)
    p = price_list(hw) if prices is None else price_list(prices)
    return float(nbytes) / (p.hbm_efficiency * hw.hbm_bandwidth) + kernels * p.kernel_overhead


def price_event(event, hardware=None, prices=None, *, mesh=None) -> float:
    """Seconds of one ledger event on ``hardware`` priced with ``prices``.

    Args:
        event: a ledger event (``Ledger.events`` dict or Event) or a dict with ``op`` and the
            fields it needs: ``flops``, ``hbm_bytes``, ``dtype`` for compute; ``axes``,
            ``group_size``, ``bytes_in``, ``bytes_out`` for collectives.
        hardware: a preset name or Hardware (default: the mesh's).
        prices: a :class:`PriceList`, a preset name, ``"ideal"`` (the peaks), or None for the
            chip's own list (:func:`price_list`).
        mesh: the mesh a collective ran on (its axis sizes and physical links); compute events
            need none.

    Returns:
        * matmul / einsum: ``max(F / (e(dtype) · peak), B / (h · W_hbm)) + t_kernel``;
        * attention / attention_vjp: the same with FlashAttention's forward / backward fraction;
        * elementwise / reduction: ``B / (h · W_hbm) + t_kernel``;
        * a collective: ``max(latency, bandwidth / reached fraction(link)) + overhead`` plus the
          list's ``step_overhead`` per ring step on a link that has one (``PriceList.steps``).

    Raises:
        ValueError: an unknown op, no hardware, or a collective without its mesh.
    """
    op = _get(event, "op")
    if not isinstance(op, str):
        raise ValueError(f"[price_event] the event's op is {op!r}; pass a ledger event (Ledger.events)")
    if hardware is None and mesh is not None:
        hardware = getattr(mesh, "hardware", None)
    hw = _hw.get(hardware)
    if hw is None:
        raise ValueError(f"[price_event] no hardware for the {op!r} event: pass hardware='h100' (or another preset) "
                         f"or a mesh made with hardware=...")
    p = price_list(hw) if prices is None else price_list(prices)
    if op in COMPUTE or op in _MEMORY_OPS:
        nbytes = float(_get(event, "hbm_bytes", 0.0))
        t_mem = nbytes / (p.hbm_efficiency * hw.hbm_bandwidth)
        if op in _MEMORY_OPS:
            return t_mem + p.kernel_overhead
        dtype = _get(event, "dtype", "bfloat16")
        peak = peak_flops(hw, dtype)[0]
        if op == "attention":
            eff = p.attention_efficiency[0]
        elif op == "attention_vjp":
            eff = p.attention_efficiency[1]
        else:
            eff = p.matmul(dtype)
        return max(float(_get(event, "flops", 0.0)) / (eff * peak), t_mem) + p.kernel_overhead
    if op not in COLLECTIVES:
        raise ValueError(f"[price_event] unknown event op {op!r}: expected a collective ({', '.join(sorted(COLLECTIVES))}) "
                         f"or a compute event ({', '.join(sorted(COMPUTE | _MEMORY_OPS))})")
    axes = tuple(_get(event, "axes", ()))
    if not axes:
        return 0.0
    if mesh is None:
        raise ValueError(f"[price_event] the {op!r} collective over {axes} needs the mesh it ran on: price_event(..., mesh=mesh)")
    return _collective_seconds(event, op, axes, mesh, hw, p)


def _collective_seconds(event, op, axes, mesh, hw, p: PriceList) -> float:
    perm = _get(event, "perm")
    perm = tuple(map(tuple, perm)) if perm else None
    n, b_in, b_out = int(_get(event, "group_size", 1)), float(_get(event, "bytes_in", 0.0)), float(_get(event, "bytes_out", 0.0))
    shape = dict(mesh.shape)
    physical = getattr(mesh, "physical_axes", None)
    key = (tuple(shape.items()), repr(physical), hw, p, op, axes, n, b_in, b_out, perm)
    hit = _CACHE.get(key)
    if hit is None:
        v = formulas.group_bytes(op, n, b_in, b_out)
        c = collective_time(op, v, axes=axes, mesh_shape=shape, hardware=hw, physical_axes=physical,
                            perm=list(perm) if perm else None)
        slice_bw = _slice_dcn_bandwidth(hw, p, shape, physical) if any(l.link == "dcn" for l in c.links) else None
        if slice_bw is not None and slice_bw < hw.dcn_bandwidth:
            # the slice's chips share what it reaches over the DCN (PriceList.dcn_slice_bandwidth)
            c = collective_time(op, v, axes=axes, mesh_shape=shape, hardware=hw.replace(dcn_bandwidth=slice_bw),
                                physical_axes=physical, perm=list(perm) if perm else None)
        eff = min((p.collective(link.link) for link in c.links), default=1.0)
        t_bw = c.bandwidth_seconds / eff
        hit = max(c.latency_seconds, t_bw) + p.collective_overhead + p.steps(op, c.links)
        if len(_CACHE) > 100_000:
            _CACHE.clear()
        _CACHE[key] = hit
    return hit


def _slice_dcn_bandwidth(hw, p: PriceList, shape: dict, physical) -> float | None:
    """The DCN bytes per second one chip gets when its slice's share is the list's
    ``dcn_slice_bandwidth`` over the slice's chips (the mesh's devices over its DCN axes); None
    without one."""
    if not p.dcn_slice_bandwidth:
        return None
    links = _hw.resolve_physical_axes(hw, tuple(shape), shape, physical)
    per_slice = math.prod(n for a, n in shape.items() if links[a] != "dcn")
    return p.dcn_slice_bandwidth / per_slice
