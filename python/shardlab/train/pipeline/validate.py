"""Rejects schedules that cannot run, naming the offending action.

Checked: every action is well formed (kind, stage, microbatch, chunk, payload); every forward
and backward part runs exactly once; a backward comes after its forward on the same device and a
weight gradient after its input gradient; a forward has its input (a receive placed before it,
or the previous virtual stage earlier on the same device) and a backward its output gradient;
every receive has a matching send on the neighbouring device, placed after the compute that
produces the data, and every send a receive. Deadlocks that only timing can reveal (two devices
each waiting for the other) are reported by :func:`~shardlab.train.pipeline.clock.clock`.

Example:
    >>> from shardlab.train import pipeline as pp
    >>> s = pp.one_f_one_b(2, 2)
    >>> bad = pp.Schedule("bad", 2, 2, 1, (s.actions[0], s.actions[1][1:]))   # drop stage 1's first recv
    >>> pp.validate(bad)
    Traceback (most recent call last):
    ...
    shardlab.train.pipeline.validate.ScheduleError: [pipeline.validate] stage 0: 'send act mb0 s0' has no matching receive 'recv act mb0 s1' on stage 1; add it before 'F mb0 s1'
"""

from __future__ import annotations

from .schedule import (ACTIVATION, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, GRADIENT, KINDS, RECV,
                       SEND, Action, Schedule)

__all__ = ["ScheduleError", "validate"]


class ScheduleError(ValueError):
    """An invalid schedule; ``.action`` is the offending :class:`Action` (None if it is missing)."""

    def __init__(self, message: str, action: Action | None = None, *, op: str = "pipeline.validate"):
        super().__init__(f"[{op}] {message}")
        self.action = action


def _fail(msg: str, action: Action | None = None):
    raise ScheduleError(msg, action)


def _check_action(sched: Schedule, s: int, a) -> None:
    """The field checks of one action (run only on actions that look unusual, see _index)."""
    if not isinstance(a, Action):
        _fail(f"stage {s}: {a!r} is not an Action", None)
    if a.kind not in KINDS:
        _fail(f"stage {s}: action {a!r} has kind {a.kind!r}; use one of {KINDS}", a)
    if a.stage != s:
        _fail(f"'{a}' is in stage {s}'s list but names stage {a.stage}", a)
    if not (isinstance(a.microbatch, int) and 0 <= a.microbatch < sched.m):
        _fail(f"stage {s}: '{a}' names microbatch {a.microbatch}; the schedule has m={sched.m}", a)
    if not (isinstance(a.chunk, int) and 0 <= a.chunk < sched.v):
        _fail(f"stage {s}: '{a}' names chunk {a.chunk}; the schedule has v={sched.v} chunks per device", a)
    if (a.kind in (SEND, RECV)) != (a.payload in (ACTIVATION, GRADIENT)):
        _fail(f"stage {s}: '{a}' has payload {a.payload!r}; sends and receives carry 'activation' or "
              f"'gradient', compute actions None", a)


def _index(sched: Schedule) -> list[dict]:
    """Per device: (kind, chunk, microbatch, payload) -> index in the device's list.

    Checks every action's fields on the way and rejects duplicates.
    """
    m_ok, c_ok = range(sched.m), range(sched.v)
    kinds_ok = {(k, None) for k in (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)}
    kinds_ok |= {(k, q) for k in (SEND, RECV) for q in (ACTIVATION, GRADIENT)}
    out = []
    for s, acts in enumerate(sched.actions):
        pos: dict = {}
        for i, a in enumerate(acts):
            if (type(a) is not Action or a.stage != s or (a.kind, a.payload) not in kinds_ok
                    or a.microbatch not in m_ok or a.chunk not in c_ok):
                _check_action(sched, s, a)
            key = (a.kind, a.chunk, a.microbatch, a.payload)
            if key in pos:
                _fail(f"stage {s}: '{a}' appears twice (positions {pos[key]} and {i})", a)
            pos[key] = i
        out.append(pos)
    return out


