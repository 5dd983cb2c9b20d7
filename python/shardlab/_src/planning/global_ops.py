"""Global-view ops: einsum, matmul and reshard on ShardedArrays, run from a Plan.

Each op plans with ``shardlab.planner`` and then runs the plan's steps inside one
``shard_map``: collectives are ``shardlab.lax`` calls and the contraction is a local
``shardlab.numpy.einsum``, so the ledger records what really moved. A plan's predicted
``bytes_sent`` equals the ledger's.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((2, 2), ("X", "Y"))
    >>> a = sl.device_put(np.ones((4, 8), np.float32), sl.NamedSharding(mesh, P(None, "X")))
    >>> b = sl.device_put(np.ones((8, 2), np.float32), sl.NamedSharding(mesh, P("X", None)))
    >>> c = sl.einsum("ij,jk->ik", a, b, out_sharding=P())
    >>> np.asarray(c)[0].tolist(), c.sharding.spec
    ([8.0, 8.0], P())
"""

from __future__ import annotations

import numpy as np

from ..arrays.local_array import LocalArray, lift
from ..arrays.sharded_array import ShardedArray, device_put, register_global_ufunc
from ..core import dtypes as _dt
from ..core.context import CTX, named_scope, shard_map_frame
from ..core.einsum_spec import parse
from ..core.errors import ShardingTypeError
from ..core.mesh import UNIT_MESH, get_mesh
from ..core.sharding import NamedSharding, P
from ..ledger.event import Event
from ..ledger.ledger import record
from ..ops import lax
from ..ops import numpy as jnp
from ..primitives import elementwise as ew
from ..primitives.primitive import bind
from ..transforms import jit as _jit
from ..transforms.program import Aval, Var
from ..transforms.shard_map import flat_shard_map
from . import sharding_rules as R
from .plan import Plan
from .planner import plan_einsum, plan_reshard


def _dynamic_slice(v: LocalArray, axis: str, dim: int) -> LocalArray:
    """Device i along ``axis`` keeps chunk i of local dim ``dim``: no data moves."""
    size = v.shape[dim] // lax.axis_size(axis)
    return lax.dynamic_slice_in_dim(v, lax.axis_index(axis) * size, size, axis=dim)


def _apply(step, env: dict, mesh, preferred_element_type=None) -> LocalArray:
    x = [env[t.name] for t in step.inputs]
    if step.op == "einsum":
        sub = ",".join(t.labels for t in step.inputs) + "->" + step.output.labels
        return lift(jnp.einsum(sub, *x, preferred_element_type=preferred_element_type), mesh)
    v, axes = x[0], step.axes if len(step.axes) > 1 else step.axes[0]
    if step.op == "all_gather":
        return lax.all_gather(v, axes, axis=step.dim, tiled=True)
    if step.op == "psum":
        return lax.psum(v, axes)
    if step.op == "psum_scatter":
        return lax.psum_scatter(v, axes, scatter_dimension=step.dim, tiled=True)
    if step.op == "all_to_all":
        return lax.all_to_all(v, axes, step.dim2, step.dim, tiled=True)
    if step.op == "dynamic_slice":
        return _dynamic_slice(v, step.axes[0], step.dim)
    raise ValueError(f"[run_plan] unknown step {step.op!r}")


def _run_direct(plan: Plan, arrays, preferred_element_type, sharding=None):
    """The plan's steps on the arrays' own storages, with the mesh's axis names bound but
    without shard_map's argument handling (the dispatch path of jnp.einsum on global arrays).
    None when shard_map's path is needed: a gradient tape or a jit trace is recording, an
    operand is abstract or not laid out as the plan's input."""
    mesh = plan.mesh
    if CTX.tapes or CTX.recorders or mesh.abstract:
        return None
    env = {}
    for t, a in zip(plan.inputs, arrays):
        if type(a) is not ShardedArray or a.is_abstract or a.sharding.mesh != mesh or \
                _dims(a) != tuple(t.layout.dims) or a.unreduced != t.layout.unreduced:
            return None
        env[t.name] = LocalArray(a._storage, mesh)
    lay = plan.output.layout
    with shard_map_frame(mesh):
        for step in plan.steps:
            env[step.output.name] = _apply(step, env, mesh, preferred_element_type)
    storage = env[plan.output.name].storage
    used = {a for axes in lay.dims for a in axes} | set(lay.unreduced)
    want = tuple(mesh.shape[a] if a in used else 1 for a in mesh.axis_names)
    if tuple(storage.shape[:mesh.ndim]) != want:
        if any(h not in (1, w) for h, w in zip(storage.shape[:mesh.ndim], want)):
            return None  # varies along an axis the result is replicated on: shard_map's checks say why
        storage = np.broadcast_to(storage, want + tuple(storage.shape[mesh.ndim:]))
    return ShardedArray(storage, sharding or NamedSharding(mesh, lay.spec()), plan.output.shape,
                        frozenset(lay.unreduced))


