"""Reduced and unreduced types through reshard and grad, against JAX 0.10.2: resharding to
``P(unreduced=...)`` keeps each device's part of the value and zeros elsewhere (the same
per-device shards as JAX), and the cotangent of a value typed reduced along an axis is typed
unreduced along it (JAX's 301 "sharding and autodiff" rules: the AllReduce happens only where
the user reshards the gradient)."""

import numpy as np
import pytest

import shardlab as sl
import shardlab.numpy as jnp

jax = pytest.importorskip("jax")
jjnp = jax.numpy

pytestmark = pytest.mark.jax

CASES = [  # (source spec, target spec) on a (2, 2) mesh of axes X, Y
    (lambda P: P(), lambda P: P(unreduced={"X"})),
    (lambda P: P(reduced={"X"}), lambda P: P(unreduced={"X"})),
    (lambda P: P("X"), lambda P: P(unreduced={"X"})),
    (lambda P: P("Y"), lambda P: P("Y", unreduced={"X"})),
    (lambda P: P(("Y", "X")), lambda P: P("Y", unreduced={"X"})),
    (lambda P: P("X"), lambda P: P(unreduced={"X", "Y"})),
    (lambda P: P(("X", "Y")), lambda P: P(unreduced={"Y"})),
]


def _shards(a):
    return [np.asarray(s.data) for s in sorted(a.addressable_shards, key=lambda s: s.device.id)]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_reshard_to_unreduced_keeps_each_devices_part_as_jax(case):
    src, dst = CASES[case]
    x = np.arange(4.0, dtype=np.float32)
    mesh = sl.make_mesh((2, 2), ("X", "Y"))
    ours = sl.reshard(sl.device_put(x, sl.NamedSharding(mesh, src(sl.P))), sl.NamedSharding(mesh, dst(sl.P)))
    jmesh = jax.make_mesh((2, 2), ("X", "Y"), devices=jax.devices()[:4])
    theirs = jax.reshard(jax.device_put(x, jax.NamedSharding(jmesh, src(jax.P))), jax.NamedSharding(jmesh, dst(jax.P)))
    assert str(sl.typeof(ours)) == str(jax.typeof(theirs))
    for a, b in zip(_shards(ours), _shards(theirs)):
        np.testing.assert_array_equal(a, b)
    back = sl.reshard(ours, sl.NamedSharding(mesh, sl.P()))
    np.testing.assert_array_equal(np.asarray(back), x)


def _both(program):
    """``program(api, numpy)`` run by shardlab and by JAX, each under a set 2-device mesh X."""
    with sl.set_mesh(sl.make_mesh((2,), ("X",))):
        ours = program(sl, jnp)
    with jax.set_mesh(jax.make_mesh((2,), ("X",), devices=jax.devices()[:2])):
        theirs = program(jax, jjnp)
    return ours, theirs


def _loss(np_, w, x):
    return np_.sum((x @ w) ** 2)


def _run_grads(api, np_):
    """The gradients of JAX's 301 page: a reduced parameter, the same reshard-to-reduced inside the
    loss, and a fan-out of one reduced value into two matmuls."""
    x = api.device_put(np_.arange(8 * 4.0).reshape(8, 4), api.P("X", None))
    w = api.device_put(np_.arange(4 * 2.0).reshape(4, 2) / 10.0, api.P(None, None))
    wr = api.device_put(w, api.P(None, None, reduced={"X"}))
    g_reduced = api.grad(lambda w, x: _loss(np_, w, x))(wr, x)

    def loss_fanout(w, x1, x2):
        w = api.reshard(w, api.P(None, None, reduced={"X"}))
        return np_.sum(x1 @ w) + np_.sum(x2 @ w)

    g_fanout = api.grad(loss_fanout)(w, x, x * 2)
    return [(str(api.typeof(g)), np.asarray(api.reshard(g, api.P()))) for g in (g_reduced, g_fanout)]


def test_cotangent_of_a_reduced_value_is_unreduced_as_jax():
    ours, theirs = _both(_run_grads)
    assert [t for t, _ in ours] == [t for t, _ in theirs] == ["float32[4,2]{U:X}", "float32[4,2]"]
    for (_, a), (_, b) in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def _microbatched_step(api, np_):
    """JAX's 301 example: per-microbatch gradients of reduced weights stay unreduced through a
    scan, and one AllReduce at the end."""
    def predict(ws, xs):
        return api.lax.scan(lambda h, w: (np_.tanh(h @ w), None), xs, ws)[0]

    def loss3(ws, batch):
        return np_.sum(predict(ws, batch) ** 2)

    def step(ws, xs):
        def microbatch_step(acc, xs_mb):
            grads = api.grad(loss3)(ws, xs_mb)
            assert api.typeof(grads).sharding.spec.unreduced == {"X"}
            return acc + grads, None

        acc = api.reshard(np_.zeros_like(ws), api.P(unreduced={"X"}))
        acc, _ = api.lax.scan(microbatch_step, acc, xs)
        return api.reshard(ws, api.P()) - 0.01 * api.reshard(acc, api.P())

    ws = api.device_put(np_.stack([np_.eye(4) / 2] * 3), api.P(reduced={"X"}))
    xs = api.device_put(np_.arange(40.0).reshape((5, 2, 4)) / 40, api.P(None, "X", None))
    out = api.jit(step)(ws, xs)
    return str(api.typeof(out)), np.asarray(out)


