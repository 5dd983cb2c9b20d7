"""Byte and FLOP formulas: the single source the ledger, the planner and the what-if
functions count with.

Per-device bytes of a collective over a group of ``n`` devices, given the bytes one device
holds before it (``bytes_in``). ``V`` is the array the ring algorithm moves (the book's V:
the gathered array for AllGather, the reduced array for AllReduce / ReduceScatter).

Example:
    >>> from shardlab._src.cost.formulas import collective_bytes
    >>> collective_bytes("all_gather", 4, 1024)     # (bytes_out, V, bytes_sent)
    (4096.0, 4096.0, 3072.0)
    >>> collective_bytes("psum", 4, 1024)
    (1024.0, 1024.0, 1536.0)
"""

from __future__ import annotations

import math

import shardlab._core as _core

# The core's one table of collective ops: (JAX-style op name, the book's collective name).
OP_TABLE = tuple(_core.op_table())
COLLECTIVES = tuple(op for op, _ in OP_TABLE)
BOOK_NAMES = {op: book for op, book in OP_TABLE}
COMPUTE = ("matmul", "einsum", "attention", "attention_vjp", "elementwise", "reduction")


def ring_bytes_sent(op: str, n: int, v_bytes: float) -> float:
    """Bytes each device sends under the ring algorithm: (n-1)/n·V for AllGather,
    ReduceScatter and AllToAll, 2(n-1)/n·V for AllReduce, V for ppermute and rooted ops."""
    return float(_core.ring_bytes_sent(op, int(n), float(v_bytes)))


def collective_bytes(op: str, n: int, bytes_in: float, *, root_gets_all: bool = False) -> tuple[float, float, float]:
    """(bytes_out, V, bytes_sent) per device of collective `op` over `n` devices."""
    bytes_in = float(bytes_in)
    if op in ("all_gather", "gather"):
        out = bytes_in * n
        v = out
    elif op in ("psum_scatter", "scatter"):
        out, v = bytes_in / n, bytes_in
    else:
        out, v = bytes_in, bytes_in
    return out, v, ring_bytes_sent(op, n, v)


def group_bytes(op: str, n: int, bytes_in: float, bytes_out: float) -> float:
    """V of a ledger event, from its per-device bytes (what the time model takes)."""
    if op == "all_gather":
        return float(bytes_out)
    if op in ("all_to_all", "gather"):
        return float(bytes_in) * n
    if op == "scatter":
        return float(bytes_out) * n
    return float(bytes_in)


def matmul_flops(m: int, k: int, n: int, *, batch: int = 1) -> int:
    """2·batch·m·k·n: one multiply and one add per term."""
    return 2 * batch * m * k * n


def einsum_flops(sizes: dict) -> int:
    """2 × the product of every letter's size (each output element sums over the rest)."""
    return 2 * math.prod(sizes.values())


def attention_pairs(q_len: int, kv_len: int, causal: bool) -> int:
    """(query, key) pairs a kernel computes: all of them, or those causal masking keeps
    (query i sees keys j <= i, top-left aligned)."""
    if not causal:
        return q_len * kv_len
    full = min(q_len, kv_len)
    return full * (full + 1) // 2 + max(q_len - kv_len, 0) * kv_len


def attention_flops(batch: int, heads: int, head_dim: int, pairs: int, passes: int) -> int:
    """``passes`` FLOPs per (query, key, head_dim) pair: 4 forward (QK^T and PV), 10 more for
    the FlashAttention-2 backward (recomputed QK^T, dV, dP, dQ, dK)."""
    return passes * batch * heads * head_dim * pairs
