"""shardlab.tree_util / shardlab.tree against jax.tree_util / jax.tree on a corpus of trees,
and registered node types passing through grad, shard_map, jit and eval_shape."""

import collections
import dataclasses
import functools
import operator

import numpy as np
import pytest

import shardlab as sl
import shardlab.numpy as jnp
from shardlab import P
from shardlab import tree_util as tu

jax = pytest.importorskip("jax")
jtu = jax.tree_util

Point = collections.namedtuple("Point", "x y")


class MyDict(dict):
    pass


class MyTuple(tuple):
    pass


def corpus():
    return [
        1, None, (), [], {}, (1,), (1, 2), [1, (2, None)], {"b": 1, "a": [2, 3]}, Point(1, (2, 3)),
        collections.OrderedDict([("b", 1), ("a", 2)]), collections.defaultdict(list, {"z": 1, "a": 2}),
        {"a": None}, [None, 1], [[[]]], {"x": {"y": {"z": (1, [2, {"w": 3}])}}}, MyDict(a=1), MyTuple((1, 2)),
        {1: "a", 2: "b"}, (Point(1, 2), [Point(3, None)]), "s", np.arange(3), [np.ones(2), {"k": np.zeros(1)}],
    ]


def _same_leaves(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x is y


@pytest.mark.jax
@pytest.mark.parametrize("i", range(len(corpus())))
def test_flatten_like_jax(i):
    t, jt = corpus()[i], corpus()[i]
    leaves, d = tu.tree_flatten(t)
    jleaves, jd = jtu.tree_flatten(jt)
    assert repr(d) == repr(jd) and str(d) == str(jd)
    assert (d.num_leaves, d.num_nodes) == (jd.num_leaves, jd.num_nodes)
    assert len(leaves) == len(jleaves)
    for x, y in zip(leaves, jleaves):
        assert type(x) is type(y) and np.array_equal(x, y)
    _same_leaves(leaves, tu.tree_leaves(t))
    assert tu.treedef_is_leaf(d) == jtu.treedef_is_leaf(jd)
    back = tu.tree_unflatten(d, leaves)
    assert type(back) is type(t) and tu.tree_structure(back) == d
    assert repr(tu.tree_unflatten(d, range(d.num_leaves))) == repr(jtu.tree_unflatten(jd, range(jd.num_leaves)))
    paths = [(tu.keystr(p), tu.keystr(p, simple=True, separator="/")) for p, _ in tu.tree_leaves_with_path(t)]
    jpaths = [(jtu.keystr(p), jtu.keystr(p, simple=True, separator="/")) for p, _ in jtu.tree_leaves_with_path(jt)]
    assert paths == jpaths
    assert [repr(k) for p, _ in tu.tree_leaves_with_path(t) for k in p] == \
        [repr(k) for p, _ in jtu.tree_leaves_with_path(jt) for k in p]
    assert [repr(c) for c in d.children()] == [repr(c) for c in jd.children()]
    assert tu.treedef_children(d) == d.children()
    if not (tu.treedef_is_leaf(d) and d.num_leaves == 1):
        nd, jnd = d.node_data(), jd.node_data()
        assert nd[0] is jnd[0] and (list(nd[1]) if isinstance(nd[1], tuple) else nd[1]) == \
            (list(jnd[1]) if isinstance(jnd[1], tuple) else jnd[1])


@pytest.mark.jax
def test_tree_map_multiple_trees_and_is_leaf():
    a = {"x": [1, 2], "y": (3, None)}
    b = {"x": [10, 20], "y": (30, None)}
    assert tu.tree_map(lambda u, v: u + v, a, b) == jtu.tree_map(lambda u, v: u + v, a, b)
    # the other trees may be deeper than the first (its leaves are prefixes)
    c = [1, 5]
    d = [(2, 3), {"q": 4}]
    assert tu.tree_map(lambda u, v: (u, v), c, d) == jtu.tree_map(lambda u, v: (u, v), c, d)
    is_list = lambda x: isinstance(x, list)  # noqa: E731
    size = lambda v: len(v) if isinstance(v, list) else v  # noqa: E731
    assert tu.tree_map(size, a, is_leaf=is_list) == jtu.tree_map(size, a, is_leaf=is_list) == {"x": 2, "y": (3, None)}
    is_none = lambda x: x is None  # noqa: E731
    assert tu.tree_leaves([None, 1], is_leaf=is_none) == jtu.tree_leaves([None, 1], is_leaf=is_none)
    assert sl.tree.map(lambda x: x * 2, a) == jax.tree.map(lambda x: x * 2, a)


MISMATCHES = [
    ((1, 2), (1, 2, 3)), ({"a": 1}, {"b": 1}), ([1, 2], (1, 2)), (Point(1, 2), (1, 2)), (None, 1),
    ({"a": 1, "b": 2}, {"a": 1, "c": 2, "d": 3}), ([1, None], [2, 3]), ({"a": [1, 2]}, {"a": [1]}),
]


@pytest.mark.jax
@pytest.mark.parametrize("a,b", MISMATCHES)
def test_mismatch_errors_like_jax(a, b):
    with pytest.raises(ValueError) as ours:
        tu.tree_map(lambda x, y: x, a, b)
    with pytest.raises(ValueError) as theirs:
        jtu.tree_map(lambda x, y: x, a, b)
    if isinstance(a, dict) and len(a) != len(b):  # the symmetric difference is a set: order varies
        assert str(ours.value).split("so the symmetric")[0] == str(theirs.value).split("so the symmetric")[0]
    else:
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError) as ours:
        tu.tree_structure(a).flatten_up_to(b)
    with pytest.raises(ValueError) as theirs:
        jtu.tree_structure(a).flatten_up_to(b)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.jax
