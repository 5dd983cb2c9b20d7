"""The mpi backend's implementation of every primitive, from the emulated one:

- a *local* primitive (elementwise, reductions, structural, einsum, attention, fused kernels,
  numpy fallbacks) runs the emulated implementation on this rank's block, with the mesh of
  this rank's devices;
- a *collective* over mesh axes that are all inside the rank's block runs locally the same
  way; otherwise the ranks along the split axes exchange blocks (MPI Allgather on their
  sub-communicator), the core's collective runs on the group's devices, and each rank keeps
  its block; psum, all_gather and all_to_all have direct MPI forms (``mpi/collectives.py``);
- shard_map's entry into manual axes splits each rank's block locally; its exit (merging the
  devices' parts along an axis split over ranks) gathers the blocks of the ranks along it;
- anything else (a primitive made outside these modules) runs on the gathered global storage.

Outputs are RankStorage of the global shape the shape rule gives, so shape rules and ledger
events are those of the one-process run.
"""

from __future__ import annotations

import zlib

import numpy as np

from ...core.processes import PROCESS
from ...primitives.primitive import REGISTRY, register_derived
from .placement import placement
from .runtime import STATE, enter, leave
from .storage import RankStorage, assemble, gather

_LOCAL_MODULES = tuple("shardlab._src." + m for m in (
    "backends.emulated.elementwise", "backends.emulated.reductions", "backends.emulated.structural",
    "backends.emulated.contractions", "backends.emulated.attention", "backends.emulated.fallback",
    "backends.fused", "transforms.checkpoint_policies"))
_COLLECTIVE_MODULES = ("shardlab._src.backends.emulated.collectives", "shardlab._src.backends.grouped")


def block_of(p, s):
    """This rank's block of a storage (RankStorage, a global numpy storage, or a scalar)."""
    if type(s) is RankStorage:
        return s.block
    if isinstance(s, np.ndarray) and s.ndim >= p.k:
        return s[p.block_slices(s.shape)]
    return s


def global_of(p, s):
    """The global storage of `s` (gathers a RankStorage from every rank)."""
    if type(s) is RankStorage:
        return gather(p, s.block, s.shape)
    return s


def _own(p, shape, dtype, block) -> RankStorage:
    want = p.block_shape(shape)
    block = np.asarray(block)
    if block.shape != want:
        block = np.broadcast_to(block, want)
    return RankStorage(shape, dtype, block, p)


def _kept(p, out: np.ndarray, dims=None) -> np.ndarray:
    """This rank's block of a full output, copied so the full one can be freed."""
    v = out[p.block_slices(out.shape, dims)]
    return v if v.size == out.size else v.copy()


def run_local(prim, p, storages, mesh, params):
    avals = prim.shape_rule(storages, mesh, **params)
    outs = prim.impl["emulated"]([block_of(p, s) for s in storages], p.block_mesh, **params)
    return [_own(p, shape, dtype, o) for (shape, dtype), o in zip(avals, outs)]


def run_global(prim, p, storages, mesh, params):
    outs = prim.impl["emulated"]([global_of(p, s) for s in storages], mesh, **params)
    return [RankStorage(o.shape, o.dtype, _kept(p, o), p) for o in outs]


def _differing(comm, desc: str):
    """None when every rank of `comm` gives the same `desc` (one 16-byte Allreduce); otherwise
    each rank's, one line per rank. Collective."""
    h = zlib.crc32(desc.encode())
    mine = np.array([h, -h], np.int64)
    both = np.empty_like(mine)
    comm.Allreduce(mine, both, op=STATE.MPI.MAX)
    if both[0] == h and both[1] == -h:
        return None
    return "\n".join(f"  rank {r}: {d}" for r, d in enumerate(comm.allgather(desc)))


def check_same_program(p, prim, storages, params) -> None:
    """ValueError naming the ranks and their collectives unless every rank is about to run the
    same collective (op, axes, shapes, dtypes)."""
    desc = f"{prim.name}(axes={tuple(params.get('axes', ()))}, " + ", ".join(
        f"{getattr(s, 'dtype', type(s).__name__)}{tuple(getattr(s, 'shape', ()))}" for s in storages) + ")"
    lines = _differing(p.comm, desc)
    if lines is None:
        return
    raise RuntimeError(f"[mpi] the ranks run different programs: at this collective\n{lines}\nevery rank must "
                       f"run the same sequence of collectives (SPMD); make rank-dependent branches "
                       f"collective-free")


def run_collective(prim, p, storages, mesh, params):
    dims = p.split_axes(params["axes"])
    if STATE.check_programs:
        check_same_program(p, prim, storages, params)
    if not dims:
        return run_local(prim, p, storages, mesh, params)
    return _on_groups(prim, p, storages, mesh, params, dims)


def _on_groups(prim, p, storages, mesh, params, dims):
    """The emulated implementation on the devices of this rank's group along mesh dims `dims`
    (the blocks of the ranks along them, MPI Allgather'ed), each rank keeping its block."""
    full = []
    for s in storages:
        b = block_of(p, s)
        vd = tuple(j for j in dims if len(getattr(s, "shape", ())) >= p.k and s.shape[j] != 1)
        if vd:
            b = np.ascontiguousarray(b)
            comm = p.sub(vd)
            recv = np.empty((comm.Get_size(),) + b.shape, b.dtype)
            comm.Allgather(_bytes(b), _bytes(recv))
            b = assemble(recv, b.shape, vd, tuple(p.grid[j] for j in vd))
        full.append(b)
    avals = prim.shape_rule(storages, mesh, **params)
    outs = prim.impl["emulated"](full, p.mesh_over(dims), **params)
    return [RankStorage(shape, dtype, _kept(p, o, dims), p) for (shape, dtype), o in zip(avals, outs)]


