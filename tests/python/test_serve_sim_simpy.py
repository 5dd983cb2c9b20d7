"""The serving simulator against the SimPy processes it replaced
(``tests/python/simpy_reference.py``): the same requests through both give bit-identical
first-token and finish times, utilisation, prefix hit rate and transfer time, in every layout
(chunked and whole-prompt prefill, several replicas, disaggregated with several prefill and
decode replicas, a prefix cache that evicts, speculative decoding, requests that can never fit)."""

import numpy as np
import pytest

pytest.importorskip("simpy")

from shardlab.models import presets  # noqa: E402
from shardlab.serve import Request, ServingConfig, StepModel, poisson_requests, simulate  # noqa: E402
from simpy_reference import simpy_simulate  # noqa: E402

MODEL = StepModel(presets.get("llama3-8b"), "tpu-v5e", {"x": 8})


def _same(a, b):
    np.testing.assert_array_equal(a.first_token, b.first_token)
    np.testing.assert_array_equal(a.finish, b.finish)
    assert a.kv_utilization == b.kv_utilization
    assert a.prefix_hit_rate == b.prefix_hit_rate
    assert a.transfer_seconds == b.transfer_seconds
    assert a.rejected == b.rejected
    assert a.summary() == b.summary()


REQS = poisson_requests(1500, 40.0, prompt_len=("lognormal", 600, 0.8), output_len=("exponential", 60),
                        shared_prefixes=12, prefix_len=128, prefix_fraction=0.6, seed=3)
CONFIGS = {
    "interleaved chunked, 2 replicas, prefix LRU evicting": ServingConfig(replicas=2, max_batch=48, chunk_size=256,
                                                                          prefix_cache_blocks=40),
    "interleaved whole prompts, small KV": ServingConfig(max_batch=64, chunk_size=None, kv_capacity_tokens=30_000),
    "interleaved speculative": ServingConfig(max_batch=32, chunk_size=128, speculative_k=3, acceptance=0.7),
    "disaggregated": ServingConfig(mode="disaggregated", max_batch=64, prefix_cache_blocks=4096),
    "disaggregated 3 prefill, 2 decode, slow link": ServingConfig(mode="disaggregated", prefill_replicas=3,
                                                                  decode_replicas=2, max_batch=24,
                                                                  transfer_bandwidth=2e9, prefix_cache_blocks=60),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_equal_to_the_simpy_processes(name):
    cfg = CONFIGS[name]
    new, ref = simulate(REQS, MODEL, cfg), simpy_simulate(REQS, MODEL, cfg)
    assert new.completed > 0
    _same(new, ref)


def test_rejections_and_one_token_outputs_equal_the_simpy_processes():
    reqs = [Request(0, 0.0, 100, 1), Request(1, 0.1, 9000, 5), Request(2, 0.1, 300, 40), Request(3, 0.2, 50, 1)]
    for cfg in (ServingConfig(kv_capacity_tokens=2048, replicas=2),
                ServingConfig(mode="disaggregated", kv_capacity_tokens=2048)):
        new, ref = simulate(reqs, MODEL, cfg), simpy_simulate(reqs, MODEL, cfg)
        _same(new, ref)
        assert new.rejected == [1]
