"""shard_map and lax as JAX 0.10.2 names them: in_specs=Infer, partial-manual axis_names,
nested shard_map, deprecated aliases, pcast's `to=`, axis_index_groups, pbroadcast,
pswapaxes, psend/precv, ragged_all_to_all, and printing per-device values. Each program is
compared with JAX running the same shard_map on 8 CPU devices where JAX can run it."""

from __future__ import annotations

import contextlib
import functools
import io
import warnings

import numpy as np
import pytest

import shardlab as sl
from shardlab import P
from shardlab.sharding import AxisType

pytestmark = pytest.mark.jax
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

X = np.arange(32, dtype=np.float32).reshape(8, 4)
G = [[0, 2], [1, 3]]


def meshes(shape=(4, 2), names=("x", "y"), kind=AxisType.Explicit):
    jm = jax.make_mesh(shape, names, axis_types=(getattr(jax.sharding.AxisType, kind.name),) * len(shape))
    return sl.make_mesh(shape, names, (kind,) * len(shape)), jm


def both(fn_sl, fn_jax):
    return np.asarray(fn_sl()), np.asarray(fn_jax())


# -- in_specs=Infer, mesh from set_mesh, decorator forms ----------------------------------------
def test_infer_takes_each_argument_spec():
    m, jm = meshes()
    a = sl.device_put(X, sl.NamedSharding(m, P("x", "y")))
    ja = jax.device_put(X, jax.NamedSharding(jm, jax.P("x", "y")))
    out = sl.shard_map(lambda v: v * 2, mesh=m, out_specs=P("x", "y"))(a)
    jout = jax.shard_map(lambda v: v * 2, mesh=jm, out_specs=jax.P("x", "y"))(ja)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jout))
    assert out.sharding.spec == P("x", "y")
    # host data enters replicated (P()): concatenated along x it repeats four times
    rep = sl.shard_map(lambda v: v + 1, mesh=m, out_specs=P("x"))(np.arange(3, dtype=np.float32))
    jrep = jax.shard_map(lambda v: v + 1, mesh=jm, out_specs=jax.P("x"))(np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(np.asarray(rep), np.asarray(jrep))
    from jax._src.shard_map import Infer as jax_infer
    assert repr(sl.sharding.Infer) == repr(jax_infer) == "jax.sharding.Infer"


def test_infer_needs_explicit_axes():
    m, jm = meshes(kind=AxisType.Auto)
    with pytest.raises(TypeError, match="Auto"):
        jax.shard_map(lambda v: v, mesh=jm, out_specs=jax.P())(X)
    with pytest.raises(TypeError, match="Auto"):
        sl.shard_map(lambda v: v, mesh=m, out_specs=P())(X)


def test_mesh_from_set_mesh_and_decorators():
    m, jm = meshes()
    a = sl.device_put(X, sl.NamedSharding(m, P("x")))
    ja = jax.device_put(X, jax.NamedSharding(jm, jax.P("x")))
    with sl.set_mesh(m):
        @sl.shard_map(out_specs=P())
        def total(v):
            return sl.lax.psum(v.sum(0), "x")

        part = functools.partial(sl.shard_map, in_specs=P("x"), out_specs=P("x"))(lambda v: v - 1)
        got = total(a), part(a)
    with jax.set_mesh(jm):
        want = jax.shard_map(lambda v: jax.lax.psum(v.sum(0), "x"), out_specs=jax.P())(ja), \
            jax.shard_map(lambda v: v - 1, in_specs=jax.P("x"), out_specs=jax.P("x"))(ja)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert total.__name__ == "total"


def test_smap_single_axis():
    m, jm = meshes()
    a = sl.device_put(X, sl.NamedSharding(m, P("x", "y")))
    ja = jax.device_put(X, jax.NamedSharding(jm, jax.P("x", "y")))
    with sl.set_mesh(m):
        got = (sl.smap(lambda v: v * 2, in_axes=0, out_axes=0, axis_name="x")(a),
               sl.smap(lambda v: sl.lax.psum(v, "x"), out_axes=None, axis_name="x")(a),
               sl.smap(lambda v: v + 1, in_axes=1, out_axes=1, axis_name="y")(a))
    with jax.set_mesh(jm):
        want = (jax.smap(lambda v: v * 2, in_axes=0, out_axes=0, axis_name="x")(ja),
                jax.smap(lambda v: jax.lax.psum(v, "x"), out_axes=None, axis_name="x")(ja),
                jax.smap(lambda v: v + 1, in_axes=1, out_axes=1, axis_name="y")(ja))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    for bad in (dict(axis_name=("x", "y"), out_axes=0), dict(axis_name="x", out_axes="0")):
        with pytest.raises(TypeError, match="smap"):
            jax.smap(lambda v: v, **bad)
        with pytest.raises(TypeError, match="smap"):
            sl.smap(lambda v: v, **bad)


def test_mesh_must_match_the_context_mesh():
    m, jm = meshes()
    other, jother = meshes((2, 4))
    with jax.set_mesh(jm), pytest.raises(ValueError, match="should match the mesh passed to shard_map"):
        jax.shard_map(lambda v: v, mesh=jother, in_specs=jax.P(), out_specs=jax.P())(X)
    with sl.set_mesh(m), pytest.raises(ValueError, match="should match the mesh passed to shard_map"):
        sl.shard_map(lambda v: v, mesh=other, in_specs=P(), out_specs=P())(X)
    with sl.set_mesh(m):  # the same mesh passed again is fine
        np.testing.assert_array_equal(np.asarray(sl.shard_map(lambda v: v, mesh=m, in_specs=P(), out_specs=P())(X)), X)


def test_static_in_specs_none():
    m, jm = meshes()
    seen = []
    out = sl.shard_map(lambda v: seen.append(type(v)) or v, mesh=m, in_specs=None, out_specs=P())(np.zeros(3))
    jout = jax.shard_map(lambda v: v, mesh=jm, in_specs=None, out_specs=jax.P())(np.zeros(3))
    assert seen == [np.ndarray]
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jout))


