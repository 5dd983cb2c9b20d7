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
    ([8.0, 8.0], PartitionSpec())
"""

from __future__ import annotations

import numpy as np

from ..arrays.local_array import LocalArray, lift
from ..arrays.sharded_array import GLOBAL_UFUNC, ShardedArray, device_put
from ..core.mesh import UNIT_MESH
from ..core.sharding import NamedSharding, P
from ..ops import lax
from ..ops import numpy as jnp
from ..transforms.shard_map import shard_map
from .plan import Plan
from .planner import plan_einsum, plan_reshard


def _dynamic_slice(v: LocalArray, axis: str, dim: int) -> LocalArray:
    """Device i along ``axis`` keeps chunk i of local dim ``dim``: no data moves."""
    size = v.shape[dim] // lax.axis_size(axis)
    return lax.dynamic_slice_in_dim(v, lax.axis_index(axis) * size, size, axis=dim)


def _apply(step, env: dict, mesh) -> LocalArray:
    x = [env[t.name] for t in step.inputs]
    if step.op == "einsum":
        sub = ",".join(t.labels for t in step.inputs) + "->" + step.output.labels
        return lift(jnp.einsum(sub, *x), mesh)
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


def run_plan(plan: Plan, *arrays) -> ShardedArray:
    """Runs ``plan`` on ``arrays`` (laid out as the plan's inputs) inside one shard_map.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((2,), ("X",))
        >>> a = sl.device_put(np.eye(4, dtype=np.float32), sl.NamedSharding(mesh, P("X")))
        >>> plan = sl.plan_einsum("ij,jk->ik", a, a, out_sharding=P())
        >>> np.allclose(np.asarray(sl.run_plan(plan, a, a)), np.eye(4))
        True
    """
    mesh = plan.mesh
    if len(arrays) != len(plan.inputs):
        raise ValueError(f"[run_plan] the plan takes {len(plan.inputs)} operands, got {len(arrays)}")
    in_specs = tuple(t.layout.spec() for t in plan.inputs)
    lay = plan.output.layout
    u = tuple(a for a in mesh.axis_names if a in lay.unreduced)
    out_spec = P(u, *lay.spec()) if u else lay.spec()

    def body(*local):
        env = {t.name: lift(v, mesh) for t, v in zip(plan.inputs, local)}
        for step in plan.steps:
            env[step.output.name] = _apply(step, env, mesh)
        r = env[plan.output.name]
        # Partial sums leave shard_map through a leading dim of the axis size, as real data.
        return jnp.expand_dims(r, 0) if u else r

    res = shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_spec)(*arrays)
    sharding = NamedSharding(mesh, lay.spec())
    if not u:
        return res  # laid out as out_spec already (and known to a gradient tape)
    return ShardedArray(res._storage.squeeze(mesh.ndim), sharding, plan.output.shape, frozenset(u))


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


def matmul(a, b, out_sharding=None, *, unreduced=()):
    """``a @ b`` with numpy's rank rules (1-D operands, batch dims aligned from the right), as ``einsum``.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((2,), ("X",))
        >>> a = sl.device_put(np.ones((4, 4), np.float32), sl.NamedSharding(mesh, P("X")))
        >>> sl.matmul(a, a, out_sharding=P("X")).sharding.spec
        PartitionSpec('X')
    """
    ra, rb = len(a.shape), len(b.shape)
    if ra == 0 or rb == 0:
        raise ValueError("[matmul] operands must have rank >= 1; use einsum or * for scalars")
    letters = "abcdefghlmnopqrstuvw"
    if ra == 1 and rb == 1:
        sub = "k,k->"
    elif ra == 1:
        batch = letters[: rb - 2]
        sub = f"k,{batch}kn->{batch}n"
    elif rb == 1:
        batch = letters[: ra - 2]
        sub = f"{batch}mk,k->{batch}m"
    else:
        # numpy's rule: batch dims align from the right; the extra leading ones belong to one side.
        common, extra = letters[: min(ra, rb) - 2], letters[min(ra, rb) - 2: max(ra, rb) - 2]
        ba, bb = (extra + common, common) if ra >= rb else (common, extra + common)
        for d, (sa, sb) in enumerate(zip(a.shape[ra - 2 - len(common): ra - 2], b.shape[rb - 2 - len(common): rb - 2])):
            if sa != sb:
                raise ValueError(f"[matmul] batch dims of {a.shape} and {b.shape} differ ({sa} vs {sb}); "
                                 f"size-1 broadcasting of batch dims is not supported, use einsum")
        sub = f"{ba}ij,{bb}jk->{extra + common}ik"
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
        (PartitionSpec(None, 'X'), True)
    """
    if not isinstance(x, ShardedArray):
        raise TypeError(f"[reshard] x must be a ShardedArray, got {type(x).__name__}")
    return run_plan(plan_reshard(x, sharding, unreduced=unreduced), x)


def _global_ufunc(ufunc, inputs, kwargs):
    """Global-view arithmetic, as on a jax.Array: elementwise ufuncs keep the first array's
    sharding and run shard by shard (inside a shard_map, so they are differentiable and any
    resharding is a recorded collective); ``@`` is planned and run by ``shardlab.matmul``;
    operands that do not line up element for element are computed on the global values."""
    if ufunc is np.matmul:
        return matmul(*inputs)
    first = next(x for x in inputs if isinstance(x, ShardedArray))
    scalar = lambda x: isinstance(x, (int, float, bool, complex, np.generic))  # noqa: E731
    aligned = []
    for x in inputs:
        if isinstance(x, ShardedArray) and x.shape == first.shape:
            aligned.append(x if x.sharding == first.sharding and not x.unreduced else reshard(x, first.sharding))
        elif isinstance(x, LocalArray) and x.mesh is UNIT_MESH and x.shape == first.shape:
            # a numpy argument a grad is tracking: it enters the shard_map as the arrays do,
            # so its gradient flows back through the split
            aligned.append(x)
        elif scalar(x):
            aligned.append(x)
        elif not isinstance(x, ShardedArray) and np.shape(x) == first.shape:
            aligned.append(device_put(np.asarray(x), first.sharding))
        else:
            out = ufunc(*[np.asarray(v) for v in inputs], **kwargs)
            return out if out.shape != first.shape else device_put(out, first.sharding)
    spec = first.sharding.spec
    pos = [i for i, x in enumerate(aligned) if isinstance(x, (ShardedArray, LocalArray))]

    def body(*local):
        args = list(aligned)
        for i, v in zip(pos, local):
            args[i] = v
        return ufunc(*args, **kwargs)

    return shard_map(body, mesh=first.sharding.mesh, in_specs=(spec,) * len(pos), out_specs=spec,
                     check_vma=False)(*[aligned[i] for i in pos])


GLOBAL_UFUNC[0] = _global_ufunc
