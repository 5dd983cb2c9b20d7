"""shard_map: local shapes, pytrees, the decorator and legacy forms, check_vma, and the
LocalArray numpy protocol / shardlab.numpy inside the body (compared with plain numpy on
each device's block)."""

import collections

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as ref
import shardlab as sl
import shardlab.numpy as jnp
from shardlab import P
from shardlab.experimental.shard_map import shard_map as legacy_shard_map

MESH = sl.make_mesh((4, 2), ("x", "y"))


def blocks(x, rows=4, cols=2):
    """Per-device blocks of x under P('x', 'y') on MESH, as a (4, 2, ...) nested list."""
    r, c = x.shape[0] // rows, x.shape[1] // cols
    return [[x[i * r:(i + 1) * r, j * c:(j + 1) * c] for j in range(cols)] for i in range(rows)]


def per_device(fn, x, out_spec=P("x", "y")):
    """Runs fn under shard_map on MESH with x split P('x', 'y'); also returns what numpy gives
    when fn runs on each device's block and the blocks are reassembled per out_spec."""
    got = np.asarray(sl.shard_map(fn, mesh=MESH, in_specs=P("x", "y"), out_specs=out_spec)(x))
    want = np.block([[np.asarray(fn(b)) for b in row] for row in blocks(x)])
    return got, want


def test_local_shapes_hand_derived():
    seen = {}

    def f(a, b, c):
        seen["shapes"] = (a.shape, b.shape, c.shape)
        return a

    sl.shard_map(f, mesh=MESH, in_specs=(P("x", "y"), P(None, ("x", "y")), P()), out_specs=P("x", "y"))(
        np.zeros((8, 6)), np.zeros((3, 16)), np.zeros(5))
    assert seen["shapes"] == ((2, 3), (3, 2), (5,))


@pytest.mark.parametrize("name, fn", [
    ("exp", lambda a: np.exp(a)),
    ("tanh+mul", lambda a: np.tanh(a) * 2 - a),
    ("maximum", lambda a: np.maximum(a, 0.25)),
    ("where", lambda a: jnp.where(a > 0, a, -a)),
    ("sqrt abs", lambda a: jnp.sqrt(jnp.abs(a))),
    ("transpose twice", lambda a: a.T.T),
    ("reshape back", lambda a: a.reshape(-1).reshape(a.shape)),
    ("swapaxes back", lambda a: jnp.swapaxes(jnp.swapaxes(a, 0, 1), 0, 1)),
    ("sum keepdims", lambda a: a.sum(axis=1, keepdims=True) + a),
    ("mean axis0", lambda a: np.mean(a, axis=0, keepdims=True) * np.ones_like(a)),
    ("max min", lambda a: a.max(axis=-1, keepdims=True) - jnp.min(a, axis=-1, keepdims=True) + a),
    ("concat split", lambda a: jnp.concatenate(jnp.split(a, 2, axis=1)[::-1], axis=1)),
    ("einsum", lambda a: jnp.einsum("ij,kj->ik", a, a)[:, : a.shape[1]]),
    ("matmul", lambda a: a @ np.ones((a.shape[1], a.shape[1]), np.float32)),
    ("clip", lambda a: jnp.clip(a, -0.5, 0.5)),
    ("square log1p", lambda a: jnp.log1p(jnp.square(a))),
    ("ufunc reduce", lambda a: np.add.reduce(a, axis=0, keepdims=True) + a),
    ("stack sum", lambda a: jnp.stack([a, 2 * a]).sum(axis=0)),
])
def test_local_numpy_matches_numpy_per_block(name, fn):
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    got, want = per_device(fn, x)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_inplace_operator_rebinds():
    def f(a):
        b = a
        b += 1  # JAX arrays are immutable: this rebinds b and leaves a alone
        return a * 10 + b

    x = np.arange(8.0).reshape(4, 2)
    out = sl.shard_map(f, mesh=MESH, in_specs=P("x", "y"), out_specs=P("x", "y"))(x)
    np.testing.assert_array_equal(np.asarray(out), 11 * x + 1)


def test_matmul_with_per_device_weights_and_bf16():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    w = rng.standard_normal((16, 6)).astype(np.float32)

    def f(a, b):
        return a @ b, jnp.matmul(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)), jnp.dot(a, b)

    out = sl.shard_map(f, mesh=MESH, in_specs=(P("x", "y"), P("y")), out_specs=(P("x", "y"),) * 3)(x, w)
    want = np.block([[x[2 * i:2 * i + 2, 8 * j:8 * j + 8] @ w[8 * j:8 * j + 8] for j in range(2)]
                     for i in range(4)])
    np.testing.assert_allclose(np.asarray(out[0]), want, rtol=1e-5, atol=1e-5)
    assert out[1].dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(np.asarray(out[1]).astype(np.float32), want, rtol=3e-2, atol=1e-1)
    np.testing.assert_allclose(np.asarray(out[2]), want, rtol=1e-5, atol=1e-5)


