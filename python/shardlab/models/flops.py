"""``flops_per_token``: forward, backward and rematerialisation FLOPs, matmul vs attention.

The convention is the ledger's, so the formula can be checked against a forward pass that ran:

* A matmul/einsum of an ``[M, K]`` by ``[K, N]`` operand costs ``2MKN`` (one multiply, one
  add). The matmuls of a layer are W_Q, W_K, W_V, W_O, the MLP matrices (2 plain, 3 gated),
  and for MoE the router ``[D, E]``, the routed experts and the shared experts; the model ends
  with the output head ``[D, V]``. Embedding lookups, norms, rotary, softmax, activations,
  residual adds and biases are elementwise and not counted (the book's ``O(BTD)`` terms).
* Attention (``shardlab.nn.dot_product_attention``) costs ``4H`` per (query, key) pair and
  query head: ``2H`` for ``QK^T`` and ``2H`` for ``PV``. Causal attention over a sequence of T
  tokens has exactly ``T(T+1)/2`` pairs, so per token it is ``4NH(T+1)/2`` -- not the book's
  ``4NHT/2``; without a causal mask it is ``4NHT``.
* Routed experts run on capacity slots: with ``C = ceil(cf * k * T / E)`` slots per expert
  (at most T) for each sequence, every expert multiplies ``C`` rows whether they are filled
  or not, so a sequence costs ``E * C * 2mDF_e``; with ``cf = 1`` and ``E | kT`` this is the
  ideal ``k * 2mDF_e`` per token.
* Backward: every matmul costs twice its forward (dL/dW and dL/dX, the book's ``4NPM``).
  Attention backward, ``attention_backward=``: ``"2x"`` (the book: ``8H`` per pair, four
  matmuls), ``"flash"`` (FlashAttention-2 recomputes ``QK^T``: ``10H``) or ``"shardlab"``
  (``shardlab.nn.dot_product_attention_vjp`` also reruns the forward: ``14H``, what its ledger
  event records).
* ``remat``: a recompute policy of :mod:`shardlab.models.remat` (the Trainer's): ``None`` /
  ``"none"`` (keep every activation), ``"full"`` (keep each layer's input, rerun the layer's
  forward), ``"dots"`` (alias ``"attention"``: keep the matmul outputs, recompute the two
  attention matmuls: the book's question 6), ``"selective"`` (Megatron's: the attention core
  only), ``"ffw_outputs"`` (keep the MLP matmul outputs: recompute Q/K/V, attention and W_O) or
  any set of checkpoint names: every matmul whose output is not kept is recomputed once, and the
  attention core unless ``attn_out`` is kept. A MoE layer's router and experts count as
  ``mlp_hidden``. The head is never recomputed.

Example:
    >>> from shardlab.models import ModelConfig, flops_per_token
    >>> cfg = ModelConfig(num_layers=1, d_model=8, ffw_dim=32, num_heads=2, vocab_size=16)
    >>> f = flops_per_token(cfg, context=4, training=False)
    >>> f.forward_matmul == 2 * (4 * 8 * 8 + 3 * 8 * 32 + 8 * 16)
    True
    >>> f.forward_attention == 4 * 2 * 4 * (4 + 1) / 2   # 4 N H (T+1)/2
    True
"""

from __future__ import annotations

from fractions import Fraction

from .config import ModelConfig
from .remat import remat_policy
from .report import Report

__all__ = ["flops_per_token", "FlopsPerToken", "attention_crossover"]

_ATTN_BWD = {"2x": 8, "flash": 10, "shardlab": 14}


class FlopsPerToken(Report):
    """FLOPs per token: parts forward/backward x matmul/attention (+ remat); ``extra`` holds
    ``per_sequence`` (exact integer over the T tokens of a sequence), the per-component forward
    split (``qkvo``, ``mlp``, ``experts``, ``router``, ``shared_experts``, ``head``) and the
    convention."""

    @property
    def forward(self) -> float:
        return self.parts["forward_matmul"] + self.parts["forward_attention"]

    @property
    def backward(self) -> float:
        return self.parts.get("backward_matmul", 0) + self.parts.get("backward_attention", 0)

    @property
    def matmul(self) -> float:
        return sum(v for k, v in self.parts.items() if k.endswith("matmul"))

    @property
    def attention(self) -> float:
        return sum(v for k, v in self.parts.items() if k.endswith("attention"))

    def for_tokens(self, num_sequences: int = 1) -> int:
        """Exact FLOPs of ``num_sequences`` sequences of ``context`` tokens."""
        return int(self.extra["per_sequence"] * num_sequences)


