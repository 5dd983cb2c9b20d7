"""Allocations that cannot fit end in one clear error (issue 29, reliability): MemoryError
``[op] needs N GiB, more than the M GiB this machine has; <what to do>``, from device_put, every
primitive's output, the global functions and the C++ core's buffers, never a bare
``std::bad_alloc`` or numpy's "array is too big" / "iterator is too large".

The machine's memory is pinned to 16 GiB where a case would otherwise depend on it, so every
case refuses before anything is allocated, whatever machine runs the tests.
"""

import re

import numpy as np
import pytest

import shardlab as sl
import shardlab._core as _core
import shardlab.numpy as jnp
from shardlab import P
from shardlab._src.arrays import storage
from shardlab._src.core import memory

MESH = sl.make_mesh((2, 4), ("x", "y"))
NEEDS = re.compile(r"^\[(\w+)\] needs (\d+(\.\d+)?) GiB, more than the [\d.]+ GiB this machine has; .+")


@pytest.fixture
def machine_16gib(monkeypatch):
    monkeypatch.setattr(memory, "total_bytes", lambda: 16 * 2**30)


def needs(exc_info, op: str, gib: str) -> str:
    msg = str(exc_info.value)
    m = NEEDS.match(msg)
    assert m is not None, msg
    assert (m.group(1), m.group(2)) == (op, gib), msg
    return msg


def test_device_put_of_a_broadcast_2_33_element_array_names_the_op_and_the_size(machine_16gib):
    x = np.broadcast_to(np.float32(1), (2**33,))
    with pytest.raises(MemoryError) as e:
        sl.device_put(x, sl.NamedSharding(MESH, P()))
    msg = needs(e, "device_put", "32")
    assert "shard it over more axes" in msg and "abstract=True" in msg


def test_broadcast_to_2_31_squared_inside_shard_map_names_the_op_and_the_size():
    f = sl.shard_map(lambda a: jnp.broadcast_to(a, (2**31, 2**31)), mesh=MESH, in_specs=P(), out_specs=P())
    with pytest.raises(MemoryError) as e:
        f(np.ones((1,), np.float32))
    msg = needs(e, "broadcast_to", str(2**64 // 2**30))
    assert "local shape (2147483648, 2147483648)" in msg and "abstract mesh" in msg
    assert "iterator is too large" not in msg and "array is too big" not in msg


def test_an_elementwise_op_whose_broadcast_output_is_too_large_names_the_op():
    def body(a):
        col = jnp.broadcast_to(a[:, None], (2**31, 1))
        row = jnp.broadcast_to(a[None, :], (1, 2**31))
        return col * row

    f = sl.shard_map(body, mesh=MESH, in_specs=P(), out_specs=P())
    with pytest.raises(MemoryError) as e:
        f(np.ones((1,), np.float32))
    needs(e, "multiply", str(2**64 // 2**30))


def test_host_functions_name_themselves_and_the_size_of_what_they_would_make():
    with pytest.raises(MemoryError) as e:
        jnp.zeros((2**31, 2**31))
    assert "device_put with a NamedSharding" in needs(e, "zeros", str(2**64 // 2**30))
    with pytest.raises(MemoryError) as e:
        jnp.broadcast_to(jnp.ones(3, jnp.int8), (2**31, 2**31, 3))
    needs(e, "broadcast_to", str(3 * 2**62 // 2**30))


def test_the_core_refuses_an_output_larger_than_the_machine_before_allocating():
    huge = np.broadcast_to(np.float32(1), (2**40,))   # a 4 TiB stride-0 view: no memory behind it
    with pytest.raises(MemoryError) as e:
        _core.copy(huge)
    assert needs(e, "copy", "4096")
    with pytest.raises(MemoryError) as e:
        _core.concatenate([huge, huge], 0)
    needs(e, "concatenate", "8192")
    with pytest.raises(MemoryError) as e:
        _core.all_gather(sl.make_mesh((2, 4), ("x", "y"))._core, np.broadcast_to(np.float32(1), (1, 1, 2**38)),
                         ["x", "y"], 0, True)
    needs(e, "all_gather", str(8 * 2**38 * 4 // 2**30))


def test_the_core_refuses_a_shape_whose_byte_count_overflows_64_bits():
    # 2**31 * 2**31 float32 is 2**64 bytes: it wrapped to 0 bytes in size_t arithmetic before.
    x = np.broadcast_to(np.float32(1), (2**31, 2**31 // 2**2))
    with pytest.raises(MemoryError) as e:
        _core.concatenate([x] * 4, 1)
    needs(e, "concatenate", str(2**64 // 2**30))


def test_a_refusal_below_the_machines_memory_says_the_system_refused_it():
    with pytest.raises(MemoryError, match=r"^\[add\] needs 2 GiB and the system refused it \(this machine has "
                                          r"[\d.]+ GiB, less of it free\); free something$") as e:
        memory.refused("add", 2 * 2**30, "free something", MemoryError("Unable to allocate 2 GiB"))
    assert isinstance(e.value.__cause__, MemoryError)
    with pytest.raises(MemoryError, match=r"^\[f\] needs more than 8589934592 GiB \(more than numpy can address\)"):
        memory.refused("f", None, "", ValueError("array is too big"))


def test_only_numpys_refusals_are_rewritten():
    assert memory.is_refusal(ValueError("array is too big; `arr.size * arr.dtype.itemsize` is larger"))
    assert memory.is_refusal(MemoryError("Unable to allocate 4.00 TiB for an array with shape (2, 3)"))
    assert not memory.is_refusal(ValueError("operands could not be broadcast together"))
    assert not memory.is_refusal(MemoryError("[gemm] needs 3 GiB, more than ..."))
    with pytest.raises(ValueError, match="could not be broadcast"):
        jnp.ones((2, 3)) + jnp.ones((4,)).__array__()


def test_check_outputs_sums_every_output_in_python_ints(machine_16gib):
    storage.check_outputs("split", [((2**31,), np.float32), ((2**31,), np.float32)])   # 16 GiB: fits
    with pytest.raises(MemoryError) as e:
        storage.check_outputs("split", [((2**31,), np.float32), ((2**31 + 2**28,), np.float32)], "fewer")
    needs(e, "split", "17")
