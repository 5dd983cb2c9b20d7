"""A model of ``shardlab.models.transformer`` cut into pipeline stages: params, functions, gradients.

Virtual stage ``k`` of ``n`` holds a contiguous range of transformer blocks
(:func:`~shardlab.train.pipeline.schedule.stage_layers`); the first also holds the token
embedding (and learned positions), the last the final norm, the output head and the loss. Each
stage is a function of its own params and its input (token ids for the first, the residual
stream ``[b, T, D]`` for the others); the last returns the microbatch's mean cross-entropy.
Chained, the stages compute exactly ``transformer.loss``: the block below is the body of
``transformer.forward``'s loop, applied layer by layer.

Example:
    >>> import numpy as np
    >>> from shardlab.models import ModelConfig, transformer
    >>> from shardlab.train.pipeline import stages
    >>> cfg = ModelConfig(num_layers=2, d_model=32, ffw_dim=64, num_heads=4, num_kv_heads=2, vocab_size=50)
    >>> params = transformer.init_params(cfg, seed=0)
    >>> ps = stages.split_params(params, cfg, (range(0, 1), range(1, 2)))
    >>> sorted(ps[0]), sorted(ps[1])
    (['embed', 'layers'], ['final_norm', 'head', 'layers'])
    >>> tok = np.random.default_rng(0).integers(0, 50, (2, 8)); tgt = np.roll(tok, -1, axis=1)
    >>> x = stages.stage_forward(ps[0], tok, None, cfg, first=True, last=False, layer_ids=range(0, 1))
    >>> l = stages.stage_forward(ps[1], x, tgt, cfg, first=False, last=True, layer_ids=range(1, 2))
    >>> bool(np.isclose(float(l), float(transformer.loss(params, tok, tgt, cfg)), atol=1e-6))
    True
"""

from __future__ import annotations

import numpy as np

import shardlab.numpy as jnp
from shardlab import LocalArray, lax
from shardlab.models import ModelConfig
from shardlab.models.layers import attention, mlp, norm
from shardlab.models.moe import moe_mlp
from shardlab.models.ops import log_softmax

__all__ = ["split_params", "stage_forward", "merge_grads", "add_trees"]


def split_params(params: dict, cfg: ModelConfig, layers: tuple[range, ...]) -> list[dict]:
    """The params of every virtual stage: ``{"layers": [...]}`` plus the embedding on the first
    and ``final_norm`` / ``head`` (or, tied, ``embed``) on the last. Arrays are shared, not copied."""
    n = len(layers)
    out = []
    for k, rng in enumerate(layers):
        p = {"layers": [params["layers"][i] for i in rng]}
        if k == 0:
            p["embed"] = params["embed"]
            if "pos_embed" in params:
                p["pos_embed"] = params["pos_embed"]
        if k == n - 1:
            p["final_norm"] = params["final_norm"]
            if "head" in params:
                p["head"] = params["head"]
            else:
                p["embed"] = params["embed"]  # tied: the head is embed.T; its two gradients add up
        out.append(p)
    return out


def _ids(x):
    return x if isinstance(x, LocalArray) else np.asarray(x)


def _block(layer: dict, x, cfg: ModelConfig, i: int, causal: bool):
    """One transformer block, as in ``transformer.forward``."""
    a = attention(layer["attn"], norm(layer["attn_norm"], x, cfg), cfg, causal=causal)
    moe = cfg.is_moe_layer(i)
    ff, fp = (moe_mlp, layer["moe"]) if moe else (mlp, layer["mlp"])
    if cfg.parallel_residual:
        return x + a + ff(fp, norm(layer["mlp_norm"], x, cfg), cfg)
    x = x + a
    return x + ff(fp, norm(layer["mlp_norm"], x, cfg), cfg)


def stage_forward(sp: dict, x, targets, cfg: ModelConfig, *, first: bool, last: bool, layer_ids,
                  causal: bool = True, data_axes: tuple = ()):
    """Runs one virtual stage: embed (first), its blocks, then norm, head and mean loss (last).

    Args:
        sp: the stage's params (:func:`split_params`).
        x: token ids ``[b, T]`` on the first stage, else the residual stream ``[b, T, D]``.
        targets: ids ``[b, T]`` on the last stage (else unused).
        layer_ids: the model's indices of the stage's layers (for MoE layer placement).
        data_axes: mesh axes the microbatch is split over (inside shard_map); the loss is
            averaged over them, so it is the mean over the whole microbatch.
    """
    if first:
        # rows of the table, as transformer's gather, with the index spelled out to [b, T, D]
        # (the gather's gradient scatters it back; a [b, T, 1] index broadcast over D has none)
        ids = _ids(x)
        emb = sp["embed"]
        full = (ids.shape[0], ids.shape[1], emb.shape[1])
        idx = jnp.broadcast_to(jnp.expand_dims(ids, -1).astype(np.int32), full)
        table = jnp.broadcast_to(emb[None], (ids.shape[0],) + tuple(emb.shape))
        x = jnp.take_along_axis(table, idx, axis=1)
        if cfg.positions == "learned":
            x = x + sp["pos_embed"][: x.shape[1]][None]
    for layer, i in zip(sp["layers"], layer_ids):
        x = _block(layer, x, cfg, i, causal)
    if not last:
        return x
    x = norm(sp["final_norm"], x, cfg)
    head = sp["head"] if "head" in sp else sp["embed"].T
    logits = jnp.matmul(x, head).astype(np.float32)
    picked = jnp.take_along_axis(log_softmax(logits, axis=-1), jnp.expand_dims(_ids(targets), -1).astype(np.int32),
                                 axis=-1)
    loss = -jnp.mean(picked)
    return lax.pmean(loss, data_axes) if data_axes else loss


def add_trees(a, b):
    """Leaf-wise a + b of two params-shaped pytrees (dicts, lists, arrays)."""
    if isinstance(a, dict):
        return {k: add_trees(a[k], b[k]) for k in a}
    if isinstance(a, (list, tuple)):
        return type(a)(add_trees(x, y) for x, y in zip(a, b))
    return np.asarray(a) + np.asarray(b)


def merge_grads(params: dict, stage_grads: list[dict], layers: tuple[range, ...]) -> dict:
    """The full params-shaped gradient from every virtual stage's gradient (a tied embedding's
    two parts, from the first and the last stage, are added)."""
    out: dict = {"layers": [None] * len(params["layers"])}
    for g, rng in zip(stage_grads, layers):
        for i, lg in zip(rng, g["layers"]):
            out["layers"][i] = lg
        for key, val in g.items():
            if key == "layers":
                continue
            out[key] = add_trees(out[key], val) if key in out else val
    return {k: out[k] for k in params}
