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
import math
import warnings

import numpy as np

from ..arrays.layout import full_storage, global_value, local_storage
from ..arrays import local_array as _local_array
from ..arrays.local_array import LocalArray, lift
from ..arrays.sharded_array import ShardedArray, abstract_array, device_put
from ..arrays.storage import AbstractStorage, is_abstract
from ..arrays.typeof import typeof
from ..core import tree
from ..core.context import CTX, shard_map_frame
from ..core.dtypes import bfloat16, canonicalize
from ..core.mesh import UNIT_MESH, AxisType, Mesh, get_mesh
from ..core.processes import PROCESS
from ..core.sharding import NamedSharding, PartitionSpec
from ..ops import lax as lax_ops
from ..ops.lax import manual_axes
from ..primitives import collectives as col
from ..primitives.primitive import Primitive, bind, push_entry
from .eval_shape import ShapeDtypeStruct


class InferFromArgs:
    """The default of ``in_specs``: each argument enters with its own sharding (restricted to
    the manual axes), as ``jax.sharding.Infer``. Host data (numpy arrays, numbers) enters
    replicated."""

    def __repr__(self):
        return "jax.sharding.Infer"

    def __reduce__(self):
        return (_get_default_infer, ())


Infer = InferFromArgs()


def _get_default_infer():
    return Infer


def _is_spec(x) -> bool:
    return isinstance(x, PartitionSpec)


def _is_spec_leaf(x) -> bool:
    return isinstance(x, PartitionSpec) or x is None or x is Infer


_CHECK_REP_MSG = ("shard_map's check_rep was renamed check_vma in JAX 0.6.1 and is no longer accepted by "
                  "jax.shard_map; pass check_vma= instead")


def shard_map(f=None, /, *, out_specs, in_specs=Infer, mesh: Mesh | None = None, axis_names=frozenset(),
              check_vma: bool = True, **deprecated):
    """Maps `f` over the devices of `mesh`, as ``jax.shard_map``.

    Args:
        f: function of per-device values (LocalArrays with LOCAL shapes).
        out_specs: PartitionSpecs, a pytree prefix of the outputs. Leaving a mesh axis out
            claims the output is the same on every device along it.
        in_specs: PartitionSpecs, a pytree prefix of the arguments. The default, ``Infer``,
            takes each ShardedArray argument's own spec (the mesh axes must be Explicit, as
            in JAX; host data enters replicated); a ``None`` leaf passes its argument
            through unchanged (static).
        mesh: the mesh (default: the one set by ``set_mesh``; inside a shard_map, its mesh).
        axis_names: the mesh axes that are manual inside `f` (a set; default: all). The
            other axes stay global: along them each value is the whole array, and
            collectives over them are not bound (nest a shard_map over them instead).
        check_vma: reject out_specs that claim replication for a value that varies.
            (``check_rep=``, its old name, is accepted with a DeprecationWarning.)

    Returns:
        A function of global arrays (numpy, ShardedArray or ShapeDtypeStruct-made abstract
        arrays) returning ShardedArrays. Without `f`, a decorator.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((4,), ("x",))
        >>> x = sl.device_put(np.arange(8.0, dtype=np.float32), sl.NamedSharding(mesh, P("x")))
        >>> f = sl.shard_map(lambda a: a * 2, mesh=mesh, out_specs=P("x"))   # in_specs inferred: P('x')
        >>> np.asarray(f(x)).tolist()
        [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0]
    """
    if deprecated:
        extra = set(deprecated) - {"check_rep"}
        if extra:
            raise TypeError(f"shard_map() got an unexpected keyword argument {sorted(extra)[0]!r}")
        warnings.warn(_CHECK_REP_MSG, DeprecationWarning, stacklevel=2)
        check_vma = bool(deprecated["check_rep"])
    kwargs = dict(out_specs=out_specs, in_specs=in_specs, mesh=mesh, axis_names=axis_names, check_vma=check_vma)
    if f is None:
        return lambda g: _shard_map(g, **kwargs)
    return _shard_map(f, **kwargs)


