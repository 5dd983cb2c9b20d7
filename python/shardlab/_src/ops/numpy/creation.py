"""Array creation: ``zeros`` / ``ones`` / ``full`` / ``empty`` (and their ``_like``), ``arange``,
``linspace``, ``eye``, ``identity``, ``tri``, ``array`` / ``asarray``; with ``device=`` or
``out_sharding=`` the result is placed on a mesh, as in JAX.
"""

from __future__ import annotations

import numpy as np

from ...arrays.host_array import as_host as _as_host, HostArray
from ...arrays.local_array import LocalArray
from ...arrays.sharded_array import device_put as _device_put, ShardedArray
from ...arrays.storage import AbstractStorage, is_abstract
from ...core import dtypes as _dt
from ...core.sharding import NamedSharding as _NamedSharding, PartitionSpec as _P
from .dispatch import _has_global, _implements, _on_mesh, GLOBAL
from .conversion import astype
from .manipulation import reshape, stack

__all__ = ["zeros", "ones", "empty", "full", "arange", "linspace", "eye", "identity", "tri", "array", "asarray",
           "zeros_like", "ones_like", "full_like", "empty_like"]


def _placement(device, out_sharding, op: str, shape):
    """The NamedSharding a creation function puts its result on (``out_sharding=`` or ``device=``
    a sharding), or None. JAX refuses both at once."""
    if device is not None and out_sharding is not None:
        raise ValueError(f"[{op}] pass only one of device= and out_sharding= (as jax.numpy)")
    want = out_sharding if out_sharding is not None else device
    if want is None or not isinstance(want, (_NamedSharding, _P)):
        if want is not None and not hasattr(want, "id"):
            raise TypeError(f"[{op}] device= must be a Device, a NamedSharding or (with set_mesh) a "
                            f"PartitionSpec, got {want!r}")
        return None  # a single device: shardlab's host array
    return GLOBAL["out_sharding"](want, op, len(shape), shape)


def _create(value, device, out_sharding, op: str):
    """A host value placed as JAX's creation functions place it."""
    value = np.asarray(value)
    sh = _placement(device, out_sharding, op, value.shape)
    if sh is not None:
        return _device_put(value, sh)
    return _on_mesh(value)


