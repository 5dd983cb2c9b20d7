"""Pictures of shardings: which device holds which block.

``visualize_array_sharding(arr)`` prints a rich table in a terminal and shows HTML in
Jupyter; ``sharding_diagram(shape, sharding)`` returns the picture as an object (``str()``
is plain text).

Example:
    >>> import shardlab as sl
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((2, 2), ("x", "y"))
    >>> d = sl.debug.sharding_diagram((4, 4), sl.NamedSharding(mesh, P("x")))
    >>> d.cells
    [[(0, 1)], [(2, 3)]]
"""

from __future__ import annotations

import html

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table

from .arrays.local_array import LocalArray
from .arrays.sharded_array import ShardedArray
from .arrays.storage import is_abstract
from .core import views
from .core.sharding import NamedSharding, PartitionSpec
from .ledger.ledger import _Null
from .planning.plan import Layout, Term

_COLORS = ["#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#31a354",
           "#756bb1", "#636363", "#e6550d", "#969696", "#9c9ede", "#cedb9c", "#e7cb94", "#e7969c"]


class ShardingDiagram:
    """A 1-D or 2-D array's blocks and the devices holding each (``cells[row][col]``)."""

    def __init__(self, shape, sharding: NamedSharding):
        shape = tuple(shape)
        if len(shape) not in (1, 2):
            raise ValueError(f"[visualize_sharding] can draw 1-D and 2-D arrays, got shape {shape}")
        self.shape = shape
        self.sharding = sharding
        index_map = sharding.devices_indices_map(shape)
        rows, cols, owners = set(), set(), {}
        for dev, idx in index_map.items():
            r = _span(idx[0], shape[0]) if len(shape) == 2 else (0, 1)
            c = _span(idx[-1], shape[-1])
            rows.add(r)
            cols.add(c)
            owners.setdefault((r, c), []).append(dev.id)
        self.row_spans = sorted(rows)
        self.col_spans = sorted(cols)
        self.cells = [[tuple(sorted(owners[(r, c)])) for c in self.col_spans] for r in self.row_spans]

    def _label(self, ids) -> str:
        return "CPU " + ",".join(str(i) for i in ids)

    def __rich__(self):
        t = Table(show_header=False, show_lines=True, box=box.SQUARE)
        for _ in self.col_spans:
            t.add_column(justify="center", min_width=8)
        for row in self.cells:
            t.add_row(*[self._label(ids) for ids in row])
        return t

    def __str__(self):
        console = Console(width=120, record=True, file=_Null(), color_system=None, force_jupyter=False)
        console.print(self.__rich__())
        return console.export_text()

    def _repr_html_(self):
        total_w = self.shape[-1]
        total_h = self.shape[0] if len(self.shape) == 2 else 1
        out = ['<table style="border-collapse:collapse;margin:4px 0">']
        for r, row in zip(self.row_spans, self.cells):
            h = max(24, int(160 * (r[1] - r[0]) / total_h))
            out.append("<tr>")
            for c, ids in zip(self.col_spans, row):
                w = max(48, int(480 * (c[1] - c[0]) / total_w))
                color = _COLORS[hash(ids) % len(_COLORS)]
                out.append(f'<td style="width:{w}px;height:{h}px;background:{color};color:white;'
                           f'text-align:center;border:1px solid white;font-family:monospace">'
                           f"{html.escape(self._label(ids))}</td>")
            out.append("</tr>")
        out.append("</table>")
        return "".join(out)


def _span(s: slice, size: int) -> tuple:
    start, stop, _ = s.indices(size)
    return (start, stop)


def sharding_diagram(shape, sharding: NamedSharding) -> ShardingDiagram:
    """The picture of `sharding` for an array of `shape`."""
    if not isinstance(sharding, NamedSharding):
        raise TypeError(f"[visualize_sharding] expected a NamedSharding, got {type(sharding).__name__}")
    return ShardingDiagram(shape, sharding)


