"""shardlab.viz: pictures of shardings, collectives, link traffic, ledgers, timelines and costs.

Every function returns a View (HTML in Jupyter, colours in a terminal with ``rich.print`` or
``view.show()``, plain text with ``print``); the ``*_html`` / ``*_text`` functions return
strings and back the ``_repr_html_`` / ``__repr__`` of shardlab's public objects (``VIEWS``).

Example:
    >>> import shardlab as sl
    >>> from shardlab import P, viz
    >>> mesh = sl.make_mesh((8,), ("x",), hardware="h100")
    >>> viz.sharding((16, 4), sl.NamedSharding(mesh, P("x"))).data["blocks"][3]["label"]
    'GPU 3'
"""

import shardlab as sl

from . import colors
from .collective import collective, group_bytes
from .ledger import event_rows, ledger_html, ledger_text, ledger_view
from .link_traffic import link_traffic
from .objects import (axis_schedule_html, axis_schedule_text, collective_cost_html, collective_cost_text,
                      hardware_html, hardware_text, mesh_html, mesh_text, plan_html, plan_text, roofline_html,
                      roofline_text)
from .plots import collective_sweep, roofline_plot, strategy_sweep
from .timeline import chrome_trace, schedule_events, timeline
from .sharding import device_list, sharding
from .view import View

__all__ = ["axis_schedule_html", "axis_schedule_text", "collective_cost_html", "collective_cost_text",
           "collective_sweep", "hardware_html", "hardware_text", "mesh_html", "mesh_text", "plan_html",
           "plan_text", "roofline_html", "roofline_plot", "roofline_text", "strategy_sweep", "VIEWS", "TEXTS",
           "collective", "colors", "group_bytes", "event_rows", "ledger_html", "ledger_text", "ledger_view", "link_traffic", "schedule_events", "chrome_trace", "timeline", "device_list", "sharding", "View"]

# Class -> function returning its HTML (for _repr_html_) / its text (for __repr__ or __str__).
VIEWS = {
    sl.Mesh: mesh_html,
    sl.hardware.Hardware: hardware_html,
    sl.cost.CollectiveCost: collective_cost_html,
    type(sl.cost.schedule("all_gather", 2, "ring", 1.0)): axis_schedule_html,
    sl.Plan: plan_html,
    sl.cost.Roofline: roofline_html,
    sl.Ledger: ledger_html,
}
TEXTS = {
    sl.Mesh: mesh_text,
    sl.hardware.Hardware: hardware_text,
    sl.cost.CollectiveCost: collective_cost_text,
    type(sl.cost.schedule("all_gather", 2, "ring", 1.0)): axis_schedule_text,
    sl.Plan: plan_text,
    sl.cost.Roofline: roofline_text,
    sl.Ledger: ledger_text,
}
