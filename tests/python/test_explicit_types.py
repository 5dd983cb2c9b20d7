"""Meshes and types of the global view, against JAX 0.10: make_mesh's spellings, Mesh /
AbstractMesh reprs, set_mesh / get_abstract_mesh / use_abstract_mesh / `with mesh:`, typeof,
PartitionSpec with unreduced / reduced, NamedSharding, SingleDeviceSharding and the Sharding
base, and the errors JAX raises for bad input."""

import numpy as np
import pytest

import shardlab as sl
from shardlab import P
from shardlab.sharding import (
    AbstractMesh, AxisType, NamedSharding, Sharding, SingleDeviceSharding, get_abstract_mesh, use_abstract_mesh,
)

jaxmark = pytest.mark.jax


@pytest.fixture(scope="module")
def jax():
    return pytest.importorskip("jax")


def _jax_mesh(jax, shape, names, types=None):
    return jax.make_mesh(shape, names, types)


def _jtypes(jax, types):
    return None if types is None else tuple(getattr(jax.sharding.AxisType, t.name) for t in types)


# -- make_mesh and Mesh -------------------------------------------------------------------------
def test_make_mesh_accepts_both_keyword_spellings_and_positional_sizes():
    a = sl.make_mesh((2, 4), ("X", "Y"))
    b = sl.make_mesh(axis_shapes=(2, 4), axis_names=("X", "Y"))
    c = sl.make_mesh(axis_sizes=(2, 4), axis_names=("X", "Y"))
    assert a == b == c and a.axis_types == (AxisType.Explicit,) * 2
    with pytest.raises(TypeError, match=r"^\[make_mesh\] got the axis sizes twice"):
        sl.make_mesh((2, 4), ("X", "Y"), axis_sizes=(2, 4))
    with pytest.raises(TypeError, match=r"^\[make_mesh\] missing required argument axis_shapes"):
        sl.make_mesh(axis_names=("X", "Y"))


@jaxmark
@pytest.mark.parametrize("types", [None, (AxisType.Auto, AxisType.Explicit), (AxisType.Auto,) * 2])
def test_mesh_repr_and_str_are_jax_s(jax, types):
    ours = sl.make_mesh((2, 4), ("X", "Y"), types)
    theirs = jax.make_mesh((2, 4), ("X", "Y"), _jtypes(jax, types))
    assert repr(ours) == repr(theirs) and str(ours) == str(theirs)
    ours2 = sl.Mesh(np.array(sl.devices()).reshape(4, 2), ("a", "b"))
    theirs2 = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("a", "b"))
    assert repr(ours2) == repr(theirs2) and ours2.axis_types == (AxisType.Auto,) * 2
    assert str(ours2.abstract_mesh) == str(jax.sharding.AbstractMesh((4, 2), ("a", "b")))


def test_hardware_stays_visible_in_the_repr():
    m = sl.make_mesh((4, 2), ("X", "Y"), hardware="tpu-v5e")
    assert repr(m).endswith("axis_types=(Explicit, Explicit), hardware='tpu-v5e')")
    assert str(m) == "Mesh('X': 4, 'Y': 2, axis_types=(Explicit, Explicit), hardware='tpu-v5e')"
    assert m.abstract_mesh.hardware is m.hardware


@jaxmark
def test_axis_type_errors_are_jax_s(jax):
    for bad, cls in (((AxisType.Explicit,), ValueError), (("Explicit", "Explicit"), TypeError)):
        with pytest.raises(cls):
            jax.make_mesh((2, 4), ("X", "Y"), _jtypes(jax, bad) if cls is ValueError else bad)
        with pytest.raises(cls, match=r"^\[make_mesh\]"):
            sl.make_mesh((2, 4), ("X", "Y"), bad)


def test_axis_type_queries_and_update():
    m = sl.make_mesh((2, 4), ("X", "Y"), (AxisType.Explicit, AxisType.Auto))
    assert m.explicit_axes == ("X",) and m.auto_axes == ("Y",) and m.manual_axes == ()
    assert not m.are_all_axes_explicit and m.update_axis_types({"Y": AxisType.Explicit}).are_all_axes_explicit
    assert m != m.update_axis_types({"Y": AxisType.Explicit})  # types are part of a mesh, as in JAX


