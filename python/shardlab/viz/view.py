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
import io
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

try:
    from PIL import Image, ImageChops
except ImportError:  # Pillow comes with matplotlib; only PNG export needs it
    Image = ImageChops = None

__all__ = ["View", "Displayed", "CSS", "table_html", "esc", "device_prefix", "figure_html", "kv_view", "grid_view",
           "bar_html", "stacked_bar_html", "short_tick"]

# One style sheet for every view: left-aligned text, right-aligned tabular numbers. Text takes the
# page's colour (readable on JupyterLab's and VS Code's dark themes as on light ones); lines and
# shading are translucent grey, which shows on both; pictures (SVG) sit on their own light card
# because their colours and labels are drawn for a light ground.
CSS = (
    ".sl-view{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;font-size:13px;"
    "color:inherit;margin:6px 0;line-height:1.35;max-width:100%;overflow-x:auto}"
    ".sl-view .sl-title{font-weight:600;font-size:14px;margin:0 0 2px 0}"
    ".sl-view .sl-sub,.sl-view .sl-note{opacity:.78;margin:0 0 6px 0}"
    ".sl-view .sl-note{font-size:12px}"
    ".sl-view code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px;"
    "color:inherit;background:none}"
    ".sl-view table.sl-table{border-collapse:collapse;margin:4px 0;color:inherit}"
    ".sl-view table.sl-table th,.sl-view table.sl-table td{padding:3px 10px;"
    "border-bottom:1px solid rgba(127,127,127,.3);text-align:left;white-space:nowrap;vertical-align:top;"
    "color:inherit;background:none}"
    ".sl-view table.sl-table th{background:rgba(127,127,127,.14);font-weight:600;"
    "border-bottom:1px solid rgba(127,127,127,.6)}"
    ".sl-view table.sl-table td.num,.sl-view table.sl-table th.num{text-align:right;"
    "font-variant-numeric:tabular-nums}"
    ".sl-view table.sl-table tr.sl-section td{background:rgba(80,120,200,.16);font-weight:600;"
    "border-top:1px solid rgba(127,127,127,.6)}"
    ".sl-view table.sl-table tr.sl-subtotal td{opacity:.85;font-style:italic}"
    ".sl-view table.sl-table tr.sl-total td{font-weight:700;border-top:2px solid rgba(127,127,127,.8);"
    "background:rgba(127,127,127,.08)}"
    ".sl-view table.sl-table tr.sl-chosen td{background:rgba(60,170,90,.22);font-weight:600}"
    ".sl-view ul{margin:4px 0 4px 18px;padding:0}"
    ".sl-view svg{background:#fff;color:#1b1b1b;border-radius:4px;max-width:none}"
    ".sl-view .sl-bar{display:inline-block;height:12px;border-radius:2px;vertical-align:middle}"
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


def figure_html(kind: str, title: str, body: str, sub: str = "") -> str:
    """The one frame of every view: ``<div class="sl-view sl-KIND">`` with title, subtitle, body
    (``title`` and ``sub`` are HTML; escape text with :func:`esc`)."""
    return (f'<div class="sl-view sl-{kind}" data-view="{kind}"><div class="sl-title">{title}</div>'
            + (f'<div class="sl-sub">{sub}</div>' if sub else "") + body + "</div>")


def bar_html(label: str, value: float, top: float, text: str, *, strong: bool = False, width: int = 260,
             color: str | None = None) -> str:
    """One labelled horizontal bar (its length ``value / top`` of ``width`` px) and its figure.

    Example:
        >>> 'width:130px' in bar_html("compute", 1.0, 2.0, "1.00 s")
        True
    """
    w = 0 if not top or not value or value <= 0 else max(1, round(width * min(value / top, 1.0)))
    c = color or ("#2f6bd0" if strong else "#8fa8d8")
    return (f'<div style="display:flex;align-items:center;gap:8px;margin:2px 0"><span style="min-width:120px">'
            f'{esc(label)}</span><span class="sl-bar" style="width:{w}px;background:{c}"></span>'
            f'<span style="font-variant-numeric:tabular-nums">{esc(text)}</span></div>')


def stacked_bar_html(segments, total: float, *, width: int = 420) -> str:
    """One horizontal bar of ``(label, value, colour)`` segments on a scale of ``total`` (a
    segment past the total shows as overflow), with a legend of the figures below.

    Example:
        >>> h = stacked_bar_html([("weights", 1.0, "#2f6bd0", "1 GiB"), ("free", 3.0, "#9aa7b8", "3 GiB")], 4.0)
        >>> h.count('class="sl-seg"'), "width:105px" in h
        (2, True)
    """
    scale = width / max(total, sum(v for _, v, _, _ in segments), 1e-300)
    segs = "".join(f'<span class="sl-seg" title="{esc(k)}: {esc(t)}" style="display:inline-block;height:14px;'
                   f'width:{max(0, round(v * scale))}px;background:{c}"></span>' for k, v, c, t in segments if v > 0)
    legend = "".join(f'<span style="margin-right:12px;white-space:nowrap"><span style="display:inline-block;'
                     f'width:10px;height:10px;border-radius:2px;background:{c};margin-right:4px"></span>'
                     f"{esc(k)} {esc(t)}</span>" for k, _, c, t in segments)
    over = sum(v for _, v, _, _ in segments) > total * (1 + 1e-9)
    mark = (f'<span title="capacity" style="position:absolute;left:{round(total * scale)}px;top:-3px;height:20px;'
            f'border-left:2px dashed #d1495b"></span>' if over else "")
    return (f'<div style="margin:4px 0"><div style="position:relative;display:flex;border:1px solid '
            f'rgba(127,127,127,.5);width:max-content">{segs}{mark}</div>'
            f'<div class="sl-note" style="margin-top:3px">{legend}'
            + ('<span style="white-space:nowrap">dashed line: capacity</span>' if over else "") + "</div></div>")


def short_tick(text: str) -> str:
    """A tick label without trailing zeros: "2.00 s" -> "2 s", "4.00k" -> "4k", "2.50 ms" -> "2.5 ms".

    Example:
        >>> short_tick("2.00 s"), short_tick("4.00k"), short_tick("2.50 ms"), short_tick("100 µs")
        ('2 s', '4k', '2.5 ms', '100 µs')
    """
    head, sep, tail = text.partition(" ")
    num = head.rstrip("kMGTPE")
    if "." in num:
        num = num.rstrip("0").rstrip(".")
    return num + head[len(head.rstrip("kMGTPE")):] + sep + tail


def _plain(renderable, width: int = 120) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None, force_jupyter=False,
                      force_terminal=False)
    console.print(renderable)
    return "\n".join(line.rstrip() for line in console.export_text().rstrip("\n").splitlines())


