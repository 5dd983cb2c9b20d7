"""LocalArray: the per-device value a shard_map body works with.

It is one array in mesh-factorized storage: ``storage.shape == mesh dims + local shape``,
where a mesh dim is 1 if the value is the same on every device along that axis. ``.shape``
is the LOCAL shape, as inside ``jax.shard_map``. numpy's ufuncs and functions work on it
(``np.exp(x)``, ``x @ w``); an op on an invariant value runs once, not once per device.

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

from .dtypes import bfloat16, canonicalize

# numpy function → implementation taking LocalArrays (filled in by shardlab.numpy).
HANDLED: dict = {}


class LocalArray(np.lib.mixins.NDArrayOperatorsMixin):
    """One value per virtual device, held in mesh-factorized storage."""

    __slots__ = ("storage", "mesh")
    __array_priority__ = 200

    def __init__(self, storage: np.ndarray, mesh):
        self.storage = storage
        self.mesh = mesh

    @classmethod
    def from_storage(cls, storage: np.ndarray, mesh) -> "LocalArray":
        if storage.ndim < mesh.ndim:
            raise ValueError(f"[LocalArray] storage of rank {storage.ndim} has fewer dims than the "
                             f"mesh's {mesh.ndim}")
        for a, (s, m) in enumerate(zip(storage.shape, mesh.axis_sizes)):
            if s not in (1, m):
                raise ValueError(f"[LocalArray] storage dim {a} has size {s}; it must be 1 or "
                                 f"the size {m} of axis {mesh.axis_names[a]!r}")
        return cls(storage, mesh)

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
    def varying_axes(self) -> tuple:
        """Mesh axes along which the value differs between devices (JAX's vma)."""
        k = self.mesh.ndim
        return tuple(n for n, s in zip(self.mesh.axis_names, self.storage.shape[:k]) if s != 1)

    @property
    def T(self):
        return self.transpose()

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d LocalArray")
        return self.shape[0]

    def __repr__(self):
        return (f"LocalArray(shape={self.shape}, dtype={self.dtype}, "
                f"varying={self.varying_axes})")

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

    # -- numpy protocols -------------------------------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if kwargs.get("out") is not None:
            raise TypeError(f"[{ufunc.__name__}] LocalArrays are immutable; out= is not supported")
        if method == "__call__":
            if ufunc is np.matmul:
                from .numpy import matmul

                return matmul(*inputs)
            mesh = mesh_of(inputs)
            storages = aligned(inputs, mesh)
            if ufunc is not np.ldexp:
                storages = jax_promotion(storages)
            return LocalArray(ufunc(*storages, **kwargs), mesh)
        if method == "reduce" and len(inputs) == 1:
            x = inputs[0]
            axis = kwargs.pop("axis", 0)
            return LocalArray(ufunc.reduce(x.storage, axis=local_axes(axis, x), **kwargs), x.mesh)
        return NotImplemented

    def __array_function__(self, func, types, args, kwargs):
        impl = HANDLED.get(func)
        if impl is None:
            raise TypeError(f"[LocalArray] numpy.{func.__name__} is not supported on per-device "
                            f"values; shardlab.numpy lists the supported functions")
        return impl(*args, **kwargs)

    # -- methods (delegating to shardlab.numpy) --------------------------------------------
    def reshape(self, *shape, order="C"):
        from . import numpy as jnp

        return jnp.reshape(self, shape[0] if len(shape) == 1 else shape, order=order)

    def transpose(self, *axes):
        from . import numpy as jnp

        return jnp.transpose(self, axes[0] if len(axes) == 1 else (axes or None))

    def astype(self, dtype):
        return LocalArray(self.storage.astype(dtype), self.mesh)

    def sum(self, axis=None, dtype=None, keepdims=False):
        from . import numpy as jnp

        return jnp.sum(self, axis=axis, dtype=dtype, keepdims=keepdims)

    def mean(self, axis=None, dtype=None, keepdims=False):
        from . import numpy as jnp

        return jnp.mean(self, axis=axis, dtype=dtype, keepdims=keepdims)

    def max(self, axis=None, keepdims=False):
        from . import numpy as jnp

        return jnp.max(self, axis=axis, keepdims=keepdims)

    def min(self, axis=None, keepdims=False):
        from . import numpy as jnp

        return jnp.min(self, axis=axis, keepdims=keepdims)

    def squeeze(self, axis=None):
        from . import numpy as jnp

        return jnp.squeeze(self, axis=axis)

    def swapaxes(self, a, b):
        from . import numpy as jnp

        return jnp.swapaxes(self, a, b)

    def ravel(self):
        return self.reshape(-1)

    flatten = ravel

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        if any(isinstance(k, LocalArray) for k in key):
            raise TypeError("[LocalArray] indexing with a per-device index is not supported; "
                            "use jnp.take_along_axis or one-hot arithmetic")
        return LocalArray(self.storage[(slice(None),) * self.mesh.ndim + key], self.mesh)


# JAX arrays are immutable: `x += y` rebinds x instead of writing into shared storage.
for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or",
              "xor", "lshift", "rshift"):
    setattr(LocalArray, f"__i{_name}__", getattr(LocalArray, f"__{_name}__"))


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


