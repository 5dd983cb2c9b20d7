"""shardlab.grad / vjp / value_and_grad / checkpoint: against jax.grad of the same shard_map
programs (8 CPU devices), against finite differences, and the backward pass's ledger."""

import types

import numpy as np
import pytest

import shardlab as sl
import shardlab.numpy as jnp
from shardlab import P
from shardlab._src.primitives import structural as st

jax = pytest.importorskip("jax")


def namespace(lib: str):
    if lib == "jax":
        return types.SimpleNamespace(lax=jax.lax, jnp=jax.numpy, shard_map=jax.shard_map, P=jax.sharding.PartitionSpec,
                                     NamedSharding=jax.sharding.NamedSharding, make_mesh=jax.make_mesh,
                                     device_put=jax.device_put, grad=jax.grad, nn=jax.nn, checkpoint=jax.checkpoint,
                                     set_mesh=jax.set_mesh)
    return types.SimpleNamespace(lax=sl.lax, jnp=sl.numpy, shard_map=sl.shard_map, P=sl.P,
                                 NamedSharding=sl.NamedSharding, make_mesh=sl.make_mesh, device_put=sl.device_put,
                                 grad=sl.grad, nn=sl.nn, checkpoint=sl.checkpoint,
                                 set_mesh=sl.set_mesh)


def rand(rng, *shape):
    return (rng.standard_normal(shape) * 0.5).astype(np.float32)


# Each program: (mesh shape, axis names, build(m, rng) -> (body, in_specs, out_spec, args)).
PROGRAMS = {}


def program(mesh_shape, names):
    def register(build):
        PROGRAMS[build.__name__] = (mesh_shape, names, build)
        return build

    return register


@program((8,), ("x",))
def fsdp_mlp(m, rng):
    def body(x, w1, w2):
        h = m.jnp.tanh(x @ m.lax.all_gather(w1, "x", tiled=True))
        return h @ m.lax.all_gather(w2, "x", tiled=True)

    return body, (m.P("x"), m.P("x"), m.P("x")), m.P("x"), [rand(rng, 16, 32), rand(rng, 32, 64), rand(rng, 64, 32)]


@program((8,), ("x",))
def data_parallel(m, rng):
    def body(x, w1, b):
        return m.jnp.tanh(x @ w1 + b)

    return body, (m.P("x"), m.P(), m.P()), m.P("x"), [rand(rng, 16, 8), rand(rng, 8, 12), rand(rng, 12)]


@program((2, 4), ("data", "model"))
def megatron_mlp(m, rng):
    def body(x, w1, w2):
        h = m.jnp.maximum(x @ w1, 0.0)
        return m.lax.psum(h @ w2, "model")

    return body, (m.P("data"), m.P(None, "model"), m.P("model")), m.P("data"), \
        [rand(rng, 8, 16), rand(rng, 16, 32), rand(rng, 32, 16)]


@program((8,), ("x",))
def sequence_parallel_mlp(m, rng):
    def body(x, w1, w2):
        full = m.lax.all_gather(x, "x", axis=0, tiled=True)
        h = m.jnp.tanh(full @ w1)
        return m.lax.psum_scatter(h @ w2, "x", scatter_dimension=0, tiled=True)

    return body, (m.P("x"), m.P(None, "x"), m.P("x")), m.P("x"), \
        [rand(rng, 16, 8), rand(rng, 8, 16), rand(rng, 16, 8)]


@program((4,), ("x",))
def all_to_all_and_ppermute(m, rng):
    def body(x):
        y = m.lax.all_to_all(x, "x", 0, 1, tiled=True)
        z = m.lax.ppermute(y * y, "x", [(i, (i + 1) % 4) for i in range(4)])
        return m.lax.pmean(z + m.jnp.sin(y).sum(), "x")

    return body, (m.P("x"),), m.P(None), [rand(rng, 16, 4)]


@program((4,), ("x",))
def untiled_collectives(m, rng):
    def body(x):
        g = m.lax.all_gather(x, "x")                      # (4, 2, 3), invariant
        s = m.lax.psum_scatter(m.jnp.exp(g), "x")         # back to (2, 3), varying
        return s * x

    return body, (m.P("x"),), m.P("x"), [rand(rng, 8, 3)]


@program((2, 2), ("x", "y"))
def collective_matmul(m, rng):
    def body(a, b):
        n = 2
        acc = a @ b
        for _ in range(n - 1):
            a = m.lax.ppermute(a, "x", [(0, 1), (1, 0)])
            acc = acc + a @ b
        return m.lax.psum(acc, "y")

    return body, (m.P("x", "y"), m.P("y")), m.P("x"), [rand(rng, 8, 8), rand(rng, 8, 6)]