def test_check_rep_and_experimental_are_deprecated_aliases():
    m, _ = meshes()
    with pytest.warns(DeprecationWarning, match="check_vma"):
        f = sl.shard_map(lambda v: v, mesh=m, in_specs=P("x"), out_specs=P(), check_rep=False)
    np.testing.assert_array_equal(np.asarray(f(X)), X[:2])  # unchecked: device 0's block
    with pytest.raises(TypeError, match="unexpected keyword argument 'check_vmaa'"):
        sl.shard_map(lambda v: v, mesh=m, out_specs=P(), check_vmaa=False)
    import shardlab.experimental.shard_map as legacy
    with pytest.warns(DeprecationWarning, match="jax.experimental.shard_map is deprecated"):
        smap = legacy.shard_map
    with pytest.warns(DeprecationWarning):
        import jax.experimental.shard_map as jlegacy
        jsmap = jlegacy.shard_map
    _, jm = meshes()
    np.testing.assert_array_equal(np.asarray(smap(lambda v: v * 3, m, P("x"), P("x"))(X)),
                                  np.asarray(jsmap(lambda v: v * 3, jax.make_mesh((4, 2), ("x", "y")),
                                                   jax.P("x"), jax.P("x"))(
                                      jax.device_put(X, jax.NamedSharding(jm, jax.P("x"))))))


# -- partial-manual and nested ---------------------------------------------------------------
def test_partial_manual_axis_names():
    m, jm = meshes()
    a = sl.device_put(X, sl.NamedSharding(m, P("x", "y")))
    ja = jax.device_put(X, jax.NamedSharding(jm, jax.P("x", "y")))
    shapes = []

    def body(v):
        shapes.append(v.shape)  # global along the auto axis 'y'
        return sl.lax.psum(v.sum(1, keepdims=True), "x")

    got = sl.shard_map(body, mesh=m, in_specs=P("x"), out_specs=P(), axis_names={"x"})(a)
    with jax.set_mesh(jm):
        want = jax.shard_map(lambda v: jax.lax.psum(v.sum(1, keepdims=True), "x"), in_specs=jax.P("x"),
                             out_specs=jax.P(), axis_names={"x"})(ja)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert shapes == [(2, 4)]
    with pytest.raises(NameError, match="unbound axis name: y"):
        sl.shard_map(lambda v: sl.lax.psum(v, "y"), mesh=m, in_specs=P("x"), out_specs=P("x"), axis_names={"x"})(a)
    with jax.set_mesh(jm), pytest.raises(NameError, match="unbound axis name: y"):
        jax.shard_map(lambda v: jax.lax.psum(v, "y"), in_specs=jax.P("x"), out_specs=jax.P("x"),
                      axis_names={"x"})(ja)


