"""einsum over local letters: the one contraction primitive (matmul and dot lower to it).

The impl keeps the mesh dims as batch letters, so every device's block is contracted in one
batched GEMM (shardlab's kernel for float32 and bfloat16). The ledger event counts
2 × the product of every letter's size FLOPs per device and the bytes one device reads and
writes.

Example:
    >>> from shardlab._src.primitives.contractions import EINSUM
    >>> EINSUM.name
    'einsum'
"""

from __future__ import annotations

import math

import numpy as np

from ..core.context import wanted
from ..core.dtypes import bfloat16, float32, float64, int8, int32
from ..ledger.event import Event, dtype_name
from .broadcasting import BROADCAST
from .elementwise import CONVERT
from .primitive import Primitive, bind
from .structural import RESHAPE

_EVENT_DTYPES = (float32, float64, bfloat16, int32, int8)


def letter_sizes(terms, avals, k: int) -> dict:
    sizes: dict = {}
    for t, a in zip(terms, avals):
        for c, s in zip(t, a.shape[k:]):
            if sizes.setdefault(c, s) != s:
                raise ValueError(f"[einsum] letter {c!r} has sizes {sizes[c]} and {s}")
    return sizes


def _shape(avals, mesh, *, terms, out, op_name="einsum", preferred_element_type=None):
    k = mesh.ndim
    sizes = letter_sizes(terms, avals, k)
    dims = tuple(np.broadcast_shapes(*(tuple(a.shape[:k]) for a in avals)))
    dt = np.result_type(*[a.dtype for a in avals]) if preferred_element_type is None \
        else np.dtype(preferred_element_type)
    return [(dims + tuple(sizes[c] for c in out), dt)]


def compute_event(op: str, mesh, flops: float, nbytes: float, dtype) -> Event:
    dt = np.dtype(dtype)
    return Event(op, group_size=1, num_groups=mesh.size, dtype=dtype_name(dt) if dt in _EVENT_DTYPES else "float32",
                 flops=flops, hbm_bytes=nbytes, algorithm="local")


def _cost(ins, outs, mesh, *, terms, out, op_name="einsum", preferred_element_type=None):
    k = mesh.ndim
    sizes = letter_sizes(terms, ins, k)
    flops = 2.0 * math.prod(sizes.values())
    nbytes = sum(math.prod(a.shape[k:]) * a.dtype.itemsize for a in ins) + \
        math.prod(outs[0].shape[k:]) * outs[0].dtype.itemsize
    return compute_event(op_name, mesh, flops, nbytes, outs[0].dtype)


def _vjp(cts, ins, outs, mesh, *, terms, out, op_name="einsum", preferred_element_type=None):
    ct = cts[0]
    grads = []
    for i, (t, x) in enumerate(zip(terms, ins)):
        if (x.dtype.kind not in "fc" and x.dtype != bfloat16) or not wanted(x):
            grads.append(None)
            continue
        if len(set(t)) != len(t):
            raise NotImplementedError(f"[grad] einsum term {t!r} repeats a letter (a diagonal); "
                                      f"its gradient is not supported")
        others = [ins[j] for j in range(len(ins)) if j != i]
        other_terms = [terms[j] for j in range(len(ins)) if j != i]
        have = set(out).union(*other_terms)
        kept = "".join(c for c in t if c in have)
        g = bind(EINSUM, [ct, *others], mesh, terms=(out, *other_terms), out=kept, op_name=op_name)
        if kept != t:  # letters summed away in the forward come back by broadcasting
            g = bind(RESHAPE, [g], mesh, local_shape=tuple(s if c in kept else 1 for c, s in zip(t, x.shape)))
            g = bind(BROADCAST, [g], mesh, local_shape=x.shape)
        if g.dtype != x.dtype:
            g = bind(CONVERT, [g], mesh, dtype=x.dtype)
        grads.append(g)
    return grads


EINSUM = Primitive("einsum", shape_rule=_shape, cost=_cost, vjp=_vjp)
