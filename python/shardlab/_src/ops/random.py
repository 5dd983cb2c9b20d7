"""``jax.random`` on numpy: keys, split/fold_in and the samplers, bit-equal to JAX 0.10.2.

Each sampler follows JAX's ``jax/_src/random/core.py`` step by step on the bits of
:mod:`.prng` (threefry2x32, partitionable), with float32 arithmetic in JAX's order and XLA's
CPU transcendentals from :mod:`.random_math`, so ``shardlab.random.normal(key, shape)`` has the
same bits as ``jax.random.normal(key, shape)`` on an x86-64 CPU with FMA.

Where the output goes (JAX's rule for the samplers):

- no mesh set: a numpy array of JAX's dtype;
- ``out_sharding=`` (a NamedSharding, or a PartitionSpec with a mesh set): a ShardedArray with
  that sharding — the values are those of the unsharded draw, as JAX's partitionable threefry
  guarantees;
- under ``shardlab.set_mesh(mesh)`` without ``out_sharding``: a replicated ShardedArray;
- inside a shard_map body: the local value (a numpy array, or a LocalArray with one draw per
  device when the key itself differs between devices).

Example:
    >>> import shardlab as sl
    >>> key = sl.random.key(0)
    >>> sl.random.uniform(key).item()
    0.9476670026779175
"""

from __future__ import annotations

import math
import operator
import warnings
from collections.abc import Sequence

import ml_dtypes
import numpy as np

from ..arrays.host_array import as_host
from ..arrays.local_array import LocalArray
from ..arrays.sharded_array import ShardedArray, device_put
from ..core import dtypes as _dt
from ..core.context import CTX
from ..core.mesh import AxisType, get_mesh
from ..core.sharding import NamedSharding, PartitionSpec
from . import prng
from .random_math import erf32, erfinv32, fma32, log1p32, log32

f32 = np.float32
_SQRT2_32 = f32(np.sqrt(2))


# --- keys -------------------------------------------------------------------------------

def _arraylike(x) -> bool:
    return isinstance(x, (np.ndarray, np.generic, LocalArray, ShardedArray, int, float, complex, bool))


def _key_base(key, name: str, allow_batched: bool = False):
    """(key data, was_raw): numpy uint32 (..., 2) or a LocalArray, after JAX's checks."""
    if isinstance(key, prng.PRNGKeyArray):
        base, raw = key._base, False
    elif _arraylike(key):
        base = np.asarray(key) if isinstance(key, ShardedArray) else key
        prng._check_key_data(base, name)
        raw = True
    else:
        raise TypeError(f"unexpected PRNG key type {type(key)}")
    shape = tuple(base.shape[:-1])
    if not allow_batched and shape:
        raise ValueError(f"{name} accepts a single key, but was given a key array of shape "
                         f"{shape if not raw else tuple(base.shape)} != (). Use jax.vmap for batching.")
    return base, raw


def _check_impl(impl, name):
    if impl is None:
        return
    spec = getattr(impl, "name", None) or getattr(impl, "impl_name", None) or impl
    if isinstance(impl, prng.KeyTy) or spec == "threefry2x32":
        return
    if isinstance(impl, str):
        raise ValueError(f'unrecognized PRNG implementation "{impl}". Did you mean one of: "threefry2x32"? '
                         f"(shardlab has JAX's default PRNG only)")
    raise TypeError(f"unrecognized type {type(impl)} for specifying PRNG implementation.")


def _place_key(data: np.ndarray, raw: bool):
    """Key data out of key(), split() or fold_in(): typed or raw, placed as JAX places it."""
    if raw:
        return _place(data, None, "key")
    return prng.PRNGKeyArray(data)


def _seed(seed, name):
    if isinstance(seed, prng.PRNGKeyArray):
        raise TypeError(f"{name} accepts a scalar seed, but was given a PRNG key.")
    if np.ndim(seed):
        raise TypeError(f"{name} accepts a scalar seed, but was given an array of shape {np.shape(seed)} != (). "
                        "Use jax.vmap for batching")
    return prng.seed_data(seed)


def key(seed, *, impl=None, dtype=None):
    """A typed PRNG key (dtype ``key<fry>``, shape ()) from an integer seed (``jax.random.key``).

    With x64 off (JAX's default) only the seed's low 32 bits count, as in JAX.

    Example:
        >>> import shardlab as sl
        >>> k = sl.random.key(42)
        >>> k
        Array((), dtype=key<fry>) overlaying:
        [ 0 42]
    """
    if dtype is not None:
        if impl is not None:
            raise ValueError("Cannot specify both `impl` and `dtype` arguments to jax.random.key")
        impl = dtype
    _check_impl(impl, "key")
    return prng.PRNGKeyArray(_seed(seed, "key"))


def PRNGKey(seed, *, impl=None):
    """A legacy raw key: ``uint32[2]`` data ``[0, seed mod 2**32]`` (``jax.random.PRNGKey``).

    Example:
        >>> import shardlab as sl
        >>> sl.random.PRNGKey(7)
        Array([0, 7], dtype=uint32)
    """
    _check_impl(impl, "PRNGKey")
    return _place(_seed(seed, "PRNGKey"), None, "PRNGKey")


def _per_device(fn, base: LocalArray):
    """Runs `fn(key data uint32[2])` once per distinct key of a LocalArray key (inside shard_map)."""
    storage = np.asarray(base.storage)
    lead = storage.shape[:base.mesh.ndim]
    outs = [np.asarray(fn(storage[idx])) for idx in np.ndindex(*lead)]
    out = np.stack(outs).reshape(*lead, *outs[0].shape) if outs else np.zeros(lead)
    return LocalArray(out, base.mesh)


