"""Bad input and faults across ranks: a mesh the ranks cannot split, ranks running different
collectives."""

import numpy as np
import pytest

import shardlab as sl
from shardlab import P, lax

RANKS = sl.process_count()
multi = pytest.mark.skipif(RANKS == 1, reason="needs mpirun -n 2 or more")


@multi
def test_mesh_not_divisible_by_ranks_is_a_clear_error():
    mesh = sl.make_mesh((3,), ("x",), devices=sl.devices()[:3])
    with pytest.raises(ValueError, match=rf"3 devices are not divisible by {RANKS} ranks"):  # at the first use
        sl.device_put(np.ones((3, 4), np.float32), sl.NamedSharding(mesh, P("x")))
    with pytest.raises(ValueError, match=rf"3 devices are not divisible by {RANKS} ranks"):
        sl.shard_map(lambda a: a * 2, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(np.ones((3, 4), np.float32))


@multi
def test_different_collectives_on_different_ranks_are_named():
    mesh = sl.make_mesh((8,), ("x",))
    x = sl.device_put(np.ones((8, 4), np.float32), sl.NamedSharding(mesh, P("x")))
    if sl.process_index() == 0:
        f = lambda a: lax.psum(a, "x")  # noqa: E731
    else:
        f = lambda a: lax.all_gather(a, "x", tiled=True)  # noqa: E731
    with pytest.raises(RuntimeError, match=r"(?s)ranks run different programs.*rank 0: psum.*rank 1: all_gather"):
        sl.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P())(x)


def test_addressable_devices_are_this_ranks_block():
    mesh = sl.make_mesh((2, 4), ("x", "y"))
    mine = sl.distributed.addressable_devices(mesh)
    assert len(mine) == mesh.size // RANKS
    ids = [d.id for d in mine]
    r = sl.process_index()
    assert ids == list(range(r * len(ids), (r + 1) * len(ids)))  # contiguous blocks of device ids
    seen = []

    def body(a):
        b = a + 1
        seen.append(sl.distributed.holds_block(b.storage))  # inside shard_map: only this rank's devices
        return b

    sl.shard_map(body, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y"))(
        sl.device_put(np.zeros((4, 8), np.float32), sl.NamedSharding(mesh, P("x", "y"))))
    assert seen == [RANKS > 1]
