"""vmap: map a function over an array axis, as ``jax.vmap``.

shardlab runs eagerly on concrete values, so ``vmap(f)`` calls `f` once per element of the
mapped axis and stacks the results (``shardlab._src.ops.batch_axis``): per-device values inside
``shard_map`` and values under ``grad`` are sliced and stacked with recorded ops, so the
result is differentiable and each collective `f` runs is recorded (once per element: the
ledger shows B small collectives where JAX would run one batched one). The cost is one
Python call of `f` per element: fine for the small batches an emulator runs.

Global ShardedArrays keep their sharding: each element is a ShardedArray of the remaining
dims, and the stacked output's mapped dim is sharded as the inputs' mapped dims were
(explicit sharding), or over ``spmd_axis_name``.

Collectives over the vmapped axis itself (``psum(x, axis_name)``, ``pmean``, ``all_gather``,
``axis_index``, ``ppermute`` ... inside ``vmap(..., axis_name=...)``): when `f` runs one, the
elements run together instead, as the devices of a virtual mesh with the single axis
`axis_name` (one call of `f` on per-device values; the virtual mesh records no ledger events,
as a vmapped axis moves nothing). This works outside ``shard_map`` on host values and under
``grad``; inside ``shard_map``, or on global arrays, it raises NotImplementedError naming what
to use.

Example:
    >>> import numpy as np, shardlab as sl
    >>> sl.vmap(lambda x, w: x @ w, in_axes=(0, None))(np.ones((3, 2), np.float32),
    ...                                                np.ones((2, 4), np.float32)).shape
    (3, 4)
"""

from __future__ import annotations

import collections
import functools
import inspect

import numpy as np

from ..arrays.host_array import as_host
from ..arrays.local_array import LocalArray
from ..arrays.sharded_array import ShardedArray
from ..arrays.storage import AbstractStorage, is_abstract
from ..core import tree
from ..core.context import CTX
from ..core.mesh import UNIT_MESH, make_mesh
from ..core.sharding import P
from ..core.tree_errors import _prefix_error
from ..core.tree_util import keystr
from ..ops import batch_axis
from ..ops.batch_axis import as_array, shape_of, stack, take, type_str
from ..ops import numpy as jnp
from ..primitives.primitive import push_entry
from .shard_map import flat_shard_map

batch_axis.register_shard_map(flat_shard_map)  # an element of a mapped axis: shardlab's step, not the user's


def _is_none(x) -> bool:
    return x is None


def _check_axes_tree(axes, what: str) -> None:
    for leaf in tree.flatten(axes, _is_none)[0]:
        if leaf is not None and type(leaf) is not int:
            raise TypeError(f"vmap {what} must be an int, None, or (nested) container with those types as "
                            f"leaves, but got {axes}.")