def smap(f=None, /, *, in_axes=Infer, out_axes, axis_name):
    """Single-axis shard_map, as ``jax.smap``: `f` is manual over the one mesh axis
    `axis_name` of the context mesh (``set_mesh``); ``in_axes``/``out_axes`` (an int, None,
    or a tuple/pytree of them) name the array axis split over it (None: replicated).

    Example:
        >>> import numpy as np, shardlab as sl
        >>> mesh = sl.make_mesh((4,), ("x",))
        >>> with sl.set_mesh(mesh):
        ...     y = sl.smap(lambda a: a + sl.lax.axis_index("x"), in_axes=0, out_axes=0, axis_name="x")(
        ...         np.zeros(8, np.float32))
        >>> np.asarray(y).tolist()
        [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    """
    if isinstance(axis_name, (list, tuple)):
        raise TypeError(f"smap axis_name should be a `str` or a `Hashable`, but got {axis_name}")
    if in_axes is not None and in_axes is not Infer and not isinstance(in_axes, (int, tuple)):
        raise TypeError(f"smap in_axes must be an int, None, jax.sharding.Infer, or a tuple of entries "
                        f"corresponding to the positional arguments passed to the function, but got {in_axes}.")

    def leaves_ok(t):
        return all(isinstance(v, int) and not isinstance(v, bool) for v in tree.flatten(t, lambda v: v is None)[0]
                   if v is not None)

    if in_axes is not Infer and not leaves_ok(in_axes):
        raise TypeError(f"smap in_axes must be an int, None, jax.sharding.Infer, or (nested) container with "
                        f"those types as leaves, but got {in_axes}.")
    if not leaves_ok(out_axes):
        raise TypeError(f"smap out_axes must be an int, None, or (nested) container with those types as leaves, "
                        f"but got {out_axes}.")

    def to_spec(axis):
        return PartitionSpec() if axis is None else PartitionSpec(*([None] * axis + [axis_name]))

    def to_specs(t):
        leaves, treedef = tree.flatten(t, lambda v: v is None)
        return tree.unflatten(treedef, [to_spec(v) for v in leaves])

    in_specs = Infer if in_axes is Infer else to_specs(in_axes)
    kwargs = dict(out_specs=to_specs(out_axes), in_specs=in_specs, mesh=None, axis_names=frozenset({axis_name}),
                  check_vma=True)
    if f is None:
        return lambda g: _shard_map(g, **kwargs)
    return _shard_map(f, **kwargs)


def _spec_names(spec) -> list:
    return [n for n in spec.mesh_axes()]


def _check_specs(specs, manual, prefix: str, mesh_axes) -> None:
    """JAX's _check_specs: every leaf a PartitionSpec naming only manual axes (a name the mesh
    lacks is left to NamedSharding's error)."""
    leaves, _ = tree.flatten(specs, _is_spec)
    bad = [f"  {prefix}_specs[{i}] is {x!r} of type {type(x).__name__}, " for i, x in enumerate(leaves)
           if not isinstance(x, PartitionSpec) and not (prefix == "in" and x is None)]
    if bad:
        raise TypeError(f"[shard_map] shard_map {prefix}_specs argument must be a pytree of `jax.sharding.PartitionSpec` "
                        f"instances, but:\n\n" + "\n\n".join(bad) + f"\n\nCheck the {prefix}_specs values passed "
                        f"to shard_map.")
    msgs = [f"  {prefix}_specs[{i}] refers to {name!r}" for i, x in enumerate(leaves) if isinstance(x, PartitionSpec)
            for name in _spec_names(x) if name not in manual and name in mesh_axes]
    if msgs:
        raise ValueError(f"[shard_map] shard_map {prefix}_specs argument must refer to an axis marked as manual "
                         f"({set(manual)}), but:\n\n" + "\n\n".join(msgs) + f"\n\nCheck the {prefix}_specs values "
                         f"passed to shard_map.")


