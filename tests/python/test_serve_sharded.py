"""shardlab.serve.sharded: every layout's decode logits equal the unsharded model's (<= 1e-5)
and its ledger equals the closed-form communication bytes; ring attention equals causal
attention with X - 1 ppermutes of K and V; bad layouts are clear errors. The paged KV cache on
the mesh (Megatron, batch-sharded, 2-D) decodes the same tokens as the contiguous cache and the
unsharded model, with the same ledger, the same bytes and its pool split over the batch axis."""

import numpy as np
import pytest

import shardlab as sl
from shardlab import P
from shardlab.models import ModelConfig, transformer
from shardlab.serve import (CacheFullError, ContiguousKVCache, PagedKVCache, Sampler, StepModel, forward_cached,
                            generate)
from shardlab.serve.mesh_cache import MeshKVCache
from shardlab.serve.sharded import (_Decoder, comm_bytes, decode_step, generate_sharded, ledger_comm_bytes,
                                   ring_attention)

DENSE = ModelConfig(num_layers=2, d_model=64, ffw_dim=128, num_heads=8, vocab_size=32)
CASES = {
    "megatron": (DENSE, (8,), ("x",)),
    "seq_kv": (DENSE.replace(qkv_bias=True, out_bias=True), (8,), ("x",)),
    "batch_kv": (DENSE.replace(num_kv_heads=2), (2, 4), ("y", "z")),
    "2d": (DENSE, (2, 4), ("x", "yz")),
    "moe": (ModelConfig(num_layers=2, d_model=64, ffw_dim=32, num_heads=8, vocab_size=32, num_experts=8,
                        top_k=2, capacity_factor=4.0, num_shared_experts=1), (8,), ("x",)),
}


def _caches(cfg, params, B, prompt_len, max_len):
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, (B, prompt_len))
    a, b = ContiguousKVCache(cfg, B, max_len), ContiguousKVCache(cfg, B, max_len)
    forward_cached(params, prompt, cfg, a)
    forward_cached(params, prompt, cfg, b)
    return a, b


def _check_step(params, tok, cfg, cache, plain, mesh, strategy, fields):
    """One sharded decode step: logits equal to the unsharded cached forward, and the ledger's
    collectives (`fields` of each) equal to the closed form."""
    ledger = sl.Ledger()
    got = decode_step(params, tok, cfg, cache, mesh, strategy, ledger=ledger)
    ref = np.asarray(forward_cached(params, tok[:, None], cfg, plain))[:, 0]
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    expect = comm_bytes(cfg, strategy, dict(mesh.shape), len(tok), dtype_bytes=4)
    got_bytes = ledger_comm_bytes(ledger)
    assert set(got_bytes) == set(expect)
    for key, d in expect.items():
        for field in fields:
            assert got_bytes[key][field] == pytest.approx(d[field]), (key, field)


@pytest.mark.parametrize("strategy", sorted(CASES))
def test_decode_step_equals_unsharded_and_ledger_equals_closed_form(strategy):
    cfg, shape, axes = CASES[strategy]
    params = transformer.init_params(cfg, seed=1)
    B = 8
    sharded, plain = _caches(cfg, params, B, 5, 16)
    mesh = sl.make_mesh(shape, axes)
    for step in range(3):
        tok = (np.arange(B) * 7 + step) % cfg.vocab_size
        _check_step(params, tok, cfg, sharded, plain, mesh, strategy, ("calls", "bytes_in", "bytes_sent"))
    np.testing.assert_allclose(sharded.k, plain.k, atol=1e-6)
    assert sharded.lengths.tolist() == [8] * B