@program((2, 2), ("data", "heads"))
def attention(m, rng):
    def body(q, k, v):
        return m.nn.dot_product_attention(q, k, v, is_causal=True)

    spec = m.P("data", None, "heads")
    return body, (spec, spec, spec), spec, [rand(rng, 2, 8, 4, 16), rand(rng, 2, 8, 2, 16), rand(rng, 2, 8, 2, 16)]


def run_grad(lib, name):
    mesh_shape, names, build = PROGRAMS[name]
    m = namespace(lib)
    mesh = m.make_mesh(mesh_shape, names)
    body, in_specs, out_spec, args = build(m, np.random.default_rng(len(name)))
    f = m.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_spec)
    placed = [m.device_put(a, m.NamedSharding(mesh, s)) for a, s in zip(args, in_specs)]
    weight = np.random.default_rng(1).standard_normal(np.asarray(f(*placed)).shape).astype(np.float32)

    def loss(*xs):
        return m.jnp.sum(f(*xs) * weight)

    with m.set_mesh(mesh):
        grads = m.grad(loss, argnums=tuple(range(len(args))))(*placed)
    return [np.asarray(g) for g in grads]


@pytest.mark.jax
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_grad_equals_jax(name):
    if len(jax.devices()) < 8:
        pytest.skip("JAX started with fewer than 8 CPU devices")
    ours, theirs = run_grad("shardlab", name), run_grad("jax", name)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


def test_grad_returns_the_inputs_sharding():
    mesh = sl.make_mesh((8,), ("x",))
    w = sl.device_put(np.ones((16, 4), np.float32), sl.NamedSharding(mesh, P("x")))
    f = sl.shard_map(lambda w: w * 3.0, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    g = sl.grad(lambda w: jnp.sum(f(w)))(w)
    assert isinstance(g, sl.ShardedArray) and g.sharding == w.sharding
    np.testing.assert_array_equal(np.asarray(g), np.full((16, 4), 3.0, np.float32))


# -- the backward pass in the ledger ----------------------------------------------------------

def _ledger_of_grad(name, hardware=None):
    mesh_shape, names, build = PROGRAMS[name]
    mesh = sl.make_mesh(mesh_shape, names, hardware=hardware)
    body, in_specs, out_spec, args = build(namespace("shardlab"), np.random.default_rng(0))
    f = sl.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_spec)
    with sl.Ledger() as ledger:
        sl.grad(lambda *xs: jnp.sum(f(*xs) ** 2), argnums=tuple(range(len(args))))(*args)
    return ledger


def test_fsdp_backward_reduce_scatters_where_the_forward_all_gathered():
    ledger = _ledger_of_grad("fsdp_mlp")
    fwd = [(e["op"], e["bytes_sent"]) for e in ledger.events if e["phase"] == "forward" and e["axes"]]
    bwd = [(e["op"], e["bytes_sent"]) for e in ledger.events if e["phase"] == "backward" and e["axes"]]
    gathers = [b for op, b in fwd if op == "all_gather"]
    scatters = [b for op, b in bwd if op == "psum_scatter"]
    assert len(gathers) == 2 and sorted(scatters) == sorted(gathers)  # same V, (n-1)/n each way
    assert not any(op == "all_gather" for op, _ in bwd)  # the gathered weights were kept


def test_data_parallel_gradient_is_one_all_reduce_per_replicated_parameter():
    ledger = _ledger_of_grad("data_parallel")
    bwd = [e for e in ledger.events if e["phase"] == "backward" and e["axes"]]
    assert sorted(e["op"] for e in bwd) == ["psum", "psum"]
    # w1 (8x12) and b (12) float32: 2 (n-1)/n V each
    assert sorted(e["bytes_sent"] for e in bwd) == [2 * 7 / 8 * 12 * 4, 2 * 7 / 8 * 96 * 4]


def test_backward_matmul_flops_are_twice_the_forward():
    ledger = _ledger_of_grad("data_parallel")
    flops = {p: sum(e["flops"] for e in ledger.events if e["op"] == "matmul" and e["phase"] == p)
             for p in ("forward", "backward")}
    assert flops["backward"] == 2 * flops["forward"] > 0


