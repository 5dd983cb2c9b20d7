"""The book's part 5 closed forms (train.rooflines, models.step_time_lower_bound): each against the
number the book prints and against the ledger of a step that runs (shape-only)."""

import math

import pytest

import shardlab as sl
from shardlab import train
from shardlab.models import ModelConfig, flops_per_token, presets, step_time_lower_bound

V5P = sl.hardware.get("tpu-v5p")
W_ICI = 2 * V5P.ici_link_bandwidth   # the book's bidirectional W_ici


# -- the numbers the book prints ----------------------------------------------------------------
def test_the_books_numbers():
    assert round(train.critical_intensity("tpu-v5p")) == 2550                         # "C/W_ici = 2550"
    assert round(train.dp_min_batch_per_chip("tpu-v5p", m_x=3)) == 850                # "BS=850 per TPU"
    assert round(850 * 4096 / 1e6, 2) == round(train.crossover_batches(32768, 2550, 4096)["dp"] / 1e6, 2) == 3.48
    assert round(train.fsdp_tp_min_batch_per_chip(32768, 2550, m_x=2, m_y=1)) == 99   # "B/N > 99"
    assert round(train.fsdp_tp_min_batch_per_chip(13824, 2550, 2, 1)) == 235          # "2550^2 / 2F = 235"
    # "all strategies are comms-bound below ... 4096 * 2550^2 / (2 * 8192 * 4) = 4e5"
    assert round(train.crossover_batches(8192 * 4, 2550, 4096)["fsdp_tp"], -5) == 4e5
    assert round(train.x_opt(3e6, 13824, 4096, 2, 1)) == 1333                          # "= 1333"
    assert 8 <= train.max_tensor_parallelism(32768, "tpu-v5p") <= 16                   # "between 8 and 16"
    # the DCN: "4.46e14 / 6.25e9 = 71,360" (the book's C here; our v5p preset's 4.59e14 gives 73,440)
    book_c = V5P.replace(peak_flops={"bfloat16": 4.46e14})
    assert round(train.critical_intensity(book_c, "dcn")) == 71360
    assert train.crossover_batches(32768, book_c, 8960 * 2, dcn_slices=2)["dcn"] == pytest.approx(2 * 71360)


def test_the_books_step_time_at_40_percent_mfu():
    # part 5, question 3: "6 * 3e6 * 13e9 / (4096 * 4.6e14 * 0.4) = 300ms" (matmuls only)
    cfg = presets.get("llama2-13b")
    t = step_time_lower_bound(cfg, 3_000_000, "tpu-v5p", 4096, context=32768, include_attention=False)
    assert t.total / 0.4 == pytest.approx(0.3, rel=0.1)
    with_attention = step_time_lower_bound(cfg, 3_000_000, "tpu-v5p", 4096, context=32768)
    assert with_attention.total > 1.5 * t.total     # at 32k tokens attention is most of the work


# -- against a program ---------------------------------------------------------------------------
def _ledger(cfg, strategy, mesh, batch, seq):
    return train.estimate(cfg, strategy, mesh, "tpu-v5p", batch=batch, seq=seq).ledger.events


def _sum(events, key, **match):
    return sum(e[key] or 0 for e in events if all(e[k] == v for k, v in match.items()))


def test_step_time_lower_bound_equals_the_matmuls_a_step_runs():
    cfg = ModelConfig(num_layers=2, d_model=512, ffw_dim=2048, num_heads=8, vocab_size=4096, max_seq_len=1024)
    events = _ledger(cfg, "fsdp", {"data": 8}, 16, 1024)
    matmul = sum(e["flops"] for e in events if e["op"] == "matmul" and e["phase"] in ("forward", "backward"))
    attention = sum(e["flops"] for e in events if e["op"].startswith("attention") and e["phase"] != "recompute")
    peak = V5P.peak("bfloat16")
    lb = step_time_lower_bound(cfg, 16 * 1024, "tpu-v5p", 8, context=1024, include_attention=False)
    assert lb.extra["compute"] == pytest.approx(matmul / peak, rel=1e-12)
    # with attention (the book's 2x backward): more, by the attention FLOPs of flops_per_token
    full = step_time_lower_bound(cfg, 16 * 1024, "tpu-v5p", 8, context=1024)
    f = flops_per_token(cfg, 1024)
    assert full.extra["compute"] - lb.extra["compute"] == pytest.approx(f.attention * 16 * 1024 / 8 / peak, rel=1e-12)
    assert attention > 0


