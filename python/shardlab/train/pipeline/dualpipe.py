"""DualPipeV: DeepSeek-V3's DualPipe cut in half, a V-shaped schedule with overlapped F&B pairs.

DualPipe (DeepSeek-V3 technical report, section 3.2.1) feeds microbatches from both ends of the
pipeline and overlaps the forward of one microbatch with the backward of another, so that one
chunk's communication (expert all-to-all, pipeline sends) hides under the other's compute.
DualPipeV is its "cut-in-half" form (deepseek-ai/DualPipe, ``dualpipev.py``): ``p`` devices, 2
chunks per device in a V (device ``d`` holds virtual stages ``d`` and ``2p - 1 - d``, the
placement of ZB-V), and per device the eight phases of that file, each of which we follow
literally:

1. ``2 (p - 1 - d)`` forwards of chunk 0;
2. ``d + 1`` times: forward chunk 0, forward chunk 1;
3. ``p - 1 - d`` times: input gradient chunk 1, weight gradient (oldest), forward chunk 1;
4. ``m - 2p + d + 1`` times: the overlapped pairs F chunk 0 & B chunk 1, then F chunk 1 &
   B chunk 0 (the very first pair of the last device is run one after the other);
5. ``p - 1 - d`` times: backward chunk 1, then the pair F chunk 1 & B chunk 0;
6. ``d + 1`` times: backward chunk 1, backward chunk 0; from the middle of this phase on the
   backward is split (input gradient now, weight gradient deferred);
7. ``p - 1 - d`` times: a deferred weight gradient, input gradient chunk 0;
8. the remaining ``d + 1`` deferred weight gradients.

Each chunk's forwards and backwards take microbatches in order; deferred weight gradients run
oldest first. An overlapped pair is two actions of the schedule (the executor runs the forward,
then the backward) named in ``Schedule.overlapped``; the clock runs a pair as one block that
starts when both inputs are there and lasts ``F + B - overlap * min(F, B)``
(:class:`~shardlab.train.pipeline.Durations` ``overlap``): ``overlap=0`` (the default) is a
dense model on one compute stream, nothing to hide; ``overlap=1`` is the max-based ideal
``max(F, B)`` of two halves that hide each other entirely.

Example:
    >>> from shardlab.train import pipeline as pp
    >>> print(pp.dualpipe_v(2, 4))
    stage 0: F0 F1 F2 F0.1 I0.1 W0.1 F1.1 F3 B1.1 F2.1 B0 B2.1 F3.1 B1 B3.1 I2 W2 I3 W3
    stage 1: F0 F0.1 F1 F1.1 F2 B0.1 F2.1 B0 F3 B1.1 F3.1 B1 B2.1 B2 I3.1 I3 W3.1 W3
    >>> pp.dualpipe_v(2, 4).overlapped[0]     # indices into stage 0's actions (sends and receives included)
    ((13, 15), (18, 20), (24, 26))
"""

from __future__ import annotations

from .builders import SCHEDULES
from .schedule import BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, Action, Schedule, check_sizes, with_comms

__all__ = ["dualpipe_v"]


def _device(d: int, p: int, m: int) -> tuple[list[Action], list[tuple[int, int]]]:
    """Device d's compute order and its overlapped pairs (indices into that order)."""
    acts: list[Action] = []
    pairs: list[tuple[int, int]] = []
    nf, nb = [0, 0], [0, 0]          # next microbatch of each chunk's forward / backward
    weights: list[tuple[int, int]] = []   # deferred weight gradients (chunk, microbatch), oldest first

    def fwd(c: int) -> int:
        acts.append(Action(FORWARD, d, nf[c], c))
        nf[c] += 1
        return len(acts) - 1

    def bwd(c: int, split: bool = False) -> int:
        mb = nb[c]
        acts.append(Action(BACKWARD_INPUT if split else BACKWARD, d, mb, c))
        if split:
            weights.append((c, mb))
        nb[c] += 1
        return len(acts) - 1

    def weight() -> None:
        c, mb = weights.pop(0)
        acts.append(Action(BACKWARD_WEIGHT, d, mb, c))

    def pair(cf: int, cb: int) -> None:
        i = fwd(cf)
        pairs.append((i, bwd(cb)))

    last = d == p - 1
    for _ in range(2 * (p - 1 - d)):                     # 1: nF0
        fwd(0)
    for _ in range(d + 1):                               # 2: nF0F1
        fwd(0)
        fwd(1)
    for _ in range(p - 1 - d):                           # 3: nB1W1F1 (zero bubble)
        bwd(1, split=True)
        weight()
        fwd(1)
    for i in range(m - 2 * p + d + 1):                   # 4: nF0B1F1B0 (the main step)
        if i == 0 and last:                              # not overlapped, to shrink the bubble
            fwd(0)
            bwd(1)
        else:
            pair(0, 1)
        pair(1, 0)
    for _ in range(p - 1 - d):                           # 5: nB1F1B0
        bwd(1)
        pair(1, 0)
    split = False
    for i in range(d + 1):                               # 6: nB1B0, the second half split
        if i == (d + 1) // 2 and d % 2 == 1:
            split = True
        bwd(1, split)
        if i == (d + 1) // 2 and d % 2 == 0:
            split = True
        bwd(0, split)
    for _ in range(p - 1 - d):                           # 7: nWB0 (zero bubble)
        weight()
        bwd(0, split=True)
    while weights:                                       # 8: nW
        weight()
    return acts, pairs


def dualpipe_v(p: int, m: int, *, num_layers: int | None = None) -> Schedule:
    """DualPipeV on ``p`` devices with ``m`` microbatches (see the module docstring).

    Args:
        p: devices (2 chunks each, in a V); m: microbatches, at least ``2 p`` (the steady phase
            needs them, as ``dualpipev.py`` asserts).
        num_layers: optional; split over the ``2 p`` virtual stages.

    Raises:
        ValueError: ``m < 2 p``.

    Example:
        >>> from shardlab.train import pipeline as pp
        >>> s = pp.dualpipe_v(4, 8)
        >>> s.name, s.layout, sum(len(x) for x in s.overlapped)
        ('dualpipe-v', 'v', 25)
    """
    layers = check_sizes("dualpipe_v", p, m, 2, num_layers=num_layers)
    if m < 2 * p:
        raise ValueError(f"[dualpipe_v] m={m} microbatches for p={p} devices: DualPipeV needs m >= 2p = {2 * p} "
                         f"(its warm-up fills both chunks of every device); use m >= {2 * p}")
    built = [_device(d, p, m) for d in range(p)]
    return with_comms("dualpipe-v", p, m, 2, [a for a, _ in built], layout="v", layers=layers,
                      pairs=[q for _, q in built])


SCHEDULES["dualpipe-v"] = dualpipe_v
