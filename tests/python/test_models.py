"""shardlab.models calculators: exact parameter counts of released checkpoints, the HF reader,
FLOP/KV/memory/MFU formulas against independent arithmetic, and bad input."""

import json

import numpy as np
import pytest

import shardlab as sl
from shardlab import P
from shardlab.models import (ModelConfig, attention_crossover, flops_per_token, kv_cache_bytes, mfu,
                             moe_compute_bound_batch, param_count, presets, step_time_lower_bound,
                             training_memory, transformer)

# Released checkpoints: the sum of the tensor sizes in their safetensors index / model cards.
RELEASED = {
    "llama2-7b": 6_738_415_616, "llama2-13b": 13_015_864_320, "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496, "llama3-405b": 405_853_388_800,
    "gpt2-small": 124_439_808, "gpt2-medium": 354_823_168, "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200, "mixtral-8x7b": 46_702_792_704,
}

# Public config.json files (fields as released).
HF = {
    "llama2-7b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
                  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
                  "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
                  "tie_word_embeddings": False, "hidden_act": "silu"},
    "mistral-7b": {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                   "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
                   "vocab_size": 32000, "max_position_embeddings": 32768, "tie_word_embeddings": False},
    "mixtral-8x7b": {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
                     "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
                     "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
                     "tie_word_embeddings": False},
    "qwen2-7b": {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
                 "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
                 "vocab_size": 152064, "tie_word_embeddings": False},
    "gemma-7b": {"model_type": "gemma", "hidden_size": 3072, "intermediate_size": 24576,
                 "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 16,
                 "head_dim": 256, "vocab_size": 256000, "hidden_act": "gelu"},
    "gpt2": {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024,
             "vocab_size": 50257},
    "pythia-160m": {"model_type": "gpt_neox", "hidden_size": 768, "intermediate_size": 3072,
                    "num_attention_heads": 12, "num_hidden_layers": 12, "vocab_size": 50304,
                    "rotary_pct": 0.25, "use_parallel_residual": True, "tie_word_embeddings": False},
}
HF_RELEASED = {"llama2-7b": 6_738_415_616, "mistral-7b": 7_241_732_096,
               "mixtral-8x7b": 46_702_792_704, "qwen2-7b": 7_615_616_512,
               "gemma-7b": 8_537_680_896, "gpt2": 124_439_808, "pythia-160m": 162_322_944}


@pytest.mark.parametrize("name", sorted(RELEASED))
def test_preset_param_counts_equal_released_checkpoints(name):
    assert param_count(presets.get(name)).total == RELEASED[name]


@pytest.mark.parametrize("name", sorted(HF))
def test_from_hf_counts_equal_released_checkpoints(name, tmp_path):
    assert param_count(ModelConfig.from_hf(HF[name])).total == HF_RELEASED[name]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF[name]))
    assert param_count(ModelConfig.from_hf(str(path))).total == HF_RELEASED[name]
    assert param_count(ModelConfig.from_hf(tmp_path)).total == HF_RELEASED[name]


def test_mixtral_active_and_breakdown_sum():
    p = param_count(presets.get("mixtral-8x7b"))
    assert p.active == 12_879_925_248
    assert sum(p.parts.values()) == p.total
    assert p.experts == 32 * 8 * 3 * 4096 * 14336 and p.router == 32 * 4096 * 8


def test_megatron_matches_paper_formula():
    for name in ("megatron-22b", "megatron-175b", "megatron-530b", "megatron-1t"):
        c = presets.get(name)
        L, h, V, s = c.num_layers, c.d_model, c.vocab_size, c.max_seq_len
        paper = 12 * L * h * h + 13 * L * h + (V + s) * h  # Narayanan et al. eq. (3) expanded
        assert param_count(c).total == paper + 2 * h
    assert round(param_count(presets.get("megatron-1t")).total / 1e12, 2) == 1.01


def test_deepseek_v3_approximation_is_stated_and_close():
    c = presets.get("deepseek-v3")
    assert "approximation" in c.note and "MLA" in c.note
    p = param_count(c)
    assert 665e9 < p.total < 680e9 and 36e9 < p.active < 42e9


def test_every_preset_has_a_source_and_renders():
    for name in presets.names():
        c = presets.get(name)
        assert c.source, name
        p = param_count(c)
        assert "total" in str(p) and "<table" in p._repr_html_() and p.formula


