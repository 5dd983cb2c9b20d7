"""``lax.scan``, ``cond``, ``switch``, ``while_loop`` and ``map``, as ``jax.lax``.

shardlab's values are concrete, so each is an eager Python loop or branch over pytrees of
numpy arrays, per-device LocalArrays (inside ``shard_map``) or global ShardedArrays. Every op
the body runs is recorded as usual (ledger, gradient tape); ``ys`` are stacked with
``shardlab.numpy`` ops, so ``grad`` flows through ``scan`` and ``cond``. JAX's type rules are
checked on every iteration: the carry keeps its pytree structure, shapes and dtypes (a Python
scalar in the initial carry is weakly typed and may be promoted, as in JAX), with JAX's
``TypeError`` messages.

Inside ``shard_map`` a predicate (``cond``), index (``switch``) or loop condition
(``while_loop``) may differ from device to device. When it is the same on every device, only
the branch taken runs. When it differs, every branch runs on every device and each device
selects its own result with ``jnp.where`` (per device, exactly what it would compute alone);
the collectives inside every branch are then recorded, for all devices. ``while_loop`` keeps
iterating while any device's condition holds, and a device whose condition is false keeps
its value.

Example:
    >>> import numpy as np
    >>> from shardlab import lax
    >>> carry, ys = lax.scan(lambda c, x: (c + x, c * 2), 0.0, np.arange(4.0, dtype=np.float32))
    >>> float(carry), ys.tolist()
    (6.0, [0.0, 0.0, 2.0, 6.0])
"""

from __future__ import annotations

import inspect
import operator

import numpy as np

from ..arrays.local_array import LocalArray
from ..arrays.sharded_array import ShardedArray
from ..arrays.storage import AbstractStorage, is_abstract
from ..core.context import CTX
from ..core.mesh import UNIT_MESH
from ..core import tree
from ..core.dtypes import bfloat16
from ..core.tree_errors import equality_errors
from ..core.tree_util import keystr
from . import numpy as jnp
from .batch_axis import as_array, dtype_of, shape_of, stack, take


# -- types and JAX's messages -------------------------------------------------------------------
_KIND_RANK = {"b": 0, "i": 1, "u": 1, "f": 2, "c": 3}
_WEAK_DEFAULT = {int: np.dtype(np.int32), float: np.dtype(np.float32), complex: np.dtype(np.complex64)}


def _aval(x) -> tuple:
    """(shape, dtype, weak, vma): a Python int/float/complex is weakly typed, as in JAX; vma is
    the mesh axes a value inside ``shard_map`` varies along (JAX's ``{V:...}``)."""
    weak = type(x) in _WEAK_DEFAULT
    vma = tuple(getattr(x, "varying_axes", ()))
    return tuple(shape_of(x)), (_WEAK_DEFAULT[type(x)] if weak else dtype_of(x)), weak, vma


def _typematch(a, b) -> bool:
    """JAX's ``core.typematch``: shape, dtype and varying axes agree (weak types ignored)."""
    return a[0] == b[0] and a[1] == b[1] and set(a[3]) == set(b[3])


def _short(aval) -> str:
    shape, dt, _, vma = aval
    name = "bfloat16" if dt == bfloat16 else dt.name
    v = "{V:" + ",".join(vma) + "}" if vma else ""
    return f"{name}[{','.join(str(s) for s in shape)}]{v}"


def _mismatch_extra(a, b) -> str:
    why = []
    if a[1] != b[1]:
        why.append("the dtypes do not match")
    if a[0] != b[0]:
        why.append("the shapes do not match")
    if set(a[3]) != set(b[3]):
        why.append("the manual axis types do not match")
    if not why:
        return ""
    return ", so " + why[0] if len(why) == 1 else ", so " + ", ".join(why[:-1]) + ", and " + why[-1]


def _capitalize(s: str) -> str:
    return s[0].upper() + s[1:]


