"""Logical axis names of the model library's params: the vocabulary a sharding strategy
maps onto mesh axes.

Every leaf of :func:`shardlab.models.transformer.init_params` gets a tuple naming its
dimensions: ``"vocab"`` (V), ``"embed"`` (D, the residual stream), ``"heads"`` (N*H, the
query heads times their width), ``"kv"`` (K*H), ``"mlp"`` (F), ``"experts"`` (E),
``"shared"`` (shared experts), ``"seq"`` (positions of a learned table). A strategy (see
``shardlab.train``) is then a table ``{logical name: mesh axes}``.

Example:
    >>> from shardlab.models import ModelConfig, param_axes
    >>> cfg = ModelConfig(num_layers=1, d_model=32, ffw_dim=64, num_heads=4, vocab_size=16)
    >>> ax = param_axes(cfg)
    >>> ax["embed"], ax["layers"][0]["mlp"]["w_down"], ax["layers"][0]["attn"]["wq"]
    (('vocab', 'embed'), ('mlp', 'embed'), ('embed', 'heads'))
"""

from __future__ import annotations

from .config import ModelConfig

__all__ = ["param_axes", "LOGICAL_AXES"]

LOGICAL_AXES = ("vocab", "embed", "heads", "kv", "mlp", "experts", "shared", "seq")


def _norm_axes(cfg: ModelConfig) -> dict:
    p = {"scale": ("embed",)}
    if cfg.norm == "layernorm":
        p["bias"] = ("embed",)
    return p


def _mlp_axes(cfg: ModelConfig, lead: tuple = ()) -> dict:
    names = ("w_gate", "w_up") if cfg.gated_mlp else ("w_in",)
    p = {n: lead + ("embed", "mlp") for n in names}
    p["w_down"] = lead + ("mlp", "embed")
    if cfg.mlp_bias:
        p.update({n.replace("w_", "b_"): lead + ("mlp",) for n in names})
        p["b_down"] = lead + ("embed",)
    return p


def param_axes(cfg: ModelConfig) -> dict:
    """A pytree shaped like ``transformer.init_params(cfg)`` whose leaves are tuples of logical
    axis names, one per dimension of the corresponding param."""
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"[param_axes] expected a ModelConfig, got {type(cfg).__name__}")
    axes = {"embed": ("vocab", "embed")}
    if cfg.positions == "learned":
        axes["pos_embed"] = ("seq", "embed")
    layers = []
    for i in range(cfg.num_layers):
        attn = {"wq": ("embed", "heads"), "wk": ("embed", "kv"), "wv": ("embed", "kv"), "wo": ("heads", "embed")}
        if cfg.qkv_bias:
            attn.update(bq=("heads",), bk=("kv",), bv=("kv",))
        if cfg.out_bias:
            attn["bo"] = ("embed",)
        layer = {"attn_norm": _norm_axes(cfg), "attn": attn, "mlp_norm": _norm_axes(cfg)}
        if cfg.is_moe_layer(i):
            moe = {"router": ("embed", "experts")}
            if cfg.router_bias:
                moe["router_bias"] = ("experts",)
            moe.update(_mlp_axes(cfg, ("experts",)))
            if cfg.num_shared_experts:
                moe["shared"] = _mlp_axes(cfg, ("shared",))
            layer["moe"] = moe
        else:
            layer["mlp"] = _mlp_axes(cfg)
        layers.append(layer)
    axes["layers"] = layers
    axes["final_norm"] = _norm_axes(cfg)
    if not cfg.tie_embeddings:
        axes["head"] = ("embed", "vocab")
    return axes
