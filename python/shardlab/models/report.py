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

from shardlab import units
from shardlab.viz import Displayed
from shardlab.viz.view import bar_html, kv_view

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
        """The display: a ``shardlab.viz.View`` (bars of each part's share, the figures, the
        formula and notes); ``.save("report.svg")`` and friends."""
        rows = [(k, f"{_fmt(v, self.unit)}  {self._share(v)}".rstrip()) for k, v in self.parts.items()]
        rows.append(("total", _fmt(self.total, self.unit)))
        rows += [(k, _fmt(v, self.extra_units.get(k, ""))) for k, v in self.extra.items()]
        top = max((v for v in self.parts.values() if isinstance(v, numbers.Real)), default=0)
        bars = "".join(bar_html(k, v, top, self._share(v)) for k, v in self.parts.items()
                       if isinstance(v, numbers.Real) and len(self.parts) > 1)
        notes = ([f"formula: {self.formula}"] if self.formula else []) + list(self.notes)
        v = kv_view("report", self.title, rows, notes=notes, before_html=bars, data=self.as_dict())
        # the plain text: right-aligned figures, shares in their own column
        w0 = max(len(k) for k, _ in rows)
        vals = [(k, _fmt(x, self.unit), self._share(x)) for k, x in self.parts.items()]
        vals.append(("total", _fmt(self.total, self.unit), ""))
        vals += [(k, _fmt(x, self.extra_units.get(k, "")), "") for k, x in self.extra.items()]
        w1 = max(len(x) for _, x, _ in vals)
        lines = [self.title] + [f"  {k:<{w0}}  {x:>{w1}}" + (f"  {s}" if s else "") for k, x, s in vals]
        lines += [f"  formula: {self.formula}"] * bool(self.formula) + [f"  note: {n}" for n in self.notes]
        v.text = "\n".join(lines)
        return v

    def __repr__(self):
        return f"<{type(self).__name__} {self.title}: total {_fmt(self.total, self.unit)}>"
