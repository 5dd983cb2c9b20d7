"""The legacy positional form: ``shard_map(f, mesh, in_specs, out_specs, check_rep=True)``.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> from shardlab.experimental.shard_map import shard_map
    >>> mesh = sl.make_mesh((2,), ("x",))
    >>> shard_map(lambda a: a * 2, mesh, P("x"), P("x"))(np.ones(4)).shape
    (4,)
"""

from .._src.transforms.shard_map import shard_map as _shard_map


def shard_map(f, mesh, in_specs, out_specs, check_rep: bool = True, auto=frozenset()):
    if auto:
        raise NotImplementedError("[shard_map] auto axes are not supported; map over every mesh axis")
    return _shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_rep)
