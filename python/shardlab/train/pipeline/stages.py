"""A model of ``shardlab.models.transformer`` cut into pipeline stages, and each stage into pieces.

Virtual stage ``k`` of ``n`` holds a contiguous range of transformer blocks
(:func:`~shardlab.train.pipeline.schedule.stage_layers`); the first also holds the token
embedding (and learned positions), the last the final norm, the output head and the loss.
:func:`stage_forward` runs a whole stage (the non-pipelined reference runs the whole model as
one); chained, the stages compute exactly ``transformer.loss``.

The executor runs a stage as a chain of :class:`Piece` s (:func:`pieces`): the embedding; per
block its norm, its attention with the residual add, its MLP norm, its MLP with the residual add;
the final norm; the head with the loss. Each piece's weights act on its input before anything
else of the piece that has weights, so the *weight gradient* of a piece (``vjp_fn(ct,
argnums=0)``) needs only the piece's output cotangent and the piece's own internal chain, not the
rest of the stage: that is what lets a zero-bubble schedule run the input gradients of a stage
(walking the pieces backwards with ``argnums=1``) and its weight gradients later, each with its
own FLOPs. A piece's carry is the residual stream ``x``, or ``(x, h)`` with ``h`` a norm's output.

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
    >>> [q.name for q in stages.pieces(params, cfg, range(1, 2), first=False, last=True)]
    ['layer1.attn_norm', 'layer1.attn', 'layer1.mlp_norm', 'layer1.mlp', 'final_norm', 'head']
    >>> c = tok
    >>> for q in stages.pieces(params, cfg, range(0, 2), first=True, last=True):
    ...     c = q.apply(q.params, c, tgt)
    >>> bool(np.isclose(float(c), float(l), atol=1e-6))
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

import shardlab.numpy as jnp
from shardlab import LocalArray, lax
from shardlab.models import ModelConfig
from shardlab.models.layers import attention, mlp, norm
from shardlab.models.moe import moe_mlp
from shardlab.models.ops import log_softmax

__all__ = ["split_params", "stage_forward", "merge_grads", "add_trees", "Piece", "pieces", "assemble_grads"]


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


def _embed(sp: dict, ids, cfg: ModelConfig):
    """Rows of the table, as transformer's gather, with the index spelled out to [b, T, D] (the
    gather's gradient scatters it back; a [b, T, 1] index broadcast over D has none)."""
    ids = _ids(ids)
    emb = sp["embed"]
    full = (ids.shape[0], ids.shape[1], emb.shape[1])
    idx = jnp.broadcast_to(jnp.expand_dims(ids, -1).astype(np.int32), full)
    table = jnp.broadcast_to(emb[None], (ids.shape[0],) + tuple(emb.shape))
    x = jnp.take_along_axis(table, idx, axis=1)
    if cfg.positions == "learned":
        x = x + sp["pos_embed"][: x.shape[1]][None]
    return x


def _head_loss(sp: dict, x, targets):
    """The mean cross-entropy of ``targets`` under ``x @ head`` (``embed.T`` when tied)."""
    head = sp["head"] if "head" in sp else sp["embed"].T
    logits = jnp.matmul(x, head).astype(np.float32)
    picked = jnp.take_along_axis(log_softmax(logits, axis=-1), jnp.expand_dims(_ids(targets), -1).astype(np.int32),
                                 axis=-1)
    return -jnp.mean(picked)


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
        x = _embed(sp, x, cfg)
    for layer, i in zip(sp["layers"], layer_ids):
        x = _block(layer, x, cfg, i, causal)
    if not last:
        return x
    x = norm(sp["final_norm"], x, cfg)
    loss = _head_loss(sp, x, targets)
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



class Piece(NamedTuple):
    """One piece of a stage: ``apply(params, carry, targets)`` with its own ``params``.

    Attributes:
        name: e.g. ``"embed"``, ``"layer3.attn"``, ``"head"``.
        params: the piece's params (a dict holding arrays of the model's params, not copies).
        where: where they sit in the model's params: ``()`` (top level) or ``("layers", i)``.
        apply: ``apply(params, carry, targets) -> carry`` (the head returns the mean loss).
        has_input: False for the embedding (its input, token ids, has no gradient).
    """

    name: str
    params: dict
    where: tuple
    apply: Callable
    has_input: bool = True


