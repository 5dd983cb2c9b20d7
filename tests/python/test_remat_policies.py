"""Recompute policies (shardlab.models.remat): one vocabulary for Trainer, estimate,
training_memory and flops_per_token, each count equal to what a real step does: the saved
activations measured on a real forward pass, the recompute FLOPs in the ledger of a step."""

import numpy as np
import pytest

import shardlab as sl
from shardlab import train
from shardlab.models import (CHECKPOINT_NAMES, ModelConfig, flops_per_token, param_count, presets, remat_policy,
                             training_memory, transformer)

CFG = ModelConfig(num_layers=2, d_model=32, ffw_dim=64, num_heads=4, vocab_size=32, max_seq_len=8)
POLICIES = ["full", "selective", "dots", "ffw_outputs", ("qkv", "attn_out", "mlp_act")]
MESHES = {"dp": ((4,), ("data",)), "zero1": ((4,), ("data",)), "fsdp": ((4,), ("data",)),
          "tp": ((4,), ("model",)), "tp_sp": ((4,), ("model",)), "fsdp_tp": ((2, 2), ("data", "model"))}
TOKENS = np.random.default_rng(0).integers(0, 32, (8, 8))


@pytest.mark.parametrize("strategy", list(MESHES))
def test_training_memory_equals_the_activations_a_real_forward_keeps(strategy):
    mesh = sl.make_mesh(*MESHES[strategy])
    params = transformer.init_params(CFG, seed=0)
    for remat in POLICIES:
        for precision in ("fp32", "mixed") if strategy == "tp_sp" else ("mixed",):
            t = train.Trainer(CFG, strategy, mesh, remat=remat, precision=precision)
            kept = t.saved_activations(t.init(params).params, TOKENS)
            calc = training_memory(CFG, t.s, dict(mesh.shape), batch=8, precision=precision, remat=remat, context=8)
            assert sum(kept.values()) == calc.parts["activations"], (strategy, remat, precision, kept)
            assert kept["input"] == calc.extra["layer_inputs"]
            assert sum(v for k, v in kept.items() if k != "input") == calc.extra["checkpointed_names"]


def test_sequence_parallelism_saves_activation_memory():
    mesh = {"model": 4}
    for remat in (None, "full", "dots"):
        tp = training_memory(CFG, "tp", mesh, batch=8, remat=remat, context=8).parts["activations"]
        sp = training_memory(CFG, "tp_sp", mesh, batch=8, remat=remat, context=8).parts["activations"]
        assert sp < tp
    # full remat keeps the layer inputs only: D per token, split 4 ways along the sequence
    sp = training_memory(CFG, "tp_sp", mesh, batch=8, remat="full", context=8)
    assert sp.parts["activations"] == 8 * 8 * 2 * 32 // 4 * 2


@pytest.mark.parametrize("strategy,mesh", [("dp", {"data": 4}), ("fsdp", {"data": 4}), ("tp_sp", {"model": 4}),
                                           ("fsdp_tp", {"data": 2, "model": 2}), ("zero2", {"data": 4})])
def test_recompute_flops_equal_the_ledger_of_a_step(strategy, mesh):
    cfg = CFG.replace(d_model=64, ffw_dim=128, vocab_size=128, max_seq_len=16)
    n = int(np.prod(list(mesh.values())))
    for remat in [None, *POLICIES]:
        e = train.estimate(cfg, strategy, mesh, "tpu-v5p", batch=8, seq=16, remat=remat)
        ledger = sum(ev["flops"] or 0 for ev in e.ledger.events if ev["phase"] == "recompute" and not ev["axes"])
        assert ledger == flops_per_token(cfg, 16, remat=remat).parts["remat"] * 8 * 16 / n, (strategy, remat)


def test_what_each_policy_recomputes():
    cfg = presets.get("llama2-13b")
    f = {p: flops_per_token(cfg, 4096, remat=p) for p in ("none", "full", "selective", "dots", "ffw_outputs")}
    assert f["none"].remat == 0
    assert f["selective"].remat == f["dots"].remat == f["none"].forward_attention   # the attention core only
    assert f["full"].remat == f["none"].forward - f["none"].extra["fwd_head"]
    # ffw_outputs recomputes Q/K/V, W_O and attention: the forward less the MLP and the head
    mlp = f["none"].extra["fwd_mlp"]
    assert f["ffw_outputs"].remat == pytest.approx(f["full"].remat - mlp, rel=1e-12)
    assert flops_per_token(cfg, 4096, remat="attention").remat == f["dots"].remat   # the older name


def test_the_books_ffw_checkpoints_are_2LB_D_plus_2F():
    # part 5, question 2: LLaMA-2 13B, 16M tokens, checkpoints after the three big FFW matmuls
    cfg = presets.get("llama2-13b")
    m = training_memory(cfg, "dp", {"data": 1}, batch=4000, context=4000, remat="ffw_outputs")
    L, B, D, F = 40, 16_000_000, 5120, 13824
    assert m.extra["checkpointed_names"] == 2 * L * B * (D + 2 * F)
    assert round(m.extra["checkpointed_names"] / 1e12) == 42       # "~4.2e13 = 42TB"
    assert m.extra["layer_inputs"] == 2 * L * B * D                 # what the checkpoints keep besides


