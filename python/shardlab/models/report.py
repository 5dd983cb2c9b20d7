"""``Report``: what every calculator returns — named parts, a total, the formula used, and a
text and HTML view.

Example:
    >>> from shardlab.models.report import Report
    >>> r = Report("toy", {"a": 3, "b": 4}, unit="params", formula="a + b")
    >>> r.total, r["b"]
    (7, 4)
    >>> print(r)  # doctest: +NORMALIZE_WHITESPACE
    toy
      a      3  (42.9%)
      b      4  (57.1%)
      total  7
    formula: a + b
"""

from __future__ import annotations

import html

__all__ = ["Report", "fmt_count", "fmt_bytes"]


def fmt_count(x: float, unit: str = "") -> str:
    """``7.0B``, ``512K``-style figure for counts and FLOPs; exact digits below 10^4."""
    if unit == "bytes":
        return fmt_bytes(x)
    if unit == "s":
        return f"{x * 1e3:.4g} ms" if abs(x) < 1 else f"{x:.4g} s"
    if abs(x) < 1e4:
        return f"{x:,.6g}"
    for scale, s in ((1e15, "P"), (1e12, "T"), (1e9, "B" if unit == "params" else "G"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= scale:
            return f"{x / scale:.4g}{s}"
    return str(x)


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.4g} {unit}"
        n /= 1024
    return str(n)


class Report:
    """Named parts that sum to ``total`` (or not, when ``total`` is given), with the formula.

    Parts are readable as items (``r["attention"]``) and attributes (``r.attention``).
    ``extra`` holds figures that are not parts of the sum (shown below the table).
    """

    def __init__(self, title: str, parts: dict, *, unit: str = "", formula: str = "",
                 total=None, extra: dict | None = None, notes: tuple = ()):
        self.title = title
        self.parts = dict(parts)
        self.unit = unit
        self.formula = formula
        self.total = sum(self.parts.values()) if total is None else total
        self.extra = dict(extra or {})
        self.notes = tuple(notes)

    def __getitem__(self, name):
        if name in self.parts:
            return self.parts[name]
        if name in self.extra:
            return self.extra[name]
        raise KeyError(f"[{self.title}] no part {name!r}; parts: {', '.join(self.parts)}; "
                       f"extra: {', '.join(self.extra) or '-'}")

    def __getattr__(self, name):
        if name.startswith("_") or name in ("parts", "extra"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError as e:
            raise AttributeError(str(e)) from None

    def as_dict(self) -> dict:
        return {**self.parts, "total": self.total, **self.extra}

    def _share(self, v) -> str:
        if not isinstance(v, (int, float)) or not self.total or isinstance(self.total, str):
            return ""
        return f"({100.0 * v / self.total:.1f}%)"

    def _rows(self):
        rows = [(k, fmt_count(v, self.unit), self._share(v)) for k, v in self.parts.items()]
        rows.append(("total", fmt_count(self.total, self.unit), ""))
        rows += [(k, fmt_count(v, self.unit) if isinstance(v, (int, float)) and not isinstance(v, bool)
                  else str(v), "") for k, v in self.extra.items()]
        return rows

    def __str__(self):
        rows = self._rows()
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        lines = [self.title]
        for k, v, s in rows:
            lines.append(f"  {k:<{w0}}  {v:>{w1}}" + (f"  {s}" if s else ""))
        if self.formula:
            lines.append(f"formula: {self.formula}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __repr__(self):
        return f"<{type(self).__name__} {self.title}: total {fmt_count(self.total, self.unit)}>"

    def _repr_html_(self):
        body = "".join(f"<tr><td>{html.escape(k)}</td><td style='text-align:right'>{html.escape(v)}</td>"
                       f"<td>{html.escape(s)}</td></tr>" for k, v, s in self._rows())
        foot = ""
        if self.formula:
            foot += f"<p><b>formula:</b> <code>{html.escape(self.formula)}</code></p>"
        foot += "".join(f"<p><i>note:</i> {html.escape(n)}</p>" for n in self.notes)
        return (f"<div><table><caption>{html.escape(self.title)}</caption><tbody>{body}</tbody>"
                f"</table>{foot}</div>")
