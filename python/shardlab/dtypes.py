"""``shardlab.dtypes``: the dtypes shardlab moves and JAX's promotion rules
(see ``shardlab._src.core.dtypes``)."""

from ._src.core.dtypes import *  # noqa: F401,F403
