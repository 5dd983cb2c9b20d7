"""The mixture-of-experts MLP: a top-k softmax router and capacity-slot dispatch.

Each sequence of T tokens is one routing group. Expert e has ``C = cfg.expert_capacity(T)``
slots; tokens claim them in sequence order and a token beyond an expert's capacity is dropped
for that expert (GShard/Switch). Dispatch and combine are gathers (``take_along_axis``), not
one-hot matmuls, so the only matmuls are the router ``[D, E]``, the experts on ``[E, C]``
slots and the shared experts -- exactly what :func:`shardlab.models.flops_per_token` counts.

The pieces (:func:`route`, :func:`dispatch`, :func:`routed_experts`, :func:`combine`,
:func:`shared_experts`) are public so that :mod:`shardlab.models.expert_parallel` can put an
AllToAll between them and stay equal to :func:`moe_mlp`, drops included.

Example:
    >>> import numpy as np
    >>> from shardlab.models import ModelConfig, transformer
    >>> cfg = ModelConfig(num_layers=1, d_model=16, ffw_dim=32, num_heads=2, vocab_size=32,
    ...                   num_experts=4, top_k=2)
    >>> p = transformer.init_params(cfg, seed=0)
    >>> x = np.random.default_rng(0).standard_normal((2, 8, 16)).astype(np.float32)
    >>> moe_mlp(p["layers"][0]["moe"], x, cfg).shape
    (2, 8, 16)
    >>> y, dropped = moe_mlp(p["layers"][0]["moe"], x, cfg.replace(capacity_factor=0.5), return_dropped=True)
    >>> int(dropped) > 0
    True
"""

from __future__ import annotations

import dataclasses

import numpy as np

import shardlab.numpy as jnp

from .config import ModelConfig
from .ops import activation, cumsum, one_hot, softmax, top_k

__all__ = ["moe_mlp", "route", "route_logits", "dispatch", "routed_experts", "combine", "shared_experts",
           "Dispatch"]


def route_logits(logits, cfg: ModelConfig, router_bias=None):
    """The top-k choices and their gates (renormalised over k) from router logits [B, T, E].

    With a router bias (DeepSeek-V3) the bias shifts which experts are chosen, not the gates.
    Returns (indices list, gates list), k arrays of shape [B, T].
    """
    probs = softmax(logits.astype(np.float32), axis=-1)
    scores = probs + router_bias if router_bias is not None else probs
    _, idx = top_k(scores, cfg.top_k)
    gates = [jnp.take_along_axis(probs, jnp.expand_dims(i, -1), axis=-1)[..., 0] for i in idx]
    norm = gates[0]
    for g in gates[1:]:
        norm = norm + g
    return idx, [g / norm for g in gates]


def route(p: dict, x, cfg: ModelConfig):
    """Router: probabilities over E, the top-k choices and their gates (renormalised over k).

    Returns (indices list, gates list), k arrays of shape [B, T].
    """
    return route_logits(jnp.matmul(x, p["router"]), cfg, p.get("router_bias"))


@dataclasses.dataclass
class Dispatch:
    """Where each token went: per choice j, ``slots[j]`` [B, T] is the row of the flattened
    [E·C] slot grid holding it (E·C when it was dropped), with its gate ``gates[j]``.
    ``dropped`` counts the (token, choice) pairs past their expert's capacity (int32 scalar)."""

    slots: list
    gates: list
    dropped: object
    capacity: int


def _gather_rows(src, rows):
    """src [B, R, D] at rows [B, S] -> [B, S, D] (indices broadcast explicitly to D)."""
    B, S = rows.shape
    D = src.shape[-1]
    return jnp.take_along_axis(src, jnp.broadcast_to(jnp.expand_dims(rows, -1), (B, S, D)), axis=1)


