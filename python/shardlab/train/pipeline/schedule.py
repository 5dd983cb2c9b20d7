"""A pipeline schedule as data: per stage (device) the ordered list of actions it performs.

A pipeline splits a model into ``p * v`` *virtual stages* (chunks of consecutive layers) placed on
``p`` devices, ``v`` chunks per device, and a batch into ``m`` microbatches. An :class:`Action`
names one thing one device does: the forward of microbatch ``mb`` on its chunk ``c``, the backward
(whole, or split into the input gradient and the weight gradient, as zero-bubble schedules do), or
the send / receive of an activation or a gradient to / from the neighbouring virtual stage.

A :class:`Schedule` is the ``p`` ordered action lists plus ``p``, ``m``, ``v`` and the placement of
virtual stages on devices: ``"loop"`` (Megatron's interleaving: device ``d`` holds virtual stages
``d, d + p, d + 2p, ...``) or ``"v"`` (ZB-V / DualPipeV: device ``d`` holds stages ``d`` and
``2p - 1 - d``). Nothing here runs or times anything; :mod:`.validate` checks a schedule,
:mod:`.clock` times it, and :mod:`.execute` runs the same lists on real data.

Example:
    >>> from shardlab.train import pipeline as pp
    >>> s = pp.one_f_one_b(2, 2)
    >>> [str(a) for a in s.actions[1]]
    ['recv act mb0 s1', 'F mb0 s1', 'B mb0 s1', 'send grad mb0 s1', 'recv act mb1 s1', 'F mb1 s1', 'B mb1 s1', 'send grad mb1 s1']
    >>> s.virtual_stage(1, 0), s.num_virtual_stages
    (1, 2)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

from shardlab.viz import Displayed
from shardlab.viz.pipeline_schedule import pipeline_schedule

__all__ = [
    "FORWARD", "BACKWARD", "BACKWARD_INPUT", "BACKWARD_WEIGHT", "SEND", "RECV", "KINDS", "COMPUTE_KINDS",
    "ACTIVATION", "GRADIENT", "LAYOUTS",
    "Action", "Schedule", "stage_layers",
]

FORWARD = "forward"
BACKWARD = "backward"                # the whole backward: input gradient and weight gradient together
BACKWARD_INPUT = "backward_input"    # dL/dx only (zero-bubble "B")
BACKWARD_WEIGHT = "backward_weight"  # dL/dW only (zero-bubble "W")
SEND = "send"
RECV = "recv"
KINDS = (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, SEND, RECV)
COMPUTE_KINDS = (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)

ACTIVATION = "activation"  # what a forward sends to the next virtual stage
GRADIENT = "gradient"      # what a backward (input part) sends to the previous virtual stage
LAYOUTS = ("loop", "v")

_SHORT = {FORWARD: "F", BACKWARD: "B", BACKWARD_INPUT: "I", BACKWARD_WEIGHT: "W"}


class Action(NamedTuple):
    """One step of one device.

    Attributes:
        kind: one of :data:`KINDS`.
        stage: the device (pipeline rank) that performs it, ``0 <= stage < p``.
        microbatch: ``0 <= microbatch < m``.
        chunk: the model chunk on that device, ``0 <= chunk < v`` (0 without interleaving).
        payload: for send / recv, :data:`ACTIVATION` or :data:`GRADIENT`; ``None`` for compute.
            A send names the chunk that produced the data, a recv the chunk that consumes it.

    Example:
        >>> str(Action("backward_weight", 2, 5, 1))
        'W mb5 s2 c1'
        >>> str(Action("send", 0, 3, 0, "activation"))
        'send act mb3 s0'
    """

    kind: str
    stage: int
    microbatch: int
    chunk: int = 0
    payload: str | None = None

    def __str__(self) -> str:
        c = f" c{self.chunk}" if self.chunk else ""
        if self.kind in _SHORT:
            return f"{_SHORT[self.kind]} mb{self.microbatch} s{self.stage}{c}"
        what = "act" if self.payload == ACTIVATION else "grad"
        return f"{self.kind} {what} mb{self.microbatch} s{self.stage}{c}"

    @property
    def short(self) -> str:
        """A block label: ``F3``, ``B3``, ``W3``, ``I3`` (``F3.1`` for chunk 1)."""
        c = f".{self.chunk}" if self.chunk else ""
        return f"{_SHORT.get(self.kind, self.kind[0])}{self.microbatch}{c}"


def stage_layers(num_layers: int, num_stages: int) -> tuple[range, ...]:
    """Splits ``num_layers`` consecutive layers into ``num_stages`` contiguous, near-equal chunks.

    Raises:
        ValueError: more stages than layers (a stage would hold no layer).

    Example:
        >>> stage_layers(10, 4)
        (range(0, 3), range(3, 6), range(6, 8), range(8, 10))
    """
    if num_layers < 1 or num_stages < 1:
        raise ValueError(f"[pipeline] num_layers {num_layers} and stages {num_stages} must both be >= 1")
    if num_stages > num_layers:
        raise ValueError(f"[pipeline] {num_stages} pipeline stages (p * v) for {num_layers} layers: a stage would "
                         f"hold no layer; use at most {num_layers} stages or fewer chunks per device")
    base, extra = divmod(num_layers, num_stages)
    out, start = [], 0
    for i in range(num_stages):
        n = base + (i < extra)
        out.append(range(start, start + n))
        start += n
    return tuple(out)


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule(Displayed):
    """The ordered actions of every device of a pipeline.

    Displays itself (Jupyter, ``rich.print``) as one row of coloured blocks per device in the
    order it runs them (``shardlab.viz.pipeline_schedule``); ``print`` gives the same as text.

    Attributes:
        name: the schedule's name ("gpipe", "1f1b", ...).
        p: devices (pipeline ranks); m: microbatches; v: model chunks per device.
        actions: ``actions[s]`` is the ordered tuple of :class:`Action` of device ``s``.
        layout: "loop" or "v" (see the module docstring).
        layers: when built with ``num_layers``, the layer range of every virtual stage.
        overlapped: per device, pairs ``(i, j)`` of indices into ``actions[s]``: a forward ``i``
            and a backward (whole or input part) ``j > i`` of other microbatches that run as one
            overlapped block (DualPipe's "F&B"; see :func:`~shardlab.train.pipeline.dualpipe_v`).
            Only sends and receives may sit between the two. ``()`` for none.
    """

    name: str
    p: int
    m: int
    v: int
    actions: tuple[tuple[Action, ...], ...]
    layout: str = "loop"
    layers: tuple[range, ...] | None = None
    overlapped: tuple = ()

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"[pipeline] layout {self.layout!r} is not one of {LAYOUTS}")
        if self.layout == "v" and self.v != 2:
            raise ValueError(f"[pipeline] the 'v' layout places 2 chunks per device, got v={self.v}")
        if len(self.actions) != self.p:
            raise ValueError(f"[pipeline] {len(self.actions)} action lists for p={self.p} stages")
        if self.overlapped:
            self._check_overlapped()

    def _check_overlapped(self) -> None:
        if len(self.overlapped) != self.p:
            raise ValueError(f"[pipeline] {len(self.overlapped)} lists of overlapped pairs for p={self.p} stages")
        for s, pairs in enumerate(self.overlapped):
            acts, seen = self.actions[s], set()
            for i, j in pairs:
                if not (0 <= i < j < len(acts)) or acts[i].kind != FORWARD or \
                        acts[j].kind not in (BACKWARD, BACKWARD_INPUT):
                    raise ValueError(f"[pipeline] stage {s}: overlapped pair ({i}, {j}) must name a forward and a "
                                     f"later backward of stage {s}'s list of {len(acts)} actions")
                if any(acts[k].kind in _SHORT for k in range(i + 1, j)):
                    raise ValueError(f"[pipeline] stage {s}: a compute action sits inside the overlapped pair "
                                     f"'{acts[i]}' & '{acts[j]}'; only sends and receives may")
                if i in seen or j in seen:
                    raise ValueError(f"[pipeline] stage {s}: '{acts[i]}' or '{acts[j]}' is in two overlapped pairs")
                seen.update((i, j))

    @property
    def num_virtual_stages(self) -> int:
        """p * v: how many chunks the model is cut into."""
        return self.p * self.v

    def virtual_stage(self, stage: int, chunk: int) -> int:
        """The position in the model (0 = first layers) of ``chunk`` on device ``stage``."""
        if self.layout == "v" and chunk == 1:
            return 2 * self.p - 1 - stage
        return chunk * self.p + stage

    def placement(self, virtual_stage: int) -> tuple[int, int]:
        """(stage, chunk) holding ``virtual_stage``: the inverse of :meth:`virtual_stage`."""
        if self.layout == "v" and virtual_stage >= self.p:
            return 2 * self.p - 1 - virtual_stage, 1
        return virtual_stage % self.p, virtual_stage // self.p

    def compute(self, stage: int) -> list[Action]:
        """The compute actions (forward / backward parts) of device ``stage``, in order."""
        return [a for a in self.actions[stage] if a.kind in _SHORT]

    @property
    def num_actions(self) -> int:
        return sum(len(a) for a in self.actions)

    def __str__(self) -> str:
        """One line per device listing its compute blocks (F0 F1 B0 ...)."""
        return "\n".join(f"stage {s}: " + " ".join(a.short for a in self.compute(s)) for s in range(self.p))

    def __repr__(self) -> str:
        return f"Schedule({self.name!r}, p={self.p}, m={self.m}, v={self.v}, {self.num_actions} actions)"

    def view(self):
        """The display: a ``shardlab.viz.View`` (``.save("schedule.svg")`` and friends)."""
        return pipeline_schedule(self)


def check_sizes(op: str, p: int, m: int, v: int = 1, *, num_layers: int | None = None) -> tuple[range, ...] | None:
    """Checks p, m, v (positive integers) and splits ``num_layers`` over p * v stages if given."""
    for name, val in (("p", p), ("m", m), ("v", v)):
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ValueError(f"[{op}] {name}={val!r} must be an integer >= 1")
    if num_layers is None:
        return None
    return stage_layers(num_layers, p * v)


def with_comms(sched_name: str, p: int, m: int, v: int, compute: Sequence[Sequence[Action]], *,
               layout: str = "loop", layers=None, pairs=None) -> Schedule:
    """Builds a :class:`Schedule` from per-device compute orders, inserting sends and receives.

    A receive goes right before the compute that consumes the data (it blocks, as a real receive
    does); a send right after the compute that produced it. Neighbouring virtual stages on the
    same device (the turn of a V) exchange nothing. ``pairs`` (per device, pairs of indices into
    its compute order) become the schedule's ``overlapped`` pairs.
    """
    probe = Schedule(sched_name, p, m, v, tuple(() for _ in range(p)), layout)
    last = p * v - 1
    vs_of = [[probe.virtual_stage(s, c) for c in range(v)] for s in range(p)]
    dev_of = [probe.placement(k)[0] for k in range(p * v)]
    new = tuple.__new__   # Action(...) without the keyword-argument handling: ~2x faster for big schedules
    out, overlapped = [], []
    for s, acts in enumerate(compute):
        lst: list[Action] = []
        append = lst.append
        vss = vs_of[s]
        at = []                          # compute index -> index in the action list
        for a in acts:
            kind, _, mb, chunk, _ = a
            vs = vss[chunk]
            fwd = kind == FORWARD
            bwd = kind == BACKWARD or kind == BACKWARD_INPUT
            if fwd and vs > 0 and dev_of[vs - 1] != s:
                append(new(Action, (RECV, s, mb, chunk, ACTIVATION)))
            elif bwd and vs < last and dev_of[vs + 1] != s:
                append(new(Action, (RECV, s, mb, chunk, GRADIENT)))
            at.append(len(lst))
            append(a)
            if fwd and vs < last and dev_of[vs + 1] != s:
                append(new(Action, (SEND, s, mb, chunk, ACTIVATION)))
            elif bwd and vs > 0 and dev_of[vs - 1] != s:
                append(new(Action, (SEND, s, mb, chunk, GRADIENT)))
        out.append(tuple(lst))
        if pairs is not None:
            overlapped.append(tuple((at[i], at[j]) for i, j in pairs[s]))
    return Schedule(sched_name, p, m, v, tuple(out), layout, layers, tuple(overlapped))
