"""Hierarchical gradient reduction over a DCN axis (train.hierarchical): executed on a 2x4
("dcn", "data") mesh of TPU v5p, equal to one device, DCN bytes from the ledger equal to the
closed form and smaller than the flat all-reduce's, priced by estimate at dcn_bandwidth."""

import numpy as np
import pytest

import shardlab as sl
from shardlab import train
from shardlab.models import ModelConfig, param_count, transformer
from shardlab.train.hierarchical import dcn_bytes_closed_form, flat_dcn_bytes_closed_form
from training_reference import rel_error

# every dimension (D = 32, F = 64, V = 64, heads 4 x 8) divisible by the slice size 4
CFG = ModelConfig(num_layers=1, d_model=32, ffw_dim=64, num_heads=4, vocab_size=64, max_seq_len=8)
S, X = 2, 4


def _mesh():
    return sl.make_mesh((S, X), ("dcn", "data"), hardware="tpu-v5p", physical_axes={"dcn": "dcn"})


OPT = train.AdamW(lr=1e-3, eps=1e-3, weight_decay=0.1)  # eps keeps vanishing gradients out of the sign noise


def _run(strategy, steps=5):
    t = train.Trainer(CFG, strategy, _mesh(), optimizer=OPT)
    params = transformer.init_params(CFG)
    state, ref, ref_state = t.init(params), params, None
    rng = np.random.default_rng(3)
    with sl.Ledger() as ledger:
        for i in range(steps):
            tok, tgt = rng.integers(0, 64, (8, 8)), rng.integers(0, 64, (8, 8))
            state, _ = t.step(state, tok, tgt)
            ref, ref_state = train.reference_step(CFG, ref, tok, tgt, OPT, i + 1, ref_state)
    return state, ref, ledger


def _sent(ledger, pred):
    return sum(e["bytes_sent"] for e in ledger.events if e["axes"] and pred(e["axes"]))


def _grad_bytes():
    return 4 * param_count(CFG).total  # fp32 gradients


@pytest.mark.parametrize("zero", [1, 3])
def test_five_steps_equal_one_device_and_the_dcn_carries_one_xth(zero):
    state, ref, ledger = _run(train.hierarchical(zero=zero))
    assert rel_error(state.params, ref) <= 1e-5
    # only the 1/X shard crosses the DCN: 2·(S−1)/S·G/X per chip per step
    dcn = _sent(ledger, lambda axes: axes == ("dcn",))
    assert dcn == pytest.approx(5 * dcn_bytes_closed_form(_grad_bytes(), X, S), rel=1e-12)
    # inside the slice: reduce-scatter + all-gather of the gradients (ZeRO-3: + the re-gather, but for
    # the embedding table, whose lookup's gradient does not read it)
    ici = _sent(ledger, lambda axes: axes == ("data",))
    table = 4 * CFG.vocab_size * CFG.d_model if zero == 3 else 0
    assert ici == pytest.approx(5 * (X - 1) / X * ((2 if zero == 1 else 3) * _grad_bytes() - table), rel=1e-12)
    # nothing else crosses the DCN but the loss' scalar psum
    assert _sent(ledger, lambda axes: "dcn" in axes and axes != ("dcn",)) == 5 * 2 * (S * X - 1) / (S * X) * 4


def test_the_flat_all_reduce_sends_more_over_the_dcn():
    _, _, hier = _run(train.hierarchical(), steps=1)
    state, ref, flat = _run(train.Strategy("dp", data=("dcn", "data")), steps=1)
    assert rel_error(state.params, ref) <= 1e-5
    flat_dcn = _sent(flat, lambda axes: "dcn" in axes) - 2 * (S * X - 1) / (S * X) * 4  # minus the loss psum
    assert flat_dcn == pytest.approx(flat_dcn_bytes_closed_form(_grad_bytes(), X, S), rel=1e-12)
    hier_dcn = _sent(hier, lambda axes: axes == ("dcn",))
    assert hier_dcn * X * S / (S - 1) == pytest.approx(flat_dcn * S * X / (S * X - 1), rel=1e-12)  # = 1/X·(N-1)/N ratio
    assert hier_dcn < flat_dcn / 6


