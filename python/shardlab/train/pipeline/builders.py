"""The schedule builders: GPipe, 1F1B (PipeDream-flush), interleaved 1F1B, zero-bubble ZB-H1 and ZB-V.

Each builder returns a :class:`~shardlab.train.pipeline.schedule.Schedule` whose per-device compute
order is the published one, with sends placed right after the compute that produces the data and
receives right before the compute that needs it. ``num_layers`` (optional) splits a model's layers
over the ``p * v`` virtual stages and rejects more stages than layers.

Example:
    >>> from shardlab.train import pipeline as pp
    >>> print(pp.one_f_one_b(3, 4))
    stage 0: F0 F1 F2 B0 F3 B1 B2 B3
    stage 1: F0 F1 B0 F2 B1 F3 B2 B3
    stage 2: F0 B0 F1 B1 F2 B2 F3 B3
"""

from __future__ import annotations

import heapq

from .schedule import (BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, Action, Schedule, check_sizes,
                       with_comms)

__all__ = ["gpipe", "one_f_one_b", "interleaved_1f1b", "zb_h1", "zb_v", "SCHEDULES"]


def gpipe(p: int, m: int, *, forward_only: bool = False, num_layers: int | None = None) -> Schedule:
    """GPipe: every device runs all m forwards, then all m backwards.

    Args:
        p: pipeline stages (devices); m: microbatches.
        forward_only: no backward (an inference or forward-timing pipeline).
        num_layers: optional; the model's layers are split over the p stages.

    Example:
        >>> print(gpipe(2, 3))
        stage 0: F0 F1 F2 B0 B1 B2
        stage 1: F0 F1 F2 B0 B1 B2
    """
    layers = check_sizes("gpipe", p, m, num_layers=num_layers)
    compute = []
    for s in range(p):
        acts = [Action(FORWARD, s, i) for i in range(m)]
        if not forward_only:
            acts += [Action(BACKWARD, s, i) for i in range(m)]
        compute.append(acts)
    return with_comms("gpipe-forward" if forward_only else "gpipe", p, m, 1, compute, layers=layers)


def one_f_one_b(p: int, m: int, *, num_layers: int | None = None) -> Schedule:
    """1F1B (PipeDream-flush): p - 1 - s warm-up forwards on stage s, then one forward and one
    backward in turn, then the remaining backwards. At most p - s microbatches live on stage s.

    Example:
        >>> one_f_one_b(4, 8).compute(0)[:5]
        [Action(kind='forward', stage=0, microbatch=0, chunk=0, payload=None), Action(kind='forward', stage=0, microbatch=1, chunk=0, payload=None), Action(kind='forward', stage=0, microbatch=2, chunk=0, payload=None), Action(kind='forward', stage=0, microbatch=3, chunk=0, payload=None), Action(kind='backward', stage=0, microbatch=0, chunk=0, payload=None)]
    """
    layers = check_sizes("one_f_one_b", p, m, num_layers=num_layers)
    new = tuple.__new__
    compute = []
    for s in range(p):
        warm = min(p - 1 - s, m)
        fwd = [new(Action, (FORWARD, s, i, 0, None)) for i in range(m)]
        bwd = [new(Action, (BACKWARD, s, i, 0, None)) for i in range(m)]
        acts = fwd[:warm]
        for i in range(m - warm):
            acts += (fwd[warm + i], bwd[i])
        acts += bwd[m - warm:]
        compute.append(acts)
    return with_comms("1f1b", p, m, 1, compute, layers=layers)


