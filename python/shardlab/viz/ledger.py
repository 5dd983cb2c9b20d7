"""The ledger as a styled table: text left, numbers right with one set of units, sections by
label and phase (when events carry them), subtotals and a totals row.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P, viz
    >>> mesh = sl.make_mesh((8,), ("x",), hardware="tpu-v5e")
    >>> f = sl.shard_map(lambda a: sl.lax.psum(a, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())
    >>> with sl.Ledger() as ledger:
    ...     _ = f(np.ones((8, 256), np.float32))
    >>> v = viz.ledger_view(ledger)
    >>> v.data["total"]["bytes_sent"], "sl-total" in v.html
    (1792.0, True)
"""

from __future__ import annotations

import csv
import json
import os

from rich.console import Console
from rich.table import Table

import shardlab as sl
from shardlab import units, views

from .timeline import chrome_trace, schedule_events
from .view import View, esc, figure_html, table_html

__all__ = ["ledger_view", "ledger_html", "ledger_text", "event_rows", "save_ledger"]

HEAD = ["op", "axes", "n", "dtype", "in / device", "out / device", "sent / device", "FLOP / device", "time"]
_NUMERIC = (2, 4, 5, 6, 7, 8)


def _events(ledger) -> list[dict]:
    return list(ledger.events) if hasattr(ledger, "events") else list(ledger)


def _section(e: dict) -> str:
    parts = [str(e[k]) for k in ("phase", "label") if e.get(k)]
    return " / ".join(parts)


def event_rows(events) -> list[list[str]]:
    """One row of formatted cells per event (compute events show FLOPs, collectives bytes)."""
    rows = []
    for e in events:
        compute = bool(e.get("flops"))
        rows.append([e["op"], ",".join(e.get("axes") or ()) or "-", str(e.get("group_size", "-")),
                     str(e.get("dtype", "-")),
                     "-" if compute else units.fmt_bytes(e.get("bytes_in")),
                     "-" if compute else units.fmt_bytes(e.get("bytes_out")),
                     "-" if compute else units.fmt_bytes(e.get("bytes_sent")),
                     units.fmt_flops(e["flops"]) if compute else "-",
                     units.fmt_seconds(e.get("seconds"))])
    return rows


def _sum(events) -> dict:
    secs = [e.get("seconds") for e in events]
    return {"count": len(events), "bytes_sent": float(sum(e.get("bytes_sent") or 0 for e in events)),
            "flops": float(sum(e.get("flops") or 0 for e in events)),
            "seconds": None if any(s is None for s in secs) or not secs else float(sum(secs))}


def _total_row(label: str, t: dict) -> list[str]:
    return [label, "", "", "", "", "", units.fmt_bytes(t["bytes_sent"]),
            units.fmt_flops(t["flops"]) if t["flops"] else "-", units.fmt_seconds(t["seconds"])]


def _grouped(events):
    """[(section, events)] in first-seen order; one unnamed section when no event has a label."""
    order: dict[str, list] = {}
    for e in events:
        order.setdefault(_section(e), []).append(e)
    return list(order.items())


def ledger_view(ledger, *, title: str | None = None) -> View:
    """The ledger (or a list of event dicts) as a View: HTML table, rich table, plain text.

    Events with ``phase`` / ``label`` keys are grouped under section rows with subtotals; the
    last row totals every event (time is "-" when an event has no estimate, i.e. no hardware).
    """
    events = _events(ledger)
    total = _sum(events)
    groups = _grouped(events)
    # A forward-only program without named scopes is one plain table.
    sectioned = len(groups) > 1 or (groups and groups[0][0] not in ("", "forward"))
    rows, classes = [], []
    for name, evs in groups:
        if sectioned:
            rows.append([esc(name or "(no label)")] + [""] * 8)
            classes.append("sl-section")
        for r in event_rows(evs):
            rows.append([esc(c) for c in r])
            classes.append("")
        if sectioned:
            rows.append([esc(c) for c in _total_row(f"subtotal ({len(evs)})", _sum(evs))])
            classes.append("sl-subtotal")
    rows.append([esc(c) for c in _total_row(f"total ({units.plural(len(events), 'event')})", total)])
    classes.append("sl-total")
    for r in rows:  # ops and section names in code font
        if r[0] and not r[0].startswith(("subtotal", "total")):
            r[0] = f"<code>{r[0]}</code>"
    cap = title or (f"ledger: {units.plural(len(events), 'event')}, {units.fmt_bytes(total['bytes_sent'])} sent per device"
                    + (f", {units.fmt_seconds(total['seconds'])}" if total["seconds"] is not None else ""))
    sub = ("times are each event's alone; the total adds them (no overlap: viz.timeline shows what overlaps)"
           if total["seconds"] is not None and len(events) > 1 else "")
    html = figure_html("ledger", esc(cap), table_html(HEAD, rows, numeric=_NUMERIC, row_classes=classes), esc(sub))
    text, renderable = _rich(cap, groups, sectioned, total, len(events))
    return View(html, text, renderable, {"total": total, "sections": [g for g, _ in groups]})