def run_plan(plan: Plan, *arrays, preferred_element_type=None, sharding=None) -> ShardedArray:
    """Runs ``plan`` on ``arrays`` (laid out as the plan's inputs) inside one shard_map.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((2,), ("X",))
        >>> a = sl.device_put(np.eye(4, dtype=np.float32), sl.NamedSharding(mesh, P("X")))
        >>> plan = sl.plan_einsum("ij,jk->ik", a, a, out_sharding=P())
        >>> np.allclose(np.asarray(sl.run_plan(plan, a, a)), np.eye(4))
        True

    ``sharding``: the result's NamedSharding as the caller spells it (JAX's ops give one spec
    entry per dim: ``P('X', None)``, not ``P('X')``); it must lay out as the plan's output.
    The result is the value shard_map (or the op) returned, so a jit trace records it.
    """
    mesh = plan.mesh
    if len(arrays) != len(plan.inputs):
        raise ValueError(f"[run_plan] the plan takes {len(plan.inputs)} operands, got {len(arrays)}")
    lay = plan.output.layout
    if sharding is not None and tuple(sharding.spec.normalized(len(plan.output.shape))) != tuple(lay.dims):
        raise ValueError(f"[run_plan] sharding {sharding.spec!r} is not the plan's output layout {lay.spec()!r}")
    direct = _run_direct(plan, arrays, preferred_element_type, sharding)
    if direct is not None:
        return direct
    in_specs = tuple(t.layout.spec() for t in plan.inputs)
    spec = sharding.spec if sharding is not None else lay.spec()
    u = tuple(a for a in mesh.axis_names if a in lay.unreduced)
    explicit_u = bool(u) and not (set(u) & R.auto_axes(mesh))
    if explicit_u:  # partial sums leave shard_map as JAX's P(unreduced={...}): the value shard_map returns
        out_spec = spec.update(unreduced=frozenset(u))
    else:
        out_spec = P(u, *spec) if u else spec

    def body(*local):
        env = {t.name: lift(v, mesh) for t, v in zip(plan.inputs, local)}
        for step in plan.steps:
            env[step.output.name] = _apply(step, env, mesh, preferred_element_type)
        r = env[plan.output.name]
        # Partial sums on Auto axes (which JAX's type cannot say) leave shard_map through a
        # leading dim of the axis size, as real data.
        return jnp.expand_dims(r, 0) if u and not explicit_u else r

    res = flat_shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_spec)(*arrays)
    if not u or explicit_u:
        return res  # laid out as out_spec already (and known to a gradient tape and a jit trace)
    out = ShardedArray(res._storage.squeeze(mesh.ndim), NamedSharding(mesh, spec), plan.output.shape, frozenset(u))
    return _seen(res, out)


def _seen(src, out):
    """``out`` (a new wrapper of ``src``'s buffer: the same per-device values, a global type)
    told to a running jit trace as the value ``src`` is, so the program's result is the op's
    and not an unknown host value."""
    for r in CTX.recorders:
        var = r.read(src)
        if isinstance(var, Var):
            r.define(out, Var(Aval.of(out))).alias = var
    return out


def _as_sharded(x, mesh) -> ShardedArray:
    if isinstance(x, ShardedArray):
        return x
    return device_put(np.asarray(x), NamedSharding(mesh, P()))


def einsum(subscripts: str, *operands, out_sharding=None, unreduced=(), overlap: str = "max"):
    """``numpy.einsum`` on ShardedArrays, with the communication chosen by the planner.

    Args:
        subscripts: einsum subscripts (explicit or implicit; '...' expands as in numpy).
        *operands: ShardedArrays on one mesh (plain arrays are replicated onto it).
        out_sharding: wanted output NamedSharding or PartitionSpec (None: the cheapest layout
            the rules give; see docs/planner.md).
        unreduced: mesh axes the output may stay unreduced along ({U_X}).

    Returns:
        A ShardedArray with the wanted sharding (and ``.unreduced``).

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((2,), ("X",))
        >>> a = sl.device_put(np.ones((2, 4), np.float32), sl.NamedSharding(mesh, P(None, "X")))
        >>> c = sl.einsum("ij,kj->ik", a, a, unreduced=("X",))
        >>> sorted(c.unreduced), np.asarray(c).tolist()
        (['X'], [[4.0, 4.0], [4.0, 4.0]])
    """
    meshes = [x.sharding.mesh for x in operands if isinstance(x, ShardedArray)]
    if not meshes:
        raise TypeError("[einsum] pass at least one ShardedArray (use shardlab.device_put)")
    arrays = [_as_sharded(x, meshes[0]) for x in operands]
    plan = plan_einsum(subscripts, *arrays, out_sharding=out_sharding, unreduced=unreduced, overlap=overlap)
    return run_plan(plan, *arrays)