# -- AbstractMesh, set_mesh, get_abstract_mesh, use_abstract_mesh, `with mesh:` -------------------
def test_abstract_mesh_is_shardlab_s_abstract_mesh():
    am = AbstractMesh((16, 16), ("x", "y"))
    assert am.axis_types == (AxisType.Auto,) * 2 and am.size == 256 and am.abstract and am.shape == {"x": 16, "y": 16}
    m = sl.make_mesh((4, 2), ("x", "y"), abstract=True)
    assert isinstance(m, AbstractMesh) and m.axis_types == (AxisType.Explicit,) * 2
    assert sl.make_mesh((4, 2), ("x", "y")).abstract_mesh == m and m.abstract_mesh is m
    x = sl.ShapeDtypeStruct((8, 4), np.float32, sharding=NamedSharding(m, P("x")))
    out = sl.eval_shape(lambda v: v * 2, x)  # abstract meshes run shape-only, as before
    assert out.shape == (8, 4) and out.sharding == NamedSharding(m, P("x"))
    assert AbstractMesh((), ()).empty and AbstractMesh((), ()).size == 0


@jaxmark
def test_abstract_mesh_reprs_and_errors_match_jax(jax):
    for args in (((2, 4), ("X", "Y")), ((), ())):
        assert repr(AbstractMesh(*args)) == repr(jax.sharding.AbstractMesh(*args))
    assert repr(get_abstract_mesh()) == repr(jax.sharding.get_abstract_mesh())
    for lib, am, mesh in ((sl.sharding, AbstractMesh((2, 4), ("X", "Y")), sl.make_mesh((2, 4), ("X", "Y"))),
                          (jax.sharding, jax.sharding.AbstractMesh((2, 4), ("X", "Y")), jax.make_mesh((2, 4), ("X", "Y")))):
        with pytest.raises(ValueError, match="(?i)expected mesh of type `jax.sharding.AbstractMesh`"):
            lib.use_abstract_mesh(mesh)
        with pytest.raises(ValueError, match="use_abstract_mesh cannot change the size of the mesh"):
            with lib.use_abstract_mesh(type(am)((4,), ("X",))):
                with lib.use_abstract_mesh(am):
                    pass
        with pytest.raises(ValueError, match="AbstractMesh does not implement __enter__"):
            with am:
                pass


def test_get_abstract_mesh_follows_set_mesh_use_abstract_mesh_and_shard_map():
    mesh = sl.make_mesh((2, 4), ("X", "Y"))
    assert get_abstract_mesh().empty
    with sl.set_mesh(mesh):
        assert get_abstract_mesh() == mesh.abstract_mesh and sl.get_mesh() is mesh
        with use_abstract_mesh(AbstractMesh((4, 2), ("a", "b"))):
            assert get_abstract_mesh().axis_names == ("a", "b")
        seen = []
        sl.shard_map(lambda v: seen.append(get_abstract_mesh()) or v, in_specs=P("X"), out_specs=P("X"))(np.ones(4))
        assert seen[0].axis_types == (AxisType.Manual,) * 2 and seen[0].shape == mesh.shape
    assert sl.get_mesh() is None and get_abstract_mesh().empty
    ctx = sl.set_mesh(mesh)  # the statement form sets it until changed
    try:
        assert sl.sharding.get_mesh() is mesh
    finally:
        ctx.__exit__(None, None, None)
    assert sl.get_mesh() is None


@jaxmark
def test_sharding_get_mesh_is_jax_s_empty_mesh_when_none_is_set(jax):
    ours, theirs = sl.sharding.get_mesh(), jax.sharding.get_mesh()
    assert repr(ours) == repr(theirs) and str(ours) == str(theirs) and ours.empty and theirs.empty
    assert sl.get_mesh() is None  # shardlab's top-level get_mesh (JAX has none) keeps None
    mesh = sl.make_mesh((2,), ("x",))
    with sl.set_mesh(mesh):
        assert sl.sharding.get_mesh() is mesh and not mesh.empty


@jaxmark
def test_with_mesh_is_deprecated_and_sets_no_context_mesh_as_in_jax(jax):
    ours, theirs = sl.make_mesh((2, 4), ("X", "Y")), jax.make_mesh((2, 4), ("X", "Y"))
    for lib, mesh, put in ((sl, ours, sl.device_put), (jax, theirs, jax.device_put)):
        with pytest.warns(DeprecationWarning, match="jax.set_mesh"):
            with mesh:
                assert lib.sharding.get_abstract_mesh().empty
                with pytest.raises(ValueError):
                    put(np.ones(8), P("X") if lib is sl else jax.P("X"))
    with pytest.raises(ValueError, match="Expected mesh of type `jax.sharding.Mesh`"):
        jax.set_mesh("x")
    with pytest.raises(ValueError, match=r"^\[set_mesh\] expected mesh of type `shardlab.sharding.Mesh`"):
        sl.set_mesh("x")


