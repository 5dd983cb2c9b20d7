"""HostArray: an array on one device (device 0), as JAX's single-device ``jax.Array``.

``shardlab.numpy`` on host data (no mesh set), ``shardlab.random`` without a mesh and
``device_put(x)`` / ``device_put(x, device)`` give one. It is a numpy array (a subclass of
``np.ndarray``), so everything that takes numpy arrays keeps taking it, and ``np.asarray(h)``
gives the plain ndarray. On top of numpy it behaves as JAX's Array on one device:

* ``.sharding`` (``SingleDeviceSharding`` of device 0), ``.device``, ``.devices()``,
  ``.addressable_shards`` / ``.global_shards`` (one Shard), ``.addressable_data(0)``,
  ``.block_until_ready()`` (returns the array), ``.copy_to_host_async()``,
  ``.is_fully_replicated``, ``.is_fully_addressable``, ``.committed`` (False as made by
  ``shardlab.numpy``, True after ``device_put(x, device)``), ``.weak_type``;
* JAX's repr (``Array([0, 1, 2], dtype=int32)``) and str (numpy's);
* arithmetic and numpy ufuncs with jax.numpy's dtype rules (``int32 * np.float64(2.0)`` is
  float32; reductions give int32 / float32 where numpy gives int64 / float64), results are
  HostArrays, scalars come back as 0-d arrays (as JAX's ``x[0]``);
* ``x.at[idx].set/add/subtract/multiply/divide/power/min/max/apply/get`` with JAX's semantics
  (repeated indices accumulate, out-of-bounds updates are dropped and out-of-bounds gathers
  clamp); in-place item assignment raises TypeError, as JAX's arrays are immutable.

Example:
    >>> import numpy as np, shardlab.numpy as jnp
    >>> x = jnp.arange(3)
    >>> x
    Array([0, 1, 2], dtype=int32)
    >>> x.block_until_ready() is x, x.sharding, x.committed
    (True, SingleDeviceSharding(device=VirtualDevice(id=0), memory_kind=device), False)
    >>> x * np.float64(2.0), x.at[0].add(5)
    (Array([0., 2., 4.], dtype=float32), Array([5, 1, 2], dtype=int32))
    >>> type(np.asarray(x)) is np.ndarray, isinstance(x, np.ndarray)
    (True, True)
"""

from __future__ import annotations

import numpy as np

from ..core import dtypes as _dt
from ..core.mesh import devices as _devices
from ..core.sharding import SingleDeviceSharding
from .computed import ComputedArray
from .index_update import IndexOps, at_property
from .shard import Shard

_host_ufunc = None   # fn(np_ufunc, args, dtype, kwargs) -> ndarray: register_host_ufunc


def register_host_ufunc(fn) -> None:
    """``fn(np_ufunc, args, dtype, kwargs) -> ndarray`` runs numpy ufuncs on HostArrays with
    jax.numpy's dtype rules; ``ops/numpy/elementwise.py`` registers it beside its definition."""
    global _host_ufunc
    _host_ufunc = fn

_SCALARS = (int, float, complex, bool)


