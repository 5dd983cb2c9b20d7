"""``shardlab.lax``, as ``jax.lax``: collectives, per-device slicing, control flow, cumulative
ops, ``dot_general`` and ``with_sharding_constraint`` (see ``shardlab._src.ops.lax``,
``_src.ops.control_flow`` and ``_src.planning`` for the definitions)."""

from ._src.ops.control_flow import cond, fori_loop, map, scan, switch, while_loop  # noqa: A004
from ._src.ops.lax import (
    all_gather, all_to_all, axis_index, axis_size, broadcast, dynamic_slice, dynamic_slice_in_dim,
    dynamic_update_slice, dynamic_update_slice_in_dim, gather, pbroadcast, pcast, pmax, pmean, pmin, ppermute,
    precv, pshuffle, psend, psum, psum_scatter, pswapaxes, pvary, ragged_all_to_all, reduce, scatter, top_k,
)
from ._src.ops.numpy.contractions import _dot_general as dot_general
from ._src.planning.global_numpy import cumlogsumexp, cummax, cummin
from ._src.planning.global_numpy import cumprod_lax as cumprod
from ._src.planning.global_numpy import cumsum_lax as cumsum
from ._src.planning.sharding_api import with_sharding_constraint
from ._src.transforms.checkpoint_policies import (  # what checkpoint policies compare primitives against
    all_gather_p, all_to_all_p, axis_index_p, dot_general_p, pmax_p, pmin_p, ppermute_p, psum_p,
)

__all__ = [
    "all_gather", "all_gather_p", "all_to_all", "all_to_all_p", "axis_index", "axis_index_p", "axis_size",
    "broadcast", "cond", "cumlogsumexp", "cummax", "cummin", "cumprod", "cumsum", "dot_general", "dot_general_p",
    "dynamic_slice", "dynamic_slice_in_dim", "dynamic_update_slice", "dynamic_update_slice_in_dim", "fori_loop",
    "gather", "map", "pbroadcast", "pcast", "pmax", "pmax_p", "pmin", "pmin_p", "ppermute", "ppermute_p", "precv",
    "psend", "pshuffle", "psum", "psum_p", "psum_scatter", "pswapaxes", "pvary", "ragged_all_to_all", "reduce",
    "scan", "scatter", "switch", "top_k", "while_loop", "with_sharding_constraint",
]
