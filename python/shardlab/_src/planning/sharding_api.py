"""Resharding APIs of the global view, as JAX 0.10.2's: ``reshard``, ``auto_axes``,
``explicit_axes`` and ``lax.with_sharding_constraint``.

- ``reshard(xs, out_shardings)`` moves every array of a pytree to a sharding (one sharding for
  all, or a pytree prefix of them) with the planner's cheapest collectives (in the ledger).
- ``auto_axes(f, axes=..., out_sharding=...)`` runs ``f`` with ``axes`` (default: all) of the
  current mesh switched to ``Auto`` and reshards its outputs to ``out_sharding``;
  ``explicit_axes(f, axes=..., in_sharding=...)`` switches them to ``Explicit``, reshards the
  arguments to ``in_sharding`` and hands the outputs back on the outer mesh. Both work as
  decorators too. Inside, ``get_mesh()`` is the switched mesh and the arrays carry it. In Auto
  mode JAX's compiler is free to keep any physical layout; shardlab keeps the layout it has
  (no data moves on the switch) and, where an op needs an Auto-sharded dim whole, all-gathers it.
- ``with_sharding_constraint(x, shardings)``: when every axis of the context mesh is Explicit
  (or no mesh is set, as in JAX) it is an assertion (JAX's AssertionError on a mismatch);
  otherwise the spec may name only Auto axes and the array is resharded (in the ledger).

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> from shardlab.sharding import reshard, auto_axes
    >>> mesh = sl.make_mesh((2, 4), ("X", "Y"))
    >>> with sl.set_mesh(mesh):
    ...     x = sl.device_put(np.arange(16.0, dtype=np.float32).reshape(4, 4), P("X", "Y"))
    ...     y = reshard({"a": x, "b": [x]}, P(None, "X"))
    ...     z = auto_axes(lambda a: a[0], out_sharding=P("Y"))(x)
    >>> y["b"][0].sharding.spec, z.sharding.spec, np.asarray(z).tolist()
    (P(None, 'X'), P('Y',), [0.0, 1.0, 2.0, 3.0])
"""

from __future__ import annotations

import functools

import numpy as np

from ..arrays.sharded_array import ShardedArray, device_put
from ..core import tree
from ..core.context import CTX
from ..core.mesh import AxisType, Mesh, get_mesh, set_mesh
from ..core.sharding import NamedSharding, P
from ..ops import lax as lax_ops
from ..ops import numpy as jnp
from ..primitives.primitive import push_entry
from ..transforms.shard_map import flat_shard_map
from .global_common import axes_of, entry, spec_of
from .global_ops import _seen
from .global_ops import reshard as _plan_reshard


def _is_sharding_leaf(s) -> bool:
    return s is None or isinstance(s, (P, NamedSharding))


def _prefix(shardings, xs, what: str, op: str) -> list:
    try:
        return tree.broadcast_prefix(shardings, xs, _is_sharding_leaf, what)
    except (ValueError, TypeError):
        raise ValueError(f"[{op}] {op} {what} specification must be a tree prefix of the positional arguments "
                         f"tuple. In particular, {what} must either be a Sharding, a PartitionSpec, or a pytree "
                         f"of them with the structure of the arguments {tree.flatten(xs)[1]}") from None


class _Relabel:
    """Tape step: the same storage on a mesh with other axis types (auto_axes / explicit_axes);
    its transpose puts the cotangent back on the input's mesh."""

    name = "mesh axis types"

    @staticmethod
    def vjp(cts, ins, outs, mesh, *, sharding):
        ct = cts[0]
        if not isinstance(ct, ShardedArray):
            return [ct]
        return [_relabel(ct, sharding.mesh)]


class _ToReduced:
    """Tape step: a replicated value typed reduced along some axes (same storage); its
    cotangent comes back unreduced along them and is summed here (JAX's transpose of a
    reshard to reduced: the one AllReduce)."""

    name = "reshard to reduced"

    @staticmethod
    def vjp(cts, ins, outs, mesh, *, sharding):
        ct = cts[0]
        if not isinstance(ct, ShardedArray):
            return [ct]
        return [_reshard_one(ct, sharding)]


