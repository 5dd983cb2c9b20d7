"""Element types and jax.numpy's rules for combining them.

shardlab knows the 13 dtypes JAX has on the CPU (complex aside): ``bool``, ``int8/16/32/64``,
``uint8/16/32/64``, ``float16``, ``bfloat16`` (from ml_dtypes), ``float32`` and ``float64``.
One table, :data:`TABLE`, lists each with its kind, size and place in JAX's type promotion
lattice; everything else here is computed from it:

- :func:`promote_types` and :func:`result_type` follow ``jax.numpy``'s lattice, including weakly
  typed Python scalars (``int32 + 1.0`` is float32, ``uint8 + 3`` stays uint8);
- :func:`canonicalize_dtype` drops 64-bit types to 32-bit ones while x64 is off, as JAX does by
  default; :func:`set_x64` turns x64 on (:func:`x64_enabled` reads it);
- :func:`to_inexact_dtype` is the dtype of ops that need a float result (``mean``, ``tanh``).

The older names keep their behaviour: :data:`SUPPORTED`, :func:`check_dtype` and
:func:`canonicalize` describe the six dtypes the rest of shardlab moves today.

Example:
    >>> from shardlab import dtypes
    >>> dtypes.promote_types("uint8", "int8")
    dtype('int16')
    >>> dtypes.result_type("int32", 1.0)
    dtype('float32')
    >>> with dtypes.x64_scope(True):
    ...     dtypes.result_type("int32", 1.0)
    dtype('float64')
"""

import contextlib
import dataclasses
import functools

import ml_dtypes
import numpy as np

__all__ = ["DTYPES", "DTypeInfo", "SUPPORTED", "TABLE", "WEAK_FLOAT", "WEAK_INT", "bfloat16", "bool_",
           "canonicalize", "canonicalize_dtype", "check_dtype", "default_float_dtype", "default_int_dtype",
           "default_uint_dtype", "dtype_info", "float16", "float32", "float64", "int16", "int32", "int64",
           "int8", "is_weakly_typed", "itemsize", "promote_types", "result_type", "set_x64",
           "to_inexact_dtype", "uint16", "uint32", "uint64", "uint8", "x64_enabled", "x64_scope"]

bool_ = np.dtype(np.bool_)
int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint8 = np.dtype(np.uint8)
uint16 = np.dtype(np.uint16)
uint32 = np.dtype(np.uint32)
uint64 = np.dtype(np.uint64)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)

# The dtypes the collectives, kernels and arrays move today (check_dtype and canonicalize).
SUPPORTED = (float32, float64, bfloat16, int32, int8, bool_)

# Lattice nodes of weakly typed Python scalars: `int` and `float` values (and the types
# themselves) take the width of the array they meet.
WEAK_INT = "int"
WEAK_FLOAT = "float"


@dataclasses.dataclass(frozen=True)
class DTypeInfo:
    """One row of :data:`TABLE`: a dtype and its place in JAX's promotion lattice.

    Attributes:
        name: the dtype's name, as ``np.dtype(name)`` accepts it ("bool", "bfloat16", ...).
        dtype: the ``np.dtype``.
        kind: "b" (bool), "i" (signed), "u" (unsigned) or "f" (floating, bfloat16 included).
        itemsize: bytes per element.
        above: the lattice nodes directly above this one with x64 on (names, or "int"/"float"
            for the weak Python scalar types); a promotion goes up the lattice to the lowest
            node above both inputs.

    Example:
        >>> from shardlab import dtypes
        >>> dtypes.dtype_info("uint8")  # doctest: +NORMALIZE_WHITESPACE
        DTypeInfo(name='uint8', dtype=dtype('uint8'), kind='u', itemsize=1,
                  above=('uint16', 'int16'))
    """

    name: str
    dtype: np.dtype
    kind: str
    itemsize: int
    above: tuple


def _row(dtype, kind, above):
    return DTypeInfo(dtype.name, dtype, kind, dtype.itemsize, tuple(above))