class HostArray(ComputedArray, np.ndarray):
    """A numpy array that is also JAX's ``Array`` on one device (see the module docstring).

    Make one with :func:`as_host` (or ``shardlab.numpy.asarray``); ``HostArray(...)`` itself is
    numpy's ``ndarray`` constructor.
    """

    _weak = False
    _committed = False
    _device = None  # None: device 0

    def __array_finalize__(self, obj):
        if obj is not None:  # views (reshape, x[i:j], .T) keep the weak type and placement
            self._weak = getattr(obj, "_weak", False)
            self._committed = getattr(obj, "_committed", False)
            self._device = getattr(obj, "_device", None)

    # -- numpy protocols -------------------------------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """numpy ufuncs (``+``, ``np.sin``, ``np.sum``'s ``add.reduce``, ...) with jax.numpy's
        dtypes; other array types (ShardedArray, LocalArray) take the operation over."""
        for v in inputs:
            if not isinstance(v, (np.ndarray, np.generic, *_SCALARS)):
                return NotImplemented
        out = kwargs.get("out")
        if out is not None:  # numpy's own in-place use (np.mean's division into its sum, ...)
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, HostArray) else o for o in out)
            with np.errstate(all="ignore"):
                getattr(ufunc, method)(*[_plain(v) for v in inputs], **kwargs)
            return out[0] if len(out) == 1 else out
        committed = any(getattr(v, "_committed", False) for v in inputs)
        device = next((v._device for v in inputs if isinstance(v, HostArray) and v._committed), None)
        if ufunc is np.matmul and method == "__call__" and not kwargs:  # ``a @ b``: JAX's promotion
            dtype = _dt.result_type(*inputs)
            res = np.matmul(*[np.asarray(_plain(v), dtype) for v in inputs])
            return as_host(_dt.canonicalize(res, "matmul"), committed=committed, device=device)
        if method == "__call__" and _host_ufunc is not None:
            dtype = kwargs.pop("dtype", None)
            kwargs.pop("subok", None)
            res = _host_ufunc(ufunc, [_operand(v) for v in promote_weak(inputs)], dtype, kwargs)
            weak = dtype is None and weak_result(inputs, res)
        else:
            with np.errstate(all="ignore"):
                res = getattr(ufunc, method)(*[_plain(v) for v in inputs], **kwargs)
            weak = False
        if isinstance(res, tuple):
            return tuple(as_host(_dt.canonicalize(r, ufunc.__name__), committed=committed, device=device)
                         for r in res)
        return as_host(_dt.canonicalize(res, ufunc.__name__), weak=weak, committed=committed, device=device)

    def __array_function__(self, func, types, args, kwargs):
        """numpy's functions (``np.roll(x)``, ``np.concatenate``, ...) see plain ndarrays and give
        them, as they do on JAX's arrays (``shardlab.numpy``'s functions give HostArrays)."""
        return func(*_plain_tree(args), **_plain_tree(kwargs))

    def __array_wrap__(self, arr, context=None, return_scalar=False):
        # numpy functions built on ndarray methods (np.sort, np.cumsum, ...): a HostArray, also for
        # a 0-d result (JAX gives 0-d Arrays, never numpy scalars)
        out = np.asarray(arr).view(HostArray)
        out._committed = self._committed
        return out

    def __getitem__(self, key):
        res = super().__getitem__(_plain_key(key))
        if isinstance(res, np.generic):
            res = as_host(res, weak=self._weak, committed=self._committed)
        return res

    def __setitem__(self, key, value):
        raise TypeError("JAX arrays are immutable and do not support in-place item assignment. Instead "
                        "of x[idx] = y, use x = x.at[idx].set(y) or another .at[] method: "
                        "https://docs.jax.dev/en/latest/_autosummary/jax.numpy.ndarray.at.html")

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        for i in range(self.shape[0]):
            yield self[i]

    def __reduce__(self):  # pickles (and deep-copies) as a HostArray with its flags
        fn, args, state = super().__reduce__()
        return _rebuild, (fn, args, state, self._weak, self._committed, self._device)

    def astype(self, dtype, order="K", casting="unsafe", subok=True, copy=True):
        """``x`` in `dtype`, canonicalized as JAX's (float64 is float32 with x64 off)."""
        out = np.asarray(self).astype(_dt.canonicalize_dtype(dtype), order=order, casting=casting)
        return as_host(out, committed=self._committed)

    # -- jax.Array -------------------------------------------------------------------------
    @property
    def weak_type(self) -> bool:
        """Whether the dtype is weak, as JAX's (an array made from a Python scalar)."""
        return bool(self._weak)

    @property
    def sharding(self) -> SingleDeviceSharding:
        """``SingleDeviceSharding`` of device 0: the one device a host array lives on."""
        return SingleDeviceSharding(self.device)

    @property
    def device(self):
        """The device holding the array (device 0 unless ``device_put`` named another)."""
        return _devices()[0] if self._device is None else self._device

    def devices(self) -> set:
        """The set of the one device."""
        return {self.device}

    @property
    def committed(self) -> bool:
        """Whether the array was placed on its device explicitly (``device_put(x, device)``), as
        JAX's: arrays from ``shardlab.numpy`` and ``device_put(x)`` are uncommitted."""
        return bool(self._committed)

    @property
    def is_fully_replicated(self) -> bool:
        """True: the one device holds the whole array."""
        return True

    @property
    def addressable_shards(self) -> list:
        """One Shard: the whole array on device 0."""
        return [Shard(self.device, (slice(None),) * self.ndim, self, 0)]

    @property
    def global_shards(self) -> list:
        """The one shard (as :attr:`addressable_shards`)."""
        return self.addressable_shards

    def addressable_data(self, index: int) -> "HostArray":
        """The data on device `index` (0: the array itself)."""
        if index != 0:
            raise IndexError(f"[addressable_data] index {index} is outside the 1 device of a single-device array")
        return self

    def __repr__(self):
        """JAX's repr of a single-device array: ``Array([0., 1.], dtype=float32)``."""
        dtype_str = f"dtype={self.dtype.name}" + (", weak_type=True" if self._weak else "")
        prefix = "Array("
        width = np.get_printoptions()["linewidth"]
        if self.size == 0:
            body = f"[], shape={self.shape}"
        else:
            body = np.array2string(np.asarray(self), prefix=prefix, suffix=",", separator=", ",
                                   max_line_width=width)
        last_line_len = len(body) - body.rfind("\n") + 1
        sep = " " * len(prefix) if last_line_len + len(dtype_str) + 2 > width else " "
        return f"{prefix}{body},{sep}{dtype_str})"

    def __str__(self):
        """The values only, as ``str`` of a jax.Array (numpy's str)."""
        return str(np.asarray(self))


