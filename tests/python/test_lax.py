"""Every shardlab.lax collective against the definition-level numpy references in
reference.py, on random meshes (1-D to 4-D, axis sizes 1..8, at most 64 devices), random
local shapes, dtypes and tuple axes in random order; plus the ledger's byte counts against
the ring-algorithm closed forms and nccl-tests' bus-bandwidth factors."""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference as ref
import shardlab as sl
from shardlab import P

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), np.dtype(np.float64), BF16, np.dtype(np.int32)]
NAMES = ("x", "y", "z", "w")

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# -- strategies ----------------------------------------------------------------------------
@st.composite
def meshes(draw, max_devices=64):
    ndim = draw(st.integers(1, 4))
    sizes = []
    for _ in range(ndim):
        cap = max_devices // math.prod(sizes)
        sizes.append(draw(st.integers(1, min(8, cap))))
    names = tuple(draw(st.permutations(NAMES))[:ndim])
    return sl.make_mesh(tuple(sizes), names)


def axis_tuple(draw, mesh, min_size=1):
    """Distinct mesh axes in random order (the major-to-minor order of a tuple axis name)."""
    k = draw(st.integers(min_size, mesh.ndim))
    return tuple(draw(st.permutations(mesh.axis_names))[:k])


def as_axis_name(draw, axes):
    """A single axis is passed either bare or as a 1-tuple; JAX accepts both."""
    if len(axes) == 1 and draw(st.booleans()):
        return axes[0]
    return axes


def group_size(mesh, axes):
    return math.prod(mesh.shape[a] for a in axes)


@st.composite
def cases(draw):
    """(mesh, dtype, vary axes, seed): the input varies along `vary` (a random subset, in
    random order) and is invariant along the other axes."""
    mesh = draw(meshes())
    dtype = draw(st.sampled_from(DTYPES))
    vary = axis_tuple(draw, mesh, min_size=0)
    seed = draw(st.integers(0, 2**32 - 1))
    return mesh, dtype, vary, seed


def local_shape(draw, rank_min=0, rank_max=3):
    r = draw(st.integers(rank_min, rank_max))
    return [draw(st.integers(1, 4)) for _ in range(r)]


# -- running a collective ------------------------------------------------------------------
def make_input(mesh, vary, shape, dtype, seed):
    """(global array for shard_map, per-device values): small integers so that sums are exact
    in every dtype (|sum| <= 4 * 64 = 256 fits bfloat16's 8-bit significand)."""
    rng = np.random.default_rng(seed)
    n = group_size(mesh, vary)
    base = rng.integers(-4, 5, size=(n, *shape)).astype(dtype)
    vals = np.empty(mesh.axis_sizes + tuple(shape), dtype)
    names = mesh.axis_names
    for c in np.ndindex(*mesh.axis_sizes):
        vals[c] = base[ref.group(c, names, mesh.axis_sizes, vary)[0]] if vary else base[0]
    return base, vals


def run(mesh, base, vary, body):
    """Runs body(local value) under shard_map; returns (every device's result stacked in mesh
    order, taken inside the body, the LocalArray result, the same read back from the output)."""
    seen = {}

    def f(x):
        out = body(x[0])
        seen["local"] = out
        seen["values"] = sl.debug.device_values(out)
        return out[None]

    g = sl.shard_map(f, mesh=mesh, in_specs=P(tuple(vary) if vary else None),
                     out_specs=P(tuple(mesh.axis_names)))
    # float64 exists only with x64 on, as in JAX (with it off, values enter as float32)
    with sl.dtypes.x64_scope(base.dtype == np.float64):
        out = np.asarray(g(base))
    return seen["values"], seen["local"], out.reshape(mesh.axis_sizes + out.shape[1:])


def assert_same(got, want, exact=True):
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    g, w = got.astype(np.float64), want.astype(np.float64)
    if exact:
        np.testing.assert_array_equal(g, w)
    else:
        rtol = {np.dtype(np.float64): 1e-12, BF16: 2 ** -7}.get(want.dtype, 1e-6)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)


def check(mesh, base, vary, vals, body, want, exact=True):
    values, local, out = run(mesh, base, vary, body)
    assert_same(values, want, exact)
    assert_same(out, want, exact)
    return local