def test_fsdp_tp_crossover_on_the_ledger():
    # alpha = 2048 (a v5p whose peak is 2048 x W_ici), F = 4096, N = 64: B*/N = alpha^2/F = 1024 tokens
    # per chip, X_opt = sqrt(B N / F) = 32, Y = 2. A plain 2-matrix MLP, as the book's derivation.
    alpha, F, N = 2048, 4096, 64
    C = alpha * W_ICI
    B = round(train.fsdp_tp_min_batch_per_chip(F, alpha, m_x=1, m_y=1) * N)
    assert B == 65536 and train.x_opt(B, F, N) == 32
    cfg = ModelConfig(num_layers=1, d_model=256, ffw_dim=F, num_heads=8, vocab_size=256, gated_mlp=False,
                      max_seq_len=2048)
    X, Y, D = 32, 2, 256
    ev = [e for e in _ledger(cfg, "fsdp_tp", {"data": X, "model": Y}, B // 2048, 2048)
          if e["label"] == "layer0/mlp" and e["phase"] == "forward"]
    data = _sum(ev, "bytes_sent", axes=("data",)) - 2 * D * (X - 1) / X      # less the norm scale's gather
    model = _sum(ev, "bytes_sent", axes=("model",))
    flops = _sum(ev, "flops", op="matmul")
    assert data == pytest.approx(4 * D * F / Y * (X - 1) / X, rel=1e-12)     # the book's 4DF/Y (bf16)
    assert model == pytest.approx(4 * B * D / X * (Y - 1) / Y, rel=1e-12)    # and 4BD/X
    assert flops == pytest.approx(4 * B * D * F / N, rel=1e-12)              # T_math's 4BDF/N
    ratio = (flops / C) / (max(data, model) / W_ICI)
    assert ratio == pytest.approx(X / (X - 1), rel=1e-9)                      # 1 at B*, but for the ring's (X-1)/X


def test_dp_crossover_on_the_ledger():
    # data parallelism: the backward all-reduces 2DF bf16 per matrix; compute-bound when B/X > alpha
    alpha, X = 512, 8
    C = alpha * W_ICI
    cfg = ModelConfig(num_layers=1, d_model=256, ffw_dim=1024, num_heads=8, vocab_size=256, gated_mlp=False,
                      max_seq_len=512)
    B = round(train.dp_min_batch_per_chip(alpha, m_x=1) * X)
    ev = [e for e in _ledger(cfg, "dp", {"data": X}, B // 512, 512) if e["label"] == "layer0/mlp"]
    weights = 2 * cfg.d_model * cfg.ffw_dim * 2                                # W_in, W_out in bf16
    sent = sum(e["bytes_sent"] for e in ev if e["op"] == "psum" and e["bytes_in"] == weights / 2)
    assert sent == pytest.approx(2 * (X - 1) / X * weights, rel=1e-12)        # 2 x total bytes (AllReduce)
    backward = _sum([e for e in ev if e["phase"] == "backward"], "flops", op="matmul")
    assert backward == pytest.approx(8 * B * cfg.d_model * cfg.ffw_dim / X, rel=1e-12)
    assert (backward / C) / (sent / W_ICI) == pytest.approx(X / (X - 1), rel=1e-9)


def test_dcn_crossover_on_the_ledger():
    # hierarchical DP: the DCN all-reduces each gradient's 1/M shard; compute-bound when B/slice > alpha_dcn
    hw = V5P
    alpha = train.critical_intensity(hw, "dcn")
    S, M = 2, 4
    cfg = ModelConfig(num_layers=1, d_model=256, ffw_dim=1024, num_heads=8, vocab_size=256, gated_mlp=False,
                      max_seq_len=512)
    events = train.estimate(cfg, train.hierarchical(), {"dcn": S, "data": M}, hw, batch=16, seq=512).ledger.events
    shard = 2 * cfg.d_model * cfg.ffw_dim / M                                 # W_in's (W_out's) bf16 1/M shard
    dcn = [e for e in events if e["axes"] == ("dcn",) and e["bytes_in"] == shard]
    sent = sum(e["bytes_sent"] for e in dcn)
    assert len(dcn) == 2 and sent == pytest.approx(2 * (S - 1) / S * 2 * shard, rel=1e-12)   # the book's 8DF/M
    bwd = _sum([e for e in events if e["label"] == "layer0/mlp" and e["phase"] == "backward"], "flops", op="matmul")
    B = 16 * 512
    assert bwd == pytest.approx(8 * B * cfg.d_model * cfg.ffw_dim / (S * M), rel=1e-12)   # T_math's 8BDF/N
    # T_math / T_comms = (B / slices) / alpha_dcn, but for the ring's (S-1)/S
    ratio = (bwd / hw.peak("bfloat16")) / (sent / hw.dcn_bandwidth)
    assert ratio == pytest.approx((B / S) / alpha * S / (S - 1), rel=1e-9)


# -- bad input -----------------------------------------------------------------------------------
def test_bad_input():
    with pytest.raises(ValueError, match=r"\[critical_intensity\] link 'pcie' is not one of ici, nvlink, ib, dcn"):
        train.critical_intensity("tpu-v5p", "pcie")
    with pytest.raises(ValueError, match=r"h100 has no ici bandwidth; its links: nvlink, ib"):
        train.critical_intensity("h100", "ici")
    with pytest.raises(ValueError, match=r"unknown preset 'tpu-v9'.*build one .*Hardware\(name='my-chip'"):
        train.critical_intensity("tpu-v9")
    with pytest.raises(ValueError, match=r"\[x_opt\] chips=0 must be a number > 0"):
        train.x_opt(1e6, 4096, 0)
    with pytest.raises(ValueError, match=r"m_y=3 leaves no mesh axis for FSDP"):
        train.crossover_batches(4096, 2550, 64, mesh_axes=3, m_y=3)
    assert math.isinf(train.crossover_batches(4096, 2550, 64)["tp"])
