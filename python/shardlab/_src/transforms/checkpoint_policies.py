"""``jax.checkpoint_policies``: which intermediates a ``checkpoint`` keeps for the backward pass.

A policy is JAX's callable ``policy(prim, *avals, **params) -> bool``: it is asked about every
primitive the checkpointed function runs, and a True answer keeps that primitive's outputs
(the backward pass reuses them instead of recomputing them). `prim` is a
:class:`JaxPrimitive`: shardlab's primitive under JAX's name (``str(prim)`` / ``prim.name``
are ``'dot_general'``, ``'all_gather'``, ``'psum'``, ``'reduce_scatter'``, ``'mul'``, ...), and
the ``*_p`` objects of ``shardlab.lax`` (``all_gather_p``, ``dot_general_p``, ...) are the same
objects, so ``prim is jax.lax.all_gather_p`` works as in JAX. A contraction's params hold
JAX's ``dimension_numbers`` (``((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))``)
and a collective's ``axis_name``.

Example:
    >>> import numpy as np, shardlab as sl
    >>> import shardlab.numpy as jnp
    >>> pol = sl.checkpoint_policies.dots_saveable
    >>> pol(sl.lax.dot_general_p), pol(sl.lax.all_gather_p), str(sl.lax.all_gather_p)
    (True, False, 'all_gather')
    >>> f = sl.checkpoint(lambda w, x: jnp.tanh(x @ w), policy=pol)
    >>> sl.grad(lambda w: jnp.sum(f(w, np.ones((2, 2), np.float32))))(np.zeros((2, 2), np.float32)).tolist()
    [[2.0, 2.0], [2.0, 2.0]]
"""

from __future__ import annotations

import types
from dataclasses import dataclass

from ..arrays.local_array import LocalArray
from ..arrays.typeof import typeof
from ..core import tree
from ..primitives import collectives as col
from ..primitives import contractions as con
from ..primitives.primitive import Primitive, bind


class JaxPrimitive:
    """A primitive as a checkpoint policy sees it: JAX's name (``str(p)``, ``p.name``); one
    object per name, so ``prim is shardlab.lax.all_gather_p`` compares as in JAX."""

    __slots__ = ("name",)
    _BY_NAME: dict = {}

    def __new__(cls, name: str):
        obj = cls._BY_NAME.get(name)
        if obj is None:
            obj = object.__new__(cls)
            obj.name = name
            cls._BY_NAME[name] = obj
        return obj

    def __str__(self):
        return self.name

    def __repr__(self):
        return self.name

    def __reduce__(self):
        return (JaxPrimitive, (self.name,))


# shardlab's primitive names where JAX's differ (jax.lax's *_p names).
_JAX_NAMES = {
    "einsum": "dot_general", "matmul": "dot_general", "vecdot": "dot_general", "matvec": "dot_general",
    "vecmat": "dot_general", "psum_scatter": "reduce_scatter", "multiply": "mul", "subtract": "sub",
    "divide": "div", "negative": "neg", "maximum": "max", "minimum": "min", "absolute": "abs",
    "power": "pow", "remainder": "rem", "equal": "eq", "not_equal": "ne", "less": "lt", "less_equal": "le",
    "greater": "gt", "greater_equal": "ge", "arctan2": "atan2", "arcsin": "asin", "arccos": "acos",
    "arctan": "atan", "arcsinh": "asinh", "arccosh": "acosh", "arctanh": "atanh", "logical_and": "and",
    "logical_or": "or", "logical_not": "not", "logical_xor": "xor", "bitwise_and": "and", "bitwise_or": "or",
    "bitwise_xor": "xor", "invert": "not", "select": "select_n", "broadcast_to": "broadcast_in_dim",
    "scatter_add": "scatter-add", "take_along_axis": "gather", "getitem": "slice", "where_positive": "select_n",
    "broadcast": "pbroadcast",
}
_REDUCTIONS = {"sum": "psum", "max": "pmax", "min": "pmin", "mean": "psum"}

