"""JAX's default PRNG, threefry2x32, in vectorized numpy, and its typed key arrays.

Everything here produces the same bits as JAX 0.10.2 with its defaults (``threefry2x32`` and
``jax_threefry_partitionable=True``):

- :func:`threefry2x32` is the Threefry-2x32 hash (20 rounds, JAX's rotation constants), on
  whole uint32 arrays at once;
- :func:`seed_data` is ``threefry_seed`` with x64 off: ``[0, seed mod 2**32]``;
- :func:`split_data` and :func:`random_bits_data` hash a 64-bit iota over the output shape (hi
  and lo words as the two counters), as the partitionable implementation does, so element
  ``i`` of an output depends only on the key and ``i`` — a sharded draw equals the unsharded one;
- :func:`fold_in_data` hashes the counter pair ``(0, data)``.

Key data are uint32 arrays whose last dim is 2; leading dims are a batch of keys.
:class:`PRNGKeyArray` wraps such data as a typed key array (``jax.random.key``), dtype
``key<fry>``.

Example:
    >>> from shardlab._src.ops import prng
    >>> prng.seed_data(0)
    array([0, 0], dtype=uint32)
    >>> prng.split_data(prng.seed_data(0), (2,)).tolist()
    [[1797259609, 2579123966], [928981903, 3453687069]]
"""

from __future__ import annotations

import math
import operator

import numpy as np

from ..arrays.shaped import Shaped
from ..core.dtypes import x64_enabled

KEY_SHAPE = (2,)
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_KS_PARITY = np.uint32(0x1BD11BDA)
UINT_DTYPES = {8: np.dtype("uint8"), 16: np.dtype("uint16"), 32: np.dtype("uint32"), 64: np.dtype("uint64")}


# --- the hash -----------------------------------------------------------------------------

def threefry2x32(k1, k2, x1, x2):
    """The Threefry-2x32 hash of counter pairs ``(x1, x2)`` under key ``(k1, k2)``.

    All four are uint32 arrays that broadcast together; returns the two hashed words, each of
    the broadcast shape (JAX's ``threefry2x32_p``).

    Example:
        >>> import numpy as np
        >>> from shardlab._src.ops.prng import threefry2x32
        >>> [int(w) for w in threefry2x32(np.uint32(0), np.uint32(0), np.uint32(0), np.uint32(0))]
        [1797259609, 2579123966]
    """
    u = np.uint32
    k1, k2, x1, x2 = (np.asarray(a, dtype=u) for a in (k1, k2, x1, x2))
    shape = np.broadcast_shapes(k1.shape, k2.shape, x1.shape, x2.shape)
    with np.errstate(over="ignore"):
        ks = (k1, k2, k1 ^ k2 ^ _KS_PARITY)
        a = np.array(np.broadcast_to(x1 + ks[0], shape), dtype=u)
        b = np.array(np.broadcast_to(x2 + ks[1], shape), dtype=u)
        tmp = np.empty(shape, dtype=u)
        for step in range(5):
            for r in _ROTATIONS[step % 2]:
                a += b
                np.left_shift(b, u(r), out=tmp)
                b >>= u(32 - r)
                b |= tmp
                b ^= a
            a += ks[(step + 1) % 3]
            b += ks[(step + 2) % 3] + u(step + 1)
    return a, b