def _check_unreduced(m: Mesh, manual, specs, prefix: str) -> None:
    """JAX's _check_unreduced: unreduced/reduced specs only in a fully manual shard_map over
    Explicit axes."""
    if specs is None or specs is Infer:
        return
    for s in tree.flatten(specs, _is_spec)[0]:
        if not isinstance(s, PartitionSpec) or not (s.unreduced or getattr(s, "reduced", frozenset())):
            continue
        if manual != frozenset(m.axis_names):
            raise NotImplementedError(f"[shard_map] unreduced/reduced can only be passed to {prefix}_specs when "
                                      f"shard_map is in full manual mode. Got mesh axis names {m.axis_names}, "
                                      f"manual_axes: {set(manual)}, specs: {s!r}")
        for kind in ("unreduced", "reduced"):
            axes = getattr(s, kind, frozenset())
            if any(m.axis_types[m.axis_names.index(a)] != AxisType.Explicit for a in axes if a in m.axis_names):
                raise ValueError(f"[shard_map] {kind} in {prefix}_specs {s!r} can only be used when the mesh "
                                 f"passed to shard_map contains axis names all of type `Explicit`. Got mesh {m!r}")


def _manual_spec(manual, spec: PartitionSpec) -> PartitionSpec:
    """JAX's _manual_spec: `spec` with the non-manual axes dropped (inferred in_specs)."""
    out = []
    for entry in spec:
        if entry is None:
            out.append(None)
        elif isinstance(entry, tuple):
            kept = [a if a in manual else None for a in entry]
            while kept and kept[-1] is None:
                kept.pop()
            if None in kept:
                raise ValueError(f"Invalid spec: {spec}")
            out.append(tuple(kept) if len(kept) > 1 else (kept[0] if kept else None))
        else:
            out.append(entry if entry in manual else None)
    return PartitionSpec(*out)


def _shard_map(f, *, out_specs, in_specs, mesh, axis_names, check_vma):
    if not callable(f):
        raise TypeError(f"[shard_map] shard_map requires a callable for its first argument, but got {f!r} of type {type(f)}.")

    @functools.wraps(f)
    def wrapped(*args):
        outer = _outer_manual()
        m = _mesh(mesh, outer)
        manual = _axis_names(axis_names, m, outer)
        if in_specs is Infer:
            not_explicit = [a for a in sorted(manual, key=m.axis_names.index) if m.axis_types[m.axis_names.index(a)]
                            != AxisType.Explicit]
            if not_explicit:
                types = ", ".join(str(m.axis_types[m.axis_names.index(a)]) for a in sorted(manual, key=m.axis_names.index))
                raise TypeError(f"[shard_map] shard_map in_specs argument must be a pytree of `jax.sharding.PartitionSpec` "
                                f"instances, but it was `None` when axis_names={frozenset(manual)} are of type "
                                f"{types}. Pass in_specs=, or make the mesh's axes Explicit "
                                f"(make_mesh(..., axis_types=(AxisType.Explicit, ...)))")
        elif in_specs is not None:
            _check_specs(in_specs, manual, "in", m.axis_names)
        _check_specs(out_specs, manual, "out", m.axis_names)
        _check_unreduced(m, manual, in_specs, "in")
        _check_unreduced(m, manual, out_specs, "out")
        leaves, treedef = tree.flatten(args, _is_value)
        if in_specs is Infer:
            specs = [_inferred(x, manual) for x in leaves]
        elif in_specs is None:
            specs = [None] * len(leaves)
        else:
            specs = tree.broadcast_prefix(in_specs, args, _is_spec_leaf, "in_specs")
        nested = outer is not None
        local = [x if s is None else (_enter_nested(x, s, m, i, manual) if nested else _enter(x, s, m, i))
                 for i, (x, s) in enumerate(zip(leaves, specs))]
        inside = manual | (outer or frozenset())
        with shard_map_frame(m), manual_axes(None if len(inside) == m.ndim else inside):
            out = f(*tree.unflatten(treedef, local))
        out_leaves, out_def = tree.flatten(out, _is_value)
        out_spec_leaves = tree.broadcast_prefix(out_specs, out, _is_spec, "out_specs")
        name = getattr(f, "__name__", repr(f))
        results = [_exit_nested(x, s, m, i, check_vma, manual, name) if nested else _exit(x, s, m, i, check_vma, name)
                   for i, (x, s) in enumerate(zip(out_leaves, out_spec_leaves))]
        for r in CTX.recorders:  # jit(f).trace / lower record the program (transforms/program.py)
            r.end_shard_map(m, leaves, specs, local, out_leaves, out_spec_leaves, results,
                            region={"flat": getattr(wrapped, "_flat", False), "check_vma": check_vma,
                                    "in_specs": specs, "out_specs": out_spec_leaves, "manual": manual,
                                    "mesh_given": mesh is not None})
        return tree.unflatten(out_def, results)

    return wrapped