def _bullets(diffs: list) -> str:
    if len(diffs) == 1:
        return f"{_capitalize(diffs[0])}.\n"
    return "\n".join(f"  * {d};\n" for d in diffs[:-1]) + f"  * {diffs[-1]}.\n"


_LEAF = type("LeafMeta", (type,), dict(__repr__=lambda _: "pytree leaf"))("Leaf", (), {})()


def _skeleton(treedef):
    return treedef.unflatten([_LEAF] * treedef.num_leaves)


def _sourceinfo(fun) -> str:
    while hasattr(fun, "func") and hasattr(fun, "args"):
        fun = fun.func
    fun = inspect.unwrap(fun)
    try:
        return f"{fun.__name__} at {fun.__code__.co_filename}:{fun.__code__.co_firstlineno}"
    except AttributeError:
        return "<unknown>"


def _promote(in_aval, out_aval):
    """The carry's aval after JAX's weak-type promotion of the input against the output."""
    shape, dt, weak, vma = in_aval
    if weak and out_aval[1] != dt and _KIND_RANK.get(out_aval[1].kind, -1) >= _KIND_RANK[dt.kind] \
            and out_aval[1].kind != "b":
        return shape, out_aval[1], False, vma
    return in_aval


class _Carry:
    """The loop-carried value's type (structure, avals) and the checks of each new value."""

    def __init__(self, name: str, fun, init):
        self.name, self.fun = name, fun
        leaves, self.treedef = tree.flatten(init)
        self.avals = [_aval(x) for x in leaves]
        self.value = self.treedef.unflatten([as_array(x, name.split()[0]) for x in leaves])
        try:
            params = list(inspect.signature(fun).parameters)
        except (TypeError, ValueError):
            params = []
        self.carry_name = params[0] if params else None

    def _component(self, path) -> str:
        if self.carry_name:
            return f"the input carry component {self.carry_name}{keystr(path)}" if path else \
                f"the input carry {self.carry_name}"
        return f"the input carry at path {keystr(path)}" if path else "the input carry"

    def promotes(self, out) -> bool:
        """True if `out` (a first new carry) promotes a weakly typed initial leaf; the carry's
        avals then take the promoted dtypes."""
        leaves, treedef = tree.flatten(out)
        if treedef != self.treedef:
            return False
        try:
            avals = [_aval(as_array(x, "scan")) for x in leaves]
        except TypeError:
            return False
        promoted = [_promote(a, b) if a[0] == b[0] else a for a, b in zip(self.avals, avals)]
        if promoted == self.avals:
            return False
        self.avals = promoted
        return True

    def promoted_init(self, value):
        """`value` (the initial carry) with each leaf cast to its aval's dtype."""
        leaves = tree.flatten(value)[0]
        return self.treedef.unflatten([x if dtype_of(x) == a[1] else jnp.astype(x, a[1])
                                       for x, a in zip(leaves, self.avals)])

    def _pcast_hint(self, paths, out_avals) -> str:
        """JAX's advice when a carry starts invariant along axes its new value varies along."""
        fixes = [f"applying `jax.lax.pcast(..., {tuple(v for v in b[3] if v not in a[3])}, to='varying')`, "
                 f"to the initial carry value corresponding to {self._component(p)}"
                 for p, a, b in zip(paths, self.avals, out_avals)
                 if not _typematch(a, b) and set(b[3]) - set(a[3])]
        if not fixes:
            return ""
        msg = f"This might be fixed by {fixes[0]}.\n" if len(fixes) == 1 else \
            "This might be fixed by:\n" + "\n".join(f"  * {d};\n" for d in fixes[:-1]) + f"  * {fixes[-1]}.\n"
        return msg + ("See https://docs.jax.dev/en/latest/notebooks/shard_map.html#scan-vma "
                      "for more information.\n\n")

    def check(self, out):
        """`out` (the body's new carry) as arrays, or JAX's TypeError."""
        leaves, treedef = tree.flatten(out)
        if treedef != self.treedef:
            diffs = [f"{self._component(p)} is a {a} but the corresponding component of the carry output "
                     f"is a {b}, so {why}"
                     for p, a, b, why in equality_errors(_skeleton(self.treedef), _skeleton(treedef))]
            if not diffs:
                diffs = [f"the input tree structure is {self.treedef} but the output tree structure "
                         f"is {treedef}"]
            raise TypeError(f"{self.name} function carry input and carry output must have the same pytree "
                            f"structure, but they differ:\n\n{_bullets(diffs)}\nRevise the function so that "
                            f"the carry output has the same pytree structure as the carry input.")
        values = [as_array(x, self.name.split()[0]) for x in leaves]
        out_avals = [_aval(v) for v in values]
        self.avals = [_promote(a, b) for a, b in zip(self.avals, out_avals)]
        paths = [p for p, _ in tree.flatten_with_path(_skeleton(self.treedef))[0]]
        diffs = [f"{self._component(p)} has type {_short(a)} but the corresponding output carry component "
                 f"has type {_short(b)}{_mismatch_extra(a, b)}"
                 for p, a, b in zip(paths, self.avals, out_avals) if not _typematch(a, b)]
        if diffs:
            raise TypeError(f"{self.name} function carry input and carry output must have equal types, but "
                            f"they differ:\n\n{_bullets(diffs)}\n{self._pcast_hint(paths, out_avals)}Revise the "
                            f"function so that all output types match the corresponding input types.")
        self.value = treedef.unflatten(values)
        return self.value


