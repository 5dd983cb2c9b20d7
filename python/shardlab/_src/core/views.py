"""HTML views of library objects, registered by the views package above everything else.

A class's ``_repr_html_`` asks this table for its view, so a low layer (Mesh, Ledger, ...)
shows the rich picture without importing the package that draws it.

Example:
    >>> from shardlab._src.core import views
    >>> views.html_view(object()) is None
    True
"""

from __future__ import annotations

VIEWS: dict = {}  # class name → function(obj) -> HTML string


def register(class_name: str, fn) -> None:
    VIEWS[class_name] = fn


def html_view(obj):
    """The registered HTML for `obj`, or None when no view is registered for its class."""
    fn = VIEWS.get(type(obj).__name__)
    return None if fn is None else fn(obj)
