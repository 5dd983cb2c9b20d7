"""``config_from_hf``: a ``ModelConfig`` from a Hugging Face ``config.json`` (dict or path).

No network: pass the parsed dict or the path of a ``config.json`` file. Model types: llama,
mistral, mixtral, qwen2, gemma, gpt2, gpt_neox. Also reachable as ``ModelConfig.from_hf``.

Example:
    >>> from shardlab.models import ModelConfig, param_count
    >>> gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
    ...         "vocab_size": 50257, "n_positions": 1024}
    >>> param_count(ModelConfig.from_hf(gpt2)).total
    124439808
"""

from __future__ import annotations

import json
import os

from .config import ModelConfig

__all__ = ["config_from_hf", "SUPPORTED_MODEL_TYPES"]

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "gemma", "gpt2", "gpt_neox")


def _need(d: dict, key: str, model_type: str):
    if key not in d:
        raise ValueError(f"[from_hf] a {model_type} config needs the field {key!r}; it has "
                         f"{', '.join(sorted(d))}")
    return d[key]


def _llama_like(d: dict, mt: str) -> dict:
    n = _need(d, "num_attention_heads", mt)
    D = _need(d, "hidden_size", mt)
    act = d.get("hidden_act", d.get("hidden_activation", "silu"))
    kw = dict(
        num_layers=_need(d, "num_hidden_layers", mt), d_model=D,
        ffw_dim=_need(d, "intermediate_size", mt), num_heads=n,
        num_kv_heads=d.get("num_key_value_heads") or n,
        head_dim=d.get("head_dim") or None, vocab_size=_need(d, "vocab_size", mt),
        max_seq_len=d.get("max_position_embeddings", 2048), gated_mlp=True,
        activation="silu" if act in ("silu", "swish") else "gelu_tanh" if "tanh" in act or act == "gelu_pytorch_tanh" else "gelu",
        norm="rmsnorm", positions="rotary", rope_theta=float(d.get("rope_theta", 10000.0)),
        tie_embeddings=bool(d.get("tie_word_embeddings", mt == "gemma")),
        norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        qkv_bias=bool(d.get("attention_bias", mt == "qwen2")), out_bias=bool(d.get("attention_bias", False)),
        mlp_bias=bool(d.get("mlp_bias", False)))
    if mt == "mixtral":
        kw.update(num_experts=_need(d, "num_local_experts", mt), top_k=_need(d, "num_experts_per_tok", mt))
    return kw


def _gpt2(d: dict, mt: str) -> dict:
    D = _need(d, "n_embd", mt)
    return dict(num_layers=_need(d, "n_layer", mt), d_model=D, ffw_dim=d.get("n_inner") or 4 * D,
                num_heads=_need(d, "n_head", mt), vocab_size=_need(d, "vocab_size", mt),
                max_seq_len=d.get("n_positions", 1024), gated_mlp=False, activation="gelu_tanh",
                norm="layernorm", positions="learned", qkv_bias=True, out_bias=True, mlp_bias=True,
                tie_embeddings=bool(d.get("tie_word_embeddings", True)),
                norm_eps=float(d.get("layer_norm_epsilon", 1e-5)))


def _neox(d: dict, mt: str) -> dict:
    return dict(num_layers=_need(d, "num_hidden_layers", mt), d_model=_need(d, "hidden_size", mt),
                ffw_dim=_need(d, "intermediate_size", mt), num_heads=_need(d, "num_attention_heads", mt),
                vocab_size=_need(d, "vocab_size", mt), max_seq_len=d.get("max_position_embeddings", 2048),
                gated_mlp=False, activation="gelu", norm="layernorm", positions="rotary",
                rotary_fraction=float(d.get("rotary_pct", 0.25)),
                rope_theta=float(d.get("rotary_emb_base", d.get("rope_theta", 10000.0))),
                qkv_bias=bool(d.get("attention_bias", True)), out_bias=bool(d.get("attention_bias", True)),
                mlp_bias=True, tie_embeddings=bool(d.get("tie_word_embeddings", False)),
                parallel_residual=bool(d.get("use_parallel_residual", True)),
                norm_eps=float(d.get("layer_norm_eps", 1e-5)))


_READERS = {"llama": _llama_like, "mistral": _llama_like, "mixtral": _llama_like,
            "qwen2": _llama_like, "gemma": _llama_like, "gpt2": _gpt2, "gpt_neox": _neox}


def config_from_hf(config, *, name: str | None = None) -> ModelConfig:
    """Reads a Hugging Face ``config.json`` (a dict, or the path of the file).

    Args:
        config: the parsed dict or a path to ``config.json``.
        name: a label (defaults to ``_name_or_path`` or the model type).

    Returns:
        The :class:`ModelConfig`; its ``source`` says it came from a config.json.

    Raises:
        ValueError: unknown or missing ``model_type``, or a missing field (named).
    """
    path = None
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
        except OSError as e:
            raise ValueError(f"[from_hf] cannot read {path!r}: {e.strerror}; pass a config.json "
                             f"path or the parsed dict") from None
    if not isinstance(config, dict):
        raise TypeError(f"[from_hf] expected a dict or a path, got {type(config).__name__}")
    mt = config.get("model_type")
    if mt not in _READERS:
        raise ValueError(f"[from_hf] unknown model_type {mt!r}; supported: "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)} (build others with ModelConfig(...))")
    kw = _READERS[mt](config, mt)
    label = name or config.get("_name_or_path") or mt
    return ModelConfig(name=label, source=f"config.json ({path or 'dict'}, model_type {mt})", **kw)


def _from_hf(cls, config, *, name: str | None = None) -> ModelConfig:
    """``ModelConfig.from_hf(dict_or_path)``: see :func:`config_from_hf`."""
    return config_from_hf(config, name=name)


# The config class stays free of file and format knowledge; this module gives it the reader.
ModelConfig.from_hf = classmethod(_from_hf)
