"""``shardlab.lax``: collectives and per-device slicing, as ``jax.lax`` (see
``shardlab._src.ops.lax`` for the definitions)."""

from ._src.ops.lax import (  # noqa: F401
    all_gather, all_to_all, axis_index, axis_size, broadcast, dynamic_slice, dynamic_slice_in_dim,
    dynamic_update_slice, dynamic_update_slice_in_dim, gather, pcast, pmax, pmean, pmin, ppermute,
    pshuffle, psum, psum_scatter, pvary, reduce, scatter, top_k,
)
from ._src.ops.lax import pbroadcast, precv, psend, pswapaxes, ragged_all_to_all  # noqa: F401
from ._src.ops.control_flow import cond, fori_loop, map, scan, switch, while_loop  # noqa: F401,A004

__all__ = ["all_gather", "all_to_all", "axis_index", "axis_size", "broadcast", "dynamic_slice",
           "dynamic_slice_in_dim", "dynamic_update_slice", "dynamic_update_slice_in_dim", "fori_loop", "gather",
           "pbroadcast", "pcast", "pmax", "pmean", "pmin", "ppermute", "precv", "psend", "pshuffle", "psum", "psum_scatter",
           "pswapaxes", "pvary", "ragged_all_to_all", "reduce", "scatter", "top_k"]
__all__ += ["cond", "map", "scan", "switch", "while_loop"]
from ._src.planning.global_numpy import cumlogsumexp, cummax, cummin  # noqa: E402,F401
from ._src.planning.global_numpy import cumprod_lax as cumprod, cumsum_lax as cumsum  # noqa: E402,F401
from ._src.planning.sharding_api import with_sharding_constraint  # noqa: E402,F401

__all__ += ["cumlogsumexp", "cummax", "cummin", "cumprod", "cumsum", "with_sharding_constraint"]
from ._src.ops.numpy import _dot_general as dot_general  # noqa: E402,F401  (jax.lax.dot_general)

__all__ += ["dot_general"]
from ._src.transforms.checkpoint_policies import (  # noqa: E402,F401  (what checkpoint policies compare against)
    all_gather_p, all_to_all_p, axis_index_p, dot_general_p, pmax_p, pmin_p, ppermute_p, psum_p,
)

__all__ += ["all_gather_p", "all_to_all_p", "axis_index_p", "dot_general_p", "pmax_p", "pmin_p", "ppermute_p", "psum_p"]