def kv_view(kind: str, title: str, rows, *, sub: str = "", notes=(), before_html: str = "",
            after_html: str = "", data: dict | None = None) -> View:
    """A two-column view (name, figure): HTML table, rich table and aligned text.

    Args:
        kind: the view's kind (``data-view`` in the HTML).
        title, sub: plain text.
        rows: ``(name, figure)`` pairs of strings; a name starting with two spaces is indented.
        notes: lines shown below the table.
        before_html, after_html: extra HTML (a bar chart, a picture) around the table.

    Example:
        >>> v = kv_view("toy", "Toy", [("a", "1.00 s"), ("b", "2.00 KiB")], notes=["an estimate"])
        >>> print(v)
        Toy
          a  1.00 s
          b  2.00 KiB
          note: an estimate
    """
    rows = [(str(k), str(v)) for k, v in rows]
    w = max((len(k) for k, _ in rows), default=0)
    text = "\n".join([title] + [f"  {k.ljust(w)}  {v}" for k, v in rows] + [f"  note: {n}" for n in notes])
    body = before_html + table_html(["", ""], [[esc(k).replace("  ", "&nbsp;&nbsp;", 1), esc(v)] for k, v in rows],
                                    numeric=(1,))
    body += "".join(f'<div class="sl-note">{esc(n)}</div>' for n in notes) + after_html
    html = figure_html(kind, esc(title), body, esc(sub))
    caption = "\n".join([sub] * bool(sub) + [f"note: {n}" for n in notes]) or None
    t = Table(show_header=False)
    t.add_column(no_wrap=True)
    t.add_column(justify="right", no_wrap=True)
    for k, v in rows:
        t.add_row(Text(k), Text(v))
    parts = ([Text(title, style="bold")] if title else []) + [t] + ([Text(caption, style="dim")] if caption else [])
    return View(html, text, Group(*parts), data)


