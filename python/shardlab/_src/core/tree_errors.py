"""JAX's messages for pytrees that do not match: ``_prefix_error`` (tree_map, vmap's in_axes)
and ``equality_errors`` (scan carries, cond branches), message for message.

Example:
    >>> from shardlab._src.core.tree_errors import equality_errors
    >>> [why for _, _, _, why in equality_errors((1, 2), (1, 2, 3))]
    ['the lengths do not match']
"""

from __future__ import annotations

import difflib
import textwrap

from . import tree as _t


def _keystr(keys) -> str:
    return "".join(str(k) for k in keys)


def _structure(tree, is_leaf=None):
    return _t.flatten(tree, is_leaf)[1]


def _one(tree):
    out = _t.flatten_one_level(tree)
    if out is None:
        raise ValueError(f"can't tree-flatten type: {type(tree)}")
    return out


def _one_keys(tree):
    out = _t.flatten_one_level_with_keys(tree)
    if out is None:
        raise ValueError(f"can't tree-flatten type: {type(tree)}")
    return out


def _is_strict_leaf(tree, is_leaf) -> bool:
    d = _structure(tree, is_leaf=is_leaf)
    return d.num_nodes == 1 and d.num_leaves == 1


def _child_keys(tree) -> tuple:
    return tuple(k for k, _ in _one_keys(tree)[0])


def _prefix_error(key_path, prefix_tree, full_tree, is_leaf=None):
    """Yields functions name -> ValueError describing where `prefix_tree` is not a prefix of
    `full_tree` (JAX's ``_prefix_error``, message for message)."""
    if _is_strict_leaf(prefix_tree, is_leaf):
        return
    if type(prefix_tree) is not type(full_tree):
        yield lambda name: ValueError(
            "pytree structure error: different types at key path\n"
            f"    {name}{_keystr(key_path)}\n"
            f"At that key path, the prefix pytree {name} has a subtree of type\n"
            f"    {type(prefix_tree)}\n"
            f"but at the same key path the full pytree has a subtree of different type\n"
            f"    {type(full_tree)}.")
        return
    p_children, p_meta = _one(prefix_tree)
    f_children, f_meta = _one(full_tree)
    p_children, f_children = tuple(p_children), tuple(f_children)
    p_keys, f_keys = _child_keys(prefix_tree), _child_keys(full_tree)
    if isinstance(prefix_tree, (list, tuple)):
        if len(prefix_tree) != len(full_tree):
            ty = type(prefix_tree)
            yield lambda name: ValueError(
                f"pytree structure error: different lengths of {ty.__name__} at key path\n"
                f"    {name}{_keystr(key_path)}\n"
                f"At that key path, the prefix pytree {name} has a subtree of type "
                f"{ty.__name__} of length {len(prefix_tree)}, but the full pytree "
                f"has a subtree of the same type but of length {len(full_tree)}.")
            return
    else:
        try:
            diff = set(p_keys).symmetric_difference(set(f_keys))
        except Exception:
            diff = None
        if len(p_children) != len(f_children):
            yield lambda name: ValueError(
                "pytree structure error: different numbers of pytree children at key path\n"
                f"    {name}{_keystr(key_path)}\n"
                f"At that key path, the prefix pytree {name} has a subtree of type\n"
                f"    {type(prefix_tree)}\n"
                f"with {len(p_children)} child keys\n"
                f"    {' '.join(str(_key_value(k)) for k in p_keys)}\n"
                f"but at the same key path the full pytree has a subtree of the same "
                f"type but with {len(f_children)} child keys\n"
                f"    {' '.join(str(_key_value(k)) for k in f_keys)}\n"
                + ("" if diff is None else
                   f"so the symmetric difference on key sets is\n"
                   f"    {' '.join(str(_key_value(k)) for k in diff)}"))
            return
    if p_meta != f_meta:
        p_str, f_str = str(p_meta), str(f_meta)
        metadata_diff = textwrap.indent("\n".join(difflib.ndiff(p_str.splitlines(), f_str.splitlines())),
                                        prefix="    ")
        yield lambda name: ValueError(
            "pytree structure error: different pytree metadata at key path\n"
            f"    {name}{_keystr(key_path)}\n"
            f"At that key path, the prefix pytree {name} has a subtree of type\n"
            f"    {type(prefix_tree)}\n"
            f"with metadata\n"
            f"    {p_str}\n"
            f"but at the same key path the full pytree has a subtree of the same "
            f"type but with metadata\n"
            f"    {f_str}\n"
            f"so the diff in the metadata at these pytree nodes is\n"
            f"{metadata_diff}")
        return
    for k, a, b in zip(p_keys, p_children, f_children):
        yield from _prefix_error((*key_path, k), a, b)


def _key_value(k):
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return getattr(k, attr)
    return k


def equality_errors(tree1, tree2, is_leaf=None):
    """Yields ``(key_path, thing1, thing2, explanation)`` for each place two trees differ
    (JAX's ``equality_errors``: used for carry / branch output mismatches)."""
    yield from _equality_errors((), tree1, tree2, is_leaf)


def _equality_errors(path, t1, t2, is_leaf):
    if _is_strict_leaf(t1, is_leaf) and _is_strict_leaf(t2, is_leaf):
        return
    if type(t1) is not type(t2):
        yield path, str(type(t1)), str(type(t2)), "their Python types differ"
        return
    if isinstance(t1, (list, tuple)) and len(t1) != len(t2):
        yield (path, f"{type(t1).__name__} of length {len(t1)}", f"{type(t2).__name__} of length {len(t2)}",
               "the lengths do not match")
        return
    c1, m1 = _one(t1)
    c2, m2 = _one(t2)
    c1, c2 = tuple(c1), tuple(c2)
    k1, k2 = _child_keys(t1), _child_keys(t2)
    if len(c1) != len(c2):
        try:
            diff = " ".join(repr(_key_value(k)) for k in set(k1).symmetric_difference(set(k2)))
        except Exception:
            diff = ""
        yield (path, f"{type(t1)} with {len(c1)} child{'ren' if len(c1) > 1 else ''}",
               f"{type(t2)} with {len(c2)} child{'ren' if len(c2) > 1 else ''}",
               "the numbers of children do not match" + (diff and f", with the symmetric difference of key sets: {{{diff}}}"))
        return
    if m1 != m2:
        yield (path, f"{type(t1)} with pytree metadata {m1}", f"{type(t2)} with pytree metadata {m2}",
               "the pytree node metadata does not match")
        return
    for k, a, b in zip(k1, c1, c2):
        yield from _equality_errors((*path, k), a, b, is_leaf)
