"""``ModelConfig``: the shape of a decoder-only transformer, in the book's letters.

The book (part 4) writes a transformer with L layers, model width D, MLP width F, N query
heads, K key/value heads of width H, and a vocabulary V. A ``ModelConfig`` holds those and the
architectural choices that change the parameter count or the FLOPs: gated (3 matrices) or plain
(2 matrices) MLP, LayerNorm (weight + bias) or RMSNorm (weight), biases, learned or rotary
positions, tied or untied embeddings, and the mixture-of-experts fields (E experts, top-k,
shared experts, capacity factor, how many leading layers stay dense).

Example:
    >>> from shardlab.models import ModelConfig
    >>> cfg = ModelConfig(num_layers=2, d_model=256, ffw_dim=1024, num_heads=4, vocab_size=1000)
    >>> cfg.num_kv_heads, cfg.head_dim, cfg.attention_kind
    (4, 64, 'MHA')
    >>> cfg.replace(num_kv_heads=1).attention_kind
    'MQA'
"""

from __future__ import annotations

import dataclasses
import math

__all__ = ["ModelConfig"]

_NORMS = ("rmsnorm", "layernorm")
_POSITIONS = ("rotary", "learned", "none")
_ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "relu")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer (dense or mixture-of-experts).

    Attributes:
        num_layers: L, transformer blocks.
        d_model: D, the residual stream width.
        ffw_dim: F, the hidden width of a dense MLP.
        num_heads: N, query heads.
        vocab_size: V.
        num_kv_heads: K, key/value heads (N = MHA, 1 = MQA, in between = GQA); defaults to N.
        head_dim: H; defaults to D / N (then N must divide D).
        max_seq_len: the longest sequence (the size of a learned position table).
        gated_mlp: True for SwiGLU/GeGLU (W_in1, W_in2, W_out: 3 matrices), False for a plain
            2-matrix MLP.
        activation: "silu", "gelu", "gelu_tanh" or "relu".
        norm: "rmsnorm" (a weight of D) or "layernorm" (weight and bias, 2D).
        qkv_bias, out_bias, mlp_bias: biases on the Q/K/V projections, the output projection
            and the MLP matrices.
        positions: "rotary", "learned" (a [max_seq_len, D] table) or "none".
        rotary_fraction: the share of each head's dims that rotary rotates (GPT-NeoX: 0.25).
        rope_theta: rotary base.
        tie_embeddings: the output head reuses the input embedding.
        parallel_residual: attention and MLP read the same input (GPT-NeoX, GPT-J).
        num_experts: E routed experts (0 = dense model).
        top_k: k experts per token.
        num_shared_experts: experts every token passes through (DeepSeek).
        expert_ffw_dim: F of one expert; defaults to ffw_dim.
        capacity_factor: slots per expert = ceil(capacity_factor * k * T / E) per sequence of
            T tokens; a token beyond its expert's capacity is dropped (GShard/Switch).
        first_dense_layers: how many leading layers use a dense MLP in an MoE model.
        router_bias: the router has a per-expert bias (DeepSeek-V3's score correction).
        norm_eps: epsilon of the norms.
        name: a label.
        source: where the numbers come from (presets cite one).
        note: a caveat (e.g. an approximation), shown with the config.
    """

    num_layers: int
    d_model: int
    ffw_dim: int
    num_heads: int
    vocab_size: int
    num_kv_heads: int | None = None
    head_dim: int | None = None
    max_seq_len: int = 2048
    gated_mlp: bool = True
    activation: str = "silu"
    norm: str = "rmsnorm"
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    positions: str = "rotary"
    rotary_fraction: float = 1.0
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    parallel_residual: bool = False
    num_experts: int = 0
    top_k: int = 0
    num_shared_experts: int = 0
    expert_ffw_dim: int | None = None
    capacity_factor: float = 1.0
    first_dense_layers: int = 0
    router_bias: bool = False
    norm_eps: float = 1e-5
    name: str = ""
    source: str = ""
    note: str = ""

    def __post_init__(self):
        op = "ModelConfig"
        for f in ("num_layers", "d_model", "ffw_dim", "num_heads", "vocab_size", "max_seq_len"):
            _check_int(op, f, getattr(self, f), minimum=1)
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        _check_int(op, "num_kv_heads", self.num_kv_heads, minimum=1)
        if self.head_dim is None:
            if self.d_model % self.num_heads:
                raise ValueError(
                    f"[{op}] num_heads {self.num_heads} does not divide d_model {self.d_model}; "
                    f"pass head_dim explicitly (e.g. head_dim={max(1, self.d_model // self.num_heads)}) "
                    f"or choose num_heads dividing {self.d_model}")
            object.__setattr__(self, "head_dim", self.d_model // self.num_heads)
        _check_int(op, "head_dim", self.head_dim, minimum=1)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"[{op}] num_kv_heads {self.num_kv_heads} does not divide num_heads {self.num_heads}; "
                f"grouped-query attention needs num_heads to be a multiple of num_kv_heads")
        for f, allowed in (("norm", _NORMS), ("positions", _POSITIONS), ("activation", _ACTIVATIONS)):
            if getattr(self, f) not in allowed:
                raise ValueError(f"[{op}] {f} {getattr(self, f)!r} is not one of {', '.join(allowed)}")
        if not 0.0 < self.rotary_fraction <= 1.0:
            raise ValueError(f"[{op}] rotary_fraction {self.rotary_fraction} must be in (0, 1]")
        if self.positions == "rotary" and self.rotary_dim % 2:
            raise ValueError(f"[{op}] rotary dims {self.rotary_dim} (head_dim {self.head_dim} x "
                             f"rotary_fraction {self.rotary_fraction}) must be even")
        for f in ("num_experts", "top_k", "num_shared_experts", "first_dense_layers"):
            _check_int(op, f, getattr(self, f), minimum=0)
        if self.expert_ffw_dim is not None:
            _check_int(op, "expert_ffw_dim", self.expert_ffw_dim, minimum=1)
        if self.num_experts:
            if self.top_k < 1:
                raise ValueError(f"[{op}] top_k {self.top_k} must be >= 1 when num_experts is "
                                 f"{self.num_experts}")
            if self.top_k > self.num_experts:
                raise ValueError(f"[{op}] top_k {self.top_k} exceeds num_experts {self.num_experts}; "
                                 f"a token can use at most every expert once")
            if self.first_dense_layers > self.num_layers:
                raise ValueError(f"[{op}] first_dense_layers {self.first_dense_layers} exceeds "
                                 f"num_layers {self.num_layers}")
        elif self.top_k or self.num_shared_experts or self.router_bias:
            raise ValueError(f"[{op}] top_k {self.top_k} / num_shared_experts "
                             f"{self.num_shared_experts} / router_bias need num_experts > 0")
        if not (isinstance(self.capacity_factor, (int, float)) and self.capacity_factor > 0):
            raise ValueError(f"[{op}] capacity_factor {self.capacity_factor!r} must be a number > 0")

    # -- derived sizes -----------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attention_kind(self) -> str:
        """"MHA" (K = N), "MQA" (K = 1) or "GQA"."""
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    @property
    def group_size(self) -> int:
        """G = N / K, query heads per key/value head."""
        return self.num_heads // self.num_kv_heads

    @property
    def rotary_dim(self) -> int:
        return int(round(self.head_dim * self.rotary_fraction))

    @property
    def moe_ffw_dim(self) -> int:
        return self.expert_ffw_dim if self.expert_ffw_dim is not None else self.ffw_dim

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    def is_moe_layer(self, layer: int) -> bool:
        return self.is_moe and layer >= self.first_dense_layers

    @property
    def mlp_matrices(self) -> int:
        """3 for a gated MLP, 2 for a plain one."""
        return 3 if self.gated_mlp else 2

    def expert_capacity(self, tokens: int) -> int:
        """Slots per expert for a group of ``tokens`` tokens: ceil(cf * k * T / E), at most T."""
        if not self.is_moe:
            return 0
        c = math.ceil(self.capacity_factor * self.top_k * tokens / self.num_experts - 1e-9)
        return max(1, min(tokens, c))

    def replace(self, **changes) -> "ModelConfig":
        """A copy with some fields changed (validated again). ``head_dim`` is re-derived when
        ``d_model`` or ``num_heads`` change and ``head_dim`` is not given."""
        if ("d_model" in changes or "num_heads" in changes) and "head_dim" not in changes:
            if self.head_dim == self.d_model // self.num_heads:
                changes["head_dim"] = None
        if "num_heads" in changes and "num_kv_heads" not in changes and self.num_kv_heads == self.num_heads:
            changes["num_kv_heads"] = None
        return dataclasses.replace(self, **changes)

    def summary(self) -> str:
        """One line in the book's letters."""
        s = (f"{self.name or 'model'}: L={self.num_layers} D={self.d_model} F={self.ffw_dim} "
             f"N={self.num_heads} K={self.num_kv_heads} H={self.head_dim} V={self.vocab_size} "
             f"({self.attention_kind}, {'gated' if self.gated_mlp else 'plain'} MLP, {self.norm}, "
             f"{self.positions} positions, {'tied' if self.tie_embeddings else 'untied'})")
        if self.is_moe:
            s += (f" MoE E={self.num_experts} k={self.top_k} shared={self.num_shared_experts} "
                  f"F_expert={self.moe_ffw_dim} dense layers={self.first_dense_layers}")
        return s


def _check_int(op: str, field: str, value, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"[{op}] {field} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"[{op}] {field} {value} must be >= {minimum}")