def grid_view(kind: str, title: str, head, rows, *, numeric=(), sub: str = "", notes=(), row_classes=None,
              before_html: str = "", after_html: str = "", data: dict | None = None) -> View:
    """A table view with a header row: HTML, rich and text (rich's box drawing).

    ``row_classes`` mark rows ("sl-total", "sl-section", "sl-chosen": highlighted).

    Example:
        >>> v = grid_view("toy", "Toy", ["plan", "time"], [["a", "1.00 s"], ["b", "2.00 s"]], numeric=(1,),
        ...               row_classes=["sl-chosen", ""])
        >>> "sl-chosen" in v.html, v.text.splitlines()[0]
        (True, 'Toy')
    """
    rows = [[str(c) for c in r] for r in rows]
    classes = list(row_classes or [""] * len(rows))
    body = before_html + table_html(list(head), [[esc(c) for c in r] for r in rows], numeric=numeric,
                                    row_classes=classes)
    body += "".join(f'<div class="sl-note">{esc(n)}</div>' for n in notes) + after_html
    html = figure_html(kind, esc(title), body, esc(sub))
    t = Table()
    for i, h in enumerate(head):
        t.add_column(Text(str(h)), justify="right" if i in numeric else "left", no_wrap=True)
    for r, c in zip(rows, classes):
        style = {"sl-chosen": "bold green", "sl-total": "bold", "sl-section": "bold"}.get(c)
        t.add_row(*[Text(x) for x in r], style=style)
    text = "\n".join([title] * bool(title) + [_plain(t, width=160)] + [sub] * bool(sub))
    if notes:
        text += "\n" + "\n".join(f"note: {n}" for n in notes)
    parts = ([Text(title, style="bold")] if title else []) + [t] + ([Text(sub, style="dim")] if sub else [])
    return View(html, text, Group(*parts), data)


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
        return self.renderable if self.renderable is not None else Text(self.text)

    def show(self) -> None:
        """Displays the view: HTML in Jupyter, colours in a terminal (rich)."""
        ipython, display = sys.modules.get("IPython"), sys.modules.get("IPython.display")
        shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
        if display is not None and shell is not None and "IPKernelApp" in getattr(shell, "config", {}):
            display.display(display.HTML(self._repr_html_()))
            return
        Console().print(self)

    def page(self, *, dark: bool = False) -> str:
        """The view as a standalone HTML page (``dark``: on a dark ground, as in a dark theme)."""
        bg, fg = ("#1e1e1e", "#d4d4d4") if dark else ("#ffffff", "#1b1b1b")
        return (f"<!doctype html><html><head><meta charset='utf-8'><style>body{{margin:16px;background:{bg};"
                f"color:{fg}}}</style></head><body>{self._repr_html_()}</body></html>")

    def save(self, path: str, *, dark: bool = False) -> None:
        """Writes the view to ``path``, by its extension: ``.html`` (a standalone page), ``.svg``
        (vector, any viewer or a slide), or ``.png`` (rendered by a headless Chromium/Chrome:
        found on the PATH or named by ``SHARDLAB_BROWSER``).

        Example:
            >>> import os, tempfile
            >>> d = tempfile.mkdtemp()
            >>> v = View("<b>x</b>", "x")
            >>> v.save(os.path.join(d, "v.html")); v.save(os.path.join(d, "v.svg"))
            >>> "<b>x</b>" in open(os.path.join(d, "v.html")).read(), open(os.path.join(d, "v.svg")).read()[:4]
            (True, '<svg')
        """
        ext = os.path.splitext(str(path))[1].lower()
        if ext in (".html", ".htm"):
            data = self.page(dark=dark).encode()
        elif ext == ".svg":
            data = self.svg(dark=dark).encode()
        elif ext == ".png":
            data = self.png(dark=dark)
        else:
            raise ValueError(f"[View.save] cannot save {path!r}: use a name ending in .html, .svg or .png")
        with open(path, "wb") as f:
            f.write(data)

    def svg(self, *, dark: bool = False) -> str:
        """The view as an SVG document (the HTML inside a ``foreignObject``; browsers, Inkscape
        and slide tools show it). Its size is measured by a headless browser when one is found,
        else estimated from the content."""
        w, h = _measure(self, dark) if _browser() else _estimate_size(self)
        bg, fg = ("#1e1e1e", "#d4d4d4") if dark else ("#ffffff", "#1b1b1b")
        body = re.sub(r"<br>", "<br/>", self._repr_html_()).replace("&nbsp;", "&#160;")
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}">'
                f'<rect width="100%" height="100%" fill="{bg}"/><foreignObject x="0" y="0" width="{w}" height="{h}">'
                f'<div xmlns="http://www.w3.org/1999/xhtml" style="padding:8px;color:{fg}">{body}</div>'
                f"</foreignObject></svg>")

    def png(self, *, dark: bool = False, scale: float = 2.0) -> bytes:
        """The view rendered to PNG bytes by a headless Chromium/Chrome (``scale``: pixels per
        CSS pixel), cropped to the content."""
        return _screenshot(self.page(dark=dark), scale=scale, dark=dark)[0]


