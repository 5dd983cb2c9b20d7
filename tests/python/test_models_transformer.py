"""shardlab.models.transformer: params hold exactly param_count elements, the ledger of a
forward pass records exactly flops_per_token x tokens, and the batch-sharded forward on 8
virtual devices equals the plain run."""

import numpy as np
import pytest

import shardlab as sl
from shardlab import P
from shardlab.models import ModelConfig, flops_per_token, param_count, presets, transformer
from shardlab.models import ops

CONFIGS = {
    "gqa-rmsnorm": ModelConfig(num_layers=2, d_model=64, ffw_dim=96, num_heads=4, num_kv_heads=2,
                               vocab_size=50),
    "mqa-untied": ModelConfig(num_layers=1, d_model=32, ffw_dim=64, num_heads=4, num_kv_heads=1,
                              head_dim=16, vocab_size=40),
    "gpt2-like": presets.get("gpt2-small").replace(num_layers=2, d_model=48, num_heads=4, ffw_dim=192,
                                                   vocab_size=60, max_seq_len=16),
    "neox-like": ModelConfig(num_layers=2, d_model=32, ffw_dim=128, num_heads=2, vocab_size=30,
                             gated_mlp=False, activation="gelu", norm="layernorm", qkv_bias=True,
                             out_bias=True, mlp_bias=True, rotary_fraction=0.25,
                             parallel_residual=True),
    "moe": ModelConfig(num_layers=2, d_model=32, ffw_dim=64, num_heads=4, num_kv_heads=2,
                       vocab_size=40, num_experts=4, top_k=2, num_shared_experts=1,
                       expert_ffw_dim=16, first_dense_layers=1, router_bias=True),
    "moe-dropping": ModelConfig(num_layers=1, d_model=32, ffw_dim=32, num_heads=2, vocab_size=20,
                                num_experts=4, top_k=1, capacity_factor=0.5, mlp_bias=True),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_params_hold_param_count_elements(name, dtype):
    cfg = CONFIGS[name]
    params = transformer.init_params(cfg, seed=1, dtype=dtype)
    assert transformer.num_elements(params) == param_count(cfg).total
    assert params["embed"].dtype == (np.float32 if dtype == "float32" else sl.numpy.bfloat16)


def _sharded_forward(cfg, params, tokens, mesh):
    f = sl.shard_map(lambda p, t: transformer.forward(p, t, cfg), mesh=mesh,
                     in_specs=(P(), P("x")), out_specs=P("x"))
    with sl.Ledger() as ledger:
        out = f(params, tokens)
    return np.asarray(out), ledger


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_forward_ledger_equals_flops_per_token(name):
    cfg = CONFIGS[name]
    T, B = 16, 8
    params = transformer.init_params(cfg, seed=0)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (B, T))
    mesh = sl.make_mesh((8,), ("x",))
    out, ledger = _sharded_forward(cfg, params, tokens, mesh)
    measured = sum(e["flops"] * e["num_groups"] for e in ledger.events)
    f = flops_per_token(cfg, T, causal=True, training=False)
    assert measured == f.for_tokens(B) == f.forward * T * B
    attn = sum(e["flops"] * e["num_groups"] for e in ledger.events if e["op"] == "attention")
    assert attn == f.forward_attention * T * B
    # the plain run computes the same numbers
    ref = transformer.forward(params, tokens, cfg)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_forward_on_one_device_mesh_matches_too():
    cfg = CONFIGS["gqa-rmsnorm"]
    params = transformer.init_params(cfg, seed=3)
    tokens = np.random.default_rng(3).integers(0, cfg.vocab_size, (2, 24))
    f = sl.shard_map(lambda p, t: transformer.forward(p, t, cfg), mesh=sl.make_mesh((1,), ("x",)),
                     in_specs=(P(), P()), out_specs=P())
    with sl.Ledger() as ledger:
        f(params, tokens)
    assert sum(e["flops"] for e in ledger.events) == flops_per_token(cfg, 24, training=False).for_tokens(2)


