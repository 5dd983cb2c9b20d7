"""Collectives over groups of axis indices (``axis_index_groups=``) and ``ragged_all_to_all``.

``axis_index_groups=[[0, 2], [1, 3]]`` on an axis of size 4 runs the collective separately
inside each group: devices 0 and 2 reduce (or gather, or exchange) among themselves, as do 1
and 3. The group size g takes the place of the axis size in the shape rules (an untiled
all_gather inserts a dim of size g), and the ledger records group_size g and mesh.size / g
groups. The transposes are JAX's, with the same groups.

``ragged_all_to_all`` sends slices of varying length: slice i of a device's ``operand``
(``input_offsets[i]``, ``send_sizes[i]``) goes to the (i // (K / g))-th device of its group,
which writes it into its ``output`` at the sender's ``output_offsets[i]``. Its ledger event
counts the bytes really sent to other devices (the largest per-device amount).

The numpy implementations are in ``backends/grouped.py``.

Example:
    >>> from shardlab._src.primitives.grouped import GROUPED_PSUM
    >>> GROUPED_PSUM.name
    'psum'
"""

from __future__ import annotations

import math

import numpy as np

from ..arrays.storage import is_abstract
from ..cost import formulas
from ..ledger.event import Event, dtype_name
from .elementwise import PRIMS as EW
from .primitive import Primitive, bind

_REDUCE_OPS = {"sum": "psum", "mean": "pmean", "max": "pmax", "min": "pmin"}


def group_len(groups) -> int:
    return len(groups[0])


def _local_bytes(aval, k) -> float:
    return float(math.prod(aval.shape[k:]) * np.dtype(aval.dtype).itemsize)


def _event(op, mesh, axes, groups, x, out) -> Event:
    k = mesh.ndim
    g = group_len(groups)
    b_in, b_out = _local_bytes(x, k), _local_bytes(out, k)
    v = b_out if op == "all_gather" else b_in
    sent = formulas.ring_bytes_sent(op, g, v) if g > 1 else 0.0
    return Event.collective(op, tuple(axes), int(g), int(mesh.size // g), dtype_name(np.dtype(x.dtype)), b_in,
                            b_out, float(sent), None)


def _mesh_dims(mesh, shape, axes):
    """Storage mesh dims of the result: full size along `axes` (the groups make it vary)."""
    idx = {mesh.axis_names.index(a) for a in axes}
    return tuple(mesh.axis_sizes[a] if a in idx else d for a, d in enumerate(shape[:mesh.ndim]))


def _norm(axis: int, rank: int, op: str, what: str) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"[{op}] {what} {axis} is out of range for local rank {rank}")
    return axis % rank


def to_front(s, mesh, axes):
    """Storage → (n, other mesh dims..., local...) with the devices along `axes` (flattened
    major-to-minor) on dim 0, broadcast where the value is invariant; and what `from_front`
    needs to undo it."""
    idx = [mesh.axis_names.index(a) for a in axes]
    full = list(s.shape)
    for a in idx:
        full[a] = mesh.axis_sizes[a]
    s = np.broadcast_to(s, full)
    other = [i for i in range(s.ndim) if i not in idx]
    v = s.transpose(idx + other)
    sizes = tuple(v.shape[:len(idx)])
    k = mesh.ndim
    return v.reshape((math.prod(sizes),) + v.shape[len(idx):]), (idx + [i for i in other if i < k], sizes)


def from_front(v, undo):
    """The inverse of `to_front` (a result with possibly different local dims)."""
    order, sizes = undo
    v = v.reshape(sizes + v.shape[1:])
    k = len(order)
    return v.transpose([int(i) for i in np.argsort(order)] + list(range(k, v.ndim)))


# -- shape rules -----------------------------------------------------------------------------
def _reduce_shape(avals, mesh, *, axes, groups, reduction):
    x = avals[0]
    dtype = np.dtype(x.dtype)
    if reduction == "mean" and dtype.kind in "iub":
        dtype = np.dtype(np.float32)
    elif reduction == "sum" and dtype.kind == "b":
        dtype = np.dtype(np.int32)  # psum of booleans counts, as JAX
    return [(_mesh_dims(mesh, x.shape, axes) + tuple(x.shape[mesh.ndim:]), dtype)]


def gather_local_shape(local, g, axis, tiled):
    local = list(local)
    if tiled:
        axis = _norm(axis, len(local), "all_gather", "axis")
        local[axis] *= g
    else:
        axis = _norm(axis, len(local) + 1, "all_gather", "axis")
        local.insert(axis, g)
    return tuple(local)


def _gather_shape(avals, mesh, *, axes, groups, axis, tiled):
    x = avals[0]
    local = gather_local_shape(x.shape[mesh.ndim:], group_len(groups), axis, tiled)
    return [(_mesh_dims(mesh, x.shape, axes) + local, x.dtype)]


