"""The book's part 7 decode layouts: which mesh axes each strategy needs, how it splits the
params and the KV cache over them, and the checks that the model's dimensions divide them.

Example:
    >>> from shardlab.models import ModelConfig
    >>> from shardlab.serve.layouts import CACHE_AXES, STRATEGIES, check_layout
    >>> STRATEGIES["batch_kv"], CACHE_AXES["batch_kv"]      # (batch, sequence, KV heads) of the cache
    (('y', 'z'), ('z', None, 'y'))
    >>> check_layout(ModelConfig(num_layers=1, d_model=48, ffw_dim=64, num_heads=6, vocab_size=32), "megatron", {"x": 4}, 8, 64)
    Traceback (most recent call last):
    ...
    ValueError: [decode_step] num_heads 6 is not divisible by mesh axis x of size 4 (strategy 'megatron'); choose a mesh whose x size divides 6
"""

from __future__ import annotations

from shardlab import P
from shardlab.models import ModelConfig

__all__ = ["STRATEGIES", "CACHE_AXES", "axis_sizes", "check_layout", "param_specs"]

STRATEGIES = {"megatron": ("x",), "batch_kv": ("y", "z"), "seq_kv": ("x",), "2d": ("x", "yz"),
              "moe": ("x",)}

# the KV cache's mesh axes per strategy: (batch, sequence, KV heads)
CACHE_AXES = {"megatron": (None, None, "x"), "moe": (None, None, "x"), "2d": (None, None, ("x", "yz")),
               "batch_kv": ("z", None, "y"), "seq_kv": (None, "x", None)}


def axis_sizes(mesh, strategy: str) -> dict:
    """The mesh's axis sizes, checked to be the strategy's axes (``STRATEGIES``)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"[decode_step] unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    want = STRATEGIES[strategy]
    shape = dict(mesh.shape)
    if tuple(shape) != want:
        raise ValueError(f"[decode_step] strategy {strategy!r} needs a mesh with axes {want}, got "
                         f"{tuple(shape)}; e.g. shardlab.make_mesh({tuple(2 if len(want) > 1 and i == 0 else 4 if len(want) > 1 else 8 for i in range(len(want)))}, {want})")
    return shape


def check_layout(cfg: ModelConfig, strategy: str, mesh_shape: dict, batch: int, max_len: int) -> None:
    """Raises ValueError when heads, KV heads, F, experts, batch or cache length do not divide
    the mesh axes the strategy shards them over."""
    s = mesh_shape
    checks = []
    if strategy in ("megatron", "seq_kv", "moe"):
        n = s["x"]
        checks += [("num_heads", cfg.num_heads, n, "x"), ("num_kv_heads", cfg.num_kv_heads, n, "x")]
        if strategy == "megatron":
            checks.append(("ffw_dim", cfg.ffw_dim, n, "x"))
        if strategy == "seq_kv":
            checks += [("ffw_dim", cfg.ffw_dim, n, "x"), ("cache length", max_len, n, "x")]
        if strategy == "moe":
            if not cfg.is_moe:
                raise ValueError("[decode_step] strategy 'moe' needs a model with num_experts > 0")
            checks += [("num_experts", cfg.num_experts, n, "x"), ("batch", batch, n, "x")]
    elif strategy == "batch_kv":
        yz = s["y"] * s["z"]
        checks += [("num_heads", cfg.num_heads, yz, "(y, z)"), ("num_kv_heads", cfg.num_kv_heads, s["y"], "y"),
                   ("ffw_dim", cfg.ffw_dim, yz, "(y, z)"), ("batch", batch, s["z"], "z")]
    elif strategy == "2d":
        n = s["x"] * s["yz"]
        checks += [("num_heads", cfg.num_heads, n, "(x, yz)"), ("num_kv_heads", cfg.num_kv_heads, n, "(x, yz)"),
                   ("d_model", cfg.d_model, n, "(x, yz)"), ("ffw_dim", cfg.ffw_dim, s["yz"], "yz")]
    for name, v, k, ax in checks:
        if v % k:
            raise ValueError(f"[decode_step] {name} {v} is not divisible by mesh axis {ax} of size {k} "
                             f"(strategy {strategy!r}); choose a mesh whose {ax} size divides {v}"
                             + ("; with fewer KV heads than devices use strategy 'batch_kv'"
                                if name == "num_kv_heads" else ""))
    if cfg.is_moe and strategy != "moe":
        raise ValueError(f"[decode_step] {cfg.name or 'the model'} is a mixture of experts; use strategy 'moe'")
    if not cfg.gated_mlp and strategy == "2d":
        raise ValueError("[decode_step] strategy '2d' is written for a gated MLP")


def _mlp_specs(p: dict, col, row) -> dict:
    out = {}
    for name in p:
        if name in ("w_gate", "w_up", "w_in"):
            out[name] = P(None, col)
        elif name == "w_down":
            out[name] = P(row, None)
        elif name in ("b_gate", "b_up", "b_in"):
            out[name] = P(col)
        else:
            out[name] = P()
    return out


def _attn_specs(p: dict, heads, kv) -> dict:
    spec = {"wq": P(None, heads), "wk": P(None, kv), "wv": P(None, kv), "wo": P(heads, None),
            "bq": P(heads), "bk": P(kv), "bv": P(kv), "bo": P()}
    return {k: spec[k] for k in p}


def param_specs(params: dict, strategy: str) -> dict:
    """The PartitionSpec of every param (a tree shaped like ``params``) under ``strategy``."""
    heads = {"megatron": "x", "seq_kv": "x", "moe": "x", "batch_kv": ("y", "z"), "2d": ("x", "yz")}[strategy]
    kv = {"batch_kv": "y"}.get(strategy, heads)
    specs = {k: P() for k in params if k != "layers"}
    layers = []
    for layer in params["layers"]:
        ls = {"attn_norm": {k: P() for k in layer["attn_norm"]}, "mlp_norm": {k: P() for k in layer["mlp_norm"]},
              "attn": _attn_specs(layer["attn"], heads, kv)}
        if "moe" in layer:
            ls["moe"] = {k: (P() if k in ("router", "router_bias", "shared") else P("x")) for k in layer["moe"]}
            if "shared" in layer["moe"]:
                ls["moe"]["shared"] = {k: P() for k in layer["moe"]["shared"]}
        elif strategy == "2d":
            ls["mlp"] = {k: (P("x", "yz") if k in ("w_gate", "w_up") else P("yz", "x")) for k in layer["mlp"]}
        else:
            col = heads
            ls["mlp"] = _mlp_specs(layer["mlp"], col, col)
        layers.append(ls)
    specs["layers"] = layers
    return specs
