"""The output-sharding rules of jax.numpy ops on global arrays, in one place (JAX's explicit mode).

Each rule takes the operands' types (shape, dtype, per-dim mesh axes, mesh) and returns the
output's per-dim mesh axes, or raises what JAX raises (``ShardingTypeError`` with JAX's
reason, named by the op, the types written in the book's notation ``f32[8@X,4]``, and what to
do). They are JAX's ``broadcasting_sharding_rule`` and ``_dot_general_sharding_rule``
(jax/_src/lax/lax.py), the einsum pairwise order of jax/_src/numpy/einsum.py, the check that
no mesh axis shards two dims (jax/_src/lax/utils.py), and the ``out_sharding`` canonicalization
of jax/_src/sharding_impls.py. Auto mesh axes (``AxisType.Auto``) are free for propagation:
the rules below say how shardlab decides them (docs/planner.md, "Explicit sharding rules").

A spec here is a tuple with one tuple of mesh axis names per dim (``()`` = unsharded).

Example:
    >>> import shardlab as sl
    >>> from shardlab._src.planning import sharding_rules as R
    >>> mesh = sl.make_mesh((2, 4), ("X", "Y"))
    >>> R.broadcast("add", [R.Operand((8, 4), "float32", (("X",), ("Y",)), mesh),
    ...                     R.Operand((1, 4), "float32", ((), ("Y",)), mesh)])
    (('X',), ('Y',))
    >>> R.type_str((8, 4), "float32", (("X",), ()))
    'f32[8@X,4]'
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import ShardingTypeError
from ..core.mesh import AxisType, get_mesh
from ..core.sharding import NamedSharding, PartitionSpec

Spec = tuple  # tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Operand:
    """What a rule needs of an operand: shape, dtype, per-dim axes and mesh (None: host data)."""

    shape: tuple
    dtype: object
    dims: Spec
    mesh: object = None


# -- notation ----------------------------------------------------------------------------------
def short_dtype(dtype) -> str:
    """JAX's short dtype name: f32, bf16, i32, u8, bool."""
    name = np.dtype(dtype).name
    return name.replace("float", "f").replace("uint", "u").replace("int", "i").replace("complex", "c")


def type_str(shape, dtype, dims: Spec, unreduced=()) -> str:
    """``f32[8@X,4@(Y,Z)]`` (JAX's ``str_short`` of a type: the book's notation)."""
    out = []
    for d, size in enumerate(shape):
        axes = dims[d] if d < len(dims) else ()
        out.append(f"{size}" if not axes else f"{size}@{axes[0]}" if len(axes) == 1 else
                   f"{size}@({','.join(axes)})")
    u = f"{{U:{','.join(unreduced)}}}" if unreduced else ""
    return f"{short_dtype(dtype)}[{','.join(out)}]{u}"


def spec_tuple(spec: Spec) -> tuple:
    """JAX's partitions tuple of a spec (None, 'X' or ('X', 'Y') per dim), as its messages print."""
    return tuple(None if not a else a[0] if len(a) == 1 else tuple(a) for a in spec)


def to_pspec(dims: Spec) -> PartitionSpec:
    return PartitionSpec(*spec_tuple(dims))


def dims_of(spec, rank: int) -> Spec:
    """Per-dim axes of a PartitionSpec padded to ``rank``."""
    return tuple(spec.normalized(rank))


def _types(ops) -> str:
    return ", ".join(type_str(o.shape, o.dtype, o.dims) for o in ops)


# -- meshes ------------------------------------------------------------------------------------
def common_mesh(op: str, operands) -> object:
    """The mesh of the operands that have one; JAX's error if two differ."""
    mesh = None
    for o in operands:
        if o.mesh is None:
            continue
        if mesh is not None and o.mesh != mesh:
            raise ShardingTypeError(
                f"[{op}] Mesh for all inputs should be equal. Got one mesh: {mesh!r} and another mesh: "
                f"{o.mesh!r} (operands {_types(operands)}); device_put (or reshard) them onto one mesh")
        mesh = o.mesh
    return mesh


_AUTO: dict = {}