def test_partial_manual_infers_the_manual_part_of_each_spec():
    m, jm = meshes()
    a = sl.device_put(X, sl.NamedSharding(m, P("x", "y")))
    ja = jax.device_put(X, jax.NamedSharding(jm, jax.P("x", "y")))
    shapes = []
    with sl.set_mesh(m):
        got = sl.shard_map(lambda v: shapes.append(v.shape) or v + 1, out_specs=P("x"), axis_names={"x"})(a)
    with jax.set_mesh(jm):
        want = jax.shard_map(lambda v: v + 1, out_specs=jax.P("x"), axis_names={"x"})(ja)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert shapes == [(2, 4)]  # P('x', 'y') enters as P('x'): global along the auto axis


def test_out_specs_unreduced():
    m, jm = meshes((4,), ("x",))
    a = sl.device_put(X, sl.NamedSharding(m, P("x")))
    ja = jax.device_put(X, jax.NamedSharding(jm, jax.P("x")))
    got = sl.shard_map(lambda v: v.sum(0), mesh=m, out_specs=P(unreduced={"x"}))(a)
    want = jax.shard_map(lambda v: v.sum(0), mesh=jm, out_specs=jax.P(unreduced={"x"}))(ja)
    assert str(sl.typeof(got)) == str(jax.typeof(want)) == "float32[4]{U:x}"
    with jax.set_mesh(jm):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.reshard(want, jax.P())))
    m2, jm2 = meshes()
    with pytest.raises(NotImplementedError, match="full manual"):
        jax.shard_map(lambda v: v, mesh=jm2, in_specs=jax.P("x"), out_specs=jax.P(unreduced={"x"}),
                      axis_names={"x"})(jax.device_put(X, jax.NamedSharding(jm2, jax.P("x"))))
    with pytest.raises(NotImplementedError, match="full manual"):
        sl.shard_map(lambda v: v, mesh=m2, in_specs=P("x"), out_specs=P(unreduced={"x"}), axis_names={"x"})(X)


def test_nested_shard_map_over_the_remaining_axis():
    m, jm = meshes()
    a = sl.device_put(X, sl.NamedSharding(m, P("x", "y")))
    ja = jax.device_put(X, jax.NamedSharding(jm, jax.P("x", "y")))

    def program(smap, lax, spec):
        def outer(v):
            inner = smap(lambda b: lax.psum(b, "y") + lax.axis_index("x"), in_specs=spec(None, "y"),
                         out_specs=spec(None, None), axis_names={"y"})
            return inner(v) * 2

        return smap(outer, in_specs=spec("x"), out_specs=spec("x"), axis_names={"x"})

    with sl.set_mesh(m):
        got = program(sl.shard_map, sl.lax, P)(a)
    with jax.set_mesh(jm):
        want = program(jax.shard_map, jax.lax, jax.P)(ja)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_nested_grad_matches_jax():
    m, jm = meshes(kind=AxisType.Auto)

    def loss(smap, lax, spec, w):
        def outer(v):
            inner = smap(lambda b: lax.psum((b * b).sum(), "y"), in_specs=spec(None, "y"), out_specs=spec(),
                         axis_names={"y"})
            return lax.psum(inner(v), "x")

        return smap(outer, in_specs=spec("x"), out_specs=spec(), axis_names={"x"})(w)

    with sl.set_mesh(m):
        g = sl.grad(lambda w: loss(sl.shard_map, sl.lax, P, w))(sl.device_put(X, sl.NamedSharding(m, P())))
    with jax.set_mesh(jm):
        jg = jax.grad(lambda w: loss(jax.shard_map, jax.lax, jax.P, w))(
            jax.device_put(X, jax.NamedSharding(jm, jax.P())))
    np.testing.assert_allclose(np.asarray(g), np.asarray(jg))


# -- printing a per-device value -------------------------------------------------------------
def test_print_inside_shard_map_matches_jax():
    m, jm = meshes(kind=AxisType.Auto)

    def run(smap, spec, mesh):
        buf = io.StringIO()

        def body(a, b):
            print(a, file=buf)
            print(repr(b), file=buf)
            print(f"{a.sum()}", file=buf)
            return a

        with contextlib.redirect_stdout(buf):
            smap(body, mesh=mesh, in_specs=(spec("x", "y"), spec()), out_specs=spec("x", "y"))(
                np.arange(16, dtype=np.int32).reshape(4, 4), np.ones(3, np.float32))
        return buf.getvalue()

    got, want = run(sl.shard_map, P, m), run(jax.shard_map, jax.P, jm)
    assert "On cpu:5 at mesh coordinates (x, y,) = (2, 1):\n[[10 11]]\n" in got
    assert got == want