def run_layout(prim, p, storages, mesh, params):
    """shard_map's entry into manual axes (``shard_map_split``: a local dim split along mesh
    axes where the value is the same on every device) and exit (``shard_map_merge``: the
    devices' parts along mesh axes concatenated into a local dim) over ``params["dims"]``'s
    axes: a split is local to each rank's devices; a merge gathers the blocks of the ranks
    along the split axes (MPI Allgather), as a tiled all_gather."""
    dims = p.split_axes(tuple(a for names in params["dims"] for a in names))
    if prim.name == "shard_map_merge" and dims and STATE.check_programs:
        check_same_program(p, prim, storages, params)
    if prim.name == "shard_map_merge":
        return _on_groups(prim, p, storages, mesh, params, dims)
    (shape, dtype), = prim.shape_rule(storages, mesh, **params)
    out, = prim.impl["emulated"]([block_of(p, storages[0])], p.mesh_over(dims), **params)
    return [RankStorage(shape, dtype, _kept(p, out, dims), p)]


_LAYOUTS = ("shard_map_split", "shard_map_merge")  # transforms/shard_map.py's primitives (a layer above)


def _bytes(a: np.ndarray):
    return [a.reshape(-1).view(np.uint8), STATE.MPI.BYTE]


_SPECIAL: dict = {}  # primitive -> its MPI implementation (mpi/collectives.py fills it)


def _impl_for(prim):
    fn = prim.impl.get("emulated")
    module = getattr(fn, "__module__", "")
    if prim in _SPECIAL:
        run = _SPECIAL[prim]
    elif module in _COLLECTIVE_MODULES:
        run = run_collective  # a collective over params["axes"]; the others there run globally
    elif module in _LOCAL_MODULES:
        run = run_local
    elif prim.name in _LAYOUTS and module == "shardlab._src.transforms.shard_map":
        run = run_layout
    else:
        run = run_global

    def impl(storages, mesh, **params):
        p = placement(mesh)
        if p is None:
            return fn(storages, mesh, **params)
        if run is run_local:
            return run(prim, p, storages, mesh, params)
        if run is run_collective and "axes" not in params:  # ragged_keep: no axes, no exchange pattern
            return run_global(prim, p, storages, mesh, params)
        enter(f"{prim.name}(axes={tuple(params.get('axes', ()))})")
        try:
            return run(prim, p, storages, mesh, params)
        finally:
            leave()

    return impl


def register_all() -> None:
    """Gives every primitive with an emulated implementation its mpi one."""
    for prim in REGISTRY:
        if "emulated" in prim.impl:
            prim.impl["mpi"] = _impl_for(prim)


def derive(prim):
    """The mpi implementation of a primitive made (or given its emulated one) after
    ``register_all``, made at its first use under MPI; None without an emulated one."""
    if "emulated" not in prim.impl:
        return None
    impl = prim.impl["mpi"] = _impl_for(prim)
    return impl


register_derived("mpi", derive)


# -- device_put: rank 0's value, each rank keeping its devices' block -------------------------------
def put_from_root(storage: np.ndarray, mesh, shape, *, same: bool = False):
    """Rank 0's `storage` (a host value of global `shape` laid out on `mesh`'s devices: mesh
    dims, then the shard) on every rank, each keeping only its devices' block (a RankStorage):
    rank 0 sends each rank its block. The other ranks' values are ignored; their shapes and
    dtypes must match rank 0's (ValueError listing each rank's). `same`: every rank holds the
    same value already (a global array gathered by np.asarray), so each keeps its block."""
    comm = STATE.comm
    if same:
        p = placement(mesh)
        return storage.copy() if p is None else RankStorage(storage.shape, storage.dtype,
                                                            np.array(storage[p.block_slices(storage.shape)]), p)
    desc = f"{storage.dtype}{tuple(shape)}"
    enter(f"device_put({desc} onto mesh {dict(mesh.shape)})")
    try:
        lines = _differing(comm, f"{desc} laid out as {tuple(storage.shape)}")
        if lines is not None:
            raise ValueError(f"[device_put] the ranks pass different arrays:\n{lines}\nunder MPI every rank passes "
                             f"an array of the same shape and dtype, and rank 0's values are used (docs/mpi.md)")
        p = placement(mesh)
        root = comm.Get_rank() == 0
        if p is None:  # a mesh without axes: every rank holds the whole value
            out = np.ascontiguousarray(storage) if root else np.empty(storage.shape, storage.dtype)
            comm.Bcast(_bytes(out), root=0)
            return out
        if root:
            for r in range(1, comm.Get_size()):
                block = np.ascontiguousarray(storage[p.block_slices(storage.shape, coords=p.cart.Get_coords(r))])
                comm.Send(_bytes(block), dest=r, tag=_PUT_TAG)
            block = np.array(storage[p.block_slices(storage.shape)])
        else:
            block = np.empty(p.block_shape(storage.shape), storage.dtype)
            comm.Recv(_bytes(block), source=0, tag=_PUT_TAG)
        return RankStorage(storage.shape, storage.dtype, block, p)
    finally:
        leave()


_PUT_TAG = 27
PROCESS.scatter = put_from_root  # device_put under several processes
