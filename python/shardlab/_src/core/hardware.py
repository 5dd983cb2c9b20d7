"""Accelerator presets and the map from mesh axes to physical links.

A preset carries peak FLOP/s per dtype, HBM capacity and bandwidth, interconnect bandwidth and
latency, and the wraparound rules of the chip's torus. Every figure has a source in
docs/hardware.md.

Example:
    >>> import shardlab
    >>> v5e = shardlab.hardware.get("tpu-v5e")
    >>> round(v5e.peak("bfloat16") / v5e.hbm_bandwidth)
    240
    >>> [a.topology for a in shardlab.hardware.axis_links(v5e, {"X": 8, "Y": 4}, ("Y",))]
    ['line']
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import shardlab._core as _core

from . import units, views


__all__ = [
    "Hardware",
    "AxisLink",
    "get",
    "names",
    "validate_axes",
    "resolve_physical_axes",
    "axis_links",
    "table",
]

_LINK_KINDS_TPU = ("dcn",)
_LINK_KINDS_GPU = ("nvlink", "ib")


@dataclasses.dataclass(frozen=True, eq=True)
class Hardware(views.Viewable):
    """Compute, memory and interconnect figures of one chip: a preset, or a chip of your own.

    The presets (``get("tpu-v5e")``) come from the C++ core with a source for every number
    (docs/hardware.md). Build a custom chip from scratch with keyword arguments, or change a
    preset with ``replace``; either works wherever a preset name does (``hardware=`` of
    ``make_mesh`` and every ``shardlab.cost`` function).

    Attributes:
        name, family ("tpu" or "gpu"), description.
        peak_flops: dict dtype name → dense FLOP/s ("bfloat16", "int8", "float32", "float8").
        hbm_capacity (bytes), hbm_bandwidth (bytes/s).
        ici_axes, ici_link_bandwidth (one-way bytes/s of one link), ici_links_per_axis,
        wrap_at / wrap_multiple (when a TPU axis closes into a ring), hop_latency (s).
        dcn_bandwidth, dcn_latency: the data-centre network per chip.
        node_size, nvlink_link_bandwidth, nvlink_links, ib_bandwidth, ib_latency: GPU nodes.

    Example:
        >>> from shardlab import hardware
        >>> chip = hardware.get("tpu-v5e").replace(hbm_bandwidth=3.4e12)
        >>> chip.hbm_bandwidth, chip.peak("bfloat16") == hardware.get("tpu-v5e").peak("bfloat16")
        (3400000000000.0, True)
        >>> toy = hardware.Hardware(name="toy", peak_flops={"bfloat16": 1e15}, hbm_bandwidth=2e12)
        >>> round(toy.peak("bfloat16") / toy.hbm_bandwidth)
        500
    """

    name: str = "custom"
    family: str = "tpu"
    description: str = ""
    peak_flops: Mapping = dataclasses.field(default_factory=dict)
    hbm_capacity: float = 0.0
    hbm_bandwidth: float = 0.0
    ici_axes: tuple = ("x", "y")
    ici_link_bandwidth: float = 0.0
    ici_links_per_axis: int = 0
    wrap_at: int = 0
    wrap_multiple: int = 0
    hop_latency: float = 1e-6
    dcn_bandwidth: float = 0.0
    dcn_latency: float = 0.0
    node_size: int = 0
    nvlink_link_bandwidth: float = 0.0
    nvlink_links: int = 0
    ib_bandwidth: float = 0.0
    ib_latency: float = 0.0

    def __post_init__(self):
        op = "Hardware"
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"[{op}] name must be a non-empty string, got {self.name!r}")
        if self.family not in ("tpu", "gpu"):
            raise ValueError(f"[{op}] family={self.family!r}; use 'tpu' or 'gpu'")
        if not isinstance(self.peak_flops, Mapping):
            raise TypeError(f"[{op}] peak_flops must be a dict from dtype name to FLOP/s, got {self.peak_flops!r}")
        peaks = {}
        for k, v in self.peak_flops.items():
            if not isinstance(k, str) or not _finite_nonneg(v) or v == 0:
                raise ValueError(f"[{op}] peak_flops[{k!r}] = {v!r}; use a dtype name and a FLOP/s > 0")
            peaks[k] = float(v)
        object.__setattr__(self, "peak_flops", peaks)
        for f in _FLOAT_FIELDS:
            v = getattr(self, f)
            if not _finite_nonneg(v):
                raise ValueError(f"[{op}] {f}={v!r} must be a finite number >= 0")
            object.__setattr__(self, f, float(v))
        for f in _INT_FIELDS:
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"[{op}] {f}={v!r} must be an int >= 0")
        if isinstance(self.ici_axes, str) or not all(isinstance(a, str) for a in self.ici_axes):
            raise ValueError(f"[{op}] ici_axes={self.ici_axes!r} must be a tuple of axis names such as ('x', 'y')")
        object.__setattr__(self, "ici_axes", tuple(self.ici_axes))
        if not self.description:
            object.__setattr__(self, "description", self.name)
        # Hashed once: every priced ledger event looks its chip up in a memo.
        object.__setattr__(self, "_hash", hash(tuple(tuple(sorted(v.items())) if isinstance(v, dict) else v
                                                     for v in (getattr(self, f.name) for f in dataclasses.fields(self)))))

    def __hash__(self):
        return self._hash

    def __repr__(self):
        return f"<Hardware {self.name}>"

    def replace(self, **changes) -> "Hardware":
        """A copy with some figures changed (``chip.replace(hbm_bandwidth=3.4e12)``); checked
        as the constructor checks. The name stays unless you pass one."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f"[Hardware.replace] unknown field(s) {sorted(unknown)}; the fields are "
                            f"{[f.name for f in dataclasses.fields(self)]}")
        return dataclasses.replace(self, **changes)

    def peak(self, dtype: str) -> float:
        """Peak dense FLOP/s for ``dtype``; ValueError naming the known dtypes if absent."""
        if dtype not in self.peak_flops:
            raise ValueError(f"[hardware] {self.name} has no published peak FLOP/s for dtype '{dtype}'; "
                             f"known: {', '.join(sorted(self.peak_flops))}")
        return self.peak_flops[dtype]

    def has_peak(self, dtype: str) -> bool:
        """True if the chip lists a peak FLOP/s for `dtype`."""
        return dtype in self.peak_flops

    def wraps(self, size: int) -> bool:
        """Whether a TPU axis of ``size`` chips closes into a ring (a ring of 2 is a line)."""
        if size < 3:
            return False
        return (self.wrap_at > 0 and size == self.wrap_at) or (self.wrap_multiple > 0 and size % self.wrap_multiple == 0)

    @property
    def nvlink_bandwidth(self) -> float:
        """One-way egress bytes/s of a GPU into NVLink (links x per-link bandwidth)."""
        return self.nvlink_link_bandwidth * self.nvlink_links

    def __str__(self):
        """The preset's figures, one per line (``print(hardware)``), from shardlab.viz."""
        text = views.text_view(self)
        return text if text is not None else repr(self)


