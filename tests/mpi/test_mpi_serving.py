"""Serving runs unchanged across ranks: sharded generation (every layout, contiguous and paged KV
caches, sampled tokens) gives the one-process tokens and ledger, and the tokens of the unsharded
model."""

import numpy as np
import pytest

import shardlab as sl
from shardlab.models import ModelConfig, transformer
from shardlab.serve import Sampler, generate
from shardlab.serve.sharded import generate_sharded

from common import run_both

DENSE = ModelConfig(num_layers=2, d_model=64, ffw_dim=128, num_heads=8, vocab_size=32)
CASES = {
    "megatron": (DENSE, (8,), ("x",), "contiguous"),
    "seq_kv": (DENSE.replace(qkv_bias=True, out_bias=True), (8,), ("x",), "contiguous"),
    "batch_kv": (DENSE.replace(num_kv_heads=2), (2, 4), ("y", "z"), "paged"),
    "2d": (DENSE, (2, 4), ("x", "yz"), "paged"),
    "moe": (ModelConfig(num_layers=2, d_model=64, ffw_dim=32, num_heads=8, vocab_size=32, num_experts=8, top_k=2,
                        capacity_factor=4.0, num_shared_experts=1), (8,), ("x",), "contiguous"),
}
PROMPT = np.random.default_rng(3).integers(0, 32, (8, 4))


@pytest.mark.parametrize("strategy", sorted(CASES))
def test_generate_sharded_gives_the_one_process_tokens_and_ledger(strategy):
    cfg, shape, axes, cache = CASES[strategy]
    params = transformer.init_params(cfg, seed=0)

    def program():
        ledger = sl.Ledger()
        mesh = sl.make_mesh(shape, axes)
        tokens = generate_sharded(params, cfg, PROMPT, 5, mesh, strategy, Sampler(temperature=0.9, seed=4),
                                  cache=cache, block_size=4, ledger=ledger)
        return [tokens, np.array([e["bytes_sent"] for e in ledger.events])]

    (v1, e1), (v0, e0) = run_both(program)
    np.testing.assert_array_equal(v1[0], v0[0])               # the same tokens
    np.testing.assert_array_equal(v1[1], v0[1])               # the decoder's own ledger: the same bytes
    assert e1 == e0 and e1                                    # and the same events, seconds included
    np.testing.assert_array_equal(v1[0], generate(params, cfg, PROMPT, 5, Sampler(temperature=0.9, seed=4)))