def iota_2x32(shape):
    """The hi and lo uint32 words of ``arange(prod(shape), dtype=uint64).reshape(shape)``."""
    shape = tuple(shape)
    n = math.prod(shape)
    if n <= 2 ** 32:
        lo = np.arange(n, dtype=np.uint32).reshape(shape)
        return np.zeros(shape, dtype=np.uint32), lo
    c = np.arange(n, dtype=np.uint64).reshape(shape)
    return (c >> np.uint64(32)).astype(np.uint32), (c & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def _words(key_data, ndim: int):
    """The key's two words, with `ndim` trailing singleton dims to broadcast against a shape."""
    key_data = np.asarray(key_data, dtype=np.uint32)
    idx = (...,) + (None,) * ndim
    return key_data[..., 0][idx], key_data[..., 1][idx]


# --- the PRNG implementation --------------------------------------------------------------

def seed_data(seed) -> np.ndarray:
    """Key data ``uint32[2]`` for an integer seed, as JAX's ``threefry_seed`` with x64 off.

    JAX converts the seed to int32 (x64 off), so only its low 32 bits count and the high word
    is 0: ``seed_data(-1)`` is ``[0, 4294967295]``. With x64 on, a 64-bit seed (a Python int,
    int64, uint64) gives its high and low words.

    Raises:
        TypeError: a non-integer or non-scalar seed (JAX's messages).
        OverflowError: a Python int beyond int64, as JAX.
    """
    if isinstance(seed, (bool, int, np.integer, np.bool_)) and not isinstance(seed, np.ndarray):
        if isinstance(seed, int) and not isinstance(seed, bool) and not -2 ** 63 <= seed < 2 ** 63:
            raise OverflowError("Python int too large to convert to C long")
        wide = isinstance(seed, int) and not isinstance(seed, bool) or np.asarray(seed).dtype.itemsize == 8
        if wide and x64_enabled():  # a 64-bit seed keeps its high word when x64 is on
            return np.array([(int(seed) & 0xFFFFFFFFFFFFFFFF) >> 32, int(seed) & 0xFFFFFFFF], dtype=np.uint32)
        low = int(seed) & 0xFFFFFFFF
    else:
        arr = np.asarray(seed)
        if arr.dtype.kind not in "biu":
            if arr.dtype.kind in "fc":
                raise TypeError(f"PRNG key seed must be an integer; got {seed!r}")
            raise TypeError(f"Value {seed!r} with dtype {arr.dtype} is not a valid JAX array type. "
                            "Only arrays of numeric types are supported by JAX.")
        low = int(arr) & 0xFFFFFFFF
    return np.array([0, low], dtype=np.uint32)


def split_data(key_data, shape) -> np.ndarray:
    """``split`` on key data ``(..., 2)``: new keys of shape ``(..., *shape, 2)``."""
    shape = tuple(shape)
    hi, lo = iota_2x32(shape)
    a, b = threefry2x32(*_words(key_data, len(shape)), hi, lo)
    return np.stack([a, b], axis=-1)


def fold_in_data(key_data, data) -> np.ndarray:
    """``fold_in`` on key data ``(..., 2)`` and uint32 data that broadcasts with the keys."""
    k1, k2 = _words(key_data, 0)
    a, b = threefry2x32(k1, k2, np.uint32(0), np.asarray(data, dtype=np.uint32))
    return np.stack([a, b], axis=-1)


def random_bits_data(key_data, bit_width: int, shape) -> np.ndarray:
    """Uniform bits ``uint{bit_width}[..., *shape]`` from key data ``(..., 2)`` (JAX's
    partitionable ``threefry_random_bits``: 32 bits are ``hi ^ lo`` of the hashed iota, 8 and 16
    bits their low bits, 64 bits ``hi << 32 | lo``)."""
    if bit_width not in UINT_DTYPES:
        raise TypeError("requires 8-, 16-, 32- or 64-bit field width.")
    shape = tuple(shape)
    if math.prod(shape) > 2 ** 64:
        raise NotImplementedError("random bits array of size exceeding 2 ** 64")
    hi, lo = iota_2x32(shape)
    a, b = threefry2x32(*_words(key_data, len(shape)), hi, lo)
    if bit_width == 64:
        return (a.astype(np.uint64) << np.uint64(32)) | b.astype(np.uint64)
    a ^= b
    return a if bit_width == 32 else a.astype(UINT_DTYPES[bit_width])


# --- typed key arrays ---------------------------------------------------------------------

class KeyTy:
    """The dtype of typed key arrays: ``key<fry>`` for threefry2x32 (``jax.dtypes.prng_key``
    kind). Compares equal to itself and to the string ``"key<fry>"``."""

    name = "key<fry>"
    impl_name = "threefry2x32"
    tag = "fry"
    itemsize = 8
    kind = "V"
    type = None

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__

    def __eq__(self, other) -> bool:
        return isinstance(other, KeyTy) or other == self.name

    def __hash__(self) -> int:
        return hash(self.name)


KEY_DTYPE = KeyTy()


def _check_key_data(data, op: str = "wrap_key_data"):
    """JAX's checks on key data (``_check_prng_key_data``): uint32, ndim >= 1, trailing (2,)."""
    if not all(hasattr(data, a) for a in ("ndim", "shape", "dtype")):
        raise TypeError("JAX encountered invalid PRNG key data: expected key_data to have ndim, shape, and "
                        f"dtype attributes. Got {data}")
    if data.ndim < 1:
        raise TypeError(f"JAX encountered invalid PRNG key data: expected key_data.ndim >= 1; got ndim={data.ndim}")
    if tuple(data.shape[-1:]) != KEY_SHAPE:
        raise TypeError("JAX encountered invalid PRNG key data: expected key_data.shape to end with (2,); got "
                        f"shape={tuple(data.shape)} for impl=threefry2x32 (in {op}; a threefry key is uint32[2], "
                        "as jax.random.PRNGKey(seed) makes)")
    if np.dtype(data.dtype) != np.uint32:
        raise TypeError("JAX encountered invalid PRNG key data: expected key_data.dtype = uint32; "
                        f"got dtype={data.dtype}")


class PRNGKeyArray(Shaped):
    """An array of typed PRNG keys (``jax.random.key``): shape without the key's own (2,),
    dtype ``key<fry>``, no arithmetic. ``shardlab.random.key_data`` gives the uint32 data.

    The data is a numpy uint32 array ``(*shape, 2)``, or a LocalArray (a key inside a shard_map
    body) whose local shape is ``(*shape, 2)``.

    Example:
        >>> import shardlab as sl
        >>> keys = sl.random.split(sl.random.key(0), 3)
        >>> keys.shape, keys.dtype, keys[1].shape
        ((3,), key<fry>, ())
    """

    __slots__ = ("_base",)
    __array_priority__ = 300
    __hash__ = None

    def __init__(self, base):
        _check_key_data(base)
        self._base = base

    @property
    def shape(self) -> tuple:
        return tuple(self._base.shape[:-1])

    @property
    def dtype(self) -> KeyTy:
        return KEY_DTYPE



    @property
    def itemsize(self) -> int:
        return KEY_DTYPE.itemsize


    def _index(self, idx):
        idx = idx if isinstance(idx, tuple) else (idx,)
        if any(i is Ellipsis for i in idx):
            return idx + (slice(None),)
        return idx

    def __getitem__(self, idx):
        if not self.shape:
            raise IndexError("Too many indices: 0-dimensional key array cannot be indexed")
        if isinstance(idx, PRNGKeyArray):
            raise TypeError("key arrays cannot index other arrays")
        return PRNGKeyArray(self._base[self._index(idx)])

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d key array")
        return (PRNGKeyArray(self._base[i]) for i in range(self.shape[0]))

    def __bool__(self):
        raise TypeError("key array cannot be converted to boolean.")

    def __array__(self, dtype=None, copy=None):
        raise TypeError("JAX array with PRNGKey dtype cannot be converted to a NumPy array. Use "
                        "jax.random.key_data(arr) if you wish to extract the underlying integer array.")

    def reshape(self, *shape, order="C"):
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        shape = tuple(operator.index(s) for s in shape)
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape = tuple(self.size // max(known, 1) if s == -1 else s for s in shape)
        return PRNGKeyArray(np.reshape(self._base, (*shape, 2), order=order))

    def ravel(self):
        return self.reshape(self.size)

    flatten = ravel

    @property
    def T(self):
        perm = (*range(self.ndim - 1, -1, -1), self.ndim)
        return PRNGKeyArray(np.transpose(self._base, perm))

    def copy(self):
        return PRNGKeyArray(np.array(self._base, copy=True))

    def _compare(self, other, op):
        if not isinstance(other, PRNGKeyArray):
            raise TypeError(f"{op} of a key array (dtype key<fry>) and {type(other).__name__}: key arrays "
                            "compare only with key arrays")
        eq = np.all(np.asarray(self._base) == np.asarray(other._base), axis=-1)
        return eq if op == "==" else ~eq

    def __eq__(self, other):
        return self._compare(other, "==")

    def __ne__(self, other):
        return self._compare(other, "!=")

    def __repr__(self) -> str:
        return f"Array({self.shape}, dtype={KEY_DTYPE.name}) overlaying:\n{self._base}"

    def _arith(self, *_args, **_kwargs):
        raise TypeError("key arrays (dtype key<fry>) have no arithmetic; use jax.random.key_data(keys) for "
                        "the uint32 data")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __xor__ = _arith

