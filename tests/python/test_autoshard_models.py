"""autoshard on the model library's own training step: the models' global-view path (einsum
attention with rotary, one-hot embedding and loss) equals their kernel path on plain arrays,
and `plan_model` traces a real transformer step, solves it, runs the plan with the outputs
equal to the unsharded run and to ``train.reference_step``, and the ledger equal to the plan."""

import numpy as np
import pytest

import shardlab as sl
from shardlab import train
from shardlab.models import ModelConfig, param_axes, transformer
from shardlab.models.layers import attention, rotary

pytest.importorskip("highspy")

from shardlab.autoshard import compare, model, plan_model, plan_pipeline  # noqa: E402


def _global(tree, mesh):
    return sl.tree_util.tree_map(lambda a: sl.device_put(np.asarray(a), sl.NamedSharding(mesh, sl.P())), tree)


def _leaves_close(a, b, rtol):
    for x, y in zip(sl.tree_util.tree_leaves(a), sl.tree_util.tree_leaves(b)):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        assert x.shape == y.shape
        assert np.max(np.abs(x - y)) <= rtol * max(np.max(np.abs(y)), 1e-30)


@pytest.mark.parametrize("kv, fraction, causal", [(2, 1.0, True), (4, 1.0, False), (1, 0.5, True)])
def test_global_attention_and_rotary_equal_the_kernels(kv, fraction, causal):
    """Grouped-query, plain multi-head and partial rotary: the global-view path equals the
    flash kernel and the fused rotary on the same numbers."""
    cfg = ModelConfig(num_layers=1, d_model=32, ffw_dim=64, num_heads=4, num_kv_heads=kv, vocab_size=16,
                      rotary_fraction=fraction)
    mesh = sl.make_mesh((2,), ("x",))
    p = transformer.init_params(cfg, seed=1)["layers"][0]["attn"]
    x = np.random.default_rng(0).standard_normal((2, 8, 32)).astype(np.float32)
    local = attention(p, x, cfg, causal=causal)
    glob = attention(_global(p, mesh), _global(x, mesh), cfg, causal=causal)
    assert isinstance(glob, sl.ShardedArray)
    np.testing.assert_allclose(np.asarray(glob), local, rtol=1e-5, atol=1e-6)
    h = np.random.default_rng(1).standard_normal((2, 8, 4, 8)).astype(np.float32)
    # rotary is exact on both paths (one product per output)
    np.testing.assert_array_equal(np.asarray(rotary(_global(h, mesh), cfg, offset=3)), rotary(h, cfg, offset=3))


def test_global_loss_and_gradients_equal_the_local_model():
    cfg = ModelConfig(num_layers=2, d_model=16, ffw_dim=32, num_heads=2, num_kv_heads=1, vocab_size=32)
    params, tok, tgt = model.example_args(cfg, 4, 8)
    mesh = sl.make_mesh((2,), ("x",))
    loss, grads = sl.value_and_grad(lambda p: transformer.loss(p, tok, tgt, cfg))(params)
    gl, gg = sl.value_and_grad(lambda p, t, y: transformer.loss(p, t, y, cfg))(_global(params, mesh),
                                                                               *_global([tok, tgt], mesh))
    assert float(np.asarray(gl)) == pytest.approx(float(loss), rel=1e-6)
    _leaves_close(gg, grads, 1e-5)
    # the global embedding is exact (one nonzero per one-hot row)
    rows = transformer.embedding_lookup(_global(params["embed"], mesh), _global(tok, mesh))
    np.testing.assert_array_equal(np.asarray(rows), params["embed"][tok])