def split(key, num=2):
    """Splits a key into ``num`` new keys (``num`` an int or a shape), as ``jax.random.split``.

    A typed key gives a key array of shape ``(num,)``; a raw ``uint32[2]`` key gives
    ``uint32[num, 2]``.

    Example:
        >>> import shardlab as sl
        >>> sl.random.split(sl.random.PRNGKey(0)).tolist()
        [[1797259609, 2579123966], [928981903, 3453687069]]
    """
    base, raw = _key_base(key, "split")
    shape = tuple(num) if isinstance(num, Sequence) else (num,)
    shape = tuple(operator.index(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"split: num must be non-negative, got {num!r} (the new keys' shape would be {shape})")
    if isinstance(base, LocalArray):
        out = _per_device(lambda k: prng.split_data(k, shape), base)
        return out if raw else prng.PRNGKeyArray(out)
    return _place_key(prng.split_data(base, shape), raw)


def fold_in(key, data):
    """A new key from a key and a 32-bit integer, as ``jax.random.fold_in``.

    Example:
        >>> import shardlab as sl
        >>> sl.random.fold_in(sl.random.PRNGKey(0), 2).tolist()
        [4146024105, 2718843009]
    """
    base, raw = _key_base(key, "fold_in")
    if np.ndim(data):
        raise TypeError("fold_in accepts a scalar, but was given an array of"
                        f"shape {np.shape(data)} != (). Use jax.vmap for batching.")
    if isinstance(data, LocalArray):  # a per-device message inside shard_map (e.g. lax.axis_index)
        mesh = data.mesh
        words = np.asarray(data.storage).astype(np.int64).astype(np.uint32)
        kst = base.storage if isinstance(base, LocalArray) else np.reshape(base, (1,) * mesh.ndim + (2,))
        out = LocalArray(prng.fold_in_data(kst, words), mesh)
        return out if raw else prng.PRNGKeyArray(out)
    arr = np.asarray(data)
    if arr.dtype.kind in "iub" and arr.dtype.kind != "b":
        if int(arr) < 0 or int(arr) > 0xFFFFFFFF:
            raise OverflowError(f"Python integer {int(arr)} out of bounds for uint32")
        word = np.uint32(int(arr))
    elif arr.dtype.kind == "b":
        word = np.uint32(bool(arr))
    else:
        word = np.uint32(np.trunc(arr.astype(np.float64)).astype(np.int64) & 0xFFFFFFFF)
    if isinstance(base, LocalArray):
        out = _per_device(lambda k: prng.fold_in_data(k, word), base)
        return out if raw else prng.PRNGKeyArray(out)
    return _place_key(prng.fold_in_data(base, word), raw)


def key_data(keys):
    """The uint32 data under a key array, shape ``(*keys.shape, 2)`` (``jax.random.key_data``).

    Example:
        >>> import shardlab as sl
        >>> sl.random.key_data(sl.random.key(3)).tolist()
        [0, 3]
    """
    base, _ = _key_base(keys, "key_data", allow_batched=True)
    return base


def wrap_key_data(key_bits_array, *, impl=None, dtype=None):
    """A typed key array from uint32 data ``(..., 2)`` (``jax.random.wrap_key_data``).

    Example:
        >>> import numpy as np, shardlab as sl
        >>> sl.random.wrap_key_data(np.array([[0, 1], [0, 2]], np.uint32)).shape
        (2,)
    """
    if dtype is not None:
        if impl is not None:
            raise ValueError("Cannot specify both `impl` and `dtype` arguments to jax.random.wrap_key_data")
        impl = dtype
    _check_impl(impl, "wrap_key_data")
    data = np.asarray(key_bits_array) if isinstance(key_bits_array, ShardedArray) else key_bits_array
    prng._check_key_data(data, "wrap_key_data")
    return prng.PRNGKeyArray(data)


def key_impl(keys) -> str:
    """The PRNG implementation's name: ``"threefry2x32"`` (``jax.random.key_impl``)."""
    _key_base(keys, "key_impl", allow_batched=True)
    return "threefry2x32"


def key_dtype(impl_spec=None) -> prng.KeyTy:
    """The dtype of typed keys, ``key<fry>`` (``jax.random.key_dtype``)."""
    _check_impl(impl_spec, "key_dtype")
    return prng.KEY_DTYPE


def clone(key):
    """The same key (``jax.random.clone``: a no-op outside JAX's key-reuse checker)."""
    return key


# --- where outputs go ---------------------------------------------------------------------

def _all_auto(mesh) -> bool:
    return all(t == AxisType.Auto for t in mesh.axis_types)


def _as_sharding(out_sharding, name: str):
    """JAX's canonicalize_sharding for the samplers: a NamedSharding or None."""
    if out_sharding is None:
        return None
    if not isinstance(out_sharding, (NamedSharding, PartitionSpec)):
        raise TypeError(f"`out_sharding` argument of {name} only supports instances of `NamedSharding` or "
                        f"`PartitionSpec`. Got {out_sharding} of type: {type(out_sharding)}")
    mesh = get_mesh()
    if isinstance(out_sharding, PartitionSpec):
        if mesh is None:
            raise ValueError("Using PartitionSpec when you are not under a mesh context is not allowed. Please "
                             "pass a NamedSharding instance or enter into a mesh context via `jax.set_mesh`. "
                             f"Got {out_sharding!r} (in jax.random.{name})")
        out_sharding = NamedSharding(mesh, out_sharding)
    elif mesh is not None and out_sharding.mesh != mesh and not (_all_auto(mesh) and _all_auto(out_sharding.mesh)):
        raise ValueError(f"Context mesh {mesh!r} should match the mesh of sharding {out_sharding.mesh!r} passed to "
                         f"{name}.")
    sharding_mesh = out_sharding.mesh
    for entry in tuple(out_sharding.spec):
        for axis in (entry if isinstance(entry, tuple) else (entry,)):
            if axis is None:
                continue
            kind = sharding_mesh.axis_types[sharding_mesh.axis_names.index(axis)]
            if kind in (AxisType.Auto, AxisType.Manual):
                raise ValueError(f"PartitionSpec passed to {name} cannot contain axis names that are of type Auto "
                                 f"or Manual. Got PartitionSpec: {out_sharding.spec!r} with axis name: {axis} of "
                                 f"type: {kind}. (Make the mesh with axis_types=AxisType.Explicit, the default "
                                 "of make_mesh.)")
    return out_sharding


def _place(x, out_sharding, name: str):
    """Numpy result -> what JAX returns: numpy inside shard_map, a HostArray (JAX's Array on one
    device) with no mesh, or a ShardedArray."""
    sharding = _as_sharding(out_sharding, name)
    if CTX.meshes:  # a shard_map body: values are local
        if sharding is not None:
            raise ValueError(f"[random.{name}] out_sharding inside a shard_map body: the result is a per-device "
                             "value; drop out_sharding and give the sharding in out_specs")
        return x
    if sharding is None:
        mesh = get_mesh()
        if mesh is None:
            return as_host(x)
        # JAX: replicated, spelled P(None, ...) on an Explicit mesh and P() on an Auto one
        sharding = NamedSharding(mesh, PartitionSpec() if _all_auto(mesh) else
                                 PartitionSpec(*([None] * np.ndim(x))))
    else:
        spec = tuple(sharding.spec)
        if len(spec) < np.ndim(x):  # JAX spells the output's spec at full rank: P('x') -> P('x', None)
            sharding = NamedSharding(sharding.mesh, PartitionSpec(*spec, *([None] * (np.ndim(x) - len(spec)))))
    return device_put(np.asarray(x), sharding)


def _run(name, key, out_sharding, fn):
    """Checks the key, runs `fn(key data uint32[2])` and places the result."""
    base, _ = _key_base(key, name)
    if isinstance(base, LocalArray):
        _as_sharding(out_sharding, name)
        return _per_device(fn, base)
    return _place(fn(np.asarray(base)), out_sharding, name)


# --- dtypes and shapes --------------------------------------------------------------------

def _canon_dtype(dtype, default, name: str) -> np.dtype:
    """JAX's check_and_canonicalize_user_dtype: float64 -> float32 (with JAX's warning) when
    x64 is off."""
    if dtype is None or dtype in (float, int, bool):
        kind = {None: default, float: "float", int: "int", bool: "bool"}[dtype]
        return {"float": _dt.default_float_dtype, "int": _dt.default_int_dtype,
                "uint": _dt.default_uint_dtype, "bool": lambda: np.dtype(bool)}[kind]()
    if isinstance(dtype, (np.ndarray, ShardedArray, LocalArray)):
        raise ValueError("Passing an array as a dtype argument is no longer supported; instead of dtype=arr use "
                         "dtype=arr.dtype.")
    try:
        d = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"JAX only supports number, bool, and string dtypes, got dtype {dtype} in {name}") from None
    canon = _dt.canonicalize_dtype(d) if d.kind in "biuf" or d == _dt.bfloat16 else d
    if canon != d:
        warnings.warn(f"Explicitly requested dtype {d} requested in {name} is not available, and will be truncated "
                      f"to dtype {canon}. To enable more dtypes, set the jax_enable_x64 configuration option or the "
                      "JAX_ENABLE_X64 shell environment variable. See https://github.com/jax-ml/jax#current-gotchas "
                      "for more.", UserWarning, stacklevel=3)
    return canon