def _layer_matmul_fwd(cfg: ModelConfig, T: int) -> dict:
    """Forward matmul FLOPs of one sequence of T tokens, by component, summed over layers."""
    D, N, K, H = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    m = cfg.mlp_matrices
    out = {"qkvo": cfg.num_layers * T * 2 * D * (2 * N + 2 * K) * H,
           "mlp": cfg.num_dense_layers * T * 2 * m * D * cfg.ffw_dim}
    if cfg.is_moe:
        C = cfg.expert_capacity(T)
        Fe = cfg.moe_ffw_dim
        out["router"] = cfg.num_moe_layers * T * 2 * D * cfg.num_experts
        out["experts"] = cfg.num_moe_layers * cfg.num_experts * C * 2 * m * D * Fe
        out["shared_experts"] = cfg.num_moe_layers * T * cfg.num_shared_experts * 2 * m * D * Fe
    out["head"] = T * 2 * D * cfg.vocab_size
    return out


def _attention_pairs(T: int, causal: bool) -> int:
    return T * (T + 1) // 2 if causal else T * T


def flops_per_token(cfg: ModelConfig, context: int, causal: bool = True, training: bool = True, *,
                    remat=None, attention_backward: str = "2x") -> FlopsPerToken:
    """FLOPs per token of a sequence of ``context`` tokens (averaged over its tokens).

    Args:
        cfg: the model.
        context: T, the sequence length (each token attends to the sequence, or its prefix
            when causal).
        causal: causal attention (exactly T(T+1)/2 query-key pairs per head).
        training: add the backward pass (and remat); False gives the forward only.
        remat: a recompute policy (``shardlab.models.remat``; see the module docstring).
        attention_backward: "2x", "flash" or "shardlab" (see the module docstring).

    Returns:
        A :class:`FlopsPerToken` report: ``forward_matmul``, ``forward_attention`` and, when
        training, ``backward_matmul``, ``backward_attention``, ``remat``; ``.forward``,
        ``.backward``, ``.matmul``, ``.attention``, ``.total``; ``extra['per_sequence']`` is the
        exact integer for one sequence (what a ledger of it records).

    Example:
        >>> from shardlab.models import flops_per_token, presets, param_count
        >>> cfg = presets.get("llama2-7b")
        >>> f = flops_per_token(cfg, context=4096, causal=True)
        >>> p = param_count(cfg)
        >>> f.matmul == 6 * (p.total - p.embedding - p.norms)   # 6 x the params used in matmuls
        True
    """
    op = "flops_per_token"
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"[{op}] expected a ModelConfig, got {type(cfg).__name__}")
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ValueError(f"[{op}] context {context!r} must be an int >= 1 (tokens in the sequence)")
    policy = remat_policy(remat, op)
    if attention_backward not in _ATTN_BWD:
        raise ValueError(f"[{op}] attention_backward {attention_backward!r} is not one of "
                         f"{', '.join(_ATTN_BWD)}")
    T = context
    comp = _layer_matmul_fwd(cfg, T)
    fwd_mm = sum(comp.values())
    pairs = _attention_pairs(T, causal)
    fwd_attn = cfg.num_layers * 4 * cfg.num_heads * cfg.head_dim * pairs
    seq = {"forward_matmul": fwd_mm, "forward_attention": fwd_attn}
    if training:
        seq["backward_matmul"] = 2 * fwd_mm
        seq["backward_attention"] = fwd_attn * _ATTN_BWD[attention_backward] // 4
        seq["remat"] = _recomputed(cfg, T, comp, fwd_attn, policy)
    per_seq_total = sum(seq.values())
    parts = {k: _num(Fraction(v, T)) for k, v in seq.items()}
    mm = "2*[D(2N+2K)H*L + " + ("3" if cfg.gated_mlp else "2") + "DF*L_dense"
    if cfg.is_moe:
        mm += f" + DE*L_moe + (E*C/T + shared)*{cfg.mlp_matrices}DF_e*L_moe"
    mm += " + DV]"
    attn = "4NH(T+1)/2*L" if causal else "4NHT*L"
    formula = f"forward = {mm} + {attn}"
    if training:
        formula += (f"; backward = 2*matmul + {_ATTN_BWD[attention_backward] / 4:g}*attention"
                    f"; remat({policy}) = {_remat_formula(policy)}")
    extra = {"context": T, "causal": causal, "per_sequence": per_seq_total}
    extra.update({f"fwd_{k}": _num(Fraction(v, T)) for k, v in comp.items()})
    return FlopsPerToken(f"{op}({cfg.name or 'model'}, T={T}{', causal' if causal else ''}"
                         f"{', training' if training else ', forward'})", parts, unit="flops",
                         formula=formula, extra=extra,
                         extra_units={k: "flops" for k in extra if k not in ("context", "causal")})


