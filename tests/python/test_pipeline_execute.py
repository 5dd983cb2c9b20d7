"""shardlab.train.pipeline.execute: schedules run on real data equal the non-pipelined step; the
executed ledger (ppermute sends, per-stage FLOPs) feeds the clock; bad input is rejected."""

import numpy as np
import pytest

import shardlab as sl
from shardlab.models import ModelConfig, transformer
from shardlab.train import pipeline as pp

from pipeline_cases import CFG, TGT, TIED, TOK, init_params, leaves


@pytest.fixture(scope="module")
def reference():
    return pp.reference_step(init_params(), TOK, TGT, CFG)


def test_reference_step_is_the_model_loss_and_its_gradient():
    params = init_params()
    loss, grads = pp.reference_step(params, TOK[:2], TGT[:2], CFG)
    assert abs(loss - float(np.asarray(transformer.loss(params, TOK[:2], TGT[:2], CFG)))) < 1e-6
    # central differences on a few entries, in float64 through the float32 model
    for path in (("layers", 1, "mlp", "w_down", (3, 5)), ("embed", (int(TOK[0, 0]), 2)), ("head", (4, 7))):
        *keys, idx = path
        leaf = params
        for k in keys:
            leaf = leaf[k]
        g = grads
        for k in keys:
            g = g[k]
        old = leaf[idx]
        vals = []
        for d in (1e-2, -1e-2):
            leaf[idx] = old + d
            vals.append(float(np.asarray(transformer.loss(params, TOK[:2], TGT[:2], CFG))))
        leaf[idx] = old
        assert abs((vals[0] - vals[1]) / 2e-2 - float(g[idx])) < 2e-3


SCHEDULES = [("gpipe", lambda p, m: pp.gpipe(p, m)), ("1f1b", lambda p, m: pp.one_f_one_b(p, m)),
             ("interleaved", lambda p, m: pp.interleaved_1f1b(p, m, 2)), ("zb-h1", lambda p, m: pp.zb_h1(p, m)),
             ("zb-v", lambda p, m: pp.zb_v(p, m))]


@pytest.mark.parametrize("name,build", SCHEDULES)
@pytest.mark.parametrize("shape,names", [((2,), ("stage",)), ((2, 2), ("stage", "data"))])
def test_every_schedule_equals_the_non_pipelined_step(reference, name, build, shape, names):
    mesh = sl.make_mesh(shape, names)
    ex = pp.execute(build(2, 4), init_params(), TOK, TGT, CFG, mesh)
    loss, grads = reference
    assert abs(ex.loss - loss) <= 1e-5
    for a, b in zip(leaves(ex.grads), leaves(grads)):
        assert a.shape == b.shape and np.max(np.abs(a - b)) <= 1e-5
    # every action ran once, in an order each device's list allows
    assert sorted(map(str, ex.order)) == sorted(str(a) for acts in ex.schedule.actions for a in acts)
    for s in range(2):
        assert [a for a in ex.order if a.stage == s] == list(ex.schedule.actions[s])


def test_four_stages_and_a_tied_embedding_with_learned_positions():
    params = init_params(TIED)
    loss, grads = pp.reference_step(params, TOK, TGT, TIED)
    ex = pp.execute(pp.one_f_one_b(2, 2), params, TOK, TGT, TIED, sl.make_mesh((2,), ("stage",)))
    assert abs(ex.loss - loss) <= 1e-5
    # the tied table's gradient has both parts: the first stage's gather and the last stage's head
    assert np.max(np.abs(ex.grads["embed"] - grads["embed"])) <= 1e-5
    ex4 = pp.execute(pp.one_f_one_b(4, 8), init_params(), TOK, TGT, CFG, sl.make_mesh((4,), ("stage",)))
    assert abs(ex4.loss - pp.reference_step(init_params(), TOK, TGT, CFG)[0]) <= 1e-5
    assert ex4.peak_live == pp.clock(ex4.schedule).peak_activations == (4, 3, 2, 1)


