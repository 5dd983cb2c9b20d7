"""RankStorage: a storage of the global mesh-factorized shape of which this rank holds only
its block (its own devices' values).

Everything above the backends sees the global shape and dtype, as for abstract storage, so
shape rules and the ledger are those of the one-process run. ``np.asarray`` of one gathers
every rank's block (``process_allgather``): it is collective, every rank must call it.
"""

from __future__ import annotations

import math

import numpy as np

import shardlab._core as _core

from ...arrays.storage import AbstractStorage, host_nbytes
from .runtime import STATE, enter, leave


class RankStorage(AbstractStorage):
    """A storage of global `shape` whose values for this rank's devices are `block`."""

    __slots__ = ("block", "placement")

    def __init__(self, shape, dtype, block: np.ndarray, placement):
        super().__init__(shape, dtype)
        self.block = block
        self.placement = placement

    def __repr__(self):
        return f"RankStorage(shape={self.shape}, dtype={self.dtype}, block={tuple(self.block.shape)})"

    def held_nbytes(self) -> int:
        """Host bytes this rank holds: its block (``ShardedArray.host_nbytes``), not the global shape."""
        return host_nbytes(self.block)

    @property
    def strides(self) -> tuple:
        """Strides of a C-contiguous array of the global shape (stride 0 where a mesh dim is 1)."""
        out, step = [], self.dtype.itemsize
        for n in reversed(self.shape):
            out.append(step if n != 1 else 0)
            step *= n
        return tuple(reversed(out))

    def __array__(self, dtype=None, copy=None):
        out = gather(self.placement, self.block, self.shape)
        return out if dtype is None else out.astype(dtype, copy=False)

    def __getitem__(self, key):
        """One device's value (``storage[coords + (...,)]``) from the block (IndexError for another
        rank's device, as JAX's non-addressable shards); any other index of the gathered global
        storage (collective)."""
        p = self.placement
        if (type(key) is tuple and len(key) == p.k + 1 and key[-1] is Ellipsis
                and all(isinstance(c, (int, np.integer)) for c in key[:-1])):
            local = []
            for j, c in enumerate(key[:-1]):
                if self.shape[j] == 1:
                    local.append(0)
                    continue
                o = p.coords[j] * p.block[j] if p.grid[j] > 1 else 0
                if not o <= c < o + self.block.shape[j]:
                    # Gathering here would be a collective that only the ranks not holding the
                    # device join (the owner reads its block): the ranks would wait on each other.
                    raise IndexError(f"[mpi] the device at mesh coordinates {tuple(int(x) for x in key[:-1])} "
                                     f"lives on another rank (this is rank {p.comm.Get_rank()}); np.asarray "
                                     f"gathers every device's value (collective), addressable_shards lists "
                                     f"this rank's")
                local.append(int(c) - o)
            return self.block[tuple(local) + (Ellipsis,)]
        return np.asarray(self)[key]

    def __array_function__(self, func, types, args, kwargs):
        """np.broadcast_to keeps a rank's block (no gather) where the mesh dims allow; any other
        numpy function runs on the gathered global storage."""
        if func is np.broadcast_to and args and args[0] is self:
            shape = tuple(args[1] if len(args) > 1 else kwargs["shape"])
            k = self.placement.k
            if len(shape) == len(self.shape) and all(a == b or a == 1 for a, b in zip(self.shape[:k], shape[:k])):
                want = self.placement.block_shape(shape)
                return RankStorage(shape, self.dtype, np.broadcast_to(self.block, want), self.placement)
        args = [np.asarray(a) if type(a) is RankStorage else
                type(a)(np.asarray(b) if type(b) is RankStorage else b for b in a) if isinstance(a, (list, tuple))
                else a for a in args]
        return func(*args, **kwargs)

    def __getattr__(self, name):
        """Any other numpy attribute (transpose, reshape, astype, ...) of the gathered global
        storage: code above the backends that works on storages directly stays correct."""
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(np.asarray(self), name)