def _dense_matmuls(cfg: ModelConfig, T: int) -> dict:
    """Forward FLOPs of one sequence's matmuls in the dense layers, by checkpoint name."""
    D, N, K, H, F = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.ffw_dim
    L = cfg.num_dense_layers
    return {"qkv": L * T * 2 * D * (N + 2 * K) * H, "attn_proj": L * T * 2 * N * H * D,
            "mlp_hidden": L * T * 2 * (cfg.mlp_matrices - 1) * D * F, "mlp_down": L * T * 2 * F * D}


def _recomputed(cfg: ModelConfig, T: int, comp: dict, fwd_attn: int, policy) -> int:
    """Recompute FLOPs of one sequence: each matmul whose output the policy does not keep, and
    the attention core unless ``attn_out`` is kept (MoE layers: their Q/K/V/O by name, router and
    experts as ``mlp_hidden``)."""
    if not policy.checkpointed:
        return 0
    moe_layers = cfg.num_layers - cfg.num_dense_layers
    dense = _dense_matmuls(cfg, T)
    total = sum(v for k, v in dense.items() if policy.recomputes(k))
    if moe_layers:
        D, N, K, H = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        attn = {"qkv": moe_layers * T * 2 * D * (N + 2 * K) * H, "attn_proj": moe_layers * T * 2 * N * H * D}
        total += sum(v for k, v in attn.items() if policy.recomputes(k))
        if policy.recomputes("mlp_hidden"):
            total += comp.get("router", 0) + comp.get("experts", 0) + comp.get("shared_experts", 0)
    return total + (fwd_attn if policy.recomputes("attn_out") else 0)


def _remat_formula(policy) -> str:
    if not policy.checkpointed:
        return "0"
    parts = [n for n in ("qkv", "attn_proj", "mlp_hidden", "mlp_down") if policy.recomputes(n)]
    parts += ["attention forward"] if policy.recomputes("attn_out") else []
    return " + ".join(parts) if parts else "0"


def _num(fr: Fraction):
    return int(fr) if fr.denominator == 1 else float(fr)


def attention_crossover(cfg: ModelConfig, against: str = "qkvo", causal: bool = False) -> float:
    """The context T at which attention FLOPs equal the ``against`` matmul FLOPs.

    ``against="qkvo"``: the Q/K/V/O projections (the book's question 5: T = 2D when N = K);
    ``"layer"``: all of a layer's matmuls (the book's T = 8D for F = 4D, D = NH, N = K). Both
    sides scale the same way from forward to training, so the answer holds for either.
    ``causal=True`` uses the exact T(T+1)/2 pairs.

    Example:
        >>> from shardlab.models import ModelConfig, attention_crossover
        >>> cfg = ModelConfig(num_layers=1, d_model=4096, ffw_dim=16384, num_heads=32, vocab_size=8)
        >>> attention_crossover(cfg, "qkvo"), attention_crossover(cfg, "layer")
        (8192.0, 32768.0)
    """
    if against not in ("qkvo", "layer"):
        raise ValueError(f"[attention_crossover] against {against!r} must be 'qkvo' or 'layer'")
    T = 1
    comp = _layer_matmul_fwd(cfg, T)
    mm = comp["qkvo"] if against == "qkvo" else sum(v for k, v in comp.items() if k != "head")
    per_pair = cfg.num_layers * 4 * cfg.num_heads * cfg.head_dim
    # per token: non-causal attention = per_pair * T; causal = per_pair * (T + 1) / 2
    return float(mm / per_pair) if not causal else float(2 * mm / per_pair - 1)