dot_general_p = JaxPrimitive("dot_general")
all_gather_p = JaxPrimitive("all_gather")
psum_p = JaxPrimitive("psum")
pmax_p = JaxPrimitive("pmax")
pmin_p = JaxPrimitive("pmin")
reduce_scatter_p = JaxPrimitive("reduce_scatter")
all_to_all_p = JaxPrimitive("all_to_all")
ppermute_p = JaxPrimitive("ppermute")
axis_index_p = JaxPrimitive("axis_index")
name_p = JaxPrimitive("name")


def jax_view(prim, args, params) -> tuple:
    """(JaxPrimitive, avals, params) of a shardlab bind, as JAX's policy would be called."""
    name = prim.name
    out = {}
    if prim is col.PSUM:
        name = _REDUCTIONS.get(params.get("reduction", "sum"), "psum")
    else:
        name = _JAX_NAMES.get(name, name)
    if "axes" in params:
        axes = tuple(params["axes"])
        out["axis_name"] = axes[0] if len(axes) == 1 else axes
    if prim is con.EINSUM and len(params.get("terms", ())) == 2:
        (lt, rt), o = params["terms"], params["out"]
        batch = [c for c in lt if c in rt and c in o]
        contract = [c for c in lt if c in rt and c not in o]
        out["dimension_numbers"] = ((tuple(lt.index(c) for c in contract), tuple(rt.index(c) for c in contract)),
                                    (tuple(lt.index(c) for c in batch), tuple(rt.index(c) for c in batch)))
    for k, v in params.items():
        out.setdefault(k, v)
    avals = tuple(typeof(a) if isinstance(a, LocalArray) else a for a in args)
    return JaxPrimitive(name), avals, out


# -- JAX's policies ---------------------------------------------------------------------------
class _Decision:
    """JAX's partial_eval.Saveable / Recompute / Offloadable answers (truthy: kept)."""

    def __init__(self, name: str, keep: bool, **fields):
        self.name, self.keep = name, keep
        self.__dict__.update(fields)

    def __bool__(self):
        return self.keep

    def __repr__(self):
        return self.name


Saveable = _Decision("Saveable", True)
Recompute = _Decision("Recompute", False)


def Offloadable(src, dst):  # noqa: N802  (JAX's constructor name)
    """Kept, in memory `dst` (shardlab keeps it where it is: the saved value is not recomputed)."""
    return _Decision(f"Offloadable(src={src!r}, dst={dst!r})", True, src=src, dst=dst)


def everything_saveable(*_, **__) -> bool:
    """Keep every intermediate, as if ``checkpoint`` were not used."""
    return True


def nothing_saveable(*_, **__) -> bool:
    """Keep nothing: recompute everything (the default of ``checkpoint``)."""
    return False


@dataclass(frozen=True)
class DotsSaveable:
    """Keep the outputs of contractions (``dot_general``); with `only_if_no_batch_dims`, only
    those without batch dimensions."""

    only_if_no_batch_dims: bool

    def __call__(self, prim, *args, **params):
        if prim is not dot_general_p:
            return False
        if not self.only_if_no_batch_dims:
            return True
        dims = params.get("dimension_numbers")
        if dims is None:
            return False
        (_, _), (lhs_b, rhs_b) = dims
        return not lhs_b and not rhs_b


checkpoint_dots = dots_saveable = DotsSaveable(False)
dots_with_no_batch_dims_saveable = DotsSaveable(True)


def offload_dot_with_no_batch_dims(offload_src, offload_dst):
    """As ``dots_with_no_batch_dims_saveable``, with the kept values offloaded (JAX moves them
    to host memory; shardlab keeps them)."""

    def policy(prim, *args, **params):
        if dots_with_no_batch_dims_saveable(prim, *args, **params):
            return Offloadable(src=offload_src, dst=offload_dst)
        return Recompute

    return policy


def save_anything_except_these_names(*names_not_to_save):
    """Keep everything (JAX's own version of this policy ignores the names)."""
    return lambda *_, **__: True


@dataclass(frozen=True)
class SaveOnlyTheseNames:
    """Keep only values named with ``checkpoint_name`` among `saveable_names`."""

    saveable_names: frozenset

    def __call__(self, prim, *_, **params):
        return prim is name_p and params["name"] in self.saveable_names


@dataclass(frozen=True)
class SaveAnyNamesButThese:
    """Keep the values named with ``checkpoint_name``, except those among `names`."""

    names: frozenset

    def __call__(self, prim, *_, **params):
        return prim is name_p and params["name"] not in self.names