# The checked number fields, from the dataclass's own annotations (its fields are the C++
# struct's, in order: tests/python/test_hardware.py holds them to _core.hardware_fields()).
_FLOAT_FIELDS = tuple(f.name for f in dataclasses.fields(Hardware) if f.type == "float")
_INT_FIELDS = tuple(f.name for f in dataclasses.fields(Hardware) if f.type == "int")


def _finite_nonneg(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v >= 0


_FROM_CORE = {"Mapping": dict, "tuple": tuple}  # the binding's map and vector as Python values


def _from_core(c) -> Hardware:
    return Hardware(**{f.name: _FROM_CORE.get(f.type, lambda v: v)(getattr(c, f.name))
                       for f in dataclasses.fields(Hardware)})


_PRESETS: dict = {}


def names() -> list[str]:
    """Names of the presets, e.g. ``['tpu-v4p', 'tpu-v5e', ..., 'b200']``."""
    return list(_core.hardware_names())


def get(name_or_obj):
    """Returns the preset called ``name_or_obj``; a Hardware passes through, None stays None.

    Names are case-insensitive and accept short forms ("v5e", "tpu_v5e", "H100").

    Raises:
        ValueError: unknown name; the message lists the known presets.

    Example:
        >>> get("v5p").description
        'TPU v5p'
    """
    if name_or_obj is None or isinstance(name_or_obj, Hardware):
        return name_or_obj
    if not isinstance(name_or_obj, str):
        raise TypeError(f"[hardware] expected a preset name or a Hardware, got {type(name_or_obj).__name__}: "
                        f"use one of {', '.join(names())}")
    try:
        c = _core.get_hardware(name_or_obj)
    except ValueError:
        raise
    except Exception as e:  # pybind11 maps std::invalid_argument to ValueError; keep it so
        raise ValueError(str(e)) from None
    hw = _PRESETS.get(c.name)
    if hw is None:
        hw = _PRESETS[c.name] = _from_core(c)
    return hw


@dataclasses.dataclass(frozen=True)
class AxisLink:
    """One mesh axis (or one physical part of it) as the cost model sees it.

    Attributes:
        mesh_axis: the mesh axis name.
        link: "ici:x", "dcn", "nvlink", "ib" or "custom".
        size: devices along this link.
        topology: "ring", "uni_ring", "line" or "switch".
        bandwidth: one-way bytes/s of one link (of one egress port for switched links).
        latency: seconds per hop.
    """

    mesh_axis: str
    link: str
    size: int
    topology: str
    bandwidth: float
    latency: float

    def as_core(self) -> tuple:
        """The link as the C++ core's cost model takes it: (size, topology, bandwidth, latency, label)."""
        return (self.size, self.topology, self.bandwidth, self.latency, f"{self.mesh_axis} ({self.link})")


def _shape_dict(mesh_axis_names, mesh_shape) -> dict[str, int]:
    if isinstance(mesh_shape, Mapping):
        shape = {str(k): int(v) for k, v in mesh_shape.items()}
        if mesh_axis_names is not None and tuple(shape) != tuple(mesh_axis_names):
            shape = {n: shape[n] for n in mesh_axis_names}
    else:
        sizes = tuple(int(s) for s in mesh_shape)
        if mesh_axis_names is None or len(sizes) != len(mesh_axis_names):
            raise ValueError(f"[hardware] mesh shape {sizes} does not match axis names {mesh_axis_names}")
        shape = dict(zip(mesh_axis_names, sizes))
    for n, s in shape.items():
        if s < 1:
            raise ValueError(f"[hardware] mesh axis '{n}' has size {s}; sizes must be >= 1")
    return shape


def _default_physical(hw, shape: dict[str, int]) -> dict[str, object]:
    axes = list(shape)
    if hw.family == "tpu":
        ici = list(hw.ici_axes)
        extra = max(0, len(axes) - len(ici))
        # Leading (major) axes beyond the torus's dimensions span slices over the DCN.
        out = {a: "dcn" for a in axes[:extra]}
        out.update({a: ici[i] for i, a in enumerate(axes[extra:])})
        return out
    # GPUs: minor axes fill the NVLink node, the rest crosses nodes over InfiniBand.
    out, inner = {}, 1
    for a in reversed(axes):
        inner *= shape[a]
        out[a] = "nvlink" if inner <= hw.node_size else "ib"
    return {a: out[a] for a in axes}


def resolve_physical_axes(hardware, mesh_axis_names, mesh_shape, physical_axes=None) -> dict[str, object]:
    """The physical link of every mesh axis: the given map completed with the defaults.

    Defaults: on a TPU the mesh axes take the torus axes in order ("x", "y"[, "z"]); leading
    axes beyond the torus's dimensions go over the DCN. On a GPU, minor axes whose product fits
    in a node use NVLink and the others InfiniBand.
    """
    hw = get(hardware)
    shape = _shape_dict(mesh_axis_names, mesh_shape)
    validate_axes(hw, tuple(shape), shape, physical_axes)
    out = _default_physical(hw, shape)
    if physical_axes:
        given = dict(physical_axes)
        used = {v for k, v in given.items() if isinstance(v, str) and v in hw.ici_axes}
        # A default that collides with an explicitly used ICI axis moves to a free one.
        free = [p for p in hw.ici_axes if p not in used]
        for a in shape:
            if a in given:
                out[a] = given[a]
            elif isinstance(out[a], str) and out[a] in used:
                out[a] = free.pop(0) if free else "dcn"
    return out


def validate_axes(hardware, mesh_axis_names, mesh_shape, physical_axes) -> None:
    """Checks a map from mesh axes to physical links; raises ValueError naming the bad axis.

    Values: a TPU torus axis name ("x", "y", "z"), "dcn", a dict {torus axis: size} for a mesh
    axis laid over several torus axes, and on GPUs "nvlink" or "ib".
    """
    hw = get(hardware)
    names_ = tuple(mesh_axis_names)
    shape = _shape_dict(names_, mesh_shape)
    if physical_axes is None:
        return
    if hw is None:
        raise ValueError("[hardware] physical_axes needs a hardware preset: pass hardware=... as well")
    if not isinstance(physical_axes, Mapping):
        raise ValueError(f"[hardware] physical_axes must be a dict from mesh axis to link, got {physical_axes!r}")
    kinds = _LINK_KINDS_TPU if hw.family == "tpu" else _LINK_KINDS_GPU
    valid = ", ".join(repr(v) for v in (*hw.ici_axes, *kinds))
    used: dict[str, str] = {}
    for axis, link in physical_axes.items():
        if axis not in shape:
            raise ValueError(f"[hardware] physical_axes names mesh axis {axis!r}, which is not in the mesh "
                             f"axes {names_}")
        parts = link if isinstance(link, Mapping) else {link: shape[axis]}
        if isinstance(link, Mapping):
            if math.prod(int(s) for s in link.values()) != shape[axis]:
                raise ValueError(f"[hardware] mesh axis {axis!r} of size {shape[axis]} is laid over {dict(link)}, "
                                 f"whose sizes multiply to {math.prod(link.values())}")
        for p, size in parts.items():
            if not isinstance(p, str) or p not in (*hw.ici_axes, *kinds):
                raise ValueError(f"[hardware] mesh axis {axis!r} maps to {p!r}, which {hw.name} does not have; "
                                 f"use one of {valid}")
            if isinstance(link, Mapping) and p not in hw.ici_axes:
                raise ValueError(f"[hardware] mesh axis {axis!r}: only torus axes ({', '.join(hw.ici_axes)}) "
                                 f"can be combined in a dict, got {p!r}")
            if p in hw.ici_axes:
                if p in used:
                    raise ValueError(f"[hardware] physical axis {p!r} is used by mesh axes {used[p]!r} and {axis!r}; "
                                     f"map each torus axis to one mesh axis")
                used[p] = axis
            if p == "nvlink" and int(size) > hw.node_size:
                raise ValueError(f"[hardware] mesh axis {axis!r} of size {size} cannot use NVLink: a {hw.name} "
                                 f"node has {hw.node_size} GPUs; map it to 'ib'")


def _links_for(hw, axis: str, size: int, link) -> list[AxisLink]:
    if isinstance(link, Mapping):
        out = []
        for p, s in link.items():
            out.extend(_links_for(hw, axis, int(s), p))
        return out
    if link == "dcn":
        return [AxisLink(axis, "dcn", size, "switch", hw.dcn_bandwidth, hw.dcn_latency)]
    if link == "nvlink":
        return [AxisLink(axis, "nvlink", size, "switch", hw.nvlink_bandwidth, hw.hop_latency)]
    if link == "ib":
        return [AxisLink(axis, "ib", size, "switch", hw.ib_bandwidth, hw.ib_latency)]
    topology = "ring" if hw.wraps(size) else "line"
    return [AxisLink(axis, f"ici:{link}", size, topology, hw.ici_link_bandwidth, hw.hop_latency)]


def axis_links(hardware, mesh_shape, axes: Sequence[str], physical_axes=None, *, topology=None) -> list[AxisLink]:
    """The links a collective over ``axes`` uses, one AxisLink per physical axis.

    Args:
        hardware: preset name or Hardware.
        mesh_shape: dict {axis name: size} (ordered major to minor).
        axes: the mesh axes the collective runs over.
        physical_axes: optional map from mesh axes to links (see validate_axes).
        topology: force every torus link to "ring", "uni_ring" or "line" (what-if questions).
    """
    hw = get(hardware)
    if hw is None:
        raise ValueError("[cost] no hardware: pass hardware='tpu-v5e' (or another preset) or a mesh with hardware")
    shape = _shape_dict(None, mesh_shape)
    for a in axes:
        if a not in shape:
            raise ValueError(f"[cost] axis {a!r} is not in the mesh axes {tuple(shape)}")
    physical = resolve_physical_axes(hw, tuple(shape), shape, physical_axes)
    out = []
    for a in axes:
        for link in _links_for(hw, a, shape[a], physical[a]):
            if topology is not None and link.topology != "switch":
                if topology not in ("ring", "uni_ring", "line"):
                    raise ValueError(f"[cost] topology {topology!r} is not one of 'ring', 'uni_ring', 'line'")
                link = dataclasses.replace(link, topology=topology)
            out.append(link)
    return out


def table() -> str:
    """A plain-text table of the presets (peak bf16, HBM, links)."""
    rows = [("preset", "bf16", "int8", "HBM", "HBM bandwidth", "link (one-way)", "wrap")]
    for n in names():
        h = get(n)
        link = h.ici_link_bandwidth if h.family == "tpu" else h.nvlink_bandwidth
        wrap = (f"at {h.wrap_at}" if h.wrap_at else f"multiples of {h.wrap_multiple}") if h.family == "tpu" else "switch"
        rows.append((n, units.fmt_flop_rate(h.peak('bfloat16')), units.fmt_flop_rate(h.peak('int8')),
                     units.fmt_bytes(h.hbm_capacity), units.fmt_bandwidth(h.hbm_bandwidth), units.fmt_bandwidth(link), wrap))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)
