"""train.search: the layout of the chips, every factorization, the answer with X_opt beside it,
the ranked display, the cache, and no progress bar where nobody watches."""

import importlib

import pytest

from shardlab import train
from shardlab.models import ModelConfig, presets

search_mod = importlib.import_module("shardlab.train.search")   # train.search is the function
estimate_mod = importlib.import_module("shardlab.train.estimate")

SMALL = ModelConfig(num_layers=2, d_model=1024, ffw_dim=4096, num_heads=16, vocab_size=32000, max_seq_len=2048)


def test_plans_follow_the_hardware_layout():
    tpu = search_mod.plans("tpu-v5p", 4096, ("fsdp", "fsdp_tp", "tp"))
    assert tpu[0][1] == {"x": 16, "y": 16, "z": 16} and tpu[0][0].data == ("x", "y", "z")
    fsdp_tp = [m for s, m in tpu if s.name == "fsdp_tp"]
    assert [m["model"] for m in fsdp_tp] == [2 ** i for i in range(1, 12)]            # every Y dividing 4096
    assert fsdp_tp[1] == {"x": 32, "y": 32, "model": 4}                               # the book's X=1024, Y=4
    assert [m for s, m in tpu if s.name == "tp"] == [{"model": 4096}]
    gpu = search_mod.plans("h100", 64, ("fsdp", "fsdp_tp"))
    assert gpu[0][1] == {"node": 8, "gpu": 8}
    assert {"x": 2, "y": 2, "model": 4} in [m for _, m in search_mod.plans("tpu-v5p", 16, ("fsdp_tp",))]
    assert search_mod.plans("tpu-v5e", 256, ("dp",))[0][1] == {"x": 16, "y": 16}      # a 2-D torus


def test_the_books_16x16x16_question():
    # part 5, question 3: LLaMA-2 13B, 3M tokens (96 x 32k) on a v5p 16x16x16, bf16 params, fp32 Adam
    cfg = presets.get("llama2-13b")
    r = train.search(cfg, "tpu-v5p", chips=4096, batch=96, seq=32768, remat="ffw_outputs")
    assert r.best is r["best"] and r.best.fits
    assert r.best.step_seconds == min(e.step_seconds for e in r.table if e.fits)
    assert [e.step_seconds for e in r.table if e.fits] == sorted(e.step_seconds for e in r.table if e.fits)
    # "pure data parallelism cannot be used: ~130GB of params and optimizer state per chip"
    dp = next(e for e in r.table if e.strategy == "dp")
    assert not dp.fits and dp.memory["params"] + dp.memory["optimizer"] > 96e9
    # 40 heads: a model axis of 2, 4 or 8; 16 and up are skipped, saying why
    assert {e.mesh["model"] for e in r.table if e.strategy == "fsdp_tp"} == {2, 4, 8}
    assert any("num_heads 40 is not divisible by the model axis 'model' of size 16" in why for _, _, why in r.skipped)
    assert r.x_opt == pytest.approx(train.x_opt(96 * 32768, 13824, 4096, 2, 1))      # ~1365 (the book: 1333 at 3e6)
    assert r.crossover["fsdp_tp"] == pytest.approx(4096 * 2550 ** 2 / (2 * 13824), rel=1e-3)
    text = r.text()
    assert "X_opt = 1,365" in text and text.index("fsdp_tp") < text.index(" dp ")
    html = r._repr_html_()
    assert html.count('style="font-weight:bold') == 1 and html.count("<tr") == len(r.table) + 1


def test_the_cache_prices_each_plan_once(monkeypatch):
    search_mod.clear_cache()
    calls = []
    real = search_mod.estimate
    monkeypatch.setattr(search_mod, "estimate", lambda *a, **k: calls.append(a[1].name) or real(*a, **k))
    first = train.search(SMALL, "tpu-v5p", chips=16, batch=16, seq=2048, strategies=("fsdp", "fsdp_tp"))
    n = len(calls)
    assert n == 1 + 3                       # fsdp, and fsdp_tp with a model axis of 2, 4, 8
    again = train.search(SMALL, "tpu-v5p", chips=16, batch=16, seq=2048, strategies=("fsdp", "fsdp_tp", "dp"),
                         remat=("full", "none"))
    assert len(calls) == n + 1 + 5          # only dp with full remat, and the five plans without remat, are new
    assert again.best.step_seconds <= first.best.step_seconds


