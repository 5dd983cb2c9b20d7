"""``typeof(x)``: a value's type with its sharding, as ``jax.typeof``.

A global ShardedArray's type is its shape, dtype and sharding (the book's ``f32[8@X,4]``):
the spec keeps the Explicit mesh axes only (an Auto axis is the compiler's choice, not part of
the type) and is padded with None to the rank; unreduced / reduced axes print as ``{U:X}`` /
``{R:X}``. Inside ``shard_map`` a LocalArray's type is the per-device shape on the mesh with
every axis Manual, and the axes it varies along print as ``{V:X}``. Host values (numpy arrays
and scalars) have no sharding part; Python scalars are weakly typed (``~float32[]``).

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((2, 4), ("X", "Y"))
    >>> a = sl.device_put(np.zeros((8, 4), np.float32), sl.NamedSharding(mesh, P("X", "Y")))
    >>> sl.typeof(a), sl.typeof(a).sharding.spec
    (ShapedArray(float32[8@X,4@Y]), P('X', 'Y'))
    >>> print(sl.typeof(a)), print(sl.typeof(1.0))
    float32[8@X,4@Y]
    ~float32[]
    (None, None)
"""

from __future__ import annotations

import weakref

import numpy as np

from ..core.dtypes import canonicalize_dtype
from ..core.mesh import AxisType, empty_abstract_mesh, manual_view
from ..core.sharding import NamedSharding, PartitionSpec
from .local_array import LocalArray
from .shaped import Shaped
from .sharded_array import ShardedArray
from .storage import AbstractStorage


class ManualAxisType:
    """How a value inside ``shard_map`` relates to the manual mesh axes, as JAX's
    ``jax.sharding.ManualAxisType`` (``jax.typeof(x).manual_axis_type``): the axes it
    ``varying`` along (a different value per device), and those along which it is an
    ``unreduced`` partial sum or ``reduced`` (summed, kept for the cotangent's sake). Equal
    contents give the same object (interned, as JAX's).

    Example:
        >>> from shardlab.sharding import ManualAxisType
        >>> m = ManualAxisType(varying={"i"})
        >>> m.varying == {"i"}, m is ManualAxisType(varying=frozenset({"i"})), m.update(varying=set()).empty
        (True, True, True)
    """

    __slots__ = ("varying", "unreduced", "reduced", "__weakref__")
    _interned: "weakref.WeakValueDictionary" = None  # type: ignore[assignment]

    def __new__(cls, *, varying=frozenset(), unreduced=frozenset(), reduced=frozenset()):
        varying, unreduced, reduced = frozenset(varying), frozenset(unreduced), frozenset(reduced)
        if varying & unreduced:
            raise ValueError("varying and unreduced cannot have common mesh axes. Got"
                             f" varying={varying} and unreduced={unreduced}")
        if varying & reduced:
            raise ValueError("varying and reduced cannot have common mesh axes. Got"
                             f" varying={varying} and reduced={reduced}")
        key = (varying, unreduced, reduced)
        obj = _MATS.get(key)
        if obj is None:
            obj = object.__new__(cls)
            object.__setattr__(obj, "varying", varying)
            object.__setattr__(obj, "unreduced", unreduced)
            object.__setattr__(obj, "reduced", reduced)
            _MATS[key] = obj
        return obj

    def __setattr__(self, name, value):
        raise AttributeError(f"ManualAxisType is immutable; use .update({name}=...)")

    def __repr__(self):
        return (f"ManualAxisType(varying={self.varying}, unreduced={self.unreduced}, "
                f"reduced={self.reduced})")

    def __reduce__(self):
        return (_make_mat, (self.varying, self.unreduced, self.reduced))

    def update(self, **kwargs) -> "ManualAxisType":
        """A copy with some of varying, unreduced, reduced replaced."""
        fields = {k: getattr(self, k) for k in ("varying", "unreduced", "reduced")}
        fields.update(kwargs)
        return ManualAxisType(**fields)

    def to_ct_mat(self) -> "ManualAxisType":
        """The cotangent's: unreduced and reduced swapped."""
        return self.update(unreduced=self.reduced, reduced=self.unreduced)

    @property
    def empty(self) -> bool:
        """Neither varying, unreduced nor reduced along any axis."""
        return not (self.varying or self.unreduced or self.reduced)

    def invarying(self, mesh) -> frozenset:
        """The manual axes of `mesh` along which the value is the same on every device."""
        manual = frozenset(n for n, t in zip(mesh.axis_names, mesh.axis_types) if t == AxisType.Manual)
        return manual - self.vur

    @property
    def vur(self) -> frozenset:
        """varying | unreduced | reduced."""
        return self.varying | self.unreduced | self.reduced


