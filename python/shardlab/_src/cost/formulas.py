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


def layer_elementwise_bytes(d_model: int, ffw_dim: int, q_heads: int, kv_heads: int, head_dim: int, *,
                            tp: int = 1, sequence_parallel: bool = False, gated: bool = True,
                            rotary: bool = True, biases: bool = False, dropout: bool = False,
                            attention: str = "flash", seq: int = 0, act_bytes: int = 2,
                            eager: bool = False, eager_norm: bool | None = None) -> float:
    """HBM bytes the memory-bound kernels of one transformer layer move per token in the forward
    pass, on one of ``tp`` tensor-parallel devices (each kernel reads its inputs and writes its
    output once, as a fused kernel does):

    * two norms, each reading and writing the ``D`` residual stream (split ``tp`` ways only
      under sequence parallelism);
    * two residual adds (read two, write one; with bias and dropout fused, plus a 1-byte mask);
    * the activation: GeLU reads and writes ``F/tp``; a gated unit (SwiGLU) reads ``2F/tp``;
    * rotary on the queries and keys (read and write);
    * unfused attention (``attention="unfused"``, Megatron 2021): the ``s`` scores per head of
      ``heads/tp`` heads written by QK^T, read and written by the fused scale-mask-softmax,
      read and written by dropout (+ a 1-byte mask), read by the PV matmul: 13 bytes a score.
      FlashAttention keeps scores on chip (0 bytes).

    ``eager=True`` counts the kernels eager PyTorch runs where a compiler would fuse (torchtitan
    without ``torch.compile``): the gated unit as ``silu(a)`` and ``* b`` (read 3F, write 2F
    instead of read 2F, write F) and rotary in fp32 complex numbers (``x.float()``, the complex
    product, ``type_as``: 20 bytes per bf16 element instead of 4); ``eager_norm`` (default
    ``eager``) the norms as torchtitan's eager ``RMSNorm`` (``x.float()``, ``pow``, ``mean``,
    ``* rsqrt``, ``type_as``, ``* weight``: 36 bytes per bf16 element instead of 4).

    The backward pass moves about twice these bytes (:data:`BACKWARD_ELEMENTWISE`).

    Example:
        >>> layer_elementwise_bytes(4096, 11008, 32, 32, 128)   # LLaMA-2 7B, bf16, one device
        180736.0
    """
    a = float(act_bytes)
    sp = tp if sequence_parallel else 1
    resid = d_model / sp
    eager_norm = eager if eager_norm is None else eager_norm
    b = 2 * (a + 4 + 8 + 4 + 8 + 4 + a + 2 * a if eager_norm else 2 * a) * resid   # two norms
    b += 2 * (3 * resid * a + (resid if dropout else 0))      # two residual adds (+ dropout mask)
    act = (5 if eager else 3) if gated else 2
    b += act * ffw_dim / tp * a + (ffw_dim / tp * a if biases else 0)
    if rotary:
        b += (a + 4 + 4 + 4 + 4 + a if eager else 2 * a) * (q_heads + kv_heads) * head_dim / tp
    if attention == "unfused":
        b += 13 * seq * q_heads / tp
    elif attention != "flash":
        raise ValueError(f"[layer_elementwise_bytes] attention={attention!r}: use 'flash' or 'unfused'")
    return float(b)


#: Memory-bound bytes of a layer's backward pass per forward byte (read the saved input and the
#: incoming gradient, write the outgoing gradient).
BACKWARD_ELEMENTWISE = 2.0


def loss_bytes(vocab: int, *, tp: int = 1, act_bytes: int = 2, eager: bool = False) -> float:
    """HBM bytes per token of the softmax cross-entropy and its gradient over ``vocab/tp`` logits:
    read the logits, write and read fp32 log-probabilities, write the gradient. ``eager=True``:
    the logits cast to fp32 first (``output(h).float()``, torchtitan) and every step a kernel of
    its own: cast (read 2, write 4), log-softmax (read 4, write 4), its gradient (read 8, write 4),
    the cast's gradient (read 4, write 2)."""
    if eager:
        return float(vocab / tp * (act_bytes + 4 + 8 + 12 + 4 + act_bytes))
    return float(vocab / tp * (2 * act_bytes + 8))


def optimizer_bytes(params: float, grads: float, state: float) -> float:
    """HBM bytes of one optimizer step on one device holding ``params``, ``grads`` and
    ``state`` (master copy and moments) bytes: gradient clipping reads the gradients for their
    norm, the update reads the gradients and the state, writes the state and the parameters."""
    return float(2 * grads + 2 * state + 2 * params)
