"""3-D parallelism: a pipeline over ``stage`` with data parallelism over ``data`` and Megatron tensor
parallelism (heads, F, vocabulary split over ``model``) inside every stage. The step equals the
non-pipelined one for every schedule; the ledger holds the TP all-reduces inside each action with
the book's bytes, activation-block sends, and one data-parallel gradient sum per device per step."""

import numpy as np
import pytest

import shardlab as sl
from shardlab.models import ModelConfig, param_axes, transformer
from shardlab.train import pipeline as pp

from pipeline_cases import CFG, TGT, TIED, TOK, init_params, leaves

MESH3 = ((2, 2, 2), ("stage", "data", "model"))
TP_AXES = {"heads", "kv", "mlp", "vocab"}   # the logical axes Megatron splits over the model axis


@pytest.fixture(scope="module")
def reference():
    return pp.reference_step(init_params(), TOK, TGT, CFG)


SCHEDULES = [("gpipe", lambda: pp.gpipe(2, 4)), ("1f1b", lambda: pp.one_f_one_b(2, 4)),
             ("interleaved", lambda: pp.interleaved_1f1b(2, 4, 2)), ("zb-h1", lambda: pp.zb_h1(2, 4)),
             ("zb-v", lambda: pp.zb_v(2, 4)), ("dualpipe-v", lambda: pp.dualpipe_v(2, 4))]


@pytest.mark.parametrize("name,build", SCHEDULES)
def test_every_schedule_on_a_2x2x2_mesh_equals_the_non_pipelined_step(reference, name, build):
    ex = pp.execute(build(), init_params(), TOK, TGT, CFG, sl.make_mesh(*MESH3))
    loss, grads = reference
    assert abs(ex.loss - loss) <= 1e-5
    for a, b in zip(leaves(ex.grads), leaves(grads)):
        assert a.shape == b.shape and np.max(np.abs(a - b)) <= 1e-5
    # tensor parallelism really ran: every forward holds psums over the model axis
    fwd = [a for acts in ex.schedule.actions for a in acts if a.kind == "forward"]
    assert all(any(e["op"] == "psum" and e["axes"] == ("model",) for e in ex.action_events(a)) for a in fwd)


def test_tied_embedding_with_learned_positions_vocab_parallel():
    params = init_params(TIED)
    loss, grads = pp.reference_step(params, TOK, TGT, TIED)
    ex = pp.execute(pp.one_f_one_b(2, 2), params, TOK, TGT, TIED, sl.make_mesh(*MESH3))
    assert abs(ex.loss - loss) <= 1e-5
    # the table's two gradients (lookup on stage 0, head on stage 1), each over its vocabulary shards
    assert np.max(np.abs(ex.grads["embed"] - grads["embed"])) <= 1e-5
    assert np.max(np.abs(ex.grads["pos_embed"] - grads["pos_embed"])) <= 1e-5


def _local_param_bytes(cfg, layer_ids, first, last, y):
    """Bytes of a stage's weights on one device: a param with a Megatron axis holds 1/y of it."""
    axes = param_axes(cfg)
    params = init_params(cfg)
    trees = [(params["layers"][i], axes["layers"][i]) for i in layer_ids]
    if first:
        trees.append(({"embed": params["embed"]}, {"embed": axes["embed"]}))
    if last:
        trees.append(({"final_norm": params["final_norm"], "head": params["head"]},
                      {"final_norm": axes["final_norm"], "head": axes["head"]}))
    total = 0
    for p, a in trees:
        for x, ax in zip(leaves(p), leaves(a)):
            total += x.size // (y if TP_AXES & set(ax) else 1)
    return 4 * total


@pytest.mark.parametrize("build", [lambda: pp.one_f_one_b(2, 4), lambda: pp.zb_h1(2, 4)])
def test_the_ledger_split_by_axis(build):
    mesh = sl.make_mesh(*MESH3, hardware="tpu-v5e")
    ex = pp.execute(build(), init_params(), TOK, TGT, CFG, mesh)
    s = ex.schedule
    b_local, T, D = 8 // 4 // 2, 8, 32         # a microbatch of 2 rows over data=2; T=8, D=32
    block = b_local * T * D * 4                # the book's B.T.D activation block, float32
    layers = pp.stage_layers(4, 2)
    for acts in s.actions:
        for a in acts:
            evs = [e for e in ex.action_events(a) if e.get("axes")]
            model = [e for e in evs if e["axes"] == ("model",)]
            assert all(e["axes"] in (("model",), ("stage",)) for e in evs)   # no data-axis traffic inside
            first, last = a.stage == 0, a.stage == 1
            n_layers = len(layers[a.stage])
            if a.kind == "forward":
                # g after attention and after the MLP of every layer, the vocab-parallel lookup on the
                # first stage; on the last the softmax's max, sum and target logit (B.T floats each)
                big = [e for e in model if e["bytes_in"] == block]
                assert [e["op"] for e in big] == ["psum"] * (2 * n_layers + first)
                small = [e for e in model if e["bytes_in"] != block]
                assert sorted(e["op"] for e in small) == (["pmax", "psum", "psum"] if last else [])
                assert all(e["bytes_in"] == b_local * T * 4 for e in small)
            elif a.kind in ("backward", "backward_input"):
                # f before attention and before the MLP of every layer (and before the head)
                big = [(e["op"], e["bytes_in"]) for e in model if e["bytes_in"] != D * 4]
                assert big == [("psum", block)] * (2 * n_layers + last)
            if a.kind in ("backward", "backward_weight"):
                # the final norm runs inside the vocab-parallel head's piece: its scale's gradient (D
                # floats, from the vocabulary shards' partial input gradients) is summed over the model axis
                norm = [(e["op"], e["bytes_in"]) for e in model if e["bytes_in"] == D * 4]
                assert norm == ([("psum", D * 4)] if last else [])
            if a.kind == "backward_weight":
                assert [e for e in evs if e["bytes_in"] != D * 4] == []
            elif a.kind == "send":
                (e,) = evs
                assert e["op"] == "ppermute" and e["axes"] == ("stage",) and e["bytes_sent"] == block
    # the data-parallel gradient sum: once per device per step, of that device's shards
    data = [e for e in ex.ledger.events if e.get("axes") == ("data",)]
    assert data == ex.gradient_all_reduce_events() and len(data) == 2
    for st in range(2):
        (e,) = ex.gradient_all_reduce_events(st)
        assert e["op"] == "psum"
        assert e["bytes_in"] == _local_param_bytes(CFG, layers[st], st == 0, st == 1, 2)


