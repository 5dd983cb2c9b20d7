"""Backends: where primitives run. ``emulated`` (the C++ core and numpy on real data) and
``abstract`` (shape rules only). Importing this package registers both."""

from . import emulated  # noqa: F401
from . import fused  # noqa: F401
from . import grouped  # noqa: F401
from . import abstract  # noqa: F401