def _is_float(d) -> bool:
    return np.dtype(d).kind == "f" or np.dtype(d) == _dt.bfloat16


def _shape(shape) -> tuple:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    try:
        out = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise TypeError(f"Shapes must be 1D sequences of concrete values of integer type, got {shape!r}.") from None
    if any(s < 0 for s in out):
        raise TypeError(f"Shapes must be 1D sequences of integer scalars, got {shape} (negative dimensions)")
    return out


def _check_shape(name: str, shape: tuple, *param_shapes) -> None:
    if param_shapes:
        try:
            got = np.broadcast_shapes(shape, *param_shapes)
        except ValueError:
            raise ValueError(f"{name} parameter shapes must be broadcast-compatible with shape argument: shapes "
                             f"{[shape, *param_shapes]} do not broadcast") from None
        if got != shape:
            raise ValueError(f"{name} parameter shapes must be broadcast-compatible with shape argument, and the "
                             f"result of broadcasting the shapes must equal the shape argument, but got result "
                             f"{got} for shape argument {shape}.")


def _param(x, dtype=None):
    """A parameter as numpy: a ShardedArray gathered, Python scalars weakly typed."""
    if isinstance(x, ShardedArray):
        x = np.asarray(x)
    if isinstance(x, LocalArray):
        raise TypeError("random samplers inside shard_map take numpy (or Python) parameters; a per-device "
                        "LocalArray parameter is not supported")
    if np.asarray(x).dtype.kind not in "biufc" and np.asarray(x).dtype != _dt.bfloat16:
        raise TypeError(f"random sampler parameters must be numbers, got {x!r} of dtype {np.asarray(x).dtype}")
    if dtype is not None:
        with np.errstate(all="ignore"):
            return np.asarray(x).astype(dtype)
    return x


def _value_dtype(x) -> np.dtype:
    """JAX's dtype of a parameter value (Python scalars weak: float -> float32 with x64 off)."""
    if isinstance(x, bool):
        return np.dtype(bool)
    if isinstance(x, int):
        return _dt.default_int_dtype()
    if isinstance(x, float):
        return _dt.default_float_dtype()
    return _dt.canonicalize_dtype(np.asarray(x).dtype)


# --- bits and uniform ---------------------------------------------------------------------

def _bits(base, bit_width, shape):
    return prng.random_bits_data(base, bit_width, shape)


def bits(key, shape=(), dtype=None, *, out_sharding=None):
    """Uniform random bits as unsigned integers (``jax.random.bits``; default uint32).

    Example:
        >>> import shardlab as sl
        >>> sl.random.bits(sl.random.key(0), (3,)).tolist()
        [4070199207, 4202968722, 1427181096]
    """
    dtype = _canon_dtype(dtype, "uint", "bits")
    if dtype.kind != "u":
        raise ValueError(f"dtype argument to `bits` must be an unsigned int dtype, got {dtype}")
    shape = _shape(shape)
    return _run("bits", key, out_sharding, lambda k: _bits(k, dtype.itemsize * 8, shape))


def _floats01(base, shape, dtype):
    """JAX's [0, 1) floats: mantissa bits under the exponent of 1.0, minus 1."""
    info = ml_dtypes.finfo(dtype)
    nbits, nmant = info.bits, info.nmant
    rng_bits = 8 if nmant < 8 else nbits
    udt = prng.UINT_DTYPES[nbits]
    b = _bits(base, rng_bits, shape).astype(udt)
    one = np.array(1.0, dtype).view(udt)
    fb = (b >> udt.type(rng_bits - nmant)) | one
    return (fb.view(dtype) - np.array(1.0, dtype)).astype(dtype)


def _uniform(base, shape, dtype, minval, maxval):
    """``_uniform``: floats * (maxval - minval) + minval (one FMA on float32), then max(minval, .)."""
    lo = np.broadcast_to(_param(minval, dtype), shape) if np.ndim(minval) else _param(minval, dtype)
    hi = np.broadcast_to(_param(maxval, dtype), shape) if np.ndim(maxval) else _param(maxval, dtype)
    floats = _floats01(base, shape, dtype)
    with np.errstate(all="ignore"):
        span = (np.asarray(hi, dtype) - np.asarray(lo, dtype)).astype(dtype)
        if dtype == np.float32:
            v = fma32(floats, span, lo)
        else:  # float64 (x64), float16 and bfloat16: each op rounds to the dtype, no FMA
            v = ((floats * span).astype(dtype) + np.asarray(lo, dtype)).astype(dtype)
        out = np.maximum(np.asarray(lo, dtype), np.asarray(v, dtype).reshape(shape))
        out = np.where(np.isnan(v.reshape(shape)) | np.isnan(np.asarray(lo, dtype)), np.nan, out)
    return np.asarray(out, dtype)


