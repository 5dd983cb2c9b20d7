import dataclasses

import pytest

import shardlab._core as _core
from shardlab import hardware


def test_presets_and_aliases():
    assert hardware.names() == ["tpu-v4p", "tpu-v5e", "tpu-v5p", "tpu-v6e", "a100", "h100", "h200", "b200"]
    assert hardware.get("v5e").name == "tpu-v5e"
    assert hardware.get("H100").family == "gpu"
    hw = hardware.get("tpu-v5p")
    assert hardware.get(hw) is hw
    assert hardware.get(None) is None


def test_unknown_preset_lists_known_ones():
    with pytest.raises(ValueError) as e:
        hardware.get("tpu-v9")
    for n in hardware.names():
        assert n in str(e.value)
    with pytest.raises(TypeError):
        hardware.get(5)


def test_table_mentions_every_preset():
    t = hardware.table()
    for n in hardware.names():
        assert n in t


def test_default_physical_axes():
    assert hardware.resolve_physical_axes("tpu-v5e", ("X", "Y"), (8, 4)) == {"X": "x", "Y": "y"}
    assert hardware.resolve_physical_axes("tpu-v5e", ("D", "X", "Y"), (2, 16, 16)) == {"D": "dcn", "X": "x", "Y": "y"}
    assert hardware.resolve_physical_axes("h100", ("N", "G"), (4, 8)) == {"N": "ib", "G": "nvlink"}
    assert hardware.resolve_physical_axes("tpu-v5e", ("X", "Y"), (4, 4), {"X": "y"}) == {"X": "y", "Y": "x"}


def test_wraparound_decides_topology():
    ring = hardware.axis_links("tpu-v5e", {"X": 16, "Y": 4}, ("X", "Y"))
    assert [l.topology for l in ring] == ["ring", "line"]
    assert [l.topology for l in hardware.axis_links("tpu-v4p", {"X": 4}, ("X",))] == ["ring"]
    assert [l.topology for l in hardware.axis_links("h100", {"G": 8}, ("G",))] == ["switch"]
    uni = hardware.axis_links("tpu-v4p", {"X": 4}, ("X",), topology="uni_ring")
    assert uni[0].topology == "uni_ring"
    split = hardware.axis_links("tpu-v5e", {"X": 256}, ("X",), {"X": {"x": 16, "y": 16}})
    assert [(l.link, l.size) for l in split] == [("ici:x", 16), ("ici:y", 16)]


@pytest.mark.parametrize("physical, msg", [
    ({"Q": "x"}, "'Q'"),
    ({"X": "w"}, "'w'"),
    ({"X": "x", "Y": "x"}, "'x'"),
    ({"X": {"x": 2, "y": 2}}, "multiply"),
    ({"X": "nvlink"}, "does not have"),
])
def test_bad_physical_axes(physical, msg):
    with pytest.raises(ValueError, match=msg):
        hardware.validate_axes("tpu-v5e", ("X", "Y"), (8, 4), physical)


def test_bad_gpu_axes_and_missing_hardware():
    with pytest.raises(ValueError, match="NVLink"):
        hardware.validate_axes("h100", ("G",), (16,), {"G": "nvlink"})
    with pytest.raises(ValueError, match="hardware"):
        hardware.validate_axes(None, ("X",), (8,), {"X": "x"})
    with pytest.raises(ValueError, match="size 0"):
        hardware.validate_axes("h100", ("G",), (0,), None)


def test_the_python_hardware_has_the_core_structs_fields_in_order_and_kind():
    """One list of Hardware fields: SHARDLAB_HARDWARE_FIELDS in cpp/include/shardlab/hardware.hpp
    makes the C++ struct and the binding; the Python dataclass must declare the same fields."""
    kinds = {"Mapping": "dict"}
    python = [(f.name, kinds.get(f.type, f.type)) for f in dataclasses.fields(hardware.Hardware)]
    assert python == [(name, kind) for name, kind, _ in _core.hardware_fields()]
    v5e = hardware.get("tpu-v5e")
    core = _core.get_hardware("tpu-v5e")
    convert = {"dict": dict, "tuple": tuple}
    for name, kind in python:
        assert getattr(v5e, name) == convert.get(kind, lambda v: v)(getattr(core, name)), name
