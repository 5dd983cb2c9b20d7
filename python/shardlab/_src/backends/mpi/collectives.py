"""The collectives with a direct MPI form, on the ranks along the split axes:

- psum / pmean / pmax / pmin: the core reduces this rank's devices, MPI Allreduce the ranks
  (straight from the block into the output when the rank holds one device of each group);
- all_gather (tiled, along the first local dim, of a value with one device per rank): MPI
  Allgather straight into the output;
- all_to_all (tiled, over one split axis): each rank sends every other rank the chunks of its
  devices (MPI Alltoall), then puts the received chunks in place (one copy).

Other cases take the general path of ``dispatch.run_collective``. Outputs are received into
buffers of the core's pool (``storage.empty``): no page faults on a reused buffer, and none is
reused while any view of it is alive.
"""

from __future__ import annotations

import numpy as np

import shardlab._core as _core

from ...kernels.native import narrow, wide
from ...primitives import collectives as col
from . import dispatch
from .dispatch import _bytes, _own, block_of, check_same_program, run_collective
from .runtime import STATE
from .storage import contiguous, empty

_MPI_OPS = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN"}


def run_psum(prim, p, storages, mesh, params):
    """psum / pmean / pmax / pmin: the core reduces this rank's devices, MPI Allreduce the ranks."""
    axes, reduction = params["axes"], params["reduction"]
    dims = p.split_axes(axes)
    x = block_of(p, storages[0])
    if not dims or not isinstance(x, np.ndarray) or x.dtype.kind == "b":
        return run_collective(prim, p, storages, mesh, params)
    if STATE.check_programs:
        check_same_program(p, prim, storages, params)
    (shape, dtype), = prim.shape_rule(storages, mesh, **params)
    w = wide(x.dtype)
    if (reduction == "mean" and x.dtype.kind in "iu") or w.itemsize < 4:
        w = np.dtype(np.float32)  # MPI reduces no bfloat16; a mean of integers is a float, as JAX's
    op = getattr(STATE.MPI, _MPI_OPS[reduction])
    if all(p.block[p.names.index(a)] == 1 for a in axes):
        # one device of the group on this rank: nothing to reduce locally; MPI reduces straight
        # from the block into the output (or in place in a widened copy)
        wide_x = x.astype(w, copy=False)
        if wide_x is not x:
            local = contiguous(wide_x)
            p.sub(dims).Allreduce(STATE.MPI.IN_PLACE, local, op=op)
        else:
            x = contiguous(x)
            local = empty(x.shape, w, like=x)
            p.sub(dims).Allreduce(x, local, op=op)
    else:
        x = x.astype(w, copy=False)
        local = contiguous(_core.all_reduce(p.block_mesh._core, x, axes, "sum" if reduction == "mean" else reduction))
        p.sub(dims).Allreduce(STATE.MPI.IN_PLACE, local, op=op)
    if reduction == "mean":
        local /= np.asarray(col.group_size(mesh, axes), local.dtype)
    return [_own(p, shape, dtype, narrow(local, dtype))]


def run_all_gather(prim, p, storages, mesh, params):
    """all_gather over one split axis: MPI Allgather of the ranks' blocks straight into one
    buffer, then (unless the layout already is the output's) one copy that puts the group's
    devices, rank-major, at the gathered dim."""
    axes, axis, tiled = params["axes"], params["axis"], params["tiled"]
    dims = p.split_axes(axes)
    x = block_of(p, storages[0])
    if not (len(axes) == 1 and len(dims) == 1 and isinstance(x, np.ndarray) and x.ndim >= p.k
            and storages[0].shape[dims[0]] != 1 and (x.ndim > p.k or not tiled)):
        return run_collective(prim, p, storages, mesh, params)
    if STATE.check_programs:
        check_same_program(p, prim, storages, params)
    (shape, dtype), = prim.shape_rule(storages, mesh, **params)
    k, j = p.k, dims[0]
    local = x.ndim - k
    a = axis % local if tiled else axis % (local + 1)
    x = contiguous(x)
    comm = p.sub(dims)
    recv = empty((comm.Get_size(),) + x.shape, x.dtype, like=x)
    comm.Allgather(_bytes(x), _bytes(recv))
    # recv: (source rank q, mesh dims with the rank's b devices at j, local dims); the output is
    # the same on the group's devices (mesh dim j of 1) and holds their n = q * b values in
    # device order at local dim a (side by side when tiled, a new dim otherwise)
    order = ([1 + i for i in range(k) if i != j] + [1 + k + t for t in range(a)] + [0, 1 + j]
             + [1 + k + t for t in range(a, local)])
    return [_own(p, shape, dtype, contiguous(recv.transpose(order)).reshape(p.block_shape(shape)))]


