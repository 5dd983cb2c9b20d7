"""Closed forms of one decode step's collectives under each layout of
:mod:`shardlab.serve.layouts`, in the book's letters, and the same sums read off a ledger: the
tests compare the two, and ``serve.estimate`` prices the closed forms. What a device sends for
each collective is ``shardlab.cost.formulas.collective_bytes``'s (the ledger's own formula).

Example:
    >>> from shardlab.models import ModelConfig
    >>> from shardlab.serve.decode_bytes import comm_bytes
    >>> cfg = ModelConfig(num_layers=1, d_model=64, ffw_dim=128, num_heads=8, vocab_size=32)
    >>> comm_bytes(cfg, "megatron", {"x": 8}, batch=2)[("psum", ("x",))]
    {'calls': 2, 'group_size': 8, 'bytes_each': 512, 'bytes_in': 1024, 'bytes_sent': 1792.0}
"""

from __future__ import annotations

import math

from shardlab.cost import formulas
from shardlab.models import ModelConfig
from shardlab.models.expert_parallel import alltoall_bytes

from .layouts import STRATEGIES

__all__ = ["comm_bytes", "ledger_comm_bytes"]


def _sent(op: str, n: int, bytes_in: float) -> float:
    """Bytes one device sends for ``op`` over a group of ``n``, given what it puts in."""
    return formulas.collective_bytes(op, n, bytes_in)[2]


def comm_bytes(cfg: ModelConfig, strategy: str, mesh_shape: dict, batch: int, dtype_bytes: float = 4,
               tokens: int = 1) -> dict:
    """Closed forms of one decode step's collectives, per device, in the book's letters.

    Returns ``{(op, axes): {"calls", "bytes_each", "bytes_in", "bytes_sent"}}`` summed over the
    L layers (``bytes_in`` = what one device puts into the collective, ``bytes_sent`` = what it
    sends under the ring algorithm). With B' = batch x tokens:

    * megatron: 2 AllReduce of [B', D] per layer over the model axes (every mesh axis);
    * moe: 1 AllReduce of [B', D] per layer (attention; 2 in a dense layer), and per MoE layer
      2 AllToAll of the capacity slots E·C·D (``models.expert_parallel.alltoall_bytes`` with
      B/X sequences of ``tokens``) and 1 AllGather of [B'/X, D];
    * batch_kv: 2 AllToAll_Z of Q/O [B', N/(YZ), H] and 2 AllReduce_YZ of [B', D] per layer;
    * seq_kv: AllGather_X of Q [B', N/X, H], AllToAll_X of the packed partials
      [B', N, H + 2] (float32), 2 AllReduce_X of [B', D] per layer;
    * 2d: the AllReduce of attention over (x, yz), then the MLP's AllGather_YZ of
      [B', D/(XYZ)], (matrices - 1) AllReduce_X of [B', F/YZ], ReduceScatter_YZ of [B', D/X],
      and the AllGather over (x, yz) of [B', D/(XYZ)] that gives back the replicated stream.
    """
    s = dict(mesh_shape)
    if strategy == "moe":
        return _moe_comm_bytes(cfg, s, batch, tokens, dtype_bytes)
    B, D, F, N, H, L = batch * tokens, cfg.d_model, cfg.ffw_dim, cfg.num_heads, cfg.head_dim, cfg.num_layers
    b = dtype_bytes
    rows = []  # (op, axes, group size, bytes in per call, calls per layer)
    if strategy == "megatron":
        axes = tuple(s)
        rows += [("psum", axes, math.prod(s.values()), B * D * b, 2)]
    elif strategy == "batch_kv":
        Y, Z = s["y"], s["z"]
        rows += [("all_to_all", ("z",), Z, B * N / (Y * Z) * H * b, 2), ("psum", ("y", "z"), Y * Z, B * D * b, 2)]
    elif strategy == "seq_kv":
        X = s["x"]
        rows += [("all_gather", ("x",), X, B * N / X * H * b, 1), ("all_to_all", ("x",), X, B * N * (H + 2) * 4, 1),
                 ("psum", ("x",), X, B * D * b, 2)]
    elif strategy == "2d":
        X, YZ = s["x"], s["yz"]
        rows += [("psum", ("x", "yz"), X * YZ, B * D * b, 1), ("all_gather", ("yz",), YZ, B * D / (X * YZ) * b, 1),
                 ("psum", ("x",), X, B * F / YZ * b, cfg.mlp_matrices - 1),
                 ("psum_scatter", ("yz",), YZ, B * D / X * b, 1),
                 ("all_gather", ("x", "yz"), X * YZ, B * D / (X * YZ) * b, 1)]
    else:
        raise ValueError(f"[comm_bytes] unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    out = {}
    for op, axes, n, each, calls in rows:   # each: the bytes one device puts into one call
        out[(op, axes)] = {"calls": L * calls, "group_size": n, "bytes_each": each, "bytes_in": L * calls * each,
                           "bytes_sent": L * calls * _sent(op, n, each)}
    return out


def _moe_comm_bytes(cfg: ModelConfig, s: dict, batch: int, tokens: int, b: float) -> dict:
    """moe: per layer the attention's AllReduce of [B', D] (and a dense layer's MLP one); per
    MoE layer 2 AllToAll of the slot grid E·C·D (C = B/X · capacity(tokens)) and the
    AllGather of [B/X, tokens, D]."""
    axes, n = tuple(s), math.prod(s.values())
    L, L_moe, D = cfg.num_layers, cfg.num_moe_layers, cfg.d_model
    a2a = alltoall_bytes(cfg, batch / n, tokens, n, b)
    rows = [("psum", n, batch * tokens * D * b, L + (L - L_moe)), ("all_to_all", n, a2a["bytes_in"], 2 * L_moe),
            ("all_gather", n, batch / n * tokens * D * b, L_moe)]
    return {(op, axes): {"calls": calls, "group_size": n, "bytes_each": each, "bytes_in": calls * each,
                         "bytes_sent": calls * _sent(op, n, each)} for op, n, each, calls in rows if calls}


def ledger_comm_bytes(ledger) -> dict:
    """``{(op, axes): {"calls", "bytes_in", "bytes_sent"}}`` summed over a ledger's collectives."""
    out: dict = {}
    for e in ledger.events:
        if e.get("flops") or not e["axes"]:
            continue
        key = (e["op"], tuple(e["axes"]))
        d = out.setdefault(key, {"calls": 0, "bytes_in": 0.0, "bytes_sent": 0.0})
        d["calls"] += 1
        d["bytes_in"] += e["bytes_in"]
        d["bytes_sent"] += e["bytes_sent"]
    return out
