"""A per-device clock that times a schedule while honouring its data dependencies.

Model. Each device has one compute stream that runs its compute actions (forward, backward,
input / weight gradient) back to back in the schedule's order. A send runs on the link from its
device to the neighbour, starting when the compute that made the data has finished and the link
is free (sends on one link go one at a time); it does not hold up the compute stream. A receive
blocks the compute stream until the matching send has finished, as a blocking receive does.
So a forward of microbatch i on stage s starts after the forward of i on stage s - 1 plus the
send time, a backward after the backward of the next stage plus the send time, and everything
after the previous action of the same device.

An overlapped pair (``Schedule.overlapped``, DualPipe's F&B) is one block on the compute stream:
it starts when the device is free and both members' inputs have arrived, lasts
``F + B - overlap * min(F, B)`` (``Durations.overlap``; 1 is the max-based ideal ``max(F, B)``)
and both members' results are ready at its end. Both members are drawn over the whole block.

Why not SimPy: the schedule already fixes each device's order, so the only waiting is a receive
on its send. One pass that advances every device until it reaches a receive whose send is not
clocked yet, and resumes it when that send is clocked, gives the exact times with each action
visited once (O(actions)); an event-queue simulator would add processes and a heap for the
same answer. A device that can never resume is a deadlock, reported with the receives waited on.

Measured quantities (see :class:`Timeline`): the step time (the last compute or send to finish),
the bubble fraction = idle compute time / total device time = ``1 - sum(busy) / (p * step)``
(the survey's second way of computing the bubble ratio: the empty area of the timeline over its
whole area), and each device's peak count of live microbatch activations (a forward's
activations are held until its whole backward, or its weight gradient, finishes).

Example:
    >>> from shardlab.train import pipeline as pp
    >>> t = pp.clock(pp.one_f_one_b(4, 8), pp.Durations(forward=1, backward=2))
    >>> t.step_time, round(t.bubble_fraction, 4), t.peak_activations
    (33.0, 0.2727, (4, 3, 2, 1))
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from . import timeline as _timeline
from .durations import Durations
from .schedule import ACTIVATION, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, RECV, SEND, Action, Schedule
from .validate import ScheduleError, validate

__all__ = ["ClockedAction", "Timeline", "clock", "bubble_formula"]


class ClockedAction(NamedTuple):
    """One clocked action: it runs on ``action.stage`` from ``start`` to ``end``."""

    action: Action
    start: float
    end: float


def bubble_formula(p: int, m: int, v: int = 1) -> float:
    """The survey's bubble ratio: (p - 1) / (m + p - 1) for GPipe and 1F1B, (p - 1) / (v m + p - 1)
    for interleaved 1F1B with v chunks per device (uniform stages, free communication).

    Example:
        >>> round(bubble_formula(4, 8), 4), round(bubble_formula(4, 8, 2), 4)
        (0.2727, 0.1579)
    """
    return (p - 1) / (v * m + p - 1)


class Timeline:
    """A clocked schedule: every action's start and end, and what follows from them.

    Attributes:
        schedule: the :class:`Schedule`; durations: the per-virtual-stage times used (a dict).
        events: ``events[s]`` lists device s's :class:`ClockedAction` s in the order they ran.
        step_time: when the last action finishes (the step starts at 0).
        busy: per device, the total compute time.
        peak_activations: per device, the most microbatch activations (one per microbatch and
            chunk) alive at once.
    """

    def __init__(self, schedule: Schedule, durations: dict, starts, ends, busy, peak, source: str = "given"):
        self.schedule = schedule
        self.durations = durations
        self.source = source
        # per device, the start and end of each of its actions, in its list's order (the order they ran)
        self._starts, self._ends = starts, ends
        self._events = None
        self.step_time = max((max(e) for e in ends if e), default=0.0)
        self.busy = tuple(busy)
        self.peak_activations = tuple(peak)

    def _raw(self, stage: int):
        return zip(self.schedule.actions[stage], self._starts[stage], self._ends[stage])

    @property
    def events(self) -> tuple[tuple[ClockedAction, ...], ...]:
        if self._events is None:
            self._events = tuple(tuple(ClockedAction(*e) for e in self._raw(s)) for s in range(self.schedule.p))
        return self._events

    @property
    def p(self) -> int:
        return self.schedule.p

    @property
    def idle_time(self) -> float:
        """Total compute-idle time summed over devices: p * step_time - sum(busy)."""
        return self.p * self.step_time - sum(self.busy)

    @property
    def bubble_fraction(self) -> float:
        """Idle time / total device time (p * step_time)."""
        if self.step_time == 0:
            return 0.0
        return 1.0 - sum(self.busy) / (self.p * self.step_time)

    def compute_events(self, stage: int) -> list[ClockedAction]:
        """Device ``stage``'s forward / backward / weight-gradient events, in order."""
        return [ClockedAction(*e) for e in self._raw(stage) if e[0].payload is None]

    def send_events(self, stage: int) -> list[ClockedAction]:
        """Device ``stage``'s sends (each occupies a link, not the compute stream)."""
        return [ClockedAction(*e) for e in self._raw(stage) if e[0].kind == SEND]

    def idle_intervals(self, stage: int) -> list[tuple[float, float]]:
        """The gaps in device ``stage``'s compute stream between 0 and step_time."""
        out, t = [], 0.0
        for e in self.compute_events(stage):
            if e.start > t:
                out.append((t, e.start))
            t = max(t, e.end)
        if t < self.step_time:
            out.append((t, self.step_time))
        return out

    def summary(self) -> str:
        s = self.schedule
        return (f"{s.name}: p={s.p} m={s.m} v={s.v}  step {self.step_time:.6g}  bubble "
                f"{self.bubble_fraction:.4f}  peak activations per stage {list(self.peak_activations)}")

    def __repr__(self) -> str:
        return f"Timeline({self.summary()})"

    def to_svg(self, **kwargs) -> str:
        """The timeline as an SVG string (see :func:`shardlab.train.pipeline.timeline.to_svg`)."""
        return _timeline.to_svg(self, **kwargs)

    def _repr_html_(self) -> str:
        return _timeline.to_html(self)

    def plot(self, ax=None, **kwargs):
        """A matplotlib figure of the timeline (see :func:`shardlab.train.pipeline.timeline.plot`)."""
        return _timeline.plot(self, ax=ax, **kwargs)


