"""Pytrees as JAX flattens them: one registry of node types, ``PyTreeDef``, key paths.

A pytree is a leaf or a node whose children are pytrees. Nodes are the built-ins JAX knows
(tuple, list, dict with its keys sorted, namedtuple, OrderedDict, defaultdict, None as a node
with no children) plus every type registered with ``register_node``. Lookup is by exact type,
as in JAX: a subclass of dict or tuple that is not registered (and not a namedtuple) is a
leaf. Every transform (grad, shard_map, jit, eval_shape, vmap, scan) flattens through this one
registry, so a registered class passes through all of them.

The public face is ``shardlab.tree_util`` and ``shardlab.tree`` (``_src/core/tree_util.py``
holds the functions built on this module).

Example:
    >>> from shardlab._src.core import tree
    >>> leaves, treedef = tree.flatten({"b": (1, None), "a": [2, 3]})
    >>> leaves, treedef
    ([2, 3, 1], PyTreeDef({'a': [*, *], 'b': (*, None)}))
    >>> tree.unflatten(treedef, [20, 30, 10])
    {'a': [20, 30], 'b': (10, None)}
"""

from __future__ import annotations

import collections
from typing import Any, Callable

# Node kinds. A PyTreeDef node is the tuple (kind, type, aux, children, num_leaves, num_nodes).
LEAF, NONE, TUPLE, LIST, DICT, NAMEDTUPLE, CUSTOM = range(7)


# -- key entries (what tree_flatten_with_path pairs with each leaf) -----------------------------
class _Key:
    __slots__ = ()

    def __eq__(self, other):
        return type(other) is type(self) and self._value() == other._value()

    def __hash__(self):
        return hash((type(self).__name__, self._value()))

    def __repr__(self):
        field = self.__match_args__[0]
        return f"{type(self).__name__}({field}={self._value()!r})"


class DictKey(_Key):
    """The key of a dict entry: ``str(DictKey('a')) == "['a']"``."""

    __slots__ = ("key",)
    __match_args__ = ("key",)

    def __init__(self, key):
        self.key = key

    def _value(self):
        return self.key

    def __str__(self):
        return f"[{self.key!r}]"


class SequenceKey(_Key):
    """The index of a tuple or list entry: ``str(SequenceKey(0)) == '[0]'``."""

    __slots__ = ("idx",)
    __match_args__ = ("idx",)

    def __init__(self, idx: int):
        self.idx = idx

    def _value(self):
        return self.idx

    def __str__(self):
        return f"[{self.idx!r}]"


class GetAttrKey(_Key):
    """An attribute (namedtuple field, dataclass field): ``str(GetAttrKey('x')) == '.x'``."""

    __slots__ = ("name",)
    __match_args__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def _value(self):
        return self.name

    def __str__(self):
        return f".{self.name}"


class FlattenedIndexKey(_Key):
    """The position of a child of a node registered without keys."""

    __slots__ = ("key",)
    __match_args__ = ("key",)

    def __init__(self, key: int):
        self.key = key

    def _value(self):
        return self.key

    def __str__(self):
        return f"[<flat index {self.key}>]"


# -- the registry -----------------------------------------------------------------------------
class _Entry:
    __slots__ = ("flatten", "unflatten", "flatten_with_keys", "data_fields", "meta_fields")

    def __init__(self, flatten, unflatten, flatten_with_keys=None, data_fields=None, meta_fields=None):
        self.flatten = flatten
        self.unflatten = unflatten
        self.flatten_with_keys = flatten_with_keys
        self.data_fields = data_fields
        self.meta_fields = meta_fields


_BUILTIN_KIND = {tuple: TUPLE, list: LIST, dict: DICT, type(None): NONE}
_REGISTRY: dict[type, _Entry] = {}


def register_node(nodetype: type, flatten_func, unflatten_func, flatten_with_keys_func=None) -> None:
    """Makes `nodetype` a pytree node (``jax.tree_util.register_pytree_node``)."""
    if not isinstance(nodetype, type):
        raise TypeError(f"register_pytree_node: nodetype must be a type, got {nodetype!r}")
    if nodetype in _REGISTRY or nodetype in _BUILTIN_KIND:
        raise ValueError(f"Duplicate custom PyTreeDef type registration for {nodetype}.")
    _REGISTRY[nodetype] = _Entry(flatten_func, unflatten_func, flatten_with_keys_func)