def validate(sched: Schedule) -> Schedule:
    """Checks ``sched``; returns it unchanged when valid.

    Raises:
        ScheduleError (a ValueError): the first problem found, naming the action and what to do.
    """
    pos = _index(sched)
    m, n, v = sched.m, sched.num_virtual_stages, sched.v
    vs_of = [[sched.virtual_stage(s, c) for c in range(v)] for s in range(sched.p)]
    place = [sched.placement(k) for k in range(n)]
    has_backward = any(k[0] != FORWARD and k[3] is None for d in pos for k in d)

    def need_input(s, c, i, consumer: Action, src_vs: int, payload: str, producer_kinds) -> None:
        """``consumer`` at index i on (s, c) needs data made by virtual stage ``src_vs``."""
        ps, pc = place[src_vs]
        made = [j for j in (pos[ps].get((k, pc, consumer.microbatch, None)) for k in producer_kinds)
                if j is not None]
        if not made:
            return  # the producer's own absence is reported by the completeness check
        if ps == s:
            if made[0] > i:
                _fail(f"stage {s}: '{consumer}' comes before '{sched.actions[s][made[0]]}', which makes its "
                      f"input on the same device; move it after", consumer)
            return
        r = pos[s].get((RECV, c, consumer.microbatch, payload))
        if r is None or r > i:
            want = Action(RECV, s, consumer.microbatch, c, payload)
            if r is None:
                _fail(f"stage {s}: '{consumer}' has no receive of its input; add '{want}' before it", consumer)
            _fail(f"stage {s}: '{want}' comes after '{consumer}', which needs the data; move it before", want)

    for s, acts in enumerate(sched.actions):
        mine, vss = pos[s], vs_of[s]
        for i, a in enumerate(acts):
            kind, mb, c = a.kind, a.microbatch, a.chunk
            vs = vss[c]
            if kind == FORWARD:
                if vs > 0:
                    need_input(s, c, i, a, vs - 1, ACTIVATION, (FORWARD,))
            elif kind == BACKWARD or kind == BACKWARD_INPUT:
                f = mine.get((FORWARD, c, mb, None))
                if f is None or f > i:
                    _fail(f"stage {s}: '{a}' comes before its forward '{Action(FORWARD, s, mb, c)}'"
                          + ("" if f is not None else " (which is missing)"), a)
                other = BACKWARD_INPUT if kind == BACKWARD else BACKWARD
                if (other, c, mb, None) in mine:
                    _fail(f"stage {s}: microbatch {mb} chunk {c} has both a whole backward and a split one "
                          f"('{a}'); use either 'backward' or 'backward_input' + 'backward_weight'", a)
                if vs < n - 1:
                    need_input(s, c, i, a, vs + 1, GRADIENT, (BACKWARD, BACKWARD_INPUT))
            elif kind == BACKWARD_WEIGHT:
                g = mine.get((BACKWARD_INPUT, c, mb, None))
                if g is None or g > i:
                    _fail(f"stage {s}: weight gradient '{a}' comes before its input gradient "
                          f"'{Action(BACKWARD_INPUT, s, mb, c)}'" + (" (which is missing)" if g is None else "")
                          + "; the weight gradient needs the output gradient that step receives", a)
            elif kind == SEND:
                act = a.payload == ACTIVATION
                made = ([mine.get((FORWARD, c, mb, None))] if act else
                        [mine.get((BACKWARD, c, mb, None)), mine.get((BACKWARD_INPUT, c, mb, None))])
                made = [j for j in made if j is not None]
                if not made or made[0] > i:
                    _fail(f"stage {s}: '{a}' comes before the compute that produces what it sends", a)
                dst = vs + 1 if act else vs - 1
                if not 0 <= dst < n:
                    _fail(f"stage {s}: '{a}' sends past the end of the pipeline (virtual stage {dst})", a)
                ds, dc = place[dst]
                if ds == s:
                    _fail(f"stage {s}: '{a}' sends to its own device (virtual stage {dst}); drop it", a)
                if (RECV, dc, mb, a.payload) not in pos[ds]:
                    want = Action(RECV, ds, mb, dc, a.payload)
                    consumer = Action(FORWARD if act else BACKWARD, ds, mb, dc)
                    _fail(f"stage {s}: '{a}' has no matching receive '{want}' on stage {ds}; add it before "
                          f"'{consumer}'", a)
            else:  # RECV
                src = vs - 1 if a.payload == ACTIVATION else vs + 1
                if not 0 <= src < n:
                    _fail(f"stage {s}: '{a}' receives from outside the pipeline (virtual stage {src})", a)
                ss, sc = place[src]
                if (SEND, sc, mb, a.payload) not in pos[ss]:
                    _fail(f"stage {s}: '{a}' has no matching send on stage {ss}; add "
                          f"'{Action(SEND, ss, mb, sc, a.payload)}' after the compute that produces it", a)
    # completeness: every (virtual stage, microbatch) forward once, and a whole backward pass if any
    for vs in range(n):
        s, c = place[vs]
        mine = pos[s]
        for mb in range(m):
            if (FORWARD, c, mb, None) not in mine:
                _fail(f"stage {s}: the forward of microbatch {mb} chunk {c} is missing "
                      f"(add '{Action(FORWARD, s, mb, c)}')", None)
            if not has_backward:
                continue
            if (BACKWARD, c, mb, None) in mine:
                continue
            if (BACKWARD_INPUT, c, mb, None) not in mine:
                _fail(f"stage {s}: the backward of microbatch {mb} chunk {c} is missing "
                      f"(add '{Action(BACKWARD, s, mb, c)}')", None)
            if (BACKWARD_WEIGHT, c, mb, None) not in mine:
                _fail(f"stage {s}: '{Action(BACKWARD_INPUT, s, mb, c)}' has no weight gradient "
                      f"(add '{Action(BACKWARD_WEIGHT, s, mb, c)}' after it)", None)
    return sched
