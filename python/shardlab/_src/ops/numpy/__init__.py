"""``shardlab.numpy``'s definitions (jax.numpy on per-device values, global arrays and host data),
one module per family as numpy's reference groups them; ``shardlab.numpy`` re-exports them.

Each function takes numpy arrays, scalars, LocalArrays (per-device values inside shard_map) or
global ShardedArrays; inside shard_map axes and shapes are LOCAL. On LocalArrays every function
is a composition of primitives (``shardlab._src.primitives``), so it runs on any backend, is
recorded in the ledger (contractions and attention as compute events) and is differentiable.
On plain numpy arrays it is numpy itself (matmul / einsum on shardlab's GEMM); on global arrays
the planning layer's implementation (:data:`GLOBAL`).

=================  ==========================================================================
module             what
=================  ==========================================================================
``dispatch``       how a call finds its implementation; helpers every family shares
``conversion``     astype, result_type, promote_types, copy, ndim / shape / size, dtype names
``manipulation``   reshape, transpose, expand / squeeze, broadcast, join, split, flip, roll
``creation``       zeros, ones, full, empty (and ``_like``), arange, linspace, eye, array
``elementwise``    ufuncs, the LocalArray operators, where / select / clip, tril / triu
``reductions``     sum ... std, arg-reductions, cumsum, NaN-aware ones, allclose
``indexing``       ``x[...]``, ``x.at[...]``, take, take_along_axis, diagonal, trace
``sorting``        sort, argsort, top_k
``contractions``   matmul, dot, einsum, tensordot, kron, dot_general
=================  ==========================================================================

A family imports only the families above it in this table (``elementwise`` needs ``manipulation``'s
expand_dims for ``ufunc.outer``); what a lower family adds to a higher one it registers where
it is defined (``register_ufunc_reduction`` in ``reductions``, ``register_ufunc_call`` in
``contractions``), as each family registers its LocalArray methods beside the function.

Example:
    >>> import shardlab.numpy as jnp
    >>> jnp.einsum("ij,jk->ik", jnp.ones((2, 3)), jnp.ones((3, 4))).shape
    (2, 4)
"""

from . import contractions, conversion, creation, dispatch, elementwise, indexing, manipulation, reductions, sorting
from .contractions import *  # noqa: F401,F403
from .conversion import *  # noqa: F401,F403
from .creation import *  # noqa: F401,F403
from .dispatch import *  # noqa: F401,F403
from .elementwise import *  # noqa: F401,F403
from .indexing import *  # noqa: F401,F403
from .manipulation import *  # noqa: F401,F403
from .reductions import *  # noqa: F401,F403
from .sorting import *  # noqa: F401,F403

__all__ = [n for m in (conversion, manipulation, creation, elementwise, reductions, indexing, sorting, contractions)
           for n in m.__all__]