def _relabel(x: ShardedArray, mesh: Mesh) -> ShardedArray:
    return ShardedArray(x._storage, NamedSharding(mesh, x.sharding.spec), x.shape, x.unreduced)


def _on_mesh(x: ShardedArray, mesh: Mesh) -> ShardedArray:
    """``x`` on ``mesh`` when the two differ only in axis types (no data moves; a gradient
    flows through)."""
    m = x.sharding.mesh
    if m is mesh:
        return x
    if m.axis_names != mesh.axis_names or m.axis_sizes != mesh.axis_sizes:
        raise ValueError(f"[reshard] the array lives on {m!r} but the sharding is on {mesh!r}; device_put it "
                         f"onto that mesh first")
    out = _relabel(x, mesh)
    push_entry(_Relabel, {"sharding": x.sharding}, [x], [out], m)
    return out


def _resolve(s, x, op: str) -> NamedSharding:
    if s is None:
        raise ValueError(f"[{op}] Reshard should only be used with out_shardings which are non-None and have a "
                         f"non-empty mesh. Got sharding {s}.")
    if isinstance(s, NamedSharding):
        return s
    mesh = get_mesh()
    if mesh is None and isinstance(x, ShardedArray):
        mesh = x.sharding.mesh
    if mesh is None:
        raise ValueError(f"[{op}] a PartitionSpec {s} needs a mesh: call shardlab.set_mesh(mesh) or pass a "
                         f"NamedSharding")
    mesh = _under_abstract_mesh(mesh)
    auto = [a for a in s.mesh_axes() if a in mesh.axis_names and
            mesh.axis_types[mesh.axis_names.index(a)] != AxisType.Explicit]
    if auto and op == "reshard":
        a = auto[0]
        raise ValueError(f"[{op}] PartitionSpec passed to reshard cannot contain axis names that are of type Auto or "
                         f"Manual. Got PartitionSpec: {s} with axis name: {a} of type: "
                         f"{mesh.axis_types[mesh.axis_names.index(a)]}; pass a NamedSharding to reshard onto Auto "
                         f"axes")
    # a bare PartitionSpec is taken padded to the array's rank, as JAX's canonicalize_sharding
    return NamedSharding(mesh, s.padded(np.ndim(x)) if len(s) < np.ndim(x) else s)


def _under_abstract_mesh(mesh: Mesh) -> Mesh:
    """Inside ``use_abstract_mesh(am)``, as JAX: a PartitionSpec names am's axes, on the devices of
    `mesh` (row-major, as many) reshaped to am's axis sizes."""
    am = getattr(CTX, "abstract_mesh", None)
    if am is None or am.empty or (am.axis_names, am.axis_sizes, am.axis_types) == \
            (mesh.axis_names, mesh.axis_sizes, mesh.axis_types):
        return mesh
    if am.size != mesh.size:
        raise ValueError(f"use_abstract_mesh cannot change the size of the mesh. Got new mesh: {am} with "
                         f"size={am.size} and prev mesh: {mesh.abstract_mesh} with size={mesh.size}")
    if mesh.abstract:
        return am
    devices = np.asarray(mesh.devices).reshape(am.axis_sizes)
    return Mesh(devices, am.axis_names, am.axis_types, hardware=mesh.hardware)


def _reshard_one(x, s: NamedSharding, unreduced=()):
    if not isinstance(x, ShardedArray):
        return device_put(np.asarray(x) if not isinstance(x, (int, float, bool)) else x, s)
    m = x.sharding.mesh
    if (m.axis_names, m.axis_sizes) != (s.mesh.axis_names, s.mesh.axis_sizes) and m.size == s.mesh.size and \
            getattr(CTX, "abstract_mesh", None) is not None and not x.unreduced and not unreduced:
        return device_put(x, s)  # onto use_abstract_mesh's mesh: the same devices under other axes
    x = _on_mesh(x, s.mesh)
    if s.spec.unreduced - x.unreduced:
        return _to_unreduced(x, s)
    if s.spec.reduced:  # reduced axes are a type on a replicated layout: move, then take the type
        moved = _reshard_one(x, NamedSharding(s.mesh, P(*s.spec)), unreduced)
        out = ShardedArray(moved._storage, NamedSharding(s.mesh, s.spec.padded(moved.ndim)), moved.shape,
                           moved.unreduced)
        push_entry(_ToReduced, {"sharding": moved.sharding}, [moved], [out], s.mesh)
        return _seen(moved, out)
    if x.sharding.spec == s.spec and not x.unreduced and not unreduced:
        return x
    return _plan_reshard(x, s, unreduced=unreduced)