def _check_branches(api: str, name1: str, name2: str, fun1, fun2, out1, out2) -> None:
    """JAX's TypeError when two branches' outputs differ in structure or type."""
    l1, d1 = tree.flatten(out1)
    l2, d2 = tree.flatten(out2)
    info = f"{name1} is {_sourceinfo(fun1)}\n{name2} is {_sourceinfo(fun2)}\n\n"
    if d1 != d2:
        diffs = [f"{name1} output{f' at path {keystr(p)}' if p else ''} is a {a} but {name2} output"
                 f"{f' at path {keystr(p)}' if p else ''} is a {b}, so {why}"
                 for p, a, b, why in equality_errors(_skeleton(d1), _skeleton(d2))]
        body = "\n".join(f"  * {d};\n" for d in diffs[:-1]) + f"  * {diffs[-1]}.\n" if len(diffs) > 1 \
            else f"{diffs[0]}.\n"
        raise TypeError(f"{api} branch outputs must have the same pytree structure, but they differ:\n\n{info}"
                        f"{body}\nRevise {name1} and/or {name2} so that they have the same pytree structure.")
    paths = [p for p, _ in tree.flatten_with_path(_skeleton(d1))[0]]
    diffs = []
    for p, a, b in zip(paths, l1, l2):
        # JAX joins the branches' varying axes (pcast) before comparing: only shape and dtype count
        a, b = _aval(as_array(a, api))[:3] + ((),), _aval(as_array(b, api))[:3] + ((),)
        if a[:2] != b[:2]:
            where = f" at path {keystr(p)}" if p else ""
            diffs.append(f"the output of {name1}{where} has type {_short(a)} but the corresponding output of "
                         f"{name2} has type {_short(b)}{_mismatch_extra(a, b)}")
    if diffs:
        body = _bullets(diffs) if len(diffs) == 1 else \
            "\n".join(f"  * {d};" for d in diffs[:-1]) + f"\n  * {diffs[-1]}.\n"
        raise TypeError(f"{api} branches must have equal output types but they differ.\n\n{info}{body}\n"
                        f"Revise {name1} and/or {name2} so that all output types match.")


def _arrays(out, op: str):
    """Host leaves of a result as arrays of JAX's canonical dtypes (what JAX returns)."""
    leaves, treedef = tree.flatten(out)
    return treedef.unflatten([as_array(x, op) for x in leaves])