def test_invariant_work_is_done_once():
    seen = {}

    def f(a, w):
        h = np.exp(w) * 2  # w is replicated: computed once, not once per device
        seen["h"] = h.storage.shape
        seen["mixed"] = (a + h).storage.shape
        return a + h

    sl.shard_map(f, mesh=MESH, in_specs=(P("x"), P()), out_specs=P("x"))(np.zeros((8, 3)), np.zeros(3))
    assert seen["h"] == (1, 1, 3)
    assert seen["mixed"] == (4, 1, 2, 3)


Pair = collections.namedtuple("Pair", "a b")


def test_pytrees_in_and_out():
    x = np.arange(16.0).reshape(8, 2)

    def f(tree, pair):
        s = tree["u"] + tree["v"][0]
        return {"sum": s, "list": [pair.a, None]}, Pair(pair.b * 2, sl.lax.psum(pair.a, "x"))

    out = sl.shard_map(f, mesh=MESH, in_specs=({"u": P("x"), "v": (P("x"),)}, Pair(P("x"), P())),
                       out_specs=({"sum": P("x"), "list": [P("x"), None]}, Pair(P(), P())))(
        {"u": x, "v": (x,)}, Pair(x, np.ones(3)))
    first, second = out
    assert isinstance(second, Pair) and first["list"][1] is None
    np.testing.assert_array_equal(np.asarray(first["sum"]), 2 * x)
    np.testing.assert_array_equal(np.asarray(first["list"][0]), x)
    np.testing.assert_array_equal(np.asarray(second.a), 2 * np.ones(3))
    np.testing.assert_array_equal(np.asarray(second.b), x.reshape(4, 2, 2).sum(0))


def test_spec_prefix_applies_to_a_whole_subtree():
    x = np.arange(8.0)
    out = sl.shard_map(lambda t: [v * 2 for v in t], mesh=MESH, in_specs=P("x"), out_specs=P("x"))([x, x + 1])
    np.testing.assert_array_equal(np.asarray(out[1]), 2 * (x + 1))


def test_decorator_and_legacy_forms():
    @sl.shard_map(mesh=MESH, in_specs=(P("x", "y"), P("y", None)), out_specs=P("x", None))
    def matmul(a, b):
        return sl.lax.psum(a @ b, "y")

    a = np.arange(32, dtype=np.float32).reshape(8, 4)
    b = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_allclose(np.asarray(matmul(a, b)), a @ b)
    assert matmul.__name__ == "matmul"
    legacy = legacy_shard_map(lambda u, v: sl.lax.psum(u @ v, "y"), MESH, (P("x", "y"), P("y", None)),
                              P("x", None), check_rep=True)
    np.testing.assert_allclose(np.asarray(legacy(a, b)), a @ b)
    # auto= (older JAX) leaves those axes out of axis_names: here 'y' is manual, 'x' stays global.
    part = legacy_shard_map(lambda u: u * 2, MESH, P(None, "y"), P(None, "y"), auto=frozenset({"x"}))
    np.testing.assert_array_equal(np.asarray(part(a)), a * 2)


def test_sharded_array_inputs_and_outputs():
    x = np.arange(64.0).reshape(8, 8)
    a = sl.device_put(x, sl.NamedSharding(MESH, P("x", "y")))
    f = sl.shard_map(lambda v: v + 1, mesh=MESH, in_specs=P("x", "y"), out_specs=P("x", "y"))
    out = f(a)
    assert isinstance(out, sl.ShardedArray)
    assert out.sharding == sl.NamedSharding(MESH, P("x", "y"))
    np.testing.assert_array_equal(np.asarray(out), x + 1)
    # A different layout is resharded on the way in.
    g = sl.shard_map(lambda v: v * 1, mesh=MESH, in_specs=P(None, "x"), out_specs=P(None, "x"))
    np.testing.assert_array_equal(np.asarray(g(a)), x)
    # A replicated output is held once however many devices share it.
    r = sl.shard_map(lambda v: sl.lax.psum(v, ("x", "y")), mesh=MESH, in_specs=P("x", "y"), out_specs=P())(a)
    assert r.host_nbytes == r.nbytes_per_device and r.emulated_nbytes == 8 * r.nbytes_per_device


def test_out_specs_replicated_when_invariant():
    # all_gather makes a value that is the same on every device: P() is accepted (JAX's type
    # system would not know this, shardlab does).
    out = sl.shard_map(lambda v: sl.lax.all_gather(v, "x", tiled=True), mesh=MESH, in_specs=P("x"),
                       out_specs=P())(np.arange(8.0))
    np.testing.assert_array_equal(np.asarray(out), np.arange(8.0))
    # check_vma=False with a varying output keeps device 0's value along the omitted axis.
    out = sl.shard_map(lambda v: v + sl.lax.axis_index("y") * 10, mesh=MESH, in_specs=P("x"),
                       out_specs=P("x"), check_vma=False)(np.arange(8.0))
    np.testing.assert_array_equal(np.asarray(out), np.arange(8.0))


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.sampled_from([P("x"), P("y"), P(("x", "y")), P(("y", "x")), P(None, "x"), P("y", "x"), P()]),
       st.sampled_from([P("x"), P(None, ("y", "x")), P("x", "y"), P("y", "x"), P(("x", "y"))]))