def test_treedef_equality_hash_and_unflatten_errors():
    assert tu.tree_structure({"a": 1}) == tu.tree_structure({"a": 2})
    assert tu.tree_structure({"a": 1}) != tu.tree_structure({"b": 1})
    assert tu.tree_structure((1, 2)) != tu.tree_structure([1, 2])
    assert tu.tree_structure(Point(1, 2)) != tu.tree_structure((1, 2))
    assert hash(tu.tree_structure({"a": (1, 2)})) == hash(tu.tree_structure({"a": (3, 4)}))
    assert tu.tree_structure(1) != 5
    d, jd = tu.tree_structure([1, 2]), jtu.tree_structure([1, 2])
    for leaves in ([1], [1, 2, 3]):
        with pytest.raises(ValueError) as ours:
            d.unflatten(leaves)
        with pytest.raises(ValueError) as theirs:
            jd.unflatten(leaves)
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError, match="Comparator raised exception"):
        tu.tree_structure({1: 1, "a": 2})
    inner = tu.tree_structure({"a": 0, "b": 0})
    assert repr(tu.tree_structure((1, [2])).compose(inner)) == \
        repr(jtu.tree_structure((1, [2])).compose(jtu.tree_structure({"a": 0, "b": 0})))
    assert repr(tu.treedef_tuple([tu.tree_structure(1), tu.tree_structure([1])])) == \
        repr(jtu.treedef_tuple([jtu.tree_structure(1), jtu.tree_structure([1])]))


