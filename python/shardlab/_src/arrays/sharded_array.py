"""ShardedArray: a global array held as real per-device shards in mesh-factorized storage.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((4, 2), ("x", "y"))
    >>> a = sl.device_put(np.ones((8, 1024), np.float32), sl.NamedSharding(mesh, P("x")))
    >>> a.nbytes_per_device, a.emulated_nbytes, a.host_nbytes
    (8192, 65536, 32768)
"""

from __future__ import annotations

import ast
import html
import inspect
import math
import sys

import numpy as np


from ..core import tree, views
from ..core.dtypes import canonicalize
from ..core.mesh import Device
from ..core.processes import PROCESS
from ..core.sharding import NamedSharding, PartitionSpec, Sharding, SingleDeviceSharding, as_sharding
from ..kernels.native import copy
from .computed import ComputedArray
from .host_array import HostArray, as_host
from .layout import from_storage, storage_shape, to_storage
from .shaped import Shaped
from .shard import Shard
from .storage import AbstractStorage, check_outputs, host_nbytes, is_abstract

_global_ufunc = None   # handler(ufunc, inputs, kwargs): register_global_ufunc


def register_global_ufunc(handler) -> None:
    """``handler(ufunc, inputs, kwargs)`` runs numpy ufuncs on global ShardedArrays (JAX's
    sharding rule for elementwise ops); ``planning/global_ops.py`` registers it beside its
    definition."""
    global _global_ufunc
    _global_ufunc = handler


