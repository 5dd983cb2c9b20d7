"""``shardlab.views``: the registry through which library objects find their pictures
(``shardlab.viz`` fills it; see ``shardlab._src.core.views``)."""

from ._src.core.views import Viewable, html_view, register_view, text_view, view_of  # noqa: F401

__all__ = ["Viewable", "html_view", "register_view", "text_view", "view_of"]