def _float_dtype(dtype, name, what="a float"):
    dtype = _canon_dtype(dtype, "float", name)
    if not _is_float(dtype):
        raise ValueError(f"dtype argument to `{name}` must be {what} dtype, got {dtype}")
    return dtype


def uniform(key, shape=(), dtype=None, minval=0.0, maxval=1.0, *, out_sharding=None):
    """Uniform values in [minval, maxval) (``jax.random.uniform``).

    Example:
        >>> import shardlab as sl
        >>> sl.random.uniform(sl.random.key(0), (2,), minval=2.0, maxval=4.0).tolist()
        [3.895334005355835, 3.9571597576141357]
    """
    dtype = _float_dtype(dtype, "uniform")
    shape = _shape(shape)
    _check_shape("uniform", shape, np.shape(minval), np.shape(maxval))
    return _run("uniform", key, out_sharding, lambda k: _uniform(k, shape, dtype, minval, maxval))


# --- float samplers on uniform ------------------------------------------------------------

def _toward_zero(x: np.ndarray) -> np.ndarray:
    """np.nextafter(x, 0) for a nonzero value of any float dtype (bfloat16 included)."""
    udt = prng.UINT_DTYPES[x.dtype.itemsize * 8]
    return (x.view(udt) - udt.type(1)).view(x.dtype)


def _normal_real(base, shape, dtype):
    lo = _toward_zero(np.array(-1.0, dtype))
    u = _uniform(base, shape, dtype, lo, np.array(1.0, dtype))
    return (erfinv32(u.astype(f32)).astype(dtype) * np.asarray(_SQRT2_32, dtype)).astype(dtype)


def normal(key, shape=(), dtype=None, *, out_sharding=None):
    """Standard normal values (``jax.random.normal``): sqrt(2) * erf_inv(u), u uniform on
    (-1, 1), with XLA's float32 erf_inv bit for bit.

    Example:
        >>> import shardlab as sl
        >>> [round(float(v), 3) for v in sl.random.normal(sl.random.key(0), (3,))]
        [1.623, 2.025, -0.434]
    """
    shape = _shape(shape)
    cdtype = _canon_dtype(dtype, "float", "normal")
    if cdtype.kind == "c":  # JAX: two real draws from split keys, (re + 1j * im) / sqrt(2)
        if cdtype != np.complex64:
            raise NotImplementedError("normal with complex128 (x64 on) is not bit-matched in shardlab; use "
                                      "complex64")

        def draw_complex(k):
            k_re, k_im = prng.split_data(k, (2,))
            re = _normal_real(k_re, shape, np.dtype(f32)).astype(np.complex64)
            im = _normal_real(k_im, shape, np.dtype(f32)).astype(np.complex64)
            return ((re + np.complex64(1j) * im) / np.complex64(_SQRT2_32)).astype(np.complex64)
        return _run("normal", key, out_sharding, draw_complex)
    if not _is_float(cdtype):
        raise ValueError(f"dtype argument to `normal` must be a float or complex dtype, got {cdtype}")
    if cdtype == np.float64:
        raise NotImplementedError("normal with float64 (x64 on) is not bit-matched in shardlab (XLA's float64 "
                                  "erf_inv is another polynomial); use float32")
    return _run("normal", key, out_sharding, lambda k: _normal_real(k, shape, cdtype))


def _nextafter(x: np.ndarray, up: bool) -> np.ndarray:
    """np.nextafter(x, +-inf) for any float dtype (bfloat16 included)."""
    if x.dtype in (np.float32, np.float64, np.float16):
        return np.nextafter(x, np.array(np.inf if up else -np.inf, x.dtype)).astype(x.dtype)
    udt = prng.UINT_DTYPES[x.dtype.itemsize * 8]
    b = np.asarray(x).view(udt)
    away = np.signbit(x) != up  # moving away from zero: the magnitude grows
    out = np.where(away, b + udt.type(1), b - udt.type(1)).astype(udt)
    tiny = np.array(1 if up else (1 << (x.dtype.itemsize * 8 - 1)) | 1, udt)
    out = np.where(x == 0, tiny, out).astype(udt)
    out = np.where(np.isnan(x.astype(f32)) | np.isinf(x.astype(f32)), b, out).astype(udt)
    return out.view(x.dtype)


def _truncated_normal(base, lower, upper, shape, dtype):
    lower = np.asarray(_param(lower, dtype))
    upper = np.asarray(_param(upper, dtype))
    # XLA turns lower / sqrt(2) into lower * (1 / sqrt(2)), the reciprocal rounded to the dtype
    inv = (np.asarray(1, dtype) / np.asarray(_SQRT2_32, dtype)).astype(dtype)
    a = erf32((lower * inv).astype(dtype).astype(f32)).astype(dtype)
    b = erf32((upper * inv).astype(dtype).astype(f32)).astype(dtype)
    u = _uniform(base, shape, dtype, a, b)
    out = (np.asarray(_SQRT2_32, dtype) * erfinv32(u.astype(f32)).astype(dtype)).astype(dtype)
    lo = _nextafter(lower, True)
    hi = _nextafter(upper, False)
    with np.errstate(all="ignore"):
        return np.minimum(hi, np.maximum(lo, out)).astype(dtype)


def truncated_normal(key, lower, upper, shape=None, dtype=None, *, out_sharding=None):
    """Normal values truncated to (lower, upper) (``jax.random.truncated_normal``).

    Example:
        >>> import shardlab as sl
        >>> x = sl.random.truncated_normal(sl.random.key(0), -1.0, 1.0, (1000,))
        >>> bool((x > -1).all() and (x < 1).all())
        True
    """
    shape = None if shape is None else _shape(shape)
    dtype = _float_dtype(dtype, "truncated_normal")
    if dtype == np.float64:
        raise NotImplementedError("truncated_normal with float64 (x64 on) is not bit-matched in shardlab; use "
                                  "float32")
    if shape is None:
        shape = np.broadcast_shapes(np.shape(lower), np.shape(upper))
    else:
        _check_shape("truncated_normal", shape, np.shape(lower), np.shape(upper))
    return _run("truncated_normal", key, out_sharding, lambda k: _truncated_normal(k, lower, upper, shape, dtype))