def _to_unreduced(x: ShardedArray, s: NamedSharding) -> ShardedArray:
    """`x` resharded to ``s``, whose spec makes some axes unreduced that `x` is not, as JAX does
    it: each device keeps the part of the value it holds and zeros elsewhere, so the partial sums
    along those axes add up to the value (a replicated value sits on the axis's first device).
    No data moves: a shard along such an axis is written in place into a zero array of the
    target's shape. Differentiable (it runs in ``shard_map``)."""
    mesh = s.mesh
    new_u = s.spec.unreduced - x.unreduced
    want = [axes_of(e) for e in s.spec.normalized(x.ndim)]
    have = [axes_of(e) for e in x.sharding.spec.normalized(x.ndim)]
    if any(tuple(a for a in h if a not in new_u) != w or h[:len(w)] != w for h, w in zip(have, want)):
        # the layout differs from the target other than by new-unreduced axes after the target's
        # own: move to the target's layout first (recorded), then cast
        x = _reshard_one(x, NamedSharding(mesh, P(*[entry(w) for w in want], unreduced=x.unreduced)))
        have = want
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))

    def body(v):
        for d, (h, w) in enumerate(zip(have, want)):
            extra = [a for a in h if a not in w]  # new unreduced axes that shard this dim: pad in place
            if extra:
                n = int(np.prod([sizes[a] for a in extra]))
                idx = 0
                for a in extra:
                    idx = idx * sizes[a] + lax_ops.axis_index(a)
                shape = list(v.shape)
                shape[d] *= n
                v = lax_ops.dynamic_update_slice_in_dim(jnp.zeros(shape, v.dtype), v, idx * v.shape[d], axis=d)
        for a in sorted(new_u - {a for h in have for a in h}, key=mesh.axis_names.index):
            v = jnp.where(lax_ops.axis_index(a) == 0, v, jnp.zeros((), v.dtype))
        return v

    out_spec = P(*[entry(w) for w in want], unreduced=s.spec.unreduced)
    return flat_shard_map(body, mesh=mesh, in_specs=(x.sharding.spec,), out_specs=out_spec,
                     check_vma=False)(x)


def reshard(xs, out_shardings, *, unreduced=()):
    """Every array of the pytree ``xs`` resharded to ``out_shardings`` (a sharding for all of
    them, or a pytree prefix of ``xs``), as ``jax.sharding.reshard``.

    A PartitionSpec is taken on the current mesh (``set_mesh``), or on the array's own mesh
    when none is set. The moves are the planner's cheapest collectives (see
    ``shardlab.plan_reshard``), recorded in the ledger and differentiable.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> from shardlab.sharding import reshard
        >>> mesh = sl.make_mesh((4,), ("X",))
        >>> a = sl.device_put(np.arange(8.0), sl.NamedSharding(mesh, P("X")))
        >>> with sl.Ledger() as ledger:
        ...     b, c = reshard((a, a), P())
        >>> b.sharding.spec, [e["op"] for e in ledger.events]  # a bare spec is padded to the rank, as JAX
        (P(None,), ['all_gather', 'all_gather'])
    """
    leaves, treedef = tree.flatten(xs)
    for s in tree.flatten(out_shardings, _is_sharding_leaf)[0]:
        if isinstance(s, str):  # JAX's TypeError; a bare axis name is a common slip
            raise TypeError(f"[reshard] the target sharding must be a NamedSharding or a PartitionSpec, got {s!r}; "
                            f"for one axis write P({s!r}) (`out_sharding` argument of reshard only supports "
                            f"instances of `NamedSharding` or `PartitionSpec`)")
    shardings = _prefix(out_shardings, xs, "out_shardings", "reshard")
    out = []
    for x, s in zip(leaves, shardings):
        want = _resolve(s, x, "reshard")
        out.append(_spelled(_reshard_one(x, want, unreduced), want))
    return tree.unflatten(treedef, out)