def pieces(params: dict, cfg: ModelConfig, layer_ids, *, first: bool, last: bool,
           causal: bool = True, tp=None) -> list[Piece]:
    """The pieces of the stage holding blocks ``layer_ids`` (and the embedding / the head).

    Chained in order they compute :func:`stage_forward` (the loss is the microbatch's mean,
    not averaged over data axes: the executor does that).

    Args:
        tp: a :class:`~shardlab.train.pipeline.tensor.TensorParallel`: the pieces are then
            per-device code for its model axis (run them in ``shard_map``); the final norm and
            the head are one piece (``"head"``, its vocab-parallel loss).
    """
    out: list[Piece] = []
    if tp is not None:
        attn = lambda p, h: tp.attention(p, h, causal)   # noqa: E731
        ffn = tp.mlp
    else:
        attn = lambda p, h: attention(p, h, cfg, causal=causal)   # noqa: E731
        ffn = lambda p, h: mlp(p, h, cfg)   # noqa: E731
    if first:
        top = {k: params[k] for k in ("embed", "pos_embed") if k in params}
        emb = (lambda p, ids, t: tp.embed(p, ids)) if tp is not None else (lambda p, ids, t: _embed(p, ids, cfg))
        out.append(Piece("embed", top, (), emb, has_input=False))
    for i in layer_ids:
        layer = params["layers"][i]
        moe = cfg.is_moe_layer(i)
        ff, fkey = ((lambda p, h: moe_mlp(p, h, cfg)), "moe") if moe else (ffn, "mlp")
        where = ("layers", i)
        if cfg.parallel_residual:
            out += [
                Piece(f"layer{i}.norms", {"attn_norm": layer["attn_norm"], "mlp_norm": layer["mlp_norm"]}, where,
                      lambda p, x, t: (x, norm(p["attn_norm"], x, cfg), norm(p["mlp_norm"], x, cfg))),
                Piece(f"layer{i}.attn", {"attn": layer["attn"]}, where,
                      lambda p, c, t: (c[0] + attn(p["attn"], c[1]), c[2])),
                Piece(f"layer{i}.{fkey}", {fkey: layer[fkey]}, where,
                      lambda p, c, t, ff=ff, fkey=fkey: c[0] + ff(p[fkey], c[1])),
            ]
            continue
        out += [
            Piece(f"layer{i}.attn_norm", {"attn_norm": layer["attn_norm"]}, where,
                  lambda p, x, t: (x, norm(p["attn_norm"], x, cfg))),
            Piece(f"layer{i}.attn", {"attn": layer["attn"]}, where,
                  lambda p, c, t: c[0] + attn(p["attn"], c[1])),
            Piece(f"layer{i}.mlp_norm", {"mlp_norm": layer["mlp_norm"]}, where,
                  lambda p, x, t: (x, norm(p["mlp_norm"], x, cfg))),
            Piece(f"layer{i}.{fkey}", {fkey: layer[fkey]}, where,
                  lambda p, c, t, ff=ff, fkey=fkey: c[0] + ff(p[fkey], c[1])),
        ]
    if last and tp is not None:
        key = "head" if "head" in params else "embed"
        out.append(Piece("head", {"final_norm": params["final_norm"], key: params[key]}, (),
                         lambda p, x, t: tp.head_loss(p, x, t)))
    elif last:
        out.append(Piece("final_norm", {"final_norm": params["final_norm"]}, (),
                         lambda p, x, t: norm(p["final_norm"], x, cfg)))
        key = "head" if "head" in params else "embed"
        out.append(Piece("head", {key: params[key]}, (), lambda p, x, t: _head_loss(p, x, t)))
    return out


def assemble_grads(params: dict, piece_grads) -> dict:
    """The params-shaped gradient from ``(piece, gradient)`` pairs covering every param once
    (a tied embedding's two parts, the embedding's and the head's, are added).

    Raises:
        ValueError: a param that no piece's gradient covers.
    """
    top: dict = {}
    layers: list[dict] = [{} for _ in params["layers"]]
    for piece, g in piece_grads:
        target = top if piece.where == () else layers[piece.where[1]]
        for key, val in g.items():
            target[key] = add_trees(target[key], val) if key in target else val
    for i, layer in enumerate(params["layers"]):
        missing = [k for k in layer if k not in layers[i]]
        if missing:
            raise ValueError(f"[pipeline] layer {i}'s {missing} got no gradient from any stage")
        layers[i] = {k: layers[i][k] for k in layer}
    top["layers"] = layers
    missing = [k for k in params if k not in top]
    if missing:
        raise ValueError(f"[pipeline] params {missing} got no gradient from any stage")
    return {k: top[k] for k in params}