# -- PartitionSpec ------------------------------------------------------------------------------
SPECS = [((), {}), (("X",), {}), (("X", None), {}), ((("X", "Y"), None), {}), ((("X",),), {}),
         ((None,), {"unreduced": {"Y"}}), ((), {"reduced": {"Y"}}), (("X",), {"unreduced": {"Y"}, "reduced": {"Z"}}),
         ((["X", "Y"],), {})]


@jaxmark
@pytest.mark.parametrize("entries,kw", SPECS, ids=[str(i) for i in range(len(SPECS))])
def test_partition_spec_repr_is_jax_s(jax, entries, kw):
    assert repr(P(*entries, **kw)) == repr(jax.P(*entries, **kw))


@jaxmark
def test_partition_spec_equality_is_jax_s(jax):
    pairs = [(("X",), ("X", None)), ((("X",),), ("X",)), (("X",), ("X",)), ((None,), ())]
    for a, b in pairs:
        assert (P(*a) == P(*b)) == (jax.P(*a) == jax.P(*b)), (a, b)
    assert (P("X") == ("X",)) == (jax.P("X") == ("X",)) is False
    assert P("X", unreduced={"Y"}) != P("X") and P(reduced={"Y"}) == P(reduced=frozenset({"Y"}))
    assert hash(P(("X",))) == hash(P("X"))
    assert P("X") + P(None, unreduced={"Y"}) == P("X", None, unreduced={"Y"}) and P("X") + (None,) == P("X", None)
    assert P("X", None).update(unreduced={"Y"}).unreduced == {"Y"} and P("a", "b").index("b") == 1


@jaxmark
@pytest.mark.parametrize("entries,kw,cls", [
    (("X",), {"unreduced": {"X"}}, ValueError),           # a partition that is also unreduced
    ((), {"unreduced": {"X"}, "reduced": {"X"}}, ValueError),
    ((), {"unreduced": ["X"]}, TypeError),                 # a list, not a set
    ((), {"reduced": {None}}, ValueError),
])
def test_partition_spec_validation_is_jax_s(jax, entries, kw, cls):
    with pytest.raises(cls) as theirs:
        jax.P(*entries, **kw)
    with pytest.raises(cls) as ours:
        P(*entries, **kw)
    assert str(ours.value).split(".")[0] == str(theirs.value).split(".")[0]


# -- NamedSharding, SingleDeviceSharding, Sharding ----------------------------------------------
@jaxmark
@pytest.mark.parametrize("spec", [P(), P("X"), P(None, ("X", "Y")), P("Y", "X")])
def test_named_sharding_repr_and_properties_match_jax(jax, spec):
    mesh, jmesh = sl.make_mesh((2, 4), ("X", "Y")), jax.make_mesh((2, 4), ("X", "Y"))
    jspec = jax.P(*spec)
    ours, theirs = NamedSharding(mesh, spec), jax.sharding.NamedSharding(jmesh, jspec)
    assert repr(ours) == repr(theirs) and ours.memory_kind == theirs.memory_kind
    assert ours.shard_shape((8, 16)) == theirs.shard_shape((8, 16))
    assert ours.is_fully_replicated == theirs.is_fully_replicated and ours.num_devices == theirs.num_devices
    assert {d.id for d in ours.addressable_devices} == {d.id for d in theirs.addressable_devices}
    assert ours.is_fully_addressable == theirs.is_fully_addressable
    assert repr(ours.with_spec(P("X"))) == repr(theirs.update(spec=jax.P("X")))
    assert ours.is_equivalent_to(NamedSharding(mesh, P(*spec, None)), 3) == \
        theirs.is_equivalent_to(jax.sharding.NamedSharding(jmesh, jax.P(*jspec, None)), 3)
    am, jam = mesh.abstract_mesh, jax.sharding.AbstractMesh((2, 4), ("X", "Y"), _jtypes(jax, mesh.axis_types))
    assert repr(NamedSharding(am, spec)) == repr(jax.sharding.NamedSharding(jam, jspec))  # no memory_kind


