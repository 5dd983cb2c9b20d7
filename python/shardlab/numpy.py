"""``shardlab.numpy`` (import as ``jnp``): jax.numpy on per-device values and numpy arrays
(see ``shardlab._src.ops.numpy``: one module per family).

Example:
    >>> import shardlab.numpy as jnp
    >>> jnp.einsum("ij,jk->ik", jnp.ones((2, 3)), jnp.ones((3, 4))).shape
    (2, 4)
"""

from ._src.ops.numpy import *  # noqa: F401,F403  (its __all__ names builtins it shadows: abs, all, sum, ...)
from ._src.ops.numpy_fallback import *  # noqa: F401,F403
from ._src.ops.numpy_fallback import UNSUPPORTED, coverage, round, round_  # noqa: F401
from ._src.ops.numpy_fallback import guard_namespace as _guard_namespace  # noqa: E402

# On global ShardedArrays every public function has a sharded rule, the recorded fallback, or raises.
_guard_namespace(globals())
