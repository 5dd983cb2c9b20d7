"""How long each action takes: given times, or times from the cost model on a hardware preset.

All times are per *virtual stage* (one model chunk): ``forward[k]``, ``backward[k]`` (the whole
backward, input plus weight gradient), ``weight[k]`` (the weight-gradient part; a split
schedule's input-gradient step takes ``backward - weight``), and ``send[k]`` / ``grad_send[k]``,
the time to move virtual stage k's output activation to stage k + 1 / its input gradient to
stage k - 1. A scalar applies to every virtual stage.

:meth:`Durations.from_cost` prices compute with the roofline of :mod:`shardlab.cost` (FLOPs over
the preset's peak, HBM bytes over its bandwidth, whichever is slower) and the sends as a
one-hop ``ppermute`` over the pipeline axis with :func:`shardlab.cost.collective_time`, so ICI,
NVLink, InfiniBand or DCN links are priced as the rest of shardlab prices them.

Example:
    >>> from shardlab.train import pipeline as pp
    >>> d = pp.Durations(forward=[1, 2], backward=4)
    >>> d.resolve(2)["forward"], d.resolve(2)["backward_input"]
    ((1.0, 2.0), (2.0, 2.0))
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from shardlab import cost as _cost
from shardlab import hardware as _hardware

__all__ = ["Durations"]


def _per_stage(op: str, name: str, value, n: int) -> tuple[float, ...]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        vals = (float(value),) * n
    elif isinstance(value, Sequence) or hasattr(value, "__len__"):
        vals = tuple(float(x) for x in value)
        if len(vals) != n:
            raise ValueError(f"[{op}] {name} has {len(vals)} entries but the schedule has {n} virtual stages "
                             f"(p * v); give one time per virtual stage or a single number")
    else:
        raise TypeError(f"[{op}] {name} must be a number or a sequence of numbers, got {type(value).__name__}")
    for x in vals:
        if not (x >= 0 and math.isfinite(x)):
            raise ValueError(f"[{op}] {name} contains {x}; times must be finite and >= 0")
    return vals


class Durations:
    """Per-action times for :func:`~shardlab.train.pipeline.clock.clock`.

    Args:
        forward: forward time of one microbatch on one virtual stage (number or one per stage).
        backward: whole-backward time (input + weight gradient). Default ``2 * forward``.
        weight: the weight-gradient part of ``backward``. Default ``backward / 2``.
        send: time to send an activation to the next virtual stage (default 0).
        grad_send: time to send a gradient to the previous one (default: ``send``).
        overlap: for schedules with overlapped forward & backward pairs (DualPipeV), the part
            of the shorter member hidden under the longer: a pair lasts
            ``F + B - overlap * min(F, B)``; 0 (default) runs them back to back, 1 is ``max(F, B)``.
        source: a note on where the numbers come from (shown in summaries).
    """

    def __init__(self, forward=1.0, backward=None, weight=None, send=0.0, grad_send=None, *, overlap: float = 0.0,
                 source: str = "given"):
        if not (isinstance(overlap, (int, float)) and 0.0 <= overlap <= 1.0):
            raise ValueError(f"[pipeline.Durations] overlap={overlap!r} must be a number in [0, 1] (the part of "
                             f"the shorter of an overlapped forward & backward hidden under the longer)")
        self.overlap = float(overlap)
        self.forward = forward
        self.backward = backward
        self.weight = weight
        self.send = send
        self.grad_send = grad_send
        self.source = source

    def resolve(self, n: int) -> dict[str, tuple[float, ...]]:
        """Per-virtual-stage tuples for ``n`` virtual stages: forward, backward, backward_input,
        backward_weight, send, grad_send (and overlap, one number)."""
        op = "pipeline.Durations"
        f = _per_stage(op, "forward", self.forward, n)
        b = tuple(2 * x for x in f) if self.backward is None else _per_stage(op, "backward", self.backward, n)
        w = tuple(x / 2 for x in b) if self.weight is None else _per_stage(op, "weight", self.weight, n)
        for k, (bk, wk) in enumerate(zip(b, w)):
            if wk > bk:
                raise ValueError(f"[{op}] weight {wk} of virtual stage {k} exceeds its whole backward {bk}; the "
                                 f"weight gradient is a part of the backward")
        s = _per_stage(op, "send", self.send, n)
        g = s if self.grad_send is None else _per_stage(op, "grad_send", self.grad_send, n)
        return {"forward": f, "backward": b, "backward_input": tuple(bk - wk for bk, wk in zip(b, w)),
                "backward_weight": w, "send": s, "grad_send": g, "overlap": self.overlap}

    def __repr__(self) -> str:
        return (f"Durations(forward={self.forward!r}, backward={self.backward!r}, weight={self.weight!r}, "
                f"send={self.send!r}, grad_send={self.grad_send!r}, overlap={self.overlap!r}, source={self.source!r})")

    @classmethod
    def from_cost(cls, *, forward_flops, activation_bytes: float, p: int, hardware=None, mesh=None,
                  axis: str = "stage", hbm_bytes=0.0, dtype="bfloat16", link=None) -> "Durations":
        """Times from FLOPs and bytes on a hardware preset.

        Compute: ``max(FLOPs / peak(dtype), hbm_bytes / HBM bandwidth)`` per virtual stage; the
        backward does twice the forward's FLOPs (one matmul for dL/dx, one for dL/dW), half of
        them in the weight gradient. Sends: ``activation_bytes`` moved one hop over ``axis`` by
        :func:`shardlab.cost.collective_time` ("ppermute"); gradients have the activation's size.

        Args:
            forward_flops: forward FLOPs of one microbatch per virtual stage (number or sequence).
            activation_bytes: bytes of the activation passed between neighbouring stages.
            p: pipeline devices (the size of ``axis``).
            hardware / mesh: a preset name (or Hardware), or a mesh carrying one; with a mesh the
                pipeline axis must be one of its axes.
            axis: the pipeline axis name (default "stage").
            hbm_bytes: HBM bytes one virtual stage reads and writes per microbatch (weights,
                activations); 0 prices compute by FLOPs alone.
            dtype: the matmul dtype whose peak is used.
            link: force the pipeline axis onto a link ("dcn", "ib", "nvlink", or a torus axis).

        Example:
            >>> d = Durations.from_cost(forward_flops=2 * 8 * 4096 * 4096 * 4, activation_bytes=8 * 4096 * 2,
            ...                         p=4, hardware="h100")
            >>> round(d.resolve(4)["forward"][0] * 1e6, 3), round(d.resolve(4)["send"][0] * 1e6, 3)   # latency-bound send
            (1.086, 1.0)
        """
        op = "pipeline.Durations.from_cost"
        if mesh is not None:
            shape = dict(mesh.shape)
            if axis not in shape:
                raise ValueError(f"[{op}] the mesh has no pipeline axis {axis!r} (axes {tuple(shape)}); name the "
                                 f"pipeline axis with axis=... or build the mesh with a {axis!r} axis")
            if shape[axis] != p:
                raise ValueError(f"[{op}] the mesh's {axis!r} axis has {shape[axis]} devices but p={p}")
            hardware = hardware if hardware is not None else getattr(mesh, "hardware", None)
            physical = getattr(mesh, "physical_axes", None)
        else:
            shape, physical = {axis: p}, None
        hw = _hardware.get(hardware)
        if hw is None:
            raise ValueError(f"[{op}] no hardware: pass hardware='h100' (or another preset: "
                             f"{', '.join(_hardware.names())}) or a mesh that carries one")
        if link is not None:
            physical = {**dict(physical or {}), axis: link}
        n = len(forward_flops) if isinstance(forward_flops, Sequence) else None
        flops = _per_stage(op, "forward_flops", forward_flops, n or 1)
        hbm = _per_stage(op, "hbm_bytes", hbm_bytes, len(flops))
        fwd = tuple(_cost.compute_time(fl, hb, dtype, hw).seconds for fl, hb in zip(flops, hbm))
        bwd = tuple(_cost.compute_time(2 * fl, 2 * hb, dtype, hw).seconds for fl, hb in zip(flops, hbm))
        if p > 1:
            perm = [(i, i + 1) for i in range(p - 1)]
            send = _cost.collective_time("ppermute", float(activation_bytes), axes=axis, mesh_shape=shape,
                                         hardware=hw, physical_axes=physical, perm=perm).seconds
        else:
            send = 0.0
        pick = (lambda t: t[0]) if n is None else (lambda t: t)
        link_name = _hardware.axis_links(hw, shape, (axis,), physical)[0].link
        return cls(forward=pick(fwd), backward=pick(bwd), weight=pick(tuple(x / 2 for x in bwd)), send=send,
                   source=f"cost model: {hw.name} {dtype} roofline, sends over {link_name}")
