"""One ledger event: a collective or a compute call, with its bytes, FLOPs and times.

Events are made by the primitives' cost rules (the one place bytes and FLOPs are counted),
so a real run and a shape-only (abstract) run of the same program give equal events.
"""

from __future__ import annotations

import math

FIELDS = ("op", "axes", "group_size", "num_groups", "dtype", "bytes_in", "bytes_out", "bytes_sent",
          "algorithm", "flops", "hbm_bytes", "seconds", "book_seconds", "hops", "bound", "phase",
          "label", "perm")

# Fields whose value depends only on the program (not on timing): what "the abstract ledger
# equals the real one" compares.
PROGRAM_FIELDS = tuple(f for f in FIELDS if f not in ("seconds", "book_seconds", "hops", "bound"))


_NAMES: dict = {}


def dtype_name(dtype) -> str:
    """The dtype's name ('float32', 'bfloat16'), memoized: numpy's dtype.__str__ costs
    microseconds, and every event names one."""
    name = _NAMES.get(dtype)
    if name is None:
        name = _NAMES[dtype] = str(dtype)
    return name


class Event:
    """A ledger row. ``as_dict()`` gives the public dict view (``Ledger.events``)."""

    __slots__ = FIELDS

    def __init__(self, op: str, *, axes=(), group_size: int = 1, num_groups: int = 1, dtype: str = "float32",
                 bytes_in: float = 0.0, bytes_out: float = 0.0, bytes_sent: float = 0.0,
                 algorithm: str = "local", flops: float = 0.0, hbm_bytes: float = 0.0, perm=None,
                 phase: str = "forward", label: str = ""):
        self.op = op
        self.axes = tuple(axes)
        self.group_size = int(group_size)
        self.num_groups = int(num_groups)
        self.dtype = dtype
        self.bytes_in = float(bytes_in)
        self.bytes_out = float(bytes_out)
        self.bytes_sent = float(bytes_sent)
        self.algorithm = algorithm
        self.flops = float(flops)
        self.hbm_bytes = float(hbm_bytes)
        self.perm = perm
        self.phase = phase
        self.label = label
        self.seconds = None
        self.book_seconds = None
        self.hops = None
        self.bound = None

    @classmethod
    def collective(cls, op: str, axes: tuple, group_size: int, num_groups: int, dtype: str, bytes_in: float,
                   bytes_out: float, bytes_sent: float, perm) -> Event:
        """A ring collective's event from already-typed fields (the per-primitive hot path:
        no conversions, no keyword parsing)."""
        e = object.__new__(cls)
        e.op, e.axes, e.group_size, e.num_groups, e.dtype = op, axes, group_size, num_groups, dtype
        e.bytes_in, e.bytes_out, e.bytes_sent, e.algorithm = bytes_in, bytes_out, bytes_sent, "ring"
        e.flops = e.hbm_bytes = 0.0
        e.perm, e.phase, e.label = perm, "forward", ""
        e.seconds = e.book_seconds = e.hops = e.bound = None
        return e

    @property
    def is_compute(self) -> bool:
        return not self.axes

    def as_dict(self) -> dict:
        d = {f: getattr(self, f) for f in FIELDS}
        if d["seconds"] is not None and math.isnan(d["seconds"]):
            d["seconds"] = None
        return d

    def __repr__(self):
        what = f"axes={self.axes}, sent={self.bytes_sent:g} B" if self.axes else f"flops={self.flops:g}"
        return f"Event({self.op!r}, {what}, phase={self.phase!r})"
