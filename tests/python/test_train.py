"""shardlab.train: every strategy against the single-device run, the book's per-layer
communication table counted from the ledger, and ZeRO memory from live buffers."""

import numpy as np
import pytest

import shardlab as sl
import shardlab.numpy as jnp
from shardlab import P, train
from shardlab.models import ModelConfig, param_axes, training_memory, transformer
from shardlab.train.step import tree_leaves
from training_reference import rel_error, steps_error

MESHES = {"dp": ((8,), ("data",)), "zero1": ((8,), ("data",)), "zero2": ((8,), ("data",)),
          "fsdp": ((8,), ("data",)), "tp": ((4,), ("model",)), "tp_sp": ((4,), ("model",)),
          "fsdp_tp": ((2, 4), ("data", "model"))}
CFG = ModelConfig(num_layers=1, d_model=32, ffw_dim=64, num_heads=4, vocab_size=64, max_seq_len=8)


def _batch(seed=1, B=8, T=8, V=64):
    rng = np.random.default_rng(seed)
    return rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))


@pytest.mark.parametrize("name", sorted(MESHES))
def test_five_steps_equal_the_single_device_run(name):
    tok, tgt = _batch(B=16)
    assert steps_error(CFG, name, sl.make_mesh(*MESHES[name]), tok, tgt) <= 1e-5


@pytest.mark.parametrize("extra", [{"activation": "gelu_tanh"}, {"qkv_bias": True, "mlp_bias": True}])
def test_grouped_projections_with_another_gate_or_biases_equal_the_single_device_run(extra):
    """The blocks run Q/K/V and gate/up as one matmul each (biases concatenated too); a GELU
    gate takes the split-and-multiply path instead of the fused swiglu."""
    tok, tgt = _batch(B=16)
    assert steps_error(CFG.replace(**extra), "fsdp_tp", sl.make_mesh(*MESHES["fsdp_tp"]), tok, tgt) <= 1e-5


@pytest.mark.parametrize("name", ["dp", "fsdp_tp"])
def test_adamw_and_full_remat_follow_the_reference(name):
    tok, tgt = _batch(2)
    p0 = transformer.init_params(CFG, seed=3)
    opt = train.AdamW(lr=1e-3, eps=1e-3, weight_decay=0.1)  # eps keeps vanishing gradients out of the sign noise
    ref, st = p0, None
    for s in range(1, 4):
        ref, st = train.reference_step(CFG, ref, tok, tgt, opt, s, st)
    t = train.Trainer(CFG, name, sl.make_mesh(*MESHES[name]), optimizer=opt, remat="full")
    state = t.init(p0)
    for _ in range(3):
        state, _ = t.step(state, tok, tgt)
    assert rel_error(state.params, ref) <= 1e-5


# -- the book's table: one layer's MLP, forward and backward, counted --------------------------
MLP_CFG = ModelConfig(num_layers=1, d_model=32, ffw_dim=64, num_heads=4, vocab_size=64, max_seq_len=8,
                      gated_mlp=False, activation="relu")


def _layer_ledger(name, mesh_shape, names):
    tok, tgt = _batch()
    t = train.Trainer(MLP_CFG, name, sl.make_mesh(mesh_shape, names), optimizer="sgd")
    state = t.init(transformer.init_params(MLP_CFG, seed=0))
    with sl.Ledger() as ledger:
        t.step(state, tok, tgt)
    return ledger.filter(label="layer0/mlp")


def _sent(ledger, phases, axes=None):
    return sum(e["bytes_sent"] for e in ledger.events if e["phase"] in phases and e["axes"]
               and (axes is None or e["axes"] == axes))


B, D, F, b = 8 * 8, 32, 64, 4  # tokens, widths, fp32 bytes (the book's table is in bf16: 2 bytes)


def test_dp_layer_moves_0_forward_and_8DF_backward():
    led = _layer_ledger("dp", (8,), ("data",))
    ring = 7 / 8
    assert _sent(led, ("forward",)) == 0
    # 8DF (bf16) = two all-reduces of D x F weights; plus the norm scale's all-reduce of D
    assert _sent(led, ("backward",)) == ring * (8 * D * F * b / 2 + 2 * D * b)


