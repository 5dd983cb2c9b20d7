"""LocalArray: the per-device value a shard_map body works with.

It is one array in mesh-factorized storage: ``storage.shape == mesh dims + local shape``,
where a mesh dim is 1 if the value is the same on every device along that axis. ``.shape``
is the LOCAL shape, as inside ``jax.shard_map``. numpy's ufuncs and functions work on it
(``np.exp(x)``, ``x @ w``); an op on an invariant value runs once, not once per device.

The array type holds data and answers shape questions only. What can be *done* with it —
ufuncs, numpy functions, methods such as ``reshape`` or ``sum`` — is registered by the ops
layer (``register_method``, ``HANDLED``, ``register_ufunc_handler``), so this module imports
nothing above it.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((4,), ("x",))
    >>> def f(x):
    ...     assert x.shape == (2, 3)        # the local shape
    ...     return np.exp(x) * 2
    >>> sl.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(np.zeros((8, 3))).shape
    (8, 3)
"""

from __future__ import annotations

import numpy as np

from ..core.dtypes import canonicalize
from .storage import AbstractStorage, is_abstract

# numpy function → implementation taking LocalArrays (filled in by the ops layer).
HANDLED: dict = {}
_ufunc_handler = None   # handler(ufunc, method, inputs, kwargs): register_ufunc_handler


def register_ufunc_handler(handler) -> None:
    """``handler(ufunc, method, inputs, kwargs)`` runs every numpy ufunc on LocalArrays
    (``np.exp(x)``, ``x + y``); the ops layer registers it beside its definition
    (``ops/numpy/elementwise.py``)."""
    global _ufunc_handler
    _ufunc_handler = handler


class LocalArray(np.lib.mixins.NDArrayOperatorsMixin):
    """One value per virtual device, held in mesh-factorized storage."""

    __slots__ = ("storage", "mesh", "__weakref__")
    __array_priority__ = 200

    def __init__(self, storage, mesh):
        if not isinstance(storage, (np.ndarray, np.generic, AbstractStorage)):
            raise TypeError(f"[LocalArray] storage must be a numpy array in mesh-factorized layout (mesh dims, "
                            f"then the local shape), got {type(storage).__name__}")
        k = mesh.ndim
        if storage.ndim < k:
            raise ValueError(f"[LocalArray] storage of shape {tuple(storage.shape)} has fewer dims than the "
                             f"{k} mesh axes {mesh.axis_names}; its leading dims are the mesh axes")
        for a, (s, m) in enumerate(zip(storage.shape, mesh.axis_sizes)):
            if s != 1 and s != m:
                raise ValueError(f"[LocalArray] storage of shape {tuple(storage.shape)}: dim {a} has size {s}; "
                                 f"it must be 1 (the same on every device) or {m}, the size of mesh axis "
                                 f"{mesh.axis_names[a]!r}")
        self.storage = storage
        self.mesh = mesh

    # -- shape -----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self.storage.shape[self.mesh.ndim:]

    @property
    def dtype(self):
        return self.storage.dtype

    @property
    def ndim(self) -> int:
        return self.storage.ndim - self.mesh.ndim

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def is_abstract(self) -> bool:
        """Whether the value has shapes and dtypes only, no data (an abstract mesh, ``eval_shape``)."""
        return is_abstract(self.storage)

    @property
    def varying_axes(self) -> tuple:
        """Mesh axes along which the value differs between devices (JAX's vma)."""
        k = self.mesh.ndim
        return tuple(n for n, s in zip(self.mesh.axis_names, self.storage.shape[:k]) if s != 1)

    @property
    def aval(self):
        """Shape, dtype and varying axes, without data (an AbstractStorage)."""
        return AbstractStorage(self.storage.shape, self.storage.dtype)

    @property
    def T(self):
        return self.transpose()

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d LocalArray")
        return self.shape[0]

    def __repr__(self):
        """Each device's block, as JAX prints a value inside an eager shard_map body::

            On cpu:0 at mesh coordinates (x,) = (0,):
            [0. 1.]

        (an abstract value, which has no data, prints its shape, dtype and varying axes)."""
        if self.is_abstract or self.mesh.ndim == 0:
            if not self.is_abstract:
                return str(np.asarray(self.storage))
            return (f"LocalArray(shape={self.shape}, dtype={self.dtype}, abstract, "
                    f"varying={self.varying_axes})")
        mesh, s = self.mesh, self.storage
        names = f"({', '.join(map(str, mesh.axis_names))},)"
        blocks = []
        for idx, device in np.ndenumerate(mesh.devices):
            src = tuple(i if s.shape[a] != 1 else 0 for a, i in enumerate(idx))
            idx = tuple(int(i) for i in idx)
            blocks.append(f"On {device.platform}:{device.id} at mesh coordinates {names} = {idx}:\n"
                          f"{np.asarray(s[src])}\n")
        return "\n".join(blocks)

    __str__ = __repr__  # as JAX: print(x) and repr(x) show the same blocks

    def __bool__(self):
        raise TypeError("[LocalArray] the truth value of a per-device value is ambiguous inside "
                        "shard_map; use jnp.where, or shardlab.debug to inspect values")

    def __array__(self, dtype=None, copy=None):
        raise TypeError("[LocalArray] cannot convert a per-device value to one numpy array inside "
                        "shard_map; return it from the function (out_specs) or use "
                        "shardlab.debug.device_values(x)")

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __hash__(self):
        return id(self)

    # -- numpy protocols (implementations registered by the ops layer) ----------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _ufunc_handler(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        impl = HANDLED.get(func)
        if impl is None:
            raise TypeError(f"[LocalArray] numpy.{func.__name__} is not supported on per-device "
                            f"values; docs/numpy_coverage.md lists the supported functions")
        return impl(*args, **kwargs)