def test_generate_sharded_equals_generate_token_for_token():
    cfg = CASES["seq_kv"][0]
    params = transformer.init_params(cfg, seed=0)
    prompt = np.random.default_rng(3).integers(0, 32, (8, 4))
    mesh = sl.make_mesh((8,), ("x",))
    for strategy in ("megatron", "seq_kv"):
        got = generate_sharded(params, cfg, prompt, 6, mesh, strategy, Sampler(temperature=0.9, seed=4))
        assert (got == generate(params, cfg, prompt, 6, Sampler(temperature=0.9, seed=4))).all()
    assert generate_sharded(params, cfg, prompt, 0, mesh).shape == (8, 0)


def test_megatron_ledger_matches_the_book_activation_bytes():
    """Part 7: Megatron decode moves activations, not weights -- 2 AllReduces of B x D per layer,
    independent of the cache length."""
    cfg, shape, axes = CASES["megatron"]
    params = transformer.init_params(cfg, seed=0)
    mesh = sl.make_mesh(shape, axes)
    sent = []
    for prompt_len in (3, 11):
        c, _ = _caches(cfg, params, 8, prompt_len, 16)
        ledger = sl.Ledger()
        decode_step(params, np.zeros(8, int), cfg, c, mesh, "megatron", ledger=ledger)
        sent.append(ledger.total_bytes_sent)
    B, D, L, n = 8, cfg.d_model, cfg.num_layers, 8
    assert sent[0] == sent[1] == L * 2 * (2 * (n - 1) / n * B * D * 4)


