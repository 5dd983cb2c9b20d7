"""Collective and compute time estimates: the book's formulas, exact forms and link-level counts.

Three estimates are kept apart so the approximations show:
  * ``book_*`` - the hand formulas of "How to Scale Your Model", part 3 (V / W_bidi per axis,
    AllReduce = 2 AllGather, AllToAll = 1/4 AllGather, latency = hops x 1 us, ...);
  * ``seconds`` - the link-level model: the ring / torus algorithm scheduled step by step on the
    preset's links (wraparound or not), the busiest link's counted bytes over its bandwidth,
    with the latency floor of hops x per-hop latency, T = max(latency, bandwidth);
  * ``schedule(...)`` - the per-link byte counts themselves.

Every function takes plain shapes, dtypes and specs, so what-if questions need no data.

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
from collections.abc import Mapping, Sequence

import ml_dtypes
import numpy as np

import shardlab._core as _core
from ..core import hardware as _hw
from ..core import memory, units, views
from ..core.einsum_spec import parse
from . import formulas

__all__ = [
    "CollectiveCost",
    "ShardBytes",
    "MatmulCost",
    "Roofline",
    "schedule",
    "collective_time",
    "all_gather_time",
    "reduce_scatter_time",
    "all_reduce_time",
    "psum_time",
    "all_to_all_time",
    "ppermute_time",
    "neighbour_shift",
    "hbm_load_time",
    "shard_bytes",
    "itemsize",
    "peak_flops",
    "matmul_flops",
    "einsum_flops",
    "attention_flops",
    "matmul_time",
    "critical_batch_size",
    "ici_critical_intensity",
    "event_seconds",
    "roofline",
]

_COLLECTIVES = set(formulas.COLLECTIVES) | set(formulas.BOOK_NAMES.values())  # JAX's names and the book's
_COMPUTE = set(formulas.COMPUTE)


# --------------------------------------------------------------------------------------------
# dtypes, specs and bytes


def _np_dtype(dtype) -> np.dtype:
    if isinstance(dtype, str) and dtype.startswith(("bfloat16", "float8")):
        name = {"float8": "float8_e4m3fn"}.get(dtype, dtype)
        return np.dtype(getattr(ml_dtypes, name))
    try:
        return np.dtype(dtype)
    except TypeError:
        raise ValueError(f"[cost] unknown dtype {dtype!r}: use e.g. 'float32', 'bfloat16', 'int8'") from None


def _require_hw(op: str, hardware):
    """The Hardware for `hardware` (a preset name or Hardware); None is an error naming `op`."""
    hw = _hw.get(hardware)
    if hw is None:
        raise ValueError(f"[{op}] hardware=None: pass a preset name such as hardware='tpu-v5e' (shardlab.hardware."
                         f"names() lists them) or a custom chip, shardlab.hardware.Hardware(...)")
    return hw


def itemsize(dtype) -> int:
    """Bytes per element of ``dtype`` ("bfloat16" is 2, "float32" 4, "int8" 1)."""
    return _np_dtype(dtype).itemsize


def _dtype_name(dtype) -> str:
    return _np_dtype(dtype).name


def _check_shape(op: str, shape) -> tuple[int, ...]:
    if isinstance(shape, (str, bytes)) or not isinstance(shape, (tuple, list)) or \
            any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) for d in shape):
        raise ValueError(f"[{op}] shape {shape!r} must be a sequence of ints")
    dims = tuple(int(d) for d in shape)
    for d in dims:
        if d < 0:
            raise ValueError(f"[{op}] shape {dims} has a negative dimension {d}; sizes must be >= 0")
    return dims


def _spec_entries(op: str, spec, rank: int) -> list[tuple[str, ...]]:
    if spec is None:
        spec = ()
    if isinstance(spec, (str, bytes)) or not isinstance(spec, (tuple, list)):
        raise TypeError(f"[{op}] spec must be a PartitionSpec or a tuple of entries (None, an axis name or a "
                        f"tuple of names), got {spec!r}")
    entries = list(spec)
    if len(entries) > rank:
        raise ValueError(f"[{op}] spec {tuple(spec)} has {len(entries)} entries for an array of rank {rank}")
    out = []
    for e in entries + [None] * (rank - len(entries)):
        if e is None:
            out.append(())
        elif isinstance(e, str):
            out.append((e,))
        elif isinstance(e, (tuple, list)) and all(isinstance(a, str) for a in e):
            out.append(tuple(e))
        else:
            raise TypeError(f"[{op}] spec entry {e!r} must be None, an axis name or a tuple of names")
    seen: set[str] = set()
    for e in out:
        for a in e:
            if a in seen:
                raise ValueError(f"[{op}] mesh axis {a!r} appears twice in spec {tuple(spec)}")
            seen.add(a)
    return out


def _mesh_shape(op: str, mesh_shape=None, mesh=None) -> dict[str, int]:
    if mesh is not None:
        mesh_shape = mesh.shape
    if mesh_shape is None:
        raise ValueError(f"[{op}] pass mesh_shape={{'X': 8, ...}} or mesh=...")
    try:
        items = dict(mesh_shape).items()
    except (TypeError, ValueError):
        raise TypeError(f"[{op}] mesh_shape must be a dict from axis name to size, got {mesh_shape!r}") from None
    for k, v in items:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"[{op}] mesh axis {k!r} has size {v!r}; sizes must be ints")
    shape = {str(k): int(v) for k, v in items}
    for k, v in shape.items():
        if v < 1:
            raise ValueError(f"[{op}] mesh axis {k!r} has size {v}; sizes must be >= 1")
    return shape


@dataclasses.dataclass(frozen=True)
class ShardBytes:
    """How an array is laid out: local shape, bytes per device and over all devices."""

    local_shape: tuple[int, ...]
    bytes_per_device: int
    total_bytes: int  # summed over every device of the mesh (replicas counted)
    array_bytes: int  # one copy of the global array
    replication: int  # devices holding each element


def shard_bytes(shape, dtype, spec=None, *, mesh_shape=None, mesh=None) -> ShardBytes:
    """Local shape and bytes of ``shape``/``dtype`` sharded as ``spec`` over the mesh.

    An unsharded array (no ``spec``, or a spec of Nones) needs no mesh: it is priced as one
    device holding all of it.

    Example:
        >>> shard_bytes((1024, 1024), "bfloat16").bytes_per_device
        2097152
        >>> shard_bytes((128, 2048), "int8", (("X", "Y"), None), mesh_shape={"X": 2, "Y": 8, "Z": 2})
        ShardBytes(local_shape=(8, 2048), bytes_per_device=16384, total_bytes=524288, array_bytes=262144, replication=2)
    """
    dims = _check_shape("shard_bytes", shape)
    entries = _spec_entries("shard_bytes", spec, len(dims))
    if mesh is None and mesh_shape is None and not any(entries):
        mesh_shape = {}  # an unsharded array needs no mesh: one device holds all of it
    mshape = _mesh_shape("shard_bytes", mesh_shape, mesh)
    local = _local_dims("shard_bytes", dims, entries, mshape)
    n_dev = math.prod(mshape.values())
    per = math.prod(local) * itemsize(dtype)
    used = {a for e in entries for a in e}
    return ShardBytes(tuple(local), per, per * n_dev, math.prod(dims) * itemsize(dtype),
                      math.prod(v for k, v in mshape.items() if k not in used))


# --------------------------------------------------------------------------------------------
# collectives


@dataclasses.dataclass(frozen=True)
class CollectiveCost:
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
    lt = _core.collective_time(op, float(nbytes), core_axes, list(perm or []))
    bt = _core.book_collective_time(op, float(nbytes), core_axes)
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


def _local_dims(op: str, dims, entries, mshape: dict) -> list[int]:
    """Each dim's size on one device under spec `entries` over a mesh of axis sizes `mshape`;
    ValueError for an axis the mesh lacks or a dim its axes do not divide."""
    local = []
    for d, e in zip(dims, entries):
        for a in e:
            if a not in mshape:
                raise ValueError(f"[{op}] spec axis {a!r} is not in the mesh axes {tuple(mshape)}")
        k = math.prod(mshape[a] for a in e)
        if d % k:
            raise ValueError(f"[{op}] dimension of size {d} is not divisible by {k} (axes {e})")
        local.append(d // k)
    return local


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


# --------------------------------------------------------------------------------------------
# compute


def hbm_load_time(nbytes: float, hardware) -> float:
    """Seconds to read ``nbytes`` from HBM once at the chip's HBM bandwidth (``nbytes / W_hbm``).

    Example:
        >>> from shardlab import hardware
        >>> chip = hardware.get("tpu-v5e").replace(hbm_bandwidth=3.4e12)   # the quiz's custom chip
        >>> round(hbm_load_time(2 * 13e9, chip) * 1e3, 2)                  # 13B bf16 parameters, ms
        7.65
    """
    hw = _require_hw("hbm_load_time", hardware)
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float, np.integer, np.floating)) \
            or not nbytes >= 0 or not math.isfinite(nbytes):
        raise ValueError(f"[hbm_load_time] nbytes {nbytes!r} must be a finite number >= 0")
    return float(nbytes) / hw.hbm_bandwidth


def peak_flops(hardware, dtype) -> tuple[float, str | None]:
    """Peak FLOP/s for a matmul in ``dtype`` and a note when a stand-in figure is used.

    bf16-class types (bfloat16, float16) use the bf16 figure; float8 types the fp8 figure.
    When the vendor publishes no figure for the dtype (fp32 on TPUs, float64 everywhere) the
    bf16 peak is used and the note says so.
    """
    hw = _require_hw("peak_flops", hardware)
    name = _dtype_name(dtype) if not isinstance(dtype, str) or not dtype.startswith("float8") else "float8"
    key = {"float16": "bfloat16", "uint8": "int8"}.get(name, name)
    if key.startswith("float8"):
        key = "float8"
    if hw.has_peak(key):
        return hw.peak(key), None
    return hw.peak("bfloat16"), f"{hw.name} publishes no {name} matmul peak; priced at the bf16 peak"


def matmul_flops(m: int, k: int, n: int, *, batch: int = 1) -> int:
    """2 x batch x m x k x n: one multiply and one add per term."""
    for name, v in (("m", m), ("k", k), ("n", n), ("batch", batch)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"[matmul_flops] {name}={v!r} must be an int")
        if v < 0:
            raise ValueError(f"[matmul_flops] {name}={v} must be >= 0")
    return 2 * batch * m * k * n


def einsum_flops(subscripts: str, *shapes) -> int:
    """2 x the product of every distinct index size (``einsum_flops("bd,df->bf", (B, D), (D, F))``)."""
    dims = [_check_shape("einsum_flops", shape) for shape in shapes]
    terms, _ = parse(subscripts, dims, "einsum_flops")
    sizes = {c: d for t, shape in zip(terms, dims) for c, d in zip(t, shape)}
    return formulas.einsum_flops(sizes)


def attention_flops(batch: int, q_len: int, kv_len: int, heads: int, head_dim: int, *, causal: bool = False) -> float:
    """FLOPs of softmax(Q K^T) V: 4 B T S H D (two matmuls), halved when causal."""
    for name, v in (("batch", batch), ("q_len", q_len), ("kv_len", kv_len), ("heads", heads), ("head_dim", head_dim)):
        if v < 0:
            raise ValueError(f"[attention_flops] {name}={v} must be >= 0")
    f = 4.0 * batch * q_len * kv_len * heads * head_dim
    return f / 2 if causal else f


@dataclasses.dataclass(frozen=True)
class MatmulCost:
    flops: float
    hbm_bytes: float
    t_math: float
    t_hbm: float
    seconds: float  # max(t_math, t_hbm)
    arithmetic_intensity: float
    critical_intensity: float
    bound: str  # "compute" or "memory"


def matmul_time(m: int, k: int, n: int, dtype="bfloat16", *, hardware, batch: int = 1,
                out_dtype=None) -> MatmulCost:
    """Roofline of one [m, k] x [k, n] matmul on one chip: FLOPs over peak vs bytes over HBM.

    HBM bytes are the two inputs read and the output written once.

    Example:
        >>> c = matmul_time(512, 4096, 8192, "bfloat16", hardware="b200")
        >>> round(c.t_math * 1e6, 1), c.bound
        (15.3, 'compute')
    """
    flops = matmul_flops(m, k, n, batch=batch)
    size = itemsize(dtype)
    hbm = batch * (m * k + k * n) * size + batch * m * n * itemsize(out_dtype or dtype)
    hw = _require_hw("matmul_time", hardware)
    peak, _ = peak_flops(hw, dtype)
    t_math, t_hbm = flops / peak, hbm / hw.hbm_bandwidth
    return MatmulCost(flops, hbm, t_math, t_hbm, max(t_math, t_hbm), flops / hbm if hbm else math.inf,
                      peak / hw.hbm_bandwidth, "compute" if t_math >= t_hbm else "memory")


def critical_batch_size(hardware, dtype="bfloat16", *, weight_dtype=None) -> float:
    """Tokens per device above which a weight-streaming matmul is compute-bound: peak / HBM BW.

    With weights stored in a narrower ``weight_dtype`` the threshold falls in proportion
    (int8 weights with bf16 math halve it).

    Example:
        >>> round(critical_batch_size("tpu-v5e"))
        240
    """
    hw = _require_hw("critical_batch_size", hardware)
    peak, _ = peak_flops(hw, dtype)
    scale = itemsize(weight_dtype) / itemsize("bfloat16") if weight_dtype is not None else itemsize(dtype) / 2
    return peak / hw.hbm_bandwidth * scale


def ici_critical_intensity(hardware, dtype="bfloat16") -> float:
    """Peak FLOP/s over bidirectional ICI bandwidth of one axis (2550 on TPU v5p in bf16)."""
    hw = _require_hw("ici_critical_intensity", hardware)
    if hw.family != "tpu":
        raise ValueError(f"[cost] {hw.name} has no ICI; use the NVLink bandwidth ({hw.nvlink_bandwidth:.3g} B/s)")
    return peak_flops(hw, dtype)[0] / (2 * hw.ici_link_bandwidth)


# --------------------------------------------------------------------------------------------
# ledger events


def _event_group_bytes(event: Mapping) -> float:
    return formulas.group_bytes(event["op"], int(event.get("group_size") or 1),
                                float(event.get("bytes_in") or 0), float(event.get("bytes_out") or 0))


def _mesh_parts(mesh):
    shape = dict(mesh.shape)
    return shape, _hw.get(getattr(mesh, "hardware", None)), getattr(mesh, "physical_axes", None)


def event_seconds(event: Mapping, mesh) -> float:
    """Estimated seconds of one ledger event on ``mesh.hardware``.

    Collectives use the link-level model (collective_time) on V derived from the event's
    per-device bytes; compute events use max(flops / peak, hbm_bytes / HBM bandwidth).

    Raises:
        ValueError: the mesh has no hardware, the op is unknown, or a field the estimate needs
            (bytes_in and bytes_out of a collective, flops of a compute event) is missing.
    """
    op = event.get("op")
    if not isinstance(op, str):
        raise ValueError(f"[event_seconds] the event's op is {op!r}; pass a ledger event (Ledger.to_dicts())")
    shape, hw, physical = _mesh_parts(mesh)
    if hw is None:
        raise ValueError(f"[{op}] the mesh has no hardware: make_mesh(..., hardware='tpu-v5e')")
    needed = ("flops",) if op in _COMPUTE else ("bytes_in", "bytes_out") if op in _COLLECTIVES else ()
    missing = [k for k in needed if event.get(k) is None]
    if missing:
        raise ValueError(f"[event_seconds] the {op!r} event has no {' or '.join(missing)}; pass a ledger event "
                         f"(Ledger.to_dicts()) or a dict with {', '.join(needed)}"
                         f"{' and axes, group_size' if op in _COLLECTIVES else ''}")
    if op in _COMPUTE:
        peak, _ = peak_flops(hw, event.get("dtype") or "bfloat16")
        return max(float(event.get("flops") or 0) / peak, float(event.get("hbm_bytes") or 0) / hw.hbm_bandwidth)
    if op not in _COLLECTIVES:
        raise ValueError(f"[cost] unknown event op {op!r}: expected a collective ({', '.join(sorted(_COLLECTIVES))}) "
                         f"or a compute event ({', '.join(sorted(_COMPUTE))})")
    axes = tuple(event.get("axes") or ())
    if not axes:
        return 0.0
    return collective_time(op, _event_group_bytes(event), axes=axes, mesh_shape=shape, hardware=hw,
                           physical_axes=physical, perm=event.get("perm")).seconds


_EVENT_COST_CACHE: dict = {}


def event_cost(event, mesh) -> tuple:
    """(seconds, book_seconds, hops, bound) of a ledger Event on ``mesh.hardware``.

    ``seconds`` is the link-level model's (collectives) or the roofline's (compute events);
    ``book_seconds`` the book's closed form where it has one. Memoized per mesh and shape of
    the event, so pricing a long program costs one model evaluation per distinct event.
    """
    hw = mesh.hardware
    if not event.axes:
        peak, _ = peak_flops(hw, event.dtype or "bfloat16")
        t_math, t_hbm = event.flops / peak, event.hbm_bytes / hw.hbm_bandwidth
        return max(t_math, t_hbm), None, 0, "compute" if t_math >= t_hbm else "memory"
    perm = tuple(map(tuple, event.perm)) if event.perm else None
    key = (mesh.axis_names, mesh.axis_sizes, hw, repr(mesh.physical_axes), event.op, event.axes, event.group_size, event.bytes_in,
           event.bytes_out, perm)
    hit = _EVENT_COST_CACHE.get(key)
    if hit is None:
        shape, hw, physical = _mesh_parts(mesh)
        v = formulas.group_bytes(event.op, event.group_size, event.bytes_in, event.bytes_out)
        c = collective_time(event.op, v, axes=event.axes, mesh_shape=shape, hardware=hw,
                            physical_axes=physical, perm=list(perm) if perm else None)
        hit = (c.seconds, c.book_seconds, c.hops, c.bound)
        if len(_EVENT_COST_CACHE) > 100_000:
            _EVENT_COST_CACHE.clear()
        _EVENT_COST_CACHE[key] = hit
    return hit


@dataclasses.dataclass
class Roofline:
    """Where a program's time goes on the mesh's hardware.

    Attributes:
        t_math: sum of FLOPs / peak over compute events (per device).
        t_hbm: sum of HBM bytes / HBM bandwidth.
        t_comms: sum of collective times; t_comms_by_axes: the same split by mesh axes.
        total_seconds: max of the three (overlap="max") or their sum (overlap="sum").
        bound: "compute", "memory" or "communication" - the largest term.
        arithmetic_intensity: FLOPs per HBM byte; critical_intensity: peak / HBM bandwidth.
        notes: assumptions made (overlap, stand-in peaks).
    """

    hardware: str
    overlap: str
    flops: float
    hbm_bytes: float
    comm_bytes: float
    t_math: float
    t_hbm: float
    t_comms: float
    t_comms_by_axes: dict
    total_seconds: float
    bound: str
    arithmetic_intensity: float
    critical_intensity: float
    notes: list

    def rows(self) -> list[tuple[str, str]]:
        rows = [("T_math", _us(self.t_math)), ("T_hbm", _us(self.t_hbm)), ("T_comms", _us(self.t_comms))]
        rows += [(f"  T_comms[{k}]", _us(v)) for k, v in self.t_comms_by_axes.items()]
        rows += [(f"total ({self.overlap})", _us(self.total_seconds)), ("bound", self.bound),
                 ("arithmetic intensity", f"{self.arithmetic_intensity:.4g} FLOPs/B"),
                 ("critical intensity", f"{self.critical_intensity:.4g} FLOPs/B")]
        return rows

    def text(self) -> str:
        w = max(len(k) for k, _ in self.rows())
        lines = [f"Roofline on {self.hardware}"] + [f"  {k.ljust(w)}  {v}" for k, v in self.rows()]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])

    __str__ = text

    def _repr_html_(self) -> str:
        view = views.html_view(self)
        if view is not None:
            return view
        body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in self.rows())
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
        return (f"<div><b>Roofline on {html.escape(self.hardware)}</b><table>{body}</table>"
                f"<ul>{notes}</ul></div>")


def _us(s: float) -> str:
    return units.fmt_seconds(s)


def roofline(events: Sequence[Mapping], mesh, overlap: str = "max") -> Roofline:
    """Sums a program's events into T_math, T_hbm and T_comms and names the bound.

    Args:
        events: ledger events (dicts with op, axes, bytes_in, bytes_out, flops, hbm_bytes, ...).
        mesh: a mesh with hardware.
        overlap: "max" assumes compute, memory traffic and communication overlap perfectly
            (time = the largest term); "sum" assumes none does (time = their sum).
    """
    if overlap not in ("max", "sum"):
        raise ValueError(f"[roofline] overlap={overlap!r}: use 'max' (perfect overlap) or 'sum' (none)")
    shape, hw, physical = _mesh_parts(mesh)
    if hw is None:
        raise ValueError("[roofline] the mesh has no hardware: make_mesh(..., hardware='tpu-v5e')")
    flops = hbm = comm_bytes = t_math = t_hbm = 0.0
    by_axes: dict[str, float] = {}
    notes: set[str] = set()
    for e in events:
        op = e.get("op")
        if op in _COMPUTE:
            peak, note = peak_flops(hw, e.get("dtype") or "bfloat16")
            if note:
                notes.add(note)
            flops += float(e.get("flops") or 0)
            hbm += float(e.get("hbm_bytes") or 0)
            t_math += float(e.get("flops") or 0) / peak
            t_hbm += float(e.get("hbm_bytes") or 0) / hw.hbm_bandwidth
        else:
            s = e.get("seconds")
            if s is None or (isinstance(s, float) and math.isnan(s)):
                s = event_seconds(e, mesh)
            key = ",".join(e.get("axes") or ()) or "-"
            by_axes[key] = by_axes.get(key, 0.0) + s
            comm_bytes += float(e.get("bytes_sent") or 0)
    t_comms = sum(by_axes.values())
    terms = {"compute": t_math, "memory": t_hbm, "communication": t_comms}
    total = max(terms.values()) if overlap == "max" else sum(terms.values())
    bound = max(terms, key=terms.get) if any(terms.values()) else "compute"
    notes.add("overlap='max': compute, HBM traffic and collectives assumed to overlap perfectly"
              if overlap == "max" else "overlap='sum': nothing overlaps (an upper bound)")
    return Roofline(hw.name, overlap, flops, hbm, comm_bytes, t_math, t_hbm, t_comms, by_axes, total, bound,
                    flops / hbm if hbm else math.inf, hw.peak("bfloat16") / hw.hbm_bandwidth, sorted(notes))