_MATS: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()


def _make_mat(varying, unreduced, reduced):
    return ManualAxisType(varying=varying, unreduced=unreduced, reduced=reduced)


class ShapedArray(Shaped):
    """An abstract value: shape, dtype, weak type and sharding (plus, inside shard_map, the
    mesh axes the value varies along), as JAX's ``core.ShapedArray``. ``str`` is JAX's short
    form (``float32[8@X,4]{V:Y}``), ``repr`` wraps it (``ShapedArray(float32[8@X,4])``).
    ``manual_axis_type`` (also ``mat``) is JAX's :class:`ManualAxisType`; ``vma`` (JAX's name
    before 0.10) is its ``varying`` set."""

    __slots__ = ("shape", "dtype", "weak_type", "sharding", "vma")

    def __init__(self, shape, dtype, weak_type: bool = False, sharding: NamedSharding | None = None,
                 vma: frozenset = frozenset(), *, manual_axis_type: ManualAxisType | None = None):
        if manual_axis_type is not None:
            vma = manual_axis_type.varying
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.weak_type = bool(weak_type)
        if sharding is None:
            sharding = NamedSharding(empty_abstract_mesh(), PartitionSpec(*[None] * len(self.shape)))
        self.sharding = sharding
        self.vma = frozenset(vma)

    @property
    def manual_axis_type(self) -> ManualAxisType:
        """The manual axes the value varies along (``.varying``), as JAX 0.10's
        ``ShapedArray.manual_axis_type``; outside shard_map it is empty."""
        return ManualAxisType(varying=self.vma)

    mat = manual_axis_type



    def str_short(self) -> str:
        """JAX's short form without the weak-type mark: ``float32[8@X,4]{V:Y}``."""
        spec = self.sharding.spec
        dims = []
        for size, entry in zip(self.shape, spec.partitions):
            if entry is None:
                dims.append(f"{size}")
            elif isinstance(entry, tuple):
                dims.append(f"{size}@({','.join(entry)})")
            else:
                dims.append(f"{size}@{entry}")
        return f"{self.dtype.name}[{','.join(dims)}]{self._decorations()}"

    def _decorations(self) -> str:
        names = self.sharding.mesh.axis_names
        parts = []
        for prefix, axes in (("V", self.vma), ("U", self.sharding.spec.unreduced),
                             ("R", self.sharding.spec.reduced)):
            if axes:
                ordered = [a for a in names if a in axes]
                parts.append(f"{prefix}:{ordered[0]}" if len(ordered) == 1 else f"{prefix}:({','.join(ordered)})")
        return "{" + ", ".join(parts) + "}" if parts else ""

    def __str__(self):
        return ("~" if self.weak_type else "") + self.str_short()

    def __repr__(self):
        return f"ShapedArray({self.str_short()}{', weak_type=True' if self.weak_type else ''})"

    def __eq__(self, other):
        return isinstance(other, ShapedArray) and (self.shape, self.dtype, self.weak_type, self.vma) == \
            (other.shape, other.dtype, other.weak_type, other.vma) and self.sharding == other.sharding

    def __hash__(self):
        return hash((self.shape, self.dtype, self.weak_type, self.vma))

    def update(self, **kwargs) -> "ShapedArray":
        """A copy with some of shape, dtype, weak_type, sharding, vma (or manual_axis_type)
        replaced."""
        fields = {k: getattr(self, k) for k in self.__slots__}
        if "manual_axis_type" in kwargs:
            kwargs["vma"] = kwargs.pop("manual_axis_type").varying
        fields.update(kwargs)
        return ShapedArray(**fields)


