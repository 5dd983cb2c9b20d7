"""The ledger: every collective (and GEMM / attention call) with exact bytes and, when the
mesh has hardware, estimated time.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((8,), ("x",))
    >>> f = sl.shard_map(lambda a: sl.lax.psum(a, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())
    >>> with sl.Ledger() as ledger:
    ...     _ = f(np.ones((8, 256), np.float32))
    >>> ledger.events[0]["op"], ledger.events[0]["bytes_sent"]
    ('psum', 1792.0)
"""

from __future__ import annotations

import html

from ..core import context, units, views
from ..core.context import CTX
from ..cost import model as cost
from .event import FIELDS, PROGRAM_FIELDS, Event


def record(event: Event, mesh) -> None:
    """Stamps `event` with the current phase and named scope, prices it on the mesh's
    hardware, and appends it to the mesh's ledger and every active ``with Ledger()`` block."""
    if not mesh.records:
        return
    event.phase = CTX.phase
    event.label = "/".join(CTX.scopes)
    if mesh.hardware is not None:
        t = cost.event_cost(event, mesh)
        event.seconds, event.book_seconds, event.hops, event.bound = t
    mesh.ledger._append(event, mesh)
    for ledger in CTX.ledgers:
        if ledger is not mesh._ledger:
            ledger._append(event, mesh)


class Ledger:
    """Records collectives and compute calls made while active (``with Ledger() as l:``).

    Each event carries the op, mesh axes, group size, dtype, bytes per device in / out / sent,
    FLOPs, its ``phase`` ('forward', 'backward', 'recompute') and ``label`` (from
    ``shardlab.named_scope``) and, on a mesh with hardware, ``seconds`` (link-level model),
    ``book_seconds`` (the book's closed form), ``hops`` and ``bound``.
    """

    def __init__(self):
        self._events: list[Event] = []
        self.mesh = None

    def _append(self, event: Event, mesh) -> None:
        self._events.append(event)
        self.mesh = mesh

    def __enter__(self):
        CTX.ledgers.append(self)
        return self

    def __exit__(self, *exc):
        CTX.ledgers.remove(self)
        return False

    # -- contents --------------------------------------------------------------------------
    @property
    def events(self) -> list[dict]:
        """Events as dicts (keys: op, axes, group_size, num_groups, dtype, bytes_in, bytes_out,
        bytes_sent, algorithm, flops, hbm_bytes, seconds, book_seconds, hops, bound, phase,
        label, perm)."""
        return [e.as_dict() for e in self._events]

    def program_events(self) -> list[tuple]:
        """Events without the timing fields: what must agree between a real run and the same
        program run shape-only (``eval_shape``)."""
        return [tuple(getattr(e, f) for f in PROGRAM_FIELDS) for e in self._events]

    def to_dicts(self) -> list[dict]:
        return self.events

    def to_dataframe(self):
        """The events as a pandas DataFrame (pandas comes with the [notebooks] extra)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("[Ledger.to_dataframe] needs pandas: pip install pandas "
                              "(or shardlab[notebooks]); Ledger.events gives the same rows as dicts") from None

        return pd.DataFrame(self.events, columns=list(FIELDS))

    def __len__(self):
        return len(self._events)

    def __iter__(self):
        return iter(self.events)

    def clear(self) -> None:
        self._events.clear()

    def filter(self, *, phase: str | None = None, label: str | None = None, op: str | None = None) -> "Ledger":
        """A new Ledger with the events of one phase, label prefix or op."""
        out = Ledger()
        out.mesh = self.mesh
        out._events = [e for e in self._events
                       if (phase is None or e.phase == phase) and (op is None or e.op == op)
                       and (label is None or e.label == label or e.label.startswith(label + "/"))]
        return out

    @property
    def total_bytes_sent(self) -> float:
        """Bytes each device sends, summed over events."""
        return float(sum(e.bytes_sent for e in self._events))

    @property
    def total_flops(self) -> float:
        """FLOPs per device, summed over compute events."""
        return float(sum(e.flops for e in self._events))

    def by_op(self) -> dict:
        """op → {"count", "bytes_sent", "flops", "seconds"} (seconds None without hardware)."""
        return self._summarize(lambda e: e.op)

    def by_axis(self) -> dict:
        """axes tuple → {"count", "bytes_sent", "flops", "seconds"}; compute events have axes ()."""
        return self._summarize(lambda e: e.axes)

    def by_phase(self) -> dict:
        """phase → {"count", "bytes_sent", "flops", "seconds"}."""
        return self._summarize(lambda e: e.phase)

    def _summarize(self, key) -> dict:
        out: dict = {}
        for e in self._events:
            s = out.setdefault(key(e), {"count": 0, "bytes_sent": 0.0, "flops": 0.0, "seconds": None})
            s["count"] += 1
            s["bytes_sent"] += e.bytes_sent
            s["flops"] += e.flops
            if e.seconds is not None:
                s["seconds"] = (s["seconds"] or 0.0) + e.seconds
        return out

    def roofline(self, overlap: str = "max"):
        """Compute-, memory- or communication-bound on the mesh's hardware (see shardlab.cost)."""
        if self.mesh is None or self.mesh.hardware is None:
            raise ValueError("[Ledger.roofline] the events' mesh has no hardware; create it with "
                             "make_mesh(..., hardware='tpu-v5e') (or another preset)")
        return cost.roofline(self.events, self.mesh, overlap=overlap)

    # -- rendering -------------------------------------------------------------------------
    _HEAD = ["op", "axes", "n", "dtype", "phase", "label", "in/dev", "out/dev", "sent/dev", "FLOP/dev", "time"]

    def _rows(self):
        rows = []
        for e in self._events:
            comm = bool(e.axes)
            rows.append([e.op, ",".join(e.axes) or "-", str(e.group_size), e.dtype, e.phase, e.label or "-",
                         units.fmt_bytes(e.bytes_in) if comm else "-",
                         units.fmt_bytes(e.bytes_out) if comm else "-",
                         units.fmt_bytes(e.bytes_sent) if comm else "-",
                         units.fmt_flops(e.flops) if e.flops else "-",
                         "-" if e.seconds is None else units.fmt_seconds(e.seconds)])
        return rows

    def _title(self) -> str:
        return (f"shardlab ledger: {units.plural(len(self), 'event')}, {units.fmt_bytes(self.total_bytes_sent)} sent "
                f"and {units.fmt_flops(self.total_flops)} per device")

    def __rich__(self):
        from rich.table import Table

        t = Table(title=self._title())
        for h in self._HEAD:
            t.add_column(h, justify="right" if "/" in h or h in ("n", "time") else "left", no_wrap=True)
        for r in self._rows():
            t.add_row(*r)
        return t

    def table(self) -> str:
        """The events as a plain-text table."""
        from rich.console import Console

        console = Console(width=140, record=True, file=_Null(), color_system=None, force_jupyter=False)
        console.print(self.__rich__())
        return console.export_text()

    __str__ = table

    def __repr__(self):
        return f"Ledger({units.plural(len(self), 'event')}, {units.fmt_bytes(self.total_bytes_sent)} sent per device)"

    def _repr_html_(self):
        view = views.html_view(self)
        if view is not None:
            return view
        head = "".join(f"<th>{h}</th>" for h in self._HEAD)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                       for r in self._rows())
        return (f"<table><caption>{html.escape(self._title())}</caption>"
                f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


class _Null:
    def write(self, s):
        return len(s)

    def flush(self):
        pass


context.register_ledger_factory(Ledger)