# -- pcast, pvary, all_gather(to=) ------------------------------------------------------------
def test_pcast_to_values_and_errors():
    m, jm = meshes((4,), ("x",))
    a = sl.device_put(X, sl.NamedSharding(m, P("x")))
    ja = jax.device_put(X, jax.NamedSharding(jm, jax.P("x")))
    cases = [  # (program, out axis, JAX's check_vma)
        (lambda lax, v: lax.pcast(jnp_ones(lax), "x", to="varying") * v, "x", True),
        (lambda lax, v: lax.psum(lax.pcast(v, "x", to="unreduced"), "x"), None, True),
        (lambda lax, v: lax.pcast(lax.psum(v, "x"), "x", to="reduced") + 1, None, False),
    ]
    for fn, out, checked in cases:
        s = P(out) if out else P()
        js = jax.P(out) if out else jax.P()
        got = sl.shard_map(functools.partial(fn, sl.lax), mesh=m, out_specs=s)(a)
        want = jax.shard_map(functools.partial(fn, jax.lax), mesh=jm, out_specs=js, check_vma=checked)(ja)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    for to in ("invariant", "bogus"):
        with pytest.raises(ValueError, match="Allowed `to` values"):
            sl.shard_map(lambda v: sl.lax.pcast(v, "x", to=to), mesh=m, out_specs=P("x"))(a)
        with pytest.raises(ValueError, match="Allowed `to` values"):
            jax.shard_map(lambda v: jax.lax.pcast(v, "x", to=to), mesh=jm, out_specs=jax.P("x"))(ja)
    with pytest.raises(ValueError, match="pcast"):  # a varying value cannot become reduced
        sl.shard_map(lambda v: sl.lax.pcast(v, "x", to="reduced"), mesh=m, out_specs=P("x"))(a)
    with pytest.raises(TypeError, match="tuple or a str"):
        sl.shard_map(lambda v: sl.lax.pcast(v, {"x"}, to="varying"), mesh=m, out_specs=P("x"))(a)


def jnp_ones(lax):
    return np.ones((2, 4), np.float32)


def test_pvary_warns_as_deprecated():
    m, _ = meshes((4,), ("x",))
    with pytest.warns(DeprecationWarning, match="pcast"):
        out = sl.shard_map(lambda v: sl.lax.pvary(v, "x") * sl.lax.axis_index("x"), mesh=m, in_specs=P(),
                           out_specs=P("x"))(np.ones(2, np.float32))
    np.testing.assert_array_equal(np.asarray(out), [0, 0, 1, 1, 2, 2, 3, 3])
    with pytest.raises(AttributeError, match="pcast"):
        jax.lax.pvary  # noqa: B018  (JAX 0.10 removed it; shardlab keeps it, warning)


@pytest.mark.parametrize("to", ["varying", "invarying"])
def test_all_gather_to(to):
    m, jm = meshes((4,), ("x",))
    a = sl.device_put(X, sl.NamedSharding(m, P("x")))
    ja = jax.device_put(X, jax.NamedSharding(jm, jax.P("x")))
    out = P("x") if to == "varying" else P()
    got = sl.shard_map(lambda v: sl.lax.all_gather(v, "x", tiled=True, to=to), mesh=m, out_specs=out)(a)
    want = jax.shard_map(lambda v: jax.lax.all_gather(v, "x", tiled=True, to=to), mesh=jm,
                         out_specs=jax.P("x") if to == "varying" else jax.P())(ja)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    with pytest.raises(ValueError, match="Allowed `to`"):
        sl.shard_map(lambda v: sl.lax.all_gather(v, "x", to="unreduced"), mesh=m, out_specs=P("x"))(a)