def _check_untaken(api: str, names: list, funs: list, operands) -> None:
    """JAX traces every branch, so it rejects branches whose outputs differ even when the
    predicate is known. For host operands (nothing recorded, no gradient being taken) the
    branches run here shape-only (abstract one-device values record nothing) and are compared
    the same way; a branch that cannot run shape-only is not checked."""
    leaves, treedef = tree.flatten(operands)
    if CTX.tapes or getattr(CTX, "recorders", None) or any(isinstance(x, (LocalArray, ShardedArray))
                                                          for x in leaves):
        return
    abstract = [LocalArray(AbstractStorage(np.shape(x), as_array(x, api).dtype), UNIT_MESH)
                if isinstance(x, (np.ndarray, np.generic, bool, int, float)) else x for x in leaves]
    outs = []
    for f in funs:
        try:
            outs.append(f(*treedef.unflatten(abstract)))
        except Exception:  # noqa: BLE001  (code that needs values: only JAX's tracer would tell)
            return
    for i in range(1, len(funs)):
        _check_branches(api, names[0], names[i], funs[0], funs[i], outs[0], outs[i])


# -- predicates that may differ from device to device ---------------------------------------------
def _decided(pred):
    """The predicate's value if it is the same everywhere, else None (a per-device value that
    differs across devices, or an abstract one)."""
    if isinstance(pred, LocalArray):
        st = pred.storage
        if is_abstract(st):
            return None
        flat = np.asarray(st).reshape(-1)
        if flat.size and np.all(flat == flat[0]):
            return flat[0].item()
        return None
    return np.asarray(pred).item()


# -- scan ---------------------------------------------------------------------------------------
def scan(f, init, xs=None, length=None, reverse: bool = False, unroll=1, _split_transpose: bool = False):
    """Loops `f` over the leading axis of `xs` carrying state, as ``jax.lax.scan``::

        def scan(f, init, xs, length=None):
            carry, ys = init, []
            for x in xs:
                carry, y = f(carry, x)
                ys.append(y)
            return carry, np.stack(ys)

    Args:
        f: ``(carry, x) -> (carry, y)``; the carry keeps its structure, shapes and dtypes.
        init: the initial carry (a pytree).
        xs: a pytree of arrays scanned along their leading axis, or None (then `length`).
        length: the number of iterations (must agree with `xs`).
        reverse: iterate from the end (ys stay in the order of xs).
        unroll: accepted for JAX compatibility (a bool or an int >= 0); every iteration runs
            eagerly either way.

    Returns:
        ``(final carry, ys)`` with ys stacked along a new leading axis.

    Example:
        >>> import numpy as np
        >>> from shardlab import lax
        >>> c, ys = lax.scan(lambda c, x: (c + 1, c), 0, None, length=3)
        >>> int(c), ys.tolist(), ys.dtype
        (3, [0, 1, 2], dtype('int32'))
    """
    if not callable(f):
        raise TypeError("lax.scan: f argument should be a callable.")
    if isinstance(unroll, bool):
        pass
    elif not isinstance(unroll, (int, np.integer)) or unroll < 0:
        raise ValueError("`unroll` must be a `bool` or a non-negative `int`.")
    xs_leaves, xs_def = tree.flatten(xs)
    xs_leaves = [as_array(x, "scan") for x in xs_leaves]
    length = _scan_length(xs_leaves, length)
    carry = _Carry("scan body", f, init)
    ys_rows = []
    y_def = None
    order = list(range(length - 1, -1, -1) if reverse else range(length))
    step = 0
    while step < len(order):
        x = xs_def.unflatten([take(v, order[step], 0, "scan") for v in xs_leaves])
        before = carry.value
        out = f(before, x)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError(f"scan body output must be a pair, got {_describe(out)}.")
        if step == 0 and carry.promotes(out[0]):
            # A weakly typed initial carry (a Python scalar) takes the body's dtype; JAX traces
            # the body again with the promoted carry, so the first iteration runs again here.
            carry.value = carry.promoted_init(before)
            continue
        carry.check(out[0])
        step += 1
        leaves, d = tree.flatten(out[1])
        if y_def is None:
            y_def = d
        elif d != y_def:
            raise TypeError(f"scan body output y must have the same structure on every iteration; "
                            f"got {y_def} and then {d}")
        ys_rows.append(leaves)
    if length == 0:
        return carry.value, _empty_ys(f, carry.value, xs_leaves, xs_def)
    if reverse:
        ys_rows.reverse()
    ys = y_def.unflatten([stack([row[j] for row in ys_rows], 0, op="scan") for j in range(y_def.num_leaves)])
    return carry.value, ys