# -- all-reduce ----------------------------------------------------------------------------
@SETTINGS
@given(cases(), st.data(), st.sampled_from(["psum", "pmean", "pmax", "pmin"]))
def test_all_reduce(case, data, op):
    mesh, dtype, vary, seed = case
    axes = axis_tuple(data.draw, mesh)
    name = as_axis_name(data.draw, axes)
    base, vals = make_input(mesh, vary, local_shape(data.draw), dtype, seed)
    want = ref.all_reduce(vals, mesh.axis_names, axes, op[1:])
    local = check(mesh, base, vary, vals, lambda x: getattr(sl.lax, op)(x, name), want, exact=op != "pmean")
    # The result is the same on every device of a group: no storage along the reduced axes.
    assert set(local.varying_axes) <= set(vary) - set(axes)


@SETTINGS
@given(cases(), st.data())
def test_psum_of_invariant_multiplies_by_group_size(case, data):
    mesh, dtype, _, seed = case
    axes = axis_tuple(data.draw, mesh)
    vary = tuple(a for a in mesh.axis_names if a not in axes and data.draw(st.booleans()))
    base, vals = make_input(mesh, vary, local_shape(data.draw), dtype, seed)
    n = group_size(mesh, axes)
    want = (vals.astype(np.float64) * n).astype(dtype)
    check(mesh, base, vary, vals, lambda x: sl.lax.psum(x, axes), want)
    np.testing.assert_array_equal(ref.psum(vals, mesh.axis_names, axes), want)  # the reference agrees


@SETTINGS
@given(meshes(), st.data())
def test_psum_of_python_constant_is_axis_size(mesh, data):
    axes = axis_tuple(data.draw, mesh)
    n = group_size(mesh, axes)
    got = {}

    def f(x):
        got["one"] = sl.lax.psum(1, axes)
        got["size"] = sl.lax.axis_size(axes)
        got["two"] = sl.lax.psum(2.5, axes)
        return x

    sl.shard_map(f, mesh=mesh, in_specs=P(), out_specs=P())(np.zeros(3, np.float32))
    assert int(np.asarray(got["one"])) == n
    assert got["size"] == n
    assert float(np.asarray(got["two"])) == 2.5 * n


def test_psum_one_hand_derived():
    mesh = sl.make_mesh((2, 3), ("a", "b"))
    got = {}

    def f(x):
        got["a"], got["b"], got["ab"] = (sl.lax.psum(1, "a"), sl.lax.psum(1, "b"),
                                         sl.lax.psum(1, ("b", "a")))
        return sl.lax.psum(x, "b")

    out = sl.shard_map(f, mesh=mesh, in_specs=P("a", "b"), out_specs=P("a", None))(
        np.arange(6.0).reshape(2, 3))
    assert (int(got["a"]), int(got["b"]), int(got["ab"])) == (2, 3, 6)
    np.testing.assert_array_equal(np.asarray(out), [[3.0], [12.0]])


# -- gathers and scatters ------------------------------------------------------------------
@SETTINGS
@given(cases(), st.data(), st.booleans())
def test_all_gather(case, data, tiled):
    mesh, dtype, vary, seed = case
    axes = axis_tuple(data.draw, mesh)
    name = as_axis_name(data.draw, axes)
    shape = local_shape(data.draw, rank_min=1 if tiled else 0)
    r = len(shape) if tiled else len(shape) + 1
    axis = data.draw(st.integers(-r, r - 1))
    base, vals = make_input(mesh, vary, shape, dtype, seed)
    want = ref.all_gather(vals, mesh.axis_names, axes, axis, tiled)
    local = check(mesh, base, vary, vals,
                  lambda x: sl.lax.all_gather(x, name, axis=axis, tiled=tiled), want)
    assert set(local.varying_axes) <= set(vary) - set(axes)


@SETTINGS
@given(cases(), st.data(), st.booleans())
def test_psum_scatter(case, data, tiled):
    mesh, dtype, vary, seed = case
    axes = axis_tuple(data.draw, mesh)
    name = as_axis_name(data.draw, axes)
    n = group_size(mesh, axes)
    shape = local_shape(data.draw, rank_min=1)
    dim = data.draw(st.integers(0, len(shape) - 1))
    shape[dim] = n * data.draw(st.integers(1, 3)) if tiled else n
    base, vals = make_input(mesh, vary, shape, dtype, seed)
    want = ref.psum_scatter(vals, mesh.axis_names, axes, dim, tiled)
    check(mesh, base, vary, vals,
          lambda x: sl.lax.psum_scatter(x, name, scatter_dimension=dim, tiled=tiled), want)