def auto_axes(mesh) -> frozenset:
    """Mesh axes of type Auto (propagation decides their sharding)."""
    hit = _AUTO.get(mesh)
    if hit is None:
        types = getattr(mesh, "axis_types", None) or ()
        hit = frozenset(n for n, t in zip(mesh.axis_names, types) if t == AxisType.Auto)
        if len(_AUTO) > 256:
            _AUTO.clear()
        _AUTO[mesh] = hit
    return hit


# -- legality ----------------------------------------------------------------------------------
def check_legal(op: str, operands, out_shape, out_dtype, out_dims: Spec, prim: str | None = None) -> None:
    """ShardingTypeError if ``out_dims`` names a mesh axis twice (JAX's DuplicateSpecError
    turned into "produces an illegally sharded result")."""
    seen = set()
    mesh = next((o.mesh for o in operands if o.mesh is not None), None)
    auto = auto_axes(mesh) if mesh is not None else frozenset()
    for axes in out_dims:
        for a in axes:
            if a in seen and a not in auto:
                raise ShardingTypeError(
                    f"[{op}] {prim or op} operation with inputs: {_types(operands)} produces an illegally "
                    f"sharded result: {type_str(out_shape, out_dtype, out_dims)}: mesh axis {a!r} would shard "
                    f"two dims. Pass out_sharding= (or reshard an operand first) so that each mesh axis "
                    f"shards one dim")
            seen.add(a)


# -- elementwise -------------------------------------------------------------------------------
def broadcast_shape(op: str, shapes) -> tuple:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise TypeError(f"[{op}] shapes {', '.join(map(str, shapes))} do not broadcast "
                        f"(jax.numpy's broadcasting: trailing dims equal or 1)") from None


# numpy's ufunc names -> JAX's lax primitive names (what JAX's messages call the op)
LAX_NAMES = {"subtract": "sub", "multiply": "mul", "divide": "div", "true_divide": "div", "maximum": "max",
             "minimum": "min", "power": "pow", "arctan2": "atan2", "equal": "eq", "not_equal": "ne", "less": "lt",
             "less_equal": "le", "greater": "gt", "greater_equal": "ge", "logical_and": "and", "logical_or": "or",
             "logical_xor": "xor", "bitwise_and": "and", "bitwise_or": "or", "bitwise_xor": "xor",
             "remainder": "rem", "mod": "rem", "fmod": "rem", "negative": "neg", "absolute": "abs"}


def broadcast(op: str, operands, out_shape=None) -> Spec:
    """JAX's ``broadcasting_sharding_rule`` after jnp's rank promotion (missing leading dims are
    size 1, unsharded): a dim takes the sharding its operands agree on; an operand's dim of
    size 1 (unsharded) takes the others'; two different non-None shardings raise
    ShardingTypeError. On Auto axes a conflict is not an error: the dim is left unsharded
    (what JAX's eager propagation gives, checked against it in tests/python/test_explicit_ops.py).
    """
    prim = LAX_NAMES.get(op, op)
    arrays = [o for o in operands if o.shape is not None]
    if not arrays:
        return ()
    r = max(len(o.shape) for o in arrays)
    shapes = [(1,) * (r - len(o.shape)) + tuple(o.shape) for o in arrays]
    specs = [((),) * (r - len(o.shape)) + tuple(o.dims) for o in arrays]
    mesh = common_mesh(op, arrays)
    auto = auto_axes(mesh) if mesh is not None else frozenset()
    out = []
    for d in range(r):
        ss = [s[d] for s in specs]
        if all(s == ss[0] for s in ss[1:]):
            out.append(ss[0])
            continue
        nontrivial = [s for s, shp in zip(ss, shapes) if not (shp[d] == 1 and not s)]
        if not nontrivial or all(s == nontrivial[0] for s in nontrivial[1:]):
            out.append(nontrivial[0] if nontrivial else ())
            continue
        res = ()
        for s in ss:
            if not res and s:
                res = s
            elif res and s and res != s:
                if set(res) | set(s) <= auto:
                    res = ()
                    break
                raise ShardingTypeError(
                    f"[{op}] {prim} got incompatible shardings for broadcasting: "
                    f"{', '.join(str(spec_tuple(sp)) for sp in specs)} (operands {_types(operands)}; "
                    f"dim {d} is sharded over {spec_tuple((res,))[0]!r} in one and {spec_tuple((s,))[0]!r} in "
                    f"another). Reshard one operand to the other's sharding first "
                    f"(shardlab.reshard(x, P(...)))")
        out.append(res)
    out = tuple(out)
    if out_shape is None:
        out_shape = broadcast_shape(op, shapes)
    check_legal(op, operands, out_shape, arrays[0].dtype, out, prim)
    return out