def test_the_books_10_bytes_per_parameter():
    cfg = presets.get("llama2-13b")
    psi = param_count(cfg).total
    m = training_memory(cfg, "dp", {"data": 1}, batch=1, precision="bf16_params")
    assert m.params + m.optimizer == 10 * psi and m.grads == 2 * psi
    assert round((m.params + m.optimizer) / 1e9) == 130                  # "(2 + 4 + 4) * 13e9 ~ 130GB"
    hbm = sl.hardware.get("tpu-v5p").hbm_capacity
    assert round(hbm / 10 / 1e9, 1) == 9.6                               # "about 9B parameters" on a v5p


@pytest.mark.parametrize("strategy", ["dp", "fsdp", "zero1"])
def test_bf16_params_trains_with_fp32_moments_and_no_master(strategy):
    mesh = sl.make_mesh((4,), ("data",))
    opt = train.AdamW(lr=1e-3)
    t = train.Trainer(CFG, strategy, mesh, optimizer=opt, precision="bf16_params")
    state = t.init(transformer.init_params(CFG, seed=0))
    state, loss = t.step(state, TOKENS, TOKENS)
    assert np.isfinite(float(loss))
    mem, psi = t.memory(state), param_count(CFG).total
    leaves = train.step.tree_leaves
    assert {str(x.dtype) for x in leaves(state.params)} == {"bfloat16"}
    assert {str(x.dtype) for x in leaves(state.opt_state["m"])} == {"float32"}
    n = 4 if strategy != "dp" else 1
    if strategy == "zero1":   # the shard the optimizer updates is bf16: 2 bytes, split 4 ways
        assert mem["optimizer"] == (8 + 2) * psi / n
    else:
        assert state.master is None and mem["optimizer"] == 8 * psi / n
    calc = training_memory(CFG, strategy, {"data": 4}, batch=8, precision="bf16_params", context=8)
    assert calc.parts["params"] == mem["params"]
    if strategy != "zero1":
        assert calc.parts["optimizer"] == mem["optimizer"]


@pytest.mark.parametrize("remat", ["selective", "ffw_outputs", ("attn_norm", "mlp_down")])
def test_a_policy_changes_no_value(remat):
    mesh = sl.make_mesh((2, 2), ("data", "model"))
    params = transformer.init_params(CFG, seed=0)
    out = []
    for r in (None, remat):
        t = train.Trainer(CFG, "fsdp_tp", mesh, optimizer="sgd", remat=r)
        state, loss = t.step(t.init(params), TOKENS, TOKENS)
        out.append((float(loss), np.asarray(state.params["layers"][0]["mlp"]["w_down"], np.float32)))
    assert out[0][0] == pytest.approx(out[1][0], rel=1e-6)
    np.testing.assert_allclose(out[0][1], out[1][1], rtol=1e-5, atol=1e-7)


def test_bad_policies_list_the_valid_ones():
    with pytest.raises(ValueError, match=r"\[Trainer\] remat 'some' is not a recompute policy; use one of 'none', "
                                         r"'full', 'selective', 'dots', 'ffw_outputs'"):
        train.Trainer(CFG, "dp", sl.make_mesh((4,), ("data",)), remat="some")
    with pytest.raises(ValueError, match=r"\[training_memory\] remat names \['mlp_out'\] are not checkpoint names.*"
                                         r"attn_norm, qkv, attn_out"):
        training_memory(CFG, "dp", {"data": 1}, batch=1, remat={"mlp_out"})
    with pytest.raises(ValueError, match=r"\[flops_per_token\] remat 'attn' is not a recompute policy"):
        flops_per_token(CFG, 8, remat="attn")
    with pytest.raises(TypeError, match=r"\[remat\] remat must be a policy name"):
        remat_policy(3)
    assert remat_policy(set(CHECKPOINT_NAMES) - {"attn_out"}).saved == remat_policy("selective").saved
    t = train.Trainer(CFG, "dp", sl.make_mesh((4,), ("data",)))
    with pytest.raises(ValueError, match=r"remat 'none' keeps every intermediate"):
        t.saved_activations(t.init(transformer.init_params(CFG)).params, TOKENS)


def test_moe_layers_follow_the_same_vocabulary():
    # the router and experts count as mlp_hidden: kept by dots, selective and ffw_outputs
    cfg = CFG.replace(num_experts=4, top_k=2, first_dense_layers=1)
    params = transformer.init_params(cfg, seed=0)
    losses = set()
    for remat in [None, "dots", "ffw_outputs", "full"]:
        t = train.Trainer(cfg, "fsdp_ep", sl.make_mesh((4,), ("data",)), optimizer="sgd", remat=remat)
        losses.add(round(float(t.step(t.init(params), TOKENS, TOKENS)[1]), 6))
        e = train.estimate(cfg, "fsdp_ep", {"data": 4}, "tpu-v5p", batch=8, seq=8, remat=remat)
        ledger = sum(ev["flops"] or 0 for ev in e.ledger.events if ev["phase"] == "recompute" and not ev["axes"])
        assert ledger == flops_per_token(cfg, 8, remat=remat).parts["remat"] * 8 * 8 / 4, remat
    assert len(losses) == 1