# -- axis_index_groups -----------------------------------------------------------------------
GROUPED = {
    "psum": (lambda lax, v: lax.psum(v, "x", axis_index_groups=G), False),
    "pmean": (lambda lax, v: lax.pmean(v, "x", axis_index_groups=G), False),
    "pmax": (lambda lax, v: lax.pmax(v, "x", axis_index_groups=G), True),
    "pmin": (lambda lax, v: lax.pmin(v, "x", axis_index_groups=G), True),
    "all_gather": (lambda lax, v: lax.all_gather(v, "x", axis_index_groups=G), True),
    "all_gather_tiled": (lambda lax, v: lax.all_gather(v, "x", axis_index_groups=G, axis=1, tiled=True), True),
    "psum_scatter": (lambda lax, v: lax.psum_scatter(v, "x", axis_index_groups=G, tiled=True), True),
    "psum_scatter_untiled": (lambda lax, v: lax.psum_scatter(v, "x", axis_index_groups=G,
                                                             scatter_dimension=0), True),
    "all_to_all": (lambda lax, v: lax.all_to_all(v, "x", 0, 1, axis_index_groups=G, tiled=True), True),
    "all_to_all_untiled": (lambda lax, v: lax.all_to_all(v[:, :2], "x", 1, 0, axis_index_groups=G), True),
}


@pytest.mark.parametrize("name", sorted(GROUPED))
def test_axis_index_groups_match_jax(name):
    fn, checked = GROUPED[name]
    m, jm = meshes((4,), ("x",))
    a = sl.device_put(X, sl.NamedSharding(m, P("x")))
    ja = jax.device_put(X, jax.NamedSharding(jm, jax.P("x")))
    with sl.Ledger() as ledger:
        got = sl.shard_map(functools.partial(fn, sl.lax), mesh=m, out_specs=P("x"))(a)
    # JAX runs psum/pmean with groups only unchecked (check_vma=False); the others either way
    want = jax.shard_map(functools.partial(fn, jax.lax), mesh=jm, out_specs=jax.P("x"), check_vma=checked)(ja)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want))
    assert np.asarray(got).dtype == np.asarray(want).dtype
    (event,) = ledger.events
    assert event["group_size"] == 2 and event["num_groups"] == 2 and event["bytes_sent"] > 0


GROUPED["gather_then_scatter"] = (  # both transposes in one program (one JAX compile)
    lambda lax, v: lax.psum_scatter(lax.all_gather(v, "x", axis_index_groups=G, axis=1, tiled=True) ** 2, "x",
                                    axis_index_groups=G, scatter_dimension=1, tiled=True), True)


@pytest.mark.parametrize("name", ["psum", "gather_then_scatter", "all_to_all"])
def test_axis_index_groups_grad_matches_jax(name):
    fn, checked = GROUPED[name]
    m, jm = meshes((4,), ("x",))
    w = np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4)
    a = sl.device_put(X, sl.NamedSharding(m, P("x")))
    ja = jax.device_put(X, jax.NamedSharding(jm, jax.P("x")))

    def loss(smap, lax, spec, v, **kw):
        out = smap(functools.partial(fn, lax), out_specs=spec("x"), **kw)(v)
        return (out * out).sum()

    g = sl.grad(lambda v: loss(functools.partial(sl.shard_map, mesh=m), sl.lax, P, v))(a)
    with jax.set_mesh(jm):
        jg = jax.grad(lambda v: loss(functools.partial(jax.shard_map, mesh=jm), jax.lax, jax.P, v,
                                     check_vma=checked))(ja)
    np.testing.assert_allclose(np.asarray(g), np.asarray(jg), rtol=1e-5)


def test_psum_of_a_constant_over_groups_is_the_group_size():
    m, jm = meshes((4,), ("x",))
    f = lambda lax: (lambda v: v + lax.psum(1, "x", axis_index_groups=G))  # noqa: E731
    with sl.Ledger() as ledger:
        got = sl.shard_map(f(sl.lax), mesh=m, in_specs=P("x"), out_specs=P("x"))(np.zeros(4, np.float32))
    want = jax.shard_map(f(jax.lax), mesh=jm, out_specs=jax.P("x"))(
        jax.device_put(np.zeros(4, np.float32), jax.NamedSharding(jm, jax.P("x"))))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert ledger.events == []  # no communication for a constant


