"""View: what every ``shardlab.viz`` function returns - HTML for Jupyter, rich for the terminal,
plain text for ``print`` and logs.

Example:
    >>> from shardlab.viz.view import View
    >>> v = View("<b>hi</b>", "hi")
    >>> str(v), v._repr_html_()[-9:]
    ('hi', '<b>hi</b>')
"""

from __future__ import annotations

import html as _html

__all__ = ["View", "CSS", "table_html", "esc", "device_prefix"]

# One style sheet for every view: left-aligned text, right-aligned tabular numbers.
CSS = (
    ".sl-view{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;font-size:13px;"
    "color:#1b1b1b;margin:6px 0;line-height:1.35}"
    ".sl-view .sl-title{font-weight:600;font-size:14px;margin:0 0 2px 0}"
    ".sl-view .sl-sub{color:#555;margin:0 0 6px 0}"
    ".sl-view code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}"
    ".sl-view table.sl-table{border-collapse:collapse;margin:4px 0}"
    ".sl-view table.sl-table th,.sl-view table.sl-table td{padding:3px 10px;border-bottom:1px solid #e3e3e3;"
    "text-align:left;white-space:nowrap;vertical-align:top}"
    ".sl-view table.sl-table th{background:#f3f3f3;font-weight:600;border-bottom:1px solid #bbb}"
    ".sl-view table.sl-table td.num,.sl-view table.sl-table th.num{text-align:right;"
    "font-variant-numeric:tabular-nums}"
    ".sl-view table.sl-table tr.sl-section td{background:#eef2f8;font-weight:600;border-top:1px solid #bbb}"
    ".sl-view table.sl-table tr.sl-subtotal td{color:#444;font-style:italic}"
    ".sl-view table.sl-table tr.sl-total td{font-weight:700;border-top:2px solid #555;background:#fafafa}"
    ".sl-view ul{margin:4px 0 4px 18px;padding:0}"
    ".sl-view .sl-note{color:#555;font-size:12px}"
)


def esc(s) -> str:
    return _html.escape(str(s))


def device_prefix(mesh) -> str:
    """"TPU", "GPU" or "CPU": how the mesh's devices are named (by its hardware preset)."""
    hw = getattr(mesh, "hardware", None)
    fam = getattr(hw, "family", None)
    return {"tpu": "TPU", "gpu": "GPU"}.get(fam, "CPU")


def table_html(head, rows, *, numeric=(), row_classes=None) -> str:
    """An HTML table; columns whose index is in ``numeric`` are right-aligned.

    Example:
        >>> "num" in table_html(["a", "b"], [["x", "1"]], numeric=(1,))
        True
    """
    def cell(tag, i, c):
        cls = ' class="num"' if i in numeric else ""
        return f"<{tag}{cls}>{c}</{tag}>"

    h = "".join(cell("th", i, esc(c)) for i, c in enumerate(head)) if any(head) else ""
    body = []
    for k, r in enumerate(rows):
        cls = row_classes[k] if row_classes else ""
        attr = f' class="{cls}"' if cls else ""
        body.append(f"<tr{attr}>" + "".join(cell("td", i, c) for i, c in enumerate(r)) + "</tr>")
    thead = f"<thead><tr>{h}</tr></thead>" if h else ""
    return f'<table class="sl-table">{thead}<tbody>{"".join(body)}</tbody></table>'


class View:
    """A rendered picture or table.

    Attributes:
        html: the HTML fragment (styled, self-contained).
        text: the plain-text form (``str(view)``).
        renderable: a rich renderable for coloured terminal output (``rich.print(view)``), or None.
        data: the numbers the view shows, for tests and further use.
    """

    def __init__(self, html: str, text: str, renderable=None, data: dict | None = None):
        self.html = html
        self.text = text
        self.renderable = renderable
        self.data = data or {}

    def _repr_html_(self) -> str:
        return f"<style>{CSS}</style>{self.html}"

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        first = self.text.splitlines()[0] if self.text else ""
        return f"<shardlab view: {first}>"

    def __rich__(self):
        if self.renderable is not None:
            return self.renderable
        from rich.text import Text

        return Text(self.text)

    def show(self) -> None:
        """Displays the view: HTML in Jupyter, colours in a terminal (rich)."""
        try:
            from IPython import get_ipython

            ip = get_ipython()
            if ip is not None and "IPKernelApp" in ip.config:
                from IPython.display import HTML, display

                display(HTML(self._repr_html_()))
                return
        except ImportError:
            pass
        from rich.console import Console

        Console().print(self)

    def save(self, path: str) -> None:
        """Writes a standalone HTML page (e.g. to open in a browser or screenshot).

        Example:
            >>> import os, tempfile
            >>> p = os.path.join(tempfile.mkdtemp(), "v.html")
            >>> View("<b>x</b>", "x").save(p); "<b>x</b>" in open(p).read()
            True
        """
        with open(path, "w", encoding="utf-8") as f:
            f.write("<!doctype html><html><head><meta charset='utf-8'><style>body{margin:16px;"
                    "background:#fff}</style></head><body>" + self._repr_html_() + "</body></html>")