def _show(shape, sharding: NamedSharding) -> None:
    """Draws with shardlab.viz's picture (a colour per block, the book's notation, any rank)
    when it is registered, else with the plain diagram; HTML in Jupyter, colour in a terminal."""
    draw = views.SHARDING_PICTURE[0]
    picture = draw(shape, sharding) if draw is not None else sharding_diagram(shape, sharding)
    try:
        from IPython import get_ipython

        if get_ipython() is not None and "IPKernelApp" in get_ipython().config:
            from IPython.display import HTML, display

            display(HTML(picture.html if draw is not None else picture._repr_html_()))
            return
    except ImportError:
        pass
    Console().print((picture.renderable or picture.text) if draw is not None else picture.__rich__())


def visualize_sharding(shape, sharding: NamedSharding) -> None:
    """Draws which devices hold each block of an array of `shape` (as jax.debug)."""
    if not isinstance(sharding, NamedSharding):
        raise TypeError(f"[visualize_sharding] expected a NamedSharding, got {type(sharding).__name__}")
    _show(tuple(shape), sharding)


def visualize_array_sharding(arr) -> None:
    """Draws the layout of a ShardedArray (as ``jax.debug.visualize_array_sharding``)."""
    if not isinstance(arr, ShardedArray):
        raise TypeError(f"[visualize_array_sharding] expected a ShardedArray, got {type(arr).__name__}")
    _show(arr.shape, arr.sharding)


def notation(sharding, ndim: int | None = None, *, name: str = "A", letters: str = "IJKLMNOP",
             unreduced=(), fmt: str = "text") -> str:
    """The book's notation for a sharding: ``A[I_XY, J]``, ``C[I, K]{U_X}``.

    Args:
        sharding: a ShardedArray, NamedSharding or PartitionSpec.
        ndim: the array's rank (taken from a ShardedArray; defaults to the spec's length).
        name, letters: the array's name and its dims' letters.
        unreduced: mesh axes the value is unreduced along (a ShardedArray's own by default).
        fmt: "text", "latex" or "html".

    Example:
        >>> from shardlab import P
        >>> notation(P(("X", "Y"), None))
        'A[I_XY, J]'
        >>> notation(P(None, "Y"), 2, name="W", letters="DF")
        'W[D, F_Y]'
    """
    if isinstance(sharding, ShardedArray):
        ndim = sharding.ndim if ndim is None else ndim
        unreduced = unreduced or sharding.unreduced
        sharding = sharding.sharding
    spec = sharding.spec if isinstance(sharding, NamedSharding) else sharding
    if not isinstance(spec, PartitionSpec):
        raise TypeError(f"[notation] expected a ShardedArray, NamedSharding or PartitionSpec, got {spec!r}")
    ndim = len(spec) if ndim is None else ndim
    if len(spec) > ndim or ndim > len(letters):
        raise ValueError(f"[notation] {spec!r} for rank {ndim} with letters {letters!r}: need "
                         f"len(spec) <= ndim <= len(letters)")
    if fmt not in ("text", "latex", "html"):
        raise ValueError(f"[notation] fmt={fmt!r}; use 'text', 'latex' or 'html'")
    layout = Layout(tuple(spec.normalized(ndim)), frozenset(unreduced))
    return Term(name, letters[:ndim], layout, (0,) * ndim, np.dtype(np.float32)).render(fmt)


def device_values(x) -> np.ndarray:
    """Every device's value of a per-device LocalArray, stacked in mesh order:
    shape ``mesh.axis_sizes + local shape`` (for printing inside shard_map)."""
    if not isinstance(x, LocalArray):
        raise TypeError(f"[device_values] expected a LocalArray, got {type(x).__name__}")
    if is_abstract(x.storage):
        raise TypeError("[device_values] the value is abstract (shape and dtype only): it has no data")
    return np.broadcast_to(x.storage, tuple(x.mesh.axis_sizes) + x.shape).copy()


def _sharded_array_html(arr: ShardedArray) -> str:
    head = html.escape(repr(arr))
    if arr.ndim <= 2:
        return f"<div><code>{head}</code>{sharding_diagram(arr.shape, arr.sharding)._repr_html_()}</div>"
    return f"<code>{head}</code>"


views.register("ShardedArray", _sharded_array_html)