def test_book_part7_model_matches_its_answer():
    # part 7 question 1: tied embeddings, 2 x K x H x L bytes of int8 KV cache per token
    c = presets.get("book-part7-model")
    p = param_count(c)
    expected = 4096 * 32128 + 64 * (3 * 4096 * 16384 + 2 * 4096 * (32 + 8) * 256 + 2 * 4096) + 4096
    assert p.total == expected
    assert kv_cache_bytes(c, 1, "int8").total == 2 * 8 * 256 * 64


def test_flops_per_token_matmul_is_six_params():
    """Training matmul FLOPs = 6 x the weights used in matmuls (no embeddings, norms, biases)."""
    for name in ("llama2-7b", "llama3-8b", "gpt2-small", "book-part7-model"):
        c = presets.get(name)
        D, L = c.d_model, c.num_layers
        weights = L * 2 * D * (c.num_heads + c.num_kv_heads) * c.head_dim + L * c.mlp_matrices * D * c.ffw_dim
        weights += c.vocab_size * D
        assert flops_per_token(c, 2048, training=True).matmul == 6 * weights, name


def test_causal_attention_counts_exact_pairs():
    c = ModelConfig(num_layers=3, d_model=64, ffw_dim=128, num_heads=4, vocab_size=10)
    T = 37
    f = flops_per_token(c, T, causal=True, training=False)
    assert f.extra["per_sequence"] - 37 * (f.forward_matmul) == 3 * 4 * 64 * T * (T + 1) // 2
    g = flops_per_token(c, T, causal=False, training=True)
    assert g.forward_attention == 3 * 4 * 64 * T
    assert g.backward_attention == 2 * g.forward_attention and g.backward_matmul == 2 * g.forward_matmul
    assert flops_per_token(c, T, causal=False, attention_backward="flash").backward_attention == 2.5 * g.forward_attention


def test_remat_policies():
    c = presets.get("book-part4-q1")
    base = flops_per_token(c, 4096, causal=False)
    att = flops_per_token(c, 4096, causal=False, remat="attention")
    full = flops_per_token(c, 4096, causal=False, remat="full")
    assert base.remat == 0
    assert att.remat == att.forward_attention == 64 * 4 * 4096 * 4096  # 4 B T^2 N H per token x L
    assert full.remat == full.forward - full.extra["fwd_head"]


def test_attention_crossover_book_rules():
    c = presets.get("book-part4-q1")
    assert attention_crossover(c, "qkvo") == 2 * c.d_model
    assert attention_crossover(c, "layer") == 8 * c.d_model
    T = attention_crossover(c, "qkvo", causal=True)
    f = flops_per_token(c, int(T), causal=True)
    assert f.forward_attention == f.extra["fwd_qkvo"]


def test_kv_cache_bytes():
    c = ModelConfig(num_layers=64, d_model=8192, ffw_dim=8, num_heads=64, vocab_size=8)
    assert kv_cache_bytes(c, 8192, "int8").total == 8 * 2**30  # the book's 8 GiB
    assert kv_cache_bytes(presets.get("llama3-8b"), 100, "bf16", batch=3).total == 2 * 3 * 100 * 32 * 8 * 128 * 2


def test_mfu_deepseek():
    u = mfu(37e9, tokens_per_s=14.8e12 / (2.79e6 * 3600), hardware=1.513e15, chips=1)
    assert abs(u.total - 6 * 37e9 * 14.8e12 / (2.79e6 * 3600 * 1.513e15)) < 1e-12
    h = mfu(presets.get("llama2-7b"), 1e6, "h100", 1000)
    assert abs(h.total - flops_per_token(presets.get("llama2-7b"), 4096).matmul * 1e6 / (1000 * 9.89e14)) < 1e-12


def test_moe_compute_bound_batch():
    v5e = sl.hardware.get("tpu-v5e")
    b = moe_compute_bound_batch(256, "tpu-v5e", top_k=8)
    assert abs(b - v5e.peak("bfloat16") / v5e.hbm_bandwidth / 2 * 256 / 8) < 1e-9
    assert moe_compute_bound_batch(presets.get("mixtral-8x7b"), "tpu-v5e", weight_dtype="bfloat16") == pytest.approx(
        v5e.peak("bfloat16") / v5e.hbm_bandwidth * 4)


def test_step_time_lower_bound_terms():
    c = presets.get("llama2-7b")
    t = step_time_lower_bound(c, 1_000_000, "tpu-v5e", 256, context=4096)
    f = flops_per_token(c, 4096)
    assert t.compute == pytest.approx(f.total * 1e6 / (256 * 1.97e14))
    assert t.total == max(t.compute, t.hbm)


