"""Colours: a perceptual palette for blocks, a heat ramp for traffic, WCAG contrast for text.

The block palette is spaced in OKLCH (perceptually even lightness and hue): hues step by the
golden angle so neighbours differ strongly, lightness cycles over three levels, and every colour
is clipped into sRGB by lowering its chroma. Text on a colour is black or white, whichever has
the larger WCAG contrast ratio (always >= 4.5).

Example:
    >>> from shardlab.viz import colors
    >>> p = colors.palette(64)
    >>> len(set(p)) == 64
    True
    >>> all(colors.contrast(colors.text_color(c), c) >= 4.5 for c in p)
    True
"""

from __future__ import annotations

import math

__all__ = ["palette", "text_color", "contrast", "luminance", "heat", "oklch_to_hex", "NEUTRAL", "PARTIAL"]

NEUTRAL = "#d9d9d9"   # an empty slot / a device that holds nothing of the array
PARTIAL = "#8c8c8c"   # a reduced (summed) value: no single device's colour

_GOLDEN = 137.50776405003785
_LEVELS = (0.72, 0.58, 0.84)


def _oklab_to_linear_srgb(L: float, a: float, b: float) -> tuple[float, float, float]:
    l_ = L + 0.3963377774 * a + 0.2158037573 * b
    m_ = L - 0.1055613458 * a - 0.0638541728 * b
    s_ = L - 0.0894841775 * a - 1.2914855480 * b
    l, m, s = l_ ** 3, m_ ** 3, s_ ** 3
    return (4.0767416621 * l - 3.3077115913 * m + 0.2309699292 * s,
            -1.2684380046 * l + 2.6097574011 * m - 0.3413193965 * s,
            -0.0041960863 * l - 0.7034186147 * m + 1.7076147010 * s)


def _encode(c: float) -> int:
    c = min(1.0, max(0.0, c))
    v = 12.92 * c if c <= 0.0031308 else 1.055 * c ** (1 / 2.4) - 0.055
    return round(255 * v)


def oklch_to_hex(L: float, C: float, h: float) -> str:
    """An OKLCH colour (L in [0, 1], chroma, hue in degrees) as ``#rrggbb``, chroma lowered
    until it fits in sRGB.

    Example:
        >>> oklch_to_hex(1.0, 0.0, 0.0)
        '#ffffff'
    """
    while True:
        rad = math.radians(h)
        rgb = _oklab_to_linear_srgb(L, C * math.cos(rad), C * math.sin(rad))
        if all(-1e-4 <= x <= 1 + 1e-4 for x in rgb) or C <= 0:
            return "#" + "".join(f"{_encode(x):02x}" for x in rgb)
        C = max(0.0, C - 0.005)


def palette(n: int) -> list[str]:
    """``n`` distinct colours, neighbours in the list far apart in hue and lightness.

    Example:
        >>> palette(3)
        ['#dd766f', '#0b835a', '#c9adfd']
    """
    if n < 0:
        raise ValueError(f"[palette] n={n} must be >= 0")
    out: list[str] = []
    seen: set[str] = set()
    i = 0
    while len(out) < n:
        h = (25.0 + i * _GOLDEN) % 360.0
        L = _LEVELS[i % len(_LEVELS)] + 0.04 * ((i // 12) % 3 - 1)
        c = oklch_to_hex(L, 0.13, h)
        if c not in seen:  # rounding can make two far-apart hues meet at low chroma
            seen.add(c)
            out.append(c)
        i += 1
    return out


def _channels(color: str) -> tuple[float, float, float]:
    c = color.lstrip("#")
    if len(c) == 3:
        c = "".join(ch * 2 for ch in c)
    if len(c) != 6:
        raise ValueError(f"[colors] expected a colour like '#1f77b4', got {color!r}")
    return tuple(int(c[i:i + 2], 16) / 255 for i in (0, 2, 4))  # type: ignore[return-value]


def luminance(color: str) -> float:
    """WCAG relative luminance of ``#rrggbb`` (0 black, 1 white)."""
    def lin(v: float) -> float:
        return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4

    r, g, b = (lin(v) for v in _channels(color))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(fg: str, bg: str) -> float:
    """WCAG contrast ratio between two colours (1 to 21; 4.5 is the floor for body text).

    Example:
        >>> round(contrast("#000000", "#ffffff"), 1)
        21.0
    """
    a, b = sorted((luminance(fg), luminance(bg)), reverse=True)
    return (a + 0.05) / (b + 0.05)


def text_color(bg: str) -> str:
    """Black or white, whichever reads better on ``bg``.

    Example:
        >>> text_color("#ffeb3b"), text_color("#1a237e")
        ('#000000', '#ffffff')
    """
    return "#000000" if contrast("#000000", bg) >= contrast("#ffffff", bg) else "#ffffff"


# A sequential ramp (light yellow -> dark purple), even steps of OKLCH lightness.
_HEAT = [oklch_to_hex(0.97 - 0.67 * t, 0.06 + 0.12 * math.sin(math.pi * t), 100 - 250 * t)
         for t in (i / 8 for i in range(9))]


def heat(t: float) -> str:
    """The heat-map colour of ``t`` in [0, 1] (0: idle link, 1: the busiest).

    Example:
        >>> heat(0.0) != heat(1.0)
        True
    """
    if not t > 0:
        return _HEAT[0]
    t = min(1.0, float(t)) * (len(_HEAT) - 1)
    i = min(int(t), len(_HEAT) - 2)
    f = t - i
    a, b = _channels(_HEAT[i]), _channels(_HEAT[i + 1])
    return "#" + "".join(f"{round(255 * (x + (y - x) * f)):02x}" for x, y in zip(a, b))