def scatter_local_shape(local, g, dim, tiled):
    local = list(local)
    dim = _norm(dim, len(local), "psum_scatter", "scatter_dimension")
    if tiled:
        if local[dim] % g:
            raise ValueError(f"[psum_scatter] scatter_dimension {dim} has size {local[dim]}, which the group "
                             f"size {g} of axis_index_groups does not divide")
        local[dim] //= g
    else:
        if local[dim] != g:
            raise ValueError(f"[psum_scatter] scatter_dimension {dim} has size {local[dim]}, which is not the "
                             f"group size {g} of axis_index_groups (pass tiled=True to split it in chunks)")
        del local[dim]
    return tuple(local)


def _scatter_shape(avals, mesh, *, axes, groups, dim, tiled):
    x = avals[0]
    dtype = np.dtype(np.int32) if np.dtype(x.dtype).kind == "b" else x.dtype
    local = scatter_local_shape(x.shape[mesh.ndim:], group_len(groups), dim, tiled)
    return [(_mesh_dims(mesh, x.shape, axes) + local, dtype)]


def a2a_local_shape(local, g, split, concat, tiled):
    local = list(local)
    split = _norm(split, len(local), "all_to_all", "split_axis")
    if tiled:
        concat = _norm(concat, len(local), "all_to_all", "concat_axis")
        if local[split] % g:
            raise ValueError(f"[all_to_all] split_axis {split} has size {local[split]}, which the group size {g} "
                             f"of axis_index_groups does not divide")
        local[split] //= g
        local[concat] *= g
        return tuple(local)
    if local[split] != g:
        raise ValueError(f"[all_to_all] split_axis {split} has size {local[split]}, which is not the group size "
                         f"{g} of axis_index_groups")
    del local[split]
    concat = _norm(concat, len(local) + 1, "all_to_all", "concat_axis")
    local.insert(concat, g)
    return tuple(local)


def _a2a_shape(avals, mesh, *, axes, groups, split, concat, tiled):
    x = avals[0]
    local = a2a_local_shape(x.shape[mesh.ndim:], group_len(groups), split, concat, tiled)
    return [(_mesh_dims(mesh, x.shape, axes) + local, x.dtype)]


# -- vjps (JAX's transposes, same groups) -----------------------------------------------------
def _reduce_vjp(cts, ins, outs, mesh, *, axes, groups, reduction):
    if reduction in ("max", "min"):
        raise NotImplementedError(f"[grad] p{reduction} has no transpose (as in JAX); "
                                  f"differentiate through psum of a one-hot selection instead")
    ct = cts[0]
    g = bind(GROUPED_PSUM, [ct], mesh, axes=axes, groups=groups, reduction="sum")
    if reduction == "mean":
        g = bind(EW["divide"], [g, g.dtype.type(group_len(groups))], mesh)
    return [g]


def _gather_vjp(cts, ins, outs, mesh, *, axes, groups, axis, tiled):
    dim = axis if tiled else _norm(axis, ins[0].ndim + 1, "all_gather", "axis")
    return [bind(GROUPED_PSUM_SCATTER, [cts[0]], mesh, axes=axes, groups=groups, dim=dim, tiled=tiled)]


def _scatter_vjp(cts, ins, outs, mesh, *, axes, groups, dim, tiled):
    return [bind(GROUPED_ALL_GATHER, [cts[0]], mesh, axes=axes, groups=groups, axis=dim, tiled=tiled)]


def _a2a_vjp(cts, ins, outs, mesh, *, axes, groups, split, concat, tiled):
    return [bind(GROUPED_ALL_TO_ALL, [cts[0]], mesh, axes=axes, groups=groups, split=concat, concat=split,
                 tiled=tiled)]


def _cost(op_of):
    def cost(ins, outs, mesh, *, axes, groups, **params):
        return _event(op_of(params), mesh, axes, groups, ins[0], outs[0])

    return cost


GROUPED_PSUM = Primitive("psum", shape_rule=_reduce_shape, cost=_cost(lambda p: _REDUCE_OPS[p["reduction"]]),
                         vjp=_reduce_vjp)
GROUPED_ALL_GATHER = Primitive("all_gather", shape_rule=_gather_shape, cost=_cost(lambda p: "all_gather"),
                               vjp=_gather_vjp)
GROUPED_PSUM_SCATTER = Primitive("psum_scatter", shape_rule=_scatter_shape, cost=_cost(lambda p: "psum_scatter"),
                                 vjp=_scatter_vjp)
GROUPED_ALL_TO_ALL = Primitive("all_to_all", shape_rule=_a2a_shape, cost=_cost(lambda p: "all_to_all"),
                               vjp=_a2a_vjp)


