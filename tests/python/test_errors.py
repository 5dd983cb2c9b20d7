"""Bad input (issue 2): every item raises a clear exception that names the op (the message
starts with ``[op]``, except JAX's NameError text for unbound axis names) and the offending
value; nothing crashes, hangs or returns a wrong answer."""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardlab as sl
from shardlab import P
from shardlab.experimental.shard_map import shard_map as legacy_shard_map

MESH = sl.make_mesh((4, 2), ("x", "y"))
X = np.arange(32, dtype=np.float32).reshape(8, 4)


def smap(f, in_specs, out_specs, mesh=MESH, **kw):
    return sl.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **kw)


def raises(exc, op, *values):
    """pytest.raises that also checks the message starts with [op] and names every value."""
    return _Raises(exc, op, values)


class _Raises:
    def __init__(self, exc, op, values):
        self.exc, self.op, self.values = exc, op, values

    def __enter__(self):
        self.ctx = pytest.raises(self.exc)
        self.info = self.ctx.__enter__()
        return self.info

    def __exit__(self, *exc_info):
        handled = self.ctx.__exit__(*exc_info)
        msg = str(self.info.value)
        assert msg.startswith(f"[{self.op}"), msg
        for v in self.values:
            assert str(v) in msg, (v, msg)
        return handled


# -- PartitionSpec / NamedSharding ---------------------------------------------------------
@pytest.mark.parametrize("spec, axis", [
    (P("x", "x"), "'x'"), (P(("x", "y"), "y"), "'y'"), (P(None, ("y", "y")), "'y'"),
])
def test_duplicate_mesh_axis(spec, axis):
    with raises(sl.DuplicateSpecError, "NamedSharding", axis):
        sl.NamedSharding(MESH, spec)
    assert issubclass(sl.DuplicateSpecError, ValueError)
    with sl.set_mesh(MESH), pytest.raises(sl.DuplicateSpecError, match=re.escape(axis)):
        sl.device_put(X, spec)
    with pytest.raises(sl.DuplicateSpecError):
        smap(lambda a: a, spec, P())(X)


def test_unknown_axis():
    with raises(ValueError, "NamedSharding", "'q'"):
        sl.NamedSharding(MESH, P("q"))
    with raises(ValueError, "NamedSharding", "'q'"):
        smap(lambda a: a, P(None, "q"), P())(X)
    with raises(ValueError, "NamedSharding", "'q'"):
        smap(lambda a: a, P(), P("q"))(X)


def test_spec_longer_than_rank():
    with raises(ValueError, "device_put", "rank 2", "3 entries"):
        sl.device_put(X, sl.NamedSharding(MESH, P("x", "y", None)))
    with raises(ValueError, "shard_map", "rank 2"):
        smap(lambda a: a, P("x", None, None), P())(X)
    with raises(ValueError, "shard_map", "local rank 0"):
        smap(lambda a: a.sum(), P(), P("x"))(X)


@pytest.mark.parametrize("shape, spec, dim, size, product", [
    ((6, 4), P("x"), 0, 6, 4), ((4, 4), P(("x", "y")), 0, 4, 8), ((8, 3), P(None, "y"), 1, 3, 2),
    ((8, 6), P("y", ("x",)), 1, 6, 4),
])
def test_indivisible_dimension(shape, spec, dim, size, product):
    with raises(ValueError, "device_put", f"dimension {dim}", f"size {size}", f"by {product}"):
        sl.device_put(np.zeros(shape, np.float32), sl.NamedSharding(MESH, spec))
    with raises(ValueError, "shard_map", f"dimension {dim}", f"size {size}"):
        smap(lambda a: a, spec, P())(np.zeros(shape, np.float32))


def test_unconstrained_and_bad_spec_entries():
    with raises(ValueError, "NamedSharding", "UNCONSTRAINED"):
        sl.NamedSharding(MESH, P(P.UNCONSTRAINED))
    with raises(TypeError, "PartitionSpec", "3"):
        P(3)
    with raises(TypeError, "NamedSharding", "'x'"):
        sl.NamedSharding(MESH, "x")


# -- collectives ---------------------------------------------------------------------------
@pytest.mark.parametrize("tiled, detail", [(False, "not the size 4"), (True, "not divisible by 4")])
def test_psum_scatter_size_mismatch(tiled, detail):
    with raises(ValueError, "psum_scatter", "size 3", detail, "'x'"):
        smap(lambda a: sl.lax.psum_scatter(a, "x", tiled=tiled), P(), P())(np.ones((3, 2), np.float32))
    with raises(ValueError, "psum_scatter", "size 2", "('x', 'y')"):
        smap(lambda a: sl.lax.psum_scatter(a, ("x", "y"), scatter_dimension=1, tiled=tiled), P(), P())(
            np.ones((3, 2), np.float32))