def rank_nbytes(storage) -> tuple:
    """(split, replicated): bytes of host memory this rank holds for `storage`, the second
    those of a value that is the same on every rank (its storage is 1 along every mesh dim
    split over the ranks: each rank holds a copy, where one process held one in all). A
    storage that is not a RankStorage (one process) is all split. Stride-0 dims count once.

    Example:
        >>> import numpy as np
        >>> from shardlab._src.backends.mpi.storage import rank_nbytes
        >>> rank_nbytes(np.broadcast_to(np.zeros((1, 256), np.float32), (8, 256)))
        (1024, 0)
    """
    block = storage.block if type(storage) is RankStorage else storage
    if not isinstance(block, np.ndarray):
        return 0, 0
    n = math.prod(d for d, st in zip(block.shape, block.strides) if st != 0) * block.itemsize if block.size else 0
    if type(storage) is not RankStorage:
        return int(n), 0
    p = storage.placement
    same = all(storage.shape[j] == 1 or p.grid[j] == 1 for j in range(p.k)) and max(p.grid, default=1) > 1
    return (0, int(n)) if same else (int(n), 0)


def gather(p, block: np.ndarray, shape) -> np.ndarray:
    """The global storage of `shape` from every rank's `block` (an MPI Allgather over the
    ranks among which the storage varies)."""
    k = p.k
    dims = tuple(j for j in range(k) if shape[j] != 1 and p.grid[j] > 1)
    block = contiguous(block)
    if not dims:
        return np.broadcast_to(block, tuple(shape)).copy() if block.shape != tuple(shape) else block
    comm = p.sub(dims)
    n = comm.Get_size()
    recv = empty((n,) + block.shape, block.dtype, like=block)
    enter(f"process_allgather(global storage {tuple(shape)} {block.dtype})")  # np.asarray and friends
    try:
        comm.Allgather(_buf(block), _buf(recv))
    finally:
        leave()
    return assemble(recv, block.shape, dims, tuple(p.grid[j] for j in dims))


def assemble(recv: np.ndarray, block_shape, dims: tuple, ranks: tuple) -> np.ndarray:
    """Blocks gathered from the ranks of a sub-communicator (rank-major along `dims`, of
    `ranks` ranks each) put side by side: dim j of the result is ranks_j * block_j."""
    v = recv.reshape(tuple(ranks) + tuple(block_shape))
    m = len(dims)
    order = []
    for j in range(len(block_shape)):
        if j in dims:
            order.append(dims.index(j))
        order.append(m + j)
    v = v.transpose(order)
    out = tuple(block_shape[j] * (ranks[dims.index(j)] if j in dims else 1) for j in range(len(block_shape)))
    return contiguous(v).reshape(out)


_PAGE = 4096
_POOLED = 1 << 20  # the core's pool keeps buffers from 1 MiB up (smaller ones: numpy's malloc)


def empty(shape, dtype, like: np.ndarray | None = None) -> np.ndarray:
    """A new C-contiguous array for a collective's output (an MPI receive buffer), from the
    core's buffer pool from 1 MiB up.

    A fresh multi-megabyte array maps its pages on first touch: for a 256 MiB output the page
    faults cost as much as the transfer. The pool keeps freed buffers mapped for the next call
    of the same size class (as PyTorch's caching allocator does); a buffer goes back to it only
    when numpy frees the array and every view of it, so a value the user still holds is never
    written again. With `like` (the send buffer), the data starts at the same offset within a
    page as `like`'s: a copy between addresses a few bytes apart modulo 4 KiB runs at half
    speed on x86 (4K aliasing).

    Example:
        >>> import numpy as np
        >>> from shardlab._src.backends.mpi.storage import empty
        >>> src = np.ones((1 << 18) + 4, np.float32)[4:]   # 1 MiB, 16 bytes into its page
        >>> out = empty((2,) + src.shape, src.dtype, like=src)
        >>> out.shape, out.flags.c_contiguous, (out.ctypes.data - src.ctypes.data) % 4096
        ((2, 262144), True, 0)
    """
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    pool = getattr(_core, "pool_empty", None)  # None: a core built before it (numpy's malloc then)
    if nbytes < _POOLED or pool is None:
        return np.empty(shape, dtype)
    shift = like.ctypes.data % _PAGE if like is not None and like.size else 0
    if shift % dtype.alignment:
        shift = 0
    raw = pool((shift + nbytes,), np.dtype(np.uint8))
    return raw[shift:].view(dtype).reshape(shape)


def contiguous(a: np.ndarray) -> np.ndarray:
    """`a` itself when C-contiguous, else a copy of it in a buffer from :func:`empty`."""
    if a.flags.c_contiguous:
        return a
    out = empty(a.shape, a.dtype)
    np.copyto(out, a)
    return out


def _buf(a: np.ndarray):
    """A contiguous array as an MPI buffer of bytes (any dtype, bfloat16 included)."""
    return [a.reshape(-1).view(np.uint8), STATE.MPI.BYTE]