def flat_shard_map(f, **kwargs):
    """``shard_map(f, **kwargs)`` for shardlab's own global-view ops: a traced program (``jit(f)
    .trace``, ``make_jaxpr``) records its body's equations in line, not as a nested ``shard_map``
    equation, since the user's program has no shard_map there."""
    g = shard_map(f, **kwargs)
    g._flat = True
    return g


def _outer_manual():
    """The manual axes of the shard_map this one runs inside (None at the top level)."""
    if not CTX.meshes:
        return None
    manual = lax_ops.MANUAL[-1] if lax_ops.MANUAL and len(lax_ops.MANUAL) == len(CTX.meshes) else None
    return frozenset(CTX.meshes[-1].axis_names) if manual is None else manual


def _mesh(mesh, outer) -> Mesh:
    if outer is not None:
        inner = CTX.meshes[-1]
        if mesh is not None and mesh != inner:
            raise ValueError(f"[shard_map] The context mesh {inner!r} should match the mesh passed to shard_map "
                             f"{mesh!r}: a shard_map nested in another runs on the outer one's mesh; leave "
                             f"mesh= out")
        return inner
    ctx = get_mesh()
    if mesh is not None and ctx is not None and _abstract_key(mesh) != _abstract_key(ctx):
        raise ValueError(f"[shard_map] The context mesh {ctx!r} should match the mesh passed to shard_map "
                         f"{mesh!r}: leave mesh= out, or pass the mesh set by set_mesh")
    m = mesh if mesh is not None else ctx
    if m is None:
        raise ValueError("[shard_map] no mesh: the context mesh cannot be empty. Use `jax.set_mesh(mesh)` to enter "
                         "into a mesh context, or pass mesh=")
    if not isinstance(m, Mesh):
        raise TypeError(f"[shard_map] shard_map requires a `jax.sharding.Mesh` or a `jax.sharding.AbstractMesh` instance for "
                        f"its second argument, but got {m!r} of type {type(m)}.")
    return m


def _abstract_key(m) -> tuple:
    """What JAX compares between the context mesh and shard_map's (``mesh.abstract_mesh``)."""
    return (tuple(m.axis_names), tuple(m.axis_sizes), tuple(m.axis_types))


def _axis_names(axis_names, m: Mesh, outer) -> frozenset:
    if not isinstance(axis_names, (set, frozenset)):
        raise TypeError(f"[shard_map] `axis_names` argument of shard_map should be of type `frozenset` or `set`. Got type: "
                        f"{type(axis_names)}")
    free = frozenset(m.axis_names) - (outer or frozenset())
    names = frozenset(axis_names) or free
    if not names <= frozenset(m.axis_names):
        raise ValueError(f"[shard_map] jax.shard_map requires axis_names={names} to be a subset of "
                         f"mesh.axis_names={frozenset(m.axis_names)}")
    if outer is not None:
        if not names - outer:
            raise ValueError(f"[shard_map] axis_names={set(names)}: every one of them is already manual in the "
                             f"enclosing shard_map; a nested shard_map maps over the remaining axes "
                             f"{sorted(free, key=m.axis_names.index)}")
        names = names - outer
    return names