@pytest.mark.jax
def test_reduce_all_transpose_broadcast_all_leaves():
    t = {"x": 1, "y": [2, 3]}
    assert tu.tree_reduce(operator.add, t) == jtu.tree_reduce(operator.add, t)
    assert tu.tree_reduce(operator.add, [], 7) == jtu.tree_reduce(operator.add, [], 7)
    with pytest.raises(TypeError):
        tu.tree_reduce(operator.add, [])
    assert tu.tree_reduce_associative(operator.add, [1, 2, 3, 4]) == 10
    assert tu.tree_all([1, True, None]) == jtu.tree_all([1, True, None])
    assert tu.tree_all([0]) == jtu.tree_all([0])
    outer, inner = tu.tree_structure([0, 0]), tu.tree_structure((0, 0))
    assert tu.tree_transpose(outer, inner, [(1, 2), (3, 4)]) == ([1, 3], [2, 4])
    assert tu.tree_transpose(outer, None, [(1, 2), (3, 4)]) == \
        jtu.tree_transpose(jtu.tree_structure([0, 0]), None, [(1, 2), (3, 4)])
    with pytest.raises(TypeError) as ours:
        tu.tree_transpose(outer, inner, [(1, 2), (3,)])
    with pytest.raises(TypeError) as theirs:
        jtu.tree_transpose(jtu.tree_structure([0, 0]), jtu.tree_structure((0, 0)), [(1, 2), (3,)])
    assert str(ours.value) == str(theirs.value)
    assert sl.tree.broadcast((1, 2), ((0, 0), [0, 0, 0])) == jax.tree.broadcast((1, 2), ((0, 0), [0, 0, 0]))
    for xs in ([1, 2], [None], [[1]], []):
        assert tu.all_leaves(xs) == jtu.all_leaves(xs)
    assert tu.flatten_one_level({"b": 1, "a": 2}) == tuple(map(tuple, jtu.flatten_one_level({"b": 1, "a": 2}))) \
        or tu.flatten_one_level({"b": 1, "a": 2}) == ([2, 1], ("a", "b"))
    with pytest.raises(ValueError, match="can't tree-flatten type"):
        tu.flatten_one_level(1)
    for typ in (Point, int, type(None), dict, collections.OrderedDict):
        assert tu.is_tree_node(typ) == jtu.is_tree_node(typ)


@pytest.mark.jax
def test_key_paths():
    t = {"foo": {"bar": {"baz": 1, "bat": [2, 3]}}, "p": Point(4, 5)}
    ours = [(tu.keystr(p), x) for p, x in tu.tree_leaves_with_path(t)]
    assert ours == [(jtu.keystr(p), x) for p, x in jtu.tree_leaves_with_path(t)]
    got = tu.tree_map_with_path(lambda p, x, y: (tu.keystr(p), x + y), t, t)
    want = jtu.tree_map_with_path(lambda p, x, y: (jtu.keystr(p), x + y), t, t)
    assert got == want
    by_path = lambda p, x: isinstance(x, list)  # noqa: E731
    assert [tu.keystr(p) for p, _ in tu.tree_leaves_with_path(t, by_path, is_leaf_takes_path=True)] == \
        [jtu.keystr(p) for p, _ in jtu.tree_leaves_with_path(t, by_path, is_leaf_takes_path=True)]
    pairs, d = tu.tree_flatten_with_path(t)
    assert d == tu.tree_structure(t)
    k = tu.DictKey("a")
    assert k == tu.DictKey("a") and k != tu.DictKey("b") and hash(k) == hash(tu.DictKey("a"))
    assert k != tu.GetAttrKey("a")
    match tu.SequenceKey(3):
        case tu.SequenceKey(idx=i):
            assert i == 3
    assert str(tu.FlattenedIndexKey(2)) == str(jtu.FlattenedIndexKey(2))
    with pytest.raises(ValueError) as ours:
        tu.tree_map_with_path(lambda p, x, y: x, [1, 2], [1])
    with pytest.raises(ValueError) as theirs:
        jtu.tree_map_with_path(lambda p, x, y: x, [1, 2], [1])
    assert str(ours.value) == str(theirs.value)


# -- registration -----------------------------------------------------------------------------
def _make_classes():
    class Custom:
        def __init__(self, a, b, tag="t"):
            self.a, self.b, self.tag = a, b, tag

    class Keyed:
        def __init__(self, x, y):
            self.x, self.y = x, y

    @dataclasses.dataclass
    class DC:
        x: object
        y: object
        op: str = dataclasses.field(default="add", metadata=dict(static=True))

    @dataclasses.dataclass
    class DCExplicit:
        w: object
        name: str

    class Cls:
        def __init__(self, v, s):
            self.v, self.s = v, s

        def tree_flatten(self):
            return (self.v,), self.s

        @classmethod
        def tree_unflatten(cls, aux, children):
            return cls(children[0], aux)

    class KeyCls:
        def __init__(self, v):
            self.v = v

        def tree_flatten_with_keys(self):
            return ((tu.GetAttrKey("v"), self.v),), None

        @classmethod
        def tree_unflatten(cls, aux, children):
            return cls(*children)

    class Static(str):
        pass

    return Custom, Keyed, DC, DCExplicit, Cls, KeyCls, Static