def _uniform_from_tiny(k, shape, dtype):
    """``uniform(minval=finfo.tiny, maxval=1)`` inside JAX's jitted samplers: XLA folds it to
    ``max(floats, tiny)`` (equal to the formula's value in float32 and bfloat16; in float16 it
    is what XLA computes, where ``floats + tiny`` would differ)."""
    return np.maximum(_floats01(k, shape, dtype), np.asarray(ml_dtypes.finfo(dtype).tiny, dtype))


def _unary(name, fn, minval=0.0, maxval=1.0):
    def sampler(key, shape=(), dtype=None, *, out_sharding=None):
        dtype_ = _float_dtype(dtype, name)
        shape_ = _shape(shape)
        if dtype_ == np.float64:
            raise NotImplementedError(f"{name} with float64 (x64 on) is not bit-matched in shardlab; use float32")

        def draw(k):
            info = ml_dtypes.finfo(dtype_)
            if minval == "tiny":
                u = _uniform_from_tiny(k, shape_, dtype_)
            else:
                u = _uniform(k, shape_, dtype_, minval(info) if callable(minval) else minval, maxval)
            return fn(u, dtype_)
        return _run(name, key, out_sharding, draw)
    sampler.__name__ = name
    return sampler


# Each XLA op rounds to the sampler's dtype (float16 and bfloat16 ops run in float32 and round).
def _exp_fn(u, dt):
    return (-log1p32(-u.astype(f32))).astype(dt)


def _laplace_fn(u, dt):
    return (np.sign(u) * log1p32(-np.abs(u).astype(f32)).astype(dt)).astype(dt)


def _mid(x, dt):
    """An intermediate between two transcendentals, rounded to the dtype as XLA's op is."""
    return x.astype(dt)


def _logistic_fn(x, dt):
    return (_mid(log32(x.astype(f32)), dt) - _mid(log1p32(-x.astype(f32)), dt)).astype(dt)


def _gumbel_fn(u, dt):
    return (-log32(_mid(-log32(u.astype(f32)), dt).astype(f32))).astype(dt)


_exponential = _unary("exponential", _exp_fn)
_laplace = _unary("laplace", _laplace_fn, lambda i: -1.0 + float(i.epsneg), 1.0)
_logistic = _unary("logistic", _logistic_fn, "tiny", 1.0)
_gumbel_low = _unary("gumbel", _gumbel_fn, "tiny", 1.0)


def exponential(key, shape=(), dtype=None, *, out_sharding=None):
    """Exponential values, ``-log1p(-u)`` (``jax.random.exponential``).

    Example:
        >>> import shardlab as sl
        >>> bool((sl.random.exponential(sl.random.key(1), (100,)) >= 0).all())
        True
    """
    return _exponential(key, shape, dtype, out_sharding=out_sharding)


def laplace(key, shape=(), dtype=None, *, out_sharding=None):
    """Laplace values, ``sign(u) * log1p(-|u|)`` (``jax.random.laplace``).

    Example:
        >>> import shardlab as sl
        >>> sl.random.laplace(sl.random.key(1), (4,)).shape
        (4,)
    """
    return _laplace(key, shape, dtype, out_sharding=out_sharding)


def logistic(key, shape=(), dtype=None, *, out_sharding=None):
    """Logistic values, ``log(u) - log1p(-u)`` (``jax.random.logistic``).

    Example:
        >>> import shardlab as sl
        >>> sl.random.logistic(sl.random.key(1), (4,)).dtype
        dtype('float32')
    """
    return _logistic(key, shape, dtype, out_sharding=out_sharding)


def gumbel(key, shape=(), dtype=None, mode=None, *, out_sharding=None):
    """Gumbel values, ``-log(-log(u))`` (``jax.random.gumbel``; mode "low", JAX's default).

    Example:
        >>> import shardlab as sl
        >>> sl.random.gumbel(sl.random.key(1), (2, 3)).shape
        (2, 3)
    """
    if mode is None:
        mode = "low"
    if mode not in ("highest", "high", "low"):
        raise ValueError("Must provide valid mode for gumbel got: %s" % mode)
    if mode == "highest":
        raise NotImplementedError("gumbel(mode='highest') is not bit-matched in shardlab; use mode='high' or "
                                  "'low' (JAX's default)")
    if mode == "high":
        dtype_ = _float_dtype(dtype, "gumbel")
        shape_ = _shape(shape)
        return _run("gumbel", key, out_sharding, lambda k: _gumbel_high(k, shape_, dtype_))
    return _gumbel_low(key, shape, dtype, out_sharding=out_sharding)


def _gumbel_high(k, shape, dtype):
    """JAX's mode='high': two uniforms, the second filling the bits under the first's ulp."""
    info = ml_dtypes.finfo(dtype)
    high, low = _uniform(k, (2, *shape), dtype, 0.0, 1.0)
    small = ((high + (np.asarray(2.0 ** -info.nmant, dtype) * low).astype(dtype)).astype(dtype)
             + np.asarray(info.tiny, dtype)).astype(dtype)
    x = np.where(high >= np.asarray(0.5, dtype), high, small).astype(dtype)
    inner = log1p32(-x.astype(f32)).astype(dtype)
    return (-log32((-inner).astype(f32))).astype(dtype)


# --- integers and discrete ----------------------------------------------------------------

def _clip_convert(val: np.ndarray, dtype) -> np.ndarray:
    """``_convert_and_clip_integer``: clip to the target range, then convert."""
    dtype = np.dtype(dtype)
    lo = max(int(np.iinfo(dtype).min), int(np.iinfo(val.dtype).min))
    hi = min(int(np.iinfo(dtype).max), int(np.iinfo(val.dtype).max))
    return np.clip(val, np.array(lo).astype(val.dtype), np.array(hi).astype(val.dtype)).astype(dtype)