def _spelled(y, want: NamedSharding):
    """`y` with its sharding spelled as the user asked (``P('X', None)`` stays so, where the
    planner writes ``P('X',)``): the same layout and storage, as JAX keeps the requested spec."""
    if not isinstance(y, ShardedArray) or y.sharding.spec == want.spec or y.unreduced != want.spec.unreduced or \
            y.sharding.mesh != want.mesh or not y.sharding.is_equivalent_to(want, y.ndim):
        return y
    out = ShardedArray(y._storage, NamedSharding(y.sharding.mesh, want.spec, memory_kind=y.sharding.memory_kind,
                                                 _check_axis_types=False), y.shape, y.unreduced)
    push_entry(_Relabel, {"sharding": y.sharding}, [y], [out], y.sharding.mesh)
    return _seen(y, out)


# -- auto_axes / explicit_axes ------------------------------------------------------------------------
def _with_types(mesh: Mesh, names: tuple, axis_type: AxisType) -> Mesh:
    update = getattr(mesh, "update_axis_types", None)
    if update is not None:
        return update({a: axis_type for a in names})
    types = tuple(axis_type if n in names else t for n, t in zip(mesh.axis_names, mesh.axis_types))
    return Mesh(mesh.devices, mesh.axis_names, types, hardware=mesh.hardware, physical_axes=mesh.physical_axes)


def _new_mesh(axes, axis_type: AxisType, name: str, shardings=None):
    """(the mesh now, the mesh with ``axes`` switched, the axes), as JAX's ``_get_new_mesh``."""
    cur = get_mesh()
    leaves = [s for s in tree.flatten(shardings, _is_sharding_leaf)[0] if isinstance(s, NamedSharding)] \
        if shardings is not None else []
    smesh = None
    for s in leaves:
        if smesh is not None and (smesh.axis_names, smesh.axis_sizes) != (s.mesh.axis_names, s.mesh.axis_sizes):
            raise ValueError(f"[{name}] Shardings passed to {name} should have the same mesh. Got one mesh "
                             f"{smesh!r} and another {s.mesh!r}")
        smesh = smesh or s.mesh
    if smesh is None and cur is None:
        return None
    if smesh is not None and cur is not None and \
            (smesh.axis_names, smesh.axis_sizes) != (cur.axis_names, cur.axis_sizes):
        raise ValueError(f"[{name}] Context mesh {cur!r} must match the mesh passed to shardings {smesh!r}. "
                         f"Recommended approach is to use the `shardlab.set_mesh` context manager.")
    mesh = cur if cur is not None else smesh
    names = mesh.axis_names if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    for a in names:
        if a not in mesh.axis_names:
            raise ValueError(f"[{name}] axis {a!r} is not an axis of the mesh {mesh.axis_names}")
        if dict(zip(mesh.axis_names, mesh.axis_types))[a] == AxisType.Manual:
            raise NotImplementedError(f"[{name}] Going from `Manual` AxisType to `Auto` or `Explicit` AxisType is "
                                      f"not allowed (axis {a!r}).")
    return mesh, _with_types(mesh, names, axis_type), names


def _map_arrays(fn, xs):
    leaves, treedef = tree.flatten(xs)
    return tree.unflatten(treedef, [fn(v) if isinstance(v, ShardedArray) else v for v in leaves])


def _bind_specs(shardings, mesh: Mesh):
    """PartitionSpecs of a sharding pytree made NamedShardings on ``mesh``."""
    leaves, treedef = tree.flatten(shardings, _is_sharding_leaf)
    return tree.unflatten(treedef, [NamedSharding(mesh, s) if isinstance(s, P) else s for s in leaves])


def auto_axes(f=None, /, *, axes=None, out_sharding=None):
    """Runs ``f`` with ``axes`` (default: every axis) of the current mesh ``Auto``, as
    ``jax.sharding.auto_axes``; the outputs are resharded to ``out_sharding`` (given here or as
    a keyword of the call).

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> from shardlab.sharding import auto_axes
        >>> mesh = sl.make_mesh((2, 4), ("X", "Y"))
        >>> x = sl.device_put(np.ones((8, 4), np.float32), sl.NamedSharding(mesh, P("X", "Y")))
        >>> @auto_axes(out_sharding=P("X"))
        ... def first_half(a):
        ...     return a[:4]  # slices the X-sharded dim: refused in Explicit mode, fine in Auto
        >>> with sl.set_mesh(mesh):
        ...     first_half(x).sharding.spec
        P('X',)
    """
    if f is None:
        return lambda g: _auto_axes(g, axes, out_sharding)
    return _auto_axes(f, axes, out_sharding)