def test_sends_are_ppermute_events_of_the_activation():
    mesh = sl.make_mesh((2, 2), ("stage", "data"))
    ex = pp.execute(pp.one_f_one_b(2, 4), init_params(), TOK, TGT, CFG, mesh)
    sends = [a for acts in ex.schedule.actions for a in acts if a.kind == "send"]
    ppermutes = ex.ledger.filter(op="ppermute").events
    assert len(ppermutes) == len(sends) == 8
    local_bytes = (8 // 4 // 2) * 8 * 32 * 4          # microbatch 2 rows split over data=2, T=8, D=32, float32
    for a in sends:
        (e,) = [e for e in ex.action_events(a) if e["op"] == "ppermute"]
        assert e["axes"] == ("stage",) and e["bytes_sent"] == local_bytes
        dst = 1 - a.stage
        assert [tuple(x) for x in e["perm"]] == [(a.stage, dst)]
    # the backward passes record no collective over the data axis: the replicas' gradients are summed once
    for a in (a for acts in ex.schedule.actions for a in acts):
        assert not [e for e in ex.action_events(a) if e["op"] != "ppermute" and e.get("axes")]


@pytest.mark.parametrize("m", [2, 4])
def test_data_parallel_gradient_sum_once_per_step(reference, m):
    """One psum per device per step (a flat buffer of all its weight gradients), whatever m is."""
    mesh = sl.make_mesh((2, 2), ("stage", "data"))
    params = init_params()
    ex = pp.execute(pp.one_f_one_b(2, m), params, TOK, TGT, CFG, mesh)
    psums = ex.ledger.filter(op="psum").events
    assert len(psums) == 2 and all(e["axes"] == ("data",) for e in psums)
    assert psums == ex.gradient_all_reduce_events()
    stage_params = [pp.stages.split_params(params, CFG, ((range(0, 2)), range(2, 4)))[s] for s in range(2)]
    for s in range(2):
        (e,) = ex.gradient_all_reduce_events(s)
        assert e["label"] == f"pipeline/gradient all-reduce s{s}"
        assert e["bytes_in"] == 4 * sum(x.size for x in leaves(stage_params[s]))  # every weight of the stage, once
    for a, b in zip(leaves(ex.grads), leaves(reference[1])):
        assert np.max(np.abs(a - b)) <= 1e-5


def test_stage_flops_partition_the_model_and_feed_the_clock():
    mesh = sl.make_mesh((2,), ("stage",), hardware="tpu-v5e")
    ex = pp.execute(pp.gpipe(2, 4), init_params(), TOK, TGT, CFG, mesh)
    fl = ex.stage_flops()
    # one microbatch through the whole model on one device (a one-stage pipeline: not pipelined)
    whole = pp.execute(pp.gpipe(1, 1), init_params(), TOK[:2], TGT[:2], CFG, sl.make_mesh((1,), ("stage",))).ledger
    fwd = sum(e["flops"] for e in whole.events if e["phase"] == "forward")
    bwd = sum(e["flops"] for e in whole.events if e["phase"] == "backward")
    assert fwd > 0 and bwd > fwd
    assert sum(fl["forward"]) == fwd and sum(fl["backward"]) == bwd
    assert fl["backward_weight"] == (0.0, 0.0)
    # the clock's durations are the executed events' seconds; the busy time of each stage is theirs
    tl = ex.timeline()
    assert tl.source == "executed ledger on tpu-v5e"
    for s in range(2):
        secs = sum(e["seconds"] for a in ex.schedule.actions[s] if a.payload is None
                   for e in ex.action_events(a))
        assert abs(tl.busy[s] - secs) <= 1e-12 * max(1.0, secs) + 1e-18
    send = [e["seconds"] for e in ex.ledger.filter(op="ppermute").events]
    assert tl.durations["send"][0] == max(send) > 0


def _matmul_weight_flops(params, layer_ids, tokens: int, head: bool) -> float:
    """2 * tokens * size of every 2-D weight a stage multiplies by (its weight-gradient matmuls)."""
    ws = [w for i in layer_ids for part in ("attn", "mlp") for w in params["layers"][i][part].values() if w.ndim == 2]
    if head:
        ws.append(params["head"])
    return sum(2.0 * tokens * w.size for w in ws)


def test_zb_h1_splits_input_and_weight_gradients():
    mesh = sl.make_mesh((2,), ("stage",), hardware="h100")
    params = init_params()
    ex = pp.execute(pp.zb_h1(2, 4), params, TOK, TGT, CFG, mesh)
    fl = ex.stage_flops()
    one = pp.execute(pp.one_f_one_b(2, 4), params, TOK, TGT, CFG, mesh).stage_flops()
    tokens = 2 * 8   # a microbatch: 2 rows of 8 tokens
    for vs, layer_ids in enumerate((range(0, 2), range(2, 4))):
        dw = _matmul_weight_flops(params, layer_ids, tokens, head=vs == 1)
        # the weight step runs the weight-gradient matmuls; the input step does not
        assert fl["backward_weight"][vs] >= dw
        assert fl["backward_input"][vs] <= one["backward"][vs] - dw
        # both halves together: the whole backward plus what the weight step recomputes inside each
        # piece (the input gradient of the matmul behind its first weight), under a quarter more
        assert one["backward"][vs] < fl["backward"][vs] < 1.25 * one["backward"][vs]
    # a weight action's events are backward matmuls of its pieces (a transpose carries the scope of the
    # forward op it transposes, as in JAX)
    w = pp.Action("backward_weight", 1, 2)
    evs = ex.action_events(w)
    assert "matmul" in {e["op"] for e in evs} and all(e["phase"] == "backward" for e in evs)
    assert {e["label"].rsplit("/", 1)[1] for e in evs} == {"layer2.attn", "layer2.mlp", "layer3.attn", "layer3.mlp",
                                                           "head"}
    assert ex.peak_live == pp.clock(ex.schedule).peak_activations


def test_zb_h1_executed_timeline_beats_1f1b_at_equal_peak_memory():
    cfg = ModelConfig(num_layers=4, d_model=64, ffw_dim=256, num_heads=4, num_kv_heads=4, vocab_size=64)
    params = transformer.init_params(cfg, seed=0)
    rng = np.random.default_rng(1)
    tok, tgt = rng.integers(0, 64, (16, 16)), rng.integers(0, 64, (16, 16))
    mesh = sl.make_mesh((4,), ("stage",), hardware="tpu-v5e")
    one = pp.execute(pp.one_f_one_b(4, 8), params, tok, tgt, cfg, mesh)
    zb = pp.execute(pp.zb_h1(4, 8), params, tok, tgt, cfg, mesh)
    assert abs(zb.loss - one.loss) <= 1e-6
    t1, tz = one.timeline(), zb.timeline()
    assert max(zb.peak_live) == max(one.peak_live) == max(tz.peak_activations) == max(t1.peak_activations) == 4
    assert tz.bubble_fraction < t1.bubble_fraction
    assert tz.step_time < t1.step_time
    # ZB-H1 does more work (the recomputation in its weight steps) and still finishes first
    assert sum(tz.busy) > sum(t1.busy)


def test_forward_only_schedule_gives_the_loss():
    ex = pp.execute(pp.gpipe(2, 4, forward_only=True), init_params(), TOK, TGT, CFG, sl.make_mesh((2,), ("stage",)))
    assert ex.grads is None
    assert abs(ex.loss - float(np.asarray(transformer.loss(init_params(), TOK, TGT, CFG)))) < 1e-5


def test_bad_input():
    params = init_params()
    with pytest.raises(ValueError, match=r"\[pipeline.execute\] the mesh has no pipeline axis 'stage' "
                                         r"\(axes \('x',\)\)"):
        pp.execute(pp.gpipe(2, 2), params, TOK, TGT, CFG, sl.make_mesh((2,), ("x",)))
    with pytest.raises(ValueError, match=r"'stage' axis has 4 devices but the schedule has p=2"):
        pp.execute(pp.gpipe(2, 2), params, TOK, TGT, CFG, sl.make_mesh((4,), ("stage",)))
    with pytest.raises(ValueError, match=r"batch 8 is not divisible by m=3 microbatches"):
        pp.execute(pp.gpipe(2, 3), params, TOK, TGT, CFG, sl.make_mesh((2,), ("stage",)))
    with pytest.raises(ValueError, match=r"microbatch 1 \(batch 8 / m=8\) is not divisible by the 2 devices"):
        pp.execute(pp.gpipe(2, 8), params, TOK, TGT, CFG, sl.make_mesh((2, 2), ("stage", "data")))
    with pytest.raises(ValueError, match=r"8 pipeline stages \(p \* v\) for 4 layers"):
        pp.execute(pp.interleaved_1f1b(4, 4, 2), params, TOK, TGT, CFG, sl.make_mesh((4,), ("stage",)))
    with pytest.raises(ValueError, match=r"built for layers .* but the model has 4 layers"):
        pp.execute(pp.one_f_one_b(2, 2, num_layers=6), params, TOK, TGT, CFG, sl.make_mesh((2,), ("stage",)))
    with pytest.raises(ValueError, match=r"m=6 microbatches is not a multiple of p=4"):
        pp.interleaved_1f1b(4, 6, 2)
    ex = pp.execute(pp.gpipe(2, 2), params, TOK, TGT, CFG, sl.make_mesh((2,), ("stage",)))
    with pytest.raises(ValueError, match=r"has no seconds: build the mesh with hardware="):
        ex.durations()


def test_uneven_stages_and_interleaving_on_three_devices(reference):
    # 4 layers over 3 stages: (2, 1, 1) layers; the first stage's forward costs the most FLOPs
    mesh = sl.make_mesh((3,), ("stage",), hardware="tpu-v5e")
    ex = pp.execute(pp.one_f_one_b(3, 4), init_params(), TOK, TGT, CFG, mesh)
    assert abs(ex.loss - reference[0]) <= 1e-5
    for a, b in zip(leaves(ex.grads), leaves(reference[1])):
        assert np.max(np.abs(a - b)) <= 1e-5
    f = ex.stage_flops()["forward"]
    assert f[0] > f[1] and ex.timeline().busy[0] > ex.timeline().busy[1]