def _int_param(x, name):
    if isinstance(x, ShardedArray):
        x = np.asarray(x)
    if isinstance(x, (list, tuple)):
        raise TypeError(f"{name} requires ndarray or scalar arguments, got {type(x)} at position 0.")
    if isinstance(x, bool):
        arr = np.asarray(x)
    elif isinstance(x, int):
        dt = _dt.default_int_dtype()
        if not np.iinfo(dt).min <= x <= np.iinfo(dt).max:
            raise OverflowError(f"Python int {x} too large to convert to {dt}")
        arr = np.asarray(x, dt)
    elif isinstance(x, float):
        arr = np.asarray(x, _dt.default_float_dtype())
    else:
        arr = np.asarray(x)
        arr = arr.astype(_dt.canonicalize_dtype(arr.dtype)) if arr.dtype.kind in "biuf" else arr
    if arr.dtype.kind not in "iu":
        with np.errstate(all="ignore"):
            if arr.dtype.kind == "f" or arr.dtype == _dt.bfloat16:
                f = np.nan_to_num(np.trunc(arr.astype(np.float64)), nan=0.0)
                dt = _dt.default_int_dtype()
                arr = np.clip(f, np.iinfo(dt).min, np.iinfo(dt).max).astype(dt)
            elif arr.dtype.kind == "b":
                arr = arr.astype(_dt.default_int_dtype())
            elif arr.dtype.kind == "c":  # JAX's astype(int) drops the imaginary part
                arr = np.trunc(arr.real).astype(_dt.default_int_dtype())
            else:
                raise TypeError(f"{name}: minval and maxval must be integers or floats, got dtype {arr.dtype}")
    return arr


