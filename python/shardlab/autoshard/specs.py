"""Shardings as the autoshard search enumerates them: a value's *dims* (for each array dim, the
mesh axes splitting it) and the candidates of a tensor and of an einsum on a mesh.

A dims tuple is the planner's layout without unreduced axes: ``(("x",), ())`` is
``P("x", None)``. Every mesh axis of size > 1 either splits one dim (whose size it must divide,
together with the other axes there) or none, so a rank-r tensor has at most (r + 1)^axes
candidates; axes sharing a dim are in mesh order.

>>> from shardlab.autoshard.specs import tensor_dims, pspec
>>> [pspec(d) for d in tensor_dims((8, 6), {"x": 2, "y": 4})]
[P(), P('y',), P('x',), P(('x', 'y'),), P(None, 'x'), P('y', 'x')]
"""

from __future__ import annotations

import itertools
import math

from shardlab.sharding import PartitionSpec as P

__all__ = ["Dims", "pspec", "dims_of", "tensor_dims", "einsum_candidates", "dims_str", "shards", "local_shape"]

Dims = tuple  # tuple[tuple[str, ...], ...]


def pspec(dims: Dims) -> P:
    """The PartitionSpec of `dims` (trailing unsharded dims left out, as JAX prints it)."""
    entries = [None if not a else a[0] if len(a) == 1 else tuple(a) for a in dims]
    while entries and entries[-1] is None:
        entries.pop()
    return P(*entries)


def dims_of(spec, rank: int) -> Dims:
    """The dims of a PartitionSpec (or None: replicated) for a rank-`rank` value."""
    entries = list(spec) if spec is not None else []
    entries += [None] * (rank - len(entries))
    out = []
    for e in entries[:rank]:
        out.append(() if e is None else (e,) if isinstance(e, str) else tuple(e))
    return tuple(out)


def dims_str(shape, dims: Dims) -> str:
    """The book's notation: ``[8@x,6]``."""
    return "[" + ",".join(f"{s}@{''.join(a)}" if a else str(s) for s, a in zip(shape, dims)) + "]"


def shards(dims: Dims, mesh_shape: dict) -> int:
    return math.prod(mesh_shape[a] for d in dims for a in d)


def local_shape(shape, dims: Dims, mesh_shape: dict) -> tuple:
    return tuple(s // math.prod(mesh_shape[a] for a in d) for s, d in zip(shape, dims))


def _axes(mesh_shape: dict) -> list:
    return [a for a, n in mesh_shape.items() if n > 1]


def tensor_dims(shape, mesh_shape: dict) -> list:
    """Every dims of a `shape` value on a mesh: each axis (size > 1) on one dim or none, the
    dim's size divisible by its axes' product. The replicated layout comes first."""
    axes = _axes(mesh_shape)
    out = []
    for where in itertools.product([None] + list(range(len(shape))), repeat=len(axes)):
        dims = tuple(tuple(a for a, w in zip(axes, where) if w == d) for d in range(len(shape)))
        if all(s % math.prod(mesh_shape[a] for a in d) == 0 for s, d in zip(shape, dims)):
            out.append(dims)
    return out


def einsum_candidates(terms, out: str, shapes, mesh_shape: dict) -> list:
    """The candidate shardings of an einsum: each mesh axis splits one index (label) or none;
    an operand holding the index is split there, the output too when it holds it. An axis on a
    contracted index leaves partial sums, all-reduced (output replicated along it) or
    reduce-scattered onto one output dim. Returns ``[(operand dims..., out dims), ...]``."""
    size = {}
    for t, s in zip(terms, shapes):
        size.update(zip(t, s))
    labels = sorted(size)
    axes = _axes(mesh_shape)
    seen, out_list = set(), []
    for where in itertools.product([None] + labels, repeat=len(axes)):
        on = {l: tuple(a for a, w in zip(axes, where) if w == l) for l in labels}
        if any(size[l] % math.prod(mesh_shape[a] for a in on[l]) for l in labels):
            continue
        ins = tuple(tuple(on[l] for l in t) for t in terms)
        base = [list(on[l]) for l in out]
        partial = [a for a, w in zip(axes, where) if w is not None and w not in out]
        for dest in itertools.product([None] + list(range(len(out))), repeat=len(partial)):
            od = [list(x) for x in base]
            for a, d in zip(partial, dest):
                if d is not None:
                    od[d].append(a)
            od = tuple(tuple(x) for x in od)  # an index's own axes, then the ones scattered onto it
            if any(size[l] % math.prod(mesh_shape[a] for a in d) for l, d in zip(out, od)):
                continue
            key = (ins, od)
            if key not in seen:
                seen.add(key)
                out_list.append(key)
    return out_list