def _matmul_subscripts(sa: tuple, sb: tuple, op: str) -> str:
    """The einsum subscripts of ``a @ b`` under numpy's rank rules: 1-D operands, batch dims
    aligned from the right (the extra leading ones belong to one side; size-1 broadcasting of a
    batch dim is refused)."""
    ra, rb = len(sa), len(sb)
    if ra == 0 or rb == 0:
        raise ValueError(f"[{op}] operands must have rank >= 1, got shapes {sa} and {sb}; use * for scalars")
    letters = "abcdefghlmnopqrstuvw"
    if ra == 1 and rb == 1:
        return "k,k->"
    if ra == 1:
        batch = letters[: rb - 2]
        return f"k,{batch}kn->{batch}n"
    if rb == 1:
        batch = letters[: ra - 2]
        return f"{batch}mk,k->{batch}m"
    common, extra = letters[: min(ra, rb) - 2], letters[min(ra, rb) - 2: max(ra, rb) - 2]
    ba, bb = (extra + common, common) if ra >= rb else (common, extra + common)
    for x, y in zip(sa[ra - 2 - len(common): ra - 2], sb[rb - 2 - len(common): rb - 2]):
        if x != y:
            raise ValueError(f"[{op}] batch dims of {sa} and {sb} differ ({x} vs {y}); broadcasting a "
                             f"size-1 batch dim of a global array is not supported: use einsum")
    return f"{ba}ij,{bb}jk->{extra + common}ik"


def matmul(a, b, out_sharding=None, *, unreduced=()):
    """``a @ b`` with numpy's rank rules (1-D operands, batch dims aligned from the right), as ``einsum``.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((2,), ("X",))
        >>> a = sl.device_put(np.ones((4, 4), np.float32), sl.NamedSharding(mesh, P("X")))
        >>> sl.matmul(a, a, out_sharding=P("X")).sharding.spec
        P('X',)
    """
    sub = _matmul_subscripts(np.shape(a), np.shape(b), "matmul")
    return einsum(sub, a, b, out_sharding=out_sharding, unreduced=unreduced)


def reshard(x: ShardedArray, sharding, *, unreduced=()) -> ShardedArray:
    """Moves ``x`` to ``sharding`` with the cheapest collectives.

    AllGather drops a subscript, AllToAll moves one to another dim, dynamic slicing adds one
    (free), AllReduce / ReduceScatter clear unreduced axes. ``unreduced`` names axes the
    result may stay unreduced along.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((4,), ("X",))
        >>> a = sl.device_put(np.arange(16.0).reshape(4, 4), sl.NamedSharding(mesh, P("X")))
        >>> b = sl.reshard(a, P(None, "X"))
        >>> b.sharding.spec, bool((np.asarray(b) == np.asarray(a)).all())
        (P(None, 'X'), True)
    """
    if not isinstance(x, ShardedArray):
        raise TypeError(f"[reshard] x must be a ShardedArray, got {type(x).__name__}")
    return run_plan(plan_reshard(x, sharding, unreduced=unreduced), x)


# -- jax.numpy on global arrays: the output sharding from sharding_rules, then the shards ------------
_PY_SCALARS = (bool, int, float, complex)
_SHARDINGS: dict = {}  # (mesh, dims) -> NamedSharding: one per distinct output type
_PLANS: dict = {}      # (subscripts, operand types, mesh, out dims) -> Plan
_RULES_SEEN: dict = {}  # (op, operand types) -> (output dims, output shape): the rule runs once per type


def _sharding(mesh, dims) -> NamedSharding:
    key = (id(mesh), dims)  # by identity: equal meshes may carry different hardware
    sh = _SHARDINGS.get(key)
    if sh is None:
        if len(_SHARDINGS) > 4096:
            _SHARDINGS.clear()
        sh = _SHARDINGS[key] = NamedSharding(mesh, R.to_pspec(dims))
    return sh


_DIMS: dict = {}  # (spec, rank) -> per-dim axes


def _dims(x: ShardedArray) -> tuple:
    spec = x.sharding.spec
    key = (spec, x.ndim)
    d = _DIMS.get(key)
    if d is None:
        if len(_DIMS) > 4096:
            _DIMS.clear()
        d = _DIMS[key] = tuple(spec.normalized(x.ndim))
    return d