def _index_method(name: str):
    """An ndarray method giving indices (int64 in numpy) in JAX's int32, as a HostArray."""
    np_method = getattr(np.ndarray, name)

    def method(self, *args, **kwargs):
        res = np_method(self.view(np.ndarray), *_plain_tree(args), **_plain_tree(kwargs))
        if isinstance(res, tuple):
            return tuple(as_host(_dt.canonicalize(r, name), committed=self._committed, device=self._device)
                         for r in res)
        return as_host(_dt.canonicalize(res, name), committed=self._committed, device=self._device)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"``x.{name}(...)`` as numpy's, the indices in JAX's int32."
    return method


for _name in ("argmax", "argmin", "argsort", "argpartition", "nonzero", "searchsorted"):
    setattr(HostArray, _name, _index_method(_name))
del _name


def _rebuild(fn, args, state, weak, committed, device):
    out = fn(*args)
    out.__setstate__(state)
    out._weak, out._committed, out._device = weak, committed, device
    return out


def as_host(value, *, weak: bool = False, committed: bool = False, device=None) -> HostArray:
    """`value` (a numpy array or scalar) as a HostArray (a view: no copy for an ndarray) on
    `device` (None: device 0)."""
    out = np.asarray(value).view(HostArray)
    out._weak = bool(weak)
    out._committed = bool(committed)
    out._device = device
    return out


def weak_result(inputs, res) -> bool:
    """Whether an elementwise result is weakly typed, as JAX's: its operands promote to a weak
    type (only weak operands, or a weak float with integers); the op keeps it (``sin`` of a
    weak int is a weak float, a comparison of weak values a weak bool)."""
    try:
        _, weak = _dt.result_type(*inputs, return_weak_type_flag=True)
    except (TypeError, ValueError):
        return False
    return bool(weak)


def promote_weak(args) -> list:
    """`args` with each weakly typed n-d HostArray converted to the operands' promoted dtype (a
    weak array gives way to the other operands' dtype, as a Python scalar does: a weak float32
    array plus a float16 array is float16); 0-d ones go as their Python scalar."""
    if not any(isinstance(v, HostArray) and v._weak and v.ndim for v in args):
        return list(args)
    try:
        target = _dt.result_type(*args)
    except (TypeError, ValueError):
        return list(args)
    return [as_host(np.asarray(v).astype(target)) if isinstance(v, HostArray) and v._weak and v.ndim else v
            for v in args]


def _plain(v):
    return v.view(np.ndarray) if isinstance(v, HostArray) else v


def _operand(v):
    """A ufunc operand for shardlab.numpy's host path: plain numpy, a weak 0-d array as the
    Python scalar it stands for (so it keeps promoting as one)."""
    if isinstance(v, HostArray):
        if v._weak and v.ndim == 0:
            return v.item()
        return v.view(np.ndarray)
    return v


def _plain_tree(v):
    if isinstance(v, HostArray):
        return v.view(np.ndarray)
    if type(v) in (tuple, list):
        return type(v)(_plain_tree(e) for e in v)
    if type(v) is dict:
        return {k: _plain_tree(e) for k, e in v.items()}
    return v


def _plain_key(key):
    if isinstance(key, HostArray):
        return key.view(np.ndarray)
    if isinstance(key, tuple):
        return tuple(_plain_key(k) for k in key)
    return key


# -- .at[] -----------------------------------------------------------------------------------------
def _is_int_index(k) -> bool:
    return isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)) or \
        (isinstance(k, np.ndarray) and k.dtype.kind in "iu")