def _reference_dense(params, tokens, cfg):
    """A float64 numpy transformer with materialised softmax, for the dense llama-like layout."""
    x = params["embed"].astype(np.float64)[tokens]
    B, T, D = x.shape
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

    def rms(p, x):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps) * p["scale"]

    def rope(x):
        half = H // 2
        inv = 1.0 / (cfg.rope_theta ** (np.arange(half) * 2.0 / H))
        ang = np.outer(np.arange(T), inv)[None, :, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)], -1)

    for layer in params["layers"]:
        a = layer["attn"]
        h = rms(layer["attn_norm"], x)
        q = rope((h @ a["wq"]).reshape(B, T, N, H))
        k = np.repeat(rope((h @ a["wk"]).reshape(B, T, K, H)), N // K, axis=2)
        v = np.repeat((h @ a["wv"]).reshape(B, T, K, H), N // K, axis=2)
        s = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(H)
        s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        x = x + np.einsum("bnts,bsnh->btnh", w, v).reshape(B, T, N * H) @ a["wo"]
        m = layer["mlp"]
        h = rms(layer["mlp_norm"], x)
        g = h @ m["w_gate"]
        x = x + (g / (1 + np.exp(-g)) * (h @ m["w_up"])) @ m["w_down"]
    return rms(params["final_norm"], x) @ params["head"]


def test_forward_matches_float64_reference():
    cfg = CONFIGS["gqa-rmsnorm"]
    params = transformer.init_params(cfg, seed=5)
    params["layers"][0]["attn_norm"]["scale"] = np.linspace(0.5, 1.5, cfg.d_model).astype(np.float32)
    tokens = np.random.default_rng(5).integers(0, cfg.vocab_size, (2, 12))
    got = transformer.forward(params, tokens, cfg)
    ref = _reference_dense({k: v for k, v in params.items()}, tokens, cfg)
    np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-5)


def test_moe_routes_top_k_and_drops_beyond_capacity():
    cfg = CONFIGS["moe-dropping"]  # capacity 0.5 * 1 * T / 4 slots per expert
    params = transformer.init_params(cfg, seed=2)
    moe = params["layers"][0]["moe"]
    # route every token to expert 0: only its first C tokens get an expert output
    moe["router"] = np.zeros_like(moe["router"])
    moe["router"][:, 0] = 1.0
    x = np.abs(np.random.default_rng(2).standard_normal((1, 16, cfg.d_model))).astype(np.float32)
    from shardlab.models.moe import moe_mlp
    y = moe_mlp(moe, x, cfg)
    C = cfg.expert_capacity(16)
    assert C == 2
    assert np.all(np.abs(y[0, :C]).sum(-1) > 0) and np.all(y[0, C:] == 0)


def test_loss_is_cross_entropy():
    cfg = CONFIGS["mqa-untied"]
    params = transformer.init_params(cfg, seed=0)
    tok = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 8))
    logits = transformer.forward(params, tok, cfg).astype(np.float64)
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    ref = np.mean(lse - np.take_along_axis(logits, tok[..., None], -1)[..., 0])
    assert abs(float(transformer.loss(params, tok, tok, cfg)) - ref) < 1e-5


def test_ops():
    x = np.random.default_rng(0).integers(0, 3, (2, 9, 3))
    np.testing.assert_array_equal(ops.cumsum(x, axis=1), np.cumsum(x, axis=1))
    s = np.random.default_rng(1).standard_normal((5, 7))
    vals, idx = ops.top_k(s, 3)
    np.testing.assert_array_equal(np.stack(idx, -1), np.argsort(-s, -1)[:, :3])
    np.testing.assert_allclose(np.stack(vals, -1), -np.sort(-s, -1)[:, :3])


def test_bad_tokens_and_dtype():
    cfg = CONFIGS["gpt2-like"]
    params = transformer.init_params(cfg)
    with pytest.raises(ValueError, match=r"\[forward\] sequence length 20 exceeds max_seq_len 16"):
        transformer.forward(params, np.zeros((1, 20), int), cfg)
    with pytest.raises(ValueError, match=r"\[forward\] tokens must be \[batch, seq\]"):
        transformer.forward(params, np.zeros(5, int), cfg)
    with pytest.raises(ValueError, match=r"\[init_params\] dtype 'int8'"):
        transformer.init_params(cfg, dtype="int8")


@pytest.mark.parametrize("name", ["gqa-rmsnorm", "gpt2-like", "neox-like", "mqa-untied"])
def test_backward_ledger_equals_flops_per_token(name):
    """With shardlab.grad: the backward pass's recorded FLOPs are flops_per_token's backward
    (every matmul twice its forward, attention the FlashAttention-2 backward's 10H per pair)."""
    cfg = CONFIGS[name]
    T, B = 16, 8
    params = transformer.init_params(cfg, seed=0)
    rng = np.random.default_rng(0)
    tokens, targets = rng.integers(0, cfg.vocab_size, (B, T)), rng.integers(0, cfg.vocab_size, (B, T))
    mesh = sl.make_mesh((8,), ("x",))
    f = sl.shard_map(lambda p, t, y: sl.lax.pmean(transformer.loss(p, t, y, cfg), "x"), mesh=mesh,
                     in_specs=(P(), P("x"), P("x")), out_specs=P())
    with sl.Ledger() as ledger:
        grads = sl.grad(lambda p: sl.numpy.sum(f(p, tokens, targets)))(params)
    flops = flops_per_token(cfg, T, causal=True, training=True, attention_backward="flash")
    fwd = sum(e["flops"] * e["num_groups"] for e in ledger.events if e["phase"] == "forward")
    bwd = sum(e["flops"] * e["num_groups"] for e in ledger.events if e["phase"] == "backward")
    assert fwd == flops.forward * T * B
    assert bwd == flops.backward * T * B
    assert bwd == 2 * flops.forward_matmul * T * B + 10 / 4 * flops.forward_attention * T * B
    assert transformer.num_elements(grads) == param_count(cfg).total
