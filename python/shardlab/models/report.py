"""``Report``: what every calculator returns — named parts, a total, the formula used, and its
display (Jupyter, ``rich.print``, ``print``) with every figure in ``shardlab.units``.

A report converts to its total: ``int(r)`` and ``float(r)``. Its parts are in ``unit``; an
entry of ``extra`` is a plain number unless ``extra_units`` names its unit (so a count such as
``data_parallel`` never prints as bytes).

Example:
    >>> from shardlab.models.report import Report
    >>> r = Report("toy", {"a": 3e9, "b": 4e9}, unit="params", formula="a + b",
    ...            extra={"layers": 32, "per_layer": 2.1875e8}, extra_units={"per_layer": "params"})
    >>> r.total, r["b"], int(r), float(r)
    (7000000000.0, 4000000000.0, 7000000000, 7000000000.0)
    >>> print(r)
    toy
      a          3.00B params  42.9%
      b          4.00B params  57.1%
      total      7.00B params
      layers               32
      per_layer   219M params
      formula: a + b
"""

from __future__ import annotations

import numbers

from rich.console import Group
from rich.table import Table
from rich.text import Text

from shardlab import units
from shardlab.viz import Displayed, View
from shardlab.viz.view import esc, figure_html, table_html

__all__ = ["Report"]


def _fmt(v, unit: str) -> str:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return str(v)
    return units.fmt_quantity(v, unit)


class Report(Displayed):
    """Named parts that sum to ``total`` (or not, when ``total`` is given), with the formula.

    Parts are readable as items (``r["attention"]``) and attributes (``r.attention``).
    ``extra`` holds figures that are not parts of the sum (shown below the total), each a
    plain number unless ``extra_units`` gives its unit ("bytes", "s", "flops", "flop_rate",
    "params", "%" ...). ``unit`` is the parts' and the total's unit ("" for a plain count).
    """

    def __init__(self, title: str, parts: dict, *, unit: str = "", formula: str = "",
                 total=None, extra: dict | None = None, notes: tuple = (), extra_units: dict | None = None):
        self.title = title
        self.parts = dict(parts)
        self.unit = unit
        self.formula = formula
        self.total = sum(self.parts.values()) if total is None else total
        self.extra = dict(extra or {})
        self.extra_units = dict(extra_units or {})
        self.notes = tuple(notes)
        units.fmt_quantity(0, unit)  # an unknown unit fails here, naming the known ones
        unknown = set(self.extra_units) - set(self.extra)
        if unknown:
            raise ValueError(f"[Report] extra_units names {sorted(unknown)}, which are not in extra "
                             f"({', '.join(self.extra) or 'none'})")

    def __getitem__(self, name):
        if name in self.parts:
            return self.parts[name]
        if name in self.extra:
            return self.extra[name]
        raise KeyError(f"[{self.title}] no part {name!r}; parts: {', '.join(self.parts)}; "
                       f"extra: {', '.join(self.extra) or '-'}")

    def __getattr__(self, name):
        if name.startswith("_") or name in ("parts", "extra", "extra_units"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError as e:
            raise AttributeError(str(e)) from None

    def __int__(self) -> int:
        return int(self.total)

    def __float__(self) -> float:
        return float(self.total)

    def as_dict(self) -> dict:
        return {**self.parts, "total": self.total, **self.extra}

    def _share(self, v) -> str:
        if not isinstance(v, numbers.Real) or not isinstance(self.total, numbers.Real) or not self.total:
            return ""
        return units.fmt_percent(v / self.total)

    def view(self):
        """The display: a ``shardlab.viz.View``: each part with its share and a bar, the total,
        the other figures apart (they are not parts of the sum), the formula and the notes;
        ``.save("report.svg")`` and friends."""
        parts = [(k, _fmt(v, self.unit), self._share(v), v) for k, v in self.parts.items()]
        extras = [(k, _fmt(v, self.extra_units.get(k, ""))) for k, v in self.extra.items()]
        total = _fmt(self.total, self.unit)
        top = max((v for *_, v in parts if isinstance(v, numbers.Real)), default=0)
        rows, classes = [], []
        for k, v, share, x in parts:
            drawn = isinstance(x, numbers.Real) and x > 0 and top > 0 and len(parts) > 1
            bar = (f'<span class="sl-bar" style="width:{max(round(160 * x / top), 1)}px;background:#6f8fd0"></span>'
                   if drawn else "")
            rows.append([esc(k), esc(v), esc(share), bar])
            classes.append("")
        rows.append(["total" if parts else "value", esc(total), "", ""])
        classes.append("sl-total")
        if extras:
            rows.append(["not in the total" if parts else "figures behind it", "", "", ""])
            classes.append("sl-section")
            rows += [[esc(k), esc(v), "", ""] for k, v in extras]
            classes += [""] * len(extras)
        notes = ([f"formula: {self.formula}"] if self.formula else []) + list(self.notes)
        body = table_html(["", "", "share" if len(parts) > 1 else "", ""], rows, numeric=(1, 2), row_classes=classes)
        body += "".join(f'<div class="sl-note">{esc(n)}</div>' for n in notes)
        html = figure_html("report", esc(self.title), body)
        w0 = max([len(k) for k, *_ in parts] + [len(k) for k, _ in extras] + [5])
        vals = [(k, v, s) for k, v, s, _ in parts] + [("total" if parts else "value", total, "")]
        vals += [(k, v, "") for k, v in extras]
        w1 = max(len(v) for _, v, _ in vals)
        lines = [self.title] + [f"  {k:<{w0}}  {v:>{w1}}" + (f"  {s}" if s else "") for k, v, s in vals]
        lines += [f"  formula: {self.formula}"] * bool(self.formula) + [f"  note: {n}" for n in self.notes]
        t = Table(show_header=False)
        t.add_column(no_wrap=True)
        t.add_column(justify="right", no_wrap=True)
        t.add_column(justify="right", no_wrap=True)
        for k, v, s in vals:
            last = k in ("total", "value") and not s
            t.add_row(Text(k), Text(v), Text(s), style="bold" if last else None, end_section=last)
        rich = Group(Text(self.title, style="bold"), t, *[Text(n, style="dim") for n in notes])
        return View(html, "\n".join(lines), rich, self.as_dict())

    def __repr__(self):
        return f"<{type(self).__name__} {self.title}: total {_fmt(self.total, self.unit)}>"