# JAX's lattice (jax/_src/dtypes.py, standard mode): bool < int (weak) < {uint8, int8};
# unsigned u < the next unsigned and the next wider signed; 64-bit integers < float (weak)
# < {bfloat16, float16} < float32 < float64.
TABLE = (
    _row(bool_, "b", [WEAK_INT]),
    _row(uint8, "u", ["uint16", "int16"]),
    _row(uint16, "u", ["uint32", "int32"]),
    _row(uint32, "u", ["uint64", "int64"]),
    _row(uint64, "u", [WEAK_FLOAT]),
    _row(int8, "i", ["int16"]),
    _row(int16, "i", ["int32"]),
    _row(int32, "i", ["int64"]),
    _row(int64, "i", [WEAK_FLOAT]),
    _row(float16, "f", ["float32"]),
    _row(bfloat16, "f", ["float32"]),
    _row(float32, "f", ["float64"]),
    _row(float64, "f", []),
)
_WEAK_ABOVE = {WEAK_INT: ("uint8", "int8"), WEAK_FLOAT: ("bfloat16", "float16")}
# With x64 off no promotion may form a 64-bit type from narrower inputs, so uint32 sits below
# int32 instead of int64 (uint32 + int32 -> int32, as in JAX).
_X64_OFF_ABOVE = {"uint32": ("int32", "uint64")}

DTYPES = tuple(row.dtype for row in TABLE)
_BY_DTYPE = {row.dtype: row for row in TABLE}
_NAMES = ", ".join(row.name for row in TABLE)
_TO_32BIT = {int64: int32, uint64: uint32, float64: float32}
# Ops needing an inexact result: narrow integers and bool become float32 (also with x64 on,
# as in JAX), 64-bit integers float64; floats stay.
_TO_INEXACT = {int64: float64, uint64: float64,
               **{row.dtype: float32 for row in TABLE if row.kind in "bui" and row.itemsize < 8}}


# --- the x64 setting ---------------------------------------------------------------------

class _Settings:
    """The module's one switch, x64, read by every rule here (JAX's "jax_enable_x64")."""

    __slots__ = ("x64",)

    def __init__(self):
        self.x64 = False


_SETTINGS = _Settings()


def x64_enabled() -> bool:
    """Whether 64-bit types are on (JAX's ``jax_enable_x64``); off by default, as in JAX.

    Example:
        >>> from shardlab import dtypes
        >>> dtypes.x64_enabled()
        False
    """
    return _SETTINGS.x64


def set_x64(enabled: bool) -> None:
    """Turns 64-bit types on or off for every rule in this module.

    Args:
        enabled: True for JAX's x64 mode (int64/uint64/float64 kept), False for the default.

    Raises:
        TypeError: ``enabled`` is not a bool.

    Example:
        >>> from shardlab import dtypes
        >>> dtypes.set_x64(True); dtypes.canonicalize_dtype("float64")
        dtype('float64')
        >>> dtypes.set_x64(False); dtypes.canonicalize_dtype("float64")
        dtype('float32')
    """
    if not isinstance(enabled, (bool, np.bool_)):
        raise TypeError(f"[set_x64] enabled must be True or False, got {enabled!r}")
    _SETTINGS.x64 = bool(enabled)


@contextlib.contextmanager
def x64_scope(enabled: bool):
    """Context manager: x64 on (or off) inside the block, the previous setting after it.

    Example:
        >>> from shardlab import dtypes
        >>> with dtypes.x64_scope(True):
        ...     dtypes.x64_enabled()
        True
        >>> dtypes.x64_enabled()
        False
    """
    before = _SETTINGS.x64
    set_x64(enabled)
    try:
        yield
    finally:
        _SETTINGS.x64 = before


# --- dtypes and their canonical forms ----------------------------------------------------

def _describe(value) -> str:
    if isinstance(value, np.dtype):
        return str(value)
    if isinstance(value, type):
        return value.__name__
    return repr(value)


def _unsupported(value, op: str) -> TypeError:
    return TypeError(f"[{op}] dtype {_describe(value)} is not supported; use one of {_NAMES} "
                     f"(or the Python types bool, int, float)")


def _as_dtype(value, op: str) -> np.dtype:
    """`value` (a name, np.dtype, scalar type) as one of the table's dtypes, not canonicalized."""
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError):
        raise _unsupported(value, op) from None
    if dtype not in _BY_DTYPE:
        raise _unsupported(value, op)
    return dtype


# Names the calculators take beside numpy's, and storage formats shardlab prices but does not
# compute in (bytes per element): the one dtype -> bytes table, with TABLE's rows.
_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32",
            "fp64": "float64", "double": "float64"}
