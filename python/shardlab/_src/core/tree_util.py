"""``jax.tree_util`` on shardlab's one pytree registry (``_src/core/tree.py``).

Registering a type here makes it a node for every transform: grad, shard_map, jit,
eval_shape, vmap and the control-flow ops all flatten through the same registry.

Example:
    >>> import shardlab as sl
    >>> sl.tree_util.tree_map(lambda x, y: x + y, {"a": 1, "b": (2, None)}, {"a": 10, "b": (20, None)})
    {'a': 11, 'b': (22, None)}
    >>> sl.tree_util.keystr(sl.tree_util.tree_leaves_with_path({"w": [0, 1]})[1][0])
    "['w'][1]"
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any, Callable

from . import tree as _t
from .tree_errors import _prefix_error
from .tree import (  # noqa: F401  (re-exported)
    DictKey, FlattenedIndexKey, GetAttrKey, PyTreeDef, SequenceKey,
)

KeyEntry = Any
KeyPath = tuple


# -- flatten / unflatten --------------------------------------------------------------------------
def tree_flatten(tree: Any, is_leaf: Callable[[Any], bool] | None = None):
    """``(leaves, treedef)``: the leaves in order and the structure, as ``jax.tree_util.tree_flatten``.

    None is a node with no children; dict keys are sorted; `is_leaf` stops the walk where it
    returns True.

    Example:
        >>> import shardlab as sl
        >>> sl.tree_util.tree_flatten([1, (2, None), {"b": 3, "a": 4}])
        ([1, 2, 4, 3], PyTreeDef([*, (*, None), {'a': *, 'b': *}]))
    """
    return _t.flatten(tree, is_leaf)


def tree_unflatten(treedef: PyTreeDef, leaves) -> Any:
    """The tree of structure `treedef` holding `leaves`, as ``jax.tree_util.tree_unflatten``.

    Example:
        >>> import shardlab as sl
        >>> d = sl.tree_util.tree_structure({"a": 0, "b": [0, 0]})
        >>> sl.tree_util.tree_unflatten(d, [1, 2, 3])
        {'a': 1, 'b': [2, 3]}
    """
    return _t.unflatten(treedef, leaves)


def tree_leaves(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> list:
    """The leaves of `tree` in flattening order, as ``jax.tree_util.tree_leaves``.

    Example:
        >>> import shardlab as sl
        >>> sl.tree_util.tree_leaves({"b": [1, None], "a": 2})
        [2, 1]
    """
    return _t.flatten(tree, is_leaf)[0]


def tree_structure(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> PyTreeDef:
    """The ``PyTreeDef`` of `tree`, as ``jax.tree_util.tree_structure``.

    Example:
        >>> import shardlab as sl
        >>> sl.tree_util.tree_structure((1, {"x": 2}))
        PyTreeDef((*, {'x': *}))
    """
    return _t.flatten(tree, is_leaf)[1]


def treedef_tuple(treedefs) -> PyTreeDef:
    """A tuple structure from child structures.

    Example:
        >>> import shardlab as sl
        >>> s = sl.tree_util.tree_structure
        >>> sl.tree_util.treedef_tuple([s(1), s([1, 2])]) == s((0, [0, 0]))
        True
    """
    kids = [d._node for d in treedefs]
    return PyTreeDef(_t._make(_t.TUPLE, tuple, None, kids))


def treedef_children(treedef: PyTreeDef) -> list:
    """The structures of the root's children.

    Example:
        >>> import shardlab as sl
        >>> sl.tree_util.treedef_children(sl.tree_util.tree_structure([(1, 2), 3]))
        [PyTreeDef((*, *)), PyTreeDef(*)]
    """
    return treedef.children()


def treedef_is_leaf(treedef: PyTreeDef) -> bool:
    """True if `treedef` is a single node (a leaf, None, or an empty container).

    Example:
        >>> import shardlab as sl
        >>> sl.tree_util.treedef_is_leaf(sl.tree_util.tree_structure(1))
        True
    """
    return treedef.num_nodes == 1


def all_leaves(iterable, is_leaf: Callable[[Any], bool] | None = None) -> bool:
    """True if every element of `iterable` is a leaf.

    Example:
        >>> import shardlab as sl
        >>> sl.tree_util.all_leaves([1, 2]), sl.tree_util.all_leaves([1, [2]])
        (True, False)
    """
    items = list(iterable)
    leaves = tree_leaves(items, is_leaf)
    return len(leaves) == len(items) and all(a is b for a, b in zip(items, leaves))


def is_tree_node(typ: type) -> bool:
    """True if `typ` is a pytree node type (built-in, namedtuple or registered).

    Example:
        >>> import collections, shardlab as sl
        >>> sl.tree_util.is_tree_node(dict), sl.tree_util.is_tree_node(int)
        (True, False)
    """
    return _t.is_node_type(typ)


def flatten_one_level(tree: Any):
    """``(children, aux)`` of one node; ValueError for a leaf.

    Example:
        >>> import shardlab as sl
        >>> sl.tree_util.flatten_one_level({"b": 1, "a": 2})
        ([2, 1], ('a', 'b'))
    """
    out = _t.flatten_one_level(tree)
    if out is None:
        raise ValueError(f"can't tree-flatten type: {type(tree)}")
    return out


def flatten_one_level_with_keys(tree: Any):
    """``([(key, child), ...], aux)`` of one node; ValueError for a leaf.

    Example:
        >>> import shardlab as sl
        >>> sl.tree_util.flatten_one_level_with_keys([7, 8])
        ([(SequenceKey(idx=0), 7), (SequenceKey(idx=1), 8)], None)
    """
    out = _t.flatten_one_level_with_keys(tree)
    if out is None:
        raise ValueError(f"can't tree-flatten type: {type(tree)}")
    return out


# -- registration --------------------------------------------------------------------------------
def register_pytree_node(nodetype, flatten_func, unflatten_func, flatten_with_keys_func=None) -> None:
    """Makes `nodetype` a pytree node, as ``jax.tree_util.register_pytree_node``.

    `flatten_func(x)` returns ``(children, aux_data)`` (aux_data hashable, static);
    `unflatten_func(aux_data, children)` rebuilds the node.

    Example:
        >>> import shardlab as sl
        >>> class Pair:
        ...     def __init__(self, a, b):
        ...         self.a, self.b = a, b
        >>> sl.tree_util.register_pytree_node(Pair, lambda p: ((p.a, p.b), None), lambda _, c: Pair(*c))
        >>> sl.tree_util.tree_leaves(Pair(1, [2, 3]))
        [1, 2, 3]
    """
    _t.register_node(nodetype, flatten_func, unflatten_func, flatten_with_keys_func)


def register_pytree_node_class(cls):
    """Class decorator: registers `cls` with its ``tree_flatten`` method and
    ``tree_unflatten`` classmethod, as ``jax.tree_util.register_pytree_node_class``.

    Example:
        >>> import shardlab as sl
        >>> @sl.tree_util.register_pytree_node_class
        ... class Box:
        ...     def __init__(self, x):
        ...         self.x = x
        ...     def tree_flatten(self):
        ...         return (self.x,), None
        ...     @classmethod
        ...     def tree_unflatten(cls, aux, children):
        ...         return cls(*children)
        >>> sl.tree_util.tree_map(lambda v: v * 2, Box(3)).x
        6
    """
    register_pytree_node(cls, operator.methodcaller("tree_flatten"), cls.tree_unflatten)
    return cls


def register_pytree_with_keys(nodetype, flatten_with_keys, unflatten_func, flatten_func=None) -> None:
    """Registers `nodetype` with a flatten that names each child by a key (``DictKey``,
    ``GetAttrKey``, ...), as ``jax.tree_util.register_pytree_with_keys``.

    Example:
        >>> import shardlab as sl
        >>> from shardlab.tree_util import GetAttrKey
        >>> class P2:
        ...     def __init__(self, x, y):
        ...         self.x, self.y = x, y
        >>> sl.tree_util.register_pytree_with_keys(
        ...     P2, lambda p: (((GetAttrKey("x"), p.x), (GetAttrKey("y"), p.y)), None), lambda _, c: P2(*c))
        >>> [sl.tree_util.keystr(k) for k, _ in sl.tree_util.tree_leaves_with_path(P2(1, 2))]
        ['.x', '.y']
    """
    if flatten_func is None:
        def flatten_func(tree):
            pairs, aux = flatten_with_keys(tree)
            return [c for _, c in pairs], aux
    register_pytree_node(nodetype, flatten_func, unflatten_func, flatten_with_keys)


def register_pytree_with_keys_class(cls):
    """Class decorator: registers `cls` by its ``tree_flatten_with_keys`` method (and
    ``tree_flatten`` if it has one) and its ``tree_unflatten`` classmethod.

    Example:
        >>> import shardlab as sl
        >>> from shardlab.tree_util import GetAttrKey
        >>> @sl.tree_util.register_pytree_with_keys_class
        ... class Special:
        ...     def __init__(self, x):
        ...         self.x = x
        ...     def tree_flatten_with_keys(self):
        ...         return ((GetAttrKey("x"), self.x),), None
        ...     @classmethod
        ...     def tree_unflatten(cls, aux, children):
        ...         return cls(*children)
        >>> sl.tree_util.keystr(sl.tree_util.tree_leaves_with_path(Special(1))[0][0])
        '.x'
    """
    flatten_func = operator.methodcaller("tree_flatten") if hasattr(cls, "tree_flatten") else None
    register_pytree_with_keys(cls, operator.methodcaller("tree_flatten_with_keys"), cls.tree_unflatten,
                              flatten_func)
    return cls


def register_dataclass(nodetype, data_fields=None, meta_fields=None, drop_fields=()):
    """Registers a dataclass (or a class with the same semantics): `data_fields` are
    children, `meta_fields` static aux data, as ``jax.tree_util.register_dataclass``.

    Used as a bare decorator on a dataclass, every field is data unless declared with
    ``dataclasses.field(metadata=dict(static=True))`` (or ``shardlab.tree.static()``).

    Example:
        >>> import dataclasses, shardlab as sl
        >>> @sl.tree_util.register_dataclass
        ... @dataclasses.dataclass
        ... class Layer:
        ...     w: float
        ...     b: float
        ...     name: str = dataclasses.field(default="dense", metadata=dict(static=True))
        >>> sl.tree_util.tree_flatten(Layer(1.0, 2.0))
        ([1.0, 2.0], PyTreeDef(CustomNode(Layer[('dense',)], [*, *])))
    """
    if data_fields is None or meta_fields is None:
        if (data_fields is None) != (meta_fields is None):
            raise TypeError("register_dataclass: data_fields and meta_fields must both be specified"
                            f" when either is specified. Got {data_fields=} {meta_fields=}.")
        if not dataclasses.is_dataclass(nodetype):
            raise TypeError("register_dataclass: data_fields and meta_fields are required when"
                            f" nodetype is not a dataclass. Got {nodetype=}.")
        fields = dataclasses.fields(nodetype)
        data_fields = [f.name for f in fields if not f.metadata.get("static", False)]
        meta_fields = [f.name for f in fields if f.metadata.get("static", False)]
        if drop_fields:
            data_fields = [f for f in data_fields if f not in drop_fields]
            meta_fields = [f for f in meta_fields if f not in drop_fields]
    meta_fields, data_fields = tuple(meta_fields), tuple(data_fields)
    if dataclasses.is_dataclass(nodetype):
        init_fields = {f.name for f in dataclasses.fields(nodetype) if f.init}
        init_fields.difference_update(drop_fields)
        if {*meta_fields, *data_fields} != init_fields:
            msg = "data_fields and meta_fields must include all dataclass fields with ``init=True`` and only them."
            if missing := init_fields - {*meta_fields, *data_fields}:
                msg += f" Missing fields: {missing}. Add them to drop_fields to suppress this error."
            if unexpected := {*meta_fields, *data_fields} - init_fields:
                msg += f" Unexpected fields: {unexpected}."
            raise ValueError(msg)
    if overlap := set(data_fields) & set(meta_fields):
        raise ValueError(f"data_fields and meta_fields must not overlap. Overlapping fields: {overlap}.")
    _t.register_dataclass_node(nodetype, data_fields, meta_fields)
    return nodetype


def register_static(cls):
    """Registers `cls` as a pytree with no leaves: its instances are static aux data.

    Example:
        >>> import shardlab as sl
        >>> @sl.tree_util.register_static
        ... class Mode(str):
        ...     pass
        >>> sl.tree_util.tree_leaves([1, Mode("train")])
        [1]
    """
    register_pytree_with_keys(cls, lambda obj: ((), obj), lambda obj, _children: obj)
    return cls


# -- map / reduce --------------------------------------------------------------------------------
def tree_map(f: Callable[..., Any], tree: Any, *rest: Any, is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """`f` applied leaf by leaf, as ``jax.tree_util.tree_map``: each tree in `rest` must have
    `tree`'s structure (or have it as a prefix: its subtrees at `tree`'s leaves are passed).

    Raises:
        ValueError: a tree in `rest` does not match, with JAX's "pytree structure error"
            message naming the key path and both subtrees.

    Example:
        >>> import shardlab as sl
        >>> sl.tree_util.tree_map(lambda x, y: x * y, [1, (2, 3)], [10, (20, 30)])
        [10, (40, 90)]
    """
    leaves, treedef = _t.flatten(tree, is_leaf)
    all_leaves = [leaves]
    for r in rest:
        try:
            all_leaves.append(treedef.flatten_up_to(r))
        except ValueError as e:
            err = next(_prefix_error((), tree, r, is_leaf), None)
            raise (err("tree_map tree") if err is not None else e) from None
    return treedef.unflatten(f(*xs) for xs in zip(*all_leaves))


def tree_map_with_path(f: Callable[..., Any], tree: Any, *rest: Any, is_leaf=None,
                       is_leaf_takes_path: bool = False) -> Any:
    """As ``tree_map``, with the key path of each leaf as `f`'s first argument.

    Example:
        >>> import shardlab as sl
        >>> sl.tree_util.tree_map_with_path(lambda p, x: sl.tree_util.keystr(p), {"a": [0, 0]})
        {'a': ["['a'][0]", "['a'][1]"]}
    """
    pairs, treedef = tree_flatten_with_path(tree, is_leaf, is_leaf_takes_path)
    cols = [[p for p, _ in pairs], [x for _, x in pairs]]
    for r in rest:
        try:
            cols.append(treedef.flatten_up_to(r))
        except ValueError as e:
            plain = None if is_leaf is None or is_leaf_takes_path else is_leaf
            err = next(_prefix_error((), tree, r, plain), None)
            raise (err("tree_map_with_path tree") if err is not None else e) from None
    return treedef.unflatten(f(*xs) for xs in zip(*cols))


class _Unspecified:
    pass


def tree_reduce(function, tree: Any, initializer=_Unspecified(), is_leaf=None):
    """``functools.reduce(function, leaves[, initializer])``, as ``jax.tree_util.tree_reduce``.

    Example:
        >>> import shardlab as sl
        >>> sl.tree_util.tree_reduce(lambda a, b: a + b, {"x": 1, "y": [2, 3]})
        6
    """
    leaves = tree_leaves(tree, is_leaf=is_leaf)
    if isinstance(initializer, _Unspecified):
        return functools.reduce(function, leaves)
    return functools.reduce(function, leaves, initializer)


def tree_reduce_associative(operation, tree: Any, *, identity=_Unspecified(), is_leaf=None):
    """A balanced-tree reduction of the leaves with an associative `operation`.

    Example:
        >>> import operator, shardlab as sl
        >>> sl.tree_util.tree_reduce_associative(operator.add, [1, (2, 3), {"a": 4}])
        10
    """
    return _parallel_reduce(tree_leaves(tree, is_leaf=is_leaf), operation, identity)


def _parallel_reduce(seq: list, op, identity):
    if not seq:
        if isinstance(identity, _Unspecified):
            raise TypeError("Must specify identity for parallel reduction of empty sequence.")
        return identity
    if len(seq) == 1:
        return seq[0]
    mid = len(seq) // 2
    return op(_parallel_reduce(seq[:mid], op, identity), _parallel_reduce(seq[mid:], op, identity))


def tree_all(tree: Any, *, is_leaf=None) -> bool:
    """``all(leaves)``.

    Example:
        >>> import shardlab as sl
        >>> sl.tree_util.tree_all([True, {"a": 1}]), sl.tree_util.tree_all([True, 0])
        (True, False)
    """
    return all(tree_leaves(tree, is_leaf=is_leaf))


def tree_transpose(outer_treedef: PyTreeDef, inner_treedef: PyTreeDef | None, pytree_to_transpose: Any) -> Any:
    """Turns an outer tree of inner trees into an inner tree of outer trees.

    Example:
        >>> import shardlab as sl
        >>> s = sl.tree_util.tree_structure
        >>> sl.tree_util.tree_transpose(s([0, 0]), s((0, 0)), [(1, 2), (3, 4)])
        ([1, 3], [2, 4])
    """
    flat, treedef = tree_flatten(pytree_to_transpose)
    if inner_treedef is None:
        inner_treedef = tree_structure(outer_treedef.flatten_up_to(pytree_to_transpose)[0])
    inner_size, outer_size = inner_treedef.num_leaves, outer_treedef.num_leaves
    if treedef.num_leaves != inner_size * outer_size:
        raise TypeError(f"Mismatch\n{treedef}\n != \n{outer_treedef.compose(inner_treedef)}")
    it = iter(flat)
    lol = [[next(it) for _ in range(inner_size)] for _ in range(outer_size)]
    return inner_treedef.unflatten(outer_treedef.unflatten(col) for col in zip(*lol))


def tree_broadcast(prefix_tree: Any, full_tree: Any, is_leaf=None) -> Any:
    """`prefix_tree`'s leaves repeated over the matching subtrees of `full_tree`.

    Example:
        >>> import shardlab as sl
        >>> sl.tree_util.tree_broadcast((1, 2), ((0, 0), [0, 0, 0]))
        ((1, 1), [2, 2, 2])
    """
    out: list = []
    try:
        tree_map(lambda x, sub: out.extend([x] * tree_structure(sub).num_leaves), prefix_tree, full_tree,
                 is_leaf=is_leaf)
    except ValueError:
        err = next(_prefix_error((), prefix_tree, full_tree, is_leaf), None)
        if err is None:
            raise
        raise err("broadcast_prefix prefix_tree") from None
    return tree_structure(full_tree).unflatten(out)


# -- key paths ------------------------------------------------------------------------------------
def tree_flatten_with_path(tree: Any, is_leaf=None, is_leaf_takes_path: bool = False):
    """``([(key_path, leaf), ...], treedef)``, as ``jax.tree_util.tree_flatten_with_path``.

    Example:
        >>> import shardlab as sl
        >>> sl.tree_util.tree_flatten_with_path({"a": (5,)})[0]
        [((DictKey(key='a'), SequenceKey(idx=0)), 5)]
    """
    fn = is_leaf
    if is_leaf is not None and not is_leaf_takes_path:
        fn = lambda _, x: is_leaf(x)  # noqa: E731
    return _t.flatten_with_path(tree, fn)


def tree_leaves_with_path(tree: Any, is_leaf=None, is_leaf_takes_path: bool = False) -> list:
    """``[(key_path, leaf), ...]``, as ``jax.tree_util.tree_leaves_with_path``.

    Example:
        >>> import shardlab as sl
        >>> [(sl.tree_util.keystr(p), x) for p, x in sl.tree_util.tree_leaves_with_path({"a": [1, 2]})]
        [("['a'][0]", 1), ("['a'][1]", 2)]
    """
    return tree_flatten_with_path(tree, is_leaf, is_leaf_takes_path)[0]


def keystr(keys, *, simple: bool = False, separator: str = "") -> str:
    """A key path as a string: ``['a'][0].x`` (or ``a/0/x`` with ``simple=True, separator='/'``).

    Example:
        >>> import shardlab as sl
        >>> from shardlab.tree_util import DictKey, SequenceKey
        >>> sl.tree_util.keystr((DictKey("a"), SequenceKey(0))), sl.tree_util.keystr(
        ...     (DictKey("a"), SequenceKey(0)), simple=True, separator="/")
        ("['a'][0]", 'a/0')
    """
    return separator.join(_simple(k) if simple else str(k) for k in keys)


def _simple(key) -> str:
    if isinstance(key, (DictKey, FlattenedIndexKey)):
        return str(key.key)
    if isinstance(key, SequenceKey):
        return str(key.idx)
    if isinstance(key, GetAttrKey):
        return str(key.name)
    return str(key)


# -- Partial ---------------------------------------------------------------------------------------
class _HashableCallableShim:
    """Delegates call, hash and equality to another callable (JAX's, for Partial of a partial)."""

    def __init__(self, fun):
        self.fun = fun

    def __call__(self, *args, **kw):
        return self.fun(*args, **kw)

    def __hash__(self):
        return hash(self.fun)

    def __eq__(self, other):
        if isinstance(other, _HashableCallableShim):
            return self.fun == other.fun
        return self.fun == other

    def __repr__(self):
        return f"_HashableCallableShim({self.fun!r})"


class Partial(functools.partial):
    """``functools.partial`` that is a pytree (its bound arguments are the leaves, the
    function is static), as ``jax.tree_util.Partial``.

    Example:
        >>> import operator, shardlab as sl
        >>> add_one = sl.tree_util.Partial(operator.add, 1)
        >>> add_one(2), sl.tree_util.tree_leaves(add_one)
        (3, [1])
    """

    def __new__(klass, func, *args, **kw):
        if isinstance(func, functools.partial):
            original = func
            func = _HashableCallableShim(original)
            out = super().__new__(klass, func, *args, **kw)
            func.func = original.func
            func.args = original.args
            func.keywords = original.keywords
            return out
        return super().__new__(klass, func, *args, **kw)


register_pytree_node(
    Partial,
    lambda p: ((p.args, p.keywords), p.func),
    lambda func, xs: Partial(func, *xs[0], **xs[1]),
)


def static(**kwargs):
    """``dataclasses.field`` with ``metadata={'static': True}``: a static field for
    ``register_dataclass`` (``jax.tree.static``)."""
    metadata = {"static": True, **(kwargs.pop("metadata", {}) or {})}
    return dataclasses.field(metadata=metadata, **kwargs)
