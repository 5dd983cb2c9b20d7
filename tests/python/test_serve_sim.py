"""shardlab.serve.simulator / workload / prefix_cache / speculative: the simulator prices every
step with StepModel (a lone request's times equal the formula's sums), continuous batching,
chunked prefill, disaggregation with KV transfer, prefix-cache hit rate, speculative decoding,
traces with malformed rows."""

import json
import math
from collections import OrderedDict

import numpy as np
import pytest

from shardlab.models import ModelConfig, presets, transformer
from shardlab.serve import (PrefixCache, Request, ServingConfig, StepModel, generate, load_trace,
                            plot_throughput_latency, poisson_requests, save_trace, simulate, sweep)
from shardlab.serve.simulator import tokens_per_verify
from shardlab.serve.speculative import layer_skip_draft, speculative_generate

MODEL = StepModel(presets.get("llama3-8b"), "tpu-v5e", {"x": 8})


def _decode_sum(model, prompt, out, batch=1):
    return sum(model.decode(batch, batch * (prompt + j)).seconds for j in range(out - 1))


def test_lone_request_times_are_the_estimate_sums():
    r = simulate([Request(0, 2.0, 300, 10)], MODEL, ServingConfig(chunk_size=None))
    pre = MODEL.prefill(300).seconds
    assert r.ttft[0] == pytest.approx(pre, rel=1e-12)
    assert r.e2e[0] == pytest.approx(pre + _decode_sum(MODEL, 300, 10), rel=1e-12)
    assert r.tpot[0] == pytest.approx(_decode_sum(MODEL, 300, 10) / 9, rel=1e-12)


def test_chunked_prefill_prices_each_chunk():
    r = simulate([Request(0, 0.0, 1000, 2)], MODEL, ServingConfig(chunk_size=256))
    want, done = 0.0, 0
    for take in (256, 256, 256, 232):
        want += MODEL.prefill(take, 1, done).seconds
        done += take
    assert r.ttft[0] == pytest.approx(want, rel=1e-12)


def test_two_requests_share_decode_steps_and_the_short_one_leaves_first():
    reqs = [Request(0, 0.0, 100, 50), Request(1, 0.0, 100, 5)]
    r = simulate(reqs, MODEL, ServingConfig(chunk_size=None))
    assert r.finish[1] < r.finish[0]
    # both prompts fit in one chunk-less step each; then decode steps at batch 2 until #1 leaves
    t_first = MODEL.prefill(100).seconds
    assert r.first_token[0] == pytest.approx(t_first)
    assert r.first_token[1] == pytest.approx(t_first + MODEL.step(1, 100, 100, 100 * 50.5).seconds)


def test_disaggregated_adds_the_kv_transfer_on_the_interconnect():
    cfg = ServingConfig(mode="disaggregated", transfer_bandwidth=1e9, transfer_latency=1e-5)
    r = simulate([Request(0, 0.0, 400, 6)], MODEL, cfg)
    pre = MODEL.prefill(400).seconds
    xfer = 400 * MODEL.kv_bytes_per_token / 1e9 + 1e-5
    assert r.ttft[0] == pytest.approx(pre)
    assert r.e2e[0] == pytest.approx(pre + xfer + _decode_sum(MODEL, 400, 6))
    assert r.transfer_seconds == pytest.approx(xfer)


def test_prefix_cache_hit_rate_is_measured():
    reqs = [Request(i, 10.0 * i, 600, 4, prefix_id=0, prefix_len=512) for i in range(20)]
    cfg = ServingConfig(chunk_size=None, prefix_cache_blocks=64, block_size=16)
    hit = simulate(reqs, MODEL, cfg)
    miss = simulate(reqs, MODEL, ServingConfig(chunk_size=None))
    assert hit.prefix_hit_rate == pytest.approx(19 / 20)
    assert miss.prefix_hit_rate == 0.0
    assert hit.ttft[1] == pytest.approx(MODEL.prefill(600 - 512, 1, 512).seconds)
    assert hit.ttft[1:].max() < miss.ttft[1:].min()
    c = PrefixCache(2)
    c.insert("a", 2)
    c.insert("b", 1)                     # evicts ("a", 0): the least recently used
    assert c.lookup("a", 2) == 0 and c.lookup("b", 1) == 1


def test_speculative_decoding_steps_follow_the_acceptance_rate():
    k, a = 4, 0.8
    g = tokens_per_verify(k, a)
    assert g == pytest.approx(sum(a ** i for i in range(k + 1)))
    plain = simulate([Request(0, 0.0, 300, 101)], MODEL, ServingConfig(chunk_size=None))
    spec = simulate([Request(0, 0.0, 300, 101)], MODEL,
                    ServingConfig(chunk_size=None, speculative_k=k, acceptance=a, draft_cost=0.05))
    steps = math.ceil(100 / g)
    one = MODEL.step(1, 300, verify_tokens=k + 1).seconds + k * 0.05 * MODEL.decode(1, 300).seconds
    assert spec.tpot[0] < plain.tpot[0]
    assert spec.e2e[0] - spec.ttft[0] == pytest.approx(steps * one, rel=0.05)