@SETTINGS
@given(cases(), st.data(), st.booleans())
def test_all_to_all(case, data, tiled):
    mesh, dtype, vary, seed = case
    axes = axis_tuple(data.draw, mesh)
    name = as_axis_name(data.draw, axes)
    n = group_size(mesh, axes)
    shape = local_shape(data.draw, rank_min=1)
    r = len(shape)
    split = data.draw(st.integers(0, r - 1))
    concat = data.draw(st.integers(-r, r - 1))
    shape[split] = n * data.draw(st.integers(1, 3)) if tiled else n
    base, vals = make_input(mesh, vary, shape, dtype, seed)
    want = ref.all_to_all(vals, mesh.axis_names, axes, split, concat, tiled)
    check(mesh, base, vary, vals, lambda x: sl.lax.all_to_all(x, name, split, concat, tiled=tiled), want)


@st.composite
def perms(draw, n):
    """A partial permutation: distinct sources sent to distinct destinations."""
    k = draw(st.integers(0, n))
    src = draw(st.permutations(range(n)))[:k]
    dst = draw(st.permutations(range(n)))[:k]
    return list(zip(src, dst))


@SETTINGS
@given(cases(), st.data())
def test_ppermute(case, data):
    mesh, dtype, vary, seed = case
    axes = axis_tuple(data.draw, mesh)
    name = as_axis_name(data.draw, axes)
    n = group_size(mesh, axes)
    perm = data.draw(st.one_of(perms(n), st.integers(0, n).map(
        lambda s: [(i, (i + s) % n) for i in range(n)])))
    base, vals = make_input(mesh, vary, local_shape(data.draw), dtype, seed)
    want = ref.ppermute(vals, mesh.axis_names, axes, perm)
    check(mesh, base, vary, vals, lambda x: sl.lax.ppermute(x, name, perm), want)


def test_ppermute_ring_shift_hand_derived():
    mesh = sl.make_mesh((4,), ("x",))
    f = sl.shard_map(lambda x: sl.lax.ppermute(x, "x", [(0, 1), (1, 2), (2, 3)]), mesh=mesh,
                     in_specs=P("x"), out_specs=P("x"))
    np.testing.assert_array_equal(np.asarray(f(np.array([1.0, 2.0, 3.0, 4.0]))), [0.0, 1.0, 2.0, 3.0])


@SETTINGS
@given(meshes(), st.data())
def test_axis_index(mesh, data):
    axes = axis_tuple(data.draw, mesh)
    name = as_axis_name(data.draw, axes)
    got = {}

    def f(x):
        idx = sl.lax.axis_index(name)
        got["values"] = sl.debug.device_values(idx)
        # axis_index arithmetic works like any per-device int32 value.
        return (x + idx * 10 + 1)[None]

    out = sl.shard_map(f, mesh=mesh, in_specs=P(), out_specs=P(mesh.axis_names))(np.zeros((), np.int32))
    want = ref.axis_index(mesh.axis_names, mesh.axis_sizes, axes)
    assert got["values"].dtype == np.int32
    np.testing.assert_array_equal(got["values"], want)
    np.testing.assert_array_equal(np.asarray(out).reshape(mesh.axis_sizes), want * 10 + 1)


def test_axis_index_hand_derived():
    mesh = sl.make_mesh((2, 3), ("a", "b"))
    got = {}

    def f(x):
        got["a"], got["b"] = sl.debug.device_values(sl.lax.axis_index("a")), sl.debug.device_values(
            sl.lax.axis_index("b"))
        got["ba"] = sl.debug.device_values(sl.lax.axis_index(("b", "a")))
        return x

    sl.shard_map(f, mesh=mesh, in_specs=P(), out_specs=P())(np.zeros(1))
    np.testing.assert_array_equal(got["a"], [[0, 0, 0], [1, 1, 1]])
    np.testing.assert_array_equal(got["b"], [[0, 1, 2], [0, 1, 2]])
    np.testing.assert_array_equal(got["ba"], [[0, 2, 4], [1, 3, 5]])


# -- MPI-style rooted collectives ----------------------------------------------------------
@SETTINGS
@given(cases(), st.data())
def test_broadcast(case, data):
    mesh, dtype, vary, seed = case
    axes = axis_tuple(data.draw, mesh)
    root = data.draw(st.integers(0, group_size(mesh, axes) - 1))
    base, vals = make_input(mesh, vary, local_shape(data.draw), dtype, seed)
    want = ref.broadcast(vals, mesh.axis_names, axes, root)
    check(mesh, base, vary, vals, lambda x: sl.lax.broadcast(x, axes, root), want)


@SETTINGS
@given(cases(), st.data(), st.sampled_from(["sum", "max", "min", "mean"]))
def test_reduce(case, data, op):
    mesh, dtype, vary, seed = case
    if op == "mean" and dtype.kind == "i":
        dtype = np.dtype(np.float32)
    axes = axis_tuple(data.draw, mesh)
    root = data.draw(st.integers(0, group_size(mesh, axes) - 1))
    base, vals = make_input(mesh, vary, local_shape(data.draw), dtype, seed)
    want = ref.reduce(vals, mesh.axis_names, axes, root, op)
    check(mesh, base, vary, vals, lambda x: sl.lax.reduce(x, axes, root, op), want, exact=op != "mean")


