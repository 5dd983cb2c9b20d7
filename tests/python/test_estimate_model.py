"""train.estimate as a step-time model: calibrated prices, phases, overlap, pipeline, display."""

import pytest
from rich.console import Console

from shardlab import cost, train
from shardlab.models import ModelConfig

CFG = ModelConfig(num_layers=4, d_model=1024, ffw_dim=4096, num_heads=8, vocab_size=32000, max_seq_len=2048)


def _est(cfg=CFG, strategy="fsdp_tp", mesh=None, hardware="h100", **kw):
    return train.estimate(cfg, strategy, mesh or {"data": 4, "model": 2}, hardware, batch=8, seq=2048, **kw)


def test_the_phases_add_up_to_the_step_and_the_chip_list_is_slower_than_the_peaks():
    e = _est(remat="full")
    assert sum(e.phases.values()) == pytest.approx(e.step_seconds, rel=1e-12)
    assert {"forward", "recompute", "backward", "optimizer"} <= set(e.phases)
    assert e.phases["recompute"] > 0 and e.hfu > e.mfu > 0
    ideal = _est(remat="full", prices="ideal")
    assert ideal.prices == "ideal" and ideal.step_seconds < e.step_seconds
    # the book's T_math stays the peak-rate matmul seconds of the ledger
    assert e.matmul_seconds == ideal.matmul_seconds


def test_deeper_models_run_two_layers_and_count_the_last_for_the_rest():
    es = {L: _est(CFG.replace(num_layers=L)) for L in (2, 4, 6)}
    assert [es[L].layers_executed for L in (2, 4, 6)] == [2, 2, 2]
    f = {L: es[L].phases["forward"] for L in es}
    assert f[6] - f[4] == pytest.approx(f[4] - f[2], rel=1e-9)
    p = {L: es[L].memory["params"] for L in es}
    assert p[6] - p[4] == p[4] - p[2] > 0
    # the same step with every layer executed
    full = _est(CFG.replace(num_layers=6), execute_layers=6)
    assert full.layers_executed == 6 and full.step_seconds == pytest.approx(es[6].step_seconds, rel=1e-9)
    assert full.memory == es[6].memory and full.comm_seconds == pytest.approx(es[6].comm_seconds, rel=1e-9)
    with pytest.raises(ValueError, match="execute_layers=7"):
        _est(CFG.replace(num_layers=6), execute_layers=7)


def test_gradient_accumulation_does_the_same_work_in_pieces():
    def est(m):
        return train.estimate(CFG, "fsdp_tp", {"data": 4, "model": 2}, "h100", batch=64, seq=2048, remat="full",
                              microbatches=m)

    one, four = est(1), est(4)
    for ph in ("forward", "recompute", "backward"):   # 4x the kernels, each a quarter the size
        assert one.phases[ph] < four.phases[ph] < 1.25 * one.phases[ph]
    assert four.memory["activations"] < one.memory["activations"]


def test_tensor_parallel_collectives_are_exposed_unless_async():
    sync, asyn = _est(), _est(async_tp=True)
    assert sync.exposed_comm_seconds["model"] > asyn.exposed_comm_seconds.get("model", 0.0)
    assert asyn.step_seconds < sync.step_seconds
    assert sync.comm_seconds["model"] == pytest.approx(asyn.comm_seconds["model"])


def test_data_parallel_reduction_overlaps_the_backward_unless_told_not_to():
    over = _est(CFG, "dp", {"data": 8}, dp_overlap=True)
    after = _est(CFG, "dp", {"data": 8}, dp_overlap=False)
    assert after.exposed_comm_seconds["data"] > over.exposed_comm_seconds["data"]
    assert after.exposed_comm_seconds["data"] == pytest.approx(after.comm_seconds["data"], rel=1e-9)


def test_a_pipeline_is_clocked_with_its_schedule_and_its_bubble():
    cfg = CFG.replace(num_layers=8)
    one = train.estimate(cfg, "tp", {"model": 2}, "h100", batch=32, seq=2048, pipeline=4, microbatches=8)
    inter = train.estimate(cfg, "tp", {"model": 2}, "h100", batch=32, seq=2048, pipeline=4, microbatches=8,
                           virtual_stages=2)
    assert one.chips == 8 and one.phases["bubble"] > 0
    # 1F1B idles (p - 1) / (m + p - 1) = 3/11 of the clock with equal stages; the head makes the
    # last stage the busiest, so the others' extra wait is hidden behind it: a little less
    assert 0.15 < one.phases["bubble"] / one.step_seconds < 3 / 11
    assert inter.phases["bubble"] < 0.85 * one.phases["bubble"]   # 2 chunks: less idle, twice the sends
    with pytest.raises(ValueError, match="not divisible by pipeline x virtual_stages"):
        train.estimate(cfg, "tp", {"model": 2}, "h100", batch=32, seq=2048, pipeline=3)
    with pytest.raises(ValueError, match="schedule='dualpipe' is not one of"):
        train.estimate(cfg, "tp", {"model": 2}, "h100", batch=32, seq=2048, pipeline=2, schedule="dualpipe")


def test_memory_bound_work_is_priced():
    e = _est()
    ew = cost.formulas.layer_elementwise_bytes(1024, 4096, 8, 8, 128, tp=2)
    assert ew > 0 and e.phases["optimizer"] > 0
    unfused = _est(attention="unfused")
    assert unfused.phases["forward"] > e.phases["forward"]    # s x s scores through HBM, all of them
    with pytest.raises(ValueError, match="attention='sparse'"):
        _est(attention="sparse")


def test_the_estimate_displays_itself():
    e = _est(remat="full")
    text = str(e)
    assert "MFU" in text and "backward" in text and "fits" in text and "█" in text
    html = e._repr_html_()
    assert "<table>" in html and "recompute" in html and "HBM" in html
    assert e.tokens_per_second == pytest.approx(8 * 2048 / (e.step_seconds * 8))
    console = Console(record=True, width=100)
    console.print(e)
    shown = console.export_text()
    assert "recompute" in shown and "activations" in shown and "MFU" in shown


def test_a_chip_without_a_preset_is_refused_with_how_to_build_one():
    with pytest.raises(ValueError, match=r"\[estimate\] unknown preset 'tpu-v9'.*shardlab.hardware.Hardware\(name="):
        train.estimate(CFG, "fsdp", {"data": 8}, "tpu-v9", batch=8, seq=128)
