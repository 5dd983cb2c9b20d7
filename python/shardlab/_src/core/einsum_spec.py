"""The one einsum subscript parser: '...' expanded, the implicit output made explicit, every
letter's size checked. Used by jnp.einsum, the planner and the FLOP formulas.

Example:
    >>> from shardlab._src.core.einsum_spec import parse
    >>> parse("...ij,jk", [(2, 3, 4), (4, 5)])
    (['aij', 'jk'], 'aik')
"""

from __future__ import annotations

import string


def parse(subscripts: str, shapes, op: str = "einsum") -> tuple[list[str], str]:
    """Explicit terms (one per operand) and output for `subscripts` on operands of `shapes`."""
    if not isinstance(subscripts, str):
        raise TypeError(f"[{op}] subscripts must be a string, got {subscripts!r}")
    sub = subscripts.replace(" ", "")
    ins, arrow, out = sub.partition("->")
    terms = ins.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"[{op}] {subscripts!r} names {len(terms)} operands but {len(shapes)} were given")
    for t in terms + [out]:
        if t.count("...") > 1 or "." in t.replace("...", ""):
            raise ValueError(f"[{op}] malformed ellipsis in {t!r} of {subscripts!r}")
        bad = [c for c in t.replace("...", "") if not c.isalpha()]
        if bad:
            raise ValueError(f"[{op}] {subscripts!r}: {bad[0]!r} is not a letter; subscripts are letters and '...'")
    used = set(c for c in sub if c.isalpha())
    pool = [c for c in string.ascii_letters if c not in used]
    ell_rank = 0
    for t, s in zip(terms, shapes):
        if "..." in t:
            ell_rank = max(ell_rank, len(s) - (len(t) - 3))
    ell = "".join(pool[:ell_rank])
    expanded = []
    for t, s in zip(terms, shapes):
        if "..." in t:
            n = len(s) - (len(t) - 3)
            if n < 0:
                raise ValueError(f"[{op}] term {t!r} has more letters than its operand's rank {len(s)}")
            t = t.replace("...", ell[ell_rank - n:] if n else "")
        if len(t) != len(s):
            raise ValueError(f"[{op}] term {t!r} has {len(t)} letters for an operand of rank {len(s)} "
                             f"(shape {tuple(s)})")
        expanded.append(t)
    if arrow:
        if ell and "..." not in out:
            raise ValueError(f"[{op}] {subscripts!r}: the output must keep the '...' dims (as numpy)")
        out = out.replace("...", ell)
        missing = [c for c in out if not any(c in t for t in expanded)]
        if missing:
            raise ValueError(f"[{op}] output letter {missing[0]!r} of {subscripts!r} is in no operand")
        if len(set(out)) != len(out):
            raise ValueError(f"[{op}] output {out!r} of {subscripts!r} repeats a letter")
    else:
        counts: dict = {}
        for t in expanded:
            for c in t:
                counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c in counts if counts[c] == 1 and c not in ell))
    sizes: dict = {}
    for t, s in zip(expanded, shapes):
        for c, n in zip(t, s):
            if sizes.setdefault(c, n) != n:
                raise ValueError(f"[{op}] letter {c!r} has sizes {sizes[c]} and {n} in {subscripts!r}")
    return expanded, out


def free_letters(used: str, n: int) -> str:
    """`n` letters not in `used` (for mesh dims added to a contraction)."""
    pool = [c for c in string.ascii_letters if c not in used]
    return "".join(pool[:n])