def test_measured_acceptance_and_output_equal_to_the_target():
    cfg = ModelConfig(num_layers=3, d_model=32, ffw_dim=64, num_heads=4, vocab_size=40)
    params = transformer.init_params(cfg, seed=2)
    dp, dc = layer_skip_draft(params, cfg, 2)
    prompt = np.array([[5, 1, 7]])
    out, stats = speculative_generate(params, cfg, dp, dc, prompt, 20, k=3)
    assert (out == generate(params, cfg, prompt, 20)).all()
    assert stats["accepted"] <= stats["proposed"] and stats["target_calls"] <= 19
    assert stats["tokens_per_call"] == pytest.approx(19 / stats["target_calls"])
    same, s2 = speculative_generate(params, cfg, params, cfg, prompt, 20, k=3)   # draft = target
    assert s2["acceptance"] == 1.0 and (same == out).all()


def test_capacity_rejects_what_can_never_fit_and_utilisation_is_a_fraction():
    reqs = [Request(0, 0.0, 100, 10), Request(1, 0.0, 5000, 10)]
    r = simulate(reqs, MODEL, ServingConfig(kv_capacity_tokens=1024, block_size=16))
    assert r.rejected == [1] and r.completed == 1
    assert 0 < r.kv_utilization <= 1


def test_load_sweep_and_plot():
    make = lambda rate: poisson_requests(300, rate, prompt_len=("uniform", 100, 400), output_len=32, seed=1)  # noqa: E731
    res = sweep(make, [5.0, 40.0], MODEL, ServingConfig(max_batch=64))
    assert res[1].throughput > res[0].throughput
    assert all(x.completed == 300 for x in res)
    import matplotlib
    matplotlib.use("Agg")
    fig = plot_throughput_latency({"interleaved": res})
    assert fig.axes[0].get_xlabel().startswith("throughput")


def test_generator_shared_prefixes_and_distributions():
    reqs = poisson_requests(2000, 10.0, prompt_len=("lognormal", 300, 0.5), output_len=("exponential", 50),
                            shared_prefixes=3, prefix_len=128, prefix_fraction=0.5, seed=0)
    with_prefix = [r for r in reqs if r.prefix_id is not None]
    assert 0.45 < len(with_prefix) / 2000 < 0.55
    assert {r.prefix_id for r in with_prefix} == {0, 1, 2}
    assert all(r.prompt_len > 128 for r in with_prefix)
    with pytest.raises(ValueError, match="is not a length distribution"):
        poisson_requests(3, 1.0, prompt_len=("gamma", 2))


def test_traces_load_with_malformed_rows_named(tmp_path):
    reqs = poisson_requests(5, 2.0, seed=0)
    save_trace(reqs, tmp_path / "t.jsonl")
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    lines.insert(2, "{not json")
    lines.insert(4, json.dumps({"arrival": 1.0, "prompt_len": 0, "output_len": 3}))
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match=r"skipped 2 malformed row\(s\): line 3: .*; line 5: prompt_len 0"):
        t = load_trace(tmp_path / "bad.jsonl")
    assert len(t) == 5 and [n for n, _ in t.errors] == [3, 5]
    save_trace(reqs, tmp_path / "t.csv")
    text = (tmp_path / "t.csv").read_text().splitlines()
    text.append("3.5,,7,,0")
    (tmp_path / "bad.csv").write_text("\n".join(text) + "\n")
    with pytest.raises(ValueError, match="line 7: missing prompt_len"):
        load_trace(tmp_path / "bad.csv", errors="raise")
    good = load_trace(tmp_path / "t.csv")
    assert [r.prompt_len for r in good] == [r.prompt_len for r in reqs]
    with pytest.raises(ValueError, match="mode 'batch' must be"):
        ServingConfig(mode="batch")


class _BlockLRU:
    """The per-block LRU the segment-based PrefixCache must equal: one OrderedDict entry per block."""

    def __init__(self, capacity):
        self.capacity, self.blocks = capacity, OrderedDict()

    def lookup(self, prefix, n):
        hit = 0
        while hit < n and (prefix, hit) in self.blocks:
            self.blocks.move_to_end((prefix, hit))
            hit += 1
        return hit

    def insert(self, prefix, n):
        for j in range(min(n, self.capacity)):
            if (prefix, j) in self.blocks:
                self.blocks.move_to_end((prefix, j))
            else:
                self.blocks[(prefix, j)] = True
                if len(self.blocks) > self.capacity:
                    self.blocks.popitem(last=False)


@pytest.mark.parametrize("capacity", [0, 1, 5, 12, 40])
def test_prefix_cache_segments_equal_a_per_block_lru(capacity):
    rng = np.random.default_rng(capacity)
    seg, ref = PrefixCache(capacity), _BlockLRU(capacity)
    for _ in range(3000):
        p, n = int(rng.integers(0, 6)), int(rng.integers(0, 14))
        if rng.random() < 0.5:
            assert seg.lookup(p, n) == ref.lookup(p, n)
        else:
            seg.insert(p, n)
            ref.insert(p, n)
        assert seg.keys() == list(ref.blocks) and len(seg) == len(ref.blocks)
    assert all((k in seg) == (k in ref.blocks) for k in [(p, j) for p in range(6) for j in range(14)])
