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
        # one large GEMM instead of many thin ones.
        out = gemm(a.reshape(-1, a.shape[-1]), b.reshape(b.shape[-2:]))
        return out.reshape(a.shape[:-1] + (b.shape[-1],))
    return gemm(a, b)


def _grouped(x: np.ndarray, term: str, groups: tuple, size: dict) -> np.ndarray:
    """`x` as a 3-D array whose dims are the products of `groups` (lists of letters of
    `term`). When each group's letters sit together and in order in `term`, the groups are
    merged first and then transposed: a strided view the GEMM packs in place, where
    transposing first would make reshape copy (a weight gradient's x^T, for one)."""
    dims = tuple(math.prod(size[c] for c in g) for g in groups)
    spans = [[term.index(c) for c in g] for g in groups]
    if all(p == list(range(p[0], p[0] + len(p))) for p in spans if p):
        present = sorted((p[0], i) for i, p in enumerate(spans) if p)
        merged = x.reshape([dims[i] for _, i in present])
        order = [i for _, i in present]
        return merged.transpose([order.index(i) for i in sorted(order)]).reshape(dims)
    return x.transpose([term.index(c) for g in groups for c in g]).reshape(dims)


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
    if batch + fa + fb != list(out) and batch + fb + fa == list(out):
        # b's free letters come first in the output: computing b·a gives it in order,
        # contiguous, where a·b would need a transposed (strided) view.
        (ta, tb), (a, b), (fa, fb) = (tb, ta), (b, a), (fb, fa)
    contract = [c for c in ta if c in tb and c not in out]
    size = {c: s for t, x in ((ta, a), (tb, b)) for c, s in zip(t, x.shape)}
    nb = math.prod(size[c] for c in batch)
    m = math.prod(size[c] for c in fa)
    n = math.prod(size[c] for c in fb)
    kk = math.prod(size[c] for c in contract)
    a3 = _grouped(a, ta, (batch, fa, contract), size)
    b3 = _grouped(b, tb, (batch, contract, fb), size)
    c3 = gemm_batched(a3, b3)
    order = batch + fa + fb
    c = c3.reshape(tuple(size[x] for x in order))
    return c.transpose([order.index(x) for x in out])