def _describe(out) -> str:
    leaves, d = tree.flatten(out)
    if d.num_leaves == 1 and d.num_nodes == 1:
        return _short(_aval(as_array(out, "scan")))
    return str(d)


def _scan_length(leaves: list, length) -> int:
    for x in leaves:
        if not shape_of(x):
            raise ValueError(f"scan got value with no leading axis to scan over: "
                             f"{', '.join(str(v) for v in leaves if not shape_of(v))}.")
    sizes = [shape_of(x)[0] for x in leaves]
    if length is not None:
        try:
            length = operator.index(length)
        except TypeError:
            raise TypeError(f"scan length must be an integer, got {length!r}") from None
        if not all(s == length for s in sizes):
            raise ValueError(f"scan got `length` argument of {length} which disagrees with leading axis "
                             f"sizes {sizes}.")
        return length
    unique = list(dict.fromkeys(sizes))
    if len(unique) > 1:
        raise ValueError(f"scan got values with different leading axis sizes: {', '.join(str(n) for n in sizes)}.")
    if not unique:
        raise ValueError("scan got no values to scan over and `length` not provided.")
    return unique[0]


def _empty_ys(f, carry, xs_leaves, xs_def):
    """ys of a zero-length scan: the body runs once on zeros to learn their types (JAX traces it)."""
    x = xs_def.unflatten([np.zeros(shape_of(v)[1:], dtype_of(v)) for v in xs_leaves])
    _, y = f(carry, x)
    leaves, d = tree.flatten(y)
    return d.unflatten([np.zeros((0,) + tuple(shape_of(v)), dtype_of(as_array(v, "scan"))) for v in leaves])


# -- cond / switch --------------------------------------------------------------------------------
_NO_OPERAND = object()


def cond(pred, true_fun, false_fun, *operands, operand=_NO_OPERAND):
    """``true_fun(*operands) if pred else false_fun(*operands)``, as ``jax.lax.cond``.

    Inside ``shard_map`` a predicate that differs across devices runs both branches and each
    device keeps its own branch's result (``jnp.where``); a predicate that is the same on every
    device runs only the branch taken. The deprecated ``operand=`` keyword is accepted.

    Raises:
        TypeError: a non-scalar or non-numeric predicate; branches whose outputs differ in
            structure or type, with JAX's messages (checked when both run, and for host
            operands by running the untaken branch shape-only, as JAX traces it).

    Example:
        >>> from shardlab import lax
        >>> lax.cond(3 > 2, lambda x: x + 1, lambda x: x - 1, 10)
        Array(11, dtype=int32, weak_type=True)
    """
    if not (callable(true_fun) and callable(false_fun)):
        if callable(false_fun) and len(operands) == 2 and callable(operands[1]):  # the oldest form
            x_true, f_true, x_false, f_false = true_fun, false_fun, *operands
            return cond(pred, lambda x, _: f_true(x), lambda _, x: f_false(x), x_true, x_false)
        raise TypeError("lax.cond: true_fun and false_fun arguments should be callable.")
    if operand is not _NO_OPERAND:
        if operands:
            raise TypeError(f"if 'operand' keyword is passed then no positional operands can be passed, "
                            f"got operand={operand!r} and positional operands {operands}")
        operands = (operand,)
    if pred is None:
        raise TypeError("cond predicate is None")
    if isinstance(pred, (list, tuple)) or len(shape_of(pred)) != 0:
        raise TypeError(f"Pred must be a scalar, got {pred} of " +
                        (f"type {type(pred)}" if isinstance(pred, (list, tuple)) else f"shape {shape_of(pred)}."))
    kind = dtype_of(pred).kind
    if kind not in "biuf":
        raise TypeError(f"Pred type must be either boolean or number, got {dtype_of(pred)}.")
    decided = _decided(pred)
    if decided is not None:
        _check_untaken("cond", ["true_fun", "false_fun"], [true_fun, false_fun], operands)
        return _arrays((true_fun if decided else false_fun)(*operands), "cond")
    t, f = true_fun(*operands), false_fun(*operands)
    _check_branches("cond", "true_fun", "false_fun", true_fun, false_fun, t, f)
    p = pred if kind == "b" else pred != 0
    return tree.unflatten(tree.flatten(t)[1], [jnp.where(p, a, b) for a, b in
                                                 zip(tree.flatten(t)[0], tree.flatten(f)[0])])


