"""Ledger events priced at the preset's peaks: what ``Ledger.events[i]["seconds"]`` holds.

Collectives use the link-level model (:func:`collective_time`) on the V the event's per-device
bytes give; compute events the roofline :func:`compute_time`. The calibrated price of the same
events (what each chip reaches) is :func:`shardlab.cost.price_event`.

Example:
    >>> import shardlab as sl
    >>> mesh = sl.make_mesh((8,), ("x",), hardware="tpu-v5e", abstract=True)
    >>> ev = {"op": "psum", "axes": ("x",), "group_size": 8, "bytes_in": 1e6, "bytes_out": 1e6}
    >>> round(event_seconds(ev, mesh) * 1e6, 1)
    38.9
"""

from __future__ import annotations

from collections.abc import Mapping

from ..core import hardware as _hw
from . import formulas
from .collectives import COLLECTIVES as _COLLECTIVES
from .collectives import collective_time
from .compute import COMPUTE as _COMPUTE
from .compute import compute_time

__all__ = ["event_seconds", "event_cost"]


def _event_group_bytes(event: Mapping) -> float:
    return formulas.group_bytes(event["op"], int(event.get("group_size") or 1),
                                float(event.get("bytes_in") or 0), float(event.get("bytes_out") or 0))


def _mesh_parts(mesh):
    shape = dict(mesh.shape)
    return shape, _hw.get(getattr(mesh, "hardware", None)), getattr(mesh, "physical_axes", None)


def event_seconds(event: Mapping, mesh) -> float:
    """Estimated seconds of one ledger event on ``mesh.hardware``.

    Collectives use the link-level model (collective_time) on V derived from the event's
    per-device bytes; compute events use max(flops / peak, hbm_bytes / HBM bandwidth).

    Raises:
        ValueError: the mesh has no hardware, the op is unknown, or a field the estimate needs
            (bytes_in and bytes_out of a collective, flops of a compute event) is missing.
    """
    op = event.get("op")
    if not isinstance(op, str):
        raise ValueError(f"[event_seconds] the event's op is {op!r}; pass a ledger event (Ledger.to_dicts())")
    shape, hw, physical = _mesh_parts(mesh)
    if hw is None:
        raise ValueError(f"[{op}] the mesh has no hardware: make_mesh(..., hardware='tpu-v5e')")
    needed = ("flops",) if op in _COMPUTE else ("bytes_in", "bytes_out") if op in _COLLECTIVES else ()
    missing = [k for k in needed if event.get(k) is None]
    if missing:
        raise ValueError(f"[event_seconds] the {op!r} event has no {' or '.join(missing)}; pass a ledger event "
                         f"(Ledger.to_dicts()) or a dict with {', '.join(needed)}"
                         f"{' and axes, group_size' if op in _COLLECTIVES else ''}")
    if op in _COMPUTE:
        return compute_time(float(event.get("flops") or 0), float(event.get("hbm_bytes") or 0),
                            event.get("dtype") or "bfloat16", hw).seconds
    if op not in _COLLECTIVES:
        raise ValueError(f"[cost] unknown event op {op!r}: expected a collective ({', '.join(sorted(_COLLECTIVES))}) "
                         f"or a compute event ({', '.join(sorted(_COMPUTE))})")
    axes = tuple(event.get("axes") or ())
    if not axes:
        return 0.0
    return collective_time(op, _event_group_bytes(event), axes=axes, mesh_shape=shape, hardware=hw,
                           physical_axes=physical, perm=event.get("perm")).seconds


_EVENT_COST_CACHE: dict = {}


def event_cost(event, mesh) -> tuple:
    """(seconds, book_seconds, hops, bound) of a ledger Event on ``mesh.hardware``.

    ``seconds`` is the link-level model's (collectives) or the roofline's (compute events);
    ``book_seconds`` the book's closed form where it has one. Memoized per mesh and shape of
    the event, so pricing a long program costs one model evaluation per distinct event.
    """
    hw = mesh.hardware
    if not event.axes:
        t = compute_time(event.flops, event.hbm_bytes, event.dtype or "bfloat16", hw)
        return t.seconds, None, 0, t.bound
    perm = tuple(map(tuple, event.perm)) if event.perm else None
    key = (mesh.axis_names, mesh.axis_sizes, hw, repr(mesh.physical_axes), event.op, event.axes, event.group_size, event.bytes_in,
           event.bytes_out, perm)
    hit = _EVENT_COST_CACHE.get(key)
    if hit is None:
        shape, hw, physical = _mesh_parts(mesh)
        v = formulas.group_bytes(event.op, event.group_size, event.bytes_in, event.bytes_out)
        c = collective_time(event.op, v, axes=event.axes, mesh_shape=shape, hardware=hw,
                            physical_axes=physical, perm=list(perm) if perm else None)
        hit = (c.seconds, c.book_seconds, c.hops, c.bound)
        if len(_EVENT_COST_CACHE) > 100_000:
            _EVENT_COST_CACHE.clear()
        _EVENT_COST_CACHE[key] = hit
    return hit