def _shape_arg(shape, op: str) -> tuple:
    if isinstance(shape, (ShardedArray, LocalArray)):
        raise TypeError(f"[{op}] shape must be an int or a tuple of ints, got an array of shape {shape.shape}; "
                        f"pass x.shape")
    try:
        return (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
    except TypeError:
        raise TypeError(f"[{op}] shape must be an int or a sequence of ints, got {shape!r}") from None


def _float_dtype(dtype):
    return _dt.default_float_dtype() if dtype is None else _dt.canonicalize_dtype(dtype)


def zeros(shape, dtype=None, *, device=None, out_sharding=None):
    """``jnp.zeros``: float32 by default (JAX's dtypes), placed with ``out_sharding=`` / ``device=``.

    Example:
        >>> import shardlab as sl, shardlab.numpy as jnp
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((2,), ("X",))
        >>> jnp.zeros((4, 2), device=sl.NamedSharding(mesh, P("X"))).sharding.spec, jnp.zeros(3).dtype
        (P('X',), dtype('float32'))
    """
    shape = _shape_arg(shape, "zeros")
    return _create(np.broadcast_to(np.zeros((), _float_dtype(dtype)), shape), device, out_sharding, "zeros")


def ones(shape, dtype=None, *, device=None, out_sharding=None):
    """``jnp.ones`` (see :func:`zeros`)."""
    shape = _shape_arg(shape, "ones")
    return _create(np.broadcast_to(np.ones((), _float_dtype(dtype)), shape), device, out_sharding, "ones")


def empty(shape, dtype=None, *, device=None, out_sharding=None):
    """``jnp.empty``: zeros, as in JAX."""
    return zeros(shape, dtype, device=device, out_sharding=out_sharding)


def full(shape, fill_value, dtype=None, *, device=None, out_sharding=None):
    """``jnp.full``: the fill value's JAX dtype (a Python int gives int32, a float float32)."""
    shape = _shape_arg(shape, "full")
    if isinstance(fill_value, ShardedArray):  # an array fill broadcasts, keeping its sharding (as JAX)
        v = fill_value if dtype is None else astype(fill_value, dtype)
        v = v if tuple(v.shape) == shape else GLOBAL[np.broadcast_to](v, shape)
        sh = _placement(device, out_sharding, "full", shape)
        return v if sh is None else GLOBAL["reshard"](v, sh)
    dt = _dt.result_type(fill_value) if dtype is None else _dt.canonicalize_dtype(dtype)
    value = np.broadcast_to(np.asarray(fill_value).astype(dt), shape)
    out = _create(value, device, out_sharding, "full")
    if dtype is None and type(fill_value) in (int, float, complex) and type(out) is HostArray:
        out = _as_host(out, weak=True)  # a Python scalar's weak type, as JAX's
    return out


def arange(start, stop=None, step=None, dtype=None, *, device=None, out_sharding=None):
    """``jnp.arange``: int32 for ints, float32 for floats (JAX's dtypes with x64 off)."""
    for v in (start, stop, step):
        if isinstance(v, (LocalArray, ShardedArray)):
            raise TypeError("[arange] start, stop and step must be concrete numbers (as in JAX's jit)")
    args = [v for v in (start, stop, step) if v is not None]
    dt = _dt.result_type(*args) if dtype is None else _dt.canonicalize_dtype(dtype)
    value = np.arange(start, stop, step) if stop is not None or step is not None else np.arange(start)
    return _create(value.astype(dt), device, out_sharding, "arange")


def linspace(start, stop, num=50, endpoint=True, retstep=False, dtype=None, axis=0, *, device=None):
    """``jnp.linspace``: float32 by default."""
    dt = _dt.to_inexact_dtype(_dt.result_type(start, stop)) if dtype is None else _dt.canonicalize_dtype(dtype)
    out = np.linspace(np.asarray(start, np.float64), np.asarray(stop, np.float64), num, endpoint=endpoint,
                      retstep=retstep, axis=axis)
    if retstep:
        return _create(out[0].astype(dt), device, None, "linspace"), np.asarray(out[1], dt)
    return _create(out.astype(dt), device, None, "linspace")


def eye(N, M=None, k=0, dtype=None, *, device=None):
    """``jnp.eye``: float32 by default."""
    return _create(np.eye(N, M, k, dtype=_float_dtype(dtype)), device, None, "eye")


def identity(n, dtype=None):
    """``jnp.identity``: float32 by default."""
    return _create(np.identity(n, dtype=_float_dtype(dtype)), None, None, "identity")


def tri(N, M=None, k=0, dtype=None):
    """``jnp.tri``: float32 by default."""
    return _create(np.tri(N, M, k, dtype=_float_dtype(dtype)), None, None, "tri")


def array(object, dtype=None, *args, copy=True, order="K", ndmin=0, device=None, out_sharding=None):  # noqa: A002
    """``jnp.array``: the value in JAX's canonical dtype (float64 -> float32, int64 -> int32 with
    x64 off), placed with ``device=`` / ``out_sharding=``; a ShardedArray keeps its sharding."""
    if isinstance(object, (ShardedArray, LocalArray)):
        x = object if dtype is None else astype(object, dtype)
        if ndmin and x.ndim < ndmin:
            x = reshape(x, (1,) * (ndmin - x.ndim) + tuple(x.shape))
        sh = _placement(device, out_sharding, "array", x.shape) if isinstance(x, ShardedArray) else None
        return x if sh is None else GLOBAL["reshard"](x, sh)
    if isinstance(object, (list, tuple)) and _has_global(object):
        return stack([asarray(o) for o in object]) if object else np.zeros((0,), np.float32)
    value = np.array(object, ndmin=ndmin)
    value = _dt.canonicalize(value, "array") if dtype is None else value.astype(_dt.canonicalize_dtype(dtype))
    out = _create(value, device, out_sharding, "array")
    if dtype is None and type(object) in (int, float, complex) and type(out) is HostArray:
        out = _as_host(out, weak=True)  # a Python scalar's weak type, as JAX's
    return out


def asarray(a, dtype=None, order=None, *, copy=None, device=None, out_sharding=None):
    """``jnp.asarray`` (see :func:`array`)."""
    return array(a, dtype, copy=bool(copy), device=device, out_sharding=out_sharding)


def _const_like(x: LocalArray, fill, dtype=None) -> LocalArray:
    """A constant with `x`'s storage shape (varying axes included), held once (stride 0)."""
    dt = _dt.canonicalize_dtype(x.dtype if dtype is None else dtype)
    if is_abstract(x.storage):
        return LocalArray(AbstractStorage(x.storage.shape, dt), x.mesh)
    return LocalArray(np.broadcast_to(np.full((), fill, dt), x.storage.shape), x.mesh)


def _like(name, x, fill, dtype, shape, device, out_sharding):
    if isinstance(x, LocalArray) and shape is None and device is None and out_sharding is None:
        return _const_like(x, fill, dtype)
    if isinstance(x, LocalArray):
        x = np.zeros(x.shape, x.dtype)
    dt = _dt.canonicalize_dtype(x.dtype if dtype is None else dtype) if hasattr(x, "dtype") else \
        (_dt.result_type(x) if dtype is None else _dt.canonicalize_dtype(dtype))
    shp = tuple(np.shape(x)) if shape is None else _shape_arg(shape, name)
    value = np.broadcast_to(np.asarray(fill).astype(dt), shp)
    if isinstance(x, ShardedArray) and device is None and out_sharding is None:
        # the input's sharding (JAX keeps it when the shape is the input's)
        if shape is None or shp == x.shape:
            return _device_put(value, x.sharding)
    return _create(value, device, out_sharding, name)


@_implements(np.zeros_like)
def zeros_like(a, dtype=None, shape=None, *, device=None, out_sharding=None):
    """``jnp.zeros_like``: a ShardedArray's zeros keep its sharding."""
    return _like("zeros_like", a, 0, dtype, shape, device, out_sharding)


@_implements(np.ones_like)
def ones_like(a, dtype=None, shape=None, *, device=None, out_sharding=None):
    return _like("ones_like", a, 1, dtype, shape, device, out_sharding)


@_implements(np.full_like)
def full_like(a, fill_value, dtype=None, shape=None, *, device=None, out_sharding=None):
    if isinstance(fill_value, (LocalArray, ShardedArray)):
        raise TypeError("[full_like] fill_value must be a scalar or host array here")
    if dtype is None and not hasattr(a, "dtype"):
        dtype = _dt.result_type(fill_value)
    return _like("full_like", a, fill_value, dtype, shape, device, out_sharding)


@_implements(np.empty_like)
def empty_like(prototype, dtype=None, shape=None, *, device=None):
    return zeros_like(prototype, dtype=dtype, shape=shape, device=device)