views.register_view(sl.Ledger, ledger_view)


def ledger_html(ledger) -> str:
    """The styled HTML table (``Ledger._repr_html_``)."""
    return ledger_view(ledger)._repr_html_()


def ledger_text(ledger) -> str:
    """The plain-text table (``str(ledger)``), box lines that survive HTML and terminals."""
    return ledger_view(ledger).text


def _rich(cap, groups, sectioned, total, n):
    t = Table(title=cap, title_justify="left")
    for i, h in enumerate(HEAD):
        t.add_column(h, justify="right" if i in _NUMERIC else "left", no_wrap=True)
    for name, evs in groups:
        if sectioned:
            t.add_row(f"[bold]{name or '(no label)'}[/bold]", *[""] * 8)
        for r in event_rows(evs):
            t.add_row(*r)
        if sectioned:
            t.add_row(*_total_row(f"subtotal ({len(evs)})", _sum(evs)), style="italic")
    t.add_row(*_total_row(f"total ({units.plural(n, 'event')})", total), style="bold", end_section=True)
    console = Console(width=140, record=True, file=_Null(), color_system=None, force_jupyter=False)
    console.print(t)
    return console.export_text(), t


class _Null:
    def write(self, s):
        return len(s)

    def flush(self):
        pass


def _plain(v):
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    return v if v is None or isinstance(v, (str, int, float, bool)) else str(v)


def save_ledger(ledger, path: str) -> None:
    """Writes a ledger's events to ``path``, by its extension:

    - ``.csv``: one row per event, the ledger's fields as columns (axes joined by ``,``);
    - ``.json``: a list of event objects (the ``ledger.events`` dicts);
    - ``.trace.json`` (or ``.perfetto.json``): the Chrome trace-event format of the ledger's
      timeline (``viz.timeline``: compute and communication lanes, data dependencies kept), for
      https://ui.perfetto.dev or chrome://tracing. It needs modelled times: a mesh with hardware
      (for host times, record with ``shardlab.profiler.trace`` instead).

    The picture of the ledger saves with ``viz.ledger_view(ledger).save("ledger.svg")``.

    Example:
        >>> import csv, json, os, tempfile, numpy as np, shardlab as sl
        >>> from shardlab import P, viz
        >>> mesh = sl.make_mesh((8,), ("x",), hardware="tpu-v5e")
        >>> f = sl.shard_map(lambda a: sl.lax.psum(a, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())
        >>> with sl.Ledger() as led:
        ...     _ = f(np.ones((8, 256), np.float32))
        >>> d = tempfile.mkdtemp()
        >>> for name in ("l.csv", "l.json", "l.trace.json"):
        ...     viz.save_ledger(led, os.path.join(d, name))
        >>> next(csv.DictReader(open(os.path.join(d, "l.csv"))))["bytes_sent"]
        '1792.0'
        >>> [e["name"] for e in json.load(open(os.path.join(d, "l.trace.json")))["traceEvents"] if e["ph"] == "X"]
        ['psum']
    """
    events = list(ledger.events) if hasattr(ledger, "events") else list(ledger)
    name = os.path.basename(str(path)).lower()
    if name.endswith((".trace.json", ".perfetto.json")):
        try:
            spans = schedule_events(events)
        except ValueError as err:
            raise ValueError(f"[save_ledger] {path!r}: a trace needs every event's time; {err}") from None
        chrome_trace(spans, path=str(path))
    elif name.endswith(".json"):
        with open(path, "w", encoding="utf-8") as f:
            json.dump([{k: _plain(v) for k, v in e.items()} for e in events], f, indent=1)
    elif name.endswith(".csv"):
        fields = list(events[0]) if events else ["op"]
        with open(path, "w", encoding="utf-8", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            for e in events:
                w.writerow({k: ",".join(map(str, v)) if isinstance(v, (tuple, list)) else
                            ("" if v is None else v) for k, v in e.items()})
    else:
        raise ValueError(f"[save_ledger] cannot save {path!r}: use a name ending in .csv, .json or .trace.json "
                         f"(the picture: viz.ledger_view(ledger).save('ledger.svg'))")
