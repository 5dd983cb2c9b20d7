"""Collective costs: the book's formulas and the link-level model of one collective on a mesh.

Two estimates are kept apart so the approximations show:
  * ``book_*`` - the hand formulas of "How to Scale Your Model", part 3 (V / W_bidi per axis,
    AllReduce = 2 AllGather, AllToAll = 1/4 AllGather, latency = hops x 1 us, ...);
  * ``seconds`` - the link-level model: the ring / torus algorithm scheduled step by step on the
    preset's links (wraparound or not), the busiest link's counted bytes over its bandwidth,
    with the latency floor of hops x per-hop latency, T = max(latency, bandwidth);
and ``schedule(...)`` gives the per-link byte counts themselves.

Example:
    >>> from shardlab import cost
    >>> t = cost.all_gather_time((2048, 8192), "bfloat16", ("Y", None),
    ...                          mesh_shape={"X": 8, "Y": 4}, hardware="tpu-v5e")
    >>> round(t.book_seconds * 1e6), round(t.seconds * 1e6)   # a v5e axis of 4 has no wraparound
    (373, 559)
"""

from __future__ import annotations

import dataclasses
import html
import math

import numpy as np

import shardlab._core as _core
from ..core import hardware as _hw
from ..core import memory, units, views
from . import formulas
from .layout import _check_shape, _local_dims, _mesh_shape, _spec_entries, itemsize, shard_bytes

__all__ = ["CollectiveCost", "schedule", "collective_time", "all_gather_time", "reduce_scatter_time",
           "all_reduce_time", "psum_time", "all_to_all_time", "ppermute_time", "neighbour_shift", "COLLECTIVES"]

#: Every collective op name the cost functions accept: JAX's names and the book's.
COLLECTIVES = frozenset(formulas.COLLECTIVES) | frozenset(formulas.BOOK_NAMES.values())
_COLLECTIVES = COLLECTIVES


@dataclasses.dataclass(frozen=True, repr=False)
class CollectiveCost(views.Viewable):
    """Estimated time of one collective.

    Attributes:
        op: collective name.
        axes: mesh axes it runs over; group_size: devices per group.
        bytes: V, the array the collective works on in one group (see docs/cost_model.md).
        seconds / bandwidth_seconds / latency_seconds: the link-level model.
        hops: hops on the critical path; bound: "latency" or "bandwidth".
        book_seconds (+ _bandwidth / _latency): the book's hand formula, None where it has none.
        links: the physical links used; axis_link_bytes: bytes on each one's busiest link.
        plan: how a multi-axis collective was split.
    """

    op: str
    axes: tuple[str, ...]
    group_size: int
    bytes: float
    seconds: float
    bandwidth_seconds: float
    latency_seconds: float
    hops: int
    bound: str
    plan: str
    links: tuple
    axis_link_bytes: tuple[float, ...]
    book_seconds: float | None
    book_bandwidth_seconds: float | None
    book_latency_seconds: float | None

    @property
    def book_error(self) -> float | None:
        """book_seconds / seconds - 1: how far the hand formula is from the link-level model."""
        if self.book_seconds is None or self.seconds == 0:
            return None
        return self.book_seconds / self.seconds - 1

    def _repr_html_(self) -> str:
        view = views.html_view(self)
        return view if view is not None else f"<code>{html.escape(str(self))}</code>"

    def __str__(self) -> str:
        book = "n/a" if self.book_seconds is None else units.fmt_seconds(self.book_seconds)
        return (f"{self.op} over {self.axes} (n={self.group_size}, V={units.fmt_bytes(self.bytes)}): "
                f"{units.fmt_seconds(self.seconds)} ({self.bound}-bound, {self.hops} hops); book {book}")

    def __repr__(self) -> str:
        return f"<CollectiveCost {self}>"


