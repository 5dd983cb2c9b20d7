"""``shardlab.hardware``: accelerator presets with a source for every number
(see ``shardlab._src.core.hardware``)."""

from ._src.core.hardware import *  # noqa: F401,F403
from ._src.core.hardware import __all__  # noqa: F401
