"""shardlab.train at scale (abstract mode): estimate against the book's part 5 closed forms,
the token split of a batch smaller than the data axes, and search."""

import math

import pytest

import shardlab as sl
from shardlab import train
from shardlab.models import ModelConfig, flops_per_token, param_count, presets

V5P = sl.hardware.get("tpu-v5p")
PEAK = sl.cost.peak_flops(V5P, "bfloat16")[0]
# LLaMA-2 13B with 2 of its 40 layers: every closed form of part 5 is per layer
L13 = presets.get("llama2-13b").replace(num_layers=2)
CUBE = {"x": 16, "y": 16, "z": 16}
BATCH, SEQ = 96, 32768  # the book's 3M-token batch (96 x 32k = 3,145,728 tokens)


def _sent(e, ops, phases=None):
    return sum(ev["bytes_sent"] for ev in e.ledger.events
               if ev["axes"] and ev["op"] in ops and (phases is None or ev["phase"] in phases))


def test_sequence_chunks_split_tokens_when_the_data_axes_outnumber_the_sequences():
    assert train.sequence_chunks(96, 32768, 4096) == 128          # 768 tokens per chip
    assert train.sequence_chunks(96, 32768, 1024, seq_split=4) == 32
    assert train.sequence_chunks(64, 4096, 64) == 1
    with pytest.raises(ValueError, match=r"\[estimate\] 3 x 5 tokens cannot be split over the data axes of size 4"):
        train.sequence_chunks(3, 5, 4)


def test_dp_on_the_cube_moves_2_psi_and_matmuls_take_6_psi_B_over_NC():
    s = train.Strategy("dp", data=("x", "y", "z"))
    e = train.estimate(L13, s, CUBE, "tpu-v5p", batch=BATCH, seq=SEQ)
    n, psi = 4096, param_count(L13).total
    assert e.sequence_chunks == 128
    # the backward all-reduces every bf16 gradient once: 2 (n-1)/n x 2 bytes x psi sent per chip
    assert _sent(e, ("psum",), ("backward",)) == pytest.approx(2 * (n - 1) / n * 2 * psi, rel=1e-9)
    # the book's T_math: 6 x matmul params x tokens / (N x C)
    tokens = BATCH * SEQ
    assert e.matmul_seconds == pytest.approx(flops_per_token(L13, SEQ).matmul * tokens / (n * PEAK), rel=1e-6)
    # pure DP cannot hold the full model's 2 + 2 + 12 bytes per param in 95 GiB of HBM
    full = train.estimate(presets.get("llama2-13b").replace(num_layers=2), s, CUBE, "tpu-v5p", batch=BATCH, seq=SEQ)
    assert full.memory["params"] + full.memory["grads"] + full.memory["optimizer"] == 16 * psi


def test_fsdp_on_the_cube_shards_every_weight_4096_ways_and_moves_3_psi():
    s = train.Strategy("fsdp", data=("x", "y", "z"), zero=3)
    e = train.estimate(L13, s, CUBE, "tpu-v5p", batch=BATCH, seq=SEQ)
    psi = param_count(L13).total
    norms = psi - sum(math.prod(x) for x in _matrix_shapes(L13))
    # bf16 params: 2 psi / 4096 for the matrices, norm scales split over x and y only (5120 / 256)
    assert e.memory["params"] == 2 * (psi - norms) / 4096 + 2 * norms / 256
    # forward gather + backward re-gather + reduce-scatter: three times the sharded weights, ring factors,
    # except the embedding table, gathered once (its lookup's gradient does not read it)
    gathered = _sent(e, ("all_gather",))
    scattered = _sent(e, ("psum_scatter",))
    table = 2 * L13.vocab_size * L13.d_model * (1 - 1 / 4096)
    assert gathered == pytest.approx(2 * scattered - table, rel=1e-9)
    assert scattered == pytest.approx(2 * (psi - norms) * (1 - 1 / 4096) + 2 * norms * (1 - 1 / 256), rel=1e-9)
    assert e.fits


