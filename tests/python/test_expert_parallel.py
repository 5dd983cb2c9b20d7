"""Expert parallelism (GShard / Switch): the AllToAll dispatch and combine equal the one-device
MoE block forward and backward with the same drops, move exactly the closed-form bytes, agree
with jax.lax.all_to_all, and train (ep, fsdp_ep) to the same params as one device."""

import contextlib
import types

import numpy as np
import pytest

import shardlab as sl
import shardlab.numpy as jnp
from shardlab import P, lax, train
from shardlab.models import ModelConfig, transformer
from shardlab.models.expert_parallel import alltoall_bytes, expert_parallel_mlp, expert_specs
from shardlab.models.moe import combine, dispatch, moe_mlp, route
from training_reference import rel_error

BASE = ModelConfig(num_layers=1, d_model=16, ffw_dim=24, num_heads=2, vocab_size=32, max_seq_len=8,
                   num_experts=8, top_k=2)
VARIANTS = {
    "gated": BASE,
    "drops_bias_shared": BASE.replace(capacity_factor=0.5, mlp_bias=True, num_shared_experts=1, router_bias=True),
    "plain_relu": BASE.replace(gated_mlp=False, activation="relu", top_k=1, capacity_factor=1.25),
}


def _layer(cfg, seed=0):
    p = transformer.init_params(cfg, seed=seed)["layers"][0]["moe"]
    if "router_bias" in p:  # a non-zero score correction changes which experts win
        p["router_bias"] = np.random.default_rng(seed).uniform(0, 0.2, cfg.num_experts).astype(np.float32)
    return p


def _x(B=8, T=8, D=16, seed=0):
    return np.random.default_rng(seed).standard_normal((B, T, D)).astype(np.float32)


def _ep(cfg, n, p):
    mesh = sl.make_mesh((n,), ("x",))

    def body(p, x):
        y, dropped = expert_parallel_mlp(p, x, cfg, "x", return_dropped=True)
        return y, lax.psum(dropped, "x")

    return sl.shard_map(body, mesh=mesh, in_specs=(expert_specs(p, "x"), P("x")), out_specs=(P("x"), P()))


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("n", [2, 8])
def test_forward_and_drops_equal_one_device(name, n):
    cfg = VARIANTS[name]
    p, x = _layer(cfg), _x()
    ref, ref_dropped = moe_mlp(p, x, cfg, return_dropped=True)
    y, dropped = _ep(cfg, n, p)(p, x)
    np.testing.assert_allclose(np.asarray(y), np.asarray(ref), atol=1e-5, rtol=0)
    assert int(np.asarray(dropped)) == int(np.asarray(ref_dropped))
    if name == "drops_bias_shared":
        assert int(np.asarray(dropped)) > 0  # the case really drops tokens


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_gradient_equals_one_device(name):
    cfg = VARIANTS[name]
    p, x = _layer(cfg), _x()
    f = _ep(cfg, 4, p)
    g_ep = sl.grad(lambda p, x: jnp.sum(jnp.tanh(f(p, x)[0])), argnums=(0, 1))(p, x)
    g_ref = sl.grad(lambda p, x: jnp.sum(jnp.tanh(moe_mlp(p, x, cfg))), argnums=(0, 1))(p, x)
    flat = lambda t: [np.asarray(v) for v in (sum((flat(t[k]) for k in sorted(t)), []) if isinstance(t, dict) else [t])]  # noqa: E731
    for a, b in zip(flat(g_ep[0]) + [np.asarray(g_ep[1])], flat(g_ref[0]) + [np.asarray(g_ref[1])]):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_dropped_tokens_fall_as_the_capacity_factor_grows():
    x = _x()
    counts = []
    for cf in (0.25, 0.5, 1.0, 2.0, 4.0):
        cfg = BASE.replace(capacity_factor=cf)
        p = _layer(cfg)
        counts.append(int(np.asarray(_ep(cfg, 8, p)(p, x)[1])))
    assert counts == sorted(counts, reverse=True) and counts[0] > 0 and counts[-1] == 0


