"""What :func:`~shardlab.train.pipeline.execute` ran: the loss, the gradients, the ledger, and per
action the events it recorded; from them the executed durations and timeline of the schedule.
"""

from __future__ import annotations

from .clock import Timeline, clock
from .durations import Durations
from .schedule import ACTIVATION, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, GRADIENT, RECV, SEND, Action

__all__ = ["Execution"]

_OP = "pipeline.execute"


class Execution:
    """What :func:`~shardlab.train.pipeline.execute` ran.

    Attributes:
        schedule, mesh, axis: the schedule, the mesh and its pipeline axis.
        loss: the step's loss (mean over the batch); grads: params-shaped gradients (numpy).
        ledger: every event of the step (compute on each stage's slice, ppermute sends, the
            data-parallel gradient all-reduce), each labelled ``pipeline/<action>/<piece>``
            (the all-reduce ``pipeline/gradient all-reduce s<device>``).
        order: the actions in the order the executor ran them (devices interleaved).
        peak_live: per device, the most vjp functions (microbatch activations) held at once.
    """

    def __init__(self, schedule, mesh, axis, loss, grads, ledger, order, spans, peak_live, reduce_spans=None):
        self.schedule, self.mesh, self.axis = schedule, mesh, axis
        self._reduce_spans = dict(reduce_spans or {})
        self.loss, self.grads, self.ledger = loss, grads, ledger
        self.order = order
        self.peak_live = tuple(peak_live)
        self._spans = spans   # action -> (first, end) indices of its events in the ledger
        self._events = None

    def action_events(self, action: Action) -> list[dict]:
        """The ledger events recorded while ``action`` ran (empty for an action not in the schedule)."""
        if self._events is None:
            self._events = self.ledger.events
        i, j = self._spans.get(action, (0, 0))
        return self._events[i:j]

    def gradient_all_reduce_events(self, stage: int | None = None) -> list[dict]:
        """The ledger events of the end-of-step data-parallel gradient all-reduce (one psum of one
        flat buffer per device; ``stage`` picks one device's). Empty without data axes."""
        if self._events is None:
            self._events = self.ledger.events
        spans = [self._reduce_spans[stage]] if stage is not None else list(self._reduce_spans.values())
        return [e for i, j in spans for e in self._events[i:j]]

    def _per_virtual_stage(self, kinds, field: str) -> tuple:
        """Per virtual stage: the value of ``field`` summed over one microbatch's ``kinds`` actions
        (checked equal for every microbatch that has them: the stages run the same program on
        each); ``None`` for a virtual stage where no microbatch has them (a schedule may run the
        whole backward for some microbatches and the split one for others, as DualPipeV does)."""
        s = self.schedule
        present = self._present()
        out = []
        for vs in range(s.num_virtual_stages):
            st, c = s.placement(vs)
            vals = []
            for mb in range(s.m):
                if kinds[0] not in (SEND, RECV) and (kinds[0], st, mb, c) not in present:
                    continue
                tot = 0.0
                for kind in kinds:
                    for e in self.action_events(Action(kind, st, mb, c, _payload(kind))):
                        if kind in (SEND, RECV) and e["op"] != "ppermute":
                            continue
                        v = e[field]
                        if v is None:
                            raise ValueError(f"[{_OP}] ledger event {e['op']} has no {field}: build the mesh "
                                             f"with hardware=... (e.g. make_mesh(..., hardware='tpu-v5e')) so "
                                             f"every event is priced")
                        tot += v
                vals.append(tot)
            if vals and max(vals) - min(vals) > 1e-9 * max(1.0, abs(max(vals))):
                raise ValueError(f"[{_OP}] virtual stage {vs}: {kinds} {field} differ between microbatches {vals}")
            out.append(vals[0] if vals else None)
        return tuple(out)

    def _present(self) -> set:
        if not hasattr(self, "_present_set"):
            self._present_set = {(a.kind, a.stage, a.microbatch, a.chunk) for acts in self.schedule.actions
                                 for a in acts if a.payload is None}
        return self._present_set

    def _backward_parts(self, field: str):
        """Per virtual stage (forward, backward, input part, weight part) of ``field``: the whole
        backward where a microbatch ran it whole, else input + weight parts; the weight part from
        the weight steps (0 where none ran)."""
        f = self._per_virtual_stage((FORWARD,), field)
        whole = self._per_virtual_stage((BACKWARD,), field)
        inp = self._per_virtual_stage((BACKWARD_INPUT,), field)
        wgt = self._per_virtual_stage((BACKWARD_WEIGHT,), field)
        back, i_out, w_out = [], [], []
        for k in range(len(f)):
            w = wgt[k] if wgt[k] is not None else 0.0
            i = inp[k] if inp[k] is not None else (whole[k] - w if whole[k] is not None else 0.0)
            back.append(whole[k] if whole[k] is not None else i + w)
            i_out.append(i)
            w_out.append(w)
        return f, tuple(back), tuple(i_out), tuple(w_out)

    def stage_flops(self) -> dict[str, tuple[float, ...]]:
        """Per virtual stage, the compute FLOPs per device of one microbatch's forward, backward
        (whole, or input + weight parts), input-gradient and weight-gradient steps, from the ledger."""
        f, b, i, w = self._backward_parts("flops")
        return {"forward": f, "backward": b, "backward_input": i, "backward_weight": w}

    def durations(self) -> Durations:
        """The clock's durations from the executed ledger: every action's events' seconds (FLOPs
        and bytes priced on the mesh's hardware), summed per virtual stage. A virtual stage that
        ran both whole and split backwards is clocked with the whole one's time and the weight
        steps' time (its input steps as their difference)."""
        fwd, back, _, wgt = self._backward_parts("seconds")
        n = len(fwd)
        send = self._sends(ACTIVATION, n)
        grad = self._sends(GRADIENT, n)
        hw = self.mesh.hardware.name if self.mesh.hardware is not None else "?"
        return Durations(forward=fwd, backward=back, weight=[min(w, b) for w, b in zip(wgt, back)], send=send,
                         grad_send=grad, source=f"executed ledger on {hw}")

    def _sends(self, payload: str, n: int) -> tuple[float, ...]:
        s = self.schedule
        out = []
        for vs in range(n):
            st, c = s.placement(vs)
            secs = [sum(e["seconds"] or 0.0 for e in self.action_events(Action(SEND, st, mb, c, payload))
                        if e["op"] == "ppermute") for mb in range(s.m)]
            out.append(max(secs))
        return tuple(out)

    def timeline(self) -> Timeline:
        """:func:`clock` of the schedule with the executed :meth:`durations`: the program that ran."""
        return clock(self.schedule, self.durations())

    def __repr__(self) -> str:
        s = self.schedule
        return (f"Execution({s.name}, p={s.p}, m={s.m}, v={s.v}, loss={self.loss:.6g}, "
                f"{len(self.ledger)} ledger events)")


def _payload(kind: str):
    return None if kind not in (SEND, RECV) else ACTIVATION