def test_axis_index_groups_bad_input():
    m, _ = meshes((4,), ("x",))
    for groups, match in (([[0, 1], [1, 2]], "cover all indices exactly once"),
                          ([[0, 1, 2], [3]], "same size"), ([["a"]], "list of lists")):
        with pytest.raises((ValueError, TypeError), match=match):
            sl.shard_map(lambda v: sl.lax.all_gather(v, "x", axis_index_groups=groups), mesh=m, in_specs=P("x"),
                         out_specs=P("x"))(X)


# -- pbroadcast, pswapaxes, psend / precv ----------------------------------------------------
def test_pbroadcast_is_masked_psum():
    """JAX has no CPU lowering for pbroadcast; its docstring's definition is the reference."""
    m, jm = meshes((4,), ("x",))
    a = sl.device_put(X, sl.NamedSharding(m, P("x")))
    ja = jax.device_put(X, jax.NamedSharding(jm, jax.P("x")))
    with sl.Ledger() as ledger:
        got = sl.shard_map(lambda v: sl.lax.pbroadcast(v, "x", 2), mesh=m, out_specs=P("x"))(a)
    want = jax.shard_map(lambda v: jax.lax.psum(jnp.where(jax.lax.axis_index("x") == 2, v, 0), "x"), mesh=jm,
                         out_specs=jax.P("x"))(ja)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert [e["op"] for e in ledger.events] == ["broadcast"]
    g = sl.grad(lambda v: (sl.shard_map(lambda u: sl.lax.pbroadcast(u, "x", 2), mesh=m,
                                        out_specs=P("x"))(v) ** 2).sum())(a)
    with jax.set_mesh(jm):
        jg = jax.grad(lambda v: (jax.shard_map(lambda u: jax.lax.psum(jnp.where(jax.lax.axis_index("x") == 2, u, 0),
                                                                      "x"), mesh=jm, out_specs=jax.P("x"))(v) ** 2
                                 ).sum())(ja)
    np.testing.assert_allclose(np.asarray(g), np.asarray(jg))


def test_pswapaxes_matches_jax():
    m, jm = meshes((4,), ("x",))
    x = np.arange(64, dtype=np.float32).reshape(16, 4)
    got = sl.shard_map(lambda v: sl.lax.pswapaxes(v, "x", 0), mesh=m, in_specs=P("x"), out_specs=P("x"))(
        sl.device_put(x, sl.NamedSharding(m, P("x"))))
    want = jax.shard_map(lambda v: jax.lax.pswapaxes(v, "x", 0), mesh=jm, out_specs=jax.P("x"))(
        jax.device_put(x, jax.NamedSharding(jm, jax.P("x"))))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_psend_precv_move_like_ppermute():
    m, jm = meshes((4,), ("x",))
    perm = [(0, 1), (1, 2), (2, 3)]
    a = sl.device_put(X, sl.NamedSharding(m, P("x")))

    def body(v):
        tok = sl.lax.psend(v, "x", perm)
        return sl.lax.precv(tok, sl.ShapeDtypeStruct(v.shape, v.dtype), "x", perm)

    with sl.Ledger() as ledger:
        got = sl.shard_map(body, mesh=m, out_specs=P("x"))(a)
    want = jax.shard_map(lambda v: jax.lax.ppermute(v, "x", perm), mesh=jm, out_specs=jax.P("x"))(
        jax.device_put(X, jax.NamedSharding(jm, jax.P("x"))))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert [e["op"] for e in ledger.events] == ["ppermute"]


# -- ragged_all_to_all -----------------------------------------------------------------------
def _ragged_reference(operand, output, in_off, send, out_off, recv, n):
    """JAX's docstring pseudo-code, per device (leading dim = device along the axis)."""
    result = output.copy()
    k = in_off.shape[1]
    spd = k // n
    for src in range(n):
        for i in range(k):
            dst = i // spd
            a, size, b = in_off[src, i], send[src, i], out_off[src, i]
            result[dst, b:b + size] = operand[src, a:a + size]
    return result


def test_ragged_all_to_all_jax_docstring_example():
    """JAX's CPU backend cannot run ragged_all_to_all; the docstring's example is the reference."""
    m, _ = meshes((2,), ("x",))
    args = (np.array([1, 2, 2, 3, 4, 0], np.float32), np.zeros(8, np.float32),
            np.array([0, 1, 0, 1], np.int32), np.array([1, 2, 1, 1], np.int32),
            np.array([0, 0, 1, 2], np.int32), np.array([1, 1, 2, 1], np.int32))
    f = sl.shard_map(lambda *v: sl.lax.ragged_all_to_all(*v, axis_name="x"), mesh=m, in_specs=P("x"),
                     out_specs=P("x"))
    with sl.Ledger() as ledger:
        out = f(*args)
    np.testing.assert_array_equal(np.asarray(out), [1, 3, 0, 0, 2, 2, 4, 0])
    (event,) = ledger.events
    # device 0 sends 2 rows to device 1, device 1 sends 1 row to device 0: the largest is 2 x 4 bytes
    assert event["op"] == "ragged_all_to_all" and event["bytes_sent"] == 8.0