def _normalized(key, shape: tuple, mode: str) -> tuple:
    """(`key` as a tuple whose integer indices are in bounds, the dims they index): negatives
    wrapped, then out-of-bounds ones clamped (``mode="clip"``) or pointed at one past the end
    (``"drop"``: the caller pads those dims by one so such updates land outside the result)."""
    key = key if isinstance(key, tuple) else (key,)
    key = tuple(np.asarray(k) if isinstance(k, (list, np.ndarray)) else k for k in key)
    key = tuple(k.view(np.ndarray) if isinstance(k, HostArray) else k for k in key)
    used = sum(k.ndim if isinstance(k, np.ndarray) and k.dtype == bool else 0 if k is None or k is Ellipsis else 1
               for k in key)
    out, dim, int_dims = [], 0, []
    for k in key:
        if k is Ellipsis:
            out.append(k)
            dim += len(shape) - used
            continue
        if k is None:
            out.append(k)
            continue
        if isinstance(k, np.ndarray) and k.dtype == bool:
            out.append(k)
            dim += k.ndim
            continue
        if dim >= len(shape):
            raise IndexError(f"[.at[]] too many indices for an array of shape {shape}")
        if _is_int_index(k):
            n = shape[dim]
            i = np.asarray(k, np.int64)
            i = np.where(i < 0, i + n, i)
            i = np.clip(i, 0, n - 1) if mode == "clip" else np.where((i < 0) | (i >= n), n, i)
            k = int(i) if i.ndim == 0 else i
            int_dims.append(dim)
        out.append(k)
        dim += 1
    return tuple(out), int_dims


def _has_mask(key) -> bool:
    return any(isinstance(k, (np.ndarray, list)) and np.asarray(k).dtype == bool
               for k in (key if isinstance(key, tuple) else (key,)))


def _check_mode(mode, op: str) -> str:
    allowed = {None: None, "clip": "clip", "fill": "drop", "drop": "drop", "promise_in_bounds": "clip"}
    name = getattr(mode, "name", mode)
    name = name.lower() if isinstance(name, str) else name
    if name == "fill_or_drop":
        name = "drop"
    if name not in allowed:
        raise ValueError(f"[{op}] mode={mode!r} is not one of 'clip', 'fill', 'drop', 'promise_in_bounds'")
    return allowed[name]


def _scatter(x: HostArray, key, values, how: str, mode=None) -> HostArray:
    op = f".at[].{how}"
    mode = _check_mode(mode, op) or "drop"
    base = np.asarray(x)
    mode = "clip" if _has_mask(key) else mode  # a boolean mask selects in-bounds elements only
    idx, int_dims = _normalized(key, base.shape, mode)
    pad = [(0, int(d in int_dims)) for d in range(base.ndim)] if mode == "drop" else None
    ufunc_of = {"add": np.add, "subtract": np.subtract, "min": np.minimum, "max": np.maximum,
                "multiply": np.multiply, "divide": np.multiply, "power": np.multiply}
    if how in ("divide", "power"):
        # JAX: x / ones_like(x).at[idx].mul(values) (x ** ... for power): repeated indices apply twice
        target = np.ones_like(base)
    else:
        target = base
    work = np.pad(target, pad) if pad else np.array(target)
    vals = None if how == "apply" else np.asarray(values)
    try:
        if how == "set":
            work[idx] = vals.astype(work.dtype)
        elif how == "apply":
            work[idx] = np.asarray(values(as_host(work[idx]))).astype(work.dtype)
        else:
            ufunc_of[how].at(work, idx, vals.astype(work.dtype))
    except (ValueError, IndexError) as e:
        shape = "a function" if vals is None else f"updates of shape {vals.shape}"
        raise type(e)(f"[{op}] {e} (array of shape {base.shape}, {shape})") from None
    if pad:
        work = work[tuple(slice(0, n) for n in base.shape)]
    if how in ("divide", "power"):
        return (x / as_host(work)) if how == "divide" else (x ** as_host(work))
    return as_host(work, weak=x._weak, committed=x._committed)


def _get(x: HostArray, key, *, mode=None, fill_value=None, out_sharding=None):
    """``x.at[key].get(...)``: ``x[key]``; out-of-bounds indices clamp (``mode="fill"``: give
    `fill_value`, NaN by default)."""
    mode = _check_mode(mode, ".at[].get")
    base = np.asarray(x)
    mode = "clip" if _has_mask(key) else mode
    if mode == "drop":  # JAX's "fill": out-of-bounds reads give fill_value
        fill = (np.nan if base.dtype.kind in "fc" else np.iinfo(base.dtype).min if base.dtype.kind in "iu"
                else True) if fill_value is None else fill_value
        idx, int_dims = _normalized(key, base.shape, "drop")
        padded = np.pad(base, [(0, int(d in int_dims)) for d in range(base.ndim)],
                        constant_values=np.array(fill).astype(base.dtype))
        out = padded[idx]
    else:
        out = base[_normalized(key, base.shape, "clip")[0]]
    return as_host(out, weak=x._weak, committed=x._committed)


def _scatter_at(x: HostArray, key, values, how, *, mode=None, out_sharding=None):
    if isinstance(how, str):
        return _scatter(x, key, values, how, mode)
    return _scatter(x, key, how, "apply", mode)  # .apply(func)


HostArray.at = at_property(IndexOps(get=_get, scatter=_scatter_at))