def test_fsdp_layer_moves_4DF_forward_and_8DF_backward_with_the_regather():
    led = _layer_ledger("fsdp", (8,), ("data",))
    ring, norm = 7 / 8, D * b * 7 / 8
    assert _sent(led, ("forward",)) == ring * 4 * D * F * b / 2 + norm
    assert _sent(led, ("recompute", "backward")) == ring * 8 * D * F * b / 2 + 2 * norm
    assert {e["op"] for e in led.filter(phase="recompute").events} == {"all_gather"}


@pytest.mark.parametrize("name", ["tp", "tp_sp"])
def test_tp_layer_moves_4BD_each_way(name):
    led = _layer_ledger(name, (4,), ("model",))
    ring = 3 / 4
    assert _sent(led, ("forward",)) == ring * 4 * B * D * b / 2
    # + the replicated norm scale's gradient all-reduce (D values)
    assert _sent(led, ("backward",)) == ring * (4 * B * D * b / 2 + 2 * D * b)


def test_fsdp_tp_layer_splits_the_table_between_the_axes():
    X, Y = 2, 4
    led = _layer_ledger("fsdp_tp", (X, Y), ("data", "model"))
    rx, ry = (X - 1) / X, (Y - 1) / Y
    # forward: 4BD/X over Y, 4DF/Y over X (+ the norm scale gathered over X)
    assert _sent(led, ("forward",), ("model",)) == ry * 4 * B * D * b / 2 / X
    assert _sent(led, ("forward",), ("data",)) == rx * (4 * D * F * b / 2 / Y + D * b)
    # backward: 8DF/Y over X (re-gather + reduce-scatter); over Y the activations' 4BD/X
    assert _sent(led, ("recompute", "backward"), ("data",)) == rx * (8 * D * F * b / 2 / Y + 2 * D * b)
    assert _sent(led, ("backward",), ("model",)) == ry * (4 * B * D * b / 2 / X + 2 * D * b / X)


def test_vocab_parallel_softmax_all_reduces_BT_values_not_BTV():
    tok, tgt = _batch()
    t = train.Trainer(MLP_CFG, "tp", sl.make_mesh((4,), ("model",)), optimizer="sgd")
    state = t.init(transformer.init_params(MLP_CFG, seed=0))
    with sl.Ledger() as ledger:
        t.step(state, tok, tgt)
    head = [e for e in ledger.filter(label="head", phase="forward").events if e["axes"]]
    assert sorted(e["op"] for e in head) == ["pmax", "psum", "psum"]
    assert all(e["bytes_in"] == B * 4 for e in head)  # one fp32 per token, V = 64 never moves


# -- memory from live buffers ------------------------------------------------------------------
MEM_CFG = ModelConfig(num_layers=1, d_model=64, ffw_dim=128, num_heads=4, vocab_size=64, max_seq_len=8)


@pytest.mark.parametrize("name,formula", [
    ("dp", lambda psi, n: (2 * psi, 2 * psi, 12 * psi)),
    ("zero1", lambda psi, n: (2 * psi, 2 * psi, 12 * psi / n)),
    ("zero2", lambda psi, n: (2 * psi, 2 * psi / n, 12 * psi / n)),
    ("fsdp", lambda psi, n: (2 * psi / n, 2 * psi / n, 12 * psi / n)),
])
def test_zero_memory_from_live_buffers(name, formula):
    n = 8
    t = train.Trainer(MEM_CFG, name, sl.make_mesh((n,), ("data",)), optimizer="adamw", precision="mixed")
    state = t.init(transformer.init_params(MEM_CFG, seed=0))
    tok, tgt = _batch()
    state, _ = t.step(state, tok, tgt)
    mem = t.memory(state)
    psi = transformer.num_elements(state.params) if False else sum(int(np.prod(x.shape)) for x in tree_leaves(state.params))
    assert (mem["params"], mem["grads"], mem["optimizer"]) == formula(psi, n)
    calc = training_memory(MEM_CFG, name, {"data": n}, batch=8, context=8)
    assert (calc.parts["params"], calc.parts["grads"], calc.parts["optimizer"]) == (
        mem["params"], mem["grads"], mem["optimizer"])


# -- errors ----------------------------------------------------------------------------------------

