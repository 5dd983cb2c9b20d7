"""Abstract mode: eval_shape, ShapeDtypeStruct, abstract meshes. For every program small
enough to run for real, the abstract ledger equals the real one, event for event."""

import numpy as np
import pytest

import shardlab as sl
import shardlab.numpy as jnp
from shardlab import P

from test_autodiff import PROGRAMS, namespace


def _build(name, abstract_mesh=False, hardware=None):
    mesh_shape, names, build = PROGRAMS[name]
    mesh = sl.make_mesh(mesh_shape, names, abstract=abstract_mesh, hardware=hardware)
    body, in_specs, out_spec, args = build(namespace("shardlab"), np.random.default_rng(0))
    f = sl.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_spec)

    def loss(*xs):
        return jnp.sum(f(*xs) ** 2)

    placed = [sl.device_put(a, sl.NamedSharding(mesh, s)) if not abstract_mesh else
              sl.ShapeDtypeStruct(a.shape, a.dtype, sharding=sl.NamedSharding(mesh, s))
              for a, s in zip(args, in_specs)]
    return loss, placed, len(args)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_abstract_ledger_equals_the_real_one_forward_and_backward(name):
    loss, placed, n = _build(name, hardware="tpu-v5e")
    step = sl.value_and_grad(loss, argnums=tuple(range(n)))
    with sl.Ledger() as real:
        value, grads = step(*placed)
    structs = [sl.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) for x in placed]
    with sl.Ledger() as abstract:
        a_value, a_grads = sl.eval_shape(step, *structs)
    assert real.program_events() == abstract.program_events()
    assert [e["seconds"] for e in real.events] == [e["seconds"] for e in abstract.events]
    assert a_value.shape == () and [g.shape for g in a_grads] == [np.shape(g) for g in grads]
    assert all(isinstance(g, sl.ShapeDtypeStruct) and g.sharding == x.sharding for g, x in zip(a_grads, placed))


@pytest.mark.parametrize("name", ["fsdp_mlp", "megatron_mlp", "attention"])
def test_an_abstract_mesh_records_the_same_events(name):
    loss, placed, n = _build(name)
    with sl.Ledger() as real:
        sl.grad(loss, argnums=tuple(range(n)))(*placed)
    loss_a, structs, _ = _build(name, abstract_mesh=True)
    with sl.Ledger() as abstract:
        sl.eval_shape(sl.grad(loss_a, argnums=tuple(range(n))), *structs)
    assert real.program_events() == abstract.program_events()


def test_a_large_abstract_mesh_allocates_nothing():
    mesh = sl.make_mesh((16, 20, 28), ("x", "y", "z"), hardware="tpu-v5p", abstract=True)
    assert mesh.size == 8960 and mesh._devices is None
    w = sl.ShapeDtypeStruct((8192 * 16, 28672), np.float32, sharding=sl.NamedSharding(mesh, P("x", "z")))
    f = sl.shard_map(lambda a: sl.lax.psum(sl.lax.all_gather(a, "x", tiled=True), "y"), mesh=mesh,
                     in_specs=P("x", "z"), out_specs=P(None, "z"))
    with sl.Ledger() as ledger:
        out = sl.eval_shape(f, w)
    assert out.shape == (8192 * 16, 28672) and out.sharding.spec == P(None, "z")
    gather, psum = ledger.events
    assert gather["bytes_out"] == 8192 * 16 * 1024 * 4 and gather["group_size"] == 16
    assert psum["group_size"] == 20 and psum["bytes_sent"] == pytest.approx(2 * 19 / 20 * gather["bytes_out"])
    assert gather["seconds"] > 0 and mesh._devices is None


def test_abstract_values_refuse_to_give_data():
    mesh = sl.make_mesh((4,), ("x",), abstract=True)
    s = sl.ShapeDtypeStruct((8, 2), np.float32, sharding=sl.NamedSharding(mesh, P("x")))

    def body(a):
        with pytest.raises(TypeError, match=r"\[device_values\] the value is abstract"):
            sl.debug.device_values(a)
        return a

    out = sl.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(s)
    with pytest.raises(TypeError, match=r"abstract .* no data"):
        np.asarray(out)
    with pytest.raises(TypeError, match=r"\[ShardedArray\] .* abstract"):
        out.addressable_shards


def test_shape_dtype_struct_and_eval_shape_errors():
    mesh = sl.make_mesh((4,), ("x",))
    with pytest.raises(ValueError, match=r"\[ShapeDtypeStruct\] dimension 0 of shape \(6, 2\) has size 6"):
        sl.eval_shape(lambda a: a, sl.ShapeDtypeStruct((6, 2), np.float32, sharding=sl.NamedSharding(mesh, P("x"))))
    with pytest.raises(ValueError, match=r"negative"):
        sl.ShapeDtypeStruct((-1, 2), np.float32)
    with pytest.raises(TypeError, match=r"\[eval_shape\] fun must be callable"):
        sl.eval_shape(3)
    with pytest.raises(ValueError, match=r"\[make_mesh\] .* more than a real mesh supports"):
        sl.make_mesh((2 ** 40,), ("x",))
    with pytest.raises(ValueError, match=r"more than an abstract mesh supports"):
        sl.make_mesh((2 ** 31, 2 ** 31, 4), ("x", "y", "z"), abstract=True)


def test_eval_shape_of_plain_functions():
    out = sl.eval_shape(lambda a, b: jnp.tanh(a @ b).sum(axis=0), sl.ShapeDtypeStruct((3, 4), np.float32),
                        np.zeros((4, 5), np.float32))
    assert out == sl.ShapeDtypeStruct((5,), np.float32)


def test_shape_dtype_struct_takes_a_bare_spec_with_a_mesh_set():
    """As JAX: ShapeDtypeStruct(..., sharding=P(...)) takes the mesh set by set_mesh; without
    one, using it says how to give the mesh."""
    mesh = sl.make_mesh((4,), ("x",))
    with sl.set_mesh(mesh):
        s = sl.ShapeDtypeStruct((8, 2), np.float32, sharding=P("x"))
    assert s.sharding == sl.NamedSharding(mesh, P("x"))
    out = sl.eval_shape(lambda a: a * 2, s)
    assert out.shape == (8, 2) and out.sharding.is_equivalent_to(s.sharding, 2)
    loose = sl.ShapeDtypeStruct((8, 2), np.float32, sharding=P("x"))
    with pytest.raises(ValueError, match=r"\[ShapeDtypeStruct\] got a bare .* no mesh is set"):
        sl.eval_shape(lambda a: a * 2, loose)