def _register(lib, classes):
    Custom, Keyed, DC, DCExplicit, Cls, KeyCls, Static = classes
    lib.register_pytree_node(Custom, lambda c: ((c.a, c.b), c.tag), lambda tag, ch: Custom(*ch, tag))
    lib.register_pytree_with_keys(
        Keyed, lambda k: (((lib.GetAttrKey("x"), k.x), (lib.GetAttrKey("y"), k.y)), None), lambda _, c: Keyed(*c))
    lib.register_dataclass(DC)
    lib.register_dataclass(DCExplicit, data_fields=["w"], meta_fields=["name"])
    lib.register_pytree_node_class(Cls)
    lib.register_pytree_with_keys_class(KeyCls)
    lib.register_static(Static)


@pytest.mark.jax
def test_registered_nodes_like_jax():
    ours, theirs = _make_classes(), _make_classes()
    _register(tu, ours)
    _register(jtu, theirs)

    def build(C):
        Custom, Keyed, DC, DCExplicit, Cls, KeyCls, Static = C
        return [Custom(1, [2, 3]), Keyed(4, {"k": 5}), DC(6, (7,)), DCExplicit(8, "n"), Cls(9, "s"), KeyCls(10),
                Static("st"), tu.Partial(operator.add, 11) if C is ours else jtu.Partial(operator.add, 11)]

    t, jt = build(ours), build(theirs)
    leaves, d = tu.tree_flatten(t)
    jleaves, jd = jtu.tree_flatten(jt)
    assert leaves == jleaves
    assert repr(d).replace("_make_classes.<locals>.", "") == repr(jd).replace("_make_classes.<locals>.", "")
    assert [tu.keystr(p) for p, _ in tu.tree_leaves_with_path(t)] == \
        [jtu.keystr(p) for p, _ in jtu.tree_leaves_with_path(jt)]
    back = tu.tree_unflatten(d, [x * 10 for x in leaves])
    assert back[2] == ours[2](60, (70,)) and back[3].w == 80 and back[3].name == "n" and back[6] == "st"
    assert back[7](1) == 111
    # metadata is part of the structure
    Custom = ours[0]
    assert tu.tree_structure(Custom(1, 2, "u")) != tu.tree_structure(Custom(1, 2, "v"))
    with pytest.raises(ValueError) as e_ours:
        tu.tree_map(lambda x, y: x, Custom(1, 2, "u"), Custom(1, 2, "v"))
    with pytest.raises(ValueError) as e_theirs:
        jtu.tree_map(lambda x, y: x, theirs[0](1, 2, "u"), theirs[0](1, 2, "v"))
    assert str(e_ours.value).replace("_make_classes.<locals>.", "").split("<class")[0] == \
        str(e_theirs.value).replace("_make_classes.<locals>.", "").split("<class")[0]
    with pytest.raises(ValueError, match="Duplicate custom PyTreeDef type registration"):
        tu.register_pytree_node(Custom, lambda c: ((), None), lambda a, c: None)


def test_register_dataclass_errors_and_static_field():
    @dataclasses.dataclass
    class A:
        x: object
        y: object

    with pytest.raises(TypeError, match="must both be specified"):
        tu.register_dataclass(A, data_fields=["x"])
    with pytest.raises(ValueError, match="Missing fields"):
        tu.register_dataclass(A, data_fields=["x"], meta_fields=[])
    with pytest.raises(ValueError, match="must not overlap"):
        tu.register_dataclass(type("B", (), {}), data_fields=["x"], meta_fields=["x"])
    with pytest.raises(TypeError, match="not a dataclass"):
        tu.register_dataclass(type("C", (), {}))

    @tu.register_dataclass
    @dataclasses.dataclass
    class S:
        x: object
        mode: str = sl.tree.static(default="train")

    leaves, d = tu.tree_flatten(S(1.5))
    assert leaves == [1.5] and repr(d) == "PyTreeDef(CustomNode(S[('train',)], [*]))"


