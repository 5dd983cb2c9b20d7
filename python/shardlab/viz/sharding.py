"""Sharding diagrams: which device holds which block of an array.

Each distinct block gets its own colour (shardlab.viz.colors.palette), text on it is black or
white for contrast, the title is the book's notation with the global and per-device shapes,
devices are named after the mesh's hardware (TPU / GPU / CPU), the picture is capped in size
(64-way sharding stays under 640 px), and arrays of rank 3 or more are drawn as a row of 2-D
slices, one per block of the leading dims.

Example:
    >>> import shardlab as sl
    >>> from shardlab import P, viz
    >>> mesh = sl.make_mesh((4, 2), ("X", "Y"), hardware="tpu-v5e")
    >>> v = viz.sharding((8, 8), sl.NamedSharding(mesh, P("X", "Y")))
    >>> v.data["notation"], v.data["num_blocks"], v.data["blocks"][0]["label"]
    ('A[I_X, J_Y]', 8, 'TPU 0')
"""

from __future__ import annotations

import math

import numpy as np
from rich.box import SQUARE
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from shardlab import NamedSharding, ShardedArray
from shardlab import debug as _debug
from shardlab import units, views

from .colors import palette, text_color
from .view import View, device_prefix, esc

__all__ = ["sharding", "device_list"]

_MAX_W = 420       # px of one 2-D panel's grid, unless many column blocks need more
_MAX_TOTAL_W = 960  # px of all panels together
_MAX_H = 780
_ROW_PX = 12       # the smallest block height / width in px


def device_list(ids, limit: int = 4) -> str:
    """Device ids as short text: runs as ranges, long lists cut.

    Example:
        >>> device_list([0, 1, 2, 3]), device_list([0, 8, 16]), device_list(range(0, 64, 8))
        ('0-3', '0,8,16', '0,8,16,24,…(8)')
    """
    ids = sorted(int(i) for i in ids)
    parts, i = [], 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if j == i else f"{ids[i]}-{ids[j]}")
        i = j + 1
    if len(parts) > limit:
        return ",".join(parts[:limit]) + f",…({len(ids)})"
    return ",".join(parts)


def _span(s: slice, size: int) -> tuple[int, int]:
    start, stop, _ = s.indices(size)
    return (start, stop)


def _normalize(x, named, dtype):
    """(shape, NamedSharding, dtype, unreduced, dtype_assumed) from the ways the view can be called."""
    unreduced = ()
    if isinstance(x, ShardedArray) or (hasattr(x, "shape") and hasattr(x, "dtype")
                                       and isinstance(getattr(x, "sharding", None), NamedSharding)):
        # an array or its type (ShapeDtypeStruct, typeof's ShapedArray): its own dtype, never float32
        return (tuple(x.shape), x.sharding, np.dtype(x.dtype if dtype is None else dtype),
                tuple(getattr(x, "unreduced", ()) or ()), False)
    if named is None and isinstance(x, tuple) and len(x) in (2, 3) and isinstance(x[1], NamedSharding):
        shape, named = x[0], x[1]
        dtype = x[2] if len(x) == 3 else dtype
    else:
        shape = x
    if not isinstance(named, NamedSharding):
        raise TypeError(f"[viz.sharding] expected a ShardedArray, or a shape and a NamedSharding, got "
                        f"{type(x).__name__} and {type(named).__name__}; e.g. viz.sharding((8, 8), "
                        f"NamedSharding(mesh, P('x')))")
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise TypeError(f"[viz.sharding] shape must be a tuple of ints, got {shape!r}") from None
    return shape, named, np.dtype(dtype if dtype is not None else np.float32), unreduced, dtype is None


def _blocks(shape, named):
    """Distinct blocks (spans per dim) in device order, each with its owners."""
    index_map = named.devices_indices_map(shape)
    owners: dict[tuple, list[int]] = {}
    for dev, idx in index_map.items():
        spans = tuple(_span(s, n) for s, n in zip(idx, shape))
        owners.setdefault(spans, []).append(dev.id)
    ordered = sorted(owners.items(), key=lambda kv: min(kv[1]))
    return [(spans, tuple(sorted(ids))) for spans, ids in ordered]


def _fit(text_len: int, w: float, h: float) -> float:
    """Font px that fits ``text_len`` characters in a w x h box (0 if below 7 px)."""
    size = min(12.0, h * 0.72, (w - 4) / max(1, text_len) / 0.62)
    return size if size >= 7 else 0.0