def test_bad_input():
    params = init_params()
    with pytest.raises(ValueError, match=r"\[pipeline.execute\] num_heads 4 is not divisible by the model axis "
                                         r"'model' of size 3"):
        pp.execute(pp.gpipe(2, 2), params, TOK, TGT, CFG, sl.make_mesh((2, 3), ("stage", "model")))
    odd = ModelConfig(num_layers=2, d_model=36, ffw_dim=64, num_heads=6, num_kv_heads=3, vocab_size=51)
    with pytest.raises(ValueError, match=r"\[pipeline.execute\] ffw_dim 64 is not divisible by the model axis "
                                         r"'model' of size 3"):
        pp.execute(pp.gpipe(2, 2), transformer.init_params(odd, seed=0), TOK, TGT, odd,
                   sl.make_mesh((2, 3), ("stage", "model")))
    with pytest.raises(ValueError, match=r"\[pipeline.execute\] the mesh has no pipeline axis 'stage' "
                                         r"\(axes \('data', 'model'\)\)"):
        pp.execute(pp.gpipe(2, 2), params, TOK, TGT, CFG, sl.make_mesh((2, 2), ("data", "model")))
    with pytest.raises(ValueError, match=r"4 pipeline stages \(p \* v\) for 2 layers"):
        pp.execute(pp.one_f_one_b(4, 4), init_params(TIED), TOK, TGT, TIED,
                   sl.make_mesh((4, 1, 2), ("stage", "data", "model")))
    with pytest.raises(ValueError, match=r"model='stage' is the pipeline axis"):
        pp.execute(pp.gpipe(2, 2), params, TOK, TGT, CFG, sl.make_mesh((2,), ("stage",)), model="stage")


def test_model_none_makes_the_model_axis_a_data_axis(reference):
    ex = pp.execute(pp.one_f_one_b(2, 2), init_params(), TOK, TGT, CFG, sl.make_mesh(*MESH3), model=None)
    assert abs(ex.loss - reference[0]) <= 1e-5
    assert not [e for e in ex.ledger.events if e.get("axes") == ("model",)]
    assert {e["axes"] for e in ex.gradient_all_reduce_events()} == {("data", "model")}


@pytest.mark.parametrize("shape,names,build", [
    ((2, 2), ("stage", "data"), lambda: pp.one_f_one_b(2, 4)),
    ((2, 2, 2), ("stage", "data", "model"), lambda: pp.one_f_one_b(2, 4)),
    ((2, 2, 2), ("stage", "data", "model"), lambda: pp.zb_h1(2, 4)),
    ((2, 2, 2), ("stage", "data", "model"), lambda: pp.dualpipe_v(2, 4))])
def test_fsdp_over_the_data_axis(reference, shape, names, build):
    """ZeRO-3 inside the pipeline: each piece gathers its weights over `data` when it runs and its
    backward reduce-scatters their gradients; no end-of-step all-reduce."""
    ex = pp.execute(build(), init_params(), TOK, TGT, CFG, sl.make_mesh(shape, names), fsdp=True)
    loss, grads = reference
    assert abs(ex.loss - loss) <= 1e-5
    for a, b in zip(leaves(ex.grads), leaves(grads)):
        assert a.shape == b.shape and np.max(np.abs(a - b)) <= 1e-5
    assert ex.gradient_all_reduce_events() == []
    y = dict(zip(names, shape)).get("model", 1)
    for acts in ex.schedule.actions:
        for a in acts:
            data = [e for e in ex.action_events(a) if e.get("axes") == ("data",)]
            vs = ex.schedule.virtual_stage(a.stage, a.chunk)
            nv = ex.schedule.num_virtual_stages
            lay = pp.stage_layers(4, nv)[vs]
            # the stage's weights on one device of the model axis, gathered whole over data once per use
            local = _local_param_bytes(CFG, lay, vs == 0, vs == nv - 1, y)
            if a.kind == "forward":
                assert {e["op"] for e in data} == {"all_gather"}
                assert sum(e["bytes_out"] for e in data) == local
            elif a.kind in ("backward", "backward_weight"):
                assert {e["op"] for e in data} == {"psum_scatter"}
                assert sum(e["bytes_in"] for e in data) == local
            else:                     # the input-gradient step and the sends move no weight
                assert data == []


def test_fsdp_needs_a_data_axis():
    with pytest.raises(ValueError, match=r"\[pipeline.execute\] fsdp=True shards the weights over the data axes, "
                                         r"but the mesh has none besides the pipeline and model axes"):
        pp.execute(pp.gpipe(2, 2), init_params(), TOK, TGT, CFG, sl.make_mesh((2, 2), ("stage", "model")), fsdp=True)
