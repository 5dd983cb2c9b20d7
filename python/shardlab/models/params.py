"""``param_count``: the exact number of parameters of a ``ModelConfig``, by component.

The count is the number of elements of the tensors a released checkpoint holds (LLaMA-2 7B:
6,738,415,616; GPT-2 small: 124,439,808), and the number of elements of the pytree
:func:`shardlab.models.transformer.init_params` builds.

Example:
    >>> from shardlab.models import param_count, presets
    >>> p = param_count(presets.get("llama2-7b"))
    >>> p.total
    6738415616
    >>> p.attention == 32 * 4 * 4096 * 4096
    True
"""

from __future__ import annotations

from .config import ModelConfig
from .report import Report

__all__ = ["param_count", "ParamCount", "attention_params_per_layer", "mlp_params", "norm_params"]


def attention_params_per_layer(cfg: ModelConfig) -> int:
    """W_Q [D,N,H] + W_K, W_V [D,K,H] + W_O [N,H,D] (+ biases): 2D(N+K)H when there are none."""
    d, n, k, h = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    p = 2 * d * (n + k) * h
    if cfg.qkv_bias:
        p += (n + 2 * k) * h
    if cfg.out_bias:
        p += d
    return p


def mlp_params(cfg: ModelConfig, ffw_dim: int) -> int:
    """One MLP of width F: 3DF gated, 2DF plain (+ biases F per input matrix and D out)."""
    d = cfg.d_model
    p = cfg.mlp_matrices * d * ffw_dim
    if cfg.mlp_bias:
        p += (cfg.mlp_matrices - 1) * ffw_dim + d
    return p


def norm_params(cfg: ModelConfig) -> int:
    """One norm: D (RMSNorm) or 2D (LayerNorm, weight and bias)."""
    return cfg.d_model * (2 if cfg.norm == "layernorm" else 1)


class ParamCount(Report):
    """Parameters by component; ``.total`` and ``.active`` (per token, for MoE)."""


def param_count(cfg: ModelConfig) -> ParamCount:
    """Counts the parameters of ``cfg`` by component.

    Components: ``embedding`` (V x D, plus a learned position table), ``attention``,
    ``mlp`` (dense layers), ``experts`` (routed), ``shared_experts``, ``router``, ``norms``
    (two per layer and the final one) and ``head`` (the output matrix, 0 when tied).
    ``.active`` counts what one token uses: the routed experts it is sent to (k of E), every
    other component in full.

    Args:
        cfg: the model.

    Returns:
        A :class:`ParamCount` (a :class:`~shardlab.models.report.Report`) with the parts above,
        ``.total``, ``.active`` and the formula.

    Example:
        >>> from shardlab.models import param_count, presets
        >>> m = param_count(presets.get("mixtral-8x7b"))
        >>> m.total, m.active
        (46702792704, 12879925248)
    """
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"[param_count] expected a ModelConfig, got {type(cfg).__name__}; "
                        f"build one with ModelConfig(...), ModelConfig.from_hf(...) or presets.get(name)")
    L, D, V = cfg.num_layers, cfg.d_model, cfg.vocab_size
    embedding = V * D + (cfg.max_seq_len * D if cfg.positions == "learned" else 0)
    attention = L * attention_params_per_layer(cfg)
    mlp = cfg.num_dense_layers * mlp_params(cfg, cfg.ffw_dim)
    one_expert = mlp_params(cfg, cfg.moe_ffw_dim)
    experts = cfg.num_moe_layers * cfg.num_experts * one_expert
    shared = cfg.num_moe_layers * cfg.num_shared_experts * one_expert
    router = cfg.num_moe_layers * (D * cfg.num_experts + (cfg.num_experts if cfg.router_bias else 0))
    norms = (2 * L + 1) * norm_params(cfg)
    head = 0 if cfg.tie_embeddings else V * D
    parts = {"embedding": embedding, "attention": attention, "mlp": mlp}
    if cfg.is_moe:
        parts.update(experts=experts, shared_experts=shared, router=router)
    parts.update(norms=norms, head=head)
    active = sum(parts.values()) - cfg.num_moe_layers * (cfg.num_experts - cfg.top_k) * one_expert
    mlp_f = "3DF" if cfg.gated_mlp else "2DF"
    formula = (f"VD{' + T_max*D' if cfg.positions == 'learned' else ''} + L*2D(N+K)H"
               f" + L_dense*{mlp_f}")
    if cfg.is_moe:
        formula += f" + L_moe*(E + shared)*{mlp_f.replace('F', 'F_e')} + L_moe*D*E"
    formula += f" + (2L+1)*{'2D' if cfg.norm == 'layernorm' else 'D'}"
    formula += "" if cfg.tie_embeddings else " + VD (head)"
    if cfg.qkv_bias or cfg.out_bias or cfg.mlp_bias:
        formula += " + biases"
    attn_share = attention / sum(parts.values())
    return ParamCount(f"param_count({cfg.name or 'model'})", parts, unit="params", formula=formula,
                      extra={"active": active, "attention_share": round(attn_share, 6)},
                      extra_units={"active": "params", "attention_share": "%"},
                      notes=(cfg.note,) if cfg.note else ())
