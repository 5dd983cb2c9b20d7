"""``shardlab.tree``: the short names of ``shardlab.tree_util``, as ``jax.tree``.

Example:
    >>> import shardlab as sl
    >>> sl.tree.map(lambda x: x * 2, {"a": 1, "b": [2, None]})
    {'a': 2, 'b': [4, None]}
    >>> sl.tree.structure((1, 2))
    PyTreeDef((*, *))
"""

from ._src.core.tree_util import (  # noqa: F401
    static,
    tree_all as all,
    tree_broadcast as broadcast,
    tree_flatten as flatten,
    tree_flatten_with_path as flatten_with_path,
    tree_leaves as leaves,
    tree_leaves_with_path as leaves_with_path,
    tree_map as map,
    tree_map_with_path as map_with_path,
    tree_reduce as reduce,
    tree_reduce_associative as reduce_associative,
    tree_structure as structure,
    tree_transpose as transpose,
    tree_unflatten as unflatten,
)

__all__ = ["all", "broadcast", "flatten", "flatten_with_path", "leaves", "leaves_with_path", "map",
           "map_with_path", "reduce", "reduce_associative", "static", "structure", "transpose", "unflatten"]