def test_identity_any_in_spec_to_any_out_spec(in_spec, out_spec):
    """shard_map(identity): every device's input block must land where out_spec puts that
    device's output (reference.shard_index), so the output is the local blocks re-tiled."""
    x = np.arange(64.0).reshape(8, 8)
    if not set(in_spec.mesh_axes()) <= set(out_spec.mesh_axes()):
        return  # the output would vary along an axis the out_spec omits (test_errors covers it)
    out = np.asarray(sl.shard_map(lambda v: v, mesh=MESH, in_specs=in_spec, out_specs=out_spec)(x))
    local = sl.NamedSharding(MESH, in_spec).shard_shape(x.shape)
    splits = [1, 1]
    for d in range(2):
        for a in out_spec.axes_of(d):
            splits[d] *= MESH.shape[a]
    assert out.shape == (local[0] * splits[0], local[1] * splits[1])
    for coord in np.ndindex(*MESH.axis_sizes):
        block = x[ref.shard_index(coord, MESH.axis_names, MESH.axis_sizes, tuple(in_spec), x.shape)]
        where = ref.shard_index(coord, MESH.axis_names, MESH.axis_sizes, tuple(out_spec), out.shape)
        np.testing.assert_array_equal(out[where], block)
    if in_spec == out_spec:
        np.testing.assert_array_equal(out, x)


def test_mesh_from_context():
    with sl.set_mesh(MESH):  # as JAX 0.10: set_mesh, not the deprecated `with mesh:`
        out = sl.shard_map(lambda v: sl.lax.psum(v, "x"), in_specs=P("x"), out_specs=P())(np.ones(4))
    np.testing.assert_array_equal(np.asarray(out), [4.0])


def test_shardlab_numpy_outside_shard_map_is_numpy():
    a = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(jnp.einsum("ij->ji", a), a.T)
    np.testing.assert_allclose(jnp.matmul(a, a.T), a @ a.T)
    np.testing.assert_array_equal(jnp.where(a > 2, a, 0), np.where(a > 2, a, 0))
    np.testing.assert_array_equal(jnp.concatenate([a, a]), np.concatenate([a, a]))
    assert jnp.float32 == np.float32 and jnp.bfloat16 == ml_dtypes.bfloat16


def test_outputs_of_a_call_are_freed_without_the_garbage_collector():
    # A reference cycle inside shard_map would keep every shard alive until gc runs, turning
    # each collective's output into a fresh (page-faulting) allocation.
    import gc
    import weakref

    mesh = sl.make_mesh((4,), ("x",))
    f = sl.shard_map(lambda a: sl.lax.all_gather(a, "x", tiled=True), mesh=mesh, in_specs=P("x"), out_specs=P())
    gc.disable()
    try:
        out = f(np.ones(64, np.float32))
        ref = weakref.ref(out)
        base = weakref.ref(out._storage.base if out._storage.base is not None else out._storage)
        del out
        assert ref() is None
        assert base() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, ml_dtypes.bfloat16, np.int32, np.int8])
def test_where_matches_numpy_on_large_and_small_values(dtype):
    # Large values take the branchless C++ select, small ones numpy's where: both must agree,
    # with a varying and an invariant (broadcast) operand and NaN / inf kept.
    mesh = sl.make_mesh((4,), ("x",))
    rng = np.random.default_rng(3)
    for rows in (8, 4096):
        h = rng.standard_normal((rows, 16)).astype(np.float32)
        d = (rng.standard_normal((rows, 16)) * 10).astype(dtype)
        if np.dtype(dtype).kind == "f":
            d[0, :3] = [np.nan, np.inf, -np.inf]
        e = d[: rows // 4]  # replicated: every device holds the same block
        f = sl.shard_map(lambda h, d, e: (jnp.where(h > 0, d, 0), jnp.where(h > 0, e, d)), mesh=mesh,
                         in_specs=(P("x"), P("x"), P()), out_specs=(P("x"), P("x")))
        a, b = f(h, d, e)
        out = sl.dtypes.canonicalize_dtype(dtype)  # float64 computes as float32 with x64 off, as in JAX
        np.testing.assert_array_equal(np.asarray(a), np.where(h > 0, d, 0).astype(out))
        np.testing.assert_array_equal(np.asarray(b), np.where(h > 0, np.tile(e, (4, 1)), d).astype(out))
