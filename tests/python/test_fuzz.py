"""Fuzzing the public API with hypothesis (issue 14): bad inputs to every collective and cost
function must give a clear error (an exception naming the op in brackets, or JAX's NameError for
an unbound axis) and never a crash, a hang, a pybind11 signature dump or an AttributeError; random
shard_map programs must agree with JAX on 8 CPU devices.

The test command runs a bounded number of examples (each test a few seconds); ``make fuzz``
runs the long profile (HYPOTHESIS_PROFILE=fuzz, see conftest.py).
"""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardlab as sl
from shardlab import P, cost

LONG = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"
N = lambda short: None if LONG else short  # noqa: E731  (None: the profile's max_examples)

MESH = sl.make_mesh((2, 4), ("x", "y"))
CLEAR = (ValueError, TypeError, NameError, IndexError, NotImplementedError, MemoryError, OverflowError)


def assert_clear(fn):
    """Runs fn; an exception must be a clear one: [op]-prefixed (or JAX's unbound-axis text)."""
    try:
        fn()
    except CLEAR as e:
        msg = str(e)
        assert msg.startswith("[") or msg.startswith("unbound axis name") or "axis" in msg and "out of bounds" in msg, \
            f"{type(e).__name__}: {msg}"
        assert "incompatible function arguments" not in msg, msg
        assert "object has no attribute" not in msg, msg


junk = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                 st.text(max_size=3), st.tuples(st.integers(-3, 9), st.integers(-3, 9)),
                 st.lists(st.integers(-3, 9), max_size=3), st.sampled_from([0, 1, 2, 3, -1, 2**63, "x", "y", ("x", "y")]))

COLLECTIVES = {
    "psum": lambda a, v, w: sl.lax.psum(a, v),
    "pmean": lambda a, v, w: sl.lax.pmean(a, v),
    "all_gather": lambda a, v, w: sl.lax.all_gather(a, "x", axis=v, tiled=bool(w)),
    "psum_scatter": lambda a, v, w: sl.lax.psum_scatter(a, "y", scatter_dimension=v, tiled=bool(w)),
    "all_to_all": lambda a, v, w: sl.lax.all_to_all(a, "y", v, w, tiled=True),
    "ppermute": lambda a, v, w: sl.lax.ppermute(a, "y", [v, w]),
    "ppermute_pairs": lambda a, v, w: sl.lax.ppermute(a, "x", v),
    "broadcast": lambda a, v, w: sl.lax.broadcast(a, "y", root=v),
    "reduce": lambda a, v, w: sl.lax.reduce(a, ("x", "y"), root=v, op=w),
    "gather": lambda a, v, w: sl.lax.gather(a, "y", root=v, axis=w),
    "scatter": lambda a, v, w: sl.lax.scatter(a, "y", root=v, scatter_dimension=w),
    "dynamic_slice_in_dim": lambda a, v, w: sl.lax.dynamic_slice_in_dim(a, v, 1, axis=w),
    "dynamic_slice": lambda a, v, w: sl.lax.dynamic_slice(a, v, w),
    "axis_index": lambda a, v, w: sl.lax.axis_index(v) + a,
    "body_returns": lambda a, v, w: v,
}


@settings(max_examples=N(150))
@given(op=st.sampled_from(sorted(COLLECTIVES)), v=junk, w=junk)
def test_bad_collective_arguments_give_clear_errors(op, v, w):
    f = sl.shard_map(lambda a: COLLECTIVES[op](a, v, w), mesh=MESH, in_specs=P("x", "y"), out_specs=P(),
                     check_vma=False)
    assert_clear(lambda: f(np.arange(32, dtype=np.float32).reshape(4, 8)))


COST_CALLS = {
    "collective_time": lambda v, w: cost.collective_time(w, v, axes="X", mesh_shape={"X": 8}, hardware="tpu-v5e"),
    "collective_time_axis": lambda v, w: cost.collective_time("all_gather", 1e6, axes="X", mesh_shape={"X": v},
                                                              hardware=w),
    "matmul_time": lambda v, w: cost.matmul_time(v, 128, 128, hardware=w),
    "shard_bytes": lambda v, w: cost.shard_bytes(v, "float32", w),
    "event_seconds": lambda v, w: cost.event_seconds({"op": w, "bytes_in": v}, sl.make_mesh((4,), ("x",),
                                                                                           hardware="tpu-v5e")),
    "hbm_load_time": lambda v, w: cost.hbm_load_time(v, w),
    "ppermute_time": lambda v, w: cost.ppermute_time((8, 8), "float32", ("X",), axes="X", mesh_shape={"X": 4},
                                                     hardware="tpu-v5e", perm=v),
    "replace": lambda v, w: sl.hardware.get("tpu-v5e").replace(hbm_bandwidth=v),
    "devices_indices_map": lambda v, w: sl.NamedSharding(MESH, P("x")).devices_indices_map(v),
    "plan_einsum": lambda v, w: sl.plan_einsum("ij,jk->ik", (v, P()), ((4, 4), P()), mesh=MESH),
}