def vmap(fun, in_axes=0, out_axes=0, axis_name=None, axis_size=None, spmd_axis_name=None, sum_match=False):
    """Vectorizing map, as ``jax.vmap``: ``vmap(f)(xs)`` is ``stack([f(x) for x in xs])``
    with the mapped axis of each argument and of each output chosen by `in_axes` and
    `out_axes`.

    Args:
        fun: the function to map.
        in_axes: an int, None, or a tuple with one entry per positional argument, each a
            pytree prefix of that argument with ints (negative allowed) or None (not mapped)
            at its leaves. Keyword arguments are mapped over axis 0.
        out_axes: the same for the outputs; None for an output that is the same for every
            element.
        axis_name: a name for the mapped axis, for collectives over it (see above).
        axis_size: the mapped size, needed when no argument is mapped.
        spmd_axis_name: mesh axes to shard the mapped dim of global outputs over.
        sum_match: JAX's option to sum outputs mapped to ``out_axes=None``; not supported
            (shardlab cannot tell a batched output from one equal for every element).

    Returns:
        The vectorized function.

    Raises:
        ValueError: inconsistent mapped sizes, an axis out of range, in_axes that is not a
            prefix of the arguments (JAX's messages).

    Example:
        >>> import numpy as np, shardlab as sl
        >>> xs = np.arange(6.0, dtype=np.float32).reshape(2, 3)
        >>> sl.vmap(lambda x: x.sum(), in_axes=1)(xs).tolist()
        [3.0, 5.0, 7.0]
        >>> sl.vmap(lambda x: (x, x * 2), out_axes=(0, 1))(xs)[1].shape
        (3, 2)
        >>> sl.vmap(lambda x: x - sl.lax.pmean(x, "i"), axis_name="i")(xs).tolist()
        [[-1.5, -1.5, -1.5], [1.5, 1.5, 1.5]]
    """
    if isinstance(fun, staticmethod):
        raise TypeError(f"staticmethod arguments are not supported, got {fun}")
    if not callable(fun):
        raise TypeError(f"Expected a callable value, got {fun}")
    if sum_match:
        raise NotImplementedError("[vmap] sum_match=True is not supported: shardlab runs the function once per "
                                  "element and cannot tell which outputs are batched; sum the mapped output "
                                  "yourself (out_axes=0, then jnp.sum(..., axis=0))")
    if isinstance(in_axes, list):
        in_axes = tuple(in_axes)
    if not (in_axes is None or type(in_axes) in (int, tuple)):
        raise TypeError("vmap in_axes must be an int, None, or a tuple of entries corresponding to the "
                        f"positional arguments passed to the function, but got {in_axes}.")
    _check_axes_tree(in_axes, "in_axes")
    _check_axes_tree(out_axes, "out_axes")
    spmd = None if spmd_axis_name is None else \
        (tuple(spmd_axis_name) if isinstance(spmd_axis_name, (tuple, list)) else (spmd_axis_name,))

    @functools.wraps(fun)
    def vmap_f(*args, **kwargs):
        if isinstance(in_axes, tuple) and len(in_axes) != len(args):
            raise ValueError("vmap in_axes must be an int, None, or a tuple of entries corresponding to the "
                             "positional arguments passed to the function, "
                             f"but got len(in_axes)={len(in_axes)}, len(args)={len(args)}")
        leaves, treedef = tree.flatten((args, kwargs))
        axes = _flatten_axes("vmap in_axes", (args, kwargs), (in_axes, 0))
        axes = [_normalize(x, d) for x, d in zip(leaves, axes)]
        size = _mapped_size(fun, args, kwargs, leaves, axes, axis_size)
        batch_axes = _batch_sharding(leaves, axes, spmd)
        rows = []
        for i in range(size):
            sliced = [x if d is None else take(x, i, d, "vmap") for x, d in zip(leaves, axes)]
            a, k = treedef.unflatten(sliced)
            try:
                rows.append(_call(fun, a, k, axis_name))
            except _NamedAxisUsed:
                if not _named_ok(leaves, axis_name):
                    raise _unsupported(axis_name) from None
                return _run_named(fun, leaves, treedef, axes, size, axis_name, out_axes)
        return _assemble(rows, out_axes, batch_axes, size)

    return vmap_f


def _named_ok(leaves, axis_name) -> bool:
    """The named-axis path runs the elements as the devices of a one-axis virtual mesh: outside
    shard_map, on host values (or one-device values under grad), with a string axis name."""
    return isinstance(axis_name, str) and not CTX.meshes and not any(
        isinstance(x, ShardedArray) or (isinstance(x, LocalArray) and x.mesh is not UNIT_MESH) for x in leaves)


class _Unit:
    """Tape step: a global value of the vmap's virtual mesh becoming a host (one-device) value."""

    name = "vmap (leave the named axis)"

    @staticmethod
    def vjp(cts, ins, outs, mesh):
        return [cts[0]]


def _run_named(fun, leaves, treedef, axes, size, axis_name, out_axes):
    """vmap with a named axis: element i runs as device i of a virtual mesh with the one axis
    `axis_name` (which records no ledger events: it is not a mesh the user made), so psum,
    pmean, all_gather, axis_index, ppermute ... over `axis_name` are the mesh's collectives."""
    mesh = make_mesh((size,), (axis_name,))
    mesh.records = False
    traced = bool(CTX.tapes)
    arrays = [i for i, (x, d) in enumerate(zip(leaves, axes)) if d is not None or
              isinstance(x, (LocalArray, np.ndarray, np.generic, bool, int, float, complex))]
    ins = []
    for i in arrays:
        x, d = leaves[i], axes[i]
        x = x if isinstance(x, LocalArray) else as_array(x, "vmap")
        ins.append(x if d in (None, 0) else jnp.moveaxis(x, d, 0))
    info = {}

    def body(*vals):
        full = list(leaves)
        for i, v in zip(arrays, vals):
            full[i] = jnp.squeeze(v, 0) if axes[i] is not None else v
        a, k = treedef.unflatten(full)
        out_leaves, out_def = tree.flatten(fun(*a, **k))
        info["def"] = out_def
        info["varying"] = [isinstance(o, LocalArray) and o.storage.shape[0] != 1 for o in out_leaves]
        return [jnp.expand_dims(as_array(o, "vmap"), 0) for o in out_leaves]

    specs = tuple(P(axis_name) if axes[i] is not None else P() for i in arrays)
    try:
        outs = flat_shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(axis_name), check_vma=False)(*ins)
    except ValueError as e:
        if "different meshes" not in str(e):
            raise
        raise NotImplementedError(
            f"[vmap] with collectives over {axis_name!r}, the function runs on a virtual mesh and cannot use a "
            f"value it closes over that is being differentiated; pass that value as an argument (in_axes None)"
        ) from e
    out_def = info["def"]
    spec = _flatten_axes("vmap out_axes", out_def.unflatten([0] * out_def.num_leaves), out_axes)
    paths = [p for p, _ in tree.flatten_with_path(out_def.unflatten([0] * out_def.num_leaves))[0]]
    result = []
    for j, o in enumerate(outs):
        if o.is_abstract:
            host = AbstractStorage(o.shape, o.dtype)
            v = LocalArray(host, UNIT_MESH)
        else:
            v = LocalArray(np.asarray(o), UNIT_MESH)
        if traced:
            push_entry(_Unit, {}, [o], [v], mesh)
        d = spec[j]
        if d is None:
            if info["varying"][j]:
                raise ValueError(f"at vmap out_axes{keystr(paths[j])}, got axis spec None but output was batched "
                                 f"on axis 0")
            v = v[0]
        else:
            rank = len(v.shape)
            if not -rank <= d < rank:
                raise ValueError(f"axis {d} is out of bounds for array of dimension {rank}")
            if d % rank:
                v = jnp.moveaxis(v, 0, d % rank)
        result.append(v if traced or is_abstract(v.storage) else as_host(v.storage))  # JAX's one-device Array
    return out_def.unflatten(result)