def wrap(storage, mesh) -> LocalArray:
    """A LocalArray around storage that a primitive produced: its shape rule already holds, so
    the constructor's checks (meant for user-made values) are skipped on this hot path."""
    x = object.__new__(LocalArray)
    x.storage = storage
    x.mesh = mesh
    return x


def register_method(name: str, fn) -> None:
    """Makes `fn` the method `name` of LocalArray (the ops layer registers reshape, sum, ...)."""
    setattr(LocalArray, name, fn)


def mesh_of(values):
    """The mesh of the first LocalArray in `values` (they must all share it)."""
    mesh = None
    for v in values:
        if isinstance(v, LocalArray):
            if mesh is None:
                mesh = v.mesh
            elif v.mesh is not mesh and v.mesh != mesh:
                raise ValueError("[LocalArray] values from different meshes cannot be combined")
    if mesh is None:
        raise TypeError("[LocalArray] no per-device value among the arguments")
    return mesh


_capture = None   # capture(x, mesh): register_capture


def register_capture(capture) -> None:
    """``capture(x, mesh)`` turns a global array closed over by a shard_map body into a
    per-device value (JAX: a const, replicated and invariant); ``transforms/shard_map.py``
    registers it beside its definition (it records the capture's gradient)."""
    global _capture
    _capture = capture


def lift(x, mesh) -> LocalArray:
    """A LocalArray for `x`; constants become values invariant along every mesh axis."""
    if isinstance(x, LocalArray):
        return x
    if hasattr(x, "sharding") and hasattr(x, "unreduced"):  # a global array closed over by a shard_map body
        if _capture is not None:
            return _capture(x, mesh)
        raise TypeError("[shard_map] a global ShardedArray was captured inside a shard_map body; "
                        "pass it as an argument with an in_spec instead")
    arr = np.asarray(x)
    if arr.dtype.kind in "iu" and arr.dtype.itemsize > 4:
        arr = canonicalize(arr, "shard_map")
    return LocalArray(arr.reshape((1,) * mesh.ndim + arr.shape), mesh)


def local_axes(axis, x: LocalArray):
    """Local axis (int, tuple or None) → storage axes."""
    k, r = x.mesh.ndim, x.ndim
    if axis is None:
        return tuple(range(k, k + r))
    if isinstance(axis, (tuple, list)):
        return tuple(local_axes(a, x) for a in axis)
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"axis must be an int, got {axis!r}")
    axis = int(axis)
    if not -r <= axis < r:
        raise np.exceptions.AxisError(f"axis {axis} is out of bounds for a value of local rank {r} "
                                      f"(local shape {x.shape})")
    return k + (axis % r)