@settings(max_examples=N(150))
@given(fn=st.sampled_from(sorted(COST_CALLS)), v=junk, w=st.one_of(junk, st.sampled_from(
    ["all_gather", "psum", "ppermute", "tpu-v5e", "h100", None])))
def test_bad_cost_arguments_give_clear_errors(fn, v, w):
    assert_clear(lambda: COST_CALLS[fn](v, w))


# -- random shard_map programs against JAX -----------------------------------------------------
jax = pytest.importorskip("jax")


def _jax_mesh():
    if len(jax.devices()) < 8:
        pytest.skip("JAX needs 8 CPU devices (conftest sets XLA_FLAGS before jax starts)")
    return jax.make_mesh((2, 4), ("x", "y"))


SIZES = {"x": 2, "y": 4}


def _step(draw, shape):
    """One (name, args) step applicable to a local value of `shape` (rank 2)."""
    options = [("scale", None), ("tanh", None), ("psum", draw(st.sampled_from(["x", "y", ("x", "y")]))),
               ("pmax", draw(st.sampled_from(["x", "y"])))]
    for ax in ("x", "y"):
        for d in (0, 1):
            options.append(("all_gather", (ax, d)))
            if shape[d] % SIZES[ax] == 0:
                options.append(("psum_scatter", (ax, d)))
                options.append(("all_to_all", (ax, d, 1 - d)))
        options.append(("ppermute", (ax, draw(st.integers(1, SIZES[ax] - 1)))))
    return draw(st.sampled_from(options))


def _shape_after(step, shape):
    name, arg = step
    shape = list(shape)
    if name == "all_gather":
        shape[arg[1]] *= SIZES[arg[0]]
    elif name == "psum_scatter":
        shape[arg[1]] //= SIZES[arg[0]]
    elif name == "all_to_all":
        ax, s, c = arg
        shape[s] //= SIZES[ax]
        shape[c] *= SIZES[ax]
    return tuple(shape)


@st.composite
def programs(draw):
    spec = draw(st.sampled_from([(None, None), ("x", None), (None, "y"), ("x", "y"), ("y", "x"),
                                 (("x", "y"), None)]))
    shape = (8, 8)
    local = tuple(d // int(np.prod([SIZES[a] for a in ((e,) if isinstance(e, str) else e or ())]))
                  for d, e in zip(shape, spec))
    steps = []
    for _ in range(draw(st.integers(1, 3))):
        step = _step(draw, local)
        steps.append(step)
        local = _shape_after(step, local)
        if max(local) > 64:
            break
    return spec, steps, draw(st.integers(0, 2**16))


def _run(lib, steps, a):
    lax = sl.lax if lib == "sl" else jax.lax
    tanh = np.tanh if lib == "sl" else jax.numpy.tanh
    for name, arg in steps:
        if name == "scale":
            a = a * 2.0 + 1.0
        elif name == "tanh":
            a = tanh(a)
        elif name == "psum":
            a = lax.psum(a, arg)
        elif name == "pmax":
            a = lax.pmax(a, arg)
        elif name == "all_gather":
            a = lax.all_gather(a, arg[0], axis=arg[1], tiled=True)
        elif name == "psum_scatter":
            a = lax.psum_scatter(a, arg[0], scatter_dimension=arg[1], tiled=True)
        elif name == "all_to_all":
            a = lax.all_to_all(a, arg[0], arg[1], arg[2], tiled=True)
        elif name == "ppermute":
            n = SIZES[arg[0]]
            a = lax.ppermute(a, arg[0], [(i, (i + arg[1]) % n) for i in range(n)])
    return a


@settings(max_examples=N(25))
@given(program=programs())
def test_random_shard_map_programs_match_jax(program):
    spec, steps, seed = program
    x = np.random.default_rng(seed).standard_normal((8, 8)).astype(np.float32)
    out_spec = (("x", "y"), None)   # every device's block, stacked: defined whatever varies
    ours = sl.shard_map(lambda a: _run("sl", steps, a), mesh=MESH, in_specs=P(*spec), out_specs=P(*out_spec),
                        check_vma=False)(x)
    jm = _jax_mesh()
    xj = jax.device_put(x, jax.sharding.NamedSharding(jm, jax.P(*spec)))
    theirs = jax.shard_map(lambda a: _run("jax", steps, a), mesh=jm, in_specs=jax.P(*spec),
                           out_specs=jax.P(*out_spec), check_vma=False)(xj)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=2e-5, atol=2e-5,
                               err_msg=f"spec {spec}, steps {steps}")