def register_dataclass_node(nodetype: type, data_fields, meta_fields) -> None:
    """Registers `nodetype` with its data fields as children and its meta fields as aux data."""
    data_fields, meta_fields = tuple(data_fields), tuple(meta_fields)

    def flatten(x):
        return tuple(getattr(x, n) for n in data_fields), tuple(getattr(x, n) for n in meta_fields)

    def flatten_with_keys(x):
        return tuple((GetAttrKey(n), getattr(x, n)) for n in data_fields), \
            tuple(getattr(x, n) for n in meta_fields)

    def unflatten(meta, data):
        return nodetype(**dict(zip(meta_fields, meta)), **dict(zip(data_fields, data)))

    register_node(nodetype, flatten, unflatten, flatten_with_keys)
    _REGISTRY[nodetype].data_fields = data_fields
    _REGISTRY[nodetype].meta_fields = meta_fields


def is_node_type(typ: type) -> bool:
    """True for the built-in node types, namedtuples and registered types."""
    return typ in _BUILTIN_KIND or typ in _REGISTRY or _is_namedtuple_type(typ)


def _is_namedtuple_type(typ) -> bool:
    return isinstance(typ, type) and issubclass(typ, tuple) and hasattr(typ, "_fields")


def _sorted_keys(d: dict) -> list:
    try:
        return sorted(d)
    except Exception:
        raise ValueError("Comparator raised exception while sorting pytree dictionary keys.") from None


# -- flatten ------------------------------------------------------------------------------------
_LEAF_NODE = (LEAF, None, None, (), 1, 1)


def flatten(tree: Any, is_leaf: Callable[[Any], bool] | None = None):
    """Returns ``(leaves, treedef)``, as ``jax.tree_util.tree_flatten``."""
    leaves: list = []
    return leaves, PyTreeDef(_flatten(tree, is_leaf, leaves))


# Module-level recursion, not a nested closure: a recursive closure is a reference cycle that
# keeps every leaf (megabytes of shard data) alive until the garbage collector runs.
def _flatten(node, is_leaf, leaves: list):
    if is_leaf is not None and is_leaf(node):
        leaves.append(node)
        return _LEAF_NODE
    t = type(node)
    kind = _BUILTIN_KIND.get(t)
    if kind is None:
        entry = _REGISTRY.get(t)
        if entry is not None:
            kids, aux = entry.flatten(node)
            return _make(CUSTOM, t, aux, [_flatten(k, is_leaf, leaves) for k in kids])
        if isinstance(node, tuple) and hasattr(t, "_fields"):
            return _make(NAMEDTUPLE, t, None, [_flatten(k, is_leaf, leaves) for k in node])
        leaves.append(node)
        return _LEAF_NODE
    if kind == DICT:
        keys = _sorted_keys(node)
        return _make(DICT, dict, keys, [_flatten(node[k], is_leaf, leaves) for k in keys])
    if kind == NONE:
        return (NONE, type(None), None, (), 0, 1)
    return _make(kind, t, None, [_flatten(k, is_leaf, leaves) for k in node])


def _make(kind, typ, aux, kids):
    return (kind, typ, aux, tuple(kids), sum(k[4] for k in kids), 1 + sum(k[5] for k in kids))


def flatten_one_level(node):
    """``(children, aux)`` of one node, or None for a leaf."""
    t = type(node)
    kind = _BUILTIN_KIND.get(t)
    if kind == DICT:
        keys = _sorted_keys(node)
        return [node[k] for k in keys], tuple(keys)
    if kind == NONE:
        return (), None
    if kind is not None:
        return node, None
    entry = _REGISTRY.get(t)
    if entry is not None:
        kids, aux = entry.flatten(node)
        return kids, aux
    if isinstance(node, tuple) and hasattr(t, "_fields"):
        return node, None
    return None