def _matrix_shapes(cfg):
    D, F, V, NH = cfg.d_model, cfg.ffw_dim, cfg.vocab_size, cfg.num_heads * cfg.head_dim
    return [(V, D), (D, V)] + cfg.num_layers * [(D, NH), (D, NH), (D, NH), (NH, D), (D, F), (D, F), (F, D)]


def test_fsdp_tp_forward_moves_the_books_4DF_over_Y_and_4BD_over_X():
    X, Y = 1024, 4
    e = train.estimate(L13, "fsdp_tp", {"data": X, "model": Y}, "tpu-v5p", batch=BATCH, seq=SEQ)
    D, F, B = L13.d_model, L13.ffw_dim, BATCH * SEQ
    mlp = e.ledger.filter(label="layer0/mlp", phase="forward")
    data = sum(ev["bytes_sent"] for ev in mlp.events if ev["axes"] == ("data",))
    model = sum(ev["bytes_sent"] for ev in mlp.events if ev["axes"] == ("model",))
    # gated MLP: three D x F bf16 matrices split Y ways, gathered X ways (+ the norm scale)
    assert data == pytest.approx((X - 1) / X * (3 * 2 * D * F / Y + 2 * D), rel=1e-9)
    # sequence parallel: all-gather + reduce-scatter of B/X tokens x D in bf16 = the book's 4BD/X
    assert model == pytest.approx((Y - 1) / Y * 4 * B * D / X, rel=1e-9)


def test_x_opt_is_the_books_formula():
    assert train.x_opt(96 * 32768, 13824, 4096, 2, 1) == pytest.approx(math.sqrt(96 * 32768 * 2 * 4096 / 13824))
    assert round(train.x_opt(48000, 32768, 64, 1, 1), 1) == 9.7   # the book's N=64 example (M_X = M_Y)


SMALL = ModelConfig(num_layers=2, d_model=1024, ffw_dim=4096, num_heads=16, vocab_size=32000, max_seq_len=2048)


def test_search_keeps_the_fastest_plan_that_fits():
    r = train.search(SMALL, "tpu-v5p", chips=16, batch=16, seq=2048, strategies=("dp", "fsdp", "tp", "fsdp_tp"))
    table, best = r["table"], r["best"]
    assert {e.strategy for e in table} == {"dp", "fsdp", "tp", "fsdp_tp"}
    # the v5p torus has 3 axes: the model axis takes 2, 4 or 8 chips, the data the other two axes
    assert {tuple(e.mesh.values()) for e in table if e.strategy == "fsdp_tp"} == {(4, 2, 2), (2, 2, 4), (2, 8)}
    assert best.fits and best.step_seconds == min(e.step_seconds for e in table if e.fits)
    assert r["x_opt"] == train.x_opt(16 * 2048, 4096, 16, 2, 1)   # M_X = 2 data axes, M_Y = 1
    # 8 heads cannot be split 16 ways: tensor parallelism alone is skipped, and says why
    r8 = train.search(SMALL.replace(num_heads=8, head_dim=128), "tpu-v5p", chips=16, batch=16, seq=2048,
                      strategies=("tp", "fsdp"))
    assert [e.strategy for e in r8["table"]] == ["fsdp"]
    assert r8["skipped"][0][0] == "tp" and "num_heads 8 is not divisible by the model axis" in r8["skipped"][0][2]


def test_search_says_by_how_much_nothing_fits():
    big = ModelConfig(num_layers=2, d_model=16384, ffw_dim=65536, num_heads=64, vocab_size=32000, max_seq_len=512)
    with pytest.raises(ValueError, match=r"\[search\] nothing fits: the smallest footprint .* GiB over the HBM of tpu-v5p"):
        train.search(big, "tpu-v5p", chips=1, batch=1, seq=512)