def test_ragged_all_to_all_random_and_grad():
    rng = np.random.default_rng(0)
    m, _ = meshes((4,), ("x",))
    n, rows, k = 4, 12, 8  # two slices per destination
    send = rng.integers(0, 3, (n, k)).astype(np.int32)
    in_off = np.concatenate([np.zeros((n, 1), np.int32), np.cumsum(send, 1)[:, :-1]], 1).astype(np.int32)
    recv = send.reshape(n, n, 2).transpose(1, 0, 2).reshape(n, k)  # what each receiver gets, by sender
    recv_off = np.concatenate([np.zeros((n, 1), np.int32), np.cumsum(recv, 1)[:, :-1]], 1).astype(np.int32)
    out_off = recv_off.reshape(n, n, 2).transpose(1, 0, 2).reshape(n, k)  # where the receiver puts it
    operand = rng.normal(size=(n, rows, 3)).astype(np.float32)
    output = np.full((n, 16, 3), -1, np.float32)
    want = _ragged_reference(operand, output, in_off, send, out_off, recv, n)
    f = sl.shard_map(lambda *v: sl.lax.ragged_all_to_all(*v, axis_name="x"), mesh=m, in_specs=P("x"),
                     out_specs=P("x"))
    flat = [a.reshape((-1,) + a.shape[2:]) for a in (operand, output, in_off, send, out_off, recv)]
    np.testing.assert_array_equal(np.asarray(f(*flat)).reshape(want.shape), want)
    # gradient of sum(w * out): the operand rows that were sent get w at their destination,
    # the output rows that were overwritten get nothing, the others keep w
    w = rng.normal(size=(n * 16, 3)).astype(np.float32)
    g_op, g_out = sl.grad(lambda a, b: (f(a, b, *flat[2:]) * w).sum(), argnums=(0, 1))(flat[0], flat[1])
    ones = _ragged_reference(np.ones_like(operand), np.zeros_like(output), in_off, send, out_off, recv, n)
    np.testing.assert_allclose(np.asarray(g_out).reshape(n, 16, 3), w.reshape(n, 16, 3) * (1 - ones))
    idx = _ragged_reference(np.arange(n * rows, dtype=np.float32).reshape(n, rows, 1).repeat(3, 2),
                            np.full((n, 16, 3), -1, np.float32), in_off, send, out_off, recv, n)
    want_op = np.zeros(n * rows * 3, np.float32).reshape(n * rows, 3)
    for pos, src in np.ndenumerate(idx[..., 0]):
        if src >= 0:
            want_op[int(src)] += w.reshape(n, 16, 3)[pos]
    np.testing.assert_allclose(np.asarray(g_op), want_op, rtol=1e-6)


