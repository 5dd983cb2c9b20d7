"""Shape helpers shared by the primitives' rules (pure functions of shapes, no data).

Example:
    >>> import numpy as np
    >>> from shardlab._src.primitives.shapes import align_shape
    >>> align_shape((4, 1, 3), 1, 3)        # mesh dims (4,), local (1, 3) padded to rank 3
    (4, 1, 1, 3)
"""

from __future__ import annotations

import numpy as np


def local_rank(a, k: int) -> int:
    """Local rank of a storage (or -1 for a Python scalar, which broadcasts anywhere)."""
    return len(a.shape) - k if hasattr(a, "shape") and not isinstance(a, np.generic) else -1


def align_shape(shape: tuple, k: int, r: int) -> tuple:
    """`shape` (mesh dims + local) with local dims left-padded with 1s to rank `r`."""
    return shape[:k] + (1,) * (r - (len(shape) - k)) + shape[k:]


def align(storages, k: int) -> list:
    """Storages reshaped (views) so local dims line up right-aligned and mesh dims lead."""
    rank, mixed = -1, False
    for s in storages:
        if type(s) is np.ndarray:
            n = s.ndim
        elif hasattr(s, "shape") and not isinstance(s, np.generic):
            n = len(s.shape)
        else:
            continue  # a scalar broadcasts anywhere
        if rank < 0:
            rank = n
        elif n != rank:
            mixed = True
    if not mixed:
        return list(storages)  # already aligned: one rank (or scalars), the common case
    r = max((local_rank(s, k) for s in storages), default=0)
    out = []
    for s in storages:
        rank = local_rank(s, k)
        if rank >= 0 and rank < r:
            s = s.reshape(align_shape(tuple(s.shape), k, r))
        out.append(s)
    return out


def broadcast_avals(avals, k: int) -> tuple:
    """The broadcast storage shape of aligned operands (scalars broadcast anywhere)."""
    r = max((local_rank(a, k) for a in avals), default=0)
    shapes = [align_shape(tuple(a.shape), k, r) for a in avals if local_rank(a, k) >= 0]
    if not shapes:
        return ()
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        locals_ = [s[k:] for s in shapes]
        raise ValueError(f"operands could not be broadcast together with local shapes "
                         f"{' '.join(str(s) for s in locals_)}") from None