def _inferred(x, manual) -> PartitionSpec:
    if isinstance(x, ShardedArray):
        return _manual_spec(manual, x.sharding.spec)
    return PartitionSpec()


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
        x = ins[0]
        reduced = x.sharding.spec.reduced if isinstance(x, ShardedArray) else frozenset()
        partial = [a for a in col.partial_axes(ct, outs[0], mesh.axis_names) if a not in reduced]
        if partial:  # per-device partial sums of a replicated value's cotangent: sum them
            ct = bind(col.PSUM, [ct], mesh, axes=partial, reduction="sum")
        if reduced:  # JAX: a reduced value's cotangent is unreduced (its partial sums stay apart)
            return [_unreduced_cotangent(ct, x, mesh, global_shape)]
        if sharding.spec.unreduced:  # and an unreduced value's is reduced: every partial gets the same
            sharding = NamedSharding(mesh, sharding.spec.update(unreduced=frozenset(), reduced=sharding.spec.unreduced),
                                     memory_kind=sharding.memory_kind, _check_axis_types=False)
        storage = full_storage(ct.storage, sharding, global_shape)
        g = ShardedArray(storage, sharding, global_shape)
        if isinstance(x, ShardedArray):
            out = g if x.sharding == sharding or g.is_abstract else device_put(g, x.sharding)
        else:
            out = LocalArray(global_value(storage, sharding, global_shape), UNIT_MESH)
        # The transpose leaves shard_map: recorded as an exit, so a grad of this grad
        # differentiates through it (otherwise the second derivative would come out zero).
        push_entry(_Exit, {"sharding": sharding}, [ct], [out], mesh)
        return [out]


def _unreduced_cotangent(ct: LocalArray, x: ShardedArray, mesh: Mesh, global_shape: tuple) -> ShardedArray:
    """The cotangent of `x`, whose type is reduced along some axes, typed unreduced along them
    (JAX's rule: the transpose of a reduced use keeps each device's partial sum, and the
    AllReduce happens only where the user reshards it). A cotangent that is already the same on
    every device along such an axis is written as partials: the value on the axis's first
    device, zeros on the others (their sum is the value)."""
    spec = x.sharding.spec
    sharding = NamedSharding(mesh, spec.update(reduced=frozenset(), unreduced=spec.reduced),
                             memory_kind=x.sharding.memory_kind, _check_axis_types=False)
    named = set(spec.mesh_axes()) | set(spec.reduced)
    local = tuple(sharding.shard_shape(global_shape))
    target = tuple(mesh.shape[a] if a in named else 1 for a in mesh.axis_names) + local
    storage = ct.storage
    if is_abstract(storage):
        storage = AbstractStorage(target, storage.dtype)
    else:
        for i, a in enumerate(mesh.axis_names):
            if a in spec.reduced and storage.shape[i] == 1 and mesh.shape[a] > 1:
                pad = [(0, 0)] * storage.ndim
                pad[i] = (0, mesh.shape[a] - 1)
                storage = np.pad(storage, pad)
        storage = np.broadcast_to(storage, target) if tuple(storage.shape) != target else storage
    out = ShardedArray(storage, sharding, global_shape)
    push_entry(_Exit, {"sharding": sharding}, [ct], [out], mesh)
    return out


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
    storage = local_storage(value, sharding)
    if PROCESS.count > 1 and PROCESS.scatter is not None and isinstance(storage, np.ndarray) and \
            not isinstance(x, LocalArray):  # under MPI, as device_put: rank 0's host value, each rank keeping its part
        storage = PROCESS.scatter(storage, mesh, value.shape, same=isinstance(x, ShardedArray))
    local = LocalArray(storage, mesh)
    if CTX.tapes and isinstance(x, (LocalArray, ShardedArray)):
        push_entry(_Enter, {"sharding": sharding, "global_shape": tuple(value.shape)}, [x], [local], mesh)
    return local