def test_training_memory_shards_like_device_put():
    """params/grads/optimizer per device equal the bytes a real sharded pytree holds."""
    cfg = ModelConfig(num_layers=2, d_model=64, ffw_dim=128, num_heads=4, vocab_size=128, norm="rmsnorm")
    params = transformer.init_params(cfg, seed=0)
    mesh = sl.make_mesh((8,), ("data",))

    def spec(x):
        return P("data") if np.shape(x)[0] % 8 == 0 else P()

    def walk(t):
        if isinstance(t, dict):
            return sum(walk(v) for v in t.values())
        if isinstance(t, list):
            return sum(walk(v) for v in t)
        return sl.device_put(t, sl.NamedSharding(mesh, spec(t))).nbytes_per_device

    fp32_sharded = walk(params)  # fp32 = 4 bytes; norm scales (D=64) shard too
    m = training_memory(cfg, "fsdp", mesh, batch=8, precision="fp32", optimizer="sgd", context=16)
    assert m.params == fp32_sharded
    m1 = training_memory(cfg, "zero1", {"data": 8}, batch=8, precision="mixed", context=16)
    n = param_count(cfg).total
    assert m1.params == 2 * n and m1.grads == 2 * n and m1.optimizer == 12 * n / 8
    m2 = training_memory(cfg, "zero2", {"data": 8}, batch=8, context=16)
    assert m2.grads == 2 * n / 8
    tp = training_memory(cfg, "fsdp+tp", {"data": 2, "model": 4}, batch=8, context=16)
    assert tp.extra["data_parallel"] == 2 and tp.extra["model_parallel"] == 4
    full = training_memory(cfg, "dp", {"d": 8}, batch=8, context=16, remat="full")
    none = training_memory(cfg, "dp", {"d": 8}, batch=8, context=16)
    assert full.activations == 1 * 16 * 2 * 64 * 2 and none.activations > full.activations


# -- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    (dict(num_heads=6), r"num_heads 6 does not divide d_model 64"),
    (dict(num_kv_heads=3), r"num_kv_heads 3 does not divide num_heads 4"),
    (dict(num_experts=4, top_k=5), r"top_k 5 exceeds num_experts 4"),
    (dict(num_experts=4, top_k=0), r"top_k 0 must be >= 1"),
    (dict(d_model=-64), r"d_model -64 must be >= 1"),
    (dict(vocab_size=0), r"vocab_size 0 must be >= 1"),
    (dict(norm="batchnorm"), r"norm 'batchnorm' is not one of"),
    (dict(top_k=2), r"top_k 2 .*need num_experts > 0"),
    (dict(capacity_factor=0), r"capacity_factor 0"),
])
def test_bad_config(kwargs, match):
    base = dict(num_layers=2, d_model=64, ffw_dim=128, num_heads=4, vocab_size=10)
    with pytest.raises(ValueError, match=r"\[ModelConfig\] " + match):
        ModelConfig(**{**base, **kwargs})


def test_bad_hf_and_calls():
    with pytest.raises(ValueError, match=r"\[from_hf\] unknown model_type 'bert'"):
        ModelConfig.from_hf({"model_type": "bert"})
    with pytest.raises(ValueError, match=r"needs the field 'num_attention_heads'"):
        ModelConfig.from_hf({"model_type": "llama"})
    with pytest.raises(ValueError, match=r"cannot read"):
        ModelConfig.from_hf("/nonexistent/config.json")
    with pytest.raises(ValueError, match=r"unknown model 'gpt5'"):
        presets.get("gpt5")
    c = presets.get("gpt2-small")
    with pytest.raises(ValueError, match=r"\[flops_per_token\] context -1"):
        flops_per_token(c, -1)
    with pytest.raises(ValueError, match=r"\[kv_cache_bytes\] tokens -5"):
        kv_cache_bytes(c, -5)
    with pytest.raises(ValueError, match=r"strategy 'pp'"):
        training_memory(c, "pp", {"x": 2}, batch=2)
    with pytest.raises(ValueError, match=r"batch 3 is not divisible by the data-parallel size 2"):
        training_memory(c, "dp", {"x": 2}, batch=3)
    with pytest.raises(ValueError, match=r"mesh axis 'x' has size -2"):
        training_memory(c, "dp", {"x": -2}, batch=2)
    with pytest.raises(ValueError, match=r"unknown dtype 'int3'"):
        kv_cache_bytes(c, 1, "int3")
    with pytest.raises(ValueError, match=r"has no experts"):
        moe_compute_bound_batch(c, "tpu-v5e")