def test_microbatched_unreduced_gradients_through_scan_as_jax():
    ours, theirs = _both(_microbatched_step)
    assert ours[0] == theirs[0]
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-5, atol=1e-7)


def _reduced_types(api, np_):
    ws = api.device_put(np_.stack([np_.eye(4) / 2] * 3), api.P(reduced={"X"}))
    seen = []
    api.lax.scan(lambda c, w: (seen.append(str(api.typeof(w))), (c, None))[1], 0.0, ws)
    return [str(api.typeof(v)) for v in (ws * 2, np_.tanh(ws), ws + ws, ws * np_.ones(()))] + seen[:1]


def test_elementwise_ops_and_scan_slices_keep_reduced_types_as_jax():
    ours, theirs = _both(_reduced_types)
    assert ours == theirs
    assert ours[0] == "float32[3,4,4]{R:X}" and ours[-1] == "float32[4,4]{R:X}"


def _mixing_errors(api, np_):
    """What multiplying a reduced array by other arrays gives: a type or the error's words."""
    out = []
    ws = api.device_put(np.ones((4, 4), np.float32), api.P(reduced={"X"}))
    for other in [api.device_put(np.ones((4, 4), np.float32), api.P()),
                  api.device_put(np.ones((4, 4), np.float32), api.P("X")),
                  np.ones((4, 4), np.float32), np_.ones(()), 2.0]:
        try:
            out.append(str(api.typeof(ws * other)))
        except Exception as e:  # noqa: BLE001 (the comparison is on the class name and the words)
            msg = str(e).split("] ", 1)[-1] if str(e).startswith("[") else str(e)  # shardlab names the op first
            out.append((type(e).__name__, " ".join(msg.split()[:7])))
    return out


def test_reduced_meets_replicated_or_sharded_raises_as_jax():
    ours, theirs = _both(_mixing_errors)
    assert ours == theirs
    assert ours[0] == ("ShardingTypeError", "Inputs cannot be replicated on the same")
    assert ours[3:] == ["float32[4,4]{R:X}"] * 2


def test_unreduced_sum_under_jit_lowering_runs_and_keeps_the_one_allreduce():
    """Adding unreduced partial sums in a traced (shape-only) program: no communication until
    the reshard, whose AllReduce is in the compiled text."""
    with sl.set_mesh(sl.make_mesh((2,), ("X",))):
        ws = sl.device_put(np.ones((4, 4), np.float32), sl.P(reduced={"X"}))
        xs = sl.device_put(np.ones((3, 2, 4), np.float32), sl.P(None, "X", None))

        def step(ws, xs):
            acc = sl.reshard(jnp.zeros_like(ws), sl.P(unreduced={"X"}))
            for i in range(xs.shape[0]):
                acc = acc + sl.grad(lambda w: jnp.sum(jnp.tanh(xs[i] @ w)))(ws)
            return sl.reshard(acc, sl.P())

        text = sl.jit(step).lower(ws, xs).compile().as_text()
        out = sl.jit(step)(ws, xs)
    assert str(sl.typeof(out)) == "float32[4,4]"
    assert text.count("all-reduce(") >= 1


@pytest.mark.parametrize("src", ["X,Y", "(X,Y)", "X", ""])
def test_device_put_to_unreduced_keeps_each_devices_part_as_jax(src):
    """JAX's parallel notebook: device_put of a global array to P('X', None, unreduced={'Y'})."""
    spec = {"X,Y": ("X", "Y"), "(X,Y)": (("X", "Y"),), "X": ("X",), "": ()}[src]
    x = np.arange(8 * 4.0, dtype=np.float32).reshape(8, 4)
    mesh = sl.make_mesh((4, 2), ("X", "Y"))
    ours = sl.device_put(sl.device_put(x, sl.NamedSharding(mesh, sl.P(*spec))),
                         sl.NamedSharding(mesh, sl.P("X", None, unreduced={"Y"})))
    jmesh = jax.make_mesh((4, 2), ("X", "Y"), devices=jax.devices()[:8])
    theirs = jax.device_put(jax.device_put(x, jax.NamedSharding(jmesh, jax.P(*spec))),
                            jax.NamedSharding(jmesh, jax.P("X", None, unreduced={"Y"})))
    for a, b in zip(_shards(ours), _shards(theirs)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(np.asarray(sl.reshard(ours, sl.NamedSharding(mesh, sl.P()))), x)


def _partial_matmul_grads(api, np_):
    """JAX 301's matmul_partial: a shard_map returning partial sums (out_specs unreduced), reduced
    by a reshard; the gradients flow back through both (an unreduced value's cotangent is reduced)."""
    a = api.device_put(np_.arange(4.0).reshape(2, 2), api.P(None, "X"))
    b = api.device_put(np_.arange(4.0).reshape(2, 2) + 1, api.P("X", None))
    mm = api.shard_map(lambda a, b: api.lax.pcast(a @ b, "X", to="unreduced"),
                       in_specs=(api.P(None, "X"), api.P("X", None)), out_specs=api.P(None, None, unreduced={"X"}))
    grads = api.grad(lambda a, b: np_.sum(api.reshard(mm(a, b), api.P(None, None))), argnums=(0, 1))(a, b)
    return [(str(api.typeof(g)), np.asarray(g).tolist()) for g in grads]


def test_gradient_through_a_shard_map_that_returns_partial_sums_as_jax():
    ours, theirs = _both(_partial_matmul_grads)
    assert ours == theirs