def test_ledger_has_two_alltoalls_each_way_of_the_closed_form():
    cfg, n = VARIANTS["drops_bias_shared"], 4
    p, x = _layer(cfg), _x()
    f = _ep(cfg, n, p)
    with sl.Ledger() as led:
        sl.grad(lambda p: jnp.sum(f(p, x)[0]))(p)
    a2a = led.filter(op="all_to_all")
    want = alltoall_bytes(cfg, groups=8 // n, group_tokens=8, axis_size=n)
    assert want["bytes_in"] == cfg.num_experts * (2 * cfg.expert_capacity(8)) * cfg.d_model * 4
    for phase in ("forward", "backward"):
        ev = a2a.filter(phase=phase).events
        assert len(ev) == 2
        assert [e["bytes_in"] for e in ev] == [want["bytes_in"]] * 2
        assert [e["bytes_sent"] for e in ev] == [want["bytes_sent"]] * 2
    assert sorted(e["label"] for e in a2a.filter(phase="forward").events) == ["combine", "dispatch"]


def test_bad_expert_layouts_are_clear_errors():
    cfg = BASE.replace(num_experts=6)
    p = _layer(cfg)
    with pytest.raises(ValueError, match=r"\[expert_parallel_mlp\] num_experts 6 is not divisible by the expert "
                                         r"axis 'x' of size 4"):
        sl.shard_map(lambda p, x: expert_parallel_mlp(p, x, cfg, "x"), mesh=sl.make_mesh((4,), ("x",)),
                     in_specs=({k: P() for k in p}, P("x")), out_specs=P("x"))(p, _x())
    dense = BASE.replace(num_experts=0, top_k=0)
    with pytest.raises(ValueError, match="needs a model with num_experts > 0"):
        sl.shard_map(lambda x: expert_parallel_mlp({}, x, dense, "x"), mesh=sl.make_mesh((2,), ("x",)),
                     in_specs=P("x"), out_specs=P("x"))(_x())
    p8 = _layer(BASE)
    with pytest.raises(NameError, match=r"\[expert_parallel_mlp\] unbound axis name: 'experts'"):
        sl.shard_map(lambda p, x: expert_parallel_mlp(p, x, BASE, "experts"), mesh=sl.make_mesh((2,), ("x",)),
                     in_specs=({k: P() for k in p8}, P("x")), out_specs=P("x"))(p8, _x())
    with pytest.raises(ValueError, match=r"holds 8 experts but num_experts 8 / axis 'x' of size 2 is 4"):
        sl.shard_map(lambda p, x: expert_parallel_mlp(p, x, BASE, "x"), mesh=sl.make_mesh((2,), ("x",)),
                     in_specs=({k: P() for k in p8}, P("x")), out_specs=P("x"))(p8, _x())


# -- against JAX: the same dispatch / experts / combine program on 8 CPU devices -----------------
def _slots_program(m, cfg):
    def body(xe, w_gate, w_up, w_down):
        xe = m.lax.all_to_all(xe, "x", 1, 0, tiled=True)          # [N·B, E/N, C, D]
        h = m.jnp.einsum("becd,edf->becf", xe, w_gate)
        h = h / (1 + m.jnp.exp(-h)) * m.jnp.einsum("becd,edf->becf", xe, w_up)
        ye = m.jnp.einsum("becf,efd->becd", h, w_down)
        return m.lax.all_to_all(ye, "x", 0, 1, tiled=True)          # [B, E, C, D]
    return body


def _run(lib, cfg, xe, p):
    if lib == "jax":
        jax = pytest.importorskip("jax")
        m = types.SimpleNamespace(lax=jax.lax, jnp=jax.numpy, shard_map=jax.shard_map, P=jax.sharding.PartitionSpec,
                                  NamedSharding=jax.sharding.NamedSharding, make_mesh=jax.make_mesh,
                                  device_put=jax.device_put, grad=jax.grad,
                                  set_mesh=jax.set_mesh)
    else:
        m = types.SimpleNamespace(lax=sl.lax, jnp=sl.numpy, shard_map=sl.shard_map, P=sl.P,
                                  NamedSharding=sl.NamedSharding, make_mesh=sl.make_mesh, device_put=sl.device_put,
                                  grad=sl.grad)
    mesh = m.make_mesh((8,), ("x",))
    f = m.shard_map(_slots_program(m, cfg), mesh=mesh, in_specs=(m.P("x"),) * 4, out_specs=m.P("x"))
    args = [m.device_put(a, m.NamedSharding(mesh, m.P("x"))) for a in (xe, p["w_gate"], p["w_up"], p["w_down"])]
    out = np.asarray(f(*args))
    with (m.set_mesh(mesh) if lib == "jax" else contextlib.nullcontext()):  # JAX differentiates under its mesh
        grads = m.grad(lambda *a: m.jnp.sum(m.jnp.tanh(f(*a))), argnums=(1, 2, 3))(*args)
    return out, [np.asarray(g) for g in grads]


def test_dispatch_and_combine_agree_with_jax_all_to_all():
    jax = pytest.importorskip("jax")
    if len(jax.devices()) < 8:
        pytest.skip("JAX started with fewer than 8 CPU devices")
    cfg = BASE.replace(activation="silu", capacity_factor=0.75)
    p, x = _layer(cfg), _x()
    idx, gates = route(p, x, cfg)
    xe, plan = dispatch(x, idx, gates, cfg)
    xe = np.asarray(xe)                                            # [B, E, C, D], sharded over B
    ours, g_ours = _run("shardlab", cfg, xe, p)
    theirs, g_theirs = _run("jax", cfg, xe, p)
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
    for a, b in zip(g_ours, g_theirs):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    # and JAX's slots, combined, are the one-device MoE block
    np.testing.assert_allclose(np.asarray(combine(theirs, plan)), np.asarray(moe_mlp(p, x, cfg)), atol=1e-5)


# -- training ------------------------------------------------------------------------------
TCFG = ModelConfig(num_layers=2, d_model=16, ffw_dim=32, num_heads=2, vocab_size=32, max_seq_len=8, num_experts=8,
                   top_k=2, num_shared_experts=1, capacity_factor=0.75, first_dense_layers=1)


def _batch(B=8, T=8, V=32, seed=1):
    rng = np.random.default_rng(seed)
    return rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))