def lift(x, mesh) -> LocalArray:
    """A LocalArray for `x`; constants become values invariant along every mesh axis."""
    if isinstance(x, LocalArray):
        return x
    from .sharded_array import ShardedArray

    if isinstance(x, ShardedArray):
        raise TypeError("[shard_map] a global ShardedArray was captured inside a shard_map body; "
                        "pass it as an argument with an in_spec instead")
    arr = np.asarray(x)
    if arr.dtype.kind in "iu" and arr.dtype.itemsize > 4:
        arr = canonicalize(arr, "shard_map")
    return LocalArray(arr.reshape((1,) * mesh.ndim + arr.shape), mesh)


def aligned(values, mesh) -> list:
    """Storages of `values` padded to one local rank, so numpy broadcasting lines up the mesh
    dims with the mesh dims and the local dims right-aligned, as for the local values."""
    k = mesh.ndim
    out, ranks = [], []
    for v in values:
        if isinstance(v, LocalArray):
            out.append(v.storage)
            ranks.append(v.ndim)
        elif isinstance(v, (int, float, complex, bool, np.generic)):
            out.append(v)  # python scalars keep numpy's weak-type promotion
            ranks.append(None)
        else:
            arr = lift(v, mesh).storage
            out.append(arr)
            ranks.append(arr.ndim - k)
    r = max((x for x in ranks if x is not None), default=0)
    for i, rank in enumerate(ranks):
        if rank is not None and rank < r:
            s = out[i]
            out[i] = s.reshape(s.shape[:k] + (1,) * (r - rank) + s.shape[k:])
    return out


def jax_promotion(values) -> list:
    """JAX's rule for integer and floating arrays together: the result has the floating type
    (int32 * float32 is float32 and int32 * bfloat16 is bfloat16, where numpy would give
    float64 or refuse). Python scalars are left to numpy's weak promotion, which matches JAX's."""
    arrays = [v for v in values if isinstance(v, np.ndarray)]
    floats = [a.dtype for a in arrays if a.dtype.kind == "f" or a.dtype == bfloat16]
    if not floats or all(a.dtype.kind not in "iub" for a in arrays):
        return list(values)
    target = np.result_type(*floats)
    return [v.astype(target) if isinstance(v, np.ndarray) and v.dtype.kind in "iub" else v for v in values]


def local_axes(axis, x: LocalArray):
    """Local axis (int, tuple or None) → storage axes."""
    k, r = x.mesh.ndim, x.ndim
    if axis is None:
        return tuple(range(k, k + r))
    if isinstance(axis, (tuple, list)):
        return tuple(local_axes(a, x) for a in axis)
    axis = int(axis)
    if not -r <= axis < r:
        raise np.exceptions.AxisError(f"axis {axis} is out of bounds for a value of rank {r}")
    return k + (axis % r)