def _unreduced_rule(name: str, inputs) -> frozenset:
    """JAX's unreduced rules of elementwise ops (``_add_ur_rule``): ``add`` / ``sub`` of operands
    unreduced along the same axes stay unreduced (each device adds its partial sums: no
    communication); one unreduced operand, or any other two-operand op on one, would need an
    implicit AllReduce and raises ShardingTypeError; a one-operand op (cos, exp) has no rule
    (NotImplementedError, as JAX's)."""
    us = [x.unreduced if isinstance(x, ShardedArray) else frozenset() for x in inputs]
    if not any(us):
        return frozenset()
    prim = R.LAX_NAMES.get(name, name)
    shown = ", ".join(R.type_str(x.shape, x.dtype, _dims(x), sorted(x.unreduced)) if isinstance(x, ShardedArray)
                      else type(x).__name__ for x in inputs)
    if len(inputs) == 1:  # JAX has no unreduced rule for one-operand ops (cos, exp, ...)
        raise NotImplementedError(f"[{name}] unreduced rule for {prim} is not implemented (as in JAX): {shown} holds "
                                  f"partial sums. Reduce it first with shardlab.reshard(x, x.sharding)")
    if name not in ("add", "subtract") or len(inputs) != 2:
        raise ShardingTypeError(f"[{name}] {prim} cannot take unreduced operands ({shown}): it would need an implicit "
                                f"AllReduce. Reduce them first with shardlab.reshard(x, x.sharding)")
    a, b = us
    if a and b and a != b:
        raise ShardingTypeError(f"[{name}] lhs and rhs to `{prim}` must be unreduced along the same mesh axes. Got "
                                f"lhs={set(a)}, rhs={set(b)} ({shown}); reduce one with shardlab.reshard first")
    if not (a and b):
        which, other = ("lhs", "rhs") if a else ("rhs", "lhs")
        raise ShardingTypeError(f"[{name}] {which} is unreduced while {other} is not. `{prim}` operation does not "
                                f"allow this because there will be implicit communication. Please reduce {which} via "
                                f"`reshard` before calling `{prim}` ({shown})")
    return a


def _reduced_rule(name: str, inputs) -> frozenset:
    """JAX's reduced rules of elementwise ops (``default_unop_reduced_rule``,
    ``default_nary_reduced_rule``): the result is reduced along the axes its operands are; every
    reduced operand must be reduced along the same axes, and an array operand that is replicated
    or sharded along those axes cannot meet one (ShardingTypeError: reshard it first). Host
    values (Python scalars, numpy arrays) take the reduced operand's type."""
    arrays = [x for x in inputs if isinstance(x, ShardedArray)]
    rs = {x.sharding.spec.reduced for x in arrays if x.sharding.spec.reduced}
    if not rs:
        return frozenset()
    in_context = get_mesh() is not None  # JAX checks replication against the context's mesh only
    prim = R.LAX_NAMES.get(name, name)
    if len(rs) > 1:
        raise ShardingTypeError(f"[{name}] All inputs should be reduced across the same mesh axes. Got specs: "
                                f"{[set(r) for r in rs]} (`{prim}`)")
    (red,) = rs
    for x in inputs:
        if not isinstance(x, ShardedArray):
            if in_context and np.ndim(x):
                raise ShardingTypeError(
                    f"[{name}] Inputs cannot be replicated on the same axes that another input is reduced on. Got "
                    f"input type: {R.type_str(np.shape(x), np.result_type(x), ((),) * np.ndim(x))} and reduced "
                    f"spec: {set(red)}")
            continue
        if x.sharding.spec.reduced == red:
            continue
        used = {a for axes in _dims(x) for a in axes} | set(x.unreduced)
        if used & red:
            raise ShardingTypeError(
                f"[{name}] Inputs cannot be sharded/varying on the same axes that another input is reduced on. "
                f"Reshard the input which is reduced to be sharded on the mesh axes it is reduced on via "
                f"`shardlab.reshard(inp, P(...))`. Got input type: {R.type_str(x.shape, x.dtype, _dims(x))} and "
                f"reduced spec: {set(red)}")
        if x.ndim and in_context:
            raise ShardingTypeError(
                f"[{name}] Inputs cannot be replicated on the same axes that another input is reduced on. Got "
                f"input type: {R.type_str(x.shape, x.dtype, _dims(x))} and reduced spec: {set(red)}")
    return red


def _split_view(storage, k: int, mesh, op_dims: tuple, out_dims: tuple, shape: tuple):
    """`storage` (mesh dims, then local dims of an operand padded to the output's rank) seen in
    the output's layout: a dim the operand holds whole but the output shards over axes A is
    split into (|A|..., n/|A|) and the pieces moved to A's mesh dims. A view: no data moves
    (each device keeps its slice of a value it already holds, as JAX's local slicing)."""
    split = [d for d in range(len(shape)) if out_dims[d] and not op_dims[d] and shape[d] != 1]
    if not split:
        return storage
    names = mesh.axis_names
    new_shape, labels = [], []
    for i in range(k):
        new_shape.append(storage.shape[i])
        labels.append(("m", names[i]))
    for d in range(len(shape)):
        n = storage.shape[k + d]
        if d in split:
            rest = n
            for a in out_dims[d]:
                new_shape.append(mesh.shape[a])
                labels.append(("s", a))
                rest //= mesh.shape[a]
            new_shape.append(rest)
        else:
            new_shape.append(n)
        labels.append(("l", d))
    v = storage.reshape(new_shape)
    filled = {a for d in split for a in out_dims[d]}
    idx = tuple(0 if lab[0] == "m" and lab[1] in filled else slice(None) for lab in labels)
    v = v[idx]
    labels = [lab for lab in labels if not (lab[0] == "m" and lab[1] in filled)]
    order = [labels.index(("s", a) if a in filled else ("m", a)) for a in names] + \
        [labels.index(("l", d)) for d in range(len(shape))]
    return v.transpose(order)