@pytest.mark.parametrize("name", ["ep", "fsdp_ep", "fsdp"])
def test_five_steps_equal_the_single_device_run(name):
    tok, tgt = _batch()
    p0 = transformer.init_params(TCFG, seed=0)
    opt = train.SGD(lr=0.5)
    ref = p0
    for s in range(1, 6):
        ref, _ = train.reference_step(TCFG, ref, tok, tgt, opt, s)
    t = train.Trainer(TCFG, name, sl.make_mesh((4,), ("data",)), optimizer=opt)
    state = t.init(p0)
    if name != "fsdp":  # the expert axis holds E/4 experts per device, for params and states
        w = state.params["layers"][1]["moe"]["w_gate"]
        assert w.nbytes_per_device == w.nbytes // 4
        assert state.params["layers"][1]["moe"]["w_gate"].sharding.spec[0] == "data"
    for _ in range(5):
        state, _ = t.step(state, tok, tgt)
    assert rel_error(state.params, ref) <= 1e-5


@pytest.mark.parametrize("name", ["ep", "fsdp_ep"])
def test_one_moe_layer_moves_two_alltoalls_each_way_of_the_closed_form(name):
    tok, tgt = _batch()
    mesh = sl.make_mesh((4,), ("data",))
    t = train.Trainer(TCFG, name, mesh, optimizer="sgd")
    state = t.init(transformer.init_params(TCFG, seed=0))
    with sl.Ledger() as led:
        t.step(state, tok, tgt)
    want = t.s.moe_alltoall_bytes(TCFG, mesh, batch=8, seq=8)
    assert want == alltoall_bytes(TCFG, 2, 8, 4)
    layer = led.filter(label="layer1/mlp")
    for phase in ("forward", "backward"):
        ev = layer.filter(phase=phase, op="all_to_all").events
        assert len(ev) == 2 and all(e["bytes_in"] == want["bytes_in"] for e in ev)
        assert sum(e["bytes_sent"] for e in ev) == 2 * TCFG.num_experts * want["capacity"] * 16 * 4 * 3 / 4
    assert not led.filter(label="layer0", op="all_to_all").events  # the dense layer has none
    # the expert weights are never gathered: FSDP's gathers are the router, norm and shared experts
    gathered = sum(e["bytes_in"] for e in layer.filter(phase="forward", op="all_gather").events)
    D, F, E, S = 16, 32, 8, 1
    assert gathered == (0 if name == "ep" else (D + D * E + 3 * S * D * F) * 4 // 4)


def test_strategy_errors_name_experts_and_axes():
    mesh = sl.make_mesh((4,), ("data",))
    with pytest.raises(ValueError, match=r"\[ep\] num_experts 6 is not divisible by the expert axis 'data' of size 4"):
        train.Trainer(TCFG.replace(num_experts=6), "ep", mesh)
    with pytest.raises(ValueError, match=r"expert axis 'model' must be one of the data axes"):
        train.Strategy("x", data="data", expert="model")
    with pytest.raises(ValueError, match=r"expert parallelism with ZeRO-1 is not supported"):
        train.Strategy("x", data="data", zero=1, expert="data")
    with pytest.raises(ValueError, match=r"\[tp\] mixture-of-experts layers are not supported with a model axis"):
        train.Trainer(TCFG, "tp", sl.make_mesh((2,), ("model",)))
    with pytest.raises(ValueError, match=r"\[ep\] expert axis 'data' given but the model is dense"):
        train.Trainer(TCFG.replace(num_experts=0, top_k=0, num_shared_experts=0, first_dense_layers=0), "ep", mesh)