def _type_spec(spec: PartitionSpec, mesh, ndim: int) -> PartitionSpec:
    """The spec as the type carries it: Explicit axes only, padded with None to the rank."""
    types = mesh._name_to_type
    entries = []
    for d in range(ndim):
        axes = tuple(a for a in spec.axes_of(d) if types.get(a) == AxisType.Explicit)
        entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*entries, unreduced=spec.unreduced, reduced=spec.reduced)


def _scalar_dtype(x) -> np.dtype:
    if isinstance(x, bool):
        return np.dtype(np.bool_)
    if isinstance(x, int):
        return canonicalize_dtype(np.int64)
    if isinstance(x, float):
        return canonicalize_dtype(np.float64)
    return np.dtype(np.complex128 if canonicalize_dtype(np.float64) == np.float64 else np.complex64)


def _host_dtype(dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        return np.dtype(np.complex64) if canonicalize_dtype(np.float64) == np.float32 else dtype
    return canonicalize_dtype(dtype)


def typeof(x) -> ShapedArray:
    """The type of `x` (shape, dtype, weak type, sharding), as ``jax.typeof``.

    Works on global ShardedArrays (abstract ones too), ``ShapeDtypeStruct``s, per-device
    LocalArrays inside ``shard_map`` (the local shape, with the varying axes as ``{V:...}``),
    numpy arrays and Python and numpy scalars (in JAX's canonical dtypes: float64 is float32 unless x64 is on).

    Raises:
        TypeError: `x` is not an array or scalar (JAX's message: "... is not a valid JAX type").

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((4,), ("X",))
        >>> def f(x):
        ...     print(sl.typeof(x))
        ...     return x
        >>> _ = sl.shard_map(f, mesh=mesh, in_specs=P("X"), out_specs=P("X"))(np.ones((8, 2), np.float32))
        float32[2,2]{V:X}
        >>> print(sl.typeof(np.arange(3)))
        int32[3]
    """
    if isinstance(x, ShardedArray):
        mesh = x.sharding.mesh.abstract_mesh
        spec = _type_spec(x.sharding.spec, x.sharding.mesh, x.ndim)
        return ShapedArray(x.shape, x.dtype, x.weak_type, NamedSharding(mesh, spec))
    if isinstance(x, LocalArray):
        m = manual_view(x.mesh)
        return ShapedArray(x.shape, x.dtype, False, NamedSharding(m, PartitionSpec(*[None] * x.ndim)),
                           frozenset(x.varying_axes))
    if type(x).__name__ == "ShapeDtypeStruct":  # transforms' class; the arrays layer cannot import it
        sharding = getattr(x, "sharding", None)
        if isinstance(sharding, NamedSharding):
            mesh = sharding.mesh.abstract_mesh
            return ShapedArray(x.shape, x.dtype, bool(getattr(x, "weak_type", False)),
                               NamedSharding(mesh, _type_spec(sharding.spec, sharding.mesh, len(x.shape))))
        return ShapedArray(x.shape, x.dtype, bool(getattr(x, "weak_type", False)))
    if isinstance(x, (bool, int, float, complex)) and not isinstance(x, np.generic):
        return ShapedArray((), _scalar_dtype(x), weak_type=not isinstance(x, bool))
    if isinstance(x, (np.ndarray, np.generic, AbstractStorage)) and np.dtype(x.dtype).kind in "biufcV":
        return ShapedArray(np.shape(x) if not isinstance(x, AbstractStorage) else x.shape, _host_dtype(x.dtype))
    if isinstance(x, str):  # JAX words this one without quotes around the type
        raise TypeError(f"Argument '{x}' of type {type(x)} is not a valid JAX type")
    raise TypeError(f"Argument '{x}' of type '{type(x)}' is not a valid JAX type")


ShardedArray.aval = property(typeof, doc="The array's type, ``typeof(x)`` (``jax.Array.aval``).")
