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
import math
import threading

from . import _core

_FIELDS = ("op", "axes", "group_size", "num_groups", "dtype", "bytes_in", "bytes_out",
           "bytes_sent", "algorithm", "flops", "hbm_bytes", "seconds")


class _Active(threading.local):
    def __init__(self):
        self.ledgers: list[Ledger] = []


_ACTIVE = _Active()


def event_dict(e) -> dict:
    d = {f: getattr(e, f) for f in _FIELDS}
    d["axes"] = tuple(d["axes"])
    if d["seconds"] is not None and math.isnan(d["seconds"]):
        d["seconds"] = None
    return d


def record(event, mesh) -> None:
    """Appends `event` to the mesh's ledger and every active ``with Ledger()`` block."""
    if mesh.hardware is not None:
        from . import cost

        event.seconds = float(cost.event_seconds(event_dict(event), mesh))
    mesh.ledger._append(event, mesh)
    for ledger in _ACTIVE.ledgers:
        if ledger is not mesh.ledger:
            ledger._append(event, mesh)


class Ledger:
    """Records collectives and compute calls made while active (``with Ledger() as l:``)."""

    def __init__(self):
        self._core = _core.Ledger()
        self.mesh = None

    def _append(self, event, mesh) -> None:
        self._core.append(event)
        self.mesh = mesh

    def __enter__(self):
        _ACTIVE.ledgers.append(self)
        return self

    def __exit__(self, *exc):
        _ACTIVE.ledgers.remove(self)
        return False

    # -- contents --------------------------------------------------------------------------
    @property
    def events(self) -> list[dict]:
        """Events as dicts (keys: op, axes, group_size, num_groups, dtype, bytes_in, bytes_out,
        bytes_sent, algorithm, flops, hbm_bytes, seconds)."""
        return [event_dict(e) for e in self._core.events()]

    def to_dicts(self) -> list[dict]:
        return self.events

    def to_dataframe(self):
        """The events as a pandas DataFrame (pandas comes with the [notebooks] extra)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("[Ledger.to_dataframe] needs pandas: pip install pandas "
                              "(or shardlab[notebooks]); Ledger.events gives the same rows as dicts") from None

        return pd.DataFrame(self.events, columns=list(_FIELDS))

    def __len__(self):
        return len(self._core)

    def __iter__(self):
        return iter(self.events)

    def clear(self) -> None:
        self._core.clear()

    @property
    def total_bytes_sent(self) -> float:
        """Bytes each device sends, summed over events."""
        return self._core.total_bytes_sent()

    def by_op(self) -> dict:
        """op → {"count", "bytes_sent", "seconds"} (seconds None without hardware)."""
        return self._summarize(lambda e: e["op"])

    def by_axis(self) -> dict:
        """axes tuple → {"count", "bytes_sent", "seconds"}; compute events have axes ()."""
        return self._summarize(lambda e: e["axes"])

    def _summarize(self, key) -> dict:
        out: dict = {}
        for e in self.events:
            s = out.setdefault(key(e), {"count": 0, "bytes_sent": 0.0, "flops": 0.0, "seconds": None})
            s["count"] += 1
            s["bytes_sent"] += e["bytes_sent"]
            s["flops"] += e["flops"]
            if e["seconds"] is not None:
                s["seconds"] = (s["seconds"] or 0.0) + e["seconds"]
        return out

    def roofline(self, overlap: str = "max"):
        """Compute-, memory- or communication-bound on the mesh's hardware (see shardlab.cost)."""
        if self.mesh is None or self.mesh.hardware is None:
            raise ValueError("[Ledger.roofline] the events' mesh has no hardware; create it with "
                             "make_mesh(..., hardware='tpu-v5e') (or another preset)")
        from . import cost

        return cost.roofline(self.events, self.mesh, overlap=overlap)

    # -- rendering -------------------------------------------------------------------------
    def _rows(self):
        rows = []
        for e in self.events:
            compute = e["flops"] > 0
            rows.append([e["op"], ",".join(e["axes"]) or "-", str(e["group_size"]), e["dtype"],
                         "-" if compute else _fmt_bytes(e["bytes_in"]),
                         "-" if compute else _fmt_bytes(e["bytes_out"]),
                         "-" if compute else _fmt_bytes(e["bytes_sent"]),
                         f"{e['flops']:.3g}" if e["flops"] else "-",
                         _fmt_seconds(e["seconds"])])
        return rows

    _HEAD = ["op", "axes", "n", "dtype", "in/dev", "out/dev", "sent/dev", "flops/dev", "time"]

    def __rich__(self):
        from rich.table import Table

        t = Table(title=f"shardlab ledger: {len(self)} events, "
                        f"{_fmt_bytes(self.total_bytes_sent)} sent per device")
        for h in self._HEAD:
            t.add_column(h, justify="left" if h in ("op", "axes", "dtype") else "right", no_wrap=True)
        for r in self._rows():
            t.add_row(*r)
        return t

    def table(self) -> str:
        """The events as a plain-text table."""
        from rich.console import Console

        console = Console(width=120, record=True, file=_Null(), color_system=None, force_jupyter=False)
        console.print(self.__rich__())
        return console.export_text()

    __str__ = table

    def __repr__(self):
        return f"Ledger({len(self)} events, {self.total_bytes_sent:.0f} bytes sent per device)"

    def _repr_html_(self):
        head = "".join(f"<th>{h}</th>" for h in self._HEAD)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                       for r in self._rows())
        return (f"<table><caption>shardlab ledger: {len(self)} events, "
                f"{_fmt_bytes(self.total_bytes_sent)} sent per device</caption>"
                f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


class _Null:
    def write(self, s):
        return len(s)

    def flush(self):
        pass


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.4g}{unit}"
        n /= 1024
    return str(n)


def _fmt_seconds(s) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.2f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"