def flatten_one_level_with_keys(node):
    """``([(key, child), ...], aux)`` of one node, or None for a leaf."""
    t = type(node)
    kind = _BUILTIN_KIND.get(t)
    if kind == DICT:
        keys = _sorted_keys(node)
        return [(DictKey(k), node[k]) for k in keys], tuple(keys)
    if kind == NONE:
        return [], None
    if kind is not None:
        return [(SequenceKey(i), c) for i, c in enumerate(node)], None
    entry = _REGISTRY.get(t)
    if entry is not None:
        if entry.flatten_with_keys is not None:
            pairs, aux = entry.flatten_with_keys(node)
            return list(pairs), aux
        kids, aux = entry.flatten(node)
        return [(FlattenedIndexKey(i), c) for i, c in enumerate(kids)], aux
    if isinstance(node, tuple) and hasattr(t, "_fields"):
        return [(GetAttrKey(f), c) for f, c in zip(t._fields, node)], None
    return None


def flatten_with_path(tree: Any, is_leaf: Callable[[Any, Any], bool] | None = None):
    """``([(key path, leaf), ...], treedef)``; `is_leaf` takes (path, value)."""
    pairs: list = []
    return pairs, PyTreeDef(_flatten_path(tree, is_leaf, (), pairs))


def _flatten_path(node, is_leaf, path: tuple, pairs: list):
    if is_leaf is not None and is_leaf(path, node):
        pairs.append((path, node))
        return _LEAF_NODE
    t = type(node)
    kind = _BUILTIN_KIND.get(t)
    if kind == NONE:
        return (NONE, type(None), None, (), 0, 1)
    one = flatten_one_level_with_keys(node)
    if one is None:
        pairs.append((path, node))
        return _LEAF_NODE
    keyed, aux = one
    kids = [_flatten_path(c, is_leaf, path + (k,), pairs) for k, c in keyed]
    if kind == DICT:
        return _make(DICT, dict, list(aux), kids)
    if kind is not None:
        return _make(kind, t, None, kids)
    if t in _REGISTRY:
        return _make(CUSTOM, t, aux, kids)
    return _make(NAMEDTUPLE, t, None, kids)


# -- PyTreeDef ------------------------------------------------------------------------------------
class PyTreeDef:
    """The structure of a pytree, as ``jax.tree_util.PyTreeDef``: compares equal to the
    structure of any tree with the same node types, node data and shape; ``unflatten`` builds
    a tree of that structure from leaves.

    Example:
        >>> from shardlab._src.core import tree
        >>> d = tree.flatten((1, [2, 3]))[1]
        >>> d, d.num_leaves, d.num_nodes, d.unflatten("abc")
        (PyTreeDef((*, [*, *])), 3, 5, ('a', ['b', 'c']))
    """

    __slots__ = ("_node",)

    def __init__(self, node):
        self._node = node

    @property
    def num_leaves(self) -> int:
        """How many leaves a tree of this structure has."""
        return self._node[4]

    @property
    def num_nodes(self) -> int:
        """How many nodes (leaves, None and containers) the structure has."""
        return self._node[5]

    def unflatten(self, leaves):
        """The tree of this structure with `leaves` in order."""
        leaves = list(leaves)
        if len(leaves) != self._node[4]:
            if len(leaves) < self._node[4]:
                raise ValueError(f"Too few leaves for PyTreeDef; expected {self._node[4]}, got {len(leaves)}")
            raise ValueError(f"Too many leaves for PyTreeDef; expected {self._node[4]}.")
        return _unflatten(self._node, iter(leaves))

    def flatten_up_to(self, xs):
        """The subtrees of `xs` at this structure's leaves (`xs` must have this structure
        down to them); ValueError as JAX's otherwise."""
        out: list = []
        _flatten_up_to(self._node, xs, out)
        return out

    def children(self) -> list:
        """The structures of the root's children."""
        return [PyTreeDef(k) for k in self._node[3]]

    def node_data(self):
        """``(type, aux data)`` of the root (None for a leaf), as JAX's."""
        kind, typ, aux = self._node[:3]
        if kind == LEAF:
            return None
        return typ, aux

    def compose(self, inner: "PyTreeDef") -> "PyTreeDef":
        """This structure with every leaf replaced by `inner`."""
        return PyTreeDef(_compose(self._node, inner._node))

    @staticmethod
    def from_node_data_and_children(registry, node_data, children) -> "PyTreeDef":
        """The structure with root `node_data` (as ``node_data()`` gives it) over `children`;
        `registry` is accepted for JAX's signature (shardlab has one registry)."""
        typ, aux = node_data
        kids = [c._node for c in children]
        kind = _BUILTIN_KIND.get(typ)
        if kind is None:
            kind = CUSTOM if typ in _REGISTRY else NAMEDTUPLE
        return PyTreeDef(_make(kind, typ, list(aux) if kind == DICT else aux, kids))

    def __eq__(self, other):
        return isinstance(other, PyTreeDef) and _equal(self._node, other._node)

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash(_hashable(self._node))

    def __repr__(self):
        return f"PyTreeDef({_str(self._node)})"

    __str__ = __repr__

    def __reduce__(self):
        return PyTreeDef, (self._node,)


