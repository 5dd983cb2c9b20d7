"""The one formatter for bytes, FLOPs, times and rates (see ``shardlab._src.core.units``)."""

from ._src.core.units import *  # noqa: F401,F403
from ._src.core.units import __all__  # noqa: F401