@pytest.mark.parametrize("tiled, detail", [(False, "not the axis size 4"), (True, "not divisible by 4")])
def test_all_to_all_size_mismatch(tiled, detail):
    with raises(ValueError, "all_to_all", "split_axis 0", "size 3", detail, "'x'"):
        smap(lambda a: sl.lax.all_to_all(a, "x", 0, 1, tiled=tiled), P(), P())(np.ones((3, 2), np.float32))


def test_axis_out_of_range():
    with raises(ValueError, "all_to_all", "split_axis 5"):
        smap(lambda a: sl.lax.all_to_all(a, "x", 5, 0), P(), P())(X)
    with raises(ValueError, "all_gather", "axis 5"):
        smap(lambda a: sl.lax.all_gather(a, "x", axis=5), P(), P())(X)
    with raises(ValueError, "all_gather", "scalar"):
        smap(lambda a: sl.lax.all_gather(a.sum(), "x", tiled=True), P(), P())(X)
    with raises(ValueError, "broadcast", "root 4"):
        smap(lambda a: sl.lax.broadcast(a, "x", 4), P(), P())(X)
    with raises(ValueError, "scatter", "root -1"):
        smap(lambda a: sl.lax.scatter(a, "y", -1, tiled=True), P(), P())(X)


@pytest.mark.parametrize("perm, words", [
    ([(0, 1), (0, 2)], ["source 0", "twice"]),
    ([(0, 1), (2, 1)], ["destination 1", "twice"]),
    ([(0, 4)], ["index 4", "(0, 4)", "[0, 4)"]),
    ([(-1, 0)], ["index -1", "(-1, 0)"]),
    ([(1, 1), (1, 1)], ["twice"]),
])
def test_invalid_ppermute_perm(perm, words):
    with raises(ValueError, "ppermute", *words):
        smap(lambda a: sl.lax.ppermute(a, "x", perm), P("x"), P("x"))(X)


def test_ppermute_perm_not_pairs():
    with raises(TypeError, "ppermute", "[0, 1]"):
        smap(lambda a: sl.lax.ppermute(a, "x", [0, 1]), P("x"), P("x"))(X)
    with raises(ValueError, "pshuffle", "[0, 0]"):
        smap(lambda a: sl.lax.pshuffle(a, "y", [0, 0]), P("x"), P("x"))(X)


def test_ppermute_tuple_axes_range_is_the_group_size():
    # 8 devices in the ('x', 'y') group: 7 is valid, 8 is not.
    smap(lambda a: sl.lax.ppermute(a, ("x", "y"), [(0, 7)]), P(("x", "y")), P(("x", "y")))(X)
    with raises(ValueError, "ppermute", "index 8", "('x', 'y')"):
        smap(lambda a: sl.lax.ppermute(a, ("x", "y"), [(0, 8)]), P(("x", "y")), P(("x", "y")))(X)


def test_bad_axis_names_inside_shard_map():
    with pytest.raises(NameError, match="'q'"):
        smap(lambda a: sl.lax.psum(a, "q"), P(), P())(X)
    with pytest.raises(NameError, match="'q'"):
        smap(lambda a: sl.lax.all_gather(a, ("x", "q")), P(), P())(X)
    with raises(TypeError, "psum", "3"):
        smap(lambda a: sl.lax.psum(a, 3), P(), P())(X)
    with raises(ValueError, "psum", "empty"):
        smap(lambda a: sl.lax.psum(a, ()), P(), P())(X)
    with raises(ValueError, "pmax", "('x', 'x')"):
        smap(lambda a: sl.lax.pmax(a, ("x", "x")), P(), P())(X)


COLLECTIVES = {
    "psum": lambda x: sl.lax.psum(x, "x"), "pmean": lambda x: sl.lax.pmean(x, "x"),
    "pmax": lambda x: sl.lax.pmax(x, "x"), "pmin": lambda x: sl.lax.pmin(x, "x"),
    "all_gather": lambda x: sl.lax.all_gather(x, "x"),
    "psum_scatter": lambda x: sl.lax.psum_scatter(x, "x", tiled=True),
    "all_to_all": lambda x: sl.lax.all_to_all(x, "x", 0, 0, tiled=True),
    "ppermute": lambda x: sl.lax.ppermute(x, "x", [(0, 1)]),
    "axis_index": lambda x: sl.lax.axis_index("x"), "axis_size": lambda x: sl.lax.axis_size("x"),
    "broadcast": lambda x: sl.lax.broadcast(x, "x"), "reduce": lambda x: sl.lax.reduce(x, "x"),
    "gather": lambda x: sl.lax.gather(x, "x"), "scatter": lambda x: sl.lax.scatter(x, "x", tiled=True),
    "pvary": lambda x: sl.lax.pvary(x, "x"),
}