def test_ragged_all_to_all_bad_input():
    m, _ = meshes((2,), ("x",))
    ok = (np.zeros(4, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="input_offsets must be integer"):
        sl.shard_map(lambda *v: sl.lax.ragged_all_to_all(*v, axis_name="x"), mesh=m, in_specs=P("x"),
                     out_specs=P("x"))(*ok, np.zeros(4, np.float32), *[np.zeros(4, np.int32)] * 3)
    with pytest.raises(ValueError, match="does not divide"):
        sl.shard_map(lambda *v: sl.lax.ragged_all_to_all(*v, axis_name="x"), mesh=m, in_specs=P(),
                     out_specs=P())(*ok, *[np.zeros(3, np.int32)] * 4)


# -- fori_loop(unroll=), bad input -----------------------------------------------------------
def test_fori_loop_accepts_unroll():
    m, jm = meshes((4,), ("x",))
    body = lambda lax: (lambda i, v: lax.ppermute(v, "x", [(j, (j + 1) % 4) for j in range(4)]) + i)  # noqa: E731
    got = sl.shard_map(lambda v: sl.lax.fori_loop(0, 3, body(sl.lax), v, unroll=2), mesh=m, in_specs=P("x"),
                       out_specs=P("x"))(X)
    want = jax.shard_map(lambda v: jax.lax.fori_loop(0, 3, body(jax.lax), v, unroll=2), mesh=jm,
                         out_specs=jax.P("x"))(jax.device_put(X, jax.NamedSharding(jm, jax.P("x"))))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_bad_input_as_jax():
    m, jm = meshes()
    a = sl.device_put(X, sl.NamedSharding(m, P("x", "y")))
    ja = jax.device_put(X, jax.NamedSharding(jm, jax.P("x", "y")))
    cases = [
        (dict(in_specs=P("x"), out_specs=P("x"), axis_names=["x"]), TypeError, "frozenset"),
        (dict(in_specs=P("x"), out_specs=P("x"), axis_names={"z"}), ValueError, "subset"),
        (dict(in_specs=P("x", "y"), out_specs=P("x"), axis_names={"x"}), ValueError, "marked as manual"),
        (dict(in_specs=P("x", "y"), out_specs=P("x")), ValueError, "replicated across mesh axis 'y'"),
        (dict(in_specs=P("x", "y"), out_specs="x"), TypeError, "PartitionSpec"),
    ]
    for kw, exc, match in cases:
        jkw = {k: (jax.P(*v) if isinstance(v, type(P())) else v) for k, v in kw.items()}
        with jax.set_mesh(jm), pytest.raises(exc, match=match):
            jax.shard_map(lambda v: v, **jkw)(ja)
        with sl.set_mesh(m), pytest.raises(exc, match=match):
            sl.shard_map(lambda v: v, **kw)(a)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="no mesh"):
            sl.shard_map(lambda v: v, out_specs=P())(X)


def test_abstract_ledger_equals_the_real_one():
    """Grouped collectives and nested shard_maps record the same events shape-only."""
    m = sl.make_mesh((4, 2), ("x", "y"))

    def program(v):
        def outer(a):
            b = sl.lax.all_to_all(a, "x", 1, 1, axis_index_groups=G, tiled=True)
            inner = sl.shard_map(lambda c: sl.lax.psum(c, "y"), in_specs=P(None, "y"), out_specs=P(),
                                 axis_names={"y"})
            return sl.lax.psum(inner(b), "x", axis_index_groups=G)

        return sl.shard_map(outer, mesh=m, in_specs=P("x"), out_specs=P(), axis_names={"x"}, check_vma=False)(v)

    with sl.Ledger() as real:
        out = program(X)
    with sl.Ledger() as abstract:
        shape = sl.eval_shape(program, sl.ShapeDtypeStruct(X.shape, X.dtype))
    assert shape.shape == np.asarray(out).shape
    assert real.program_events() == abstract.program_events()
    assert [e["op"] for e in real.events] == ["all_to_all", "psum", "psum"]


def test_arrays_made_inside_a_body_are_per_device_values_as_jax():
    """jnp.zeros / arange inside shard_map are per-device values the same on every device (JAX's
    traced constants): they mix with varying values, take ``.at[]`` updates from them and leave
    through out_specs like any per-device value."""
    import shardlab.numpy as snp

    jnp = jax.numpy
    x = np.arange(8.0, dtype=np.float32).reshape(4, 2)

    def body(m, v):
        state = m.zeros((3, 2), dtype=np.float32) * np.float32(np.nan)
        state = state.at[0].set(v[0]).at[2].add(m.arange(2, dtype=np.float32))
        return state[None]

    mesh = sl.make_mesh((4,), ("i",), (AxisType.Auto,))
    ours = sl.shard_map(functools.partial(body, snp), mesh=mesh, in_specs=P("i"), out_specs=P("i"))(x)
    jmesh = jax.make_mesh((4,), ("i",), (jax.sharding.AxisType.Auto,))
    theirs = jax.shard_map(functools.partial(body, jnp), mesh=jmesh, in_specs=jax.P("i"),
                           out_specs=jax.P("i"))(x)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    seen = {}
    sl.shard_map(lambda v: seen.setdefault("z", snp.zeros(2)) + v[0], mesh=mesh, in_specs=P("i"),
                 out_specs=P("i"))(x)
    assert isinstance(seen["z"], sl.LocalArray) and seen["z"].dtype == np.float32