def switch(index, branches, *operands, operand=_NO_OPERAND):
    """``branches[clamp(index, 0, len(branches) - 1)](*operands)``, as ``jax.lax.switch``.

    An index that differs across devices (inside ``shard_map``) runs every branch and each
    device selects its own.

    Example:
        >>> from shardlab import lax
        >>> [int(lax.switch(i, [lambda x: x, lambda x: 10 * x], 3)) for i in (-1, 0, 1, 7)]
        [3, 3, 30, 30]
    """
    if not all(callable(b) for b in branches):
        raise TypeError("lax.switch: branches argument should be a sequence of callables.")
    if operand is not _NO_OPERAND:
        if operands:
            raise TypeError(f"if 'operand' keyword is passed then no positional operands can be passed, "
                            f"got operand={operand!r} and positional operands {operands}")
        operands = (operand,)
    if len(shape_of(index)) != 0:
        raise TypeError(f"Branch index must be scalar, got {index} of shape {shape_of(index)}.")
    dt = dtype_of(index)
    if dt.kind not in "iu":
        raise TypeError(f"Index type must be an integer, got {index} as {dt}")
    branches = tuple(branches)
    if not branches:
        raise ValueError("Empty branch sequence")
    if len(branches) == 1:
        return _arrays(branches[0](*operands), "switch")
    decided = _decided(index)
    if decided is not None:
        _check_untaken("switch", ["branch 0"] + [f"branch{i}" for i in range(1, len(branches))], list(branches),
                       operands)
        return _arrays(branches[min(max(int(decided), 0), len(branches) - 1)](*operands), "switch")
    outs = [b(*operands) for b in branches]
    for i in range(1, len(outs)):
        _check_branches("switch", "branch 0", f"branch{i}", branches[0], branches[i], outs[0], outs[i])
    idx = jnp.clip(index, 0, len(branches) - 1)
    leaves = [tree.flatten(o)[0] for o in outs]
    result = leaves[-1]
    for k in range(len(outs) - 2, -1, -1):
        result = [jnp.where(idx == k, a, b) for a, b in zip(leaves[k], result)]
    return tree.flatten(outs[0])[1].unflatten(result)