def schedule(op: str, size: int, topology: str, nbytes: float, *, perm=None, root: int = 0):
    """Runs one collective step by step on one axis and counts the bytes on every link.

    Args:
        op: all_gather, reduce_scatter, all_reduce, all_to_all, ppermute, broadcast, reduce,
            gather or scatter (JAX names like psum are accepted).
        size: devices on the axis; topology: "ring", "uni_ring", "line" or "switch".
        nbytes: V (for an N x N array of scalars pass N*N to count scalars).

    Returns:
        An AxisSchedule with ``steps``, ``links`` (src, dst, bytes per directed link),
        ``max_link_bytes``, ``total_link_bytes`` and ``step_max_bytes``.

    Example:
        >>> s = schedule("all_gather", 4, "uni_ring", 16 * 16)   # problem 10: N^2 (1 - 1/D)
        >>> s.max_link_bytes
        192.0
    """
    if nbytes < 0:
        raise ValueError(f"[{op}] bytes {nbytes} must be >= 0")
    return _core.schedule_axis(op, int(size), topology, float(nbytes), list(perm or []), int(root))


_SCHEDULED: dict = {}
_ONE_AXIS: dict = {}


class _Scaled:
    """A bandwidth-bound link-level result of one axis scaled to a larger V (every stage stays
    bandwidth-bound, so the time is the bandwidth term, which scales with V)."""

    __slots__ = ("seconds", "bandwidth_seconds", "latency_seconds", "hops", "plan", "axis_link_bytes")

    def __init__(self, ref, factor: float):
        self.bandwidth_seconds = ref.bandwidth_seconds * factor
        self.latency_seconds = ref.latency_seconds
        self.seconds = self.bandwidth_seconds
        self.hops, self.plan = ref.hops, ref.plan
        self.axis_link_bytes = [b * factor for b in ref.axis_link_bytes]


def _link_level(op: str, nbytes: float, core_axes: list, perm):
    """The core's link-level model. On a single axis without a custom perm the schedule is fixed
    and every stage's bytes scale with V: once a call is bandwidth-bound in every stage
    (seconds == bandwidth seconds), any larger V is that result scaled (exact), so a long axis is
    scheduled once per (op, axis) instead of once per size."""
    if len(core_axes) != 1 or perm or nbytes <= 0:
        return _core.collective_time(op, nbytes, core_axes, list(perm or []))
    key = (op, tuple(core_axes))
    ref = _ONE_AXIS.get(key)
    if ref is not None and nbytes >= ref[0]:
        return ref[1] if nbytes == ref[0] else _Scaled(ref[1], nbytes / ref[0])
    res = _core.collective_time(op, nbytes, core_axes, [])
    if res.bandwidth_seconds > 0 and abs(res.seconds - res.bandwidth_seconds) <= 1e-12 * res.seconds:
        _ONE_AXIS[key] = (nbytes, res)
    return res


