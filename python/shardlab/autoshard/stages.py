"""Alpa's inter-op pass: cut L layers into pipeline stages, give each a sub-mesh, cover the
devices exactly, and minimise the pipeline latency of B micro-batches

    T = sum_i t_i + (B - 1) * max_j t_j

where t_i = stage_cost(layer_start_i, layer_end_i, submesh_shape_i) is the stage's intra-op time
(Alpa gets it from the intra-op ILP; here it is any callback). As in Alpa, the max is handled
by enumerating its value t_max over every distinct stage time: for each t_max a dynamic program
F(s, k, d; t_max) gives the least sum of stage times for layers k.. on d devices with every
stage at most t_max, and T* = min over t_max of F(0, N*M; t_max) + (B - 1) * t_max, stopping
once B * t_max cannot beat the best. Here the program runs for all t_max at once (numpy).

>>> def cost(start, end, shape):  # work split over the devices, plus a collective overhead
...     n = shape[0] * shape[1]
...     return (end - start) / n + 0.5 * (n - 1), True
>>> plan = plan_stages(4, (1, 4), cost, num_microbatches=8)
>>> [(s.layer_start, s.layer_end, s.submesh_shape) for s in plan.stages]
[(0, 1, (1, 1)), (1, 2, (1, 1)), (2, 3, (1, 1)), (3, 4, (1, 1))]
>>> plan.latency_s
11.0
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Sequence

import numpy as np

from shardlab.units import fmt_seconds

__all__ = ["Stage", "StagePlan", "plan_stages", "brute_force_stages", "submesh_choices"]

StageCost = Callable[[int, int, tuple], "tuple[float, bool]"]


@dataclasses.dataclass(frozen=True)
class Stage:
    """Layers ``layer_start`` (inclusive) to ``layer_end`` (exclusive) on a sub-mesh of
    ``submesh_shape`` (hosts, devices per host); ``seconds`` is its stage time; ``hosts`` and
    ``devices`` are the ranges of the mesh it occupies (None when no rectangle placement was
    found for a custom list of shapes)."""

    layer_start: int
    layer_end: int
    submesh_shape: tuple[int, int]
    seconds: float
    hosts: range | None = None
    devices: range | None = None


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """Stages in pipeline order and the latency ``sum_i t_i + (B - 1) * max_j t_j``."""

    stages: tuple[Stage, ...]
    latency_s: float
    num_microbatches: int
    mesh_shape: tuple[int, int]

    @property
    def sum_s(self) -> float:
        return float(sum(s.seconds for s in self.stages))

    @property
    def max_s(self) -> float:
        return float(max(s.seconds for s in self.stages))

    def summary(self) -> str:
        lines = [f"{len(self.stages)} stages on a {self.mesh_shape[0]}x{self.mesh_shape[1]} mesh, "
                 f"{self.num_microbatches} micro-batches: latency {fmt_seconds(self.latency_s)} "
                 f"(sum {fmt_seconds(self.sum_s)} + {self.num_microbatches - 1} x max {fmt_seconds(self.max_s)})"]
        for i, s in enumerate(self.stages):
            where = "" if s.hosts is None else (f" hosts {s.hosts.start}..{s.hosts.stop - 1}, "
                                                f"devices {s.devices.start}..{s.devices.stop - 1}")
            lines.append(f"  stage {i}: layers {s.layer_start}..{s.layer_end - 1} on "
                         f"{s.submesh_shape[0]}x{s.submesh_shape[1]}{where}: {fmt_seconds(s.seconds)}")
        return "\n".join(lines)


def submesh_choices(mesh_shape: Sequence[int], space: str = "all") -> list[tuple[int, int]]:
    """Alpa's sub-mesh shapes of an (N hosts, M devices per host) mesh: (1, 2^k) for 2^k < M
    and (n, M) for every n <= N (``space="all"``) or powers of two n (``"power_of_two"``). Any
    multiset of them with N*M devices in all tiles the mesh. M must be a power of two."""
    n_hosts, per_host = _mesh(mesh_shape)
    if per_host & (per_host - 1):
        raise ValueError(f"submesh_choices: {per_host} devices per host is not a power of two; "
                         "pass submesh_shapes= explicitly")
    if space not in ("all", "power_of_two"):
        raise ValueError(f"submesh_choices: space must be 'all' or 'power_of_two', got {space!r}")
    out = []
    m = 1
    while m < per_host:
        out.append((1, m))
        m *= 2
    for n in range(1, n_hosts + 1):
        if space == "all" or n & (n - 1) == 0:
            out.append((n, per_host))
    return out


def _mesh(mesh_shape) -> tuple[int, int]:
    shape = tuple(int(x) for x in mesh_shape)
    if len(shape) == 1:
        shape = (1,) + shape
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"mesh_shape must be (hosts, devices per host) with positive sizes, got "
                         f"{tuple(mesh_shape)}")
    return shape


def _table(num_layers, mesh_shape, stage_cost, num_microbatches, submesh_shapes, num_stages):
    """Validate the input; call stage_cost once per (start, end, shape)."""
    if int(num_layers) != num_layers or num_layers < 1:
        raise ValueError(f"plan_stages: num_layers must be a positive integer, got {num_layers}")
    if int(num_microbatches) != num_microbatches or num_microbatches < 1:
        raise ValueError(f"plan_stages: num_microbatches must be a positive integer, got {num_microbatches}")
    n_hosts, per_host = _mesh(mesh_shape)
    shapes = submesh_choices((n_hosts, per_host)) if submesh_shapes is None else \
        [tuple(int(x) for x in s) for s in submesh_shapes]
    if not shapes:
        raise ValueError("plan_stages: no sub-mesh shapes given")
    for s in shapes:
        if len(s) != 2 or s[0] < 1 or s[1] < 1 or s[0] > n_hosts or s[1] > per_host:
            raise ValueError(f"plan_stages: sub-mesh {s} does not fit the {n_hosts}x{per_host} mesh")
    devices = n_hosts * per_host
    smallest = min(a * b for a, b in shapes)
    if num_stages is not None:
        if int(num_stages) != num_stages or num_stages < 1:
            raise ValueError(f"plan_stages: num_stages must be a positive integer, got {num_stages}")
        if num_stages > num_layers:
            raise ValueError(f"plan_stages: cannot cut {num_layers} layers into {num_stages} stages "
                             "(each stage needs at least one layer)")
        if num_stages * smallest > devices:
            raise ValueError(
                f"plan_stages: the {n_hosts}x{per_host} mesh ({devices} devices) is too small for "
                f"{num_stages} stages: the smallest sub-mesh has {smallest} device(s), so at most "
                f"{devices // smallest} stages fit. Use fewer stages or a larger mesh.")
    cost = np.full((num_layers + 1, num_layers + 1, len(shapes)), np.inf)
    refused = 0
    for k in range(num_layers):
        for i in range(k + 1, num_layers + 1):
            for m, shape in enumerate(shapes):
                out = stage_cost(k, i, shape)
                try:
                    t, ok = out
                    t = float(t)
                except (TypeError, ValueError):
                    raise TypeError(f"plan_stages: stage_cost({k}, {i}, {shape}) must return "
                                    f"(seconds, memory_ok), got {out!r}") from None
                if np.isnan(t) or t < 0:
                    raise ValueError(f"plan_stages: stage_cost({k}, {i}, {shape}) returned "
                                     f"{t} seconds; stage times must be >= 0")
                if ok and np.isfinite(t):
                    cost[k, i, m] = t
                else:
                    refused += 1
    return (n_hosts, per_host), shapes, cost, refused


def _dp(cost, sizes, devices, tmax, num_stages):
    """F[t, s, k, d] for every t_max in ``tmax``: least sum of stage times for layers k.. on
    exactly d devices in s stages (s = 0 stands for "any number" when num_stages is None)."""
    L = cost.shape[0] - 1
    ns = 1 if num_stages is None else num_stages + 1
    F = np.full((len(tmax), ns, L + 1, devices + 1), np.inf)
    F[:, 0, L, 0] = 0.0
    dst = slice(0, 1) if num_stages is None else slice(1, ns)
    src = slice(0, 1) if num_stages is None else slice(0, ns - 1)
    for k in range(L - 1, -1, -1):
        for i in range(k + 1, L + 1):
            for m, n in enumerate(sizes):
                t = cost[k, i, m]
                if not np.isfinite(t) or n > devices:
                    continue
                ok = t <= tmax
                if not ok.any():
                    continue
                cand = t + F[ok, src, i, : devices + 1 - n]
                region = F[ok, dst, k, n:]
                F[ok, dst, k, n:] = np.minimum(region, cand)
    return F


def plan_stages(num_layers: int, mesh_shape: Sequence[int], stage_cost: StageCost, *,
                num_microbatches: int, submesh_shapes: Sequence[Sequence[int]] | None = None,
                num_stages: int | None = None) -> StagePlan:
    """Alpa's stage DP (see the module docstring).

    ``mesh_shape``: (hosts, devices per host). ``stage_cost(layer_start, layer_end,
    submesh_shape)`` returns ``(seconds, memory_ok)`` for layers ``layer_start`` (inclusive) to
    ``layer_end`` (exclusive) on a sub-mesh; it is called once per triple. ``submesh_shapes``
    defaults to Alpa's `submesh_choices`; the stages' devices add up to the mesh exactly.
    ``num_stages`` fixes the number of stages (default: the best number).

    Raises ValueError for a mesh too small for the requested stages, shapes that do not fit the
    mesh, and when no slicing is feasible (every candidate refused by memory or no combination
    covers the devices).
    """
    (n_hosts, per_host), shapes, cost, refused = _table(
        num_layers, mesh_shape, stage_cost, num_microbatches, submesh_shapes, num_stages)
    devices = n_hosts * per_host
    sizes = [a * b for a, b in shapes]
    B = int(num_microbatches)
    values = np.unique(cost[np.isfinite(cost)])
    s_final = 0 if num_stages is None else num_stages
    best, best_t = np.inf, None
    ns = 1 if num_stages is None else num_stages + 1
    chunk = max(1, 4_000_000 // (ns * (num_layers + 1) * (devices + 1)))
    for c0 in range(0, len(values), chunk):
        tmax = values[c0:c0 + chunk]
        if B * tmax[0] >= best:
            break  # every plan whose slowest stage is >= tmax[0] costs at least B * tmax[0]
        F = _dp(cost, sizes, devices, tmax, num_stages)
        total = F[:, s_final, 0, devices] + (B - 1) * tmax
        j = int(np.argmin(total))
        if total[j] < best:
            best, best_t = float(total[j]), float(tmax[j])
    if best_t is None:
        raise ValueError(
            f"plan_stages: no feasible slicing of {num_layers} layers onto the {n_hosts}x{per_host} "
            f"mesh ({devices} devices)"
            + (f" in {num_stages} stages" if num_stages else "")
            + f": stage_cost refused {refused} of the {num_layers * (num_layers + 1) // 2 * len(shapes)} "
            "(layers, sub-mesh) candidates (memory_ok "
            f"False or infinite time) and the rest cannot cover all {devices} devices. Allow more "
            "sub-mesh shapes, more stages or more memory.")
    # backtrack at the best t_max
    F = _dp(cost, sizes, devices, np.array([best_t]), num_stages)[0]
    picks = []
    s, k, d = s_final, 0, devices
    while k < num_layers:
        found = None
        for i in range(k + 1, num_layers + 1):
            for m, n in enumerate(sizes):
                t = cost[k, i, m]
                if n > d or not t <= best_t:
                    continue
                prev = F[0 if num_stages is None else s - 1, i, d - n]
                if np.isfinite(prev) and np.isclose(t + prev, F[s, k, d], rtol=1e-12, atol=0):
                    found = (i, m)
                    break
            if found:
                break
        assert found is not None, "stage DP backtracking failed"
        i, m = found
        picks.append((k, i, shapes[m], float(cost[k, i, m])))
        k, d = i, d - sizes[m]
        s = s if num_stages is None else s - 1
    return _make_plan(picks, B, (n_hosts, per_host))


def _make_plan(picks, B, mesh_shape) -> StagePlan:
    places = _place(mesh_shape, [p[2] for p in picks])
    stages = tuple(Stage(k, i, shape, t, *(places[j] if places else (None, None)))
                   for j, (k, i, shape, t) in enumerate(picks))
    times = [p[3] for p in picks]
    return StagePlan(stages, float(sum(times) + (B - 1) * max(times)), B, mesh_shape)


def _place(mesh_shape, shapes):
    """Rectangles of the mesh for the sub-meshes: largest first, each at the first free
    position in row-major order. None when that greedy packing fails."""
    n_hosts, per_host = mesh_shape
    free = np.ones(mesh_shape, dtype=bool)
    out = [None] * len(shapes)
    for j in sorted(range(len(shapes)), key=lambda j: (-shapes[j][0] * shapes[j][1], -shapes[j][1], j)):
        a, b = shapes[j]
        spot = next(((r, c) for r in range(n_hosts - a + 1) for c in range(per_host - b + 1)
                     if free[r:r + a, c:c + b].all()), None)
        if spot is None:
            return None
        r, c = spot
        free[r:r + a, c:c + b] = False
        out[j] = (range(r, r + a), range(c, c + b))
    return out


def brute_force_stages(num_layers: int, mesh_shape: Sequence[int], stage_cost: StageCost, *,
                       num_microbatches: int, submesh_shapes=None, num_stages=None,
                       max_plans: int = 1_000_000) -> StagePlan:
    """Every cut of the layers into stages and every sub-mesh per stage that covers the devices
    exactly: the reference plan_stages is tested against (small inputs only)."""
    (n_hosts, per_host), shapes, cost, _ = _table(
        num_layers, mesh_shape, stage_cost, num_microbatches, submesh_shapes, num_stages)
    devices = n_hosts * per_host
    B = int(num_microbatches)
    best, best_picks, seen = np.inf, None, 0
    for r in range(num_layers):
        if num_stages is not None and r + 1 != num_stages:
            continue
        for cuts in itertools.combinations(range(1, num_layers), r):
            bounds = (0,) + cuts + (num_layers,)
            for ms in itertools.product(range(len(shapes)), repeat=r + 1):
                seen += 1
                if seen > max_plans:
                    raise ValueError(f"brute_force_stages: more than {max_plans} plans; use plan_stages")
                if sum(shapes[m][0] * shapes[m][1] for m in ms) != devices:
                    continue
                ts = [cost[bounds[j], bounds[j + 1], m] for j, m in enumerate(ms)]
                if not all(np.isfinite(ts)):
                    continue
                total = sum(ts) + (B - 1) * max(ts)
                if total < best:
                    best = total
                    best_picks = [(bounds[j], bounds[j + 1], shapes[m], float(ts[j]))
                                  for j, m in enumerate(ms)]
    if best_picks is None:
        raise ValueError("brute_force_stages: no feasible slicing")
    return _make_plan(best_picks, B, (n_hosts, per_host))