def test_backward_events_get_book_seconds_on_hardware():
    ledger = _ledger_of_grad("fsdp_mlp", hardware="tpu-v5e")
    comm = [e for e in ledger.events if e["axes"]]
    assert comm and all(e["seconds"] > 0 and e["book_seconds"] is not None and e["hops"] >= 1 for e in comm)


def test_named_scope_labels_events():
    mesh = sl.make_mesh((2,), ("x",))

    def body(x):
        with sl.named_scope("layer0"), sl.named_scope("mlp"):
            return sl.lax.psum(x @ x.T, "x")

    with sl.Ledger() as ledger:
        sl.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P())(np.ones((4, 4), np.float32))
    assert [e["label"] for e in ledger.events] == ["layer0/mlp", "layer0/mlp"]
    assert len(ledger.filter(label="layer0")) == 2 and len(ledger.filter(label="layer1")) == 0


# -- plain functions: finite differences --------------------------------------------------------

FUNCTIONS = {
    "tanh_sum": lambda x: jnp.sum(jnp.tanh(x) * x),
    "softmax": lambda x: jnp.sum(sl.nn.softmax(x, axis=-1) * np.arange(x.shape[-1], dtype=np.float32)),
    "logsumexp": lambda x: jnp.sum(sl.nn.logsumexp(x, axis=0)),
    "norms": lambda x: jnp.sum(sl.nn.layer_norm(x) ** 2 + sl.nn.rms_norm(x)),
    "max_mean": lambda x: jnp.max(x, axis=1).sum() + jnp.mean(x ** 3),
    "reshape_transpose": lambda x: jnp.sum(jnp.reshape(x.T, (-1,))[::2] ** 2),
    "matmul_chain": lambda x: jnp.sum((x @ x.T) @ jnp.exp(x * 0.1)),
    "where_concat": lambda x: jnp.sum(jnp.where(x > 0, x, 0.1 * x) + jnp.concatenate([x, x * 2], axis=1).mean()),
    "activations": lambda x: jnp.sum(sl.nn.gelu(x) + sl.nn.silu(x) + sl.nn.relu(x) + sl.nn.softplus(x)),
    "power_divide": lambda x: jnp.sum((x * x + 1.0) ** 1.5 / (jnp.abs(x) + 2.0)),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_grad_matches_finite_differences(name):
    f = FUNCTIONS[name]
    x = np.random.default_rng(3).standard_normal((4, 5)).astype(np.float32)
    g = sl.grad(f)(x)
    assert g.shape == x.shape and g.dtype == np.float32
    x64 = x.astype(np.float64)
    eps = 1e-3
    num = np.zeros_like(x64)
    for i in np.ndindex(*x.shape):
        d = np.zeros_like(x64)
        d[i] = eps
        num[i] = (float(f((x64 + d).astype(np.float32))) - float(f((x64 - d).astype(np.float32)))) / (2 * eps)
    np.testing.assert_allclose(g, num, rtol=3e-2, atol=3e-2)


def test_vjp_and_value_and_grad_with_pytrees_and_aux():
    params = {"w": np.ones((3, 2), np.float32), "b": np.zeros(2, np.float32)}
    x = np.arange(6.0, dtype=np.float32).reshape(2, 3)

    def loss(p, x):
        y = x @ p["w"] + p["b"]
        return jnp.sum(y * y), y.shape

    (value, aux), g = sl.value_and_grad(loss, has_aux=True)(params, x)
    y = x @ params["w"]
    assert float(value) == pytest.approx(float((y * y).sum())) and aux == (2, 2)
    np.testing.assert_allclose(g["w"], x.T @ (2 * y), rtol=1e-6)
    np.testing.assert_allclose(g["b"], (2 * y).sum(0), rtol=1e-6)
    out, f_vjp = sl.vjp(lambda a: a * 2.0 + 1.0, x)
    (ct,) = f_vjp(np.ones_like(x))
    np.testing.assert_array_equal(out, x * 2 + 1)
    np.testing.assert_array_equal(ct, np.full_like(x, 2.0))


def test_aux_is_the_users_view_as_the_output_is():
    # an aux value computed from a traced input is a plain array (JAX's Array), not a per-device value
    def f(x):
        return jnp.sum(x * x), {"s": jnp.sum(x), "y": x * 2.0}

    x = np.arange(3.0, dtype=np.float32)
    (value, aux), g = sl.value_and_grad(f, has_aux=True)(x)
    (j_value, j_aux), j_g = jax.value_and_grad(lambda v: (jax.numpy.sum(v * v), {"s": jax.numpy.sum(v), "y": v * 2.0}),
                                               has_aux=True)(x)
    assert type(aux["s"]) is type(value) and type(aux["y"]) is type(g)
    assert float(aux["s"]) == float(j_aux["s"]) == 3.0 and aux["s"].shape == j_aux["s"].shape == ()
    np.testing.assert_array_equal(np.asarray(aux["y"]), np.asarray(j_aux["y"]))
    _, _, aux2 = sl.vjp(f, x, has_aux=True)
    assert type(aux2["s"]) is type(value)
    g_only, aux3 = sl.grad(f, has_aux=True)(x)
    np.testing.assert_array_equal(np.asarray(g_only), np.asarray(j_g))
    assert type(aux3["y"]) is type(g_only)


def test_unused_input_gets_zero_gradient():
    g = sl.grad(lambda a, b: jnp.sum(a * 2.0), argnums=(0, 1))(np.ones(3, np.float32), np.ones(2, np.float32))
    np.testing.assert_array_equal(g[1], np.zeros(2, np.float32))


# -- checkpoint ------------------------------------------------------------------------------------

def _mlp_with_remat(policy):
    mesh = sl.make_mesh((2,), ("x",))
    block = sl.checkpoint(lambda x, w: jnp.tanh(x @ w) @ w.T, policy=policy)
    f = sl.shard_map(lambda x, w: block(x, w), mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x"))
    x, w = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32), \
        np.random.default_rng(1).standard_normal((6, 5)).astype(np.float32)
    with sl.Ledger() as ledger:
        g = sl.grad(lambda x, w: jnp.sum(f(x, w) ** 2), argnums=1)(x, w)
    return g, ledger


def test_checkpoint_recomputes_the_forward_and_keeps_gradients():
    g0, plain = _mlp_with_remat("dots_saveable")
    g1, remat = _mlp_with_remat(None)
    np.testing.assert_allclose(g0, g1, rtol=1e-5, atol=1e-6)
    recompute = [e for e in remat.events if e["phase"] == "recompute"]
    assert [e["op"] for e in recompute] == ["matmul", "matmul"]
    assert sum(e["flops"] for e in recompute) == sum(e["flops"] for e in remat.events if e["phase"] == "forward")
    assert not [e for e in plain.events if e["phase"] == "recompute"]  # dots kept: nothing recomputed


def test_checkpoint_rejects_an_unknown_policy():
    with pytest.raises(ValueError, match=r"\[checkpoint\] policy 'everything'"):
        sl.checkpoint(lambda x: x, policy="everything")


# -- bad input -----------------------------------------------------------------------------------

def test_grad_errors_name_the_problem():
    x = np.ones(3, np.float32)
    with pytest.raises(TypeError, match=r"\[grad\] the function must return a scalar, got an output of shape \(3,\)"):
        sl.grad(lambda x: x * 2.0)(x)
    with pytest.raises(ValueError, match=r"\[grad\] argnums 2 is out of range for 1 positional"):
        sl.grad(lambda x: jnp.sum(x), argnums=2)(x)
    with pytest.raises(TypeError, match=r"\[grad\] argument 0 has dtype int32; grad needs float inputs"):
        sl.grad(lambda x: jnp.sum(x))(np.ones(3, np.int32))
    with pytest.raises(NotImplementedError, match=r"\[grad\] pmax has no transpose"):
        mesh = sl.make_mesh((2,), ("x",))
        f = sl.shard_map(lambda a: sl.lax.pmax(a, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())
        sl.grad(lambda a: jnp.sum(f(a)))(np.ones(4, np.float32))
    with pytest.raises(NotImplementedError, match=r"\[grad\] numpy_fallback is not differentiable"):
        sl.grad(lambda a: jnp.sum(jnp.median(a, axis=0)))(np.ones(4, np.float32))


def test_collective_outside_shard_map_under_grad_is_an_unbound_axis():
    with pytest.raises(NameError, match="unbound axis name: 'x'"):
        sl.grad(lambda a: jnp.sum(sl.lax.psum(a, "x")))(np.ones(2, np.float32))


def test_vjp_with_argnums_computes_only_what_is_asked():
    """Zero-bubble pipelines split a backward pass into input and weight gradients: each half
    runs only its own matmuls."""
    mesh = sl.make_mesh((2,), ("x",))
    f = sl.shard_map(lambda x, w: jnp.tanh(x @ w), mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x"))
    x = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((6, 5)).astype(np.float32)
    out, f_vjp = sl.vjp(f, x, w)
    ct = np.ones((8, 5), np.float32)
    full = f_vjp(ct)
    with sl.Ledger() as input_half:
        gx, gw0 = f_vjp(ct, argnums=0)
    with sl.Ledger() as weight_half:
        gx0, gw = f_vjp(ct, argnums=1)
    np.testing.assert_allclose(gx, full[0], rtol=1e-6)
    np.testing.assert_allclose(gw, full[1], rtol=1e-6)
    assert not np.any(gw0) and not np.any(gx0)
    assert [e["op"] for e in input_half.events] == ["matmul"]               # dx = ct w^T only
    assert [e["op"] for e in weight_half.events] == ["matmul", "psum"]      # dw = x^T ct, summed over x
    with pytest.raises(ValueError, match=r"\[vjp\] argnums 2 is out of range"):
        f_vjp(ct, argnums=2)


def test_a_constant_entering_shard_map_gets_no_gradient_all_reduce():
    """Only what depends on the differentiated inputs is on the tape (as JAX traces only
    that): a replicated constant's cotangent is never formed, so no backward psum for it."""
    mesh = sl.make_mesh((2,), ("x",))
    c = sl.device_put(np.ones(4, np.float32), sl.NamedSharding(mesh, P()))
    w = sl.device_put(np.arange(4, dtype=np.float32), sl.NamedSharding(mesh, P("x")))
    f = sl.shard_map(lambda w, c: sl.lax.psum(jnp.sum(w * c[:2]), "x"), mesh=mesh, in_specs=(P("x"), P()),
                     out_specs=P())
    with sl.Ledger() as ledger:
        g = sl.grad(lambda w: f(w, c))(w)
    assert [(e["op"], e["phase"]) for e in ledger.events if e["axes"]] == [("psum", "forward")]
    np.testing.assert_array_equal(np.asarray(g), np.ones(4, np.float32))
    # differentiating the constant too brings its all-reduce back
    with sl.Ledger() as both:
        sl.grad(lambda w, c: f(w, c), argnums=(0, 1))(w, c)
    assert [(e["op"], e["phase"]) for e in both.events if e["axes"]] == [("psum", "forward"), ("psum", "backward")]


def test_take_along_axis_gradient_with_an_index_that_broadcasts():
    x = np.random.default_rng(0).standard_normal((2, 8, 16)).astype(np.float32)
    idx = np.array([[[3], [0], [3], [7], [1]], [[2], [2], [5], [0], [6]]], np.int32)   # [2, 5, 1]
    g = sl.grad(lambda x: jnp.sum(jnp.take_along_axis(x, idx, axis=1) ** 2))(x)
    jax = pytest.importorskip("jax")
    ref = jax.grad(lambda x: jax.numpy.sum(jax.numpy.take_along_axis(x, idx, axis=1) ** 2))(x)
    np.testing.assert_allclose(g, np.asarray(ref), rtol=1e-6)


def test_take_of_a_constant_table_with_per_device_indices():
    mesh = sl.make_mesh((2,), ("x",))
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    f = sl.shard_map(lambda i: jnp.take(table, i, axis=0), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    idx = np.array([5, 1, 2, 0], np.int32)
    np.testing.assert_array_equal(np.asarray(f(idx)), table[idx])


def test_backward_skips_the_cotangent_of_an_input_not_differentiated():
    """grad with respect to w of x @ w runs the weight-gradient matmul only, as JAX's
    transpose does: x is a constant, its cotangent is never formed."""
    mesh = sl.make_mesh((2,), ("x",))
    f = sl.shard_map(lambda x, w: jnp.tanh(x @ w), mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x"))
    x = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((6, 5)).astype(np.float32)
    with sl.Ledger() as only_w:
        gw = sl.grad(lambda w: jnp.sum(f(x, w)))(w)
    with sl.Ledger() as both:
        gx, gw2 = sl.grad(lambda x, w: jnp.sum(f(x, w)), argnums=(0, 1))(x, w)
    def backward(ledger):
        return [e["op"] for e in ledger.events if e["phase"] == "backward" and e["op"] == "matmul"]
    assert backward(only_w) == ["matmul"] and backward(both) == ["matmul", "matmul"]
    np.testing.assert_allclose(gw, gw2, rtol=1e-6)


@pytest.mark.parametrize("where", ["plain", "shard_map", "shard_map_sharded_input"])
def test_grad_of_grad_matches_jax(where):
    """Second derivatives: an inner grad's result stays tracked by the outer one, through
    shard_map's boundaries too (it used to come back as a constant: a zero second derivative)."""
    jax = pytest.importorskip("jax")
    x = np.linspace(-2, 2, 8).astype(np.float32)
    mesh = sl.make_mesh((4,), ("x",))
    if where == "plain":
        f = lambda y: jnp.sum(jnp.tanh(y) * y)  # noqa: E731
    else:
        inner = sl.shard_map(lambda y: jnp.tanh(y) * y, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
        f = lambda y: jnp.sum(inner(y))  # noqa: E731
    arg = sl.device_put(x, sl.NamedSharding(mesh, P("x"))) if where == "shard_map_sharded_input" else x
    got = np.asarray(sl.grad(lambda x: jnp.sum(sl.grad(f)(x) ** 2))(arg))
    want = jax.grad(lambda x: jax.numpy.sum(jax.grad(lambda y: jax.numpy.sum(jax.numpy.tanh(y) * y))(x) ** 2))(x)
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-6)
    assert sl.grad(sl.grad(lambda x: x ** 3))(np.float32(2.0)) == pytest.approx(12.0)


def test_a_global_array_times_a_tracked_numpy_argument():
    """A sharded result combined with the numpy argument being differentiated (``a * u`` with
    ``a`` a ShardedArray): the argument enters the elementwise shard_map and gets its gradient,
    first and second order, as in JAX (it used to raise converting the tracked value to numpy)."""
    mesh = sl.make_mesh((4,), ("x",))
    sq = sl.shard_map(lambda y: y * y, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    rng = np.random.default_rng(2)
    g, u = rng.standard_normal((2, 8, 3)).astype(np.float32)
    got = sl.grad(lambda g, u: jnp.sum(sq(g) * u * u), argnums=(0, 1))(g, u)
    want = jax.grad(lambda g, u: jax.numpy.sum(g * g * u * u), argnums=(0, 1))(g, u)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
    second = sl.grad(lambda u: jnp.sum(sl.grad(lambda u: jnp.sum(sq(u) * u))(u) ** 2))(u)
    want2 = jax.grad(lambda u: jax.numpy.sum(jax.grad(lambda u: jax.numpy.sum(u * u * u))(u) ** 2))(u)
    np.testing.assert_allclose(np.asarray(second), np.asarray(want2), rtol=1e-5)


@pytest.mark.parametrize("idx", [3, [2, 5], [0, 9], [4, 9]])
def test_split_is_one_primitive_whose_transpose_concatenates(idx):
    """jnp.split is one ``split`` whose backward is one ``concatenate`` of the pieces'
    cotangents (not a zero-filled scatter-add per piece and adds); gradients equal JAX's."""
    mesh = sl.make_mesh((2,), ("x",))
    x = np.random.default_rng(0).standard_normal((4, 9)).astype(np.float32)

    def f(split, sum_, x):
        return sum(sum_(p * p * (i + 1)) for i, p in enumerate(split(x, idx, axis=1)))

    per_device = sl.shard_map(lambda x: jnp.expand_dims(f(jnp.split, jnp.sum, x), 0), mesh=mesh, in_specs=P("x"),
                              out_specs=P("x"))
    calls = []
    prims = (st.SPLIT, st.CONCATENATE, st.SCATTER_ADD)
    saved = [p.impl["emulated"] for p in prims]
    for p, impl in zip(prims, saved):
        p.impl["emulated"] = lambda s, m, _n=p.name, _f=impl, **kw: calls.append(_n) or _f(s, m, **kw)
    try:
        g = sl.grad(lambda x: jnp.sum(per_device(x)))(x)
    finally:
        for p, impl in zip(prims, saved):
            p.impl["emulated"] = impl
    want = jax.grad(lambda x: f(jax.numpy.split, jax.numpy.sum, x[:2]) + f(jax.numpy.split, jax.numpy.sum, x[2:]))(x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(want), rtol=1e-6)
    assert calls == ["split", "concatenate"]


def test_split_refuses_decreasing_indices_as_jax_does():
    mesh = sl.make_mesh((2,), ("x",))
    f = sl.shard_map(lambda x: jnp.split(x, [5, 2], axis=1)[0], mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    with pytest.raises(ValueError, match=r"\[split\] indices \[5, 2\] along local axis 1 of size 9 decrease"):
        f(np.ones((4, 9), np.float32))
    with pytest.raises(ValueError):
        jax.numpy.split(np.ones((4, 9), np.float32), [5, 2], axis=1)