def test_errors_name_the_dimension_and_the_axis():
    with pytest.raises(ValueError, match=r"\[tp\] num_heads 4 is not divisible by the model axis 'model' of size 8"):
        train.Trainer(MLP_CFG, "tp", sl.make_mesh((8,), ("model",)))
    with pytest.raises(ValueError, match=r"mesh axis 'data' is not in the mesh"):
        train.Trainer(MLP_CFG, "fsdp", sl.make_mesh((8,), ("x",)))
    t = train.Trainer(MLP_CFG, "dp", sl.make_mesh((8,), ("data",)))
    with pytest.raises(ValueError, match=r"microbatch 4 .* not divisible by the data axes"):
        t.step(t.init(transformer.init_params(MLP_CFG)), *_batch(B=4))
    with pytest.raises(ValueError, match=r"zero stage 4"):
        train.Strategy("x", data="data", zero=4)


def test_param_axes_match_the_params():
    p = transformer.init_params(CFG)
    for a, x in zip(tree_leaves(param_axes(CFG)), tree_leaves(p)):
        assert len(a) == np.ndim(x)


# -- core: checkpoint inside shard_map and labels in the backward pass ----------------------------

def test_checkpointed_gather_is_redone_in_the_backward_pass_under_its_scope():
    mesh = sl.make_mesh((4,), ("x",))

    def body(x, w):
        with sl.named_scope("blk"):
            g = sl.checkpoint(lambda x, w: x @ sl.lax.all_gather(w, "x", tiled=True), policy="dots_saveable")
            return sl.lax.psum(jnp.sum(jnp.tanh(g(x, w))), "x")

    f = sl.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P())
    x, w = np.ones((8, 8), np.float32), np.ones((8, 4), np.float32)
    with sl.Ledger() as led:
        sl.grad(lambda w: f(x, w))(sl.device_put(w, sl.NamedSharding(mesh, P("x"))))
    rows = [(e["op"], e["phase"], e["label"]) for e in led.events if e["axes"]]
    assert ("all_gather", "recompute", "blk") in rows and ("psum_scatter", "backward", "blk") in rows


# -- ZeRO over data axes that do not all divide the embed dimension ------------------------------
ODD = ModelConfig(num_layers=1, d_model=12, ffw_dim=16, num_heads=2, head_dim=6, vocab_size=64, max_seq_len=8)


@pytest.mark.parametrize("name", ["fsdp", "zero1"])
def test_zero_over_three_axes_splits_other_dimensions_and_equals_the_single_device_run(name):
    # D = 12 takes x and y (12/4 = 3); z goes to F, heads or vocab; norm scales stay replicated over z
    s = train.Strategy(name, data=("x", "y", "z"), zero=3 if name == "fsdp" else 1)
    assert s.zero_split(("embed", "mlp"), (12, 16), {"x": 2, "y": 2, "z": 2}) == ((0, ("x", "y")), (1, ("z",)))
    assert s.zero_split(("embed",), (12,), {"x": 2, "y": 2, "z": 2}) == ((0, ("x", "y")),)
    tok, tgt = _batch(B=8)
    p0 = transformer.init_params(ODD, seed=0)
    opt = train.SGD(lr=0.5)
    ref = p0
    for k in range(1, 4):
        ref, _ = train.reference_step(ODD, ref, tok, tgt, opt, k)
    t = train.Trainer(ODD, s, sl.make_mesh((2, 2, 2), ("x", "y", "z")), optimizer=opt)
    state = t.init(p0)
    w_in = state.params["layers"][0]["mlp"]["w_gate"]
    assert w_in.nbytes_per_device == 12 * 16 * 4 // (8 if name == "fsdp" else 1)
    for _ in range(3):
        state, _ = t.step(state, tok, tgt)
    assert rel_error(state.params, ref) <= 1e-5


def test_a_weight_no_data_axis_divides_is_an_error_naming_it():
    s = train.strategies.fsdp()
    with pytest.raises(ValueError, match=r"\[fsdp\] no dimension of a weight with axes \('vocab', 'embed'\) and shape "
                                         r"\(32000, 5120\).* data axis 'data' of size 4096"):
        s.zero_split(("vocab", "embed"), (32000, 5120), {"data": 4096})
