import numpy as np
import pytest

import shardlab as sl
from shardlab import P


def test_jit_runs_eagerly_and_places_outputs():
    mesh = sl.make_mesh((4, 2), ("x", "y"))
    calls = []

    @sl.jit
    def f(a):
        calls.append(1)
        return a + 1

    np.testing.assert_array_equal(f(np.zeros(4)), np.ones(4))
    assert calls == [1]
    g = sl.jit(lambda a, b: (a, {"b": b}), out_shardings=(sl.NamedSharding(mesh, P("x")),
                                                          {"b": sl.NamedSharding(mesh, P(None, "y"))}))
    a, d = g(np.arange(8.0), np.ones((2, 4)))
    assert a.sharding.spec == P("x") and d["b"].sharding.spec == P(None, "y")
    np.testing.assert_array_equal(np.asarray(a), np.arange(8.0))
    assert sl.block_until_ready(a) is a


def test_jit_in_shardings_and_decorator_factory():
    mesh = sl.make_mesh((2,), ("x",))
    sharding = sl.NamedSharding(mesh, P("x"))

    @sl.jit(out_shardings=sharding)
    def double(a):
        return np.asarray(a) * 2

    out = double(sl.device_put(np.arange(4.0), sharding))
    assert out.sharding == sharding
    h = sl.jit(lambda a: a, in_shardings=sharding)
    assert h(np.arange(4.0)).sharding == sharding
    with pytest.raises(ValueError, match=r"\[jit\] 2 in_shardings for 1 arguments"):
        sl.jit(lambda a: a, in_shardings=(sharding, sharding))(np.ones(2))
    with pytest.raises(TypeError, match=r"\[jit\] expected a function"):
        sl.jit(3)