def _exit(x, spec, mesh: Mesh, i: int, check_vma: bool, fname: str = "f") -> ShardedArray:
    spec = _check_spec(spec, f"out_specs for output {i}")
    if isinstance(x, ShardedArray):  # closed over by the body: returned as the invariant value it is there
        x = capture(x, mesh, output=i)
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
    unreduced = spec.unreduced  # each device's value is a partial sum along these (P(unreduced=...))
    storage = v.storage
    k = mesh.ndim
    for a, name in enumerate(mesh.axis_names):
        if name in mentioned or name in unreduced or storage.shape[a] == 1:
            continue
        if check_vma:
            raise ValueError(_vma_message(fname, mesh, spec, i, name))
        storage = _first(storage, a)  # device 0's value, as unchecked JAX
    target = tuple(mesh.axis_sizes[a] if n in mentioned or n in unreduced else 1
                   for a, n in enumerate(mesh.axis_names))
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


def capture(x: ShardedArray, mesh: Mesh, output: int | None = None) -> LocalArray:
    """A global array that a shard_map body closes over (rather than takes as an argument), as a
    per-device value: JAX makes it a constant of the body, entered replicated, so every device
    holds the whole array and it is invariant along every manual axis (``typeof`` shows no
    ``{V:...}``; mixing it with varying values broadcasts it, returning it needs no check).
    Under a gradient the entry is recorded, so a captured parameter gets its cotangent summed
    over the devices, as for an argument entered with ``P()``.

    JAX allows this for arrays on a mesh of Auto axes only: an array on a mesh with Explicit
    axes raises NotImplementedError when an operation uses it (JAX's message), and returning
    one that is sharded raises ValueError (its spec is not the P() a constant enters with);
    returning a replicated one is allowed. `output`: the output index when the body returns it.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> from shardlab.sharding import AxisType
        >>> mesh = sl.make_mesh((2,), ("i",), (AxisType.Auto,))
        >>> w = sl.device_put(np.arange(4.0, dtype=np.float32), sl.NamedSharding(mesh, P("i")))
        >>> f = sl.shard_map(lambda a: a * w, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
        >>> np.asarray(f(np.ones(8, np.float32))).tolist()
        [0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 2.0, 3.0]
    """
    if mesh is UNIT_MESH:  # not inside a shard_map body (a value tracked by grad): no per-device view
        raise TypeError("[shard_map] a global ShardedArray was captured inside a shard_map body; "
                        "pass it as an argument with an in_spec instead")
    src = x.sharding.mesh
    if AxisType.Explicit in tuple(src.axis_types):
        t = _short(typeof(x))
        explicit = tuple(n for n, ty in zip(src.axis_names, src.axis_types) if ty == AxisType.Explicit)
        if output is None:
            raise NotImplementedError(
                "[shard_map] Closing over inputs to shard_map where the input is sharded on `Explicit` axes is "
                "not implemented. As a workaround, please pass those inputs as an argument to shard_map. Got "
                f"input with shape {t}({{Explicit: {explicit}}})")
        spec = _type_spec_tuple(x)
        if any(e is not None for e in spec):
            raise ValueError(
                f"[shard_map] output {output} is a global array the body closes over, {t} on Explicit "
                f"axes: it enters as a constant with in_specs P({', '.join(['None'] * x.ndim)}), which does not "
                f"match its spec {x.sharding.spec!r}. Pass it to shard_map as an argument with its in_spec")
    k = mesh.ndim
    if x.is_abstract or mesh.abstract:
        storage = AbstractStorage((1,) * k + tuple(x.shape), x.dtype)
    else:
        storage = np.asarray(x).reshape((1,) * k + tuple(x.shape))  # partial sums added, as JAX's const
    local = LocalArray(storage, mesh)
    if CTX.tapes:
        sharding = NamedSharding(mesh, PartitionSpec())
        push_entry(_Capture, {"sharding": sharding, "global_shape": tuple(x.shape)}, [x], [local], mesh)
    return local