# -- while_loop / map -----------------------------------------------------------------------------
def while_loop(cond_fun, body_fun, init_val):
    """``while cond_fun(val): val = body_fun(val)``, as ``jax.lax.while_loop``.

    Inside ``shard_map`` a condition that differs across devices keeps the loop going while
    any device's condition holds; a device whose condition is false keeps its value.

    Raises:
        TypeError: `cond_fun` not returning a boolean scalar, or a body that changes the
            carry's structure or types (JAX's messages).

    Example:
        >>> from shardlab import lax
        >>> int(lax.while_loop(lambda c: c < 10, lambda c: c * 2, 1))
        16
    """
    if not (callable(cond_fun) and callable(body_fun)):
        raise TypeError("lax.while_loop: body_fun and cond_fun arguments should be callable.")
    carry = _Carry("while_loop body", body_fun, init_val)
    while True:
        c = cond_fun(carry.value)
        leaves, d = tree.flatten(c)
        if d.num_leaves != 1 or d.num_nodes != 1:
            raise TypeError(f"cond_fun must return a boolean scalar, but got pytree {d}.")
        if shape_of(c) != () or dtype_of(c) != np.bool_:
            raise TypeError(f"cond_fun must return a boolean scalar, but got output type(s) "
                            f"[ShapedArray({_short(_aval(c))})].")
        if isinstance(c, (LocalArray, ShardedArray)) and is_abstract(c.storage if isinstance(c, LocalArray)
                                                                     else c._storage):
            raise TypeError("[while_loop] the loop condition has no value here (abstract mode: eval_shape or an "
                            "abstract mesh), so the trip count is unknown; use fori_loop or scan with a static "
                            "length")
        decided = _decided(c)
        if decided is False:
            return carry.value
        old = carry.value
        new = carry.check(body_fun(old))
        if decided is None:  # devices disagree: those whose condition is false keep their value
            carry.value = carry.treedef.unflatten(
                [jnp.where(c, n, o) for n, o in zip(tree.flatten(new)[0], tree.flatten(old)[0])])


def fori_loop(lower, upper, body_fun, init_val, *, unroll=None):
    """``for i in range(lower, upper): val = body_fun(i, val)``, as ``jax.lax.fori_loop``,
    with the carry's structure and types checked as JAX checks them (a Python scalar in
    `init_val` is weakly typed and may be promoted) and host results in JAX's dtypes.

    `unroll` (an int or bool) is accepted for JAX compatibility; the loop always runs eagerly.

    Example:
        >>> from shardlab import lax
        >>> lax.fori_loop(0, 4, lambda i, c: c * 2 + i, 1.0, unroll=2)
        Array(27., dtype=float32)
    """
    if not callable(body_fun):
        raise TypeError("lax.fori_loop: body_fun argument should be callable.")
    if unroll is not None and not isinstance(unroll, (bool, int, np.integer)):
        raise TypeError(f"fori_loop unroll must be an int or a bool, got {unroll!r}")
    lo, hi = _bound(lower, "lower"), _bound(upper, "upper")
    carry = _Carry("fori_loop body", body_fun, init_val)
    try:
        params = list(inspect.signature(body_fun).parameters)
        carry.carry_name = params[1] if len(params) > 1 else None
    except (TypeError, ValueError):
        carry.carry_name = None
    i = lo
    while i < hi:
        before = carry.value
        out = body_fun(i, before)
        if i == lo and carry.promotes(out):  # as in scan: JAX traces again with the promoted carry
            carry.value = carry.promoted_init(before)
            continue
        carry.check(out)
        i += 1
    return carry.value


def _bound(v, what: str) -> int:
    if isinstance(v, LocalArray):
        decided = _decided(v)
        if decided is None:
            raise TypeError(f"[fori_loop] {what} differs across devices; loop bounds must be the same on "
                            f"every device (use while_loop with a per-device condition)")
        v = decided
    try:
        return operator.index(np.asarray(v).item() if isinstance(v, (np.ndarray, ShardedArray)) else v)
    except TypeError:
        raise TypeError(f"fori_loop {what} must be an integer, got {v!r}") from None


def map(f, xs, *, batch_size: int | None = None):  # noqa: A001  (jax.lax.map)
    """``np.stack([f(x) for x in xs])`` over pytrees, as ``jax.lax.map``.

    `batch_size` is accepted (a positive int): JAX vectorizes that many elements at a time,
    which changes speed, not values; here every element runs one at a time.

    Example:
        >>> import numpy as np
        >>> from shardlab import lax
        >>> lax.map(lambda x: x * 2, np.arange(5.0, dtype=np.float32), batch_size=2).tolist()
        [0.0, 2.0, 4.0, 6.0, 8.0]
    """
    if batch_size is not None and (not isinstance(batch_size, (int, np.integer)) or batch_size < 1):
        raise ValueError(f"lax.map: batch_size must be a positive integer, got {batch_size!r}")
    _, ys = scan(lambda _, x: ((), f(x)), (), xs)
    return ys