def test_no_progress_bar_when_nobody_watches(capsys):
    train.search(SMALL, "tpu-v5p", chips=16, batch=16, seq=2048, strategies=("fsdp",))
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_bad_input():
    with pytest.raises(ValueError, match=r"\[search\] unknown preset 'tpu-v9'.*shardlab.hardware.Hardware\("):
        train.search(SMALL, "tpu-v9", chips=16, batch=16, seq=2048)
    with pytest.raises(ValueError, match=r"\[strategy\] 'fsdp_pp' is not a strategy; use one of dp, zero1"):
        train.search(SMALL, "tpu-v5p", chips=16, batch=16, seq=2048, strategies=("fsdp_pp",))
    with pytest.raises(ValueError, match=r"\[search\] remat 'half' is not a recompute policy"):
        train.search(SMALL, "tpu-v5p", chips=16, batch=16, seq=2048, remat="half")
    with pytest.raises(ValueError, match=r"\[search\] chips=0 must be an int >= 1"):
        train.search(SMALL, "tpu-v5p", chips=0, batch=16, seq=2048)
    with pytest.raises(ValueError, match=r"\[search\] no plan can split the model over 16 chips: tp"):
        train.search(SMALL.replace(num_heads=8, head_dim=128), "tpu-v5p", chips=16, batch=16, seq=2048,
                     strategies=("tp",))


def test_a_strategy_of_your_own_is_laid_out_too():
    mine = train.Strategy("mine", data=("a", "b"), model="m", zero=3, sequence_parallel=True)
    r = train.search(SMALL, "tpu-v5p", chips=16, batch=16, seq=2048, strategies=(mine,))
    assert {tuple(e.mesh) for e in r.table} <= {("x", "y", "model"), ("x", "model")} and r.best.strategy == "mine"
    with pytest.raises(ValueError, match=r"\[search\] strategy 'hierarchical' cannot be laid over the mesh axes"):
        train.search(SMALL, "tpu-v5p", chips=16, batch=16, seq=2048, strategies=(train.hierarchical(),))


LONG = ModelConfig(num_layers=4, d_model=1024, ffw_dim=4096, num_heads=8, vocab_size=32000, max_seq_len=32768)


def test_a_long_sequence_picks_context_parallelism_and_short_ones_do_not():
    assert {"cp", "fsdp_cp"} <= set(search_mod.DEFAULT_STRATEGIES)
    long = train.search(LONG, "tpu-v5p", chips=4, batch=1, seq=32768)
    assert long.best.strategy in ("cp", "fsdp_cp") and long.best.mesh["context"] > 1
    # the data-parallel plans cut the one sequence over their axes and gather each layer's K/V
    fsdp = next(e for e in long.table if e.strategy == "fsdp")
    assert fsdp.sequence_chunks == 4 and any("K/V gathered" in n for n in fsdp.notes)
    assert fsdp.step_seconds > long.best.step_seconds
    short = train.search(LONG, "tpu-v5p", chips=4, batch=4, seq=2048)
    assert "context" not in short.best.mesh
    # ring chunks of fewer than MIN_RING_CHUNK tokens are not tried
    sizes = [m["context"] for s, m in search_mod.plans("tpu-v5p", 4096, ("fsdp_cp",), seq=32768)]
    assert sizes == [2, 4, 8, 16, 32, 64, 128] and 32768 // (2 * 128) == search_mod.MIN_RING_CHUNK
    # TP and a ring together: each pair of sizes that covers the chips (cp_tp has no data axis)
    both = [m for s, m in search_mod.plans("tpu-v5p", 16, ("cp_tp",), seq=2048)]
    assert both == [{"model": 2, "context": 8}, {"model": 4, "context": 4}, {"model": 8, "context": 2}]
    r = train.search(LONG, "tpu-v5p", chips=8, batch=1, seq=4096, strategies=("cp_tp",))
    assert r.best.strategy == "cp_tp" and r.best.mesh["model"] * r.best.mesh["context"] == 8


@pytest.mark.parametrize("strategy, mesh", [("fsdp_cp", {"data": 2, "context": 8}), ("cp", {"context": 4})])
def test_the_ring_in_closed_form_prices_what_executing_it_does(monkeypatch, strategy, mesh):
    def est():
        return train.estimate(LONG, strategy, mesh, "tpu-v5p", batch=2, seq=4096, remat="full")

    closed = est()
    monkeypatch.setattr(estimate_mod._Ring, "RUN", 10**9)      # no closed form: every ring step executed
    executed = est()
    assert executed.step_seconds == pytest.approx(closed.step_seconds, rel=1e-9)
    assert executed.comm_seconds == pytest.approx(closed.comm_seconds, rel=1e-9)
    assert executed.phases == pytest.approx(closed.phases, rel=1e-9)
    assert executed.hfu == pytest.approx(closed.hfu, rel=1e-9) and executed.memory == closed.memory
    hops = [e for e in executed.ledger.events if e["op"] == "ppermute"]
    assert len(hops) > len([e for e in closed.ledger.events if e["op"] == "ppermute"])