def test_plan_model_runs_the_model_step_equal_to_reference_and_ledger():
    """The one line on a 2x2 mesh (a rotary GQA transformer's SGD step, the batch and weights
    laid out as train's FSDP + TP, the rest searched): the plan runs, its ledger is the plan's
    collectives, and its new params are reference_step's."""
    cfg = ModelConfig(num_layers=1, d_model=16, ffw_dim=32, num_heads=4, num_kv_heads=2, vocab_size=32)
    mesh = sl.make_mesh((2, 2), ("x", "y"), hardware="tpu-v5p")
    plan = plan_model(cfg, mesh=mesh, batch=4, seq=4, in_specs=model.strategies(cfg, mesh)["fsdp_tp"])
    assert plan.specs["[0]['layers'][0]['attn']['wq']"] == sl.P("x", "y") and plan.specs["[1]"] == sl.P("x")
    args = model.example_args(cfg, 4, 4)
    res = plan.check(*args, rtol=1e-5)  # outputs = the unsharded program, ledger = plan.collectives
    seen = [(e["op"], tuple(e["axes"]), e["bytes_sent"]) for e in res["ledger"].events if e["axes"]]
    assert seen == [c.key() for c in plan.collectives] and len(seen) > 0
    (loss, new), _ = plan.run(*args)
    ref, _ = train.reference_step(cfg, args[0], args[1], args[2], model.DEFAULT_OPTIMIZER, step=1)
    _leaves_close(new, ref, 1e-5)
    assert float(np.asarray(loss)) == pytest.approx(float(transformer.loss(*args, cfg)), rel=1e-6)
    # the new weights come back in the layout the next step starts from (step_carry)
    assert new["layers"][0]["attn"]["wq"].sharding.spec == sl.P("x", "y")
    # every parameter of the model has a spec, under its path
    n = len(sl.tree_util.tree_leaves(param_axes(cfg), is_leaf=lambda a: isinstance(a, tuple)))
    assert len(sl.tree_util.tree_leaves(plan.in_specs, is_leaf=lambda s: isinstance(s, sl.PartitionSpec))) == n + 2


def test_plan_model_under_a_memory_limit_shards_and_still_matches():
    """A limit below the replicated step forces the search to split (1-D mesh: a fast solve)."""
    cfg = ModelConfig(num_layers=1, d_model=16, ffw_dim=32, num_heads=2, vocab_size=32)
    mesh = sl.make_mesh((2,), ("x",), hardware="tpu-v5p")
    free = plan_model(cfg, mesh=mesh, batch=4, seq=8)
    tight = plan_model(cfg, mesh=mesh, batch=4, seq=8, memory_limit_bytes=0.6 * free.solution.memory_bytes)
    assert tight.solution.memory_bytes <= 0.6 * free.solution.memory_bytes < free.solution.memory_bytes
    assert tight.estimate_s >= free.estimate_s
    specs = sl.tree_util.tree_leaves(tight.in_specs, is_leaf=lambda s: isinstance(s, sl.PartitionSpec))
    assert any(s != sl.P() for s in specs)
    tight.check(*model.example_args(cfg, 4, 8), rtol=1e-5)


def test_adamw_step_on_global_arrays_equals_reference_step():
    cfg = ModelConfig(num_layers=1, d_model=16, ffw_dim=32, num_heads=2, vocab_size=32)
    opt = train.AdamW(lr=0.01, weight_decay=0.1)
    params, states, tok, tgt = model.example_args(cfg, 4, 4, optimizer=opt)
    assert set(states) == {"m", "v"}
    mesh = sl.make_mesh((2,), ("x",))
    loss, new_p, new_s = model.train_step(cfg, opt)(*_global([params, states, tok, tgt], mesh))
    ref_p, ref_s = train.reference_step(cfg, params, tok, tgt, opt, step=1)
    _leaves_close(new_p, ref_p, 1e-5)
    _leaves_close(new_s["m"], ref_s["m"], 1e-5)
    # abstract arguments: the same tree of ShapeDtypeStructs
    abstract = model.example_args(cfg, 4, 4, optimizer=opt, abstract=True)
    assert [a.shape for a in sl.tree_util.tree_leaves(abstract)] == [np.shape(a) for a in
                                                                      sl.tree_util.tree_leaves((params, states, tok, tgt))]


def test_strategies_are_the_trainers_layouts():
    cfg = ModelConfig(num_layers=2, d_model=16, ffw_dim=32, num_heads=2, vocab_size=32)
    mesh = sl.make_mesh((2, 2), ("x", "y"), hardware="tpu-v5p")
    hand = model.strategies(cfg, mesh)
    assert set(hand) == {"dp", "fsdp", "tp", "fsdp_tp"}
    t = train.Trainer(cfg, train.strategies.fsdp_tp("x", "y"), mesh, optimizer="sgd")
    params, tok, tgt = hand["fsdp_tp"]
    assert params["layers"][1]["attn"]["wq"] == t.param_spec(("embed", "heads"))
    assert params["layers"][0]["mlp"]["w_down"] == t.param_spec(("mlp", "embed"))
    assert tok == tgt == sl.P("x", None)
    assert all(e is None for s in sl.tree_util.tree_leaves(hand["dp"][0], is_leaf=lambda s: isinstance(s, sl.PartitionSpec))
               for e in s)
    assert hand["dp"][1] == sl.P(("x", "y"), None)


