"""lax.scan / cond / switch / while_loop / map / fori_loop against jax.lax: values, dtypes,
structures, gradients, JAX's errors, and per-device predicates inside shard_map."""

import numpy as np
import pytest

import shardlab as sl
import shardlab.numpy as jnp
from shardlab import P, lax

jax = pytest.importorskip("jax")
jjnp = jax.numpy
jlax = jax.lax

pytestmark = pytest.mark.jax


def _same(ours, theirs, rtol=1e-6):
    lo, do = sl.tree_util.tree_flatten(ours)
    lt, dt = jax.tree_util.tree_flatten(theirs)
    assert repr(do) == repr(dt)
    for a, b in zip(lo, lt):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype, (a.dtype, b.dtype)
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-6)


XS = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)

SCANS = [
    ("cumsum", lambda L, N: L.scan(lambda c, x: (c + x, c), N.zeros(3, np.float32), XS)),
    ("reverse", lambda L, N: L.scan(lambda c, x: (c * 2 + x, (c, x.sum())), N.ones(3, np.float32), XS, reverse=True)),
    ("length_no_xs", lambda L, N: L.scan(lambda c, _: (c + 1, c * 2), 0, None, length=5)),
    ("weak_int_promoted", lambda L, N: L.scan(lambda c, x: (c + x, c), 0, XS[:, 0])),
    ("dict_carry_none_y", lambda L, N: L.scan(lambda c, x: ({"a": c["a"] + x, "n": c["n"] + 1}, None),
                                              {"a": N.zeros(3, np.float32), "n": 0}, XS)),
    ("pytree_xs", lambda L, N: L.scan(lambda c, x: (c + x["u"] * x["v"][0], [x["u"]]), 0.0,
                                      {"u": XS[:, 0], "v": (XS[:, 1],)})),
    ("unroll", lambda L, N: L.scan(lambda c, x: (c + x, x), 0.0, XS[:, 1], unroll=2)),
    ("int_ys", lambda L, N: L.scan(lambda c, x: (c + 1.0, (x > 0).astype(np.int32)), 0.0, XS)),
]


@pytest.mark.parametrize("name,prog", SCANS, ids=[s[0] for s in SCANS])
def test_scan_like_jax(name, prog):
    _same(prog(lax, jnp), prog(jlax, jjnp))


def test_scan_zero_length_gives_empty_ys():
    c, ys = lax.scan(lambda c, x: (c + x.sum(), x * 2), 0.0, np.zeros((0, 3), np.float32))
    jc, jys = jlax.scan(lambda c, x: (c + x.sum(), x * 2), 0.0, np.zeros((0, 3), np.float32))
    _same((c, ys), (jc, jys))


SCAN_ERRORS = [
    lambda L, N: L.scan(lambda c, x: ((c, c), x), 0.0, np.arange(3.0)),
    lambda L, N: L.scan(lambda c, x: (c.astype(np.int32), x), 0.0, np.arange(3.0)),
    lambda L, N: L.scan(lambda c, x: (N.stack([c, c]), x), 0.0, np.arange(3.0)),
    lambda L, N: L.scan(lambda c, x: ({"a": c["b"]}, x), {"b": 0.0}, np.arange(3.0)),
    lambda L, N: L.scan(lambda c, x: (c, x), 0.0, None),
    lambda L, N: L.scan(lambda c, x: (c, x), 0.0, [np.arange(3.0), np.arange(4.0)]),
    lambda L, N: L.scan(lambda c, x: (c, x), 0.0, np.arange(3.0), length=4),
    lambda L, N: L.scan(lambda c, x: (c, x), 0.0, 1.0),
    lambda L, N: L.scan(lambda c, x: c, 0.0, np.arange(3.0)),
    lambda L, N: L.while_loop(lambda c: (c < 5, c), lambda c: c + 1, 0),
    lambda L, N: L.while_loop(lambda c: N.array([True]), lambda c: c + 1, 0),
    lambda L, N: L.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1,), (0, 1)),
    lambda L, N: L.cond(np.array([True, False]), lambda x: x, lambda x: x, 1.0),
    lambda L, N: L.switch(1.0, [lambda x: x, lambda x: x + 1], 1.0),
    lambda L, N: L.switch(0, [], 1.0),
    lambda L, N: L.cond(True, lambda x: x, lambda x: x, 1.0, operand=2.0),
    # JAX traces both branches even for a known predicate; shardlab runs them shape-only
    lambda L, N: L.cond(True, lambda x: x, lambda x: (x, x), 1.0),
    lambda L, N: L.cond(False, lambda x: x, lambda x: x.astype(np.int32), 1.0),
    lambda L, N: L.cond(True, lambda x: {"a": x}, lambda x: {"a": N.stack([x, x])}, XS),
    lambda L, N: L.switch(2, [lambda x: x, lambda x: (x,), lambda x: x], XS),
]


