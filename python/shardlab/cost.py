"""``shardlab.cost``: collective and compute time formulas usable without running anything
(see ``shardlab._src.cost``)."""

from ._src.cost.model import *  # noqa: F401,F403
from ._src.cost.model import __all__ as _model_all
from ._src.cost.model import event_cost, event_seconds  # noqa: F401
from ._src.cost import formulas  # noqa: F401
from ._core import AxisSchedule  # noqa: F401  (what cost.schedule returns: one axis's collective step by step)

__all__ = list(_model_all) + ["AxisSchedule", "event_cost", "event_seconds", "formulas"]