def dispatch(x, idx: list, gates: list, cfg: ModelConfig):
    """Packs x [B, T, D] into capacity slots [B, E, C, D] (an empty slot is zeros).

    Returns (slots array, :class:`Dispatch`)."""
    B, T, D = x.shape
    E = cfg.num_experts
    C = cfg.expert_capacity(T)
    assign = one_hot(idx[0], E)
    for i in idx[1:]:
        assign = assign + one_hot(i, E)
    rank = cumsum(assign, axis=1)  # [B, T, E]: 1-based arrival order of each token at expert e
    # slot c of expert e holds the token whose rank is c + 1: the count of tokens ranked <= c
    slot_c = np.arange(C, dtype=np.int32)
    token_of_slot = jnp.sum(jnp.less_equal(jnp.expand_dims(rank, -1), slot_c).astype(np.int32), axis=1)
    x_pad = jnp.concatenate([x, jnp.zeros((B, 1, D), x.dtype)], axis=1)  # row T: an empty slot
    xe = jnp.reshape(_gather_rows(x_pad, jnp.reshape(token_of_slot, (B, E * C))), (B, E, C, D))
    slots, dropped = [], None
    for i in idx:
        pos = jnp.take_along_axis(rank, jnp.expand_dims(i, -1), axis=-1)[..., 0] - 1
        kept = pos < C
        slots.append(jnp.where(kept, i * C + pos, E * C))  # E * C: the zero row (dropped)
        d = jnp.sum(jnp.logical_not(kept).astype(np.int32))
        dropped = d if dropped is None else dropped + d
    return xe, Dispatch(slots, gates, dropped, C)


def _experts(p: dict, xe, cfg: ModelConfig, subs: tuple, bias):
    """The expert MLPs: routed on slots xe [B, E, C, D], shared on tokens [B, T, D] (then the
    hidden values are [B, T, S, F]); ``bias`` lays an [experts, F] bias over the hidden values."""
    sub_in, sub_out = subs
    if cfg.gated_mlp:
        g = jnp.einsum(sub_in, xe, p["w_gate"])
        u = jnp.einsum(sub_in, xe, p["w_up"])
        if "b_gate" in p:
            g, u = g + bias(p["b_gate"]), u + bias(p["b_up"])
        h = activation(cfg.activation, g) * u
    else:
        h = jnp.einsum(sub_in, xe, p["w_in"])
        if "b_in" in p:
            h = h + bias(p["b_in"])
        h = activation(cfg.activation, h)
    y = jnp.einsum(sub_out, h.astype(xe.dtype), p["w_down"])
    return y


def routed_experts(p: dict, xe, cfg: ModelConfig):
    """The routed experts of ``p`` (weights [E', D, F] ...) on their slots xe [G, E', C, D]."""
    ye = _experts(p, xe, cfg, ("becd,edf->becf", "becf,efd->becd"), lambda b: b[:, None, :])
    if "b_down" in p:
        ye = ye + p["b_down"][:, None, :]
    return ye


def combine(ye, plan: Dispatch, dtype=None):
    """Expert outputs ye [B, E, C, D] back to tokens [B, T, D], each choice weighted by its gate."""
    B, E, C, D = ye.shape
    ye_pad = jnp.concatenate([jnp.reshape(ye, (B, E * C, D)), jnp.zeros((B, 1, D), ye.dtype)], axis=1)
    out = None
    for slot, g in zip(plan.slots, plan.gates):
        y = _gather_rows(ye_pad, slot)
        term = jnp.expand_dims(g, -1).astype(y.dtype) * y
        out = term if out is None else out + term
    return out if dtype is None else out.astype(dtype)


def shared_experts(p: dict, x, cfg: ModelConfig):
    """DeepSeek's shared experts (every token passes through each) on x [B, T, D]."""
    ys = _experts(p, x, cfg, ("btd,sdf->btsf", "btsf,sfd->btd"), lambda b: b)
    if "b_down" in p:
        ys = ys + jnp.sum(p["b_down"], axis=0)
    return ys


def moe_mlp(p: dict, x, cfg: ModelConfig, *, return_dropped: bool = False):
    """The MoE block on x [B, T, D]: route, dispatch to capacity slots, run experts, combine.

    With ``return_dropped`` returns ``(out, dropped)``: ``dropped`` counts the (token,
    choice) pairs that found their expert full.
    """
    idx, gates = route(p, x, cfg)
    xe, plan = dispatch(x, idx, gates, cfg)
    out = combine(routed_experts(p, xe, cfg), plan)
    if cfg.num_shared_experts:
        out = out + shared_experts(p["shared"], x, cfg)
    out = out.astype(x.dtype)
    return (out, plan.dropped) if return_dropped else out