def interleaved_1f1b(p: int, m: int, v: int, *, num_layers: int | None = None) -> Schedule:
    """Interleaved 1F1B (Megatron-LM): v chunks per device, virtual stage ``c * p + s`` on device s.

    Microbatches go through a device's chunks in groups of p (forward: chunk 0 of microbatches
    0..p-1, then chunk 1 of the same ones, ...; backward from the last chunk), with
    ``2 (p - 1 - s) + (v - 1) p`` warm-up forwards on device s. With v = 1 this is 1F1B.

    Raises:
        ValueError: m not a multiple of p (the groups of p microbatches need it).

    Example:
        >>> print(interleaved_1f1b(2, 2, 2))
        stage 0: F0 F1 F0.1 F1.1 B0.1 B1.1 B0 B1
        stage 1: F0 F1 F0.1 B0.1 F1.1 B1.1 B0 B1
    """
    layers = check_sizes("interleaved_1f1b", p, m, v, num_layers=num_layers)
    if v == 1:
        return one_f_one_b(p, m, num_layers=num_layers)
    if m % p:
        raise ValueError(f"[interleaved_1f1b] m={m} microbatches is not a multiple of p={p} stages: the interleaved "
                         f"schedule sends microbatches through each device's chunks in groups of p; use m = "
                         f"{(m // p + 1) * p} (or another multiple of {p})")
    total = m * v

    def unit(k: int, backward: bool) -> tuple[int, int]:
        group, r = divmod(k, p * v)
        chunk = r // p
        return group * p + r % p, (v - 1 - chunk if backward else chunk)

    compute = []
    for s in range(p):
        warm = min(2 * (p - 1 - s) + (v - 1) * p, total)
        acts = []
        for k in range(warm):
            mb, c = unit(k, False)
            acts.append(Action(FORWARD, s, mb, c))
        for i in range(total - warm):
            mb, c = unit(warm + i, False)
            acts.append(Action(FORWARD, s, mb, c))
            mb, c = unit(i, True)
            acts.append(Action(BACKWARD, s, mb, c))
        for k in range(total - warm, total):
            mb, c = unit(k, True)
            acts.append(Action(BACKWARD, s, mb, c))
        compute.append(acts)
    return with_comms("interleaved-1f1b", p, m, v, compute, layers=layers)


def zb_h1(p: int, m: int, *, num_layers: int | None = None) -> Schedule:
    """ZB-H1 (zero bubble, Qi et al. 2023): 1F1B with the backward split into the input gradient
    (I, on the critical path) and the weight gradient (W, which nothing downstream waits for).

    Stage s keeps 1F1B's p - 1 - s warm-up forwards and defers up to s weight gradients, so every
    stage holds at most p microbatches' activations (1F1B's peak, on stage 0) while the deferred
    W's fill the cool-down bubble.

    Example:
        >>> print(zb_h1(2, 3))
        stage 0: F0 F1 I0 W0 F2 I1 W1 I2 W2
        stage 1: F0 I0 F1 I1 W0 F2 I2 W1 W2
    """
    layers = check_sizes("zb_h1", p, m, num_layers=num_layers)
    compute = []
    for s in range(p):
        warm = min(p - 1 - s, m)
        acts = [Action(FORWARD, s, i) for i in range(warm)]
        next_w = 0

        def backward(i: int) -> None:
            nonlocal next_w
            acts.append(Action(BACKWARD_INPUT, s, i))
            if i + 1 - next_w > s:           # more than s weight gradients pending: run the oldest
                acts.append(Action(BACKWARD_WEIGHT, s, next_w))
                next_w += 1

        for i in range(m - warm):
            acts.append(Action(FORWARD, s, warm + i))
            backward(i)
        for i in range(m - warm, m):
            backward(i)
        acts += [Action(BACKWARD_WEIGHT, s, i) for i in range(next_w, m)]
        compute.append(acts)
    return with_comms("zb-h1", p, m, 1, compute, layers=layers)


