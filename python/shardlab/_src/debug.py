"""Pictures of shardings: which device holds which block.

``visualize_array_sharding(arr)`` prints the picture ``jax.debug.visualize_array_sharding``
prints (rich boxes; rich shows them as HTML in Jupyter); ``sharding_diagram(shape, sharding)``
returns the blocks as an object (``str()`` is plain text), and ``shardlab.viz.sharding`` draws
any rank with the book's notation.

Example:
    >>> import shardlab as sl
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((2, 2), ("x", "y"))
    >>> d = sl.debug.sharding_diagram((4, 4), sl.NamedSharding(mesh, P("x")))
    >>> d.cells
    [[(0, 1)], [(2, 3)]]
"""

from __future__ import annotations


import numpy as np
from rich import box
from rich.align import Align
from rich.console import Console
from rich.padding import Padding
from rich.style import Style
from rich.table import Table

from .arrays.local_array import LocalArray
from .arrays.sharded_array import ShardedArray
from .arrays.storage import is_abstract
from .core import notation as _notation
from .core import views
from .core.mesh import devices
from .core.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding
from .core.tree import flatten
from .ledger.ledger import _Null


class ShardingDiagram(views.Viewable):
    """A 1-D or 2-D array's blocks and the devices holding each (``cells[row][col]``).

    ``print`` / ``rich.print`` draw JAX's boxes; Jupyter shows ``shardlab.viz.sharding``'s
    picture (registered there), the one picture engine."""

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

    def __rich__(self):
        return sharding_table(self.shape, self.sharding, use_color=False)

    def __str__(self):
        console = Console(width=120, record=True, file=_Null(), color_system=None, force_jupyter=False)
        console.print(self.__rich__())
        return console.export_text()


def _span(s: slice, size: int) -> tuple:
    start, stop, _ = s.indices(size)
    return (start, stop)


def sharding_diagram(shape, sharding: NamedSharding) -> ShardingDiagram:
    """The picture of `sharding` for an array of `shape`."""
    if not isinstance(sharding, NamedSharding):
        raise TypeError(f"[visualize_sharding] expected a NamedSharding, got {type(sharding).__name__}")
    return ShardingDiagram(shape, sharding)


