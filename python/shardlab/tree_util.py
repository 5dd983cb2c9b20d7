"""``shardlab.tree_util``: pytrees as ``jax.tree_util`` (see ``shardlab._src.core.tree_util``).

One registry serves every transform: a type registered here flattens the same way in grad,
shard_map, jit, eval_shape, vmap and lax.scan / cond / while_loop.

Example:
    >>> import shardlab as sl
    >>> sl.tree_util.tree_leaves({"b": (1, None), "a": [2, 3]})
    [2, 3, 1]
"""

from ._src.core.tree_util import (  # noqa: F401
    DictKey, FlattenedIndexKey, GetAttrKey, KeyEntry, KeyPath, Partial, PyTreeDef, SequenceKey, all_leaves,
    flatten_one_level, flatten_one_level_with_keys, is_tree_node, keystr, register_dataclass,
    register_pytree_node, register_pytree_node_class, register_pytree_with_keys, register_pytree_with_keys_class,
    register_static, tree_all, tree_broadcast, tree_flatten, tree_flatten_with_path, tree_leaves,
    tree_leaves_with_path, tree_map, tree_map_with_path, tree_reduce, tree_reduce_associative, tree_structure,
    tree_transpose, tree_unflatten, treedef_children, treedef_is_leaf, treedef_tuple,
)

__all__ = [
    "DictKey", "FlattenedIndexKey", "GetAttrKey", "KeyEntry", "KeyPath", "Partial", "PyTreeDef", "SequenceKey",
    "all_leaves", "flatten_one_level", "flatten_one_level_with_keys", "is_tree_node", "keystr",
    "register_dataclass", "register_pytree_node", "register_pytree_node_class", "register_pytree_with_keys",
    "register_pytree_with_keys_class", "register_static", "tree_all", "tree_broadcast", "tree_flatten",
    "tree_flatten_with_path", "tree_leaves", "tree_leaves_with_path", "tree_map", "tree_map_with_path",
    "tree_reduce", "tree_reduce_associative", "tree_structure", "tree_transpose", "tree_unflatten",
    "treedef_children", "treedef_is_leaf", "treedef_tuple",
]
