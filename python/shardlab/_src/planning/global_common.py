"""What the global-view jnp ops share: spec entries as JAX writes them, the book's notation of a
type, the refusal-or-gather rule for Auto axes, and running a body on the shards.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> from shardlab._src.planning.global_common import spec_of, type_str
    >>> mesh = sl.make_mesh((2, 4), ("X", "Y"))
    >>> x = sl.device_put(np.zeros((8, 4), np.float32), sl.NamedSharding(mesh, P(("X", "Y"))))
    >>> spec_of(x), type_str(x)
    ([('X', 'Y'), None], 'f32[8@(X,Y),4]')
"""

from __future__ import annotations

import numpy as np

from ..arrays.sharded_array import ShardedArray, device_put
from ..core.errors import ShardingTypeError
from ..core.mesh import AxisType
from ..core.sharding import NamedSharding, P
from ..ops import lax
from ..transforms.shard_map import flat_shard_map
from .global_ops import reshard as _plan_reshard


# -- specs ---------------------------------------------------------------------------------------
def entry(axes) -> object:
    """A tuple of axis names as JAX writes a spec entry: None, 'X' or ('X', 'Y')."""
    axes = tuple(axes or ())
    return None if not axes else (axes[0] if len(axes) == 1 else axes)


def axes_of(e) -> tuple:
    return () if e is None else (e,) if isinstance(e, str) else tuple(e)


def spec_of(x: ShardedArray) -> list:
    """One entry per dim (None / name / tuple of names)."""
    return [entry(a) for a in x.sharding.spec.normalized(x.ndim)]


def type_str(x, shape=None, spec=None) -> str:
    """The book's notation of a type (JAX's ``str_short`` with short dtypes): ``f32[8@X,8@(X,Y)]``;
    ``shape`` / ``spec`` give another type of ``x``'s dtype."""
    shape = np.shape(x) if shape is None else shape
    spec = (spec_of(x) if isinstance(x, ShardedArray) else [None] * len(shape)) if spec is None else spec
    dims = []
    for n, e in zip(shape, spec):
        a = axes_of(e)
        dims.append(str(n) if not a else f"{n}@{a[0]}" if len(a) == 1 else f"{n}@({','.join(a)})")
    name = np.dtype(x.dtype).name
    short = name.replace("float", "f").replace("uint", "u").replace("int", "i").replace("complex", "c")
    return f"{short}[{','.join(dims)}]"


def sharding_str(x: ShardedArray, spec=None) -> str:
    spec = P(*spec_of(x)) if spec is None else spec
    return f"NamedSharding(mesh={x.sharding.mesh!r}, spec={_pstr(spec)})"


def _pstr(spec) -> str:
    return "P(" + ", ".join(repr(e) for e in spec) + ")"


def check_reduced(x: ShardedArray, op: str) -> None:
    if x.unreduced:
        raise ValueError(f"[{op}] the array {type_str(x)} is unreduced along {sorted(x.unreduced)}; reshard it "
                         f"first (shardlab.reshard(x, x.sharding) sums the partials)")


def with_spec(x: ShardedArray, spec) -> ShardedArray:
    """``x`` resharded to ``spec`` on its mesh (the planner's collectives; no-op if equal)."""
    spec = P(*spec)
    if P(*spec_of(x)) == P(*[entry(axes_of(e)) for e in spec]) + (None,) * (x.ndim - len(spec)) and not x.unreduced:
        return x
    return _plan_reshard(x, NamedSharding(x.sharding.mesh, spec))


def free_dims(x: ShardedArray, dims, make_error) -> ShardedArray:
    """``x`` with ``dims`` unsharded. JAX refuses (``make_error()``) where an Explicit axis
    shards them; where every such axis is Auto, the dims are all-gathered (the compiler's job
    in JAX; here a recorded collective)."""
    spec = spec_of(x)
    bad = [a for d in dims for a in axes_of(spec[d])]
    if not bad:
        return x
    types = dict(zip(x.sharding.mesh.axis_names, x.sharding.mesh.axis_types))
    if any(types[a] != AxisType.Auto for a in bad):
        raise make_error()
    return with_spec(x, [None if d in dims else e for d, e in enumerate(spec)])


def same_mesh(arrays, op: str = "shardlab") -> list:
    """The operands, checked to be on one mesh (axis types included: inside ``auto_axes`` an
    array from outside is on another mesh, and JAX refuses to mix them too)."""
    first = arrays[0].sharding.mesh
    for a in arrays[1:]:
        m = a.sharding.mesh
        if m is not first and m != first:
            raise ShardingTypeError(f"[{op}] Mesh for all inputs should be equal. Got one mesh: {first!r} and "
                                    f"another mesh: {m!r}; reshard or device_put the operands onto one mesh")
    return list(arrays)


def run(body, arrays, out_specs, op: str = "shardlab"):
    """``body`` on the shards of ``arrays`` (each in its own spec) inside one shard_map."""
    arrays = same_mesh(list(arrays), op)
    specs = tuple(a.sharding.spec for a in arrays)
    return flat_shard_map(body, mesh=arrays[0].sharding.mesh, in_specs=specs, out_specs=out_specs)(*arrays)


def gather_dims(v, spec: list, dims):
    """Inside a shard_map body: all-gather local dims ``dims`` over the axes that shard them."""
    for d in dims:
        a = axes_of(spec[d])
        if a:
            v = lax.all_gather(v, a if len(a) > 1 else a[0], axis=d, tiled=True)
    return v


def slice_dims(v, spec: list, dims):
    """Inside a shard_map body: keep this device's chunk of whole local dims ``dims`` (no data
    moves)."""
    for d in dims:
        a = axes_of(spec[d])
        if a:
            name = a if len(a) > 1 else a[0]
            size = v.shape[d] // lax.axis_size(name)
            v = lax.dynamic_slice_in_dim(v, lax.axis_index(name) * size, size, axis=d)
    return v


def as_global(v, mesh, spec=None) -> ShardedArray:
    """A non-ShardedArray operand placed on ``mesh`` (replicated, as JAX's constants)."""
    if isinstance(v, ShardedArray):
        return v
    arr = np.asarray(v)
    if arr.dtype == np.float64 and not isinstance(v, np.ndarray):
        arr = arr.astype(np.float32)
    return device_put(arr, NamedSharding(mesh, P() if spec is None else spec))


def norm_axis(axis, r: int, op: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"[{op}] axis must be an int, got {axis!r}")
    if not -r <= axis < r:
        raise np.exceptions.AxisError(f"[{op}] axis {axis} is out of bounds for an array of rank {r}")
    return int(axis) % r


def _norm_axes(axis, r: int, op: str) -> tuple:
    axes = tuple(range(r)) if axis is None else (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = tuple(sorted(norm_axis(a, r, op) for a in axes))
    if len(set(out)) != len(out):
        raise ValueError(f"[{op}] axis {axis!r} repeats a dimension")
    return out