def _operand_info(x, op: str):
    """(kind, Operand) of one elementwise argument: 'sharded', 'host', 'scalar' or 'tracked'."""
    if isinstance(x, ShardedArray):
        return "sharded", R.Operand(x.shape, x.dtype, _dims(x), x.sharding.mesh)
    if type(x) in _PY_SCALARS:
        return "scalar", None
    if isinstance(x, LocalArray):
        if x.mesh is not UNIT_MESH:
            raise TypeError(f"[{op}] mixes a per-device value (inside shard_map) with a global ShardedArray; "
                            f"pass the global array into the shard_map, or compute outside it")
        return "tracked", R.Operand(x.shape, x.dtype, ((),) * x.ndim)
    a = np.asarray(x)
    return "host", R.Operand(a.shape, a.dtype, ((),) * a.ndim)


def elementwise(ufunc, inputs, kwargs):
    """``ufunc`` on global arrays (ShardedArrays, host arrays, Python scalars), as JAX's explicit
    mode: the output sharding is ``sharding_rules.broadcast``'s, the dtype jax.numpy's (Python
    scalars weak), and each device computes its block from blocks it holds (no collective).
    ``@`` is a contraction (:func:`contract`)."""
    name = ufunc.__name__
    if ufunc is np.matmul:
        return contract_matmul(*inputs)
    if kwargs.get("out") is not None:
        raise TypeError(f"[{name}] ShardedArrays are immutable (as jax.Arrays); out= is not supported")
    kwargs = dict(kwargs)
    dtype = kwargs.pop("dtype", None)
    kwargs.pop("out", None)
    if kwargs:
        raise TypeError(f"[{name}] keyword arguments {sorted(kwargs)} are not supported on global arrays")
    prim = ew.PRIMS.get(name)
    if prim is None:
        return global_fallback(ufunc, name, inputs, {})
    unreduced = _unreduced_rule(name, inputs)
    reduced = _reduced_rule(name, inputs)
    infos = [_operand_info(x, name) for x in inputs]
    key = (name, tuple(infos))
    hit = _RULES_SEEN.get(key)
    if hit is None:
        ops = [o for _, o in infos if o is not None]
        out_dims = R.broadcast(name, ops)
        mesh = R.common_mesh(name, ops)
        r = len(out_dims)
        out_shape = R.broadcast_shape(name, [(1,) * (r - len(o.shape)) + tuple(o.shape) for o in ops])
        out_dims = _dedupe_auto(out_dims, mesh)
        if len(_RULES_SEEN) > 4096:
            _RULES_SEEN.clear()
        hit = _RULES_SEEN[key] = (out_dims, out_shape)
    out_dims, out_shape = hit
    # the operands' own mesh, not the cached one: meshes equal as JAX sees them may differ in the
    # hardware shardlab prices their collectives on
    mesh = next(x.sharding.mesh for x in inputs if isinstance(x, ShardedArray))
    r = len(out_dims)
    sharding = _result_sharding(mesh, out_dims, inputs)
    if reduced:
        sharding = NamedSharding(mesh, sharding.spec.padded(r).update(reduced=reduced),
                                 memory_kind=sharding.memory_kind, _check_axis_types=False)
    if R.auto_axes(mesh):
        inputs = [_fit(x, out_dims, name) if isinstance(x, ShardedArray) else x for x in inputs]
        infos = [_operand_info(x, name) for x in inputs]
    slow = bool(CTX.tapes) or mesh.abstract or any(k == "tracked" for k, _ in infos) or \
        any(isinstance(x, ShardedArray) and x.is_abstract for x in inputs)
    if slow:
        out = _elementwise_shard_map(ufunc, inputs, infos, out_dims, mesh,
                                     sharding.spec.update(unreduced=unreduced) if unreduced else sharding.spec)
    else:
        k = mesh.ndim
        args = []
        for x, (kind, o) in zip(inputs, infos):
            if kind == "scalar":
                args.append(x)
                continue
            pad = r - len(o.shape)
            shape = (1,) * pad + tuple(o.shape)
            dims = ((),) * pad + tuple(o.dims)
            st = x._storage if kind == "sharded" else np.asarray(x)
            if kind == "sharded":
                st = st.reshape(st.shape[:k] + shape[:pad] + st.shape[k:]) if pad else st
            else:
                st = st.reshape((1,) * k + shape)
            args.append(_split_view(st, k, mesh, dims, out_dims, shape))
        if CTX.recorders:  # a jit trace: operands it knows (a re-laid view is shard_map's to record)
            if any(kind != "scalar" and (kind != "sharded" or a is not x._storage)
                   for x, (kind, _), a in zip(inputs, infos, args)):
                return _maybe_astype(_elementwise_shard_map(ufunc, inputs, infos, out_dims, mesh, sharding.spec),
                                     dtype)
            args = [_seen(x, LocalArray(a, mesh)) if kind == "sharded" else a
                    for x, (kind, _), a in zip(inputs, infos, args)]
        res = bind(prim, args, mesh)
        out = _seen(res, ShardedArray(res.storage, sharding, out_shape, unreduced))
    return _maybe_astype(out, dtype)


