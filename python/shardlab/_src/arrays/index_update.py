"""``x.at[idx]``: JAX's functional index updates, one front for every array kind.

``x.at[idx].set(v)`` (and add, subtract, multiply, divide, power, min, max, apply, get)
return updated copies, as ``jax.Array.at``. Each array kind (a host array, a per-device
value, a global array) supplies its own gather and scatter through :class:`IndexOps`; the
methods, their keyword arguments and their names are this one class.

Example:
    >>> import shardlab.numpy as jnp
    >>> x = jnp.zeros(4)
    >>> x.at[1].set(5.0).tolist(), x.at[::2].add(1.0).tolist()
    ([0.0, 5.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0])
"""

from __future__ import annotations

from typing import Callable, NamedTuple


class IndexOps(NamedTuple):
    """One array kind's ``get(x, idx, *, mode, fill_value, out_sharding)`` and
    ``scatter(x, idx, values, how, *, mode, out_sharding)`` (``how`` a name, or the function
    of ``.apply``)."""

    get: Callable
    scatter: Callable


class IndexUpdateRef:
    """``x.at[idx]`` (JAX's ``_IndexUpdateRef``)."""

    __slots__ = ("array", "index", "_ops")

    def __init__(self, array, index, ops: IndexOps):
        self.array, self.index, self._ops = array, index, ops

    def __repr__(self):
        return f"_IndexUpdateRef({self.array!r}, {self.index!r})"

    def get(self, *, indices_are_sorted=False, unique_indices=False, mode=None, fill_value=None,
            out_sharding=None, wrap_negative_indices=True):
        """``x[idx]``, with JAX's out-of-bounds ``mode`` (clamp, or ``"fill"`` with `fill_value`)."""
        return self._ops.get(self.array, self.index, mode=mode, fill_value=fill_value, out_sharding=out_sharding)

    def apply(self, func, *, indices_are_sorted=False, unique_indices=False, mode=None, wrap_negative_indices=True):
        """``x`` with the unary elementwise ``func`` applied to the indexed elements."""
        return self._ops.scatter(self.array, self.index, None, func, mode=mode, out_sharding=None)

    def _update(how):
        def method(self, values, *, indices_are_sorted=False, unique_indices=False, mode=None, out_sharding=None,
                   wrap_negative_indices=True):
            return self._ops.scatter(self.array, self.index, values, how, mode=mode, out_sharding=out_sharding)

        method.__name__ = how
        method.__doc__ = f"Pure equivalent of ``x[idx] {how} values`` (JAX's ``.at[idx].{how}``)."
        return method

    set = _update("set")
    add = _update("add")
    subtract = _update("subtract")
    multiply = mul = _update("multiply")
    divide = _update("divide")
    power = _update("power")
    min = _update("min")
    max = _update("max")
    del _update


class IndexUpdateHelper:
    """``x.at`` (JAX's ``_IndexUpdateHelper``): index it to get an :class:`IndexUpdateRef`."""

    __slots__ = ("array", "_ops")

    def __init__(self, array, ops: IndexOps):
        self.array, self._ops = array, ops

    def __getitem__(self, index):
        return IndexUpdateRef(self.array, index, self._ops)

    def __repr__(self):
        return f"_IndexUpdateHelper({self.array!r})"


def at_property(ops: IndexOps) -> property:
    """The ``.at`` property of an array kind whose gather and scatter are ``ops``."""
    return property(lambda self: IndexUpdateHelper(self, ops), doc="``x.at[idx]``: JAX's functional index updates.")