@SETTINGS
@given(cases(), st.data(), st.booleans())
def test_gather(case, data, tiled):
    mesh, dtype, vary, seed = case
    axes = axis_tuple(data.draw, mesh)
    root = data.draw(st.integers(0, group_size(mesh, axes) - 1))
    shape = local_shape(data.draw, rank_min=1 if tiled else 0)
    r = len(shape) if tiled else len(shape) + 1
    axis = data.draw(st.integers(0, r - 1))
    base, vals = make_input(mesh, vary, shape, dtype, seed)
    want = ref.gather(vals, mesh.axis_names, axes, root, axis, tiled)
    check(mesh, base, vary, vals, lambda x: sl.lax.gather(x, axes, root, axis=axis, tiled=tiled), want)


@SETTINGS
@given(cases(), st.data(), st.booleans())
def test_scatter(case, data, tiled):
    mesh, dtype, vary, seed = case
    axes = axis_tuple(data.draw, mesh)
    n = group_size(mesh, axes)
    root = data.draw(st.integers(0, n - 1))
    shape = local_shape(data.draw, rank_min=1)
    dim = data.draw(st.integers(0, len(shape) - 1))
    shape[dim] = n * data.draw(st.integers(1, 3)) if tiled else n
    base, vals = make_input(mesh, vary, shape, dtype, seed)
    want = ref.scatter(vals, mesh.axis_names, axes, root, dim, tiled)
    check(mesh, base, vary, vals,
          lambda x: sl.lax.scatter(x, axes, root, scatter_dimension=dim, tiled=tiled), want)


def test_pytree_and_pvary():
    mesh = sl.make_mesh((2, 2), ("x", "y"))
    a = np.arange(8.0).reshape(4, 2)

    def f(x):
        tree = sl.lax.psum({"u": x, "v": (x * 2, [x + 1])}, "x")
        assert isinstance(tree, dict) and isinstance(tree["v"], tuple) and isinstance(tree["v"][1], list)
        varied = sl.lax.pvary(sl.lax.psum(x, ("x", "y")), "x")
        assert "x" in varied.varying_axes
        return tree["u"], tree["v"][0], tree["v"][1][0], varied

    u, v, w, varied = sl.shard_map(f, mesh=mesh, in_specs=P("x", "y"), out_specs=(P(None, "y"),) * 3 + (P("x"),))(a)
    s = a.reshape(2, 2, 2).sum(0)
    np.testing.assert_array_equal(np.asarray(u), s)
    np.testing.assert_array_equal(np.asarray(v), 2 * s)
    np.testing.assert_array_equal(np.asarray(w), s + 2)
    np.testing.assert_array_equal(np.asarray(varied), np.tile(a.reshape(2, 2, 2).sum((0, 2))[:, None], (2, 1)))


