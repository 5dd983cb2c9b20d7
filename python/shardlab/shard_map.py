"""shard_map: run a per-device function on every virtual device at once.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((4, 2), ("x", "y"))
    >>> @sl.shard_map(mesh=mesh, in_specs=(P("x", "y"), P("y", None)), out_specs=P("x", None))
    ... def matmul(a, b):
    ...     return sl.lax.psum(a @ b, "y")      # contract the sharded dim, then sum
    >>> a, b = np.ones((8, 4), np.float32), np.ones((4, 3), np.float32)
    >>> np.asarray(matmul(a, b))[0].tolist()
    [4.0, 4.0, 4.0]
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from . import _tree
from .dtypes import canonicalize
from .local_array import LocalArray, lift
from .mesh import Mesh, get_mesh
from .sharded_array import ShardedArray, to_storage
from .sharding import NamedSharding, PartitionSpec


class _Frames(threading.local):
    def __init__(self):
        self.meshes: list[Mesh] = []


_FRAMES = _Frames()


def current_mesh(op: str, axis_name=None) -> Mesh:
    """The mesh of the innermost running shard_map; NameError outside one (as JAX)."""
    if not _FRAMES.meshes:
        name = axis_name if axis_name is not None else "?"
        raise NameError(f"unbound axis name: {name!r}. [{op}] collectives run inside "
                        f"shard_map, where the mesh's axis names are bound")
    return _FRAMES.meshes[-1]


def _is_spec(x) -> bool:
    return isinstance(x, PartitionSpec)


def shard_map(f=None, /, *, mesh: Mesh | None = None, in_specs=None, out_specs=None,
              check_vma: bool = True, axis_names=None, check_rep=None):
    """Maps `f` over the devices of `mesh`, as ``jax.shard_map``.

    Args:
        f: function of per-device values (LocalArrays with LOCAL shapes).
        mesh: the mesh (default: the one set by ``set_mesh`` / ``with mesh:``).
        in_specs: PartitionSpecs, a pytree prefix of the arguments.
        out_specs: PartitionSpecs, a pytree prefix of the outputs. Leaving a mesh axis out
            claims the output is the same on every device along it.
        check_vma: reject out_specs that claim replication for a value that varies.

    Returns:
        A function of global arrays (numpy or ShardedArray) returning ShardedArrays.
        Without `f`, a decorator.
    """
    if check_rep is not None:
        check_vma = check_rep
    if in_specs is None or out_specs is None:
        raise TypeError("[shard_map] in_specs and out_specs are required keyword arguments")
    if f is None:
        return lambda g: shard_map(g, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                   check_vma=check_vma, axis_names=axis_names)
    if not callable(f):
        raise TypeError(f"[shard_map] f must be callable, got {type(f).__name__}")

    @functools.wraps(f)
    def wrapped(*args):
        m = mesh if mesh is not None else get_mesh()
        if m is None:
            raise ValueError("[shard_map] no mesh: pass mesh= or call shardlab.set_mesh(mesh)")
        if axis_names is not None and set(axis_names) != set(m.axis_names):
            raise NotImplementedError(f"[shard_map] axis_names={set(axis_names)}: partially-manual "
                                      f"shard_map is not supported; map over all of {m.axis_names}")
        if _FRAMES.meshes:
            raise NotImplementedError("[shard_map] nested shard_map is not supported")
        leaves, treedef = _tree.flatten(args)
        specs = _tree.broadcast_prefix(in_specs, args, _is_spec, "in_specs")
        local = [_enter(x, s, m, i) for i, (x, s) in enumerate(zip(leaves, specs))]
        _FRAMES.meshes.append(m)
        try:
            out = f(*_tree.unflatten(treedef, local))
        finally:
            _FRAMES.meshes.pop()
        out_leaves, out_def = _tree.flatten(out, lambda x: isinstance(x, LocalArray))
        out_spec_leaves = _tree.broadcast_prefix(out_specs, out, _is_spec, "out_specs")
        results = [_exit(x, s, m, i, check_vma) for i, (x, s) in enumerate(zip(out_leaves, out_spec_leaves))]
        return _tree.unflatten(out_def, results)

    return wrapped


def _check_spec(spec, what: str) -> PartitionSpec:
    if not isinstance(spec, PartitionSpec):
        raise TypeError(f"[shard_map] {what} must be a PartitionSpec, got {spec!r}")
    return spec


def _enter(x, spec, mesh: Mesh, i: int) -> LocalArray:
    spec = _check_spec(spec, f"in_specs for argument {i}")
    sharding = NamedSharding(mesh, spec)
    if isinstance(x, ShardedArray):
        if x.sharding.mesh != mesh:
            raise ValueError(f"[shard_map] argument {i} lives on {x.sharding.mesh!r} but shard_map "
                             f"runs on {mesh!r}; device_put it onto this mesh first")
        # An unreduced array enters as each device's partial sum (its storage), as in JAX.
        if x.sharding.is_equivalent_to(sharding, x.ndim):
            return LocalArray(x._storage, mesh)
        x = np.asarray(x)
    elif isinstance(x, LocalArray):
        raise TypeError(f"[shard_map] argument {i} is a per-device value; nested shard_map is not supported")
    try:
        arr = canonicalize(np.asarray(x), "shard_map")
    except (TypeError, ValueError) as e:
        raise TypeError(f"[shard_map] argument {i} ({type(x).__name__}) is not an array: {e}") from None
    sharding.check_shape(arr.shape, f"shard_map in_specs[{i}]")
    return LocalArray(to_storage(arr, sharding), mesh)


def _exit(x, spec, mesh: Mesh, i: int, check_vma: bool) -> ShardedArray:
    spec = _check_spec(spec, f"out_specs for output {i}")
    v = lift(x, mesh)
    if v.mesh != mesh:
        raise ValueError(f"[shard_map] output {i} is a per-device value of {v.mesh!r}, not of this "
                         f"shard_map's {mesh!r}; return values computed from this call's arguments")
    sharding = NamedSharding(mesh, spec)
    if len(spec) > v.ndim:
        raise ValueError(f"[shard_map] out_specs {spec!r} for output {i} has {len(spec)} entries but "
                         f"the output has local rank {v.ndim} (local shape {v.shape})")
    mentioned = set(spec.mesh_axes())
    storage = v.storage
    k = mesh.ndim
    for a, name in enumerate(mesh.axis_names):
        size = storage.shape[a]
        if name in mentioned:
            continue
        if size != 1:
            if check_vma:
                raise ValueError(
                    f"[shard_map] out_specs {spec!r} for output {i} leave out mesh axis {name!r}, "
                    f"claiming the output is the same on every device along it, but it varies "
                    f"along {name!r}; add {name!r} to the out_spec, reduce over it first "
                    f"(psum / all_gather), or pass check_vma=False")
            storage = storage[(slice(None),) * a + (slice(0, 1),)]  # device 0's value, as unchecked JAX
    target = tuple(mesh.axis_sizes[a] if n in mentioned else 1 for a, n in enumerate(mesh.axis_names))
    storage = np.broadcast_to(storage, target + storage.shape[k:])  # stride 0: no copy
    local = v.shape
    global_shape = tuple(s * sharding._core.dim_split(d) for d, s in enumerate(local))
    return ShardedArray(storage, sharding, global_shape)