def sharding(x, sharding: NamedSharding | None = None, *, dtype=None, name: str = "A",
             letters: str = "IJKLMNOP") -> View:
    """The picture of an array's sharding.

    Args:
        x: a ShardedArray (or its type: a ShapeDtypeStruct, ``typeof(x)``), a shape (with
            ``sharding``), or a ``(shape, NamedSharding)`` pair.
        sharding: the NamedSharding when ``x`` is a shape.
        dtype: element type for the byte counts of a bare shape (float32 by default, said so in
            the picture); an array's own dtype otherwise.
        name: the array's name in the notation (``A`` in ``A[I_X, J]``).
        letters: the dims' letters in the notation (``IJ`` in ``A[I_X, J]``).

    Returns:
        A View: HTML in Jupyter, a coloured table with ``rich.print``, text with ``print``;
        ``view.data`` holds the blocks, their owners and colours.

    Example:
        >>> import shardlab as sl
        >>> from shardlab import P, viz
        >>> mesh = sl.make_mesh((2, 2, 2), ("x", "y", "z"))
        >>> v = viz.sharding(((4, 4, 4), sl.NamedSharding(mesh, P("x", "y", "z"))))
        >>> v.data["panels"], len(v.data["blocks"])
        (2, 8)
    """
    shape, named, dt, unreduced, assumed = _normalize(x, sharding, dtype)
    mesh = named.mesh
    rank = len(shape)
    blocks = _blocks(shape, named)
    colors = palette(len(blocks))
    prefix = device_prefix(mesh)
    note = _debug.notation(named, rank, name=name, letters=letters, unreduced=unreduced) if rank else name
    note_html = _debug.notation(named, rank, name=name, letters=letters, unreduced=unreduced, fmt="html") \
        if rank else esc(name)

    # Panels: one per block of the leading dims (rank >= 3); rank 0/1 draw as one row.
    if rank >= 3:
        keys = sorted({sp[:-2] for sp, _ in blocks})
    else:
        keys = [()]
    lead = rank - 2 if rank >= 3 else 0
    rdim = rank - 2 if rank >= 2 else None
    cdim = rank - 1 if rank >= 1 else None
    rows_n = shape[rdim] if rdim is not None else 1
    cols_n = shape[cdim] if cdim is not None else 1
    row_spans = sorted({sp[rdim] for sp, _ in blocks}) if rdim is not None else [(0, 1)]
    col_spans = sorted({sp[cdim] for sp, _ in blocks}) if cdim is not None else [(0, 1)]

    # Geometry: aspect of the array, clamped; grow so each block is at least _ROW_PX.
    npan = len(keys)
    W = min(_MAX_W, max(160, (_MAX_TOTAL_W - 24 * (npan - 1)) // npan))
    W = min(max(W, _ROW_PX * len(col_spans)), max(W, (_MAX_TOTAL_W - 24 * (npan - 1)) // npan))
    if rank <= 1:
        H = 56
    else:
        H = min(_MAX_H, max(W * rows_n / cols_n, 80, _ROW_PX * len(row_spans)))
    W, H = int(W), int(H)

    block_info = []
    color_of = {}
    for k, ((spans, ids), c) in enumerate(zip(blocks, colors)):
        color_of[spans] = (k, c)
        block_info.append({"spans": spans, "owners": ids, "color": c, "text_color": text_color(c),
                           "label": f"{prefix} {device_list(ids)}"})

    panels_html, tables = [], []
    for key in keys:
        cells = []
        grid_txt = [["" for _ in col_spans] for _ in row_spans]
        grid_sty = [["" for _ in col_spans] for _ in row_spans]
        for spans, ids in blocks:
            if spans[:lead] != key:
                continue
            k, c = color_of[spans]
            fg = text_color(c)
            r = spans[rdim] if rdim is not None else (0, 1)
            cc = spans[cdim] if cdim is not None else (0, 1)
            x0, x1 = W * cc[0] / cols_n, W * cc[1] / cols_n
            y0, y1 = H * r[0] / rows_n, H * r[1] / rows_n
            w, h = x1 - x0, y1 - y0
            full = block_info[k]["label"]
            short = device_list(ids, limit=2)
            label, fs, vertical = "", 0.0, False
            for cand in (full, short):  # horizontal, else downwards in a tall thin block
                for vert in (False, True):
                    if not fs and (not vert or h > w):
                        fs = _fit(len(cand), h, w) if vert else _fit(len(cand), w, h)
                        label, vertical = (cand, vert) if fs else ("", False)
            if not fs:
                label = ""
            where = ", ".join(f"{a}:{b}" for a, b in spans) or "scalar"
            tip = f"{name}[{where}] on {prefix} {device_list(ids, limit=64)}"
            cells.append(
                f'<div class="sl-cell" data-block="{k}" title="{esc(tip)}" style="position:absolute;'
                f"left:{x0:.1f}px;top:{y0:.1f}px;width:{w:.1f}px;height:{h:.1f}px;background:{c};color:{fg};"
                f"box-sizing:border-box;border:1px solid #fff;display:flex;align-items:center;"
                f"justify-content:center;overflow:hidden;font:{fs or 7:.0f}px ui-monospace,Menlo,monospace;"
                f'white-space:nowrap{";writing-mode:vertical-rl" if vertical else ""}">{esc(label)}</div>')
            i, j = row_spans.index(r), col_spans.index(cc)
            grid_txt[i][j] = block_info[k]["label"]
            grid_sty[i][j] = f"{fg} on {c}"
        top = (f"dim {cdim} ({letters[cdim]}) = {cols_n} →" if cdim is not None else "")
        left = (f"dim {rdim} ({letters[rdim]}) = {rows_n} →" if rdim is not None else "")
        if H < 130 and rdim is not None:
            left = f"{letters[rdim]} →"
        head = ""
        if lead:
            sl_ = ", ".join(f"{a}:{b}" for a, b in key)
            head = f'<div class="sl-note" style="text-align:center">{esc(name)}[{esc(sl_)}, :, :]</div>'
        panels_html.append(
            f'<div class="sl-panel">{head}<div style="display:grid;grid-template-columns:18px {W}px;'
            f'grid-template-rows:18px {H}px"><div></div>'
            f'<div class="sl-note sl-axis" style="text-align:center">{esc(top)}</div>'
            f'<div class="sl-note sl-axis" style="writing-mode:vertical-rl;'
            f'text-align:center">{esc(left)}</div>'
            f'<div class="sl-grid" style="position:relative;width:{W}px;height:{H}px">{"".join(cells)}</div>'
            f"</div></div>")
        tables.append((key, grid_txt, grid_sty))

    local = tuple(b - a for a, b in blocks[0][0]) if rank else ()
    per_dev = math.prod(local) * dt.itemsize
    hw = mesh.hardware
    mesh_txt = " × ".join(f"{a}={s}" for a, s in mesh.shape.items())
    hw_txt = f" · {hw.description} ({hw.name})" if hw is not None else " · no hardware preset (CPU)"
    reps = len(blocks[0][1])
    title = f"{note}   {dt.name}{list(shape)} → per device {list(local)}, {units.fmt_bytes(per_dev)}"
    sub = (f"mesh {mesh_txt}{hw_txt}; {len(blocks)} distinct block{'s' * (len(blocks) != 1)}, "
           f"each on {reps} device{'s' * (reps != 1)}"
           + ("; no dtype given: bytes assume float32 (pass dtype=, or the array)" if assumed else ""))
    html = (f'<div class="sl-view sl-sharding" data-view="sharding">'
            f'<div class="sl-title"><code>{note_html}</code>&nbsp;&nbsp;{esc(dt.name)}{esc(list(shape))} → '
            f"per device {esc(list(local))}, {esc(units.fmt_bytes(per_dev))}</div>"
            f'<div class="sl-sub">{esc(sub)}</div>'
            f'<div style="display:flex;gap:24px;align-items:flex-start;flex-wrap:wrap">{"".join(panels_html)}</div>'
            f"</div>")
    text, renderable = _terminal(title, sub, tables, lead, name)
    data = {"notation": note, "shape": shape, "local_shape": local, "bytes_per_device": per_dev,
            "blocks": block_info, "num_blocks": len(blocks), "panels": len(keys), "width": W, "height": H,
            "prefix": prefix}
    return View(html, text, renderable, data)


def _terminal(title, sub, tables, lead, name):
    """A rich table per panel, cells coloured like the HTML; plain text without colour."""
    parts = [Text(title, style="bold"), Text(sub, style="dim")]
    for key, grid_txt, grid_sty in tables:
        t = Table(show_header=False, show_lines=True, box=SQUARE, padding=(0, 1))
        if lead:
            t.title = f"{name}[" + ", ".join(f"{a}:{b}" for a, b in key) + ", :, :]"
        for _ in grid_txt[0]:
            t.add_column(justify="center", no_wrap=True)
        for txt_row, sty_row in zip(grid_txt, grid_sty):
            t.add_row(*[Text(s or "", style=st or "") for s, st in zip(txt_row, sty_row)])
        parts.append(t)
    group = Group(*parts)
    console = Console(width=160, record=True, file=_Null(), color_system=None, force_jupyter=False)
    console.print(group)
    return console.export_text().rstrip() + "\n", group


class _Null:
    def write(self, s):
        return len(s)

    def flush(self):
        pass


def sharded_array_view(arr) -> View:
    """A ShardedArray as Jupyter shows it (``_repr_html_``): its repr above its sharding picture."""
    pic = sharding(arr)
    head = f'<div class="sl-view"><code style="white-space:pre-wrap">{esc(repr(arr))}</code></div>'
    return View(head + pic.html, f"{arr!r}\n{pic.text}", pic.renderable, pic.data)


views.register_view(ShardedArray, sharded_array_view)


def sharding_diagram_view(diagram) -> View:
    """``debug.sharding_diagram(shape, sharding)`` in Jupyter: the same picture as ``sharding``."""
    return sharding(diagram.shape, diagram.sharding)


views.register_view(_debug.ShardingDiagram, sharding_diagram_view)