# -- contractions ------------------------------------------------------------------------------
def _check_match(lhs, rhs, msg: str):
    for a, b in zip(lhs, rhs):
        if a and b and a != b:
            raise ShardingTypeError(msg)


def dot_general(op: str, lhs: Operand, rhs: Operand, contracting, batch) -> Spec:
    """JAX's ``_dot_general_sharding_rule`` without out_sharding: batch dims (lhs's sharding),
    then lhs's free dims, then rhs's. Sharded contracting dims on both sides are ambiguous."""
    (lc, rc), (lb, rb) = contracting, batch
    lcs, rcs = tuple(lhs.dims[i] for i in lc), tuple(rhs.dims[i] for i in rc)
    lbs, rbs = tuple(lhs.dims[i] for i in lb), tuple(rhs.dims[i] for i in rb)
    auto = auto_axes(lhs.mesh or rhs.mesh) if (lhs.mesh or rhs.mesh) is not None else frozenset()
    if auto:  # propagation is free on Auto axes: only explicit ones must agree
        strip = lambda specs: tuple(tuple(a for a in s if a not in auto) for s in specs)  # noqa: E731
        lbs, rbs, lcs, rcs = strip(lbs), strip(rbs), strip(lcs), strip(rcs)
    _check_match(lbs, rbs, f"[{op}] dot_general requires lhs batch dimensions and rhs batch dimensions to have the "
                           f"consistent sharding, got {spec_tuple(lbs)} and {spec_tuple(rbs)} (operands "
                           f"{_types([lhs, rhs])}). Reshard one operand so the batch dims match")
    _check_match(lcs, rcs, f"[{op}] dot_general requires contracting dimensions to have consistent sharding, got "
                           f"{spec_tuple(lcs)} and {spec_tuple(rcs)} (operands {_types([lhs, rhs])}). Reshard "
                           f"one operand so the contracting dims match")
    for a, b in zip(lcs, rcs):
        if a and b and not set(a) <= auto:
            raise ShardingTypeError(
                f"[{op}] Contracting dimensions are sharded and it is ambiguous how the output should be "
                f"sharded. Please specify the output sharding via the `out_sharding` parameter. Got "
                f"lhs_contracting_spec={spec_tuple(lcs)} and rhs_contracting_spec={spec_tuple(rcs)} "
                f"(operands {_types([lhs, rhs])})")
    used = set(lc) | set(lb)
    rused = set(rc) | set(rb)
    return (tuple(lhs.dims[i] for i in lb) + tuple(s for i, s in enumerate(lhs.dims) if i not in used)
            + tuple(s for i, s in enumerate(rhs.dims) if i not in rused))