class _Capture(_Enter):
    """Tape step: a closed-over global array entering a shard_map body. Its cotangent is summed
    over the devices and left replicated (an Auto mesh's layout is the compiler's choice; JAX's
    comes back as P())."""

    name = "shard_map (closed over)"

    @staticmethod
    def vjp(cts, ins, outs, mesh, *, sharding, global_shape):
        ct = cts[0]
        partial = col.partial_axes(ct, outs[0], mesh.axis_names)
        if partial:
            ct = bind(col.PSUM, [ct], mesh, axes=partial, reduction="sum")
        out = ShardedArray(full_storage(ct.storage, sharding, global_shape), sharding, global_shape)
        push_entry(_Exit, {"sharding": sharding}, [ct], [out], mesh)
        return [out]


def _short(t) -> str:
    """A type in the book's notation (``f32[8@X,4]``)."""
    name = t.dtype.name
    for long, short in (("bfloat", "bf"), ("complex", "c"), ("float", "f"), ("uint", "u"), ("int", "i")):
        if name.startswith(long):
            name = short + name[len(long):]
            break
    return name + t.str_short()[len(t.dtype.name):]


def _type_spec_tuple(x: ShardedArray) -> tuple:
    return tuple(x.sharding.spec.axes_of(d) or None for d in range(x.ndim))


_local_array.register_capture(capture)


def _first(storage, a: int):
    if is_abstract(storage):
        shape = list(storage.shape)
        shape[a] = 1
        return AbstractStorage(shape, storage.dtype)
    return storage[(slice(None),) * a + (slice(0, 1),)]


def _vma_message(fname, mesh, spec, i, name) -> str:
    return (f"[shard_map] shard_map applied to the function {fname!r} was given out_specs which require replication which "
            f"can't be statically inferred given the mesh:\n\nThe mesh given has shape {tuple(mesh.axis_sizes)} "
            f"with corresponding axis names {mesh.axis_names}.\n\nout_specs[{i}] is {spec!r} which implies that the "
            f"corresponding output value is replicated across mesh axis {name!r}, but it varies along {name!r}\n\n"
            f"Add {name!r} to the out_spec, reduce over it first (psum / all_gather), or pass "
            f"check_vma=False")


# -- nested shard_map: splitting a per-device value further, and merging it back ---------------
def _dims_of(spec: PartitionSpec, rank: int) -> tuple:
    return tuple(tuple(spec.axes_of(d)) for d in range(rank))


def _split_shape(avals, mesh, *, dims, manual):
    x = avals[0]
    k = mesh.ndim
    mesh_dims = list(x.shape[:k])
    local = list(x.shape[k:])
    for d, names in enumerate(dims):
        for a in names:
            mesh_dims[mesh.axis_names.index(a)] = mesh.shape[a]
        local[d] //= math.prod(mesh.shape[a] for a in names)
    return [(tuple(mesh_dims) + tuple(local), x.dtype)]