def _strip_sources(msg: str) -> str:
    """JAX names each branch with its source line; only the text around it must match."""
    return "\n".join(line for line in msg.splitlines() if " is <lambda> at " not in line)


@pytest.mark.parametrize("i", range(len(SCAN_ERRORS)))
def test_errors_like_jax(i):
    prog = SCAN_ERRORS[i]
    with pytest.raises((TypeError, ValueError)) as theirs:
        prog(jlax, jjnp)
    with pytest.raises(type(theirs.value)) as ours:
        prog(lax, jnp)
    a, b = _strip_sources(str(ours.value)), _strip_sources(str(theirs.value))
    # JAX names a leaf carry by its abstract type, shardlab as "pytree leaf"
    b = b.replace("<class 'jax._src.core.ShapedArray'>", "pytree leaf")
    b = b.replace("~", "")  # nor does it mark weak types in the messages
    assert a == b or a.split("\n")[0] == b.split("\n")[0], (a, b)


CONDS = [
    ("true", lambda L, N: L.cond(True, lambda x: x + 1, lambda x: x - 1, 1.0)),
    ("false_int", lambda L, N: L.cond(0, lambda x: x + 1, lambda x: x - 1, 5)),
    ("float_pred", lambda L, N: L.cond(1.5, lambda a, b: a * b, lambda a, b: a - b, 2.0, 3.0)),
    ("no_operands", lambda L, N: L.cond(False, lambda: 1.0, lambda: 2.0)),
    ("operand_kw", lambda L, N: L.cond(True, lambda x: x * 2, lambda x: x, operand=XS)),
    ("pytree", lambda L, N: L.cond(N.sum(XS) > 0, lambda d: {"s": d["a"] + 1, "t": (d["a"],)},
                                   lambda d: {"s": d["a"] - 1, "t": (d["a"] * 0,)}, {"a": XS})),
    ("switch", lambda L, N: [L.switch(i, [lambda x: x, lambda x: x * 3, lambda x: -x], XS[0]) for i in (-2, 0, 1, 2, 9)]),
    ("while", lambda L, N: L.while_loop(lambda c: c[0] < 100, lambda c: (c[0] * 3, c[1] + 1), (1, 0))),
    ("while_weak", lambda L, N: L.while_loop(lambda c: c < 5, lambda c: c + 1.5, 0)),
    ("map", lambda L, N: L.map(lambda x: (x.sum(), x * 2), XS)),
    ("map_batch", lambda L, N: L.map(lambda x: x ** 2, XS[:, 0], batch_size=3)),
    ("fori_unroll", lambda L, N: L.fori_loop(0, 4, lambda i, c: c * 2 + i, 1.0, unroll=2)),
]


@pytest.mark.parametrize("name,prog", CONDS, ids=[c[0] for c in CONDS])
def test_cond_switch_while_map_like_jax(name, prog):
    _same(prog(lax, jnp), prog(jlax, jjnp))


