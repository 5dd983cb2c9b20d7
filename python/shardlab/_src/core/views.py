"""The registry through which library objects find their pictures.

A class low in the stack (Mesh, Ledger, Hardware, Plan, Roofline, ...) cannot import
``shardlab.viz``, which draws with the public face above it. So ``shardlab.viz`` registers each
object's view beside the view's definition, by class::

    register_view(Mesh, mesh_view)      # mesh_view(mesh) -> a View (html, text, __rich__)

and the class's ``_repr_html_`` / ``__rich__`` (and ``__str__`` where the class has no text of
its own) ask :func:`view_of`. Subclasses find their base class's view. C++ classes (pybind11)
cannot ask, so ``register_view`` gives them the methods itself.

Example:
    >>> from shardlab._src.core import views
    >>> class Thing(views.Viewable):
    ...     pass
    >>> class Picture:
    ...     def __init__(self, obj): self.text = "a thing"
    ...     def _repr_html_(self): return "<b>a thing</b>"
    ...     def __rich__(self): return self.text
    >>> views.html_view(Thing()) is None
    True
    >>> views.register_view(Thing, Picture)
    >>> Thing()._repr_html_(), views.text_view(Thing()), Thing().__rich__()
    ('<b>a thing</b>', 'a thing', 'a thing')
"""

from __future__ import annotations

import html
from typing import Callable

__all__ = ["register_view", "view_of", "html_view", "text_view", "Viewable"]

_VIEWS: dict[type, Callable] = {}


def _is_binding(cls: type) -> bool:
    return type(cls).__name__ == "pybind11_type"


def register_view(cls: type, view: Callable) -> None:
    """Makes ``view(obj)`` the picture of every ``cls`` (and subclass) instance.

    ``view`` returns an object with ``_repr_html_()``, ``text`` and ``__rich__()`` (a
    ``shardlab.viz.View``). A pybind11 class gets ``_repr_html_``, ``__rich__``, ``__str__``
    and ``__repr__`` from the view, since its C++ methods cannot ask the registry.
    """
    if not isinstance(cls, type):
        raise TypeError(f"[register_view] expected a class, got {cls!r}")
    if not callable(view):
        raise TypeError(f"[register_view] view for {cls.__name__} must be callable obj -> View, got {view!r}")
    _VIEWS[cls] = view
    if _is_binding(cls):
        cls._repr_html_ = lambda self: view(self)._repr_html_()
        cls.__rich__ = lambda self: view(self).__rich__()
        cls.__str__ = cls.__repr__ = lambda self: view(self).text


def view_of(obj):
    """The registered view of ``obj`` (a View), or None when its class has none."""
    for cls in type(obj).__mro__:
        fn = _VIEWS.get(cls)
        if fn is not None:
            return fn(obj)
    return None


def html_view(obj) -> str | None:
    """The registered view's HTML (with its style sheet), or None."""
    v = view_of(obj)
    return None if v is None else v._repr_html_()


def text_view(obj) -> str | None:
    """The registered view's plain text, or None."""
    v = view_of(obj)
    return None if v is None else v.text


class Viewable:
    """Mixin: ``_repr_html_`` (Jupyter) and ``__rich__`` (``rich.print``) from the registry,
    the repr when nothing is registered."""

    def _repr_html_(self) -> str:
        h = html_view(self)
        return h if h is not None else f"<code>{html.escape(repr(self))}</code>"

    def __rich__(self):
        v = view_of(self)
        return v.__rich__() if v is not None else repr(self)