@jaxmark
def test_unreduced_sharding_describes_an_unreduced_array(jax):
    mesh = sl.make_mesh((2, 4), ("X", "Y"))
    s = NamedSharding(mesh, P("X", unreduced={"Y"}))
    js = jax.sharding.NamedSharding(jax.make_mesh((2, 4), ("X", "Y")), jax.P("X", unreduced={"Y"}))
    assert repr(s) == repr(js) and s.is_fully_replicated is js.is_fully_replicated is False
    x = np.arange(32.0, dtype=np.float32).reshape(8, 4)
    a = sl.device_put(x, s)
    assert a.unreduced == {"Y"} and a.sharding == s
    np.testing.assert_array_equal(np.asarray(a), x)  # the partials add up to the value
    assert str(sl.typeof(a)) == "float32[8@X,4]{U:Y}" and sl.typeof(a).sharding.spec == P("X", None, unreduced={"Y"})
    assert repr(a) == f"Array(shape=(8, 4), dtype=float32, sharding={s})"  # JAX's repr of an unreduced array


@jaxmark
def test_unreduced_needs_explicit_mesh_axes_as_in_jax(jax):
    auto = (AxisType.Auto, AxisType.Auto)
    with pytest.raises(ValueError, match="Unreduced axes can only refer to mesh axes that is of type `Explicit`"):
        jax.sharding.NamedSharding(jax.make_mesh((2, 4), ("X", "Y"), _jtypes(jax, auto)), jax.P(unreduced={"Y"}))
    with pytest.raises(ValueError, match=r"\[NamedSharding\] Unreduced axes can only refer to mesh axes that is of type"):
        NamedSharding(sl.make_mesh((2, 4), ("X", "Y"), auto), P(unreduced={"Y"}))
    with pytest.raises(ValueError, match="Unreduced axes Z is not found"):
        NamedSharding(sl.make_mesh((2, 4), ("X", "Y")), P(unreduced={"Z"}))


@jaxmark
@pytest.mark.parametrize("spec,name", [(("X", "X"), "DuplicateSpecError"), ((("X", "Y"), "Y"), "DuplicateSpecError"),
                                        (("Z",), "ValueError")])
def test_bad_specs_raise_jax_s_classes(jax, spec, name):
    with pytest.raises(Exception) as theirs:
        jax.sharding.NamedSharding(jax.make_mesh((2, 4), ("X", "Y")), jax.P(*spec))
    assert type(theirs.value).__name__ == name
    with pytest.raises(ValueError) as ours:  # shardlab's DuplicateSpecError is a ValueError too
        NamedSharding(sl.make_mesh((2, 4), ("X", "Y")), P(*spec))
    assert type(ours.value).__name__ == name and "[NamedSharding]" in str(ours.value)


@jaxmark
def test_single_device_sharding_and_the_sharding_base(jax):
    s, js = SingleDeviceSharding(sl.devices()[3]), jax.sharding.SingleDeviceSharding(jax.devices()[3])
    assert repr(s).replace("VirtualDevice", "CpuDevice") == repr(js)
    assert s.is_fully_replicated and js.is_fully_replicated and s.num_devices == js.num_devices == 1
    assert s.devices_indices_map((4, 2)) == {sl.devices()[3]: (slice(None), slice(None))}
    assert s == SingleDeviceSharding(sl.devices()[3]) and s != SingleDeviceSharding(sl.devices()[0])
    named = NamedSharding(sl.make_mesh((2,), ("x",)), P("x"))
    assert isinstance(s, Sharding) and isinstance(named, Sharding) and not isinstance(P(), Sharding)
    assert isinstance(js, jax.sharding.Sharding)
    with pytest.raises(TypeError, match=r"^\[SingleDeviceSharding\]"):
        SingleDeviceSharding(3)


# -- typeof ---------------------------------------------------------------------------------------
@jaxmark
@pytest.mark.parametrize("types,spec", [
    (None, P("X", "Y")), (None, P("X")), (None, P(None, ("X", "Y"))), (None, P()),
    ((AxisType.Auto, AxisType.Auto), P("X", "Y")), ((AxisType.Explicit, AxisType.Auto), P("X", "Y")),
    ((AxisType.Auto, AxisType.Explicit), P(("X", "Y"))),
])
def test_typeof_of_a_global_array_is_jax_s(jax, types, spec):
    x = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    a = sl.device_put(x, NamedSharding(sl.make_mesh((2, 4), ("X", "Y"), types), spec))
    j = jax.device_put(x, jax.sharding.NamedSharding(jax.make_mesh((2, 4), ("X", "Y"), _jtypes(jax, types)),
                                                     jax.P(*spec)))
    t, jt = sl.typeof(a), jax.typeof(j)
    assert str(t) == str(jt) and repr(t) == repr(jt)
    assert t.shape == jt.shape and t.dtype == jt.dtype and t.ndim == jt.ndim and t.weak_type == jt.weak_type
    assert t.sharding.spec == P(*jt.sharding.spec)  # padded to the rank, Explicit axes only
    assert str(t.sharding.mesh) == str(jt.sharding.mesh).split(", device_kind")[0] + ")"


