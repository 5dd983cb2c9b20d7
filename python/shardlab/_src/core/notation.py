"""The book's sharding notation: ``A[I_XY, J]``, ``C[I, K]{U_X}``, as text, LaTeX or HTML.

One renderer for the planner's plans, ``debug.notation`` and ``viz``'s picture titles: a dim's
letter takes the mesh axes that split it as a subscript, and a value that is unreduced along
axes carries ``{U_axes}``.

Example:
    >>> from shardlab._src.core import notation
    >>> notation.term("A", "IJ", [("X", "Y"), ()]), notation.term("C", "IK", [(), ()], unreduced=("X",))
    ('A[I_XY, J]', 'C[I, K]{U_X}')
    >>> notation.term("W", "DF", [(), ("Y",)], fmt="html")
    'W[D, F<sub>Y</sub>]'
"""

from __future__ import annotations

import html

__all__ = ["FORMATS", "axes_str", "sub", "term"]

FORMATS = ("text", "latex", "html")


def axes_str(axes) -> str:
    """Mesh axes as a subscript: joined ("XY") when every name is one letter, else with commas."""
    if all(len(a) == 1 for a in axes):
        return "".join(axes)
    return ",".join(axes)


def sub(base: str, axes, fmt: str) -> str:
    """``base`` with ``axes`` as its subscript in ``fmt``.

    Example:
        >>> sub("I", ("X",), "text"), sub("I", ("x", "y"), "latex"), sub("I", (), "html")
        ('I_X', 'I_{xy}', 'I')
    """
    if not axes:
        return base
    s = axes_str(axes)
    if fmt == "latex":
        return f"{base}_{{{s}}}"
    if fmt == "html":
        return f"{base}<sub>{html.escape(s)}</sub>"
    return f"{base}_{s}" if len(s) == 1 or "," not in s else f"{base}_{{{s}}}"


def term(name: str, letters: str, dims, unreduced=(), fmt: str = "text", mesh_order=()) -> str:
    """A named value in the notation: ``name[letter_axes, ...]{U_axes}``.

    Args:
        name: the value's name ("A").
        letters: one letter per dim ("IJ").
        dims: per dim, the mesh axes splitting it (tuples; ``()`` for an unsplit dim).
        unreduced: mesh axes along which the value is a partial sum.
        fmt: "text", "latex" or "html".
        mesh_order: the mesh's axis order, for listing the unreduced axes.
    """
    if fmt not in FORMATS:
        raise ValueError(f"[notation] fmt={fmt!r}; use 'text', 'latex' or 'html'")
    s = f"{name}[{', '.join(sub(l.upper(), d, fmt) for l, d in zip(letters, dims))}]"
    if unreduced:
        u = tuple(a for a in mesh_order if a in unreduced) or tuple(sorted(unreduced))
        s += {"text": f"{{{sub('U', u, fmt)}}}", "latex": rf"\{{{sub('U', u, fmt)}\}}",
              "html": f"{{{sub('U', u, fmt)}}}"}[fmt]
    return s
