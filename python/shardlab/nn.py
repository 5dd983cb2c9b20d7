"""``shardlab.nn``: jax.nn's functions, differentiable, with attention on the flash kernel
(see ``shardlab._src.ops.nn``)."""

from ._src.ops.nn import *  # noqa: F401,F403
from ._src.ops.nn import __all__  # noqa: F401