def _unflatten(node, it):
    kind = node[0]
    if kind == LEAF:
        return next(it)
    if kind == NONE:
        return None
    values = [_unflatten(k, it) for k in node[3]]
    if kind == TUPLE:
        return tuple(values)
    if kind == LIST:
        return values
    if kind == DICT:
        return dict(zip(node[2], values))
    if kind == NAMEDTUPLE:
        return node[1](*values)
    return _REGISTRY[node[1]].unflatten(node[2], values)


def unflatten(treedef: PyTreeDef, leaves):
    """The tree of structure `treedef` with `leaves`, as ``jax.tree_util.tree_unflatten``."""
    if not isinstance(treedef, PyTreeDef):
        raise TypeError(f"tree_unflatten: treedef must be a PyTreeDef, got {type(treedef).__name__}")
    return treedef.unflatten(leaves)


def _equal(a, b) -> bool:
    if a is b:
        return True
    if a[0] != b[0] or a[1] is not b[1] or a[4] != b[4] or len(a[3]) != len(b[3]):
        return False
    if a[0] in (DICT, CUSTOM):
        try:
            if not bool(a[2] == b[2]):
                return False
        except Exception:
            return False
    return all(_equal(x, y) for x, y in zip(a[3], b[3]))


def _hashable(node):
    aux = node[2]
    if node[0] == DICT:
        aux = tuple(aux)
    elif node[0] == CUSTOM:
        try:
            hash(aux)
        except TypeError:
            aux = id(aux)
    return (node[0], node[1], aux, tuple(_hashable(k) for k in node[3]))


def _str(node) -> str:
    kind, typ, aux, kids = node[:4]
    if kind == LEAF:
        return "*"
    if kind == NONE:
        return "None"
    inner = [_str(k) for k in kids]
    if kind == TUPLE:
        return "(" + inner[0] + ",)" if len(inner) == 1 else "(" + ", ".join(inner) + ")"
    if kind == LIST:
        return "[" + ", ".join(inner) + "]"
    if kind == DICT:
        return "{" + ", ".join(f"{k!r}: {v}" for k, v in zip(aux, inner)) + "}"
    label = f"namedtuple[{typ.__name__}]" if kind == NAMEDTUPLE else f"{typ.__name__}[{aux}]"
    return f"CustomNode({label}, [{', '.join(inner)}])"


def _compose(node, inner):
    if node[0] == LEAF:
        return inner
    return _make(node[0], node[1], node[2], [_compose(k, inner) for k in node[3]])