def save_only_these_names(*names_which_can_be_saved):
    """Save only named values, and only among the names given."""
    return SaveOnlyTheseNames(frozenset(names_which_can_be_saved))


def save_any_names_but_these(*names_not_to_save):
    """Save only named values, excluding the names given."""
    return SaveAnyNamesButThese(frozenset(names_not_to_save))


def save_and_offload_only_these_names(*, names_which_can_be_saved, names_which_can_be_offloaded, offload_src,
                                      offload_dst):
    """As ``save_only_these_names``; the offloaded names are kept too (offloaded in JAX)."""
    saved, offloaded = set(names_which_can_be_saved), set(names_which_can_be_offloaded)
    both = saved & offloaded
    if both:
        raise ValueError("The names should be exclusive and should not intersect in `names_which_can_be_saved` and "
                         f"`names_which_can_be_offloaded`. Got names_which_can_be_saved={saved}, "
                         f"names_which_can_be_offloaded={offloaded} and the intersection={both}")

    def policy(prim, *_, **params):
        if prim is name_p and params["name"] in saved:
            return Saveable
        if prim is name_p and params["name"] in offloaded:
            return Offloadable(src=offload_src, dst=offload_dst)
        return Recompute

    return policy


def save_from_both_policies(policy_1, policy_2):
    """Logical OR of two policies: a value is kept if either keeps it."""

    def policy(prim, *args, **params):
        out1 = policy_1(prim, *args, **params)
        out2 = policy_2(prim, *args, **params)
        if not (isinstance(out1, bool) and isinstance(out2, bool)):
            raise ValueError(f"The return value of the policies should be a boolean. Got: {out1} and {out2}. Please "
                             f"write a custom policy function directly, rather than using this helper function.")
        return out1 or out2

    return policy


class _Policies(types.SimpleNamespace):
    """The rematerialization policies, as ``jax.checkpoint_policies``: pass one as
    ``checkpoint(f, policy=...)`` (``dots_saveable``, ``nothing_saveable``,
    ``save_only_these_names(...)``, ...)."""


checkpoint_policies = _Policies(
    everything_saveable=everything_saveable,
    nothing_saveable=nothing_saveable,
    dots_saveable=dots_saveable,
    checkpoint_dots=dots_saveable,
    dots_with_no_batch_dims_saveable=dots_with_no_batch_dims_saveable,
    checkpoint_dots_with_no_batch_dims=dots_with_no_batch_dims_saveable,
    offload_dot_with_no_batch_dims=offload_dot_with_no_batch_dims,
    save_anything_except_these_names=save_anything_except_these_names,
    save_any_names_but_these=save_any_names_but_these,
    save_only_these_names=save_only_these_names,
    save_from_both_policies=save_from_both_policies,
    save_and_offload_only_these_names=save_and_offload_only_these_names)


# -- checkpoint_name: a named identity the name policies look for ---------------------------
def _name_vjp(cts, ins, outs, mesh, *, name):
    return [cts[0]]


NAME = Primitive("name", shape_rule=lambda avals, mesh, *, name: [(tuple(avals[0].shape), avals[0].dtype)],
                 vjp=_name_vjp)
NAME.impl["emulated"] = lambda storages, mesh, *, name: [storages[0]]
NAME.impl["abstract"] = lambda storages, mesh, *, name: [storages[0]]


def checkpoint_name(x, name: str):
    """Names `x` (a pytree of arrays) for the name policies (``save_only_these_names``, ...), as
    ``jax.ad_checkpoint.checkpoint_name``; the identity on values. Per-device values inside
    shard_map get a ``name`` step the policies see; values outside it are returned as they are.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> from shardlab.ad_checkpoint import checkpoint_name
        >>> checkpoint_name(np.ones(2), "h").tolist()
        [1.0, 1.0]
    """
    def one(v):
        if isinstance(v, LocalArray):
            return bind(NAME, [v], v.mesh, name=name)
        return v

    leaves, treedef = tree.flatten(x, lambda v: isinstance(v, LocalArray))
    return tree.unflatten(treedef, [one(v) for v in leaves])