# -- ragged_all_to_all -----------------------------------------------------------------------
def _ragged_shape(avals, mesh, *, axes, groups):
    k = mesh.ndim
    operand, output = avals[0], avals[1]
    if np.dtype(operand.dtype) != np.dtype(output.dtype):
        raise TypeError(f"[ragged_all_to_all] operand is {np.dtype(operand.dtype)} but output is "
                        f"{np.dtype(output.dtype)}; they must have the same dtype")
    if tuple(operand.shape[k + 1:]) != tuple(output.shape[k + 1:]) or len(operand.shape) == k:
        raise ValueError(f"[ragged_all_to_all] operand of local shape {tuple(operand.shape[k:])} and output of "
                         f"local shape {tuple(output.shape[k:])} must agree in every dim but the first")
    names = ("input_offsets", "send_sizes", "output_offsets", "recv_sizes")
    lengths = set()
    for name, a in zip(names, avals[2:]):
        if np.dtype(a.dtype).kind not in "iu":
            raise ValueError(f"ragged_all_to_all {name} must be integer type.")
        local = tuple(a.shape[k:])
        if len(local) != 1 or local[0] < 1:
            raise ValueError(f"ragged_all_to_all {name} must be rank 1 with positive dimension size, but got "
                             f"shape {local}")
        lengths.add(local[0])
    if len(lengths) != 1:
        raise ValueError(f"[ragged_all_to_all] input_offsets, send_sizes, output_offsets and recv_sizes must have "
                         f"one length; got {sorted(lengths)}")
    n, g = lengths.pop(), group_len(groups)
    if n % g:
        raise ValueError(f"[ragged_all_to_all] the offsets and sizes have length {n}, which the size {g} of "
                         f"{axes} (or of each axis_index_group) does not divide")
    return [(_mesh_dims(mesh, output.shape, axes) + tuple(output.shape[k:]), output.dtype)]


def ragged_bytes_sent(storages, mesh, axes, groups) -> float:
    """The largest number of bytes one device sends to the others (real storages), or the
    all_to_all estimate of the whole operand (abstract ones)."""
    operand = storages[0]
    k = mesh.ndim
    row = math.prod(operand.shape[k + 1:]) * np.dtype(operand.dtype).itemsize
    if any(is_abstract(s) for s in (operand, storages[1], storages[3])):
        return formulas.ring_bytes_sent("all_to_all", group_len(groups), _local_bytes(operand, k))
    # every device's send sizes (under MPI, np.asarray gathers them from the ranks: every rank prices alike)
    sizes, _ = to_front(np.asarray(storages[3]), mesh, axes)  # (n, other mesh..., K)
    n = sizes.shape[0]
    g = group_len(groups)
    spd = sizes.shape[-1] // g
    member = {d: (gi, p) for gi, grp in enumerate(groups) for p, d in enumerate(grp)}
    worst = 0
    for src in range(n):
        gi, p = member[src]
        mask = np.ones(sizes.shape[-1], bool)
        mask[p * spd:(p + 1) * spd] = False  # slices a device keeps for itself move no bytes
        worst = max(worst, int(sizes[src][..., mask].sum(axis=-1).max(initial=0)))
    return float(worst * row)


def _ragged_cost(ins, outs, mesh, *, axes, groups):
    k = mesh.ndim
    g = group_len(groups)
    return Event.collective("ragged_all_to_all", tuple(axes), int(g), int(mesh.size // g),
                            dtype_name(np.dtype(ins[0].dtype)), _local_bytes(ins[0], k), _local_bytes(outs[0], k),
                            ragged_bytes_sent(ins, mesh, axes, groups), None)


def _ragged_vjp(cts, ins, outs, mesh, *, axes, groups):
    ct = cts[0]
    operand, _, input_offsets, send_sizes, output_offsets, recv_sizes = ins
    a2a = dict(axes=axes, groups=groups, split=0, concat=0, tiled=True)
    out_off = bind(GROUPED_ALL_TO_ALL, [output_offsets], mesh, **a2a)
    in_off = bind(GROUPED_ALL_TO_ALL, [input_offsets], mesh, **a2a)
    zeros = bind(EW["multiply"], [operand, operand.dtype.type(0)], mesh)
    operand_ct = bind(RAGGED_ALL_TO_ALL, [ct, zeros, out_off, recv_sizes, in_off, send_sizes], mesh,
                      axes=axes, groups=groups)
    output_ct = bind(RAGGED_KEEP, [ct, out_off, recv_sizes], mesh)
    return [operand_ct, output_ct, None, None, None, None]


RAGGED_ALL_TO_ALL = Primitive("ragged_all_to_all", shape_rule=_ragged_shape, cost=_ragged_cost, vjp=_ragged_vjp)


def _keep_shape(avals, mesh):
    x, off, sizes = avals
    k = mesh.ndim
    dims = tuple(max(a, b, c) for a, b, c in zip(x.shape[:k], off.shape[:k], sizes.shape[:k]))
    return [(dims + tuple(x.shape[k:]), x.dtype)]


def _keep_vjp(cts, ins, outs, mesh):
    return [bind(RAGGED_KEEP, [cts[0], ins[1], ins[2]], mesh), None, None]


# Local: `x` with the rows [off[i], off[i] + size[i]) zeroed (what a ragged_all_to_all
# overwrote in its `output`, so those rows get no cotangent). No communication, no event.
RAGGED_KEEP = Primitive("ragged_keep", shape_rule=_keep_shape, vjp=_keep_vjp)