def test_cond_branch_mismatch_when_both_branches_run():
    # a per-device predicate runs both branches, so their outputs are checked as JAX checks them
    mesh = sl.make_mesh((2,), ("x",))
    f = sl.shard_map(lambda v: lax.cond(lax.axis_index("x") == 0, lambda a: a, lambda a: (a, a), v),
                     mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    with pytest.raises(TypeError) as ours:
        f(np.ones(2, np.float32))
    with pytest.raises(TypeError) as theirs:
        jlax.cond(True, lambda a: a, lambda a: (a, a), 1.0)
    assert _strip_sources(str(ours.value)) == _strip_sources(str(theirs.value))
    g = sl.shard_map(lambda v: lax.cond(lax.axis_index("x") == 0, lambda a: a, lambda a: a.astype(np.int32), v),
                     mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    with pytest.raises(TypeError, match="cond branches must have equal output types"):
        g(np.ones(2, np.float32))


# -- gradients ------------------------------------------------------------------------------------
W = np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)


def _rnn_loss(w, N, L):
    def step(h, x):
        h = N.tanh(h @ w + x.sum())
        return h, h.sum()
    h, ys = L.scan(step, N.full((4,), 0.1, dtype=np.float32), XS)
    return N.sum(h) + N.sum(ys ** 2)


def test_grad_through_scan_like_jax():
    g = sl.grad(lambda w: _rnn_loss(w, jnp, lax))(W)
    jg = jax.jit(jax.grad(lambda w: _rnn_loss(w, jjnp, jlax)))(W)
    np.testing.assert_allclose(np.asarray(g), np.asarray(jg), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pred", [True, False])
def test_grad_through_cond_and_switch_like_jax(pred):
    def loss(w, N, L):
        a = L.cond(pred, lambda v: N.sum(N.sin(v)), lambda v: N.sum(v * v), w)
        b = L.switch(int(pred), [lambda v: N.sum(v ** 3), lambda v: N.sum(N.cos(v))], w)
        return a + b
    np.testing.assert_allclose(np.asarray(sl.grad(lambda w: loss(w, jnp, lax))(W)),
                               np.asarray(jax.jit(jax.grad(lambda w: loss(w, jjnp, jlax)))(W)), rtol=1e-5, atol=1e-6)


def test_grad_through_scan_inside_shard_map():
    mesh = sl.make_mesh((4,), ("x",))
    xs = np.linspace(0, 1, 8 * 3, dtype=np.float32).reshape(8, 3)

    def body(w, v):  # v: this device's 2 rows; the carry varies along x from the start, as JAX requires
        c0 = lax.pcast(jnp.zeros((), np.float32), "x", to="varying")
        c, ys = lax.scan(lambda c, r: (c + jnp.sum(jnp.tanh(r @ w)), c), c0, v)
        return lax.psum(c + jnp.sum(ys), "x")

    f = sl.shard_map(body, mesh=mesh, in_specs=(P(), P("x")), out_specs=P())
    w = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)
    g = sl.grad(lambda w: f(w, xs))(w)

    def ref(w):
        total = 0.0
        for blk in xs.reshape(4, 2, 3):
            c, ys = jlax.scan(lambda c, r: (c + jjnp.sum(jjnp.tanh(r @ w)), c), 0.0, blk)
            total = total + c + jjnp.sum(ys)
        return total

    np.testing.assert_allclose(np.asarray(g), np.asarray(jax.jit(jax.grad(ref))(w)), rtol=1e-5, atol=1e-6)


def _swap_body(carry, _):
    c1, c2 = carry
    return (c2, c1), ()


VMA_LOOPS = [  # (name, loop over (x varying along i, y invariant)) run inside shard_map
    ("scan_swap", lambda L, x, y: L.scan(_swap_body, (x, y), (), length=2)[0][0]),
    ("scan_accumulate", lambda L, x, y: L.scan(lambda c, _: (c + x, ()), y, (), length=2)[0]),
    ("while_loop", lambda L, x, y: L.while_loop(lambda c: c[0] < 3, lambda c: c + x, y)),
]


@pytest.mark.parametrize("name,loop", VMA_LOOPS, ids=[n for n, _ in VMA_LOOPS])
def test_loop_carry_varying_axes_must_match_as_in_jax(name, loop):
    """A carry that starts invariant and comes back varying along a mesh axis is JAX's TypeError
    (the docs' shard_map "scan-vma" example), with the same message."""
    mesh = sl.make_mesh((2,), ("i",))
    f = sl.shard_map(lambda x, y: loop(lax, x, y), mesh=mesh, in_specs=(P("i"), P()), out_specs=P("i"))
    with pytest.raises(TypeError) as ours:
        f(np.arange(6.0, dtype=np.float32), np.arange(3.0, dtype=np.float32))
    jmesh = jax.make_mesh((2,), ("i",), devices=jax.devices()[:2])
    jf = jax.shard_map(lambda x, y: loop(jlax, x, y), mesh=jmesh, in_specs=(jax.P("i"), jax.P()),
                       out_specs=jax.P("i"))
    jx = jax.device_put(np.arange(6.0, dtype=np.float32), jax.NamedSharding(jmesh, jax.P("i")))
    jy = jax.device_put(np.arange(3.0, dtype=np.float32), jax.NamedSharding(jmesh, jax.P()))
    with pytest.raises(TypeError) as theirs:
        jf(jx, jy)
    assert str(ours.value) == str(theirs.value)


def test_loop_carry_made_varying_with_pcast_runs():
    mesh = sl.make_mesh((2,), ("i",))
    f = sl.shard_map(lambda x, y: lax.fori_loop(0, 2, lambda i, c: c + x, lax.pcast(y, "i", to="varying")),
                     mesh=mesh, in_specs=(P("i"), P()), out_specs=P("i"))
    x, y = np.arange(6.0, dtype=np.float32), np.arange(3.0, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(f(x, y)), np.concatenate([y + 2 * x[:3], y + 2 * x[3:]]))


# -- per-device predicates inside shard_map --------------------------------------------------------
MESH = sl.make_mesh((4,), ("x",))
X8 = np.arange(8, dtype=np.float32)


def _per_device(fn):
    """fn applied to each device's block on its own (what a real device computes)."""
    return np.concatenate([np.asarray(fn(i, blk)) for i, blk in enumerate(X8.reshape(4, 2))])


def test_cond_with_a_predicate_that_differs_across_devices():
    f = sl.shard_map(lambda v: lax.cond(lax.axis_index("x") % 2 == 0, lambda a: a * 10, lambda a: -a, v),
                     mesh=MESH, in_specs=P("x"), out_specs=P("x"))
    want = _per_device(lambda i, b: jlax.cond(i % 2 == 0, lambda a: a * 10, lambda a: -a, b))
    np.testing.assert_array_equal(np.asarray(f(X8)), want)


def test_switch_and_while_loop_per_device():
    branches = [lambda a: a, lambda a: a * 2, lambda a: a * 3]
    f = sl.shard_map(lambda v: lax.switch(lax.axis_index("x"), branches, v), mesh=MESH, in_specs=P("x"),
                     out_specs=P("x"))
    np.testing.assert_array_equal(np.asarray(f(X8)), _per_device(lambda i, b: jlax.switch(i, branches, b)))
    g = sl.shard_map(lambda v: lax.while_loop(lambda c: c[0] < 5, lambda c: c + 1, v), mesh=MESH,
                     in_specs=P("x"), out_specs=P("x"))
    np.testing.assert_array_equal(np.asarray(g(X8)),
                                  _per_device(lambda i, b: jlax.while_loop(lambda c: c[0] < 5, lambda c: c + 1, b)))


def test_uniform_predicate_runs_only_the_branch_taken():
    f = sl.shard_map(lambda v: lax.cond(lax.psum(1, "x") == 4, lambda a: lax.psum(a, "x"), lambda a: a, v),
                     mesh=MESH, in_specs=P("x"), out_specs=P())
    with sl.Ledger() as led:
        out = f(X8)
    np.testing.assert_array_equal(np.asarray(out), X8.reshape(4, 2).sum(0))
    assert sum(1 for e in led.events if e["op"] == "psum") == 1


def test_scan_with_collectives_inside_shard_map_records_each_step():
    def body(c, xi):
        s = lax.psum(xi, "x")
        return c + s, s * 2
    f = sl.shard_map(lambda v: lax.scan(body, jnp.zeros((), np.float32), v), mesh=MESH, in_specs=P("x"),
                     out_specs=(P(), P()))
    with sl.Ledger() as led:
        c, ys = f(X8)
    blocks = X8.reshape(4, 2)
    np.testing.assert_array_equal(np.asarray(ys), blocks.sum(0) * 2)
    assert float(np.asarray(c)) == X8.sum()
    assert sum(1 for e in led.events if e["op"] == "psum") == 2


def test_scan_over_a_global_array():
    mesh = sl.make_mesh((4, 2), ("x", "y"))
    a = sl.device_put(np.arange(32, dtype=np.float32).reshape(4, 8), sl.NamedSharding(mesh, P(None, "x")))
    c, ys = lax.scan(lambda c, row: (c + row, row * 2), jnp.zeros(8, np.float32), a)
    assert isinstance(ys, sl.ShardedArray) and ys.sharding.spec == P(None, "x")
    np.testing.assert_array_equal(np.asarray(ys), np.arange(32).reshape(4, 8) * 2)
    np.testing.assert_array_equal(np.asarray(c), np.arange(32).reshape(4, 8).sum(0))


def test_abstract_mode():
    out = sl.eval_shape(lambda a: lax.scan(lambda c, r: (c + r, r * 2), jnp.zeros(3, np.float32), a), XS)
    assert out[0].shape == (3,) and out[1].shape == (4, 3) and out[1].dtype == np.float32
    picked = sl.eval_shape(lambda a: lax.cond(jnp.sum(a) > 0, lambda v: v * 2, lambda v: v, a), XS)
    assert picked.shape == (4, 3)
    with pytest.raises(TypeError, match="trip count is unknown"):
        sl.eval_shape(lambda a: lax.while_loop(lambda v: jnp.sum(v) < 10, lambda v: v + 1, a), XS)


def test_carry_with_both_dtype_and_shape_wrong_names_both_like_jax():
    prog = lambda L, N: L.scan(lambda c, x: ({"a": N.zeros(2, np.int32), "b": c["b"]}, x),  # noqa: E731
                               {"a": N.zeros((), np.float32), "b": N.ones(3, np.float32)}, np.arange(3.0))
    with pytest.raises(TypeError) as theirs:
        prog(jlax, jjnp)
    with pytest.raises(TypeError) as ours:
        prog(lax, jnp)
    assert str(ours.value) == str(theirs.value)
