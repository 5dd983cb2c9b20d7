"""shard_map: run a per-device function on every virtual device at once.

Entering and leaving are tape steps, so gradients flow through a shard_map: a cotangent that
varies along an axis where the entered value was replicated (a replicated weight used by
every data shard) is summed there by a recorded psum — data parallelism's all-reduce.

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

import numpy as np

from ..arrays.layout import full_storage, global_value, local_storage
from ..arrays.local_array import LocalArray, lift
from ..arrays.sharded_array import ShardedArray, abstract_array, device_put
from ..arrays.storage import AbstractStorage, is_abstract
from ..core import tree
from ..core.context import CTX, shard_map_frame
from ..core.dtypes import bfloat16, canonicalize
from ..core.mesh import UNIT_MESH, Mesh, get_mesh
from ..core.sharding import NamedSharding, PartitionSpec
from ..primitives import collectives as col
from ..primitives.primitive import bind, push_entry
from .eval_shape import ShapeDtypeStruct


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
        A function of global arrays (numpy, ShardedArray or ShapeDtypeStruct-made abstract
        arrays) returning ShardedArrays. Without `f`, a decorator.
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
        if CTX.meshes:
            raise NotImplementedError("[shard_map] nested shard_map is not supported")
        leaves, treedef = tree.flatten(args, _is_value)
        specs = tree.broadcast_prefix(in_specs, args, _is_spec, "in_specs")
        local = [_enter(x, s, m, i) for i, (x, s) in enumerate(zip(leaves, specs))]
        with shard_map_frame(m):
            out = f(*tree.unflatten(treedef, local))
        out_leaves, out_def = tree.flatten(out, _is_value)
        out_spec_leaves = tree.broadcast_prefix(out_specs, out, _is_spec, "out_specs")
        results = [_exit(x, s, m, i, check_vma) for i, (x, s) in enumerate(zip(out_leaves, out_spec_leaves))]
        for r in CTX.recorders:  # jit(f).trace / lower (transforms/lowered.py)
            r.end_shard_map(m, leaves, specs, local, out_leaves, out_spec_leaves, results)
        return tree.unflatten(out_def, results)

    return wrapped


def _is_value(x) -> bool:
    return isinstance(x, (LocalArray, ShardedArray))


def _check_spec(spec, what: str) -> PartitionSpec:
    if not isinstance(spec, PartitionSpec):
        raise TypeError(f"[shard_map] {what} must be a PartitionSpec, got {spec!r}")
    return spec


class _Enter:
    """Tape step: a global value entering shard_map as a per-device value."""

    name = "shard_map (enter)"

    @staticmethod
    def vjp(cts, ins, outs, mesh, *, sharding, global_shape):
        ct = cts[0]
        partial = col.partial_axes(ct, outs[0], mesh.axis_names)
        if partial:  # per-device partial sums of a replicated value's cotangent: sum them
            ct = bind(col.PSUM, [ct], mesh, axes=partial, reduction="sum")
        storage = full_storage(ct.storage, sharding, global_shape)
        g = ShardedArray(storage, sharding, global_shape)
        x = ins[0]
        if isinstance(x, ShardedArray):
            out = g if x.sharding == sharding or g.is_abstract else device_put(g, x.sharding)
        else:
            out = LocalArray(global_value(storage, sharding, global_shape), UNIT_MESH)
        # The transpose leaves shard_map: recorded as an exit, so a grad of this grad
        # differentiates through it (otherwise the second derivative would come out zero).
        push_entry(_Exit, {"sharding": sharding}, [ct], [out], mesh)
        return [out]


class _Exit:
    """Tape step: a per-device value leaving shard_map as a global ShardedArray."""

    name = "shard_map (exit)"

    @staticmethod
    def vjp(cts, ins, outs, mesh, *, sharding):
        ct = cts[0]
        x = ins[0]
        if isinstance(ct, ShardedArray):
            if ct.sharding.is_equivalent_to(sharding, ct.ndim) and not ct.unreduced:
                storage = ct._storage
            else:
                value = AbstractStorage(ct.shape, ct.dtype) if ct.is_abstract else np.asarray(ct)
                storage = local_storage(value, sharding)
        elif isinstance(ct, LocalArray):
            storage = local_storage(ct.storage, sharding)
        else:
            storage = local_storage(np.asarray(ct), sharding)
        if storage.dtype != x.dtype:
            storage = storage.astype(x.dtype) if not is_abstract(storage) else AbstractStorage(storage.shape, x.dtype)
        out = LocalArray(storage, mesh)
        if isinstance(ct, (ShardedArray, LocalArray)):  # recorded as an entry, for grad of grad
            push_entry(_Enter, {"sharding": sharding, "global_shape": tuple(ct.shape)}, [ct], [out], mesh)
        return [out]


def _global_input(x, i: int):
    """The global value behind argument `x` (numpy array, or an abstract storage)."""
    if isinstance(x, LocalArray):
        if x.mesh is not UNIT_MESH:
            raise TypeError(f"[shard_map] argument {i} is a per-device value; nested shard_map is not supported")
        return x.storage
    if isinstance(x, ShardedArray):
        return AbstractStorage(x.shape, x.dtype) if x.is_abstract else np.asarray(x)
    if isinstance(x, AbstractStorage):
        return x
    try:
        arr = np.asarray(x)
        if not arr.dtype.isnative:
            arr = arr.astype(arr.dtype.newbyteorder("="))
        return canonicalize(arr, "shard_map")
    except (TypeError, ValueError) as e:
        raise TypeError(f"[shard_map] argument {i} ({type(x).__name__}) is not an array: {e}") from None


def _enter(x, spec, mesh: Mesh, i: int) -> LocalArray:
    spec = _check_spec(spec, f"in_specs for argument {i}")
    sharding = NamedSharding(mesh, spec)
    if isinstance(x, ShapeDtypeStruct):  # abstract mode without eval_shape
        x = abstract_array(x.shape, x.dtype, x.sharding) if x.sharding is not None else \
            AbstractStorage(x.shape, x.dtype)
    if isinstance(x, ShardedArray):
        if x.sharding.mesh != mesh:
            raise ValueError(f"[shard_map] argument {i} lives on {x.sharding.mesh!r} but shard_map "
                             f"runs on {mesh!r}; device_put it onto this mesh first")
        # An unreduced array enters as each device's partial sum (its storage), as in JAX.
        if x.sharding.is_equivalent_to(sharding, x.ndim):
            local = LocalArray(x._storage, mesh)
            if CTX.tapes:
                push_entry(_Enter, {"sharding": x.sharding, "global_shape": x.shape}, [x], [local], mesh)
            return local
    value = _global_input(x, i)
    if mesh.abstract and not is_abstract(value):
        value = AbstractStorage(value.shape, value.dtype)
    sharding.check_shape(value.shape, f"shard_map in_specs[{i}]")
    local = LocalArray(local_storage(value, sharding), mesh)
    if CTX.tapes and isinstance(x, (LocalArray, ShardedArray)):
        push_entry(_Enter, {"sharding": sharding, "global_shape": tuple(value.shape)}, [x], [local], mesh)
    return local


def _exit(x, spec, mesh: Mesh, i: int, check_vma: bool) -> ShardedArray:
    spec = _check_spec(spec, f"out_specs for output {i}")
    if not isinstance(x, LocalArray):
        arr = np.asarray(x) if isinstance(x, (bool, int, float, np.generic, np.ndarray)) else None
        if arr is None or arr.dtype.kind not in "biuf" and arr.dtype != bfloat16:
            raise TypeError(f"[shard_map] output {i} of the function is a {type(x).__name__} ({x!r:.60}); "
                            f"a shard_map body returns arrays, numbers, or pytrees (tuples, lists, "
                            f"dicts) of them")
        x = arr
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
        if name in mentioned or storage.shape[a] == 1:
            continue
        if check_vma:
            raise ValueError(
                f"[shard_map] out_specs {spec!r} for output {i} leave out mesh axis {name!r}, "
                f"claiming the output is the same on every device along it, but it varies "
                f"along {name!r}; add {name!r} to the out_spec, reduce over it first "
                f"(psum / all_gather), or pass check_vma=False")
        storage = _first(storage, a)  # device 0's value, as unchecked JAX
    target = tuple(mesh.axis_sizes[a] if n in mentioned else 1 for a, n in enumerate(mesh.axis_names))
    local = tuple(storage.shape[k:])
    global_shape = tuple(s * sharding._core.dim_split(d) for d, s in enumerate(local))
    if is_abstract(storage):
        storage = AbstractStorage(target + local, storage.dtype)
    else:
        storage = np.broadcast_to(storage, target + local)  # stride 0: no copy
    out = ShardedArray(storage, sharding, global_shape)
    if CTX.tapes:
        push_entry(_Exit, {"sharding": sharding}, [v], [out], mesh)
    return out


def _first(storage, a: int):
    if is_abstract(storage):
        shape = list(storage.shape)
        shape[a] = 1
        return AbstractStorage(shape, storage.dtype)
    return storage[(slice(None),) * a + (slice(0, 1),)]