class ShardedArray(ComputedArray, Shaped, np.lib.mixins.NDArrayOperatorsMixin):
    """A global array sharded over a mesh; each virtual device holds its real shard.

    ``np.asarray(arr)`` gives the global value. Replicated data is held once on the host
    (``host_nbytes``) while ``emulated_nbytes`` counts what every device would hold.

    ``unreduced`` names mesh axes the value is unreduced along (the book's {U_X}): for each
    such axis the storage dim has the full axis size and holds every device's partial sum.
    ``np.asarray`` of an unreduced array sums the partials (what psum would give).

    It behaves as a ``jax.Array``: JAX's repr (values, then the sharding) and str, scalar
    conversions, ``block_until_ready``, ``devices()``, ``global_shards``, and the methods
    (``sum``, ``reshape``, ``astype``, ``T``, ...) that call ``shardlab.numpy``. Indexing,
    iteration and ``.at[]`` are registered by the planning layer (``planning/global_index.py``),
    arithmetic by the handler :func:`register_global_ufunc` names.
    """

    __array_priority__ = 100

    def __init__(self, storage: np.ndarray, sharding: NamedSharding, shape: tuple,
                 unreduced: frozenset = frozenset()):
        if not isinstance(storage, (np.ndarray, AbstractStorage)):
            raise TypeError(f"[ShardedArray] storage must be a numpy array in mesh-factorized layout, got "
                            f"{type(storage).__name__}; use shardlab.device_put(x, sharding) to make one")
        if not isinstance(sharding, NamedSharding):
            raise TypeError(f"[ShardedArray] sharding must be a NamedSharding, got {sharding!r}")
        unreduced = frozenset(unreduced) | sharding.spec.unreduced
        if unreduced != sharding.spec.unreduced:
            # P(unreduced={...}) and ShardedArray.unreduced are one fact: the sharding carries it.
            # (shardlab's planner also leaves partial sums on Auto axes, which JAX's type cannot say)
            sharding = NamedSharding(sharding.mesh, sharding.spec.update(unreduced=unreduced),
                                     memory_kind=sharding.memory_kind, _check_axis_types=False)
        self._storage = storage
        self.sharding = sharding
        self.shape = tuple(int(s) for s in shape)
        self.unreduced = unreduced
        _check_storage(storage, sharding, self.shape, self.unreduced)

    # -- array-like ------------------------------------------------------------------------
    @property
    def dtype(self):
        return self._storage.dtype




    @property
    def storage(self) -> np.ndarray:
        """The mesh-factorized storage (read-only view): mesh dims, then the shard dims."""
        v = self._storage.view()
        v.flags.writeable = False
        return v

    def __array__(self, dtype=None, copy=None):
        storage = self._storage
        if is_abstract(storage):
            raise TypeError(f"[ShardedArray] this array of shape {self.shape} is abstract (from an "
                            f"abstract mesh or eval_shape): it has a shape and dtype but no data")
        if self.unreduced:
            dims = tuple(self.sharding.mesh.axis_names.index(a) for a in self.unreduced)
            storage = storage.sum(axis=dims, keepdims=True, dtype=storage.dtype)
        out = from_storage(storage, self.sharding, self.shape)
        return out if dtype is None else out.astype(dtype)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """Global-view arithmetic, as on a jax.Array: elementwise ufuncs keep the sharding and
        run shard by shard; ``@`` is planned and run by ``shardlab.matmul``."""
        if method != "__call__" or kwargs.get("out") is not None:
            return NotImplemented
        if any(type(v).__name__ == "LocalArray" and v.mesh.axis_names for v in inputs):
            return NotImplemented  # inside a shard_map body: the per-device value's ufunc captures this one
        return _global_ufunc(ufunc, inputs, kwargs)

    @property
    def is_abstract(self) -> bool:
        """Whether the array has a shape, dtype and sharding but no data (abstract mode)."""
        return is_abstract(self._storage)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    # -- jax.Array behaviour -------------------------------------------------------------------
    __hash__ = None  # jax.Array is unhashable: hash() raises TypeError

    _weak_type = False

    @property
    def weak_type(self) -> bool:
        """Whether the dtype is weak, as JAX's: True for a Python scalar placed with
        ``device_put`` (it then promotes as the scalar would), False otherwise."""
        return self._weak_type


    def _value(self) -> np.ndarray:
        return np.asarray(self)

    def __bool__(self):
        if self.size == 0:
            raise ValueError("The truth value of an empty array is ambiguous. Use `array.size > 0` to "
                             "check that an array is not empty.")
        if self.size > 1:
            raise ValueError("The truth value of an array with more than one element is ambiguous. "
                             "Use a.any() or a.all()")
        return bool(self._value())

    def _check_scalar(self):
        if self.ndim > 0:
            raise TypeError(f"Only scalar arrays can be converted to Python scalars; got arr.ndim={self.ndim}")

    def __float__(self):
        self._check_scalar()
        return float(self._value())

    def __int__(self):
        self._check_scalar()
        return int(self._value())

    def __complex__(self):
        self._check_scalar()
        return complex(self._value())

    def __index__(self):
        if not (self.shape == () and np.dtype(self.dtype).kind in "iu"):
            raise TypeError("Only integer scalar arrays can be converted to a scalar index.")
        return int(self._value())

    def item(self, *args):
        """The element as a Python scalar (``jax.Array.item``)."""
        return self._value().item(*args)

    def tolist(self):
        """The global value as nested Python lists."""
        return self._value().tolist()

    def tobytes(self, order="C") -> bytes:
        """The global value's bytes."""
        return self._value().tobytes(order)

    def __format__(self, format_spec):
        if self.unreduced or self.is_abstract:
            return repr(self)
        v = self._value()
        return format(v if v.ndim else v[()], format_spec)

    @property
    def is_fully_replicated(self) -> bool:
        """Whether every device holds the whole value."""
        return self.sharding.is_fully_replicated

    @property
    def committed(self) -> bool:
        """True: an array placed with a sharding is committed to its devices."""
        return True

    @property
    def device(self):
        """As ``jax.Array.device`` for an array on several devices: its sharding."""
        return self.sharding

    def to_device(self, device, *, stream=None):
        """``device_put(self, device)`` (``jax.Array.to_device``)."""
        if stream is not None:
            raise NotImplementedError("stream argument of array.to_device()")
        return device_put(self, device)

    def copy(self) -> "ShardedArray":
        """A copy with the same sharding, its spec padded to the rank as an op's output is in JAX
        (each device copies its own shard; nothing moves)."""
        storage = self._storage if is_abstract(self._storage) else np.array(self._storage)
        return ShardedArray(storage, self.sharding.update(spec=self.sharding.spec.padded(self.ndim)), self.shape,
                            self.unreduced)

    def devices(self) -> set:
        """The devices that hold the array."""
        return self.sharding.device_set

    @property
    def global_shards(self) -> list["Shard"]:
        """Every device's shard (all addressable: one process holds every virtual device)."""
        return self.addressable_shards

    @property
    def device_buffer(self):
        """Removed in JAX: raises AttributeError pointing at ``addressable_data(0)``."""
        raise AttributeError("arr.device_buffer has been deprecated. Use arr.addressable_data(0)")

    @property
    def device_buffers(self):
        """Removed in JAX: raises AttributeError pointing at ``addressable_shards``."""
        raise AttributeError("arr.device_buffers has been deprecated. Use [x.data for x in arr.addressable_shards]")

    @property
    def format(self) -> "Format":
        """The array's layout and sharding (``jax.Array.format``); the layout is the default
        row-major one, shown as None."""
        return Format(None, self.sharding)

    # -- shards ----------------------------------------------------------------------------
    def _local(self, pos: int) -> np.ndarray:
        if is_abstract(self._storage):
            raise TypeError(f"[ShardedArray] this array of shape {self.shape} is abstract: its shards "
                            f"have shapes ({self.sharding.shard_shape(self.shape)}) but no data")
        coords = np.unravel_index(pos, self.sharding.mesh.devices.shape)
        idx = tuple(int(c) if s != 1 else 0 for c, s in zip(coords, self._storage.shape))
        v = self._storage[idx + (Ellipsis,)]  # Ellipsis: a 0-d view, not a scalar, for rank-0 arrays
        v = v.view()
        v.flags.writeable = False
        return v

    @property
    def addressable_shards(self) -> list[Shard]:
        """One Shard per device of this process in mesh (row-major) order: every device, or
        under MPI this rank's."""
        out = []
        devices = self.sharding.mesh.devices.ravel()
        for pos in PROCESS.addressable_positions(self.sharding.mesh):
            dev = devices[pos]
            data = as_host(self._local(pos), committed=True, device=dev)  # JAX: an Array on that device
            out.append(Shard(dev, self.sharding._index(pos, self.shape), data, self.sharding.replica_id(pos)))
        return out

    def addressable_data(self, index: int) -> np.ndarray:
        """The data of this process's `index`-th device (in ``addressable_shards`` order: every
        device on one process, this rank's under MPI), as JAX's."""
        mesh = self.sharding.mesh
        positions = PROCESS.addressable_positions(mesh)
        n = len(positions)
        if not 0 <= index < n:
            here = f" of process {PROCESS.index}" if PROCESS.count > 1 else ""
            raise IndexError(f"[addressable_data] index {index} is outside the {n} devices{here}")
        pos = positions[index]
        return as_host(self._local(pos), committed=True, device=mesh.devices.ravel()[pos])

    @property
    def nbytes_per_device(self) -> int:
        return math.prod(self.sharding.shard_shape(self.shape)) * self.dtype.itemsize

    @property
    def emulated_nbytes(self) -> int:
        """Bytes summed over every device, as real hardware would hold them."""
        return self.nbytes_per_device * self.sharding.mesh.size

    @property
    def host_nbytes(self) -> int:
        """Bytes of host memory this array really holds."""
        return host_nbytes(self._storage)

    def __repr__(self):
        """JAX's ``Array(...)`` repr (values, dtype) followed by the sharding; an unreduced array
        shows its shape and sharding only (as JAX); an abstract one as a ShapeDtypeStruct."""
        if is_abstract(self._storage):
            return f"ShapeDtypeStruct(shape={self.shape}, dtype={self.dtype}, sharding={self.sharding!r})"
        dtype_str = f"dtype={self.dtype.name}" + (", weak_type=True" if self._weak_type else "")
        if self.unreduced:
            return f"Array(shape={self.shape}, {dtype_str}, sharding={self.sharding})"
        prefix = "Array("
        width = np.get_printoptions()["linewidth"]
        if self.size == 0:
            body = f"[], shape={self.shape}"
        else:
            body = np.array2string(self._value(), prefix=prefix, suffix=",", separator=", ",
                                   max_line_width=width)
        last_line_len = len(body) - body.rfind("\n") + 1
        sep = " " * len(prefix) if last_line_len + len(dtype_str) + 2 > width else " "
        return f"{prefix}{body},{sep}{dtype_str}, sharding={self.sharding})"

    def __str__(self):
        """The values only, as ``str`` of a jax.Array (numpy's str)."""
        if self.unreduced or is_abstract(self._storage):
            return repr(self)
        return str(self._value())

    def _repr_html_(self):
        view = views.html_view(self)
        return view if view is not None else f"<code>{html.escape(repr(self))}</code>"