_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def _browser() -> str | None:
    named = os.environ.get("SHARDLAB_BROWSER")
    if named:
        return named
    for b in _BROWSERS:
        found = shutil.which(b)
        if found:
            return found
    return None


def _screenshot(page: str, *, scale: float, dark: bool) -> tuple[bytes, tuple[int, int]]:
    """(PNG bytes cropped to the content, its size in CSS px) of an HTML page."""
    browser = _browser()
    if browser is None:
        raise RuntimeError("[View.save] a PNG needs a headless Chromium or Chrome (none on the PATH); install "
                           "chromium, set SHARDLAB_BROWSER to its path, or save as .svg or .html")
    if Image is None:
        raise RuntimeError("[View.save] a PNG needs Pillow to crop the picture: pip install pillow")
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "view.html"), os.path.join(d, "view.png")
        with open(src, "w", encoding="utf-8") as f:
            f.write(page)
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--force-device-scale-factor={scale}", f"--screenshot={out}", "--window-size=2400,3000",
               "file://" + src]
        try:
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, check=True)
        except (OSError, subprocess.SubprocessError) as err:
            raise RuntimeError(f"[View.save] the browser {browser} could not render the view: {err}") from None
        img = Image.open(out).convert("RGB")
    ground = Image.new("RGB", img.size, (0x1e, 0x1e, 0x1e) if dark else (255, 255, 255))
    box = ImageChops.difference(img, ground).getbbox() or (0, 0, 1, 1)
    pad = round(8 * scale)
    box = (max(0, box[0] - pad), max(0, box[1] - pad), min(img.width, box[2] + pad), min(img.height, box[3] + pad))
    img = img.crop(box)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue(), (math.ceil(box[2] / scale) + 8, math.ceil(box[3] / scale) + 8)


def _measure(view: View, dark: bool) -> tuple[int, int]:
    return _screenshot(view.page(dark=dark), scale=1.0, dark=dark)[1]


def _estimate_size(view: View) -> tuple[int, int]:
    """Width and height (px) of a view without a browser: its pictures' sizes, its text's (on the
    generous side: a clipped picture is worse than a margin)."""
    sizes = [(float(w), float(h)) for w, h in re.findall(r'<svg[^>]*?width="([\d.]+)"[^>]*?height="([\d.]+)"',
                                                            view.html)]
    lines = view.text.splitlines() or [""]
    w = max([10.5 * len(lines[0]) + 40, 7.5 * max(len(x) for x in lines) + 40]
            + [sw + 40 for sw, _ in sizes] + [float(view.data.get("width", 0) or 0) + 80])
    h = 50 + 25 * view.html.count("<tr") + 22 * (view.html.count('class="sl-note"') + view.html.count("sl-sub"))
    h += sum(sh for _, sh in sizes) + float(view.data.get("height", 0) or 0) + 24 * view.html.count("<li")
    return math.ceil(min(w, 4000)), math.ceil(h)


class Displayed:
    """Mixin for result classes above viz (reports, estimates, schedules): a ``view()`` method
    returning a View gives them ``_repr_html_`` (Jupyter), ``__rich__`` (``rich.print``), ``__str__``
    (``print``) and ``save(path)`` (HTML, SVG, PNG), all from that one view."""

    def view(self) -> View:  # pragma: no cover - every subclass defines it
        """The one View every display of the object comes from."""
        raise NotImplementedError(f"{type(self).__name__} must define view() -> shardlab.viz.View")

    def _repr_html_(self) -> str:
        return self.view()._repr_html_()

    def __rich__(self):
        return self.view().__rich__()

    def __str__(self) -> str:
        return self.view().text

    def save(self, path: str, *, dark: bool = False) -> None:
        """Saves the display to ``path`` (.html, .svg or .png); see :meth:`View.save`."""
        self.view().save(path, dark=dark)
