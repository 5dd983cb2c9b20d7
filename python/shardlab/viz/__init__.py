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

from . import colors
from .collective import collective, group_bytes
from .ledger import event_rows, ledger_html, ledger_text, ledger_view
from .link_traffic import link_traffic
from .timeline import schedule_events, timeline
from .sharding import device_list, sharding
from .view import View

__all__ = ["collective", "colors", "group_bytes", "event_rows", "ledger_html", "ledger_text", "ledger_view", "link_traffic", "schedule_events", "timeline", "device_list", "sharding", "View"]