# -- methods that delegate to shardlab.numpy (jax.Array's methods, with JAX's signatures) ------
def _jnp():
    """``shardlab.numpy``, the public jax.numpy. The arrays layer may not import the ops above
    it; the package loads shardlab.numpy before any array can exist, so it is looked up here."""
    return sys.modules["shardlab.numpy"]


def _forward(target: str, self, params: dict, defaults: dict, required: tuple = ()):
    """Calls ``shardlab.numpy.<target>(self, *required, **kw)``: the required parameters by
    position (their names differ between numpy and jax.numpy), then only the keywords whose
    values differ from the method's defaults (so a jnp function that lacks an option JAX has
    works until the option is used)."""
    kw = {k: v for k, v in params.items() if k not in required and (
        k not in defaults or not (v is defaults[k] or (type(v) is type(defaults[k]) and v == defaults[k])))}
    fn = getattr(_jnp(), target, None)
    if fn is None:
        raise NotImplementedError(f"[ShardedArray.{target}] shardlab.numpy has no {target} yet; use "
                                  f"np.asarray(x) for the global value or run it inside shard_map")
    return fn(self, *(params[k] for k in required), **kw)


# method name → (shardlab.numpy function, the parameters after self as in jax.Array)
_DELEGATED = {
    "sum": ("sum", "axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None, "
                   "promote_integers=True"),
    "prod": ("prod", "axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None, "
                     "promote_integers=True"),
    "mean": ("mean", "axis=None, dtype=None, out=None, keepdims=False, *, where=None"),
    "max": ("max", "axis=None, out=None, keepdims=False, initial=None, where=None"),
    "min": ("min", "axis=None, out=None, keepdims=False, initial=None, where=None"),
    "any": ("any", "axis=None, out=None, keepdims=False, *, where=None"),
    "all": ("all", "axis=None, out=None, keepdims=False, *, where=None"),
    "std": ("std", "axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=None, correction=None"),
    "var": ("var", "axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=None, correction=None"),
    "argmax": ("argmax", "axis=None, out=None, keepdims=None"),
    "argmin": ("argmin", "axis=None, out=None, keepdims=None"),
    "cumsum": ("cumsum", "axis=None, dtype=None, out=None"),
    "cumprod": ("cumprod", "axis=None, dtype=None, out=None"),
    "astype": ("astype", "dtype, copy=False, device=None"),
    "squeeze": ("squeeze", "axis=None"),
    "swapaxes": ("swapaxes", "axis1, axis2"),
    "clip": ("clip", "min=None, max=None"),
    "round": ("round", "decimals=0, out=None"),
    "conj": ("conj", ""),
    "conjugate": ("conjugate", ""),
    "dot": ("dot", "b, *, precision=None, preferred_element_type=None"),
    "nonzero": ("nonzero", "*, fill_value=None, size=None"),
    "sort": ("sort", "axis=-1, *, kind=None, order=None, stable=True, descending=False"),
    "argsort": ("argsort", "axis=-1, *, kind=None, order=None, stable=True, descending=False"),
    "take": ("take", "indices, axis=None, out=None, mode=None, unique_indices=False, indices_are_sorted=False, "
                     "fill_value=None"),
    "repeat": ("repeat", "repeats, axis=None, *, total_repeat_length=None, out_sharding=None"),
    "ravel": ("ravel", "order='C', *, out_sharding=None"),
    "flatten": ("ravel", "order='C', *, out_sharding=None"),
    "diagonal": ("diagonal", "offset=0, axis1=0, axis2=1"),
    "trace": ("trace", "offset=0, axis1=0, axis2=1, dtype=None, out=None"),
}


