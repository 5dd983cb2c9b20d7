"""shardlab.viz: pictures of shardings, collectives, link traffic, ledgers, timelines and costs.

Every function returns a View (HTML in Jupyter, colours in a terminal with ``rich.print`` or
``view.show()``, plain text with ``print``, ``view.save("x.svg" | "x.png" | "x.html")``). The
library's objects (Mesh, Hardware, Plan, Roofline, Ledger, ShardedArray, ...) display through
these views: each is registered for its class beside its definition (``shardlab.views``).
``viz.progress`` draws progress bars for long work.

Example:
    >>> import shardlab as sl
    >>> from shardlab import P, viz
    >>> mesh = sl.make_mesh((8,), ("x",), hardware="h100")
    >>> viz.sharding((16, 4), sl.NamedSharding(mesh, P("x"))).data["blocks"][3]["label"]
    'GPU 3'
"""

from . import colors, progress
from .collective import collective, group_bytes
from .ledger import event_rows, ledger_html, ledger_text, ledger_view, save_ledger
from .link_traffic import link_traffic
from .objects import (axis_schedule_html, axis_schedule_text, axis_schedule_view, collective_cost_html,
                      collective_cost_text, collective_cost_view, hardware_html, hardware_text, hardware_view,
                      mesh_html, mesh_text, mesh_view, plan_html, plan_text, plan_view, roofline_html, roofline_text,
                      roofline_view)
from .pipeline_schedule import pipeline_schedule
from .plots import collective_sweep, roofline_plot, strategy_sweep, throughput_latency_plot
from .timeline import chrome_trace, schedule_events, timeline
from .serving import throughput_latency
from .sharding import device_list, sharding
from .strategies import bytes_by_axes, strategies
from .view import Displayed, View

__all__ = ["axis_schedule_html", "axis_schedule_text", "axis_schedule_view", "collective", "collective_cost_html",
           "collective_cost_text", "collective_cost_view", "collective_sweep", "colors", "device_list", "Displayed",
           "event_rows", "group_bytes", "hardware_html", "hardware_text", "hardware_view", "ledger_html",
           "ledger_text", "ledger_view", "link_traffic", "mesh_html", "mesh_text", "mesh_view", "pipeline_schedule", "plan_html",
           "plan_text", "plan_view", "progress", "roofline_html", "roofline_plot", "roofline_text", "roofline_view",
           "save_ledger", "schedule_events", "chrome_trace", "sharding", "strategies", "bytes_by_axes", "strategy_sweep", "throughput_latency", "throughput_latency_plot", "timeline", "View"]