def zb_v(p: int, m: int, *, max_live: int | None = None, num_layers: int | None = None) -> Schedule:
    """ZB-V (Qi et al. 2024, the V-shaped zero-bubble schedule; DualPipeV runs the same placement):
    2 chunks per device in a V (device d holds virtual stages d and 2p - 1 - d, so the first and the
    last stage share device 0), the backward split into input (I) and weight (W) gradients.

    The order is built the way the zero-bubble paper builds its schedules: a greedy simulation
    with unit times per chunk (F = I = W = 1, free sends) in which a free device runs, by
    priority, an input gradient whose output gradient has arrived (the critical path), else the
    next forward whose input has arrived (chunk 1 first) if it holds fewer than ``max_live``
    chunk activations (one fewer for chunk 0, so chunk 1 always has room), else its oldest deferred weight gradient, else waits. Any order a timing
    realises is deadlock-free under every timing, so the schedule runs with any durations.

    Args:
        p: devices; m: microbatches (any m >= 1; the bubble vanishes once m >= 2p).
        max_live: chunk activations a device may hold (a chunk is half a device's layers);
            default 2p, 1F1B's peak of p whole-stage activations.
        num_layers: optional; split over the 2p virtual stages.

    Example:
        >>> print(zb_v(2, 2))
        stage 0: F0 F1 F0.1 I0.1 F1.1 I1.1 I0 W0.1 I1 W1.1 W0 W1
        stage 1: F0 F0.1 F1 F1.1 I0.1 I0 I1.1 I1 W0.1 W0 W1.1 W1
    """
    layers = check_sizes("zb_v", p, m, 2, num_layers=num_layers)
    limit = 2 * p if max_live is None else max_live
    if not isinstance(limit, int) or limit < 2:
        raise ValueError(f"[zb_v] max_live={max_live!r} must be an integer >= 2 (a microbatch's two chunks)")
    n = 2 * p

    def vs_of(d: int, c: int) -> int:
        return d if c == 0 else n - 1 - d

    done: dict = {}                      # (kind, virtual stage, mb) -> end time
    nxt = {(k, d, c): 0 for k in (FORWARD, BACKWARD_INPUT) for d in range(p) for c in (0, 1)}
    pending_w: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    live, free = [0] * p, [0.0] * p
    compute: list[list[Action]] = [[] for _ in range(p)]
    remaining = 3 * m * n

    def ready(key, t: float) -> bool:
        return key in done and done[key] <= t

    def pick(d: int, t: float):
        for c in (1, 0):                 # an input gradient whose output gradient is here
            mb = nxt[(BACKWARD_INPUT, d, c)]
            vs = vs_of(d, c)
            if mb < m and ready((FORWARD, vs, mb), t) and (vs == n - 1 or ready((BACKWARD_INPUT, vs + 1, mb), t)):
                return BACKWARD_INPUT, c, mb
        for c in (1, 0):                 # the next forward whose input is here; chunk 0 leaves a slot
            mb = nxt[(FORWARD, d, c)]    # for chunk 1, which brings microbatches to their backward
            vs = vs_of(d, c)
            if mb < m and live[d] < limit - (c == 0) and (vs == 0 or ready((FORWARD, vs - 1, mb), t)):
                return FORWARD, c, mb
        if pending_w[d]:
            c, mb = pending_w[d][0]
            return BACKWARD_WEIGHT, c, mb
        return None

    ends: list[float] = []               # heap of completion times still ahead of the clock
    while remaining:
        t = min(free)
        while ends and ends[0] <= t:
            heapq.heappop(ends)
        for d in range(p):
            choice = pick(d, t) if free[d] == t else None
            if choice is not None:
                break
        else:                            # nobody free can act: wait for the next action to finish
            later = [f for f in free if f > t] + ends[:1]
            if not later:
                raise RuntimeError(f"[zb_v] no device can proceed at p={p}, m={m}, max_live={limit}")
            nt = min(later)
            free = [nt if f == t else f for f in free]
            continue
        kind, c, mb = choice
        vs = vs_of(d, c)
        compute[d].append(Action(kind, d, mb, c))
        done[(kind, vs, mb)] = free[d] = t + 1.0
        heapq.heappush(ends, t + 1.0)
        remaining -= 1
        if kind == FORWARD:
            nxt[(FORWARD, d, c)] += 1
            live[d] += 1
        elif kind == BACKWARD_INPUT:
            nxt[(BACKWARD_INPUT, d, c)] += 1
            pending_w[d].append((c, mb))
        else:
            pending_w[d].pop(0)
            live[d] -= 1
    return with_comms("zb-v", p, m, 2, compute, layout="v", layers=layers)


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved-1f1b": interleaved_1f1b, "zb-h1": zb_h1, "zb-v": zb_v}