def clock(schedule: Schedule, durations: Durations | None = None, *, check: bool = True) -> Timeline:
    """Times ``schedule`` with ``durations`` (default: forward 1, backward 2, weight 1, free sends).

    Args:
        schedule: the schedule to time.
        durations: a :class:`Durations` (given times or :meth:`Durations.from_cost`).
        check: validate the schedule first (skip only for schedules already validated).

    Raises:
        ScheduleError: the schedule is invalid, or deadlocks (the message names the receives
            each stuck device waits on).

    Example:
        >>> from shardlab.train import pipeline as pp
        >>> pp.clock(pp.gpipe(3, 4, forward_only=True), pp.Durations(forward=[1, 3, 2])).step_time
        15.0
    """
    if check:
        validate(schedule)
    durations = durations if durations is not None else Durations()
    n, p, m = schedule.num_virtual_stages, schedule.p, schedule.m
    d = durations.resolve(n)
    # per (device, chunk): the virtual stage; per virtual stage: its device
    vs_of = [[schedule.virtual_stage(s, c) for c in range(schedule.v)] for s in range(p)]
    dev_of = [schedule.placement(k)[0] for k in range(n)]
    compute_time = {k: d[k] for k in (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)}
    overlap = d["overlap"]
    pair_of = [dict(x) for x in schedule.overlapped] if schedule.overlapped else [{} for _ in range(p)]
    pair_block: dict = {}                   # (device, index of a pair's backward) -> (start, end)
    send_act, send_grad = d["send"], d["grad_send"]
    # data is keyed by one int: ((producing virtual stage) * m + microbatch) * 2 + (1 for a gradient)
    produced: list = [None] * (2 * n * m)   # -> end of the compute that produced it
    arrived: list = [None] * (2 * n * m)    # -> end of its send
    waiting: dict = {}                      # key -> the device blocked on it
    link_free: dict = {}                    # src * p + dst -> when the link is next free
    t_dev, busy, live, peak, ptr = [0.0] * p, [0.0] * p, [0] * p, [0] * p, [0] * p
    starts: list[list[float]] = [[] for _ in range(p)]
    ends: list[list[float]] = [[] for _ in range(p)]
    ready = deque(range(p))
    while ready:
        s = ready.popleft()
        acts, i, t, vss = schedule.actions[s], ptr[s], t_dev[s], vs_of[s]
        st, en = starts[s].append, ends[s].append
        b, lv, pk = busy[s], live[s], peak[s]
        n_acts = len(acts)
        while i < n_acts:
            kind, _, mb, chunk, payload = acts[i]
            vs = vss[chunk]
            if kind == RECV:
                key = ((vs - 1) * m + mb) * 2 if payload == ACTIVATION else ((vs + 1) * m + mb) * 2 + 1
                end = arrived[key]
                if end is None:
                    waiting[key] = s
                    break
                if end < t:
                    end = t
                st(t)
                en(end)
                t = end
            elif kind == SEND:
                if payload == ACTIVATION:
                    key, dst, dt = (vs * m + mb) * 2, dev_of[vs + 1], send_act[vs]
                else:
                    key, dst, dt = (vs * m + mb) * 2 + 1, dev_of[vs - 1], send_grad[vs]
                start = produced[key]
                link = s * p + dst
                free = link_free.get(link, 0.0)
                if free > start:
                    start = free
                end = start + dt
                link_free[link] = arrived[key] = end
                st(start)
                en(end)
                w = waiting.pop(key, None)
                if w is not None:
                    ready.append(w)
            else:
                dt = compute_time[kind][vs]
                j = pair_of[s].get(i) if pair_of[s] else None
                if j is not None:            # the forward of an overlapped pair: wait for the backward's input too
                    bk, _, bmb, bchunk, _ = acts[j]
                    bvs = vss[bchunk]
                    ready_at = 0.0
                    if bvs < n - 1:
                        key = ((bvs + 1) * m + bmb) * 2 + 1
                        ready_at = arrived[key] if dev_of[bvs + 1] != s else produced[key]
                        if ready_at is None:
                            waiting[key] = s
                            break
                    if ready_at > t:
                        t = ready_at
                    db = compute_time[bk][bvs]
                    dt = dt + db - overlap * min(dt, db)
                    pair_block[(s, j)] = (t, t + dt)
                    end = t + dt
                    st(t)
                    b += dt
                    t = end
                elif (s, i) in pair_block:   # the backward of a pair: drawn over the pair's block
                    start, end = pair_block.pop((s, i))
                    st(start)
                else:
                    end = t + dt
                    st(t)
                    b += dt
                    t = end
                en(end)
                if kind == FORWARD:
                    produced[(vs * m + mb) * 2] = end
                    lv += 1
                    if lv > pk:
                        pk = lv
                elif kind == BACKWARD_WEIGHT:
                    lv -= 1
                else:
                    produced[(vs * m + mb) * 2 + 1] = end
                    if kind == BACKWARD:
                        lv -= 1
            i += 1
        ptr[s], t_dev[s], busy[s], live[s], peak[s] = i, t, b, lv, pk
    stuck = [s for s in range(p) if ptr[s] < len(schedule.actions[s])]
    if stuck:
        parts = "; ".join(f"stage {s} waits at '{schedule.actions[s][ptr[s]]}'" for s in stuck)
        raise ScheduleError(f"{schedule.name}: deadlock, no device can proceed: {parts}. Reorder the receives so "
                            f"each is preceded on the sender by its send", schedule.actions[stuck[0]][ptr[stuck[0]]],
                            op="pipeline.clock")
    return Timeline(schedule, d, starts, ends, busy, peak, durations.source)