def _auto_axes(fun, axes, out_sharding):
    @functools.wraps(fun)
    def decorator(*args, **kwargs):
        if out_sharding is None:
            if "out_sharding" not in kwargs:
                raise TypeError("Missing required keyword argument: 'out_sharding'")
            out_s = kwargs.pop("out_sharding")
        else:
            out_s = out_sharding
        info = _new_mesh(axes, AxisType.Auto, "auto_axes", shardings=out_s)
        if info is None:
            return fun(*args, **kwargs)
        prev, new, names = info
        if set(prev.auto_axes if hasattr(prev, "auto_axes") else
               [n for n, t in zip(prev.axis_names, prev.axis_types) if t == AxisType.Auto]) == set(names):
            return fun(*args, **kwargs)
        with set_mesh(new):
            args = _map_arrays(lambda a: _on_mesh(a, new), args)
            out = fun(*args, **kwargs)
        return reshard(out, _bind_specs(out_s, prev))

    return decorator


def explicit_axes(f=None, /, *, axes=None, in_sharding=None):
    """Runs ``f`` with ``axes`` (default: every axis) of the current mesh ``Explicit``, its
    arguments resharded to ``in_sharding`` (given here or as a keyword of the call), as
    ``jax.sharding.explicit_axes``. The outputs come back on the outer mesh as they are laid out.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> from shardlab.sharding import AxisType, explicit_axes
        >>> mesh = sl.make_mesh((2, 4), ("X", "Y"), (AxisType.Auto, AxisType.Auto))
        >>> with sl.set_mesh(mesh):
        ...     out = explicit_axes(lambda a: a.sum(axis=0), in_sharding=P("X", "Y"))(np.ones((8, 4), np.float32))
        >>> out.sharding.spec, out.sharding.mesh.axis_types
        (P('Y',), (Auto, Auto))
    """
    if f is None:
        return lambda g: _explicit_axes(g, axes, in_sharding)
    return _explicit_axes(f, axes, in_sharding)


def _explicit_axes(fun, axes, in_sharding):
    @functools.wraps(fun)
    def decorator(*args, **kwargs):
        if in_sharding is None:
            if "in_sharding" not in kwargs:
                raise TypeError("Missing required keyword argument: 'in_sharding'")
            in_s = kwargs.pop("in_sharding")
        else:
            in_s = in_sharding
        info = _new_mesh(axes, AxisType.Explicit, "explicit_axes")
        if info is None:
            raise ValueError("[explicit_axes] Context mesh cannot be empty. Please use `shardlab.set_mesh` API to "
                             "enter into a mesh context when using `explicit_axes` API.")
        prev, new, _ = info
        with set_mesh(new):
            args = reshard(args, _bind_specs(in_s, new))
            out = fun(*args, **kwargs)
        return _map_arrays(lambda a: _on_mesh(a, prev), out)

    return decorator


# -- with_sharding_constraint -------------------------------------------------------------------------
def _typed_spec(x: ShardedArray) -> list:
    """The spec JAX's type shows: only Explicit axes (Auto ones are the compiler's business)."""
    types = dict(zip(x.sharding.mesh.axis_names, x.sharding.mesh.axis_types))
    return [entry([a for a in axes_of(e) if types[a] == AxisType.Explicit]) for e in spec_of(x)]


def _pspec(entries) -> P:
    entries = list(entries)
    return P(*entries)


