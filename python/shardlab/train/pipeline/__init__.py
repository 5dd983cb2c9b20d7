"""Pipeline parallelism: schedules as data, validated, clocked and drawn.

Build a schedule (:func:`gpipe`, :func:`one_f_one_b`, :func:`interleaved_1f1b`, :func:`zb_h1`, :func:`zb_v`,
:func:`dualpipe_v`),
check it (:func:`validate`), time it with given or cost-model durations (:func:`clock` with
:class:`Durations`), and read the step time, the bubble fraction and the peak activations per
stage from the :class:`Timeline`, which draws itself in Jupyter and with ``.plot()``. Run it on
real data with :func:`execute` (a training step of a ``shardlab.models.transformer`` model along a
``stage`` mesh axis, equal to :func:`reference_step`, with data parallelism and Megatron tensor parallelism
(:mod:`.tensor`) on the mesh's other axes); its ledger gives the clock the executed times.

Example:
    >>> from shardlab.train import pipeline as pp
    >>> t = pp.clock(pp.gpipe(4, 8), pp.Durations(forward=1, backward=2))
    >>> t.step_time, round(t.bubble_fraction, 4), t.peak_activations
    (33.0, 0.2727, (8, 8, 8, 8))
"""

from .schedule import (ACTIVATION, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, GRADIENT, KINDS, RECV,
                       SEND, Action, Schedule, stage_layers)
from .builders import SCHEDULES, gpipe, interleaved_1f1b, one_f_one_b, zb_h1, zb_v
from .dualpipe import dualpipe_v
from .validate import ScheduleError, validate
from .durations import Durations
from .clock import ClockedAction, Timeline, bubble_formula, clock
from .execute import Execution, execute, reference_step
from . import stages, tensor, timeline

__all__ = [
    "Action", "Schedule", "stage_layers", "KINDS", "FORWARD", "BACKWARD", "BACKWARD_INPUT", "BACKWARD_WEIGHT",
    "SEND", "RECV", "ACTIVATION", "GRADIENT",
    "gpipe", "one_f_one_b", "interleaved_1f1b", "zb_h1", "zb_v", "dualpipe_v", "SCHEDULES",
    "ScheduleError", "validate", "Durations", "ClockedAction", "Timeline", "clock", "bubble_formula", "timeline",
    "execute", "reference_step", "Execution", "stages", "tensor",
]
