"""The one formatter for bytes, FLOPs, times and rates, used by every view.

Three significant digits, a unit chosen so the number sits in [1, 1000) (bytes: [1, 1024)),
never a "0.00" and never an exponent ("e+14"): a tiny value takes a smaller unit (ps for times
below a nanosecond). Memory is in binary prefixes everywhere (KiB = 1024 B, MiB, GiB, as memory
is sized); rates use decimal (SI) ones (GB/s, TFLOP/s, tokens/s, as data sheets quote them).
FLOP is spelled one way: ``FLOP`` for a count, ``FLOP/s`` for a rate, ``FLOP/B`` for intensity;
times are s, ms, µs, ns.

Example:
    >>> from shardlab import units
    >>> units.fmt_bytes(100663296), units.fmt_bytes(768), units.fmt_bytes(1536)
    ('96.0 MiB', '768 B', '1.50 KiB')
    >>> units.fmt_seconds(6.497e-07), units.fmt_seconds(3e-9), units.fmt_seconds(4e-12)
    ('650 ns', '3.00 ns', '4.00 ps')
    >>> units.fmt_flops(2.5e12), units.fmt_flop_rate(1.97e14), units.fmt_bandwidth(4.5e10)
    ('2.50 TFLOP', '197 TFLOP/s', '45.0 GB/s')
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["fmt_bytes", "fmt_seconds", "fmt_flops", "fmt_bandwidth", "fmt_flop_rate", "fmt_count",
           "fmt_params", "fmt_percent", "fmt_quantity", "plural", "sig3", "MISSING"]

MISSING = "-"
"""What every formatter prints for None or NaN (a quantity the model could not give)."""

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_TIME_UNITS = ((1e-15, "fs"), (1e-12, "ps"), (1e-9, "ns"), (1e-6, "µs"), (1e-3, "ms"), (1.0, "s"))
_FLOP_UNITS = ("FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP")
_DECIMAL = ("", "k", "M", "G", "T", "P", "E")


def sig3(x: float) -> str:
    """``x`` with three significant digits and no exponent, for 0.01 <= |x| < 1000.

    Example:
        >>> sig3(1.0), sig3(12.345), sig3(999.6)
        ('1.00', '12.3', '1000')
    """
    a = abs(x)
    if a >= 99.95:
        return f"{x:.0f}"
    if a >= 9.995:
        return f"{x:.1f}"
    return f"{x:.2f}"


def _small(v: float) -> str:
    """Three significant digits of a number below 0.01 without an exponent (0.000123)."""
    return np.format_float_positional(v, precision=3, unique=True, fractional=False, trim="-")


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _check(op: str, x) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise TypeError(f"[{op}] expected a number, got {x!r}") from None
    return v


def _scaled(v: float, base: float, names) -> str:
    """Picks the prefix so the 3-digit mantissa is in [1, base); rounding up moves a unit."""
    if v == 0:
        return f"0 {names[0]}"
    sign = "-" if v < 0 else ""
    v = abs(v)
    i = 0
    while i < len(names) - 1 and v >= base:
        v /= base
        i += 1
    text = sig3(v)
    if float(text) >= base and i < len(names) - 1:  # 1023.7 B -> "1.00 KiB", not "1024 B"
        v /= base
        i += 1
        text = sig3(v)
    return f"{sign}{text} {names[i]}"


def fmt_bytes(n) -> str:
    """Bytes with binary prefixes; whole byte counts below 1 KiB print exactly.

    Example:
        >>> fmt_bytes(0), fmt_bytes(16), fmt_bytes(1023.9), fmt_bytes(3 * 2**30), fmt_bytes(None)
        ('0 B', '16 B', '1.00 KiB', '3.00 GiB', '-')
    """
    if _missing(n):
        return MISSING
    v = _check("fmt_bytes", n)
    if abs(v) < 1023.5 and v == int(v):
        return f"{int(v)} B"
    if abs(v) < 1:
        return f"{_small(v) if abs(v) < 0.01 else sig3(v)} B"
    return _scaled(v, 1024.0, _BYTE_UNITS)


def fmt_seconds(s) -> str:
    """A time in fs, ps, ns, µs, ms or s (min and h past an hour's worth of seconds).

    Example:
        >>> fmt_seconds(0), fmt_seconds(1.2345e-5), fmt_seconds(0.0009999), fmt_seconds(5400)
        ('0 s', '12.3 µs', '1.00 ms', '1.50 h')
    """
    if _missing(s):
        return MISSING
    v = _check("fmt_seconds", s)
    if v == 0:
        return "0 s"
    sign = "-" if v < 0 else ""
    a = abs(v)
    if a >= 3600:
        return f"{sign}{sig3(a / 3600)} h"
    if a >= 99.95:
        return f"{sign}{sig3(a / 60)} min"
    for scale, name in reversed(_TIME_UNITS):
        if a >= scale * 0.9995 or scale == 1e-15:
            m = a / scale
            if m < 0.9995:  # below a femtosecond: no exponent, no "0.00"
                return f"{sign}< 1 fs" if not sign else "> -1 fs"
            return f"{sign}{sig3(m)} {name}"
    raise AssertionError("unreachable")


def fmt_flops(n) -> str:
    """A FLOP count with decimal prefixes (kFLOP ... EFLOP).

    Example:
        >>> fmt_flops(512), fmt_flops(2 * 4096**3)
        ('512 FLOP', '137 GFLOP')
    """
    if _missing(n):
        return MISSING
    v = _check("fmt_flops", n)
    if abs(v) < 999.5 and v == int(v):
        return f"{int(v)} FLOP"
    return _scaled(v, 1000.0, _FLOP_UNITS)


def fmt_bandwidth(bytes_per_second) -> str:
    """Bytes per second with decimal prefixes (GB/s), as data sheets quote links.

    Example:
        >>> fmt_bandwidth(8.19e11)
        '819 GB/s'
    """
    if _missing(bytes_per_second):
        return MISSING
    v = _check("fmt_bandwidth", bytes_per_second)
    return _scaled(v, 1000.0, tuple(p + "B/s" for p in _DECIMAL))


def fmt_flop_rate(flops_per_second) -> str:
    """FLOP/s with decimal prefixes (TFLOP/s).

    Example:
        >>> fmt_flop_rate(9.89e14)
        '989 TFLOP/s'
    """
    if _missing(flops_per_second):
        return MISSING
    v = _check("fmt_flop_rate", flops_per_second)
    return _scaled(v, 1000.0, tuple(p + "FLOP/s" for p in _DECIMAL))


def fmt_count(n, unit: str = "") -> str:
    """A plain count (devices, tokens, FLOP per byte): a whole number below a million exactly
    (``4,096``), anything else with 3 significant digits and k/M/G/T.

    Example:
        >>> fmt_count(7), fmt_count(240.5, "FLOP/B"), fmt_count(4096), fmt_count(1234567), fmt_count(1140.6)
        ('7', '240 FLOP/B', '4,096', '1.23M', '1.14k')
    """
    if _missing(n):
        return MISSING
    v = _check("fmt_count", n)
    if math.isinf(v):
        return "∞" + (f" {unit}" if unit else "")
    if abs(v) < 1e6 and v == int(v):
        text = f"{int(v):,}"
    elif abs(v) < 999.5:
        text = sig3(v) if abs(v) >= 0.01 else _small(v)
    else:
        text = _scaled(v, 1000.0, _DECIMAL).replace(" ", "")
    return f"{text} {unit}" if unit else text


def fmt_params(n) -> str:
    """A parameter count as model sizes are named: exact below 1000, else k, M, B (billion), T.

    The one place "B" means billion, not bytes; it is always followed by "params".

    Example:
        >>> fmt_params(124_439_808), fmt_params(8.03e9), fmt_params(512)
        ('124M params', '8.03B params', '512 params')
    """
    if _missing(n):
        return MISSING
    v = _check("fmt_params", n)
    if abs(v) < 999.5 and v == int(v):
        return f"{int(v)} params"
    return _scaled(v, 1000.0, ("", "k", "M", "B", "T", "P")).replace(" ", "") + " params"


def fmt_percent(fraction, digits: int = 1) -> str:
    """A fraction (0.5) as a percentage ("50.0%").

    Example:
        >>> fmt_percent(0.4567), fmt_percent(1), fmt_percent(None)
        ('45.7%', '100.0%', '-')
    """
    if _missing(fraction):
        return MISSING
    return f"{100.0 * _check('fmt_percent', fraction):.{digits}f}%"


def plural(n, word: str, many: str | None = None) -> str:
    """``n`` and the word, plural unless n is 1: "1 event", "3 events".

    Example:
        >>> plural(1, "event"), plural(356, "event"), plural(2, "batch", "batches")
        ('1 event', '356 events', '2 batches')
    """
    return f"{fmt_count(n)} {word if n == 1 else (many or word + 's')}"


_KINDS = {"bytes": fmt_bytes, "seconds": fmt_seconds, "flops": fmt_flops, "bandwidth": fmt_bandwidth,
          "flop_rate": fmt_flop_rate, "count": fmt_count, "params": fmt_params, "percent": fmt_percent}
# Other spellings of the kinds (unit symbols callers already use).
_ALIASES = {"B": "bytes", "s": "seconds", "FLOP": "flops", "B/s": "bandwidth", "FLOP/s": "flop_rate",
            "": "count", "%": "percent", "fraction": "percent"}


def fmt_quantity(value, kind: str) -> str:
    """Formats ``value`` as ``kind``: bytes, seconds, flops, bandwidth, flop_rate, count, params
    or percent (or their symbols B, s, FLOP, B/s, FLOP/s, %).

    Example:
        >>> fmt_quantity(2048, "bytes"), fmt_quantity(3e-6, "s"), fmt_quantity(0.25, "%")
        ('2.00 KiB', '3.00 µs', '25.0%')
    """
    try:
        return _KINDS[_ALIASES.get(kind, kind)](value)
    except KeyError:
        raise ValueError(f"[fmt_quantity] unknown kind {kind!r}; use one of {', '.join(_KINDS)}") from None