def collective_time(op: str, nbytes: float, *, axes, mesh_shape=None, hardware=None, mesh=None,
                    physical_axes=None, topology=None, perm=None) -> CollectiveCost:
    """Time of ``op`` moving V = ``nbytes`` over mesh ``axes``.

    Args:
        op: collective name (psum, all_gather, psum_scatter, all_to_all, ppermute, ...).
        nbytes: V as defined in docs/cost_model.md (AllGather: the gathered array of one group).
        axes: mesh axis name or tuple of names.
        mesh_shape / hardware / physical_axes: the machine, or ``mesh=`` carrying them.
        topology: force torus axes to "ring", "uni_ring" or "line".
        perm: (source, destination) pairs for ppermute; default: the neighbour shift
            (see ``neighbour_shift``), one hop on every topology.

    Raises:
        ValueError: an unknown axis, bad bytes, or an axis so long that scheduling it link by
            link would take minutes.
        MemoryError: the link-level schedule would not fit in this machine's memory.

    Example:
        >>> t = collective_time("all_gather", 34e6, axes="Y", mesh_shape={"X": 16, "Y": 16},
        ...                     hardware="tpu-v5e")
        >>> round(t.book_seconds * 1e6)   # V / W_bidi
        378
    """
    if not isinstance(op, str) or op not in _COLLECTIVES:
        raise ValueError(f"[collective_time] unknown collective {op!r}; use one of {', '.join(sorted(_COLLECTIVES))}")
    if perm is not None:
        perm = _check_perm(op, perm)
    if mesh is not None:
        hardware = hardware if hardware is not None else getattr(mesh, "hardware", None)
        physical_axes = physical_axes if physical_axes is not None else getattr(mesh, "physical_axes", None)
    mshape = _mesh_shape(op, mesh_shape, mesh)
    axes_t = (axes,) if isinstance(axes, str) else tuple(axes)
    if not isinstance(nbytes, (int, float, np.integer, np.floating)) or not nbytes >= 0 or not math.isfinite(nbytes):
        raise ValueError(f"[{op}] bytes {nbytes!r} must be a finite number >= 0")
    if len(set(axes_t)) != len(axes_t):
        raise ValueError(f"[{op}] axes {axes_t} repeat a mesh axis")
    links = _hw.axis_links(hardware, mshape, axes_t, physical_axes, topology=topology)
    _check_schedule_size(op, links, perm)
    if op == "ppermute" and perm is None:
        perm = neighbour_shift([mshape[a] for a in axes_t])
    core_axes = [link.as_core() for link in links]
    key = (op, float(nbytes), tuple(core_axes), tuple(map(tuple, perm or ())))
    hit = _SCHEDULED.get(key)
    if hit is None:  # the link-level schedule of a long axis costs milliseconds: once per distinct call
        hit = (_link_level(op, float(nbytes), core_axes, perm), _core.book_collective_time(op, float(nbytes), core_axes))
        if len(_SCHEDULED) > 100_000:
            _SCHEDULED.clear()
        _SCHEDULED[key] = hit
    lt, bt = hit
    bound = "latency" if lt.latency_seconds > lt.bandwidth_seconds else "bandwidth"
    return CollectiveCost(
        op=op, axes=axes_t, group_size=math.prod(mshape[a] for a in axes_t), bytes=float(nbytes),
        seconds=lt.seconds, bandwidth_seconds=lt.bandwidth_seconds, latency_seconds=lt.latency_seconds,
        hops=lt.hops, bound=bound, plan=lt.plan, links=tuple(links), axis_link_bytes=tuple(lt.axis_link_bytes),
        book_seconds=bt.seconds if bt.available else None,
        book_bandwidth_seconds=bt.bandwidth_seconds if bt.available else None,
        book_latency_seconds=bt.latency_seconds if bt.available else None)


def _check_perm(op: str, perm) -> list[tuple[int, int]]:
    """`perm` as a list of (source, destination) int pairs, or a TypeError naming it."""
    try:
        pairs = [tuple(p) for p in perm]
        ok = all(len(p) == 2 and all(not isinstance(i, bool) and isinstance(i, (int, np.integer)) for i in p)
                 for p in pairs)
    except TypeError:
        ok = False
    if not ok or isinstance(perm, (str, bytes)):
        raise TypeError(f"[{op}] perm must be a sequence of (source, destination) int pairs, got {perm!r}")
    for p in pairs:
        if not all(0 <= i < 2**62 for i in p):
            raise ValueError(f"[{op}] perm pair {p} has an index outside the axis")
    return [(int(a), int(b)) for a, b in pairs]


def neighbour_shift(axis_sizes) -> list[tuple[int, int]]:
    """The default ppermute of the cost functions: device i sends to device i + 1 along the
    minor axis, without wrapping round (the last device of each row sends nothing).

    Every pair is one hop apart on a ring, a line (an axis without wraparound, e.g. a TPU
    v5e axis of 4) and a switch, so "a ppermute" costs one hop wherever it runs. For a cyclic
    shift pass ``perm=[(i, (i + 1) % n) for i in range(n)]``: without wraparound its last
    pair crosses the whole axis.

    Args:
        axis_sizes: sizes of the axes the ppermute runs over, major to minor (indices are
            flattened major-to-minor, as ``lax.ppermute`` flattens a tuple of axis names).

    Example:
        >>> neighbour_shift([4])
        [(0, 1), (1, 2), (2, 3)]
        >>> neighbour_shift([2, 2])
        [(0, 1), (2, 3)]
    """
    sizes = [int(n) for n in axis_sizes]
    minor, total = (sizes[-1] if sizes else 1), math.prod(sizes)
    return [(i, i + 1) for i in range(total) if (i + 1) % minor]