# -- the ledger ----------------------------------------------------------------------------
def _ledger_case(op, mesh, axes, shape, dtype):
    """Runs one collective; returns (the single ledger event, V in bytes per device as
    ledger.hpp defines it, local bytes in, local bytes out)."""
    n = group_size(mesh, axes)
    item = np.dtype(dtype).itemsize
    x = np.ones((mesh.size, *shape), dtype)
    calls = {
        "psum": lambda v: sl.lax.psum(v, axes), "pmean": lambda v: sl.lax.pmean(v, axes),
        "pmax": lambda v: sl.lax.pmax(v, axes), "pmin": lambda v: sl.lax.pmin(v, axes),
        "all_gather": lambda v: sl.lax.all_gather(v, axes, axis=0, tiled=True),
        "psum_scatter": lambda v: sl.lax.psum_scatter(v, axes, scatter_dimension=0, tiled=True),
        "all_to_all": lambda v: sl.lax.all_to_all(v, axes, 0, 0, tiled=True),
        "ppermute": lambda v: sl.lax.ppermute(v, axes, [(i, (i + 1) % n) for i in range(n)]),
    }
    with sl.Ledger() as ledger:
        sl.shard_map(lambda v: calls[op](v[0])[None], mesh=mesh, in_specs=P(mesh.axis_names),
                     out_specs=P(mesh.axis_names))(x)
    (event,) = ledger.events
    local = math.prod(shape) * item
    full = local * n if op == "all_gather" else local  # V: the gathered array for all_gather
    out = {"all_gather": local * n, "psum_scatter": local // n}.get(op, local)
    return event, full, local, out


CLOSED_FORM = {  # bytes each device sends on a ring of n, as a multiple of V
    "all_gather": lambda n: (n - 1) / n, "psum_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n, "ppermute": lambda n: 1.0 if n > 1 else 0.0,
    "psum": lambda n: 2 * (n - 1) / n, "pmean": lambda n: 2 * (n - 1) / n,
    "pmax": lambda n: 2 * (n - 1) / n, "pmin": lambda n: 2 * (n - 1) / n,
}


@SETTINGS
@given(meshes(), st.data(), st.sampled_from(sorted(CLOSED_FORM)),
       st.sampled_from([np.float32, np.float64, ml_dtypes.bfloat16, np.int32]))
def test_ledger_bytes_closed_form(mesh, data, op, dtype):
    if op == "pmean" and np.dtype(dtype).kind == "i":
        dtype = np.float32  # pmean of int32 is float32: the event carries the float32 bytes
    axes = axis_tuple(data.draw, mesh)
    n = group_size(mesh, axes)
    shape = [n * data.draw(st.integers(1, 3))] + local_shape(data.draw, 0, 2)
    with sl.dtypes.x64_scope(np.dtype(dtype) == np.float64):   # float64 exists with x64 on, as in JAX
        event, full, local, out = _ledger_case(op, mesh, axes, shape, dtype)
    assert event["op"] == op
    assert event["axes"] == axes
    assert event["group_size"] == n
    assert event["num_groups"] == mesh.size // n
    assert event["dtype"] == str(np.dtype(dtype))
    assert event["bytes_in"] == local
    assert event["bytes_out"] == out
    assert event["bytes_sent"] == pytest.approx(CLOSED_FORM[op](n) * full)
    # nccl-tests: busbw = algbw * factor, where algbw = V / t and the ring moves factor * V.
    if n > 1:
        assert sl._core.bus_bandwidth_factor(op, n) == pytest.approx(event["bytes_sent"] / full)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 64])
def test_bus_bandwidth_factors_match_nccl_tests(n):
    # nccl-tests doc/PERFORMANCE.md: AllReduce 2(n-1)/n; ReduceScatter, AllGather, AllToAll
    # (n-1)/n; Broadcast, Reduce and SendRecv 1.
    f = sl._core.bus_bandwidth_factor
    for op in ("psum", "pmean", "pmax", "pmin"):
        assert f(op, n) == pytest.approx(2 * (n - 1) / n)
    for op in ("all_gather", "psum_scatter", "all_to_all"):
        assert f(op, n) == pytest.approx((n - 1) / n)
    for op in ("broadcast", "reduce", "ppermute"):
        assert f(op, n) == 1.0


def test_ledger_hand_derived_8_devices():
    mesh = sl.make_mesh((8,), ("x",))
    x = np.ones((8, 256), np.float32)  # 1 KiB per device

    def f(v):
        a = sl.lax.psum(v, "x")
        b = sl.lax.all_gather(v, "x", tiled=True)
        c = sl.lax.psum_scatter(b, "x", tiled=True)
        return a + c

    with sl.Ledger() as ledger:
        sl.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(x)
    sent = [e["bytes_sent"] for e in ledger.events]
    assert sent == [2 * 7 / 8 * 1024, 7 / 8 * 8192, 7 / 8 * 8192]
    assert ledger.total_bytes_sent == pytest.approx(sum(sent))
    assert set(ledger.by_op()) == {"psum", "all_gather", "psum_scatter"}
    assert ledger.by_axis()[("x",)]["count"] == 3
    assert "psum" in ledger.table()
    assert "<table" in ledger._repr_html_()


def test_ledger_rooted_and_partial_ppermute():
    mesh = sl.make_mesh((4, 2), ("x", "y"))
    x = np.ones((8, 8), np.float32)  # 32 bytes per device
    with sl.Ledger() as ledger:
        sl.shard_map(lambda v: (sl.lax.broadcast(v, "x", 1) + sl.lax.reduce(v, "x", 2)
                                + sl.lax.ppermute(v, "x", [])), mesh=mesh, in_specs=P(("x", "y")),
                     out_specs=P(("x", "y")))(x)
    by_op = {e["op"]: e for e in ledger.events}
    assert by_op["broadcast"]["bytes_sent"] == 32
    assert by_op["reduce"]["bytes_sent"] == 32
    assert by_op["ppermute"]["bytes_sent"] == 0  # nothing moves
    assert all(e["num_groups"] == 2 and e["group_size"] == 4 for e in ledger.events)