def run_psum_scatter(prim, p, storages, mesh, params):
    """psum_scatter over one split axis: the core sums this rank's devices of the group, MPI
    Reduce_scatter_block gives each rank the sum of its devices' chunks, and one copy puts a
    chunk on each device (the general path would gather every rank's whole input first)."""
    axes, d, tiled = params["axes"], params["dim"], params["tiled"]
    dims = p.split_axes(axes)
    x = block_of(p, storages[0])
    if not (len(axes) == 1 and len(dims) == 1 and isinstance(x, np.ndarray) and x.ndim > p.k
            and x.dtype.kind != "b" and storages[0].shape[dims[0]] != 1):
        return run_collective(prim, p, storages, mesh, params)
    if STATE.check_programs:
        check_same_program(p, prim, storages, params)
    (shape, dtype), = prim.shape_rule(storages, mesh, **params)
    k, j = p.k, dims[0]
    d = k + d % (x.ndim - k)
    r, b = p.grid[j], p.block[j]
    w = wide(x.dtype)
    if w.itemsize < 4:
        w = np.dtype(np.float32)  # MPI reduces no bfloat16
    x = x.astype(w, copy=False)
    part = _core.all_reduce(p.block_mesh._core, x, axes, "sum") if b > 1 else x  # mesh dim j: 1
    # the scattered dim as (destination rank, its b devices, one chunk), destination rank first
    part = part.reshape(part.shape[:d] + (r, b, part.shape[d] // (r * b)) + part.shape[d + 1:])
    send = contiguous(np.moveaxis(part, d, 0))
    recv = empty(send.shape[1:], w, like=send)
    p.sub(dims).Reduce_scatter_block(send, recv, op=STATE.MPI.SUM)
    # recv: mesh dims (1 at j), the scattered dim as (b, chunk); device i of the b gets chunk i
    out = contiguous(np.moveaxis(recv.reshape(recv.shape[:j] + recv.shape[j + 1:]), d - 1, j))
    return [_own(p, shape, dtype, narrow(out, dtype).reshape(p.block_shape(shape)))]


def run_all_to_all(prim, p, storages, mesh, params):
    axes, split, concat, tiled = params["axes"], params["split"], params["concat"], params["tiled"]
    dims = p.split_axes(axes)
    x = block_of(p, storages[0])
    if not (tiled and len(axes) == 1 and len(dims) == 1 and isinstance(x, np.ndarray)
            and storages[0].shape[dims[0]] != 1):
        return run_collective(prim, p, storages, mesh, params)
    if STATE.check_programs:
        check_same_program(p, prim, storages, params)
    (shape, dtype), = prim.shape_rule(storages, mesh, **params)
    k, j = p.k, dims[0]
    rank = x.ndim - k
    s, c = k + split % rank, k + concat % rank
    r, b = p.grid[j], p.block[j]
    n = r * b
    size = x.shape[s] // n  # one chunk
    # send[q]: this rank's devices' chunks for rank q's devices (b chunks along the split dim)
    parts = x.reshape(x.shape[:s] + (r, b * size) + x.shape[s + 1:])
    send = contiguous(np.moveaxis(parts, s, 0))
    recv = empty(send.shape, send.dtype, like=send)
    p.sub(dims).Alltoall(_bytes(send), _bytes(recv))
    # recv: (source rank, mesh dims with the source devices at j, local dims with the split dim
    # holding this rank's b destination devices' chunks); output: destination devices at mesh
    # dim j, the n sources (rank-major) concatenated in front of the concat dim's own extent
    v = recv.reshape(recv.shape[:1 + s] + (b, size) + recv.shape[2 + s:])  # split dim -> (b_dst, size)
    names = ["q"] + [f"m{i}" for i in range(k)] + [f"l{i}" for i in range(k, x.ndim)]
    names[1 + s:2 + s] = ["dst", "chunk"]
    want = []
    for i in range(k):
        want.append("dst" if i == j else f"m{i}")
    for i in range(k, x.ndim):
        if i == s and i == c:
            want += ["q", f"m{j}", "chunk"]
        elif i == s:
            want.append("chunk")
        elif i == c:
            want += ["q", f"m{j}", f"l{i}"]
        else:
            want.append(f"l{i}")
    v = v.transpose([names.index(w) for w in want])
    out = contiguous(v).reshape(p.block_shape(shape))
    return [_own(p, shape, dtype, out)]


dispatch._SPECIAL.update({col.PSUM: run_psum, col.ALL_GATHER: run_all_gather, col.PSUM_SCATTER: run_psum_scatter,
                          col.ALL_TO_ALL: run_all_to_all})