def _maybe_astype(out, dtype):
    return out if dtype is None else astype(out, dtype)


def _result_sharding(mesh, dims: tuple, operands) -> NamedSharding:
    """A result's sharding spelled as JAX's. Explicit axes: the type's spec, one entry per dim
    (``P('X', None)``). On a mesh of Auto axes the layout is the compiler's choice, read back as
    JAX's pxla does (``_get_out_sharding_from_orig_sharding``): the first array operand's own
    sharding where it is equivalent (same rank), else the spec with trailing unsharded dims
    dropped (``P('X',)``, ``P()`` when replicated). ``P('X') != P('X', None)`` in JAX, so code
    comparing specs sees the difference."""
    auto = R.auto_axes(mesh)
    if not auto or len(auto) != len(mesh.axis_names):
        return _sharding(mesh, dims)
    first = next((x for x in operands if isinstance(x, ShardedArray)), None)
    if first is not None and first.ndim == len(dims) and not first.unreduced and _dims(first) == tuple(dims):
        return first.sharding
    d = list(dims)
    while d and not d[-1]:
        d.pop()
    return _sharding(mesh, tuple(d))


def _fit(x: ShardedArray, out_dims: tuple, op: str) -> ShardedArray:
    """``x`` with every sharding the output does not keep gathered away (only on Auto axes, where
    propagation chose to leave a conflicting dim unsharded: the AllGathers are in the ledger,
    labelled with the reason)."""
    r = len(out_dims)
    dims = _dims(x)
    mine = out_dims[r - len(dims):]
    keep = tuple(d if d == o else () for d, o in zip(dims, mine))
    if keep == dims:
        return x
    with named_scope(f"auto:{op}: operand {R.type_str(x.shape, x.dtype, dims)} gathered to "
                     f"{R.type_str(x.shape, x.dtype, keep)} (conflicting Auto shardings)"):
        return reshard(x, _sharding(x.sharding.mesh, keep))


def _elementwise_shard_map(ufunc, inputs, infos, out_dims, mesh, out_spec=None):
    """The same op inside one shard_map (differentiable, abstract-ready): each array operand
    enters with the output's sharding on the dims it holds whole."""
    r = len(out_dims)
    pos, specs = [], []
    for i, (kind, o) in enumerate(infos):
        if kind == "scalar":
            continue
        nd = len(o.shape)
        dims = out_dims[r - nd:]
        spec = R.to_pspec(tuple(d if s != 1 else () for d, s in zip(dims, o.shape)))
        u = inputs[i].unreduced if isinstance(inputs[i], ShardedArray) else frozenset()
        specs.append(spec.update(unreduced=u) if u else spec)  # partial sums enter as each device's part
        pos.append(i)

    def body(*local):
        args = list(inputs)
        for i, v in zip(pos, local):
            args[i] = v
        return ufunc(*args)

    return flat_shard_map(body, mesh=mesh, in_specs=tuple(specs), out_specs=out_spec or R.to_pspec(out_dims),
                     check_vma=False)(*[inputs[i] for i in pos])


def _dedupe_auto(dims: tuple, mesh) -> tuple:
    """On Auto axes propagation is free: an axis the rules would put on two dims stays on the
    first (JAX's eager propagation does the same; explicit axes raised in the rule already)."""
    auto = R.auto_axes(mesh)
    if not auto:
        return dims
    seen, out = set(), []
    for axes in dims:
        keep = tuple(a for a in axes if a not in seen or a not in auto)
        seen.update(keep)
        out.append(keep)
    return tuple(out)


def astype(x: ShardedArray, dtype) -> ShardedArray:
    """``x`` converted to ``dtype`` shard by shard (same sharding)."""
    dtype = _dt.canonicalize_dtype(dtype)
    if x.dtype == dtype:
        return x
    if CTX.tapes or x.is_abstract:
        spec = x.sharding.spec
        return flat_shard_map(lambda v: jnp.astype(v, dtype), mesh=x.sharding.mesh, in_specs=spec,
                         out_specs=spec)(x)
    arg = _seen(x, LocalArray(x._storage, x.sharding.mesh)) if CTX.recorders else x._storage
    out = bind(ew.CONVERT, [arg], x.sharding.mesh, dtype=dtype)
    return _seen(out, ShardedArray(out.storage, x.sharding, x.shape, x.unreduced))


# -- contractions -------------------------------------------------------------------------------------
def _as_global(x, mesh, dtype) -> ShardedArray:
    if not isinstance(x, ShardedArray):
        x = device_put(np.asarray(x), NamedSharding(mesh, P()))  # host data: replicated, as JAX's constants
    return astype(x, dtype)


