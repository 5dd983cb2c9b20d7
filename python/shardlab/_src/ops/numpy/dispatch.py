"""How a ``shardlab.numpy`` function finds its implementation: per-device values (LocalArray)
go to primitives, global ShardedArrays to the planning layer's implementations in
:data:`GLOBAL`, host data to numpy with JAX's dtype rules; and the small helpers every family
shares (operands, axes, registration with numpy's ``__array_function__``).
"""

from __future__ import annotations

import builtins

import numpy as np

from ...arrays.host_array import as_host as _as_host, HostArray
from ...arrays.local_array import HANDLED, lift, local_axes, LocalArray
from ...arrays.sharded_array import device_put as _device_put, ShardedArray
from ...core.context import CTX as _CTX
from ...core.mesh import get_mesh as _get_mesh
from ...core.sharding import NamedSharding as _NamedSharding, PartitionSpec as _P

__all__ = ["GLOBAL", "register_global"]


_PY_SCALARS = frozenset((int, float, complex, bool))


def _on_mesh(out, weak: bool = False):
    """A result computed from host data: inside shard_map an invariant per-device value (a
    LocalArray, as JAX's body sees a traced constant); under ``set_mesh`` a replicated
    ShardedArray on that mesh, as JAX gives ``NamedSharding(mesh, P())``; with no mesh a
    HostArray (JAX's Array on one device, a numpy subclass; `weak`: its weak_type)."""
    if not isinstance(out, (np.ndarray, np.generic)):
        return out
    if _CTX.meshes:  # inside shard_map: a per-device value, the same on every device (as JAX's)
        return lift(np.asarray(out), _CTX.meshes[-1])
    mesh = _get_mesh()
    if mesh is None:
        return out if type(out) is HostArray and (out._weak or not weak) else _as_host(out, weak=weak)
    if mesh.abstract:
        return out
    return _device_put(np.asarray(out), _NamedSharding(mesh, _P()))


def _has_global(args) -> bool:
    for a in args:
        if isinstance(a, ShardedArray):
            return True
    return False


def _host_operand(v, op: str):
    if isinstance(v, HostArray):  # plain numpy (a weak 0-d one as its Python scalar, promoting as one)
        return v.item() if v._weak and v.ndim == 0 else v.view(np.ndarray)
    if type(v) in _PY_SCALARS or isinstance(v, (np.ndarray, np.generic)):
        return v
    if isinstance(v, (list, tuple)):
        raise TypeError(f"[{op}] {op} requires ndarray or scalar arguments, got {type(v)} at position 0 "
                        f"(as jax.numpy); wrap it with jnp.asarray first")
    return np.asarray(v)


# Implementations on global ShardedArrays, filled by the planning layer (which the ops layer
# cannot import). Keys: the numpy function (np.sum, np.reshape, ...) or the jnp name; the value
# is called with the jnp function's own arguments. ``shardlab.numpy``'s dispatch
# (numpy_fallback.global_dispatch) looks here first, then falls back (recorded) or refuses.
# Reserved string keys: "elementwise", "contract", "matmul", "astype", "fallback",
# "out_sharding", "reshard" (planning/global_ops.py).
GLOBAL: dict = {}


def register_global(key, impl):
    """Registers `impl` as the implementation of `key` (a numpy function or a reserved name) on
    global ShardedArrays; the planning layer calls it beside each implementation. Returns `impl`."""
    GLOBAL[key] = impl
    return impl


def _global(np_fn, x, **kw):
    impl = GLOBAL.get(np_fn)
    if impl is None:
        raise TypeError(f"[{np_fn.__name__}] on a global ShardedArray is not supported yet; use it inside "
                        f"shard_map, or np.asarray(x) for the global value")
    return impl(x, **kw)


def _implements(*np_funcs):
    def register(fn):
        for f in np_funcs:
            HANDLED[f] = fn
        return fn

    return register


def _is_local(*values) -> bool:
    return builtins.any(isinstance(v, LocalArray) for v in values)


def _scalar(v) -> bool:
    return isinstance(v, (int, float, complex, bool)) and not isinstance(v, np.generic)


def _operand(v, mesh):
    """A bind operand: LocalArrays as they are, Python scalars as weakly typed constants,
    anything else lifted to an invariant LocalArray."""
    if isinstance(v, LocalArray) or _scalar(v):
        return v
    return lift(v, mesh)


def _axes(axis, x: LocalArray, op: str) -> tuple:
    if axis is None:
        return tuple(range(len(x.storage.shape) - x.mesh.ndim))
    try:
        st_axes = local_axes(axis, x)
    except (np.exceptions.AxisError, TypeError) as e:
        raise type(e)(f"[{op}] {e}") from None
    st_axes = st_axes if isinstance(st_axes, tuple) else (st_axes,)
    k = x.mesh.ndim
    axes = tuple(sorted(a - k for a in st_axes))
    if len(set(axes)) != len(axes):
        raise ValueError(f"[{op}] axis {axis!r} repeats a dimension")
    return axes


def _method(fn):
    def method(self, *a, **k):
        return fn(self, *a, **k)

    method.__name__ = fn.__name__
    method.__doc__ = f"``jnp.{fn.__name__}(self, ...)``, on the local value. {(fn.__doc__ or '').strip()}"
    return method


def _local(x):
    return isinstance(x, LocalArray)