@pytest.mark.parametrize("op", sorted(COLLECTIVES))
def test_collective_outside_shard_map_is_name_error(op):
    with pytest.raises(NameError, match=r"unbound axis name: 'x'") as info:
        COLLECTIVES[op](X)
    assert "shard_map" in str(info.value)


@pytest.mark.parametrize("op", sorted(set(COLLECTIVES) - {"axis_index", "axis_size"}))
@pytest.mark.parametrize("value, shown", [("abc", "<U3"), (object(), "object"),
                                          (np.ones(4, np.complex64), "complex64")])
def test_collective_of_non_array(op, value, shown):
    name = {"pvary": "pcast"}.get(op, op)
    with raises(TypeError, name, shown):
        smap(lambda a: COLLECTIVES[op](value), P(), P())(X)


# -- meshes --------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(0,), (0, 2), (2, -1), (-3,), (2.0,), (True, 2)])
def test_non_positive_mesh_sizes(shape):
    with raises(ValueError, "make_mesh", str(shape)):
        sl.make_mesh(shape, ("a", "b")[: len(shape)])


def test_empty_mesh():
    with pytest.raises(ValueError, match=r"^\[(make_mesh|Mesh)\].*\(\)"):
        sl.make_mesh((), ())
    for devs in (np.array([]), np.empty((0, 2), object)):
        with raises(ValueError, "Mesh", str(devs.shape)):
            sl.Mesh(devs, ("a", "b")[: devs.ndim])


def test_bad_mesh_construction():
    with raises(ValueError, "Mesh", "'a'"):
        sl.make_mesh((2, 2), ("a", "a"))
    with raises(ValueError, "make_mesh", "(2, 2)", "('a',)"):
        sl.make_mesh((2, 2), ("a",))
    with raises(ValueError, "Mesh", "3"):
        sl.Mesh(np.array([sl.devices()[3], sl.devices()[3]]), ("a",))
    with raises(ValueError, "make_mesh", "needs 4 devices"):
        sl.make_mesh((2, 2), ("a", "b"), devices=sl.devices()[:3])
    with raises(TypeError, "Mesh", "-1"):
        sl.Mesh(np.array([0, -1]), ("a",))


def test_shard_map_without_mesh():
    with raises(ValueError, "shard_map", "no mesh"):
        sl.shard_map(lambda a: a, in_specs=P(), out_specs=P())(X)
    with raises(ValueError, "device_put", "no mesh"):
        sl.device_put(X, P("x"))


# -- shard_map inputs and outputs ----------------------------------------------------------
def test_out_specs_claiming_replication_of_a_varying_value():
    with raises(ValueError, "shard_map", "'x'", "check_vma=False"):
        smap(lambda a: a, P("x"), P())(X)
    with raises(ValueError, "shard_map", "'y'"):
        smap(lambda a: sl.lax.psum(a, "x"), P("x", "y"), P())(X)
    with raises(ValueError, "shard_map", "'x'"):
        smap(lambda a: a + sl.lax.axis_index("x"), P(), P())(X)
    with raises(ValueError, "shard_map", "'x'"):
        legacy_shard_map(lambda a: a, MESH, P("x"), P())(X)


def test_check_vma_false_takes_device_zeros_value():
    # As JAX with check_vma=False: the output is read from the first device along the axis.
    out = smap(lambda a: a, P("x"), P(), check_vma=False)(X)
    np.testing.assert_array_equal(np.asarray(out), X[:2])
    out = legacy_shard_map(lambda a: a * 2, MESH, P("x"), P(), check_rep=False)(X)
    np.testing.assert_array_equal(np.asarray(out), 2 * X[:2])


