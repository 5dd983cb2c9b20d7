"""Presets: real models and the book's problem models, each with its source.

Names are case-insensitive; ``names()`` lists them. The real models' fields are those of
their released ``config.json`` (or paper table), so ``param_count`` gives the checkpoint's
tensor sizes.

Example:
    >>> from shardlab.models import presets
    >>> presets.get("llama3-8b").num_kv_heads
    8
    >>> "gpt2-small" in presets.names()
    True
"""

from __future__ import annotations

from .config import ModelConfig

__all__ = ["get", "names", "PRESETS"]

_LLAMA = dict(gated_mlp=True, activation="silu", norm="rmsnorm", positions="rotary")
_GPT2 = dict(gated_mlp=False, activation="gelu_tanh", norm="layernorm", positions="learned",
             qkv_bias=True, out_bias=True, mlp_bias=True, tie_embeddings=True, vocab_size=50257,
             max_seq_len=1024)
_MEGATRON = dict(gated_mlp=False, activation="gelu", norm="layernorm", positions="learned",
                 qkv_bias=True, out_bias=True, mlp_bias=True, tie_embeddings=True, vocab_size=51200,
                 max_seq_len=2048)
_HF = "Hugging Face config.json of "


def _gpt2(name, d, layers, heads):
    return ModelConfig(name=name, num_layers=layers, d_model=d, ffw_dim=4 * d, num_heads=heads,
                       norm_eps=1e-5, source=_HF + f"openai-community/{name.replace('-small', '')}", **_GPT2)


def _megatron(name, d, layers, heads):
    return ModelConfig(name=name, num_layers=layers, d_model=d, ffw_dim=4 * d, num_heads=heads,
                       source="Narayanan et al. 2021, 'Efficient Large-Scale Language Model Training "
                              "on GPU Clusters Using Megatron-LM', Table 1 (V=51200, T=2048)",
                       note="biases and a learned position table as in GPT-2/3; equals the paper's "
                            "count 12*L*D^2*(1 + 13/(12D) + (V+T)/(12LD)) plus the final "
                            "LayerNorm's 2D",
                       **_MEGATRON)