def test_estimate_prices_the_dcn_axis_at_the_dcn_bandwidth():
    hw = sl.hardware.get("tpu-v5p")
    cfg = ModelConfig(num_layers=2, d_model=1024, ffw_dim=4096, num_heads=8, vocab_size=32768, max_seq_len=1024)
    e = train.estimate(cfg, train.hierarchical(data=("x", "y"), zero=3), {"dcn": 4, "x": 4, "y": 4}, "tpu-v5p",
                       batch=64, seq=1024)
    events = [ev for ev in e.ledger.events if ev["axes"] == ("dcn",)]
    sent = sum(ev["bytes_sent"] for ev in events)
    assert sent == pytest.approx(dcn_bytes_closed_form(2 * param_count(cfg).total, 16, 4), rel=1e-12)
    # each all-reduce: its bytes at the per-chip DCN bandwidth (6.25 GB/s), not an ICI link's 90 GB/s,
    # or 3 ring steps x 2 hops of the DCN latency (10 us) for the small ones (norm scales)
    for ev in events:
        assert ev["seconds"] == pytest.approx(max(ev["bytes_sent"] / hw.dcn_bandwidth, ev["hops"] * hw.dcn_latency))
    assert sum(ev["bound"] == "bandwidth" for ev in events) >= 8
    # the estimate prices the same events with the chip's price list (the DCN reaches 90 % of its bandwidth
    # and costs step_overhead["dcn"] per ring step: 2 (4 - 1) of each all-reduce)
    assert e.comm_seconds["dcn"] == pytest.approx(sum(sl.cost.price_event(ev, mesh=e.ledger.mesh) for ev in events), rel=1e-12)
    steps = len(events) * 6 * sl.cost.price_list("tpu-v5p").step_overhead["dcn"]
    assert sum(ev["seconds"] for ev in events) + steps < e.comm_seconds["dcn"] < sum(ev["seconds"] for ev in events) / 0.9 + steps + 1e-12
    # the same mesh as a Mesh: a flat strategy must be told that 'dcn' is the DCN (a 3-axis mesh
    # on the 3-D v5p torus would otherwise lay it on ICI x)
    mesh = sl.make_mesh((4, 4, 4), ("dcn", "x", "y"), hardware="tpu-v5p", physical_axes={"dcn": "dcn"}, abstract=True)
    flat_fsdp = train.estimate(cfg, train.Strategy("flat", data=("dcn", "x", "y"), zero=3), mesh, "tpu-v5p",
                               batch=64, seq=1024)
    # gathers weights across slices too: forward all P params, backward all but the embedding table
    # (its lookup's gradient does not read it), reduce-scatters all P, each staged over the DCN on
    # 1/16 of the array ((S-1)/S·V/16), against the hierarchical all-reduce's 2·(S-1)/S·G/16:
    # (2P + 2(P - VD) + 2P) / (2·2P) = 1 + (P - VD)/(2P) = 4/3 here (VD is a third of P, head untied)
    P, VD = param_count(cfg).total, cfg.vocab_size * cfg.d_model
    by_phase = {}
    for ev in flat_fsdp.ledger.events:
        if ev["axes"] == ("dcn", "x", "y") and ev["op"] in ("all_gather", "psum_scatter"):
            k = (ev["op"], ev["phase"])
            by_phase[k] = by_phase.get(k, 0) + (ev["bytes_out"] if ev["op"] == "all_gather" else ev["bytes_in"])
    assert by_phase == {("all_gather", "forward"): 2 * P, ("all_gather", "recompute"): 2 * (P - VD),
                        ("psum_scatter", "backward"): 2 * P}
    ratio = 1 + (P - VD) / (2 * P)
    assert ratio == pytest.approx(4 / 3, rel=1e-4)   # but for the 5k norm scales
    # the DCN stages alone take `ratio` x the hierarchical DCN seconds; the flat plan's ICI stages
    # add at most the hierarchical plan's own ICI seconds for the same gathers and scatters, and its
    # DCN stages their step overhead (3 ring steps each, against the all-reduce's 6 per 2 stages)
    flat_steps = sum(ev["axes"] == ("dcn", "x", "y") for ev in flat_fsdp.ledger.events) * 3 * \
        sl.cost.price_list("tpu-v5p").step_overhead["dcn"]
    assert ratio * e.comm_seconds["dcn"] < flat_fsdp.comm_seconds["dcn+x+y"] < \
        ratio * e.comm_seconds["dcn"] + e.comm_seconds["x+y"] + flat_steps
    # a flat psum is priced by its best staged plan, which is the hierarchical one: same DCN seconds
    flat_dp = train.estimate(cfg, train.Strategy("dp", data=("dcn", "x", "y")), mesh, "tpu-v5p", batch=64, seq=1024)
    assert flat_dp.comm_seconds["dcn+x+y"] == pytest.approx(e.comm_seconds["dcn"], rel=0.06)


def test_bad_meshes_and_stages_are_refused():
    with pytest.raises(ValueError, match=r"\[hierarchical\] mesh axis 'dcn' is laid over 'x' of tpu-v5p"):
        train.Trainer(CFG, train.hierarchical(), sl.make_mesh((S, X), ("dcn", "data"), hardware="tpu-v5p"))
    with pytest.raises(ValueError, match=r"zero=0 all-reduces every gradient"):
        train.hierarchical(zero=0)
    with pytest.raises(ValueError, match=r"cross-slice axis 'pod' is not one of the data axes"):
        train.Hierarchical("h", data=("data",), zero=1, dcn="pod")
    with pytest.raises(ValueError, match=r"have no axis inside the slice"):
        train.Hierarchical("h", data=("dcn",), zero=1)


def test_the_rules_and_collectives_say_where_each_byte_goes():
    s = train.hierarchical()
    assert s.rules()["states"] == {"embed": ("data",)} and s.rules()["activations"] == {"batch": ("dcn", "data")}
    assert [r[1:] for r in s.collectives()] == [("psum_scatter", ("data",)), ("psum", ("dcn",)),
                                                ("all_gather", ("data",))]
    z3 = train.hierarchical(data=("x", "y"), zero=3, model="model")
    ops = [r[1:] for r in z3.collectives()]
    assert ("psum", ("dcn",)) in ops and ("all_gather", ("x", "y")) in ops and ("psum", ("model",)) in ops
    assert not any("dcn" in axes and op == "all_gather" for op, axes in ops)   # weights never cross the DCN


def test_estimate_puts_a_dict_mesh_axis_named_dcn_on_the_dcn():
    """A flat strategy over ("dcn", "data") on a TPU: the "dcn" axis is priced on the
    data-centre network (6.25 GB/s per v5p chip), not on a torus axis."""
    big = ModelConfig(num_layers=2, d_model=1024, ffw_dim=4096, num_heads=8, vocab_size=32000)
    over_dcn = train.estimate(big, train.strategies.dp(data=("dcn", "data")), {"dcn": 4, "data": 16},
                              "tpu-v5p", batch=64, seq=2048)
    over_ici = train.estimate(big, train.strategies.dp(data=("rep", "data")), {"rep": 4, "data": 16},
                              "tpu-v5p", batch=64, seq=2048)
    assert over_dcn.comm_seconds["dcn+data"] > 2 * over_ici.comm_seconds["rep+data"]
