"""einsum on plain arrays, lowered to shardlab's batched GEMM where it can be.

A two-operand contraction without repeated letters becomes one batched GEMM (transpose,
reshape, gemm, reshape, transpose); anything else is numpy's einsum.

Example:
    >>> import numpy as np
    >>> from shardlab._src.kernels.einsum import einsum_arrays
    >>> float(einsum_arrays(["ij", "jk"], "ik", [np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)]).sum())
    24.0
"""

from __future__ import annotations

import math

import numpy as np

from ..core.dtypes import bfloat16, float32
from .gemm import gemm


def gemm_batched(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Batched a @ b (numpy batch broadcasting) with shardlab's GEMM for float32/bfloat16."""
    dt = np.result_type(a.dtype, b.dtype)
    if dt not in (float32, bfloat16):
        return np.matmul(a, b)
    a, b = a.astype(dt, copy=False), b.astype(dt, copy=False)
    if a.ndim > 2 and b.ndim == a.ndim and math.prod(b.shape[:-2]) == 1:
        # b is the same for every batch (a replicated weight): fold a's batch dims into M,
        # one large GEMM instead of many thin ones -- when that needs no copy of a.
        folded = a.view()
        try:
            folded.shape = (-1, a.shape[-1])
        except AttributeError:
            return gemm(a, b)
        out = gemm(folded, b.reshape(b.shape[-2:]))
        return out.reshape(a.shape[:-1] + (b.shape[-1],))
    return gemm(a, b)


def _operand_view(x: np.ndarray, term: str, batch: list, g1: list, g2: list, size: dict) -> np.ndarray:
    """`x` as ``[*batch, prod(g1), prod(g2)]`` with a size-1 dim for each batch letter `x`
    lacks (the GEMM broadcasts it). Batch dims stay separate and strided, so only merging the
    letters of g1 or of g2 can force numpy's reshape to copy."""
    have = [c for c in batch if c in term]
    y = x.transpose([term.index(c) for c in have + g1 + g2])
    shape = [size[c] if c in term else 1 for c in batch]
    return y.reshape(shape + [math.prod(size[c] for c in g1), math.prod(size[c] for c in g2)])


def _unmerged_prefix(x: np.ndarray, term: str, group: list) -> list:
    """The letters of `group` before its longest tail that one stride can address (each tail
    letter's stride is the next one's times that one's size; size-1 letters fit anywhere)."""
    tail, inner = len(group), None  # inner: (stride, size) of the letter after the current one
    for i in range(len(group) - 1, -1, -1):
        ax = term.index(group[i])
        n, st = x.shape[ax], x.strides[ax]
        if n != 1:
            if inner is not None and st != inner[0] * inner[1]:
                break
            inner = (st, n)
        tail = i
    return group[:tail]


def einsum_arrays(terms: list[str], out: str, arrays: list) -> np.ndarray:
    """einsum over plain arrays with explicit terms and output."""
    if len(arrays) != 2 or any(len(set(t)) != len(t) for t in terms) or len(set(out)) != len(out):
        return np.einsum(",".join(terms) + "->" + out, *arrays, optimize=True)
    (ta, tb), (a, b) = terms, arrays
    # letters in one operand only and not in the output are summed away first
    only_a = [c for c in ta if c not in tb and c not in out]
    only_b = [c for c in tb if c not in ta and c not in out]
    if only_a:
        a = a.sum(axis=tuple(ta.index(c) for c in only_a))
        ta = "".join(c for c in ta if c not in only_a)
    if only_b:
        b = b.sum(axis=tuple(tb.index(c) for c in only_b))
        tb = "".join(c for c in tb if c not in only_b)
    batch = [c for c in ta if c in tb and c in out]
    fa = [c for c in ta if c not in tb]
    fb = [c for c in tb if c not in ta]
    contract = [c for c in ta if c in tb and c not in out]
    size = {c: s for t, x in ((ta, a), (tb, b)) for c, s in zip(t, x.shape)}
    # A free letter in front of a batch letter of its operand (a mesh dim the other operand
    # is invariant along) would split its M or N group and force a copy: it becomes a batch
    # dim of its own, broadcast in the other operand.
    lead = [c for t, free in ((ta, fa), (tb, fb)) for c in free
            if any(t.index(c) < t.index(x) for x in batch)]
    # Likewise the leading letters of a free group whose strides do not chain (a weight
    # gradient's mesh letter apart from its feature letter): merged, they would cost a copy of
    # the operand; as batch dims the GEMM reads them in place.
    lead += [c for x, t, free in ((a, ta, fa), (b, tb, fb))
             for c in _unmerged_prefix(x, t, [c for c in free if c not in lead]) if c not in lead]
    fa = [c for c in fa if c not in lead]
    fb = [c for c in fb if c not in lead]
    dims = batch + lead
    if dims + fa + fb != list(out) and dims + fb + fa == list(out):
        # b's free letters come first in the output: computing b·a gives it in order,
        # contiguous, where a·b would need a transposed (strided) view.
        (ta, tb), (a, b), (fa, fb) = (tb, ta), (b, a), (fb, fa)
    c = gemm_batched(_operand_view(a, ta, dims, fa, contract, size), _operand_view(b, tb, dims, contract, fb, size))
    order = dims + fa + fb
    c = c.reshape(tuple(size[x] for x in order))
    return c.transpose([order.index(x) for x in out])
