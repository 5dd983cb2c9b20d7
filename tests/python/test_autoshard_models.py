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

from shardlab.autoshard import model, plan_model  # noqa: E402


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
    """The one line: a rotary GQA transformer's SGD step on a 2x2 mesh under a memory limit the
    replicated step exceeds; the plan shards, runs, and its new params are reference_step's."""
    cfg = ModelConfig(num_layers=1, d_model=16, ffw_dim=32, num_heads=2, num_kv_heads=1, vocab_size=32)
    mesh = sl.make_mesh((2, 2), ("x", "y"), hardware="tpu-v5p")
    free = plan_model(cfg, mesh=mesh, batch=4, seq=4)
    limit = 0.5 * free.solution.memory_bytes
    plan = plan_model(cfg, mesh=mesh, batch=4, seq=4, memory_limit_bytes=limit)
    assert plan.solution.memory_bytes <= limit
    specs = sl.tree_util.tree_leaves(plan.in_specs, is_leaf=lambda s: isinstance(s, sl.PartitionSpec))
    assert len(specs) == len(sl.tree_util.tree_leaves(param_axes(cfg), is_leaf=lambda a: isinstance(a, tuple))) + 2 and any(s != sl.P() for s in specs)
    args = model.example_args(cfg, 4, 4)
    res = plan.check(*args, rtol=1e-5)  # outputs = the unsharded program, ledger = plan.collectives
    assert [(e["op"], tuple(e["axes"]), e["bytes_sent"]) for e in res["ledger"].events if e["axes"]] == \
        [c.key() for c in plan.collectives]
    (loss, new), _ = plan.run(*args)
    ref, _ = train.reference_step(cfg, args[0], args[1], args[2], model.DEFAULT_OPTIMIZER, step=1)
    _leaves_close(new, ref, 1e-5)
    assert float(np.asarray(loss)) == pytest.approx(float(transformer.loss(*args, cfg)), rel=1e-6)
    # every parameter of the model has a spec, under its path
    assert "[0]['layers'][0]['attn']['wq']" in plan.specs and "[0]['embed']" in plan.specs


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