def _blocks(shape: tuple, sharding) -> dict:
    """(row, col) block index → the ids of the devices holding that block (1-D arrays are one
    row), from the sharding's device → index map, as JAX's picture groups them."""
    if isinstance(sharding, NamedSharding):
        index_map = {dev.id: idx for dev, idx in sharding.devices_indices_map(shape).items()}
    else:  # one device holds everything (SingleDeviceSharding, a host array)
        dev = next(iter(sharding.device_set)) if hasattr(sharding, "device_set") else None
        index_map = {getattr(dev, "id", 0): (slice(None),) * len(shape)}
    blocks: dict = {}
    for dev_id, idx in index_map.items():
        chunk = []
        for size, s in zip(shape, idx):
            start, stop, _ = s.indices(size)
            chunk.append(0 if stop == start == 0 or stop - start == size else start // (stop - start))
        key = (0, chunk[0]) if len(shape) == 1 else tuple(chunk)
        blocks.setdefault(key, set()).add(dev_id)
    return blocks


def _spans(shape: tuple, sharding) -> dict:
    """(row, col) block index → (height, width) as fractions of the array (height None in 1-D)."""
    if not isinstance(sharding, NamedSharding):
        return {(0, 0): (None if len(shape) == 1 else 1.0, 1.0)}
    shard = sharding.shard_shape(shape)
    blocks = _blocks(shape, sharding)
    if len(shape) == 1:
        return {k: (None, shard[0] / shape[0] if shape[0] else 1.0) for k in blocks}
    return {k: (shard[0] / shape[0] if shape[0] else 1.0, shard[1] / shape[1] if shape[1] else 1.0)
            for k in blocks}


def _color_order(color_map, n: int):
    """JAX's colour walk: n evenly spaced colours of the map, visited with a stride of about
    half the count so neighbouring blocks get distant colours."""
    values = np.linspace(0, 1, n)
    i = 0
    for _ in range(n):
        yield color_map(values[i])
        i = (i + n // 2 + (n % 2 == 0)) % n


def _hex(color) -> str:
    if isinstance(color, str):
        return color
    r, g, b = (int(c * 255) for c in color[:3])
    return f"#{r:02X}{g:02X}{b:02X}"


def _text_on(bg: str) -> str:
    r, g, b = (int(bg[i:i + 2], 16) for i in (1, 3, 5))
    return "#000000" if r * 0.299 + g * 0.587 + b * 0.114 > 186 else "#ffffff"


def sharding_table(shape, sharding, *, use_color: bool = True, scale: float = 1.0, min_width: int = 9,
                   max_width: int = 80, color_map=None):
    """The rich table ``jax.debug.visualize_sharding`` prints: one box per block, sized by the
    block's share of the array, labelled with the devices that hold it ("CPU 0,1").

    Colour (matplotlib's tab20b, as JAX) when ``use_color``; otherwise the boxes are drawn with
    lines (``visualize_sharding`` draws lines where rich finds no colour terminal, as JAX).
    """

    shape = tuple(int(s) for s in shape)
    if not 1 <= len(shape) <= 2:
        raise ValueError(f"[visualize_sharding] only works for shapes with 1 and 2 dimensions, got shape {shape}; "
                         f"use shardlab.viz.sharding(shape, sharding) for any rank")
    if use_color and color_map is None:
        try:
            import matplotlib as mpl

            color_map = mpl.colormaps["tab20b"]
        except ModuleNotFoundError:
            use_color = False
    base_height = int(10 * scale)
    base_width = int(base_height * ((shape[1] if len(shape) == 2 else 1) / shape[0] if shape[0] else 1))
    blocks = _blocks(shape, sharding)
    spans = _spans(shape, sharding)
    rows = max(k[0] for k in blocks) + 1
    cols = max(k[1] for k in blocks) + 1
    colors = _color_order(color_map, rows * cols) if use_color else None
    kind = "CPU"
    table = Table(show_header=False, show_lines=not use_color, padding=0, highlight=not use_color,
                  pad_edge=False, box=box.SQUARE if not use_color else None)
    for i in range(rows):
        cells = []
        for j in range(cols):
            label = f"{kind} " + ",".join(str(d) for d in sorted(blocks[i, j]))
            height_frac, width_frac = spans[i, j]
            width = min(max(int(width_frac * base_width * 2.5), min_width), max_width)
            height = 1 if height_frac is None else int(height_frac * base_height)
            left, extra = divmod(width - len(label) - 2, 2)
            right = left + extra
            top, extra = divmod(height - 2, 2)
            bottom = top + extra
            style = Style()
            if use_color:
                bg = _hex(next(colors))
                style = Style(bgcolor=bg, color=_text_on(bg))
                top, right, bottom, left = top + 1, right + 1, bottom + 1, left + 1
            cells.append(Padding(Align(label, "center", vertical="middle"),
                                 (max(top, 0), max(right, 0), max(bottom, 0), max(left, 0)), style=style))
        table.add_row(*cells)
    return table


def _sharding_of(arr):
    if isinstance(arr, ShardedArray):
        return arr.sharding
    if isinstance(arr, (np.ndarray, np.generic, int, float, complex)):
        return SingleDeviceSharding(devices()[0])
    raise TypeError(f"[visualize_array_sharding] expected an array (a ShardedArray or a host array), got "
                    f"{type(arr).__name__}")


def visualize_sharding(shape, sharding, *, use_color: bool = True, scale: float = 1.0, min_width: int = 9,
                       max_width: int = 80, color_map=None) -> None:
    """Prints which devices hold each block of an array of ``shape``, as
    ``jax.debug.visualize_sharding`` prints it (same boxes, sizes and labels).

    For the book's notation, per-device bytes and arrays of any rank, use
    ``shardlab.viz.sharding(shape, sharding)``.

    Example:
        >>> import shardlab as sl
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((2,), ("x",))
        >>> sl.debug.visualize_sharding((4,), sl.NamedSharding(mesh, P("x")), use_color=False)
        ┌───────┬───────┐
        │ CPU 0 │ CPU 1 │
        └───────┴───────┘
    """

    if not isinstance(sharding, NamedSharding) and not hasattr(sharding, "device_set"):
        raise TypeError(f"[visualize_sharding] expected a Sharding (NamedSharding or SingleDeviceSharding), got "
                        f"{type(sharding).__name__}")
    console = Console(width=max_width)
    table = sharding_table(shape, sharding, use_color=use_color and console.color_system is not None, scale=scale,
                           min_width=min_width, max_width=max_width, color_map=color_map)
    console.print(table, end="\n\n")


def visualize_array_sharding(arr, **kwargs) -> None:
    """Prints the layout of an array, as ``jax.debug.visualize_array_sharding`` (keyword
    arguments as ``visualize_sharding``). A host array is one block on device 0.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((2, 2), ("x", "y"))
        >>> a = sl.device_put(np.zeros((4, 4)), sl.NamedSharding(mesh, P("x")))
        >>> sl.debug.visualize_array_sharding(a, use_color=False)
        ┌───────────────────────┐
        │                       │
        │        CPU 0,1        │
        │                       │
        │                       │
        ├───────────────────────┤
        │                       │
        │        CPU 2,3        │
        │                       │
        │                       │
        └───────────────────────┘
    """
    visualize_sharding(np.shape(arr), _sharding_of(arr), **kwargs)


def inspect_array_sharding(value, *, callback) -> None:
    """Calls ``callback`` with the sharding of every array in the pytree ``value``, as
    ``jax.debug.inspect_array_sharding`` (shardlab runs eagerly, so at once).

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> a = sl.device_put(np.zeros(4), sl.NamedSharding(sl.make_mesh((2,), ("x",)), P("x")))
        >>> sl.debug.inspect_array_sharding(a, callback=lambda s: print(s.spec))
        P('x',)
    """
    for leaf in flatten(value)[0]:
        callback(_sharding_of(leaf))


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
    return _notation.term(name, letters[:ndim], spec.normalized(ndim), frozenset(unreduced), fmt)


def device_values(x) -> np.ndarray:
    """Every device's value of a per-device LocalArray, stacked in mesh order:
    shape ``mesh.axis_sizes + local shape`` (for printing inside shard_map)."""
    if not isinstance(x, LocalArray):
        raise TypeError(f"[device_values] expected a LocalArray, got {type(x).__name__}")
    if is_abstract(x.storage):
        raise TypeError("[device_values] the value is abstract (shape and dtype only): it has no data")
    return np.broadcast_to(x.storage, tuple(x.mesh.axis_sizes) + x.shape).copy()