class _NamedAxisUsed(Exception):
    """The function ran a collective over the vmapped axis (so the elements must run together)."""


def _call(fun, args, kwargs, axis_name):
    if axis_name is None:
        return fun(*args, **kwargs)
    try:
        return fun(*args, **kwargs)
    except NameError as e:
        if repr(axis_name) in str(e) or str(axis_name) in str(e):
            raise _NamedAxisUsed() from e
        raise


def _unsupported(axis_name) -> NotImplementedError:
    return NotImplementedError(
        f"[vmap] collectives over the vmapped axis {axis_name!r} run only outside shard_map, on host or "
        f"one-device values (there the elements run as the devices of a virtual mesh). Here, reduce after the "
        f"vmap instead (e.g. jnp.sum(vmap(f)(x), axis=0) for psum, the stacked output itself for all_gather, "
        f"jnp.arange(n) for axis_index), or map with shard_map over a mesh axis of that size")


def _flatten_axes(name: str, value_tree, axes_tree) -> list:
    """`axes_tree` (a prefix of `value_tree`, None as a leaf) broadcast to one entry per leaf."""
    out: list = []
    try:
        prefix_leaves, prefix_def = tree.flatten(axes_tree, _is_none)
        subtrees = prefix_def.flatten_up_to(value_tree)
    except ValueError:
        args_axes, args_value = axes_tree[0], value_tree[0]
        dummy = tree.flatten(args_value)[1].unflatten([_PytreeLeaf()] * tree.flatten(args_value)[1].num_leaves)
        errors = list(_prefix_error((), args_axes, dummy, _is_none)) if name.endswith("in_axes") else \
            list(_prefix_error((), axes_tree, value_tree, _is_none))
        if not errors:
            raise ValueError(f"{name} specification must be a tree prefix of the corresponding value, got "
                             f"specification {axes_tree} for value tree {tree.flatten(value_tree)[1]}.") from None
        details = "\n  ".join(e(name).args[0] for e in errors)
        raise ValueError(f"{name} specification must be a tree prefix of the corresponding value; \n"
                         f"  Mismatch details ({len(errors)} found):\n  {details}") from None
    for a, sub in zip(prefix_leaves, subtrees):
        out.extend([a] * tree.flatten(sub)[1].num_leaves)
    return out


class _PytreeLeaf:
    def __repr__(self):
        return "pytree leaf"


def _normalize(x, d):
    if d is None:
        return None
    if not isinstance(x, (LocalArray, ShardedArray, np.ndarray, np.generic, bool, int, float, complex)):
        raise TypeError(f"[vmap] an argument leaf of type {type(x).__name__} cannot be mapped over; "
                        f"pass it with in_axes None")
    rank = len(shape_of(x))
    if not -rank <= d < rank:
        min_rank = d + 1 if d >= 0 else -d
        raise ValueError(f"vmap was requested to map its argument along axis {d}, which implies that its rank "
                         f"should be at least {min_rank}, but is only {rank} (its shape is {tuple(shape_of(x))})")
    return d % rank