def _signature(params: str) -> inspect.Signature:
    """``inspect.Signature`` of ``(self, <params>)`` from the table's text: names, literal
    defaults and a bare ``*`` for keyword-only parameters."""
    out = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    for item in filter(None, (t.strip() for t in params.split(","))):
        if item == "*":
            kind = inspect.Parameter.KEYWORD_ONLY
            continue
        name, eq, default = item.partition("=")
        out.append(inspect.Parameter(name, kind, default=ast.literal_eval(default) if eq else inspect.Parameter.empty))
    return inspect.Signature(out)


def _delegate(name: str, target: str, params: str):
    sig = _signature(params)
    defaults = {k: p.default for k, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
    required = tuple(k for k, p in sig.parameters.items() if k != "self" and p.default is inspect.Parameter.empty)

    def method(self, *args, **kwargs):
        bound = sig.bind(self, *args, **kwargs)  # JAX's signature: a wrong call raises TypeError here
        return _forward(target, self, {k: v for k, v in bound.arguments.items() if k != "self"}, defaults, required)

    method.__signature__ = sig
    method.__name__ = name
    method.__qualname__ = f"ShardedArray.{name}"
    method.__doc__ = (f"``jax.Array.{name}``: ``shardlab.numpy.{target}`` on this array (JAX's signature; "
                      f"options left at their defaults are not passed on).")
    return method


for _name, (_target, _params) in _DELEGATED.items():
    setattr(ShardedArray, _name, _delegate(_name, _target, _params))


def _reshape(self, *args, order="C", out_sharding=None):
    """``jax.Array.reshape``: ``x.reshape(2, 4)`` or ``x.reshape((2, 4))``."""
    shape = args[0] if len(args) == 1 else args
    kw = {} if order == "C" else {"order": order}
    if out_sharding is not None:
        kw["out_sharding"] = out_sharding
    return _jnp().reshape(self, shape, **kw)


def _transpose(self, *args):
    """``jax.Array.transpose``: ``x.transpose()``, ``x.transpose(1, 0)`` or ``x.transpose((1, 0))``."""
    axes = None if not args else args[0] if len(args) == 1 else tuple(args)
    return _jnp().transpose(self) if axes is None else _jnp().transpose(self, tuple(axes))


ShardedArray.reshape = _reshape
ShardedArray.transpose = _transpose
ShardedArray.T = property(lambda self: _jnp().transpose(self), doc="All axes reversed (``jnp.transpose``).")
ShardedArray.mT = property(lambda self: _jnp().swapaxes(self, -1, -2),
                           doc="The last two axes swapped (``jnp.matrix_transpose``).")
ShardedArray.real = property(lambda self: _jnp().real(self), doc="``jnp.real`` of the array.")
ShardedArray.imag = property(lambda self: _jnp().imag(self), doc="``jnp.imag`` of the array.")


class Format:
    """An array's layout and sharding, as ``jax.Array.format`` (shardlab has one layout:
    row-major, shown as ``layout=None``)."""

    def __init__(self, layout, sharding):
        self.layout = layout
        self.sharding = sharding

    def __repr__(self):
        return f"Format(layout={self.layout}, sharding={self.sharding})"

    def __eq__(self, other):
        return isinstance(other, Format) and (self.layout, self.sharding) == (other.layout, other.sharding)

    __hash__ = None


def _check_storage(storage, sharding: NamedSharding, shape: tuple, unreduced: frozenset) -> None:
    """Raises ValueError unless `storage` is the mesh-factorized layout of a `shape` array
    sharded as `sharding` (mesh dims: the axis size where the spec or `unreduced` names the
    axis, else 1; then the shard shape)."""
    mesh = sharding.mesh
    sharding.check_shape(shape, "ShardedArray")
    named = set(sharding.spec.mesh_axes())
    for a in unreduced:
        if a not in mesh.axis_names or a in named:
            raise ValueError(f"[ShardedArray] unreduced axis {a!r} must be a mesh axis {mesh.axis_names} "
                             f"that the spec {sharding.spec!r} does not use")
    want = tuple(mesh.shape[a] if a in named or a in unreduced else 1 for a in mesh.axis_names) + \
        sharding.shard_shape(shape)
    if tuple(storage.shape) != want:
        raise ValueError(f"[ShardedArray] storage of shape {tuple(storage.shape)} does not hold a {shape} array "
                         f"sharded as {sharding.spec!r} on {mesh!r}: the layout needs {want} (mesh dims "
                         f"{want[:mesh.ndim]}, then the shard shape {want[mesh.ndim:]}); use "
                         f"shardlab.device_put(x, sharding) to make one")


def _is_placement(s) -> bool:
    return s is None or isinstance(s, (Sharding, PartitionSpec, Device))


def device_put(x, device=None, *, src=None, donate=False, may_alias=None):
    """Places `x` (an array or a pytree of arrays) on devices, as ``jax.device_put``.

    Args:
        x: array-like (numpy array, scalar, ShardedArray) or a pytree of them (lists and tuples
            are pytrees, as in JAX).
        device: a NamedSharding; a PartitionSpec (with a mesh set by ``set_mesh``); a Device or
            SingleDeviceSharding (host data: a HostArray, JAX's Array on one device, committed
            to it); None (an array keeps its placement, host data becomes an uncommitted
            HostArray, as JAX puts it on one device); or a pytree of these, a prefix of `x`'s
            structure.
        src, donate, may_alias: accepted for JAX's signature; shardlab copies when it must.

    Values take JAX's canonical dtypes (float64 becomes float32 unless x64 is on).

    Raises:
        ValueError: a dim not divisible by the product of the axes splitting it, or a spec
            longer than the rank; a PartitionSpec with no mesh set.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((2,), ("x",))
        >>> [s.data.tolist() for s in sl.device_put(np.arange(4), sl.NamedSharding(mesh, P("x"))).addressable_shards]
        [[0, 1], [2, 3]]
        >>> with sl.set_mesh(mesh):
        ...     out = sl.device_put({"w": np.ones((2, 2)), "b": np.zeros(2)}, {"w": P("x"), "b": P()})
        >>> out["w"].sharding.spec, out["b"].dtype
        (P('x',), dtype('float32'))
    """
    if _is_placement(device):
        if isinstance(x, (ShardedArray, np.ndarray, np.generic, int, float, complex, bool)):
            return _put(x, device)
        leaves, treedef = tree.flatten(x)
        return tree.unflatten(treedef, [_put(v, device) for v in leaves])
    leaves, treedef = tree.flatten(x)
    targets = tree.broadcast_prefix(device, x, _is_placement, "the device argument", "device_put")
    return tree.unflatten(treedef, [_put(v, d) for v, d in zip(leaves, targets)])


def _host(x) -> np.ndarray:
    arr = np.asarray(x)
    if not arr.dtype.isnative:  # big-endian data: the core reads native byte order only
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return canonicalize(arr, "device_put")


def _put(x, device):
    if device is None or isinstance(device, (Device, SingleDeviceSharding)):
        if isinstance(x, ShardedArray) and device is None:
            return x
        if type(x).__name__ == "LocalArray":  # inside shard_map: already on its devices
            return x
        if isinstance(x, ShardedArray):  # gathered onto the one device
            dev = device.device_set.pop() if isinstance(device, SingleDeviceSharding) else device
            return as_host(np.asarray(x), weak=x.weak_type, committed=True, device=dev)
        # JAX's Array on one device: committed when the device is named; a Python scalar is weak
        weak = type(x) in (int, float, complex) or bool(getattr(x, "_weak", False))
        committed = device is not None or bool(getattr(x, "_committed", False))
        dev = device.device_set.pop() if isinstance(device, SingleDeviceSharding) else device
        dev = getattr(x, "_device", None) if dev is None else dev
        return as_host(_host(x), weak=weak, committed=committed, device=dev)
    sharding = as_sharding(device, "device_put")
    source = None
    gathered = isinstance(x, ShardedArray)  # np.asarray below gives every process the same value
    if gathered:
        if x.sharding == sharding:
            return x
        source = x if not x.unreduced and not x.is_abstract else None
        x = np.asarray(x)
    arr = _host(x)
    sharding.check_shape(arr.shape, "device_put")
    unreduced = sharding.spec.unreduced
    if unreduced:
        placed = sharding.with_spec(sharding.spec.update(unreduced=frozenset()))
    else:
        placed = sharding
    view = to_storage(arr, placed)
    check_outputs("device_put", [(view.shape, view.dtype)],
                  f"a {arr.shape} {arr.dtype} array sharded as {sharding.spec!r} is that large on this mesh; "
                  f"shard it over more axes, or use an abstract mesh (make_mesh(..., abstract=True))")
    if PROCESS.count > 1 and PROCESS.scatter is not None and not placed.mesh.abstract:
        # several processes (MPI): process 0's value, each process keeping its devices' part
        storage = PROCESS.scatter(_partials(view, placed, unreduced, source) if unreduced else view, placed.mesh,
                                  arr.shape, same=gathered)
    else:
        storage = copy(view)
        if unreduced:
            storage = _partials(storage, placed, unreduced, source)
    out = ShardedArray(storage, sharding, arr.shape)
    if type(x) in (int, float, complex) or getattr(x, "_weak", False):  # JAX's weak type: a Python scalar keeps promoting as one
        out._weak_type = True
    return out


def _partials(storage, placed: NamedSharding, unreduced, source) -> np.ndarray:
    """`storage` (the value laid out as `placed`) as partial sums along the `unreduced` axes, as
    JAX writes them: each device keeps the part of the value it held in `source` (a global array
    sharded along such an axis: its shard, in place) and zeros elsewhere; where `source` is
    replicated along the axis, or is host data, the first device holds the value."""
    mesh = placed.mesh
    shape = list(storage.shape)
    for a in unreduced:
        shape[mesh.axis_names.index(a)] = mesh.shape[a]
    keep = np.ones(shape, bool)
    for a in unreduced:
        i = mesh.axis_names.index(a)
        coords = np.arange(mesh.shape[a]).reshape([-1 if j == i else 1 for j in range(len(shape))])
        if source is not None and source._storage.shape[i] != 1:  # which device held each element
            held = np.broadcast_to(coords, source._storage.shape)
            owner = to_storage(from_storage(held, source.sharding, source.shape), placed)
        else:
            owner = np.zeros(storage.shape, np.int64)
        keep &= owner == coords
    return np.where(keep, storage, np.zeros((), storage.dtype))


def _to_device(self, device, *, stream=None):
    """``device_put(self, device)`` (``jax.Array.to_device``)."""
    return device_put(self, device)


HostArray.to_device = _to_device  # a host array moves through device_put, defined here


def device_get(x):
    """The host value of `x` (an array or a pytree of arrays), as ``jax.device_get``: a plain numpy
    array for each ShardedArray (partial sums added) or HostArray; other leaves are returned as
    they are.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> a = sl.device_put(np.arange(4.0), sl.NamedSharding(sl.make_mesh((2,), ("x",)), sl.P("x")))
        >>> sl.device_get({"a": a, "n": 3})
        {'a': array([0., 1., 2., 3.], dtype=float32), 'n': 3}
    """
    leaves, treedef = tree.flatten(x)
    return tree.unflatten(treedef, [np.asarray(v) if isinstance(v, (ShardedArray, np.ndarray)) else v for v in leaves])


def abstract_array(shape, dtype, sharding: NamedSharding) -> ShardedArray:
    """A ShardedArray with shape, dtype and sharding but no data (abstract mode)."""
    shape = tuple(int(s) for s in shape)
    sharding.check_shape(shape, "ShapeDtypeStruct")
    return ShardedArray(AbstractStorage(storage_shape(shape, sharding), dtype), sharding, shape)