def _randint(base, shape, minval, maxval, dtype):
    dtype = np.dtype(dtype)
    nbits = dtype.itemsize * 8
    udt = prng.UINT_DTYPES[nbits]
    maxval_out_of_range = maxval > _clip_convert(np.array(np.iinfo(dtype).max, dtype), maxval.dtype)
    minval = _clip_convert(minval, dtype)
    maxval = _clip_convert(maxval, dtype)
    k1, k2 = prng.split_data(base, (2,))
    higher, lower = _bits(k1, nbits, shape), _bits(k2, nbits, shape)
    with np.errstate(all="ignore"):
        span = (maxval - minval).astype(udt)
        span = np.where(maxval <= minval, udt.type(1), span).astype(udt)
        span = np.where(maxval_out_of_range & (maxval > minval), span + udt.type(1), span).astype(udt)

        def rem(a, s):  # XLA: x % 0 == x
            a, s = np.broadcast_arrays(np.asarray(a, udt), np.asarray(s, udt))
            return np.where(s == 0, a, a % np.where(s == 0, udt.type(1), s)).astype(udt)
        mult = rem(udt.type(2 ** (nbits // 2)), span)
        mult = rem((mult * mult).astype(udt), span)
        off = rem((rem(higher, span) * mult).astype(udt) + rem(lower, span), span)
        return (np.broadcast_to(minval, shape) + off.astype(dtype)).astype(dtype)


def randint(key, shape, minval, maxval, dtype=None, *, out_sharding=None):
    """Uniform integers in [minval, maxval) (``jax.random.randint``; JAX's two-word modulus).

    Example:
        >>> import shardlab as sl
        >>> sl.random.randint(sl.random.key(0), (5,), 0, 10).tolist()
        [9, 0, 2, 3, 1]
    """
    dtype = _canon_dtype(dtype, "int", "randint")
    if dtype.kind not in "iu":
        raise TypeError(f"randint only accepts integer dtypes, got {dtype}")
    shape = _shape(shape)
    lo = _int_param(minval, "randint")
    hi = _int_param(maxval, "randint")
    _check_shape("randint", shape, lo.shape, hi.shape)
    sample_dtype = dtype
    if dtype.itemsize * 8 < 32:
        info = np.iinfo(dtype)
        sample_dtype = np.dtype("int32")
        lo = lo.astype("int32").clip(int(info.min), int(info.max))
        hi = hi.astype("int32").clip(int(info.min), int(info.max) + 1)
    return _run("randint", key, out_sharding,
                lambda k: _randint(k, shape, lo, hi, sample_dtype).astype(dtype))


def bernoulli(key, p=0.5, shape=None, mode="low", *, out_sharding=None):
    """Boolean samples, ``uniform(key, shape, p.dtype) < p`` (``jax.random.bernoulli``).

    Example:
        >>> import shardlab as sl
        >>> sl.random.bernoulli(sl.random.key(0), 0.5, (4,)).tolist()
        [False, False, True, True]
    """
    if shape is not None:
        shape = _shape(shape)
    if mode not in ("high", "low"):
        raise ValueError(f"got {mode=}, expected 'high' or 'low'")
    base, _ = _key_base(key, "bernoulli")
    dtype = _value_dtype(_param(p))
    if not _is_float(dtype):
        raise TypeError(f"bernoulli probability `p` must have a floating dtype, got {dtype}.")
    pv = _param(p, dtype)
    if shape is None:
        shape = np.shape(pv)
    else:
        _check_shape("bernoulli", shape, np.shape(pv))

    def draw(k):
        if mode == "high":
            u = _uniform(k, (2, *shape), dtype, 0.0, 1.0)
            u1, u2 = u[0], (u[1] * np.asarray(2.0 ** -ml_dtypes.finfo(dtype).nmant, dtype)).astype(dtype)
            return u2 < (pv - u1).astype(dtype)
        return _uniform(k, shape, dtype, 0.0, 1.0) < pv
    return _run("bernoulli", key, out_sharding, draw)


def rademacher(key, shape=(), dtype=None, *, out_sharding=None):
    """-1 or 1 with equal probability (``jax.random.rademacher``).

    Example:
        >>> import shardlab as sl
        >>> sl.random.rademacher(sl.random.key(0), (4,)).tolist()
        [-1, -1, 1, 1]
    """
    dtype = _canon_dtype(dtype, "int", "rademacher")
    shape = _shape(shape)

    def draw(k):
        b = _uniform(k, shape, f32, 0.0, 1.0) < f32(0.5)
        return (2 * b.astype(dtype) - 1).astype(dtype)
    return _run("rademacher", key, out_sharding, draw)


def _shuffle(base, x: np.ndarray, axis: int) -> np.ndarray:
    exponent = 3
    uint32max = np.iinfo(np.uint32).max
    num_rounds = int(np.ceil(exponent * np.log(max(1, x.size)) / np.log(uint32max)))
    for _ in range(num_rounds):
        base, sub = prng.split_data(base, (2,))
        sort_keys = _bits(sub, 32, x.shape)
        order = np.argsort(sort_keys, axis=axis, kind="stable")
        x = np.take_along_axis(x, order, axis=axis)
    return x


def _norm_axis(axis, ndim, name):
    try:
        axis = operator.index(axis)
    except TypeError:
        raise TypeError(f"{name}: axis must be an integer, got {axis!r}") from None
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of bounds for array of dimension {ndim}")
    return axis % ndim


def permutation(key, x, axis=0, independent=False, *, out_sharding=None):
    """A random permutation of ``arange(x)`` or of ``x`` along ``axis`` (``jax.random.permutation``;
    JAX's sort by random 32-bit keys, stable).

    Example:
        >>> import shardlab as sl
        >>> sl.random.permutation(sl.random.key(0), 5).tolist()
        [0, 1, 4, 3, 2]
    """
    base, _ = _key_base(key, "permutation")
    x = _param(x)
    if isinstance(x, (list, tuple)):
        raise TypeError(f"permutation requires ndarray or scalar arguments, got {type(x)} at position 0.")
    axis = _norm_axis(axis, np.ndim(x) or 1, "permutation")
    if not np.ndim(x):
        if np.asarray(x).dtype.kind not in "iu":
            raise TypeError("x must be an integer or at least 1-dimensional")
        arr = np.arange(int(x), dtype=_dt.default_int_dtype())
        return _run("permutation", key, out_sharding, lambda k: _shuffle(k, arr, axis))
    arr = np.asarray(x)
    arr = arr.astype(_dt.canonicalize_dtype(arr.dtype)) if arr.dtype.kind in "biuf" else arr

    def draw(k):
        if independent or arr.ndim == 1:
            return _shuffle(k, arr, axis)
        ind = _shuffle(k, np.arange(arr.shape[axis], dtype=_dt.default_int_dtype()), 0)
        return np.take(arr, ind, axis=axis)
    return _run("permutation", key, out_sharding, draw)


def _top_k_indices(g, k):
    """lax.top_k's indices along the last axis: largest first, ties by lower index."""
    order = np.argsort(-g, axis=-1, kind="stable")
    nan_first = np.argsort(~np.isnan(g), axis=-1, kind="stable") if np.isnan(g).any() else None
    if nan_first is not None:
        order = nan_first  # NaN counts as the largest in XLA's total order
    return order[..., :k]


def choice(key, a, shape=(), replace=True, p=None, axis=0, mode=None):
    """Random samples from ``a`` (or ``arange(a)``), with or without replacement, optionally
    weighted by ``p`` (``jax.random.choice``).

    Example:
        >>> import shardlab as sl
        >>> sl.random.choice(sl.random.key(0), 10, (3,), replace=False).tolist()
        [0, 1, 8]
    """
    base, _ = _key_base(key, "choice")
    if not isinstance(shape, Sequence):
        raise TypeError(f"shape argument of jax.random.choice must be a sequence, got {shape}")
    a = _param(a)
    if isinstance(a, (list, tuple)):
        raise TypeError(f"choice requires ndarray or scalar arguments, got {type(a)} at position 0.")
    arr = np.asarray(a)
    arr = arr.astype(_dt.canonicalize_dtype(arr.dtype)) if arr.dtype.kind in "biuf" else arr
    if arr.ndim == 0:
        n_inputs = int(arr)
        arr = np.asarray(a, _dt.default_int_dtype()) if isinstance(a, int) else arr
    else:
        axis = _norm_axis(axis, arr.ndim, "choice")
        n_inputs = arr.shape[axis]
    shape = tuple(shape)
    n_draws = math.prod(shape)
    if n_draws == 0:
        return _place(np.zeros(shape, dtype=arr.dtype), None, "choice")
    if n_inputs <= 0:
        raise ValueError("a must be greater than 0 unless no samples are taken")
    if not replace and n_draws > n_inputs:
        raise ValueError(f"Cannot take a larger sample (size {n_draws}) than population (size {n_inputs}) when "
                         "'replace=False'")
    int_dt = _dt.default_int_dtype()

    def draw(k):
        if p is None:
            if replace:
                lo, hi = np.asarray(0, int_dt), np.asarray(n_inputs, int_dt)
                ind = _randint(k, shape, lo, hi, int_dt)
                result = ind if arr.ndim == 0 else np.take(arr, ind, axis=axis)
            else:
                src = np.arange(n_inputs, dtype=int_dt) if arr.ndim == 0 else arr
                perm = _permute_for_choice(k, src, axis)
                result = perm[(slice(None),) * axis + (slice(n_draws),)]
        else:
            p_arr = np.asarray(_param(p))
            p_arr = p_arr.astype(_dt.to_inexact_dtype(_dt.canonicalize_dtype(p_arr.dtype)))
            if p_arr.shape != (n_inputs,):
                raise ValueError("p must be None or a 1D vector with the same size as a.shape[axis]. "
                                 f"p has shape {p_arr.shape} and a.shape[axis] is {n_inputs}.")
            if replace:
                p_cuml = np.cumsum(p_arr, dtype=p_arr.dtype)
                u = _uniform(k, shape, p_arr.dtype, 0.0, 1.0)
                r = (p_cuml[-1] * (np.asarray(1, p_arr.dtype) - u).astype(p_arr.dtype)).astype(p_arr.dtype)
                ind = np.searchsorted(p_cuml, r, side="left").astype(int_dt)
            else:
                g = _gumbel_draw(k, (n_inputs,), p_arr.dtype, mode) + log32(p_arr).astype(p_arr.dtype)
                ind = _top_k_indices(g.astype(p_arr.dtype), n_draws).astype(int_dt)
            result = ind if arr.ndim == 0 else np.take(arr, ind, axis=axis)
        return np.asarray(result).reshape(shape if arr.ndim == 0 else
                                          arr.shape[0:axis] + tuple(shape) + arr.shape[axis + 1:])
    return _run("choice", key, None, draw)


def _permute_for_choice(k, src, axis):
    if src.ndim == 1:
        return _shuffle(k, src, axis)
    ind = _shuffle(k, np.arange(src.shape[axis], dtype=_dt.default_int_dtype()), 0)
    return np.take(src, ind, axis=axis)


def _gumbel_draw(k, shape, dtype, mode=None):
    mode = mode or "low"
    if mode == "high":
        return _gumbel_high(k, shape, dtype)
    if mode != "low":
        raise NotImplementedError(f"mode={mode!r} is not bit-matched in shardlab; use 'high' or 'low'")
    return _gumbel_fn(_uniform_from_tiny(k, shape, dtype), dtype)


def categorical(key, logits, axis=-1, shape=None, replace=True, mode=None, *, out_sharding=None):
    """Samples from categorical distributions given logits, by the Gumbel max (or top-k)
    trick (``jax.random.categorical``).

    Example:
        >>> import numpy as np, shardlab as sl
        >>> sl.random.categorical(sl.random.key(0), np.log([0.1, 0.2, 0.7]), shape=(5,)).tolist()
        [1, 2, 2, 1, 2]
    """
    base, _ = _key_base(key, "categorical")
    logits_arr = np.asarray(_param(logits))
    if logits_arr.dtype.kind in "iub":
        logits_arr = logits_arr.astype(_dt.default_float_dtype())
    else:
        logits_arr = logits_arr.astype(_dt.canonicalize_dtype(logits_arr.dtype))
    if not _is_float(logits_arr.dtype):
        raise TypeError(f"categorical: logits must be floats, got {logits_arr.dtype}")
    axis = _norm_axis(axis, logits_arr.ndim, "categorical")
    batch_shape = tuple(np.delete(logits_arr.shape, axis))
    if shape is None:
        shape = batch_shape
    else:
        shape = _shape(shape)
        _check_shape("categorical", shape, batch_shape)
    dtype = logits_arr.dtype
    shape_prefix = shape[:len(shape) - len(batch_shape)]

    def draw(k):
        if replace:
            logits_shape = list(shape[len(shape) - len(batch_shape):])
            logits_shape.insert(axis, logits_arr.shape[axis])
            g = _gumbel_draw(k, (*shape_prefix, *logits_shape), dtype, mode)
            x = (g + logits_arr.reshape((1,) * len(shape_prefix) + logits_arr.shape)).astype(dtype)
            return np.argmax(x, axis=len(shape_prefix) + axis).astype(_dt.default_int_dtype())
        x = (logits_arr + _gumbel_draw(k, logits_arr.shape, dtype, mode)).astype(dtype)
        kk = math.prod(shape_prefix)
        if kk > logits_arr.shape[axis]:
            raise ValueError(f"Number of samples without replacement ({kk}) cannot exceed number of categories "
                             f"({logits_arr.shape[axis]}).")
        ind = _top_k_indices(np.moveaxis(x, axis, -1), kk).astype(_dt.default_int_dtype())
        return np.moveaxis(ind, -1, 0).reshape(shape)
    return _run("categorical", key, out_sharding, draw)


# --- built on normal ----------------------------------------------------------------------

def multivariate_normal(key, mean, cov, shape=None, dtype=None, method="cholesky", *, out_sharding=None):
    """Multivariate normal values ``mean + factor @ normal`` (``jax.random.multivariate_normal``).

    The normal draw has JAX's bits; the factor (numpy's Cholesky, SVD or eigh) and the product
    agree with JAX to float32 rounding, not bit for bit.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> sl.random.multivariate_normal(sl.random.key(0), np.zeros(2), np.eye(2), (3,)).shape
        (3, 2)
    """
    base, _ = _key_base(key, "multivariate_normal")
    if method not in {"svd", "eigh", "cholesky"}:
        raise ValueError("method must be one of {'svd', 'eigh', 'cholesky'}")
    mean = np.asarray(_param(mean))
    cov = np.asarray(_param(cov))
    inexact = _dt.to_inexact_dtype(_dt.promote_types(_dt.canonicalize_dtype(mean.dtype),
                                                     _dt.canonicalize_dtype(cov.dtype)))
    mean, cov = mean.astype(inexact), cov.astype(inexact)
    dtype = inexact if dtype is None else _float_dtype(dtype, "multivariate_normal")
    if mean.ndim < 1:
        raise ValueError(f"multivariate_normal requires mean.ndim >= 1, got mean.ndim == {mean.ndim}")
    if cov.ndim < 2:
        raise ValueError(f"multivariate_normal requires cov.ndim >= 2, got cov.ndim == {cov.ndim}")
    n = mean.shape[-1]
    if cov.shape[-2:] != (n, n):
        raise ValueError(f"multivariate_normal requires cov.shape == (..., n, n) for n={n}, but got "
                         f"cov.shape == {cov.shape}.")
    if shape is None:
        shape = np.broadcast_shapes(mean.shape[:-1], cov.shape[:-2])
    else:
        shape = _shape(shape)
        _check_shape("normal", shape, mean.shape[:-1], cov.shape[:-2])

    def draw(k):
        c64 = cov.astype(np.float64)
        if method == "svd":
            u, s, _ = np.linalg.svd(c64)
            factor = u * np.sqrt(s[..., None, :])
        elif method == "eigh":
            w, v = np.linalg.eigh(c64)
            factor = v * np.sqrt(w[..., None, :])
        else:
            factor = np.linalg.cholesky(c64)
        z = _normal_real(k, shape + mean.shape[-1:], dtype)
        return (mean + np.einsum("...ij,...j->...i", factor, z)).astype(dtype)
    return _run("multivariate_normal", key, out_sharding, draw)


def orthogonal(key, n, shape=(), dtype=None, m=None, *, out_sharding=None):
    """A random (semi-)orthogonal matrix, QR of a normal draw (``jax.random.orthogonal``).

    The normal draw has JAX's bits; the QR (numpy's LAPACK) agrees to float32 rounding.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> q = sl.random.orthogonal(sl.random.key(0), 3)
        >>> bool(np.allclose(q @ q.T, np.eye(3), atol=1e-5))
        True
    """
    base, _ = _key_base(key, "orthogonal")
    shape = _shape(shape)
    dtype = _float_dtype(dtype, "orthogonal")
    n = operator.index(n)
    m_ = n if m is None else operator.index(m)

    def draw(k):
        z = _normal_real(k, (*shape, max(n, m_), min(n, m_)), dtype)
        q, r = np.linalg.qr(z.astype(np.float64))
        d = np.diagonal(r, axis1=-2, axis2=-1)
        x = (q * np.expand_dims(np.sign(d), -2)).astype(dtype)
        return np.swapaxes(x, -1, -2) if n < m_ else x
    return _run("orthogonal", key, out_sharding, draw)


def _not_matched(name, instead):
    def fn(key, *args, **kwargs):
        raise NotImplementedError(
            f"jax.random.{name} is not in shardlab.random: JAX draws it with a per-element rejection loop whose "
            f"bits shardlab does not reproduce. {instead}")
    fn.__name__ = name
    fn.__doc__ = f"Not available (raises NotImplementedError): {instead}"
    return fn


gamma = _not_matched("gamma", "Run jax.random.gamma in JAX and pass the values in, or use exponential() "
                     "(gamma with a=1).")
loggamma = _not_matched("loggamma", "Run jax.random.loggamma in JAX and pass the values in.")
beta = _not_matched("beta", "Run jax.random.beta in JAX and pass the values in, or use uniform() (beta(1, 1)).")
dirichlet = _not_matched("dirichlet", "Run jax.random.dirichlet in JAX and pass the values in.")
poisson = _not_matched("poisson", "Run jax.random.poisson in JAX and pass the values in.")
