"""The mixture-of-experts MLP: a top-k softmax router and capacity-slot dispatch.

Each sequence of T tokens is one routing group. Expert e has ``C = cfg.expert_capacity(T)``
slots; tokens claim them in sequence order and a token beyond an expert's capacity is dropped
for that expert (GShard/Switch). Dispatch and combine are gathers (``take_along_axis``), not
one-hot matmuls, so the only matmuls are the router ``[D, E]``, the experts on ``[E, C]``
slots and the shared experts -- exactly what :func:`shardlab.models.flops_per_token` counts.

Example:
    >>> import numpy as np
    >>> from shardlab.models import ModelConfig, transformer
    >>> cfg = ModelConfig(num_layers=1, d_model=16, ffw_dim=32, num_heads=2, vocab_size=32,
    ...                   num_experts=4, top_k=2)
    >>> p = transformer.init_params(cfg, seed=0)
    >>> x = np.random.default_rng(0).standard_normal((2, 8, 16)).astype(np.float32)
    >>> moe_mlp(p["layers"][0]["moe"], x, cfg).shape
    (2, 8, 16)
"""

from __future__ import annotations

import numpy as np

import shardlab.numpy as jnp

from .config import ModelConfig
from .ops import activation, cumsum, one_hot, softmax, top_k

__all__ = ["moe_mlp", "route"]


def route(p: dict, x, cfg: ModelConfig):
    """Router: probabilities over E, the top-k choices and their gates (renormalised over k).

    With a router bias (DeepSeek-V3) the bias shifts which experts are chosen, not the gates.
    Returns (indices list, gates list), k arrays of shape [B, T].
    """
    logits = jnp.matmul(x, p["router"]).astype(np.float32)
    probs = softmax(logits, axis=-1)
    scores = probs + p["router_bias"] if "router_bias" in p else probs
    _, idx = top_k(scores, cfg.top_k)
    gates = [jnp.take_along_axis(probs, jnp.expand_dims(i, -1), axis=-1)[..., 0] for i in idx]
    norm = gates[0]
    for g in gates[1:]:
        norm = norm + g
    return idx, [g / norm for g in gates]


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


def moe_mlp(p: dict, x, cfg: ModelConfig):
    """The MoE block on x [B, T, D]: route, dispatch to capacity slots, run experts, combine."""
    B, T, D = x.shape
    E = cfg.num_experts
    C = cfg.expert_capacity(T)
    idx, gates = route(p, x, cfg)
    assign = one_hot(idx[0], E)
    for i in idx[1:]:
        assign = assign + one_hot(i, E)
    rank = cumsum(assign, axis=1)  # [B, T, E]: 1-based arrival order of each token at expert e
    # slot c of expert e holds the token whose rank is c + 1: the count of tokens ranked <= c
    slot_c = np.arange(C, dtype=np.int32)
    token_of_slot = jnp.sum(jnp.less_equal(jnp.expand_dims(rank, -1), slot_c).astype(np.int32), axis=1)
    x_pad = jnp.concatenate([x, jnp.zeros((B, 1, D), x.dtype)], axis=1)  # row T: an empty slot
    xe = jnp.take_along_axis(x_pad, jnp.reshape(token_of_slot, (B, E * C, 1)), axis=1)
    xe = jnp.reshape(xe, (B, E, C, D))
    ye = _experts(p, xe, cfg, ("becd,edf->becf", "becf,efd->becd"),
                  lambda b: b[:, None, :])
    if "b_down" in p:
        ye = ye + p["b_down"][:, None, :]
    ye_pad = jnp.concatenate([jnp.reshape(ye, (B, E * C, D)), jnp.zeros((B, 1, D), ye.dtype)], axis=1)
    out = None
    for i, g in zip(idx, gates):
        pos = jnp.take_along_axis(rank, jnp.expand_dims(i, -1), axis=-1)[..., 0] - 1
        slot = jnp.where(pos < C, i * C + pos, E * C)  # E * C: the zero row (dropped)
        y = jnp.take_along_axis(ye_pad, jnp.expand_dims(slot, -1), axis=1)
        term = jnp.expand_dims(g, -1).astype(y.dtype) * y
        out = term if out is None else out + term
    if cfg.num_shared_experts:
        ys = _experts(p["shared"], x, cfg, ("btd,sdf->btsf", "btsf,sfd->btd"), lambda b: b)
        if "b_down" in p["shared"]:
            ys = ys + jnp.sum(p["shared"]["b_down"], axis=0)
        out = out + ys
    return out.astype(x.dtype)