_STORAGE_BYTES = {"fp8": 1, "float8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "int4": 0.5}
_BY_NAME = {row.name: row for row in TABLE}


def itemsize(dtype, op: str = "dtype") -> float:
    """Bytes per element of ``dtype``: a numpy or ml_dtypes dtype, a name (``"bfloat16"``,
    ``"bf16"``, ``"fp32"``, ...), or a storage format the cost and memory calculators price
    (``"fp8"``: 1, ``"int4"``: 0.5).

    Example:
        >>> from shardlab import dtypes
        >>> dtypes.itemsize("bf16"), dtypes.itemsize("float32"), dtypes.itemsize("int4")
        (2, 4, 0.5)

    Raises:
        ValueError: an unknown name, naming ``op``.
    """
    if isinstance(dtype, str):
        key = _ALIASES.get(dtype.lower(), dtype.lower())
        if key in _STORAGE_BYTES:
            return _STORAGE_BYTES[key]
        if key in _BY_NAME:
            return _BY_NAME[key].itemsize
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        raise ValueError(f"[{op}] unknown dtype {dtype!r}; use one of {_NAMES}, "
                         f"{', '.join(list(_ALIASES) + list(_STORAGE_BYTES))}, or a numpy dtype") from None


def dtype_info(dtype) -> DTypeInfo:
    """The :data:`TABLE` row of `dtype` (a name, np.dtype or scalar type).

    Raises:
        TypeError: `dtype` is not one of the 13 array dtypes in :data:`TABLE`.

    Example:
        >>> from shardlab import dtypes
        >>> info = dtypes.dtype_info("bfloat16")
        >>> info.kind, info.itemsize, info.above
        ('f', 2, ('float32',))
    """
    return _BY_DTYPE[_as_dtype(dtype, "dtype_info")]


def canonicalize_dtype(dtype) -> np.dtype:
    """JAX's canonical form of `dtype`: with x64 off, int64->int32, uint64->uint32,
    float64->float32; with x64 on, the dtype itself.

    Args:
        dtype: a name ("int64"), np.dtype, numpy scalar type, or the Python types bool, int,
            float (numpy's meaning: int is int64, float is float64).

    Raises:
        TypeError: `dtype` is not a dtype shardlab knows; the message lists the ones it does.

    Example:
        >>> from shardlab import dtypes
        >>> dtypes.canonicalize_dtype("int64"), dtypes.canonicalize_dtype(float)
        (dtype('int32'), dtype('float32'))
        >>> dtypes.canonicalize_dtype("complex64")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        TypeError: [canonicalize_dtype] dtype 'complex64' is not supported; use one of bool, ...
    """
    return _canonical(_as_dtype(dtype, "canonicalize_dtype"))


def _canonical(dtype: np.dtype) -> np.dtype:
    return dtype if _SETTINGS.x64 else _TO_32BIT.get(dtype, dtype)


def default_int_dtype() -> np.dtype:
    """int64 with x64 on, else int32: the dtype of a Python int and of signed integer sums.

    Example:
        >>> from shardlab import dtypes
        >>> dtypes.default_int_dtype()
        dtype('int32')
    """
    return _canonical(int64)


def default_uint_dtype() -> np.dtype:
    """uint64 with x64 on, else uint32: the dtype of unsigned integer sums.

    Example:
        >>> from shardlab import dtypes
        >>> with dtypes.x64_scope(True):
        ...     dtypes.default_uint_dtype()
        dtype('uint64')
    """
    return _canonical(uint64)


def default_float_dtype() -> np.dtype:
    """float64 with x64 on, else float32: the dtype of a Python float.

    Example:
        >>> from shardlab import dtypes
        >>> dtypes.default_float_dtype()
        dtype('float32')
    """
    return _canonical(float64)


_DEFAULT = {"b": lambda: bool_, "i": default_int_dtype, "u": default_uint_dtype,
            "f": default_float_dtype}


def to_inexact_dtype(dtype) -> np.dtype:
    """The result dtype of an op that needs a float (``mean``, ``tanh``, ``var``) on `dtype`.

    bool and integers up to 32 bits give float32 (with x64 on too, as in JAX); int64 and
    uint64 give float64; floats stay. The result is canonical, so with x64 off everything
    lands on float32, float16 or bfloat16.

    Example:
        >>> from shardlab import dtypes
        >>> dtypes.to_inexact_dtype("int32"), dtypes.to_inexact_dtype("bfloat16").name
        (dtype('float32'), 'bfloat16')
        >>> with dtypes.x64_scope(True):
        ...     dtypes.to_inexact_dtype("int64"), dtypes.to_inexact_dtype("int32")
        (dtype('float64'), dtype('float32'))
    """
    dtype = _as_dtype(dtype, "to_inexact_dtype")
    return _canonical(_TO_INEXACT.get(dtype, dtype))


# --- the promotion lattice ---------------------------------------------------------------

def _edges(x64: bool) -> dict:
    edges = {row.name: row.above for row in TABLE}
    edges.update(_WEAK_ABOVE)
    if not x64:
        edges.update(_X64_OFF_ABOVE)
    return edges


@functools.cache
def _upper_bounds(x64: bool) -> dict:
    """Each lattice node -> the set of nodes at or above it (reflexive-transitive closure)."""
    edges = _edges(x64)

    def closure(node):
        seen, todo = {node}, [node]
        while todo:
            for up in edges[todo.pop()]:
                if up not in seen:
                    seen.add(up)
                    todo.append(up)
        return frozenset(seen)

    return {node: closure(node) for node in edges}


@functools.cache
def _least_upper_bound(x64: bool, nodes: frozenset) -> str:
    """The lowest node above every one of `nodes`; the lattice guarantees it is unique."""
    bounds = _upper_bounds(x64)
    common = frozenset.intersection(*(bounds[n] for n in nodes))
    least = [c for c in common if common <= bounds[c]]
    assert len(least) == 1, (nodes, least)
    return least[0]


def _node_dtype(node: str) -> np.dtype:
    """np.dtype of a lattice node; the weak nodes mean numpy's int (int64) and float (float64)."""
    if node == WEAK_INT:
        return int64
    return float64 if node == WEAK_FLOAT else np.dtype(node)


def _promote_node(value, op: str) -> str:
    if value is int:
        return WEAK_INT
    if value is float:
        return WEAK_FLOAT
    return _as_dtype(value, op).name


def promote_types(a, b) -> np.dtype:
    """The dtype a binary op casts `a` and `b` to: ``jax.numpy.promote_types``.

    The Python types ``int`` and ``float`` are weak: they take the other side's width
    (``promote_types("uint8", int)`` is uint8, numpy says int64). Like JAX, the inputs are
    not canonicalized ("int64" stays int64 with x64 off) and two weak types give numpy's
    int64 / float64; the x64 setting changes one rule, uint32 + int32 (int32 with x64 off,
    int64 with it on).

    Args:
        a, b: dtype names, np.dtypes, numpy scalar types, or the Python types bool, int, float.

    Raises:
        TypeError: a dtype shardlab does not know (complex, float8, strings, ...).

    Example:
        >>> from shardlab import dtypes
        >>> dtypes.promote_types("int8", "uint8"), dtypes.promote_types("bfloat16", "float16")
        (dtype('int16'), dtype('float32'))
        >>> dtypes.promote_types("uint8", int), dtypes.promote_types("int64", "float16")
        (dtype('uint8'), dtype('float16'))
    """
    nodes = frozenset((_promote_node(a, "promote_types"), _promote_node(b, "promote_types")))
    return _node_dtype(_least_upper_bound(_SETTINGS.x64, nodes))


# --- values: weak types and result_type ---------------------------------------------------

_WEAK_SCALARS = (int, float, complex)


def is_weakly_typed(x) -> bool:
    """Whether `x` is weakly typed: a Python int or float value (not bool), or an array whose
    ``weak_type`` (or ``aval.weak_type``, for JAX arrays) is set.

    Example:
        >>> import numpy as np
        >>> from shardlab import dtypes
        >>> dtypes.is_weakly_typed(3), dtypes.is_weakly_typed(True)
        (True, False)
        >>> dtypes.is_weakly_typed(np.int32(3)), dtypes.is_weakly_typed(np.zeros(2))
        (False, False)
    """
    if type(x) in _WEAK_SCALARS:
        return True
    flag = getattr(x, "weak_type", None)
    if flag is None:
        flag = getattr(getattr(x, "aval", None), "weak_type", False)
    return bool(flag)


def _dtype_and_weak(x, op: str) -> tuple:
    """(canonical dtype, weak) of one result_type argument, as jax.dtypes.dtype sees it."""
    if x is None:
        return default_float_dtype(), False
    if x is int or x is float:
        return _canonical(_node_dtype(_promote_node(x, op))), True
    if type(x) in (bool, int, float, complex):
        return _canonical(_as_dtype(type(x), op)), type(x) is not bool
    if isinstance(x, (str, np.dtype, type)):
        return _canonical(_as_dtype(x, op)), False
    dtype = getattr(x, "dtype", None)
    if not isinstance(dtype, np.dtype):
        try:
            dtype = np.result_type(x)
        except (TypeError, ValueError):
            raise TypeError(f"[{op}] cannot tell the dtype of {type(x).__name__} {x!r}; pass "
                            f"an array, a Python scalar or a dtype") from None
    return _canonical(_as_dtype(dtype, op)), is_weakly_typed(x)


def _weak_node(dtype: np.dtype, weak: bool) -> str:
    """The lattice node of a value: its dtype, or for weak values the Python type's node."""
    kind = _BY_DTYPE[dtype].kind
    if not weak or kind == "b":
        return dtype.name
    return WEAK_INT if kind in "iu" else WEAK_FLOAT


def _lattice_result_type(args, op: str) -> tuple:
    dtypes, weaks = zip(*(_dtype_and_weak(x, op) for x in args))
    if len(dtypes) == 1:
        dtype, weak = dtypes[0], weaks[0]
    elif len(set(dtypes)) == 1 and not all(weaks):
        dtype, weak = dtypes[0], False
    elif all(weaks):
        # Only weak values: promote their strong dtypes, and the result is weak.
        node = _least_upper_bound(_SETTINGS.x64, frozenset(d.name for d in dtypes))
        dtype, weak = _canonical(_node_dtype(node)), True
    else:
        node = _least_upper_bound(_SETTINGS.x64,
                                  frozenset(_weak_node(d, w) for d, w in zip(dtypes, weaks)))
        dtype, weak = _canonical(_node_dtype(node)), node in (WEAK_INT, WEAK_FLOAT)
    return dtype, weak and dtype != bool_


def result_type(*args, return_weak_type_flag: bool = False):
    """The dtype of an elementwise op on `args`: ``jax.numpy.result_type``.

    Arguments are canonicalized first (an int64 numpy array counts as int32 with x64 off).
    Python int and float values (and the types ``int``, ``float``) are weak: they do not
    widen a typed operand, so ``int8 + 3`` is int8 and ``float16 + 1.0`` is float16, while
    ``int32 + 1.0`` goes to the float side, float32. Python bools are not weak (they are
    bool). A weak result becomes the default type of its kind (int32 or float32 with x64
    off, int64 or float64 with it on). ``None`` stands for the default float type.

    Args:
        *args: arrays (anything with a ``.dtype``), Python or numpy scalars, dtypes, names.
        return_weak_type_flag: also return whether the result is weakly typed.

    Returns:
        The np.dtype, or ``(dtype, weak)`` with `return_weak_type_flag`.

    Raises:
        ValueError: no arguments.
        TypeError: an argument whose dtype shardlab does not know.

    Example:
        >>> import numpy as np
        >>> from shardlab import dtypes
        >>> x = np.zeros(3, np.int8)
        >>> dtypes.result_type(x, 3), dtypes.result_type(x, 3.0)
        (dtype('int8'), dtype('float32'))
        >>> dtypes.result_type(2, 0.5, return_weak_type_flag=True)
        (dtype('float32'), True)
        >>> dtypes.result_type(np.zeros(3, np.uint32), np.zeros(3, np.int32))
        dtype('int32')
    """
    if not args:
        raise ValueError("[result_type] at least one array or dtype is required")
    dtype, weak = _lattice_result_type(args, "result_type")
    if weak:
        dtype = _DEFAULT[_BY_DTYPE[dtype].kind]()
    return (dtype, weak) if return_weak_type_flag else dtype


# --- the six dtypes the collectives and kernels move today --------------------------------

def check_dtype(dtype, op: str) -> np.dtype:
    """Returns `dtype` as np.dtype, or raises TypeError naming `op` and the supported types."""
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED:
        raise TypeError(f"[{op}] dtype {dtype} is not supported; use one of "
                        f"{', '.join(str(d) for d in SUPPORTED)} (cast with .astype)")
    return dtype


def canonicalize(arr, op: str) -> np.ndarray:
    """`arr` as a numpy array of JAX's canonical dtype (:func:`canonicalize_dtype`: with x64 off
    float64 -> float32, int64 -> int32, uint64 -> uint32), in native byte order; what a value
    entering shardlab (device_put, shard_map, a constant) becomes.

    Raises:
        OverflowError: integers that do not fit the canonical type (JAX would wrap them).
        TypeError: a dtype shardlab does not have (complex, object, ...), naming `op`.

    Example:
        >>> import numpy as np
        >>> from shardlab import dtypes
        >>> dtypes.canonicalize(np.arange(3.0), "device_put").dtype, dtypes.canonicalize(np.uint8([1]), "op").dtype
        (dtype('float32'), dtype('uint8'))
    """
    arr = np.asarray(arr)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    target = _canonical(_as_dtype(arr.dtype, op))
    if target == arr.dtype:
        return arr
    if target.kind in "iu" and arr.size:
        info = np.iinfo(target)
        if arr.max() > info.max or arr.min() < info.min:
            raise OverflowError(f"[{op}] integer values do not fit in {target} (JAX's {target} with x64 off); "
                                f"enable x64 (shardlab.config.update('enable_x64', True)) or scale them")
    return arr.astype(target)