def test_bad_configs_are_named():
    moe = ModelConfig(num_layers=1, d_model=16, ffw_dim=32, num_heads=2, vocab_size=32, num_experts=4, top_k=2,
                      expert_ffw_dim=16)
    with pytest.raises(ValueError, match="MoE"):
        model.train_step(moe)
    with pytest.raises(TypeError, match="ModelConfig"):
        model.example_args("llama2-7b", 4, 4)
    cfg = ModelConfig(num_layers=1, d_model=16, ffw_dim=32, num_heads=2, vocab_size=32)
    with pytest.raises(ValueError, match="batch=0"):
        model.example_args(cfg, 0, 4)
    with pytest.raises(ValueError, match="2-D mesh"):
        model.compare_model(cfg, mesh=sl.make_mesh((2,), ("x",), hardware="tpu-v5p"), batch=4, seq=4)
    with pytest.raises(ValueError, match="batch 6 does not split into 4 micro-batches"):
        model.compare_model(cfg, mesh=sl.make_mesh((2, 2), ("x", "y"), hardware="tpu-v5p"), batch=6, seq=4,
                            num_microbatches=4)


# -- pipelines of the model library's own step, in the comparison -----------------------------------------
def test_model_stages_are_cut_as_train_pipeline_cuts_them():
    cfg = ModelConfig(num_layers=3, d_model=16, ffw_dim=32, num_heads=4, num_kv_heads=2, vocab_size=32)
    first, middle, last = (model.stage_args(cfg, a, b, 2, 4) for a, b in [(0, 1), (1, 2), (2, 3)])
    assert set(first[0]) == {"embed", "layers"} and first[1].shape == (2, 4) and len(first) == 3
    assert set(middle[0]) == {"layers"} and middle[1].shape == (2, 4, 16) and len(middle) == 3
    assert first[2].shape == middle[2].shape == (2, 4, 16)  # the cotangent of the stage's output
    assert set(last[0]) == {"layers", "final_norm", "head"} and len(last) == 3 and last[2].shape == (2, 4)
    assert len(model.stage_args(cfg, 1, 3, 2, 4)[0]["layers"]) == 2
    with pytest.raises(ValueError, match="not a stage of 3 layers"):
        model.stage_args(cfg, 2, 5, 2, 4)


def test_pipelines_join_the_comparison_executed_and_clocked():
    """The stage DP's plan and a hand-written 1F1B with data-parallel stages on a 2x2 mesh (two
    stages of one row each), beside the free intra-op plan: every row runs and matches."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    cfg = ModelConfig(num_layers=2, d_model=16, ffw_dim=32, num_heads=4, num_kv_heads=2, vocab_size=32)
    mesh = sl.make_mesh((2, 2), ("x", "y"), hardware="tpu-v5p")
    B, T, m = 8, 4, 2
    program = model.stage_program(cfg, B // m, T)
    common = dict(hardware="tpu-v5p", num_microbatches=m, num_stages=2, submesh_shapes=[(1, 2)])
    free = plan_pipeline(program, 2, (2, 2), **common)
    hand = plan_pipeline(program, 2, (2, 2), **common, stage_specs=model.data_parallel_stages(cfg, B // m, T))
    # the hand-written stages keep the weights whole and split the micro-batch over the row
    for st in hand.stages.stages:
        p = hand.plan_of(st)
        assert p.specs["[0]['layers'][0]['mlp']['w_up']"] == sl.P() and p.specs["[1]"] == sl.P("devices")
    assert [(s.layer_start, s.layer_end) for s in hand.stages.stages] == [(0, 1), (1, 2)]
    args = model.example_args(cfg, B, T)
    c = compare(model.train_step(cfg), *args, mesh=mesh, strategies={}, rtol=1e-5,
                pipelines={"stage DP": free, "1F1B": hand}, pipeline_args=(cfg, *args))
    assert [r.name for r in c.rows] == ["autoshard", "stage DP", "1F1B"]
    assert all(r.ran and r.max_rel_err <= 1e-5 for r in c.rows)
    for r in c.rows[1:]:
        q = r.parts()
        slow = max(r.pipeline.plan_of(s).estimate_s for s in r.pipeline.stages.stages)
        assert r.estimate_s == pytest.approx(r.pipeline.timeline.step_time)
        assert q["bubble"] == pytest.approx(r.estimate_s - m * slow, abs=1e-15) and q["bubble"] > 0
        assert q["compute"] + q["comm"] + q["reshard"] + q["bubble"] == pytest.approx(r.estimate_s, rel=1e-9)
    assert hand.estimate_s > free.estimate_s  # DP stages all-reduce gradients; the DP's plan need not
    assert "bubble" in c.table() and "loss and gradients match" in c.table()
    ax = c.plot()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["autoshard", "stage DP", "1F1B"]
    assert "pipeline bubble" in [t.get_text() for t in ax.get_legend().get_texts()]