def with_sharding_constraint(x, shardings):
    """Constrains the sharding of every array of the pytree ``x``, as
    ``jax.lax.with_sharding_constraint``.

    With every axis of the context mesh Explicit, or no mesh set (as in JAX), it asserts that
    each array already has that sharding (JAX's AssertionError, which points at ``reshard``).
    Otherwise each spec may name only Auto axes (JAX's ValueError) and the array is resharded
    to it, with the collectives in the ledger. ``P.UNCONSTRAINED`` keeps a dim's sharding.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> from shardlab.sharding import AxisType
        >>> mesh = sl.make_mesh((2, 4), ("X", "Y"), (AxisType.Auto, AxisType.Auto))
        >>> x = sl.device_put(np.ones((8, 8), np.float32), sl.NamedSharding(mesh, P("X")))
        >>> with sl.set_mesh(mesh):
        ...     sl.lax.with_sharding_constraint(x, P(None, "Y")).sharding.spec
        P(None, 'Y')
    """
    leaves, treedef = tree.flatten(x)
    shardings_flat = _prefix(shardings, x, "shardings", "with_sharding_constraint")
    ctx = get_mesh()
    out = []
    for v, s in zip(leaves, shardings_flat):
        if s is None:
            raise ValueError(f"[with_sharding_constraint] One of with_sharding_constraint arguments got sharding "
                             f"{s} which is not allowed. Please only pass `jax.sharding.Sharding` instances.")
        spec = s.spec if isinstance(s, NamedSharding) else s
        if not isinstance(s, NamedSharding) and ctx is None:
            raise RuntimeError(f"[with_sharding_constraint] with_sharding_constraint requires a non-empty mesh in "
                               f"context if you are passing `PartitionSpec`s to shardings (got {spec}). You can "
                               f"define a context mesh via `shardlab.set_mesh(mesh)`, or pass a NamedSharding")
        mesh = s.mesh if isinstance(s, NamedSharding) else ctx
        ndim = np.ndim(v) if not isinstance(v, ShardedArray) else v.ndim
        if len(spec) > ndim:
            raise ValueError(f"[with_sharding_constraint] sharding {spec} is longer than the rank {ndim} of the "
                             f"argument of shape {np.shape(v)}")
        user = list(spec) + [None] * (ndim - len(spec))
        # JAX asserts only under a context mesh whose axes are all Explicit; with no context mesh
        # the spec must name Auto axes (and an Explicit-sharded array asks for reshard)
        explicit_ctx = ctx is not None and all(t == AxisType.Explicit for t in ctx.axis_types)
        unconstrained = [e is P.UNCONSTRAINED for e in user]
        if explicit_ctx:
            if any(unconstrained):
                types = ctx.axis_types
                raise ValueError(f"[with_sharding_constraint] {spec} cannot contain `P.UNCONSTRAINED` when no mesh "
                                 f"axis_types are `Auto`. Got mesh axis_types: {tuple(types)}")
            if not isinstance(v, ShardedArray):
                v = device_put(np.asarray(v), NamedSharding(mesh, P()))
            have = _typed_spec(v)
            want = [entry(axes_of(e)) for e in user]
            if have != want:
                raise AssertionError(
                    "`with_sharding_constraint` acts as an assert when all axes of mesh are of type `Explicit`. "
                    f"The array sharding: {_pspec(have)} did not match the sharding provided: {_pspec(want)}. "
                    "Please use `jax.sharding.reshard` (shardlab.sharding.reshard) to shard your input to the "
                    "sharding you want.")
            out.append(v)
            continue
        types = dict(zip(mesh.axis_names, mesh.axis_types))
        named = [a for e in user if e is not P.UNCONSTRAINED for a in axes_of(e)]
        if any(types.get(a) != AxisType.Auto for a in named):
            raise ValueError(f"[with_sharding_constraint] The spec of NamedSharding passed to "
                             f"with_sharding_constraint can only refer to Auto axes of the mesh. Got spec={spec} and "
                             f"mesh={mesh!r}. You probably meant to use `reshard` API?")
        current = spec_of(v) if isinstance(v, ShardedArray) else [None] * ndim
        # the constraint is on Auto axes only: a dim's Explicit axes are its type, and stay (JAX)
        explicit = {a for a, t in types.items() if t == AxisType.Explicit}
        target = [current[d] if unconstrained[d] else
                  entry(tuple(a for a in axes_of(current[d]) if a in explicit) + axes_of(user[d]))
                  for d in range(ndim)]
        out.append(_reshard_one(v, NamedSharding(mesh, P(*target))))
    return tree.unflatten(treedef, out)