def _mapped_size(fun, args, kwargs, leaves, axes, axis_size) -> int:
    if not leaves and axis_size is None:
        raise ValueError("vmap wrapped function must be passed at least one argument containing an array or "
                         f"axis_size must be specified, got empty *args={args} and **kwargs={kwargs}")
    sizes = [None if d is None else shape_of(x)[d] for x, d in zip(leaves, axes)]
    found = [s for s in sizes if s is not None] + ([axis_size] if axis_size is not None else [])
    if len(set(found)) == 1:
        return found[0]
    if not found:
        raise ValueError("vmap must have at least one non-None value in in_axes or axis_size must be specified")
    try:
        params = list(inspect.signature(fun).bind(*args, **kwargs).signature.parameters)
    except (TypeError, ValueError):
        params = None

    def arg_name(path):
        if params is None or path[0].idx >= len(params):
            return f"args{keystr(path)}"
        return f"argument {params[path[0].idx]}" + (keystr(path[1:]) if len(path) > 1 else "")

    names = [f"{arg_name(p)} of type {type_str(x)}" for p, x in tree.flatten_with_path(args)[0]] + \
        [f"kwargs{keystr(p)} of type {type_str(x)}" for p, x in tree.flatten_with_path(kwargs)[0]]
    counts = collections.Counter(s for s in sizes if s is not None).most_common()
    first = {s: i for i, s in reversed(list(enumerate(sizes))) if s is not None}
    msg = ["vmap got inconsistent sizes for array axes to be mapped:\n"]
    if axis_size is not None:
        msg.append(f"  * the `axis_size` argument was {axis_size};\n")
    for n, (sz, ct) in enumerate(counts):
        ex, ax = names[first[sz]], axes[first[sz]]
        if ct == 1:
            msg.append(f"  * one axis had size {sz}: axis {ax} of {ex};\n")
        elif n == 0:
            msg.append(f"  * most axes ({ct} of them) had size {sz}, e.g. axis {ax} of {ex};\n")
        else:
            msg.append(f"  * some axes ({ct} of them) had size {sz}, e.g. axis {ax} of {ex};\n")
    raise ValueError("".join(msg)[:-2])


def _batch_sharding(leaves, axes, spmd) -> tuple:
    """The mesh axes the mapped dims of global inputs are sharded over (they must agree, as
    in JAX's explicit mode), or `spmd_axis_name`."""
    spec = None
    seen = False
    for x, d in zip(leaves, axes):
        if d is None or not isinstance(x, ShardedArray):
            continue
        s = tuple(x.sharding.spec.normalized(x.ndim)[d])
        if seen and s != spec:
            raise ValueError(f"Mapped away dimension of inputs passed to vmap should be sharded the same. Got "
                             f"inconsistent axis specs: {spec or None} vs {s or None}")
        spec, seen = s, True
    if spec:
        for x, d in zip(leaves, axes):
            if d is None and isinstance(x, ShardedArray) and set(spec) & set(x.sharding.spec.mesh_axes()):
                raise ValueError(f"Unmapped values passed to vmap cannot be sharded along the mesh axis you are "
                                 f"vmapping over. Got type: {type_str(x)} sharded as {x.sharding.spec}, in_axes: "
                                 f"None and vmapped mesh axis: {spec}")
    if spmd is not None and spec and tuple(spec) != spmd:
        raise ValueError(f"Only one of spmd_axis_name or arrays sharded on `Explicit` mesh axis type is allowed. "
                         f"Got spmd_axis_name={spmd} and arrays sharded on explicit_mesh_axis={spec}")
    return tuple(spec) if spec else (spmd or ())


def _same(vals) -> bool:
    first = vals[0]
    for v in vals[1:]:
        if v is first:
            continue
        a = first.storage if isinstance(first, LocalArray) else first
        b = v.storage if isinstance(v, LocalArray) else v
        if is_abstract(a) or is_abstract(b) or getattr(first, "is_abstract", False):
            continue
        try:
            if not np.array_equal(np.asarray(a), np.asarray(b)):
                return False
        except (TypeError, ValueError):
            return False
    return True


def _assemble(rows, out_axes, batch_axes, size):
    if size == 0:
        raise ValueError("[vmap] the mapped axis has size 0: there is no element to run the function on "
                         "(JAX traces it for the output shapes; shardlab runs it)")
    flat = [tree.flatten(r) for r in rows]
    out_def = flat[0][1]
    for leaves, d in flat[1:]:
        if d != out_def:
            raise ValueError(f"[vmap] the function returned {out_def} for element 0 but {d} for another; "
                             f"its output structure must not depend on the values")
    spec = _flatten_axes("vmap out_axes", rows[0], out_axes)
    paths = [p for p, _ in tree.flatten_with_path(rows[0])[0]]
    out = []
    for j in range(out_def.num_leaves):
        vals = [f[0][j] for f in flat]
        d = spec[j]
        if d is None:
            if not _same(vals):
                raise ValueError(f"at vmap out_axes{keystr(paths[j])}, got axis spec None but output was batched on axis 0")
            out.append(as_array(vals[0], "vmap"))
            continue
        rank = len(shape_of(vals[0])) + 1
        if not -rank <= d < rank:
            raise ValueError(f"axis {d} is out of bounds for array of dimension {rank}")
        out.append(stack(vals, d % rank, batch_axes, "vmap"))
    return out_def.unflatten(out)