def einsum(op: str, terms, out_labels: str, operands, *, jnp_order: bool = True) -> Spec:
    """The output sharding of ``jnp.einsum`` without out_sharding: operands contracted left to
    right as jnp.einsum's two-operand steps do (labels summed away first, then one
    dot_general with the rule above, then a transpose), so JAX's errors come out with it.
    ``jnp_order=False``: one ``lax.dot_general`` as written (lhs first)."""
    ops = list(operands)
    labs = list(terms)
    while True:
        # labels no other operand and not the output needs are summed away (a reduction: no rule)
        for i, (t, o) in enumerate(zip(labs, ops)):
            others = set(out_labels) | {c for j, u in enumerate(labs) if j != i for c in u}
            keep = [k for k, c in enumerate(t) if c in others]
            if len(keep) != len(t):
                labs[i] = "".join(t[k] for k in keep)
                ops[i] = Operand(tuple(o.shape[k] for k in keep), o.dtype, tuple(o.dims[k] for k in keep), o.mesh)
        if len(ops) == 1:
            break
        lhs, rhs, ln, rn = ops[0], ops[1], labs[0], labs[1]
        rest = set(out_labels) | {c for u in labs[2:] for c in u}
        result = [c for c in dict.fromkeys(ln + rn) if c in rest]
        batch = [c for c in result if c in ln and c in rn]
        contracted = sorted(c for c in set(ln) & set(rn) if c not in rest)
        lrem = "".join(c for c in ln if c not in batch and c not in contracted)
        rrem = "".join(c for c in rn if c not in batch and c not in contracted)
        res_names = "".join(batch) + lrem + rrem
        if jnp_order and len(ops) == 2 and "".join(batch) + rrem + lrem == out_labels:  # jnp.einsum's (rhs, lhs)
            lhs, rhs, ln, rn, lrem, rrem = rhs, lhs, rn, ln, rrem, lrem
            res_names = "".join(batch) + lrem + rrem
        dims = dot_general(op, lhs, rhs,
                           (tuple(ln.index(c) for c in contracted), tuple(rn.index(c) for c in contracted)),
                           (tuple(ln.index(c) for c in batch), tuple(rn.index(c) for c in batch)))
        size = {c: s for t, o in ((ln, lhs), (rn, rhs)) for c, s in zip(t, o.shape)}
        shape = tuple(size[c] for c in res_names)
        check_legal(op, [lhs, rhs], shape, lhs.dtype, dims, "dot_general")
        ops = [Operand(shape, lhs.dtype, dims, lhs.mesh or rhs.mesh)] + ops[2:]
        labs = [res_names] + labs[2:]
    (o,), (t,) = ops, labs
    return tuple(o.dims[t.index(c)] for c in out_labels)


# -- out_sharding ------------------------------------------------------------------------------
def out_sharding(value, op: str, rank: int, shape=None, mesh=None) -> NamedSharding | None:
    """``out_sharding=`` (or ``device=`` a sharding) as a NamedSharding, as JAX's
    ``canonicalize_sharding``: a bare PartitionSpec needs ``set_mesh`` (JAX's ValueError); an
    unknown axis or an axis used twice raises what JAX raises, naming the op."""
    if value is None:
        return None
    if isinstance(value, NamedSharding):
        sh = value
    elif isinstance(value, PartitionSpec):
        cur = get_mesh()
        if cur is None:
            raise ValueError(
                f"[{op}] Using PartitionSpec when you are not under a mesh context is not allowed. Please pass a "
                f"NamedSharding instance or enter into a mesh context via `jax.set_mesh`. Got {value!r} "
                f"(shardlab.set_mesh(mesh), or NamedSharding(mesh, {value!r}))")
        spec = value
        names = set(cur.axis_names)
        for a in spec.mesh_axes():
            if a not in names:
                raise ValueError(f"[{op}] Resource axis: {a} of {spec!r} is not found in mesh: {cur.axis_names}. "
                                 f"Name one of the mesh's axes in out_sharding")
        sh = _named(cur, spec, op)
    else:
        raise TypeError(f"[{op}] `out_sharding` argument of {op} only supports instances of `NamedSharding` or "
                        f"`PartitionSpec`. Got {value!r} of type: {type(value)}")
    if mesh is not None and sh.mesh != mesh:
        raise ValueError(f"[{op}] out_sharding lives on {sh.mesh!r} but the operands on {mesh!r}; "
                         f"give a sharding of the operands' mesh")
    if len(sh.spec) > rank:
        raise ValueError(f"[{op}] out_sharding {sh.spec!r} has {len(sh.spec)} entries for a result of rank {rank}")
    if shape is not None:
        sh.check_shape(tuple(shape), op)
    return sh


def _named(mesh, spec, op: str) -> NamedSharding:
    try:
        return NamedSharding(mesh, spec)
    except ValueError as e:  # DuplicateSpecError is a ValueError
        raise type(e)(f"[{op}] {e}") from None