def contract(op: str, subscripts: str, operands, *, out_sharding=None, preferred_element_type=None,
             prim: str = "dot_general", jnp_order: bool = True) -> ShardedArray:
    """A contraction (einsum, dot, matmul, tensordot, ...) on global arrays: the output sharding
    is ``out_sharding`` or JAX's rule (``sharding_rules.einsum``: batch and free dims keep their
    sharding, sharded contracting dims on both sides are ambiguous); then the planner runs it
    with the cheapest collectives (``plan_einsum`` + ``run_plan``), so the ledger records them."""
    meshes = [x.sharding.mesh for x in operands if isinstance(x, ShardedArray)]
    infos = [R.Operand(x.shape, x.dtype, _dims(x), x.sharding.mesh) if isinstance(x, ShardedArray) else
             R.Operand(np.shape(x), _dt.result_type(x), ((),) * np.ndim(x)) for x in operands]
    mesh = R.common_mesh(op, infos)
    if mesh is None:
        raise TypeError(f"[{op}] pass at least one ShardedArray")
    for x in operands:
        if isinstance(x, ShardedArray) and x.unreduced:
            raise ShardingTypeError(f"[{op}] lhs or rhs passed to dot_general cannot be unreduced. Got "
                                    f"{R.type_str(x.shape, x.dtype, _dims(x), sorted(x.unreduced))}; "
                                    f"reshard it first (shardlab.reshard(x, x.sharding))")
    terms, out_labels = parse(subscripts, [o.shape for o in infos], op)
    sizes = {c: s for t, o in zip(terms, infos) for c, s in zip(t, o.shape)}
    out_shape = tuple(sizes[c] for c in out_labels)
    dtype = _dt.result_type(*[o.dtype for o in infos])
    want = R.out_sharding(out_sharding, op, len(out_labels), out_shape, mesh)
    if want is None:
        dims = R.einsum(op, terms, out_labels, infos, jnp_order=jnp_order)
        dims = _dedupe_auto(dims, mesh)
        R.check_legal(op, infos, out_shape, dtype, dims, prim)
    else:
        dims = R.dims_of(want.spec, len(out_labels))
        out_u = frozenset(getattr(want.spec, "unreduced", None) or ())
        if out_u:  # JAX's _dot_general_unreduced_rule: the contracted axes, and only they
            contracted = [c for t in terms for c in t if c not in out_labels]
            specs = [tuple(o.dims[t.index(c)] for c in dict.fromkeys(contracted) if c in t)
                     for t, o in zip(terms, infos)]
            if len(set(specs)) != 1:
                raise ShardingTypeError(f"[{op}] lhs and rhs contracting dims should be sharded identically when "
                                        f"out_sharding provided to dot_general mentions unreduced_axes. Got "
                                        f"{', '.join(str(R.spec_tuple(sp)) for sp in specs)}")
            flat = frozenset(a for axes in specs[0] for a in axes)
            if out_u != flat:
                raise ShardingTypeError(f"[{op}] out_sharding's unreduced axes should be equal to the contracting "
                                        f"specs. Got unreduced axes={set(out_u)} and contracting "
                                        f"spec={R.spec_tuple(specs[0])}")
            arrays = [_as_global(x, mesh, dtype) for x in operands]
            plan = plan_einsum(",".join(terms) + "->" + out_labels, *arrays, out_sharding=R.to_pspec(dims),
                               unreduced=tuple(sorted(out_u)))
            return run_plan(plan, *arrays, preferred_element_type=preferred_element_type,
                            sharding=_sharding(mesh, dims))
    del meshes
    arrays = [_as_global(x, mesh, dtype) for x in operands]
    sub = ",".join(terms) + "->" + out_labels
    key = (sub, tuple((a.shape, a.dtype, _dims(a)) for a in arrays), mesh, dims)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) > 1024:
            _PLANS.clear()
        plan = _PLANS[key] = plan_einsum(sub, *arrays, out_sharding=R.to_pspec(dims))
    sharding = _result_sharding(mesh, dims, operands) if want is None else _sharding(mesh, dims)
    if want is None and R.auto_axes(mesh):
        # Auto axes: the layout is propagation's choice; the ledger says so on each event.
        with named_scope(f"auto:{op} -> {R.type_str(out_shape, dtype, dims)} (propagation's choice)"):
            return run_plan(plan, *arrays, preferred_element_type=preferred_element_type, sharding=sharding)
    return run_plan(plan, *arrays, preferred_element_type=preferred_element_type, sharding=sharding)


def contract_matmul(a, b, *, out_sharding=None, preferred_element_type=None, op: str = "matmul"):
    """``a @ b`` (numpy's rank rules) as :func:`contract`."""
    sub = _matmul_subscripts(np.shape(a), np.shape(b), op)
    return contract(op, sub, (a, b), out_sharding=out_sharding, preferred_element_type=preferred_element_type)