def test_partial_is_a_pytree():
    p = tu.Partial(functools.partial(operator.mul, 2), 3)
    assert p() == 6 and tu.tree_leaves(p) == [3]
    q = tu.tree_map(lambda v: v + 1, tu.Partial(operator.add, 1, 2))
    assert isinstance(q, tu.Partial) and q() == 5


# -- through the transforms --------------------------------------------------------------------
@dataclasses.dataclass
class Params:
    w: object
    b: object
    act: str = dataclasses.field(default="tanh", metadata=dict(static=True))


tu.register_dataclass(Params)


@pytest.mark.jax
def test_registered_dataclass_through_grad():
    w = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)
    b = np.array([0.1, -0.2], np.float32)
    x = np.ones((4, 3), np.float32)

    def loss(p, x, np_):
        return np_.sum(np_.tanh(x @ p.w + p.b) ** 2)

    g = sl.grad(lambda p: loss(p, x, jnp))(Params(w, b))

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class JParams:
        w: object
        b: object
        act: str = dataclasses.field(default="tanh", metadata=dict(static=True))

    jg = jax.jit(jax.grad(lambda p: loss(p, x, jax.numpy)))(JParams(w, b))
    assert isinstance(g, Params) and g.act == "tanh"
    np.testing.assert_allclose(np.asarray(g.w), np.asarray(jg.w), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(g.b), np.asarray(jg.b), rtol=1e-5, atol=1e-6)


def test_registered_node_through_shard_map_jit_and_eval_shape():
    mesh = sl.make_mesh((4,), ("x",))
    p = Params(np.arange(8, dtype=np.float32), np.ones(8, np.float32))
    f = sl.shard_map(lambda q: Params(q.w * 2, q.b + q.w, q.act), mesh=mesh,
                     in_specs=(Params(P("x"), P("x"), "tanh"),), out_specs=P("x"))
    out = f(p)
    assert isinstance(out, Params) and out.act == "tanh"
    np.testing.assert_array_equal(np.asarray(out.w), np.arange(8) * 2)
    np.testing.assert_array_equal(np.asarray(out.b), np.arange(8) + 1)
    j = sl.jit(lambda q: Params(q.w + 1, q.b, q.act))(p)
    assert isinstance(j, Params)
    np.testing.assert_array_equal(np.asarray(j.w), np.arange(8) + 1)
    shapes = sl.eval_shape(lambda q: Params(q.w[:2], q.b, q.act), p)
    assert isinstance(shapes, Params) and shapes.w.shape == (2,)


def test_shard_map_in_specs_prefix_errors_still_name_the_op():
    mesh = sl.make_mesh((2,), ("x",))
    f = sl.shard_map(lambda a, b: a, mesh=mesh, in_specs=(P("x"),), out_specs=P("x"))
    with pytest.raises(ValueError, match=r"\[shard_map\] in_specs has structure"):
        f(np.ones(2), np.ones(2))


def test_registered_node_through_device_put():
    mesh = sl.make_mesh((4,), ("x",))
    p = Params(np.arange(8.0), np.ones(8))
    out = sl.device_put(p, sl.NamedSharding(mesh, P("x")))
    assert isinstance(out, Params) and out.w.sharding.spec == P("x") and out.w.dtype == np.float32
    out = sl.device_put(p, Params(sl.NamedSharding(mesh, P("x")), sl.NamedSharding(mesh, P()), "tanh"))
    assert out.w.sharding.spec == P("x") and out.b.sharding.spec == P()
    np.testing.assert_array_equal(np.asarray(out.w), np.arange(8.0))