def test_moe_decode_dispatches_by_alltoall_of_the_slot_grid():
    """MoE with expert sharding (GShard): per MoE layer two AllToAlls of each device's capacity
    slots, E·C·D·bytes in and (X-1)/X of it sent, and no AllReduce of expert outputs."""
    cfg, shape, axes = CASES["moe"]
    params = transformer.init_params(cfg, seed=1)
    B, X = 8, shape[0]
    sharded, plain = _caches(cfg, params, B, 3, 16)
    ledger = sl.Ledger()
    got = decode_step(params, np.arange(B), cfg, sharded, sl.make_mesh(shape, axes), "moe", ledger=ledger)
    np.testing.assert_allclose(got, np.asarray(forward_cached(params, np.arange(B)[:, None], cfg, plain))[:, 0],
                               atol=1e-5, rtol=0)
    a2a = [e for e in ledger.events if e["op"] == "all_to_all"]
    C = (B // X) * 1                                       # one token per sequence: capacity 1
    assert len(a2a) == 2 * cfg.num_layers
    assert all(e["bytes_in"] == cfg.num_experts * C * cfg.d_model * 4 for e in a2a)
    assert all(e["bytes_sent"] == cfg.num_experts * C * cfg.d_model * 4 * (X - 1) / X for e in a2a)
    psums = [e for e in ledger.events if e["op"] == "psum"]
    assert len(psums) == cfg.num_layers                    # attention only


def test_ring_attention_equals_causal_attention_and_moves_kv_blocks():
    rng = np.random.default_rng(0)
    X, B, S, N, K, H = 4, 2, 16, 4, 2, 8
    q = rng.standard_normal((B, S, N, H)).astype(np.float32)
    k, v = rng.standard_normal((2, B, S, K, H)).astype(np.float32)
    mesh = sl.make_mesh((X,), ("x",))
    f = sl.shard_map(ring_attention, mesh=mesh, in_specs=P(None, "x"), out_specs=P(None, "x"))
    with sl.Ledger() as ledger:
        out = np.asarray(f(q, k, v))
    np.testing.assert_allclose(out, sl.nn.dot_product_attention(q, k, v, is_causal=True), atol=1e-5)
    perms = [e for e in ledger.events if e["op"] == "ppermute"]
    assert len(perms) == 2 * (X - 1)
    assert sum(e["bytes_in"] for e in perms) == 2 * (X - 1) * B * (S // X) * K * H * 4


def test_bad_layouts_are_clear_errors():
    cfg = DENSE.replace(num_heads=4)                      # head_dim re-derived: 16
    params = transformer.init_params(cfg, seed=0)
    c, _ = _caches(cfg, params, 8, 2, 16)
    mesh = sl.make_mesh((8,), ("x",))
    with pytest.raises(ValueError, match=r"\[decode_step\] num_heads 4 is not divisible by mesh axis x of size 8"):
        decode_step(params, np.zeros(8, int), cfg, c, mesh, "megatron")
    cfg2 = DENSE.replace(num_kv_heads=2)
    p2 = transformer.init_params(cfg2, seed=0)
    c2, _ = _caches(cfg2, p2, 8, 2, 16)
    with pytest.raises(ValueError, match="num_kv_heads 2 is not divisible .* use strategy 'batch_kv'"):
        decode_step(p2, np.zeros(8, int), cfg2, c2, mesh, "seq_kv")
    with pytest.raises(ValueError, match=r"needs a mesh with axes \('y', 'z'\)"):
        decode_step(p2, np.zeros(8, int), cfg2, c2, mesh, "batch_kv")
    c3 = ContiguousKVCache(DENSE, 8, 12)
    with pytest.raises(ValueError, match="cache length 12 is not divisible by mesh axis x of size 8"):
        decode_step(transformer.init_params(DENSE), np.zeros(8, int), DENSE, c3, mesh, "seq_kv")
    moe = CASES["moe"][0]
    pm = transformer.init_params(moe, seed=0)
    cm = ContiguousKVCache(moe, 4, 16)
    forward_cached(pm, np.ones((4, 2), int), moe, cm)
    with pytest.raises(ValueError, match=r"batch 4 is not divisible by mesh axis x of size 8 \(strategy 'moe'\)"):
        decode_step(pm, np.zeros(4, int), moe, cm, mesh, "moe")
    with pytest.raises(ValueError, match="unknown strategy 'fsdp'"):
        decode_step(params, np.zeros(8, int), cfg, c, mesh, "fsdp")


# ---------------------------------------------------------------------------------------------
# the paged KV cache on the mesh

PAGED = {"megatron": CASES["megatron"], "batch_kv": CASES["batch_kv"], "2d": CASES["2d"]}


def _paged(cfg, params, prompt, Z, num_blocks, block_size):
    B = prompt.shape[0]
    c = PagedKVCache(cfg, num_blocks, block_size, shards=Z)
    for b in range(B):
        c.add_sequence(b, shard=b // (B // Z))
    forward_cached(params, prompt, cfg, c, list(range(B)))
    return c


@pytest.mark.parametrize("strategy", sorted(PAGED))
def test_paged_decode_step_equals_unsharded_with_the_same_ledger_and_bytes(strategy):
    cfg, shape, axes = PAGED[strategy]
    params = transformer.init_params(cfg, seed=1)
    mesh = sl.make_mesh(shape, axes)
    B, bs, T0 = 8, 4, 5
    Z = dict(mesh.shape).get("z", 1)
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, (B, T0))
    paged = _paged(cfg, params, prompt, Z, num_blocks=B * 4, block_size=bs)     # 16 tokens a sequence
    plain = ContiguousKVCache(cfg, B, 16)
    forward_cached(params, prompt, cfg, plain)
    # the pool holds exactly the contiguous cache's bytes, and the estimate's KV bytes per token
    assert paged.nbytes == plain.nbytes == StepModel(cfg, "tpu-v5e", {"x": 8}, "float32").kv_bytes_per_token * B * 16
    for step in range(4):
        tok = (np.arange(B) * 5 + step) % cfg.vocab_size
        _check_step(params, tok, cfg, paged, plain, mesh, strategy, ("bytes_sent",))
    for b in range(B):                      # the pool holds each token where its block table says
        k, _, n = paged.view(0, [b])
        np.testing.assert_allclose(k[0, :n[0]], plain.k[0, b, :n[0]], atol=1e-6)
        assert all(t // paged.shard_blocks == b // (B // Z) for t in paged.block_table(b))


@pytest.mark.parametrize("strategy", sorted(PAGED))
def test_generate_sharded_paged_equals_contiguous_and_unsharded(strategy):
    cfg, shape, axes = PAGED[strategy]
    params = transformer.init_params(cfg, seed=0)
    prompt = np.random.default_rng(3).integers(0, cfg.vocab_size, (8, 3))
    mesh = sl.make_mesh(shape, axes)
    ref = generate(params, cfg, prompt, 9, Sampler(temperature=0.9, seed=4))
    for cache in ("paged", "contiguous"):
        got = generate_sharded(params, cfg, prompt, 9, mesh, strategy, Sampler(temperature=0.9, seed=4),
                               cache=cache, block_size=4)
        assert (got == ref).all(), cache
    # the decoder keeps the cache on the mesh across steps: every step's logits equal unsharded decode
    Z = dict(mesh.shape).get("z", 1)
    contiguous, plain = _caches(cfg, params, 8, 3, 12)
    for host, seqs in ((_paged(cfg, params, plain_prompt(cfg), Z, 8 * 3, 4), range(8)), (contiguous, None)):
        dec = _Decoder(params, cfg, mesh, strategy, host, seqs)
        ref_cache = _caches(cfg, params, 8, 3, 12)[1]
        for step in range(8):
            tok = (np.arange(8) * 3 + step) % cfg.vocab_size
            ref = np.asarray(forward_cached(params, tok[:, None], cfg, ref_cache))[:, 0]
            np.testing.assert_allclose(dec.step(tok), ref, atol=1e-5, rtol=0)


def plain_prompt(cfg, B=8, prompt_len=3):
    """The prompt ``_caches`` prefills."""
    return np.random.default_rng(0).integers(0, cfg.vocab_size, (B, prompt_len))


def test_paged_pool_is_split_over_the_batch_axis_and_heads():
    cfg, shape, axes = CASES["batch_kv"]
    params = transformer.init_params(cfg, seed=0)
    mesh = sl.make_mesh(shape, axes)                      # y = 2 (KV heads), z = 4 (batch)
    c = MeshKVCache(_paged(cfg, params, np.zeros((8, 2), int), 4, 16, 4), mesh, batch="z", kv="y",
                    seqs=range(8))
    shards = {s.data.shape for s in c.k[0].addressable_shards}
    assert shards == {(16 // 4, 4, cfg.num_kv_heads // 2, cfg.head_dim)}
    assert c.nbytes == c.host.nbytes


def test_paged_errors_say_what_is_short():
    cfg, shape, axes = CASES["batch_kv"]
    params = transformer.init_params(cfg, seed=0)
    prompt = np.zeros((8, 6), int)
    mesh = sl.make_mesh(shape, axes)
    # 8 sequences of 6 + 7 tokens need 4 blocks of 4 each: 8 per shard of 2 sequences
    with pytest.raises(CacheFullError, match=r"2 sequence\(s\) need 8 more blocks of 4 tokens but shard 0 has "
                                             r"only 6 free of its 6 \(short by 2\)"):
        generate_sharded(params, cfg, prompt, 8, mesh, "batch_kv", cache="paged", block_size=4, num_blocks=24)
    with pytest.raises(ValueError, match="splits the sequence over the mesh; .* use cache='contiguous'"):
        generate_sharded(params, CASES["seq_kv"][0], prompt, 2, sl.make_mesh((8,), ("x",)), "seq_kv", cache="paged")
    with pytest.raises(ValueError, match=r"has 1 shard\(s\) but the batch axis 'z' has 4 devices"):
        decode_step(params, np.zeros(8, int), cfg, _paged(cfg, params, prompt, 1, 32, 4), mesh, "batch_kv")
    with pytest.raises(ValueError, match="cache 'blocks' must be 'contiguous' or 'paged'"):
        generate_sharded(params, cfg, prompt, 2, mesh, "batch_kv", cache="blocks")