# The link-level model walks every path hop by hop: about n^2 hop visits for a ring
# AllGather on an axis of n, n^3 for an AllToAll. Past this many it would run for minutes.
_MAX_HOP_VISITS = 1e9
_PATH_BYTES = 64  # one scheduled path in the core (start, direction, hops, bytes, step)


def _check_schedule_size(op: str, links, perm) -> None:
    """Raises before the link-level model is asked to schedule an axis too long for this
    machine's memory (MemoryError) or for a reply within seconds (ValueError)."""
    base = {"psum": "all_reduce", "pmean": "all_reduce", "pmax": "all_reduce", "pmin": "all_reduce",
            "psum_scatter": "reduce_scatter"}.get(op, op)
    paths = visits = 0.0
    for link in links:
        n = float(link.size)
        if n <= 1:
            continue
        hop = 1.0 if link.topology == "switch" else n  # hops of one routed message, at most
        if base == "all_to_all":
            p, v = 2 * n * n, n * n * hop / 2
        elif base == "ppermute":
            k = len(perm) if perm else n
            p, v = 2 * k, k * hop
        elif base in ("gather", "scatter"):
            p, v = 2 * n, n * hop
        else:  # ring all_gather / reduce_scatter / all_reduce / broadcast / reduce
            p, v = 4 * n, 2 * n * n
        paths, visits = max(paths, p), visits + v
    sizes = tuple(link.size for link in links)
    memory.check_alloc(op, paths * _PATH_BYTES + 32 * sum(sizes),
                       f"the link-level model schedules every device of axes of sizes {sizes}; "
                       f"use the book's formula (shardlab.cost.formulas) at this scale")
    if visits > _MAX_HOP_VISITS:
        raise ValueError(f"[{op}] axes of sizes {sizes} are too long for the link-level model (about "
                         f"{visits:.2g} hop visits); no real interconnect axis is this long: split it "
                         f"over more mesh axes, or use the book's formula (shardlab.cost.formulas)")



def _group_bytes(op, shape, dtype, spec, mshape, axes, *, axes_must_shard: bool) -> tuple[float, tuple[str, ...]]:
    dims = _check_shape(op, shape)
    entries = _spec_entries(op, spec, len(dims))
    spec_axes = [a for e in entries for a in e]
    _local_dims(op, dims, entries, mshape)
    if axes is None:
        if not axes_must_shard:
            raise ValueError(f"[{op}] pass axes=... (the mesh axes to reduce over)")
        axes_t = tuple(spec_axes)
    else:
        axes_t = (axes,) if isinstance(axes, str) else tuple(axes)
    for a in axes_t:
        if a not in mshape:
            raise ValueError(f"[{op}] axis {a!r} is not in the mesh axes {tuple(mshape)}")
        if axes_must_shard and a not in spec_axes:
            raise ValueError(f"[{op}] axis {a!r} does not shard the array (spec {tuple(spec or ())}); "
                             f"an AllGather or AllToAll runs over axes that appear in the spec")
        if not axes_must_shard and a in spec_axes:
            raise ValueError(f"[{op}] axis {a!r} already shards the array (spec {tuple(spec or ())}); "
                             f"reduce over an axis the array is unreduced along")
    other = math.prod(mshape[a] for a in spec_axes if a not in axes_t)
    return math.prod(dims) * itemsize(dtype) / other, axes_t


def _group_collective_time(op, shape, dtype, spec, axes, axes_must_shard, mesh_shape, hardware, mesh,
                           physical_axes, topology) -> CollectiveCost:
    """The what-if functions' shared body: the group's bytes V from the spec, then the time."""
    mshape = _mesh_shape(op, mesh_shape, mesh)
    v, axes_t = _group_bytes(op, shape, dtype, spec, mshape, axes, axes_must_shard=axes_must_shard)
    return collective_time(op, v, axes=axes_t, mesh_shape=mshape, hardware=hardware, mesh=mesh,
                           physical_axes=physical_axes, topology=topology)