@jaxmark
@pytest.mark.parametrize("value", [1.0, 3, True, 2 + 1j, np.float64(2.0), np.int64(3), np.ones(3),
                                   np.zeros((2, 3), np.int8), np.ones(2, np.float64)], ids=repr)
def test_typeof_of_host_values_is_jax_s(jax, value):
    t, jt = sl.typeof(value), jax.typeof(value)
    assert str(t) == str(jt) and repr(t) == repr(jt) and t.weak_type == jt.weak_type and t.dtype == jt.dtype
    assert t.sharding.spec == P(*jt.sharding.spec) and t.sharding.mesh.empty


@jaxmark
def test_typeof_inside_shard_map_shows_the_varying_axes(jax):
    x = np.ones((8, 4), np.float32)
    mesh, jmesh = sl.make_mesh((2, 4), ("X", "Y")), jax.make_mesh((2, 4), ("X", "Y"))
    seen = {}

    def body(lib, key):
        def f(a, b):
            seen[key] = (str(lib.typeof(a)), repr(lib.typeof(a)), str(lib.typeof(b)),
                         lib.typeof(a).sharding.mesh.axis_types, str(lib.typeof(lib.lax.psum(a, "X"))))
            return a
        return f

    a = sl.device_put(x, NamedSharding(mesh, P("X")))
    sl.shard_map(body(sl, "ours"), mesh=mesh, in_specs=(P("X"), P()), out_specs=P("X"))(a, x)
    ja = jax.device_put(x, jax.sharding.NamedSharding(jmesh, jax.P("X")))
    jax.shard_map(body(jax, "jax"), mesh=jmesh, in_specs=(jax.P("X"), jax.P()), out_specs=jax.P("X"))(ja, x)
    ours, theirs = seen["ours"], seen["jax"]
    assert ours[:3] == theirs[:3] == ("float32[4,4]{V:X}", "ShapedArray(float32[4,4]{V:X})", "float32[8,4]")
    assert [t.name for t in ours[3]] == [t.name for t in theirs[3]] == ["Manual", "Manual"]
    assert ours[4] == theirs[4]


@jaxmark
@pytest.mark.parametrize("value", ["a", [1, 2], None, {"a": 1}, object()], ids=repr)
def test_typeof_of_a_non_array_raises_jax_s_type_error(jax, value):
    with pytest.raises(TypeError) as theirs:
        jax.typeof(value)
    with pytest.raises(TypeError) as ours:
        sl.typeof(value)
    assert str(ours.value) == str(theirs.value)


def test_typeof_of_abstract_values():
    m = sl.make_mesh((16, 16), ("x", "y"), abstract=True)
    x = sl.ShapeDtypeStruct((1024, 512), sl.dtypes.bfloat16, sharding=NamedSharding(m, P("x", "y")))
    seen = []
    sl.eval_shape(lambda v: seen.append(str(sl.typeof(v))) or v, x)
    assert seen == [str(sl.typeof(x))] == ["bfloat16[1024@x,512@y]"]


@jaxmark
def test_typeof_of_a_shape_dtype_struct_is_jax_s(jax):
    assert str(sl.typeof(sl.ShapeDtypeStruct((2, 3), np.float32))) == \
        str(jax.typeof(jax.ShapeDtypeStruct((2, 3), np.float32))) == "float32[2,3]"


def test_meshes_specs_and_shardings_pickle():
    # (JAX pickles a PartitionSpec and an abstract mesh; its CPU devices, so its concrete
    # meshes, do not pickle. shardlab's virtual devices do.)
    import pickle

    values = [sl.make_mesh((2, 4), ("X", "Y"), hardware="tpu-v5e"), AbstractMesh((16, 16), ("x", "y")),
              sl.Mesh(np.array(sl.devices())[::-1].reshape(4, 2), ("a", "b")), P("X", unreduced={"Y"}),
              NamedSharding(sl.make_mesh((2, 4), ("X", "Y")), P("X", unreduced={"Y"}))]
    for v in values:
        back = pickle.loads(pickle.dumps(v))
        assert back == v and type(back) is type(v) and repr(back) == repr(v)
