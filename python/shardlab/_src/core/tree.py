"""Minimal pytrees (tuples, lists, dicts, namedtuples, None) as JAX flattens them."""

from typing import Any, Callable


def _children(node):
    if isinstance(node, dict):
        keys = sorted(node)
        return [node[k] for k in keys], ("dict", tuple(keys))
    if isinstance(node, tuple) and hasattr(node, "_fields"):
        return list(node), ("namedtuple", type(node))
    if isinstance(node, (tuple, list)):
        return list(node), (type(node).__name__, len(node))
    return None, None


def flatten(tree: Any, is_leaf: Callable[[Any], bool] = lambda x: False):
    """Returns (leaves, treedef); None is an empty node, as in JAX."""
    leaves: list = []
    return leaves, _flatten(tree, is_leaf, leaves)


# Module-level recursion, not a nested closure: a recursive closure is a reference cycle that
# keeps every leaf (megabytes of shard data) alive until the garbage collector runs.
def _flatten(node, is_leaf, leaves: list):
    if node is None:
        return ("none",)
    if not is_leaf(node):
        kids, kind = _children(node)
        if kind is not None:
            return (kind, [_flatten(k, is_leaf, leaves) for k in kids])
    leaves.append(node)
    return ("leaf",)


def unflatten(treedef, leaves):
    return _unflatten(treedef, iter(leaves))


def _unflatten(d, it):
    if d[0] == "none":
        return None
    if d[0] == "leaf":
        return next(it)
    (kind, meta), kids = d
    values = [_unflatten(k, it) for k in kids]
    if kind == "dict":
        return dict(zip(meta, values))
    if kind == "namedtuple":
        return meta(*values)
    return tuple(values) if kind == "tuple" else list(values)


def broadcast_prefix(prefix: Any, tree: Any, is_leaf: Callable[[Any], bool], what: str):
    """For every leaf of `tree`, the leaf of `prefix` whose subtree contains it."""
    out: list = []
    _broadcast(prefix, tree, is_leaf, what, out)
    return out


def _broadcast(p, t, is_leaf, what: str, out: list) -> None:
    if is_leaf(p):
        out.extend([p] * len(flatten(t)[0]))
        return
    if p is None and t is None:
        return
    pk, pkind = _children(p)
    tk, tkind = _children(t)
    if pkind is None or tkind is None or pkind[0] != tkind[0] or len(pk) != len(tk):
        raise ValueError(f"[shard_map] {what} has structure {_describe(p)} which is not a prefix "
                         f"of the arguments' structure {_describe(t)}")
    if pkind[0] == "dict" and pkind[1] != tkind[1]:
        raise ValueError(f"[shard_map] {what} dict keys {list(pkind[1])} differ from {list(tkind[1])}")
    for a, b in zip(pk, tk):
        _broadcast(a, b, is_leaf, what, out)


def _describe(node) -> str:
    kids, kind = _children(node)
    if kind is None:
        return type(node).__name__
    return f"{kind[0]}[{', '.join(_describe(k) for k in kids)}]"