def _split_impl(storages, mesh, *, dims, manual):
    s = storages[0]
    k = mesh.ndim
    shape, pos, local_pos = list(s.shape[:k]), {}, []
    for d, names in enumerate(dims):
        for a in names:
            pos[mesh.axis_names.index(a)] = len(shape)
            shape.append(mesh.shape[a])
        local_pos.append(len(shape))
        shape.append(s.shape[k + d] // math.prod(mesh.shape[a] for a in names))
    v = s.reshape(shape)
    perm = [pos.get(a, a) for a in range(k)] + local_pos
    v = v.transpose(perm + sorted(pos))  # the split axes' old dims (size 1) go last and are dropped
    return [np.ascontiguousarray(v.reshape(v.shape[:len(perm)]))]


def _merge_shape(avals, mesh, *, dims, manual):
    x = avals[0]
    k = mesh.ndim
    mesh_dims = list(x.shape[:k])
    local = list(x.shape[k:])
    for d, names in enumerate(dims):
        for a in names:
            mesh_dims[mesh.axis_names.index(a)] = 1
        local[d] *= math.prod(mesh.shape[a] for a in names)
    return [(tuple(mesh_dims) + tuple(local), x.dtype)]


def _merge_impl(storages, mesh, *, dims, manual):
    s = storages[0]
    k = mesh.ndim
    merged = sorted(mesh.axis_names.index(a) for names in dims for a in names)
    full = list(s.shape)
    for a in merged:
        full[a] = mesh.axis_sizes[a]
    s = np.broadcast_to(s, full)  # an invariant value concatenated along an axis: copies
    other = [a for a in range(k) if a not in merged]
    order, shape = [], [s.shape[a] for a in other]
    for d, names in enumerate(dims):
        ids = [mesh.axis_names.index(a) for a in names]
        order += ids + [k + d]
        shape.append(math.prod(s.shape[a] for a in ids) * s.shape[k + d])
    v = s.transpose(other + order).reshape(shape)
    return [np.ascontiguousarray(np.expand_dims(v, tuple(merged)) if merged else v)]


def _split_vjp(cts, ins, outs, mesh, *, dims, manual):
    ct = cts[0]
    named = {a for names in dims for a in names}
    partial = tuple(a for a in mesh.axis_names if a in manual and a not in named and a in ct.varying_axes)
    if partial:  # the entered value is the same along these axes: its cotangent is their sum
        ct = bind(col.PSUM, [ct], mesh, axes=partial, reduction="sum")
    return [bind(MERGE, [ct], mesh, dims=dims, manual=manual)]


def _merge_vjp(cts, ins, outs, mesh, *, dims, manual):
    ct = cts[0]
    named = tuple(a for names in dims for a in names if a in ct.varying_axes)
    if named:
        ct = bind(col.PSUM, [ct], mesh, axes=named, reduction="sum")
    return [bind(SPLIT, [ct], mesh, dims=dims, manual=manual)]


SPLIT = Primitive("shard_map_split", shape_rule=_split_shape, vjp=_split_vjp)
MERGE = Primitive("shard_map_merge", shape_rule=_merge_shape, vjp=_merge_vjp)
for _prim, _fn in ((SPLIT, _split_impl), (MERGE, _merge_impl)):
    _prim.impl["emulated"] = _fn


def _enter_nested(x, spec, mesh: Mesh, i: int, manual) -> LocalArray:
    spec = _check_spec(spec, f"in_specs for argument {i}")
    v = x if isinstance(x, LocalArray) else lift(_global_input(x, i), mesh)
    if v.mesh != mesh:
        raise ValueError(f"[shard_map] argument {i} is a per-device value of {v.mesh!r}, not of the enclosing "
                         f"shard_map's {mesh!r}")
    if len(spec) > v.ndim:
        raise ValueError(f"[shard_map] in_specs {spec!r} for argument {i} has {len(spec)} entries but the "
                         f"argument has rank {v.ndim} (shape {v.shape})")
    NamedSharding(mesh, spec)  # an unknown or repeated axis name: NamedSharding's error
    dims = _dims_of(spec, v.ndim)
    for d, names in enumerate(dims):
        n = math.prod(mesh.shape[a] for a in names)
        if v.shape[d] % n:
            raise ValueError(f"[shard_map] argument {i} of shape {v.shape}: in_specs {spec!r} maps dim {d} (of "
                             f"size {v.shape[d]}) to mesh axes {names} (of total size {n}), which does not "
                             f"divide it")
    return bind(SPLIT, [v], mesh, dims=dims, manual=tuple(sorted(manual)))


def _exit_nested(x, spec, mesh: Mesh, i: int, check_vma: bool, manual, fname: str) -> LocalArray:
    spec = _check_spec(spec, f"out_specs for output {i}")
    v = lift(x, mesh)
    if len(spec) > v.ndim:
        raise ValueError(f"[shard_map] out_specs {spec!r} for output {i} has {len(spec)} entries but the "
                         f"output has local rank {v.ndim} (local shape {v.shape})")
    NamedSharding(mesh, spec)
    mentioned = set(spec.mesh_axes())
    for a, name in enumerate(mesh.axis_names):
        if name in manual and name not in mentioned and name in v.varying_axes:
            if check_vma:
                raise ValueError(_vma_message(fname, mesh, spec, i, name))
            v = LocalArray(_first(v.storage, a), mesh)
    return bind(MERGE, [v], mesh, dims=_dims_of(spec, v.ndim), manual=tuple(sorted(manual)))