def all_gather_time(shape, dtype, spec=None, *, mesh_shape=None, hardware=None, mesh=None, axes=None,
                    physical_axes=None, topology=None) -> CollectiveCost:
    """AllGather of a global ``shape``/``dtype`` array sharded as ``spec``, over ``axes``.

    ``axes`` defaults to every mesh axis in ``spec``; V is the array divided by the axes that
    stay sharded (AllGather_X([B_X, D_Y]) gathers 2BD/|Y| bytes per group).

    Example:
        >>> t = all_gather_time((1024, 4096), "bfloat16", ("X", "Y"), axes="X",
        ...                     mesh_shape={"X": 4, "Y": 4, "Z": 4}, hardware="tpu-v4p")
        >>> round(t.book_seconds * 1e6, 1)
        23.3
    """
    return _group_collective_time("all_gather", shape, dtype, spec, axes, True, mesh_shape, hardware, mesh,
                                  physical_axes, topology)


def reduce_scatter_time(shape, dtype, spec=None, *, axes, mesh_shape=None, hardware=None, mesh=None,
                        physical_axes=None, topology=None) -> CollectiveCost:
    """ReduceScatter over ``axes`` of an array unreduced along them, sharded as ``spec`` elsewhere."""
    return _group_collective_time("reduce_scatter", shape, dtype, spec, axes, False, mesh_shape, hardware, mesh,
                                  physical_axes, topology)


def all_reduce_time(shape, dtype, spec=None, *, axes, mesh_shape=None, hardware=None, mesh=None,
                    physical_axes=None, topology=None) -> CollectiveCost:
    """AllReduce (psum) over ``axes`` of an array unreduced along them (AllReduce_Z([B_X, D_Y]{U_Z})).

    Example:
        >>> t = all_reduce_time((1024, 4096), "bfloat16", ("X", "Y"), axes="Z",
        ...                     mesh_shape={"X": 4, "Y": 4, "Z": 4}, hardware="tpu-v4p")
        >>> round(t.book_seconds * 1e6, 1)
        11.7
    """
    return _group_collective_time("all_reduce", shape, dtype, spec, axes, False, mesh_shape, hardware, mesh,
                                  physical_axes, topology)


psum_time = all_reduce_time


def all_to_all_time(shape, dtype, spec=None, *, mesh_shape=None, hardware=None, mesh=None, axes=None,
                    physical_axes=None, topology=None) -> CollectiveCost:
    """AllToAll over ``axes`` (default: the spec's axes) of an array sharded as ``spec``.

    V is the whole array of one group; the book's 1-D form is V / (4 W_bidi).
    """
    return _group_collective_time("all_to_all", shape, dtype, spec, axes, True, mesh_shape, hardware, mesh,
                                  physical_axes, topology)


def ppermute_time(shape, dtype, spec=None, *, axes, mesh_shape=None, hardware=None, mesh=None, perm=None,
                  physical_axes=None, topology=None) -> CollectiveCost:
    """ppermute of each device's shard over ``axes``.

    ``perm`` defaults to the neighbour shift (device i sends to i + 1, no wraparound; see
    ``neighbour_shift``): one hop on a ring, a line or a switch. A cyclic shift on an axis
    without wraparound (a TPU v5e axis of 4) costs n - 1 hops; pass it explicitly.

    Example:
        >>> t = ppermute_time((1024, 1024), "float32", ("X", None), axes="X", mesh_shape={"X": 4},
        ...                   hardware="tpu-v5e")
        >>> t.hops, t.links[0].topology
        (1, 'line')
    """
    mshape = _mesh_shape("ppermute", mesh_shape, mesh)
    local = shard_bytes(shape, dtype, spec, mesh_shape=mshape)
    return collective_time("ppermute", local.bytes_per_device, axes=axes, mesh_shape=mshape, hardware=hardware,
                           mesh=mesh, physical_axes=physical_axes, topology=topology, perm=perm)