_ALL = [
    ModelConfig(name="llama2-7b", num_layers=32, d_model=4096, ffw_dim=11008, num_heads=32,
                vocab_size=32000, max_seq_len=4096, norm_eps=1e-5,
                source=_HF + "meta-llama/Llama-2-7b-hf", **_LLAMA),
    ModelConfig(name="llama2-13b", num_layers=40, d_model=5120, ffw_dim=13824, num_heads=40,
                vocab_size=32000, max_seq_len=4096, source=_HF + "meta-llama/Llama-2-13b-hf", **_LLAMA),
    ModelConfig(name="llama2-70b", num_layers=80, d_model=8192, ffw_dim=28672, num_heads=64,
                num_kv_heads=8, vocab_size=32000, max_seq_len=4096,
                source=_HF + "meta-llama/Llama-2-70b-hf", **_LLAMA),
    ModelConfig(name="llama3-8b", num_layers=32, d_model=4096, ffw_dim=14336, num_heads=32,
                num_kv_heads=8, vocab_size=128256, max_seq_len=8192, rope_theta=500000.0,
                source=_HF + "meta-llama/Meta-Llama-3-8B", **_LLAMA),
    ModelConfig(name="llama3-70b", num_layers=80, d_model=8192, ffw_dim=28672, num_heads=64,
                num_kv_heads=8, vocab_size=128256, max_seq_len=8192, rope_theta=500000.0,
                source=_HF + "meta-llama/Meta-Llama-3-70B", **_LLAMA),
    ModelConfig(name="llama3-405b", num_layers=126, d_model=16384, ffw_dim=53248, num_heads=128,
                num_kv_heads=8, vocab_size=128256, max_seq_len=131072, rope_theta=500000.0,
                source=_HF + "meta-llama/Llama-3.1-405B", **_LLAMA),
    _gpt2("gpt2-small", 768, 12, 12),
    _gpt2("gpt2-medium", 1024, 24, 16),
    _gpt2("gpt2-large", 1280, 36, 20),
    _gpt2("gpt2-xl", 1600, 48, 25),
    ModelConfig(name="gpt3-175b", num_layers=96, d_model=12288, ffw_dim=4 * 12288, num_heads=96,
                source="Brown et al. 2020, 'Language Models are Few-Shot Learners', Table 2.1 "
                       "(n_layers 96, d_model 12288, n_heads 96, d_head 128, n_ctx 2048; GPT-2 "
                       "vocabulary and layout)",
                **{**_GPT2, "max_seq_len": 2048}),
    _megatron("megatron-22b", 6144, 48, 64),
    _megatron("megatron-175b", 12288, 96, 96),
    _megatron("megatron-530b", 20480, 105, 128),
    _megatron("megatron-1t", 25600, 128, 160),
    ModelConfig(name="mixtral-8x7b", num_layers=32, d_model=4096, ffw_dim=14336, num_heads=32,
                num_kv_heads=8, vocab_size=32000, max_seq_len=32768, rope_theta=1e6,
                num_experts=8, top_k=2, source=_HF + "mistralai/Mixtral-8x7B-v0.1", **_LLAMA),
    ModelConfig(name="deepseek-v3", num_layers=61, d_model=7168, ffw_dim=18432, num_heads=128,
                num_kv_heads=2, head_dim=128, vocab_size=129280, max_seq_len=4096,
                num_experts=256, top_k=8, num_shared_experts=1, expert_ffw_dim=2048,
                first_dense_layers=3, router_bias=True,
                source=_HF + "deepseek-ai/DeepSeek-V3 (hidden 7168, 61 layers, 3 dense layers "
                       "F=18432, 256 routed + 1 shared experts F=2048, top-8, V=129280); "
                       "DeepSeek-V3 technical report (671B total, 37B active)",
                note="approximation: Multi-head Latent Attention is modelled as GQA with N=128, K=2, "
                     "H=128 (2KH=512 cached values per token and layer vs MLA's 576); attention "
                     "params are 2D(N+K)H=238.6M per layer vs MLA's 187.1M, so the counts come out "
                     "high: 674.2B total (671B released) and 40.7B active (37B reported); the "
                     "multi-token-prediction module is not counted",
                **_LLAMA),
    ModelConfig(name="book-part4-q1", num_layers=64, d_model=4096, ffw_dim=4 * 4096, num_heads=32,
                vocab_size=32000, source="How to Scale Your Model, part 4 (Transformer Math), "
                "question 1: D=4096, F=4D, V=32000, L=64, MHA with N*H=D (H=128 chosen)",
                note="the book leaves N and H free with N*H=D; counts do not depend on the split",
                **_LLAMA),
    ModelConfig(name="book-part5-llama2-13b", num_layers=40, d_model=5120, ffw_dim=13824,
                num_heads=40, vocab_size=32000, max_seq_len=4096,
                source="How to Scale Your Model, part 5 (Training), the section's base model: "
                       "LLaMA-2 13B (separate embedding and output matrices, gated MLP)", **_LLAMA),
    ModelConfig(name="book-part7-model", num_layers=64, d_model=4096, ffw_dim=16384, num_heads=32,
                num_kv_heads=8, head_dim=256, vocab_size=32128, tie_embeddings=True,
                source="How to Scale Your Model, part 7 (Inference), the invented model: L=64, "
                       "D=4096, F=16384, N=32, K=8, H=256, V=32128, shared input/output embeddings",
                **_LLAMA),
]

PRESETS: dict[str, ModelConfig] = {c.name: c for c in _ALL}


def names() -> list[str]:
    """Preset names, e.g. ``['llama2-7b', ..., 'book-part7-model']``."""
    return list(PRESETS)


def get(name: str) -> ModelConfig:
    """The preset called ``name`` (case-insensitive; ``_`` and ``.`` read as ``-``).

    Raises:
        ValueError: unknown name; the message lists the presets.
    """
    if isinstance(name, ModelConfig):
        return name
    key = str(name).lower().replace("_", "-").replace(" ", "-")
    key = {"llama-2-7b": "llama2-7b", "llama-3-8b": "llama3-8b", "gpt2": "gpt2-small",
           "llama3.1-405b": "llama3-405b", "mixtral": "mixtral-8x7b"}.get(key, key)
    if key not in PRESETS:
        raise ValueError(f"[presets.get] unknown model {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[key]
