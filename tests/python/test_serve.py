"""shardlab.serve: KV caches, sampling, and cached generation equal to recomputation."""

import numpy as np
import pytest

from shardlab.models import ModelConfig, presets, transformer
from shardlab.serve import (CacheFullError, ContiguousKVCache, PagedKVCache, Sampler, filter_logits,
                            forward_cached, generate, generate_uncached)

CONFIGS = {
    "gqa": ModelConfig(num_layers=2, d_model=32, ffw_dim=64, num_heads=4, num_kv_heads=2, vocab_size=50),
    "gpt2-like": presets.get("gpt2-small").replace(num_layers=2, d_model=32, num_heads=4, ffw_dim=64,
                                                   vocab_size=40, max_seq_len=32),
    "neox-like": ModelConfig(num_layers=1, d_model=32, ffw_dim=64, num_heads=2, vocab_size=30,
                             gated_mlp=False, activation="gelu", norm="layernorm", qkv_bias=True,
                             rotary_fraction=0.25, parallel_residual=True),
    # capacity_factor E/k: no token is dropped, so routing per step equals routing per sequence
    "moe": ModelConfig(num_layers=2, d_model=32, ffw_dim=32, num_heads=4, num_kv_heads=1, vocab_size=40,
                       num_experts=4, top_k=2, capacity_factor=2.0, num_shared_experts=1),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_cached_generation_equals_recomputation(name):
    cfg = CONFIGS[name]
    params = transformer.init_params(cfg, seed=3)
    prompt = np.random.default_rng(1).integers(0, cfg.vocab_size, (3, 6))
    assert (generate(params, cfg, prompt, 8) == generate_uncached(params, cfg, prompt, 8)).all()


def test_cached_logits_equal_forward_logits():
    cfg = CONFIGS["gqa"]
    params = transformer.init_params(cfg, seed=0)
    seq = np.random.default_rng(0).integers(0, 50, (2, 9))
    cache = ContiguousKVCache(cfg, 2, 16)
    got = [np.asarray(forward_cached(params, seq[:, :5], cfg, cache))]
    for t in range(5, 9):
        got.append(np.asarray(forward_cached(params, seq[:, t:t + 1], cfg, cache)))
    ref = np.asarray(transformer.forward(params, seq, cfg))
    np.testing.assert_allclose(np.concatenate(got, axis=1), ref, atol=1e-5)
    assert cache.lengths.tolist() == [9, 9]


def test_paged_cache_equals_contiguous_and_tracks_blocks():
    cfg = CONFIGS["gqa"]
    params = transformer.init_params(cfg, seed=0)
    prompt = np.random.default_rng(2).integers(0, 50, (2, 5))
    paged = PagedKVCache(cfg, num_blocks=8, block_size=4)
    out = generate(params, cfg, prompt, 6, cache=paged)
    assert (out == generate(params, cfg, prompt, 6)).all()
    # 5 + 5 cached tokens per sequence (the last sampled token is never fed back) -> 3 blocks each
    assert [len(paged.block_table(s)) for s in (0, 1)] == [3, 3]
    assert paged.num_free_blocks == 2 and paged.utilization() == pytest.approx(6 / 8)
    paged.release(0)
    assert paged.num_free_blocks == 5


def test_paged_fork_shares_prefix_blocks():
    cfg = CONFIGS["gqa"]
    params = transformer.init_params(cfg, seed=0)
    c = PagedKVCache(cfg, num_blocks=6, block_size=2)
    c.add_sequence("a")
    toks = np.arange(5)[None]
    forward_cached(params, toks, cfg, c, ["a"])
    c.fork("a", "b")                  # two full blocks shared, the odd token copied into a new block
    assert c.block_table("b")[:2] == c.block_table("a")[:2] and c.lengths["b"] == 5
    nxt = np.array([[7]])
    la = np.asarray(forward_cached(params, nxt, cfg, c, ["a"]))
    lb = np.asarray(forward_cached(params, nxt, cfg, c, ["b"]))
    np.testing.assert_allclose(la, lb, atol=1e-6)
    c.release("a")
    assert c.refs[c.block_table("b")[0]] == 1


def test_context_longer_than_cache_is_a_clear_error():
    cfg = CONFIGS["gqa"]
    params = transformer.init_params(cfg, seed=0)
    cache = ContiguousKVCache(cfg, 1, 4)
    with pytest.raises(CacheFullError, match=r"\[kv_cache\] context 6 tokens of row 0 is longer than the cache \(max_len 4\)"):
        forward_cached(params, np.zeros((1, 6), int), cfg, cache)
    paged = PagedKVCache(cfg, num_blocks=2, block_size=2)
    paged.add_sequence(0)
    with pytest.raises(CacheFullError, match="need 3 more blocks .* only 2 of 2 are free \\(short by 1\\)"):
        forward_cached(params, np.zeros((1, 5), int), cfg, paged, [0])


def test_sampler_greedy_topk_topp_and_seed():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    assert Sampler().sample(logits).tolist() == [0]
    lp = filter_logits(logits, top_p=0.7)             # 0.5 < 0.7, 0.8 >= 0.7: keeps tokens 0, 1
    assert np.isfinite(lp).tolist() == [[True, True, False, False]]
    np.testing.assert_allclose(np.exp(lp[0, :2]), [0.5 / 0.8, 0.3 / 0.8])
    assert np.isfinite(filter_logits(logits, top_k=3)).sum() == 3
    draws = [int(Sampler(temperature=1.0, seed=s).sample(logits)[0]) for s in range(2000)]
    freq = np.bincount(draws, minlength=4) / 2000
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.04)
    a, b = Sampler(temperature=0.7, top_k=3, seed=5), Sampler(temperature=0.7, top_k=3, seed=5)
    assert [a.sample(logits)[0] for _ in range(20)] == [b.sample(logits)[0] for _ in range(20)]
    with pytest.raises(ValueError, match=r"\[Sampler\] top_p 0 must be in \(0, 1\]"):
        Sampler(top_p=0)


def test_sampled_generation_with_seed_equals_recomputation():
    cfg = CONFIGS["gqa"]
    params = transformer.init_params(cfg, seed=0)
    prompt = np.random.default_rng(0).integers(0, 50, (2, 4))
    mk = lambda: Sampler(temperature=0.8, top_k=20, top_p=0.9, seed=11)  # noqa: E731
    assert (generate(params, cfg, prompt, 6, mk()) == generate_uncached(params, cfg, prompt, 6, mk())).all()