def copy(a, order="K", subok=False):
    """``jnp.copy`` of a global array: each device copies its own shard, so the sharding is kept
    (JAX's spec, one entry per dim, as its copy primitive's type); nothing moves.

    Example:
        >>> import numpy as np, shardlab as sl, shardlab.numpy as jnp
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((2,), ("X",))
        >>> x = sl.device_put(np.ones((4, 2), np.float32), sl.NamedSharding(mesh, P("X")))
        >>> jnp.copy(x).sharding.spec
        P('X', None)
    """
    if not isinstance(a, ShardedArray):
        return global_fallback(np.copy, "copy", (a,), {"order": order})
    if CTX.tapes and not a.unreduced:  # the gradient tape sees the copy (an identity shard_map)
        spec = a.sharding.spec
        return flat_shard_map(lambda v: v, mesh=a.sharding.mesh, in_specs=spec, out_specs=spec.padded(a.ndim))(a)
    return _seen(a, a.copy())


# -- no rule: the fallback, recorded ---------------------------------------------------------------
def global_fallback(fn, name: str, args, kwargs, *, elementwise: bool = False):
    """A jax.numpy function with no sharded rule, on global arrays: every ShardedArray operand is
    gathered to replicated (AllGathers in the ledger), the function runs once on the whole value
    (one ``numpy_fallback`` event, labelled ``fallback:<name>``), and the result is replicated
    on the mesh, P(). Correct, and honest about what it costs.

    ``elementwise``: a function of each element of its one array argument (``jnp.round``,
    ``jnp.fix``, ...) runs on every device's block instead, keeping the sharding (no gather)."""
    mesh = next(a.sharding.mesh for a in _leaves((args, kwargs)) if isinstance(a, ShardedArray))
    x = args[0] if args else None
    if elementwise and isinstance(x, ShardedArray) and not x.unreduced and not x.is_abstract and not CTX.tapes \
            and not any(isinstance(a, ShardedArray) for a in _leaves((args[1:], kwargs))):
        with named_scope(f"fallback:{name}"):
            with np.errstate(all="ignore"):
                out = np.asarray(fn(x._storage, *args[1:], **kwargs))
            if out.shape == x._storage.shape:
                out = _dt.canonicalize(out, name)
                record(Event("numpy_fallback", dtype=str(out.dtype), bytes_in=x.nbytes_per_device,
                             bytes_out=out.nbytes // max(1, x.sharding.num_shards(x.shape)),
                             hbm_bytes=x.nbytes_per_device * 2), mesh)
                return ShardedArray(out, x.sharding, x.shape)
    with named_scope(f"fallback:{name}"):
        def gather(v):
            if isinstance(v, ShardedArray):
                if v.sharding.mesh != mesh:
                    raise ShardingTypeError(f"[{name}] operands live on different meshes: {mesh!r} and "
                                            f"{v.sharding.mesh!r}; device_put them onto one")
                g = reshard(v, NamedSharding(mesh, P())) if (v.sharding.spec.mesh_axes() or v.unreduced) else v
                return np.asarray(g)
            return v

        host_args = _map(gather, args)
        host_kwargs = _map(gather, kwargs)
        out = fn(*host_args, **host_kwargs)
        leaves = _leaves(out)
        nbytes = sum(np.asarray(o).nbytes for o in leaves if isinstance(o, (np.ndarray, np.generic)))
        nin = sum(np.asarray(a).nbytes for a in _leaves((host_args, host_kwargs)) if isinstance(a, np.ndarray))
        record(Event("numpy_fallback", dtype=str(np.asarray(leaves[0]).dtype) if leaves else "float32",
                     bytes_in=nin, bytes_out=nbytes, hbm_bytes=nin + nbytes), mesh)

    def place(o):
        if isinstance(o, (np.ndarray, np.generic)):
            return device_put(_dt.canonicalize(np.asarray(o), name), NamedSharding(mesh, P()))
        return o

    return _map(place, out)


def _leaves(tree) -> list:
    if isinstance(tree, (list, tuple)):
        return [leaf for t in tree for leaf in _leaves(t)]
    if isinstance(tree, dict):
        return [leaf for t in tree.values() for leaf in _leaves(t)]
    return [tree]


def _map(fn, tree):
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*[_map(fn, t) for t in tree])
    if isinstance(tree, (list, tuple)):
        return type(tree)(_map(fn, t) for t in tree)
    if isinstance(tree, dict):
        return {k: _map(fn, v) for k, v in tree.items()}
    return fn(tree)


register_global_ufunc(elementwise)
jnp.register_global("contract", contract)
jnp.register_global("matmul", contract_matmul)
jnp.register_global("elementwise", elementwise)
jnp.register_global("fallback", global_fallback)
jnp.register_global("astype", astype)
jnp.register_global("out_sharding", R.out_sharding)
jnp.register_global("reshard", reshard)
jnp.register_global(np.copy, copy)
_jit.register_reshard(reshard)  # jit(out_shardings=) moves results with the planner (this layer is above jit)