def _flatten_up_to(node, x, out: list) -> None:
    kind, typ, aux, kids = node[:4]
    if kind == LEAF:
        out.append(x)
        return
    if kind == NONE:
        if x is not None:
            raise ValueError(
                f"Expected None, got {x!r}.\n\nIn previous releases of JAX, flatten-up-to used to consider "
                f"None to be a tree-prefix of non-None values. To obtain the previous behavior, you can "
                f"usually write:\n  jax.tree.map(lambda x, y: None if x is None else f(x, y), a, b, "
                f"is_leaf=lambda x: x is None)")
        return
    if kind in (TUPLE, LIST):
        name = "tuple" if kind == TUPLE else "list"
        if type(x) is not typ:
            raise ValueError(f"Expected {name}, got {x!r}.")
        if len(x) != len(kids):
            raise ValueError(f"{name.capitalize()} arity mismatch: {len(x)} != {len(kids)}; {name}: {x!r}.")
        children = list(x)
    elif kind == DICT:
        if type(x) is not dict:
            raise ValueError(f"Expected dict, got {x!r}.")
        keys = _sorted_keys(x)
        if keys != list(aux):
            raise ValueError(f"Dict key mismatch; expected keys: {list(aux)!r}; present keys: {keys!r}.")
        children = [x[k] for k in keys]
    elif kind == NAMEDTUPLE:
        if not isinstance(x, tuple) or not hasattr(type(x), "_fields"):
            raise ValueError(f"Expected named tuple, got {x!r}.")
        if type(x) is not typ:
            raise ValueError(f"Custom node type mismatch: expected type: {typ}, value: {x!r}.")
        if len(x) != len(kids):
            raise ValueError(f"Named tuple arity mismatch: {len(x)} != {len(kids)}; tuple: {x!r}.")
        children = list(x)
    else:
        if type(x) is not typ:
            raise ValueError(f"Custom node type mismatch: expected type: {typ}, value: {x!r}.")
        children, x_aux = _REGISTRY[typ].flatten(x)
        children = list(children)
        try:
            same = bool(x_aux == aux)
        except Exception:
            same = False
        if not same:
            raise ValueError(f"Mismatch custom node data: {aux!r} != {x_aux!r}; value: {x!r}.")
        if len(children) != len(kids):
            raise ValueError(f"Custom node arity mismatch: expected: {len(kids)}, got: {len(children)}; "
                             f"value: {x!r}.")
    for k, c in zip(kids, children):
        _flatten_up_to(k, c, out)


# -- for the transforms -------------------------------------------------------------------------
def broadcast_prefix(prefix: Any, tree: Any, is_leaf: Callable[[Any], bool], what: str, op: str = "shard_map"):
    """For every leaf of `tree`, the leaf of `prefix` whose subtree contains it. `is_leaf`
    marks the prefix's leaves (PartitionSpecs, shardings); None matches only None."""
    out: list = []
    _broadcast(prefix, tree, is_leaf, what, op, out)
    return out


def _broadcast(p, t, is_leaf, what: str, op: str, out: list) -> None:
    if is_leaf(p):
        out.extend([p] * flatten(t)[1].num_leaves)
        return
    if p is None and t is None:
        return
    p_one = None if p is None else flatten_one_level(p)
    t_one = None if t is None else flatten_one_level(t)
    if p_one is None or t_one is None or type(p) is not type(t) or len(list(p_one[0])) != len(list(t_one[0])):
        raise ValueError(f"[{op}] {what} has structure {_describe(p)} which is not a prefix "
                         f"of the arguments' structure {_describe(t)}")
    if p_one[1] != t_one[1]:
        if type(p) is dict:
            raise ValueError(f"[{op}] {what} dict keys {list(p_one[1])} differ from {list(t_one[1])}")
        raise ValueError(f"[{op}] {what} node data {p_one[1]!r} differs from {t_one[1]!r}")
    for a, b in zip(p_one[0], t_one[0]):
        _broadcast(a, b, is_leaf, what, op, out)


def _describe(node) -> str:
    one = None if node is None else flatten_one_level(node)
    if one is None:
        return type(node).__name__
    return f"{type(node).__name__}[{', '.join(_describe(k) for k in one[0])}]"


def _register_builtins() -> None:
    register_node(
        collections.OrderedDict,
        lambda x: (tuple(x.values()), tuple(x.keys())),
        lambda keys, values: collections.OrderedDict(zip(keys, values)),
        lambda x: (tuple((DictKey(k), v) for k, v in x.items()), tuple(x.keys())),
    )

    def dd_keys(d):
        keys = tuple(_sorted_keys(d))
        return tuple((DictKey(k), d[k]) for k in keys), (d.default_factory, keys)

    def dd_flat(d):
        keys = tuple(_sorted_keys(d))
        return tuple(d[k] for k in keys), (d.default_factory, keys)

    register_node(collections.defaultdict, dd_flat,
                  lambda s, values: collections.defaultdict(s[0], zip(s[1], values)), dd_keys)


_register_builtins()