def test_inputs_on_different_meshes():
    other = sl.make_mesh((2, 4), ("x", "y"))
    a = sl.device_put(X, sl.NamedSharding(other, P("x")))
    with raises(ValueError, "shard_map", "argument 0", "Mesh(axis_sizes=(2, 4), axis_names=('x', 'y')"):
        smap(lambda v: v, P("x"), P("x"))(a)
    with raises(ValueError, "shard_map", "argument 1"):
        smap(lambda u, v: u + v, (P("x"), P("x")), P("x"))(X, a)

    leaked = {}
    smap(lambda v: leaked.setdefault("v", v), P("x"), P("x"))(X)
    with raises(ValueError, "LocalArray", "different meshes"):
        smap(lambda v: v + leaked["v"], P(), P(), mesh=other)(X)
    with raises(ValueError, "shard_map", "output 0"):
        smap(lambda v: leaked["v"], P(), P("x"), mesh=other)(X)
    with raises(ValueError, "psum", "storage dim 0"):
        smap(lambda v: sl.lax.psum(leaked["v"], "x"), P(), P(), mesh=other)(X)


@pytest.mark.parametrize("value, shown", [("hello", "str"), (object(), "object"),
                                          (np.ones(8, np.complex128), "complex128")])
def test_non_array_inputs(value, shown):
    with raises(TypeError, "shard_map", "argument 0", shown):
        smap(lambda a: a, P(), P())(value)
    with raises(TypeError, "device_put", shown if shown != "str" else "<U5"):
        sl.device_put(value, sl.NamedSharding(MESH, P()))


def test_integers_that_do_not_fit_int32():
    with raises(OverflowError, "device_put", "int32"):
        sl.device_put(np.array([2**40, 0, 0, 0]), sl.NamedSharding(MESH, P("x")))


def test_bad_shard_map_arguments():
    with raises(TypeError, "shard_map", "callable", "int"):
        sl.shard_map(3, mesh=MESH, in_specs=P(), out_specs=P())
    with pytest.raises(TypeError, match="required keyword-only argument: 'out_specs'"):  # as JAX
        sl.shard_map(lambda a: a, mesh=MESH, in_specs=P())
    with raises(TypeError, "shard_map", "in_specs", "str"):  # JAX's TypeError: not a PartitionSpec
        smap(lambda a: a, "x", P())(X)
    with raises(ValueError, "shard_map", "out_specs"):
        smap(lambda a: (a, a), P(), (P(),))(X)
    with raises(ValueError, "shard_map", "['b']", "['a']"):
        smap(lambda d: d["a"], ({"b": P("x")},), P("x"))({"a": X})
    with raises(TypeError, "LocalArray", "truth value"):
        smap(lambda a: a if a else a, P(), P())(X)
    with raises(TypeError, "LocalArray"):
        smap(lambda a: np.asarray(a), P(), P())(X)
    with raises(NotImplementedError, "shard_map", "Closing over", "Explicit"):  # JAX's refusal
        captured = sl.device_put(X, sl.NamedSharding(MESH, P("x")))
        smap(lambda a: a + captured, P(), P())(X)


def test_shard_map_does_not_nest():
    inner = smap(lambda a: a, P(), P())
    with raises(ValueError, "shard_map", "already manual"):  # nothing left to map over
        smap(lambda a: inner(a), P(), P())(X)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.integers(-3, 10), min_size=0, max_size=4),
       st.lists(st.sampled_from(["x", "y", "z", None, ("x", "y"), ("y", "x"), ("x", "x")]), max_size=4))
def test_fuzz_device_put_either_works_or_raises_clearly(shape, spec):
    """Random (shape, spec) pairs: a correct result or a ValueError/TypeError naming an op."""
    try:
        arr = np.zeros([max(s, 0) for s in shape], np.float32)
        out = sl.device_put(arr, sl.NamedSharding(MESH, P(*spec)))
    except (ValueError, TypeError) as e:
        assert re.match(r"^\[\w", str(e)), str(e)
        return
    assert out.shape == arr.shape
    np.testing.assert_array_equal(np.asarray(out), arr)


# -- per-device slicing ------------------------------------------------------------------------
def test_dynamic_slice_rejects_bad_starts_and_sizes():
    mesh = sl.make_mesh((2,), ("x",))

    def call(body):
        return sl.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P())(np.zeros((4, 4), np.float32))

    with pytest.raises(ValueError, match=r"\[dynamic_slice\] 1 start indices for an operand of rank 2"):
        call(lambda a: sl.lax.dynamic_slice(a, (0,), (2, 2)))
    with pytest.raises(ValueError, match=r"\[dynamic_slice\] slice size 5 does not fit"):
        call(lambda a: sl.lax.dynamic_slice(a, (0, 0), (5, 2)))
    with pytest.raises(TypeError, match=r"\[dynamic_slice\] start indices must be integer scalars"):
        call(lambda a: sl.lax.dynamic_slice(a, (0.5, 0), (2, 2)))
    with pytest.raises(NameError, match="unbound axis name"):
        sl.lax.dynamic_slice(np.zeros(4), (0,), (2,))
