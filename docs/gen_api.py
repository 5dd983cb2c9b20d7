"""Writes docs/api.md from the package itself, so the reference cannot drift from the code.

Signatures come from ``inspect``; each one-line summary is the first paragraph of the
object's docstring (or, for the few members without one, a note kept below).

    python docs/gen_api.py            # rewrite docs/api.md
    python docs/gen_api.py --check    # exit 1 if docs/api.md is out of date (for CI)
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import pathlib
import re
import sys
import types

import numpy as np

OUT = pathlib.Path(__file__).resolve().parent / "api.md"

# Order of the page; any other module a top-level name comes from is appended after these.
MODULES = [
    "shardlab.sharding", "shardlab.experimental.shard_map", "shardlab.lax", "shardlab.numpy",
    "shardlab.nn", "shardlab.debug", "shardlab.kernels", "shardlab.hardware", "shardlab.cost",
]

# Names without an underscore that other shardlab modules use but users need not.
INTERNAL = {
    "as_sharding", "host_nbytes", "to_storage", "from_storage", "current_mesh", "event_dict",
    "record", "lift", "aligned", "mesh_of", "local_axes", "HANDLED", "UFUNC", "GLOBAL", "GLOBAL_UFUNC",
    "register_method", "wrap", "fallback", "FALLBACK_NAMES", "abstract_array", "event_cost", "event_seconds",
    "formulas",
}

# One-liners for public members that have no docstring of their own.
NOTES = {
    "DuplicateSpecError": "A mesh axis appears twice in a PartitionSpec (a ValueError, as in JAX).",
    "shardlab.experimental.shard_map.shard_map": "The legacy positional form of `shardlab.shard_map` "
    "(`check_rep` is `check_vma`; `auto` axes are not supported).",
    "shardlab.config.config": "The settings object (`shardlab.config`), as `jax.config`.",
    "shardlab.config": "The settings object (`shardlab.config`), as `jax.config`.",
    "_Config.num_devices": "How many default virtual devices `shardlab.devices()` lists "
    "(8, or `SHARDLAB_NUM_DEVICES`).",
    "LocalArray.from_storage": "A LocalArray from mesh-factorized storage, checking its mesh dims.",
    "Device.id": "The device's integer id (row-major position in a mesh made by `make_mesh`).",
    "Device.platform": 'Always "cpu", as JAX\'s CPU devices.',
    "Device.device_kind": "A description string of the virtual device.",
    "Mesh.devices": "ndarray of `Device`, one dim per mesh axis.",
    "Mesh.device_ids": "ndarray of the devices' integer ids, same shape as `devices`.",
    "Mesh.axis_names": "Tuple of axis names.",
    "Mesh.axis_types": "As given to the constructor (kept for JAX compatibility).",
    "Mesh.shape": "Ordered dict axis name → size.",
    "Mesh.hardware": "The hardware preset for cost estimates, or None.",
    "Mesh.physical_axes": "Map from mesh axis to physical links, or None (see shardlab.hardware).",
    "Mesh.ledger": "The mesh's default Ledger: every collective on this mesh is recorded here too.",
    "Mesh.size": "Number of devices.",
    "Mesh.axis_sizes": "Tuple of axis sizes, in axis order.",
    "Mesh.shape_tuple": "Tuple of (name, size) pairs.",
    "Mesh.ndim": "Number of mesh axes.",
    "Mesh.empty": "Always False (a mesh has at least one device).",
    "Mesh.axis_size": "Size of axis `name`; NameError for an unknown name.",
    "Mesh.device_at": "The Device at mesh coordinates `coords`.",
    "PartitionSpec.mesh_axes": "All mesh axes the spec uses, dim by dim, major-to-minor.",
    "NamedSharding.mesh": "The Mesh.",
    "NamedSharding.spec": "The PartitionSpec.",
    "NamedSharding.memory_kind": "As given (kept for JAX compatibility).",
    "NamedSharding.check_shape": "Raises ValueError if `shape` does not fit the spec (rank, divisibility).",
    "NamedSharding.shard_shape": "The local (per-device) shape of an array of `global_shape`.",
    "NamedSharding.replica_id": "Which copy of its block the device at mesh position `pos` holds (0 = first).",
    "NamedSharding.is_fully_replicated": "True if every device holds the whole array.",
    "NamedSharding.num_devices": "Number of devices in the mesh.",
    "NamedSharding.device_set": "Set of the mesh's devices.",
    "NamedSharding.num_shards": "Number of distinct blocks (product of the sizes of the axes the spec uses).",
    "NamedSharding.is_equivalent_to": "Same mesh and same spec once padded to rank `ndim`.",
    "Shard.device": "The Device holding this shard.",
    "Shard.index": "Tuple of slices: where the shard sits in the global array.",
    "Shard.data": "The shard's data (read-only numpy array).",
    "Shard.replica_id": "Which copy of this block it is (0 = first).",
    "ShardedArray.sharding": "The NamedSharding.",
    "ShardedArray.shape": "The global shape.",
    "ShardedArray.dtype": "The element type.",
    "ShardedArray.ndim": "Rank of the global array.",
    "ShardedArray.size": "Number of elements of the global array.",
    "ShardedArray.nbytes": "Bytes of one copy of the global array.",
    "ShardedArray.addressable_data": "Device `index`'s shard data (mesh order).",
    "ShardedArray.nbytes_per_device": "Bytes of one device's shard.",
    "LocalArray.storage": "The mesh-factorized storage: mesh dims (size 1 where invariant), then local dims.",
    "LocalArray.mesh": "The Mesh the value lives on.",
    "LocalArray.shape": "The LOCAL shape (as inside `jax.shard_map`).",
    "LocalArray.dtype": "The element type.",
    "LocalArray.ndim": "Local rank.",
    "LocalArray.size": "Number of local elements.",
    "LocalArray.T": "Transpose of the local value.",
    "LocalArray.reshape": "Reshape of the local value (as `jnp.reshape`).",
    "LocalArray.transpose": "Transpose of the local value (as `jnp.transpose`).",
    "LocalArray.astype": "The value converted to `dtype` on every device.",
    "LocalArray.sum": "Local sum (as `jnp.sum`); no communication.",
    "LocalArray.mean": "Local mean (as `jnp.mean`); no communication.",
    "LocalArray.max": "Local max (as `jnp.max`); no communication.",
    "LocalArray.min": "Local min (as `jnp.min`); no communication.",
    "LocalArray.squeeze": "Local squeeze (as `jnp.squeeze`).",
    "LocalArray.swapaxes": "Local swapaxes (as `jnp.swapaxes`).",
    "LocalArray.ravel": "The local value flattened to 1-D.",
    "LocalArray.flatten": "The local value flattened to 1-D.",
    "Ledger.mesh": "The mesh of the last recorded event (None while empty).",
    "Ledger.to_dicts": "The events as a list of dicts (same as `events`).",
    "Ledger.to_dataframe": "The events as a pandas DataFrame (needs pandas).",
    "Ledger.clear": "Removes every event.",
    "AxisSchedule": "The link-level schedule of one collective over one mesh axis (the C++ cost model's): its steps and what each link carries.",
    "AxisSchedule.op": "The collective.",
    "AxisSchedule.size": "The number of devices along the axis.",
    "AxisSchedule.topology": "The axis's links: ring, line, switch, torus.",
    "AxisSchedule.bytes": "The message size the schedule was made for (the `nbytes` argument of `cost.schedule`).",
    "AxisSchedule.steps": "The number of steps.",
    "AxisSchedule.step_max_bytes": "The largest bytes any link carries, one entry per step.",
    "AxisSchedule.links": "Bytes carried by each directed link over the whole schedule (LinkCount: source, destination, bytes).",
    "AxisSchedule.max_link_bytes": "The busiest link's bytes (what sets the time on a bandwidth-bound axis).",
    "AxisSchedule.total_link_bytes": "Bytes summed over every link.",
    "ShardingDiagram.shape": "The array shape drawn.",
    "ShardingDiagram.sharding": "The NamedSharding drawn.",
    "ShardingDiagram.row_spans": "(start, stop) of each row block.",
    "ShardingDiagram.col_spans": "(start, stop) of each column block.",
    "ShardingDiagram.cells": "`cells[row][col]` is the sorted tuple of device ids holding that block.",
}

# Attributes set in __init__ (not visible on the class), documented per class.
INSTANCE_ATTRIBUTES = {
    "Device": ["id"],
    "Mesh": ["devices", "device_ids", "axis_names", "axis_types", "shape", "hardware",
             "physical_axes", "ledger"],
    "NamedSharding": ["mesh", "spec", "memory_kind"],
    "ShardedArray": ["sharding", "shape"],
    "Ledger": ["mesh"],
    "_Config": ["num_devices"],
    "ShardingDiagram": ["shape", "sharding", "row_spans", "col_spans", "cells"],
}

missing: list[str] = []


def summary(obj, qualname: str) -> str:
    if qualname in NOTES:
        return NOTES[qualname]
    doc = inspect.getdoc(obj) if obj is not None else None
    if doc and not (isinstance(obj, type) and doc == inspect.getdoc(object)):
        first = doc.strip().split("\n\n")[0]
        return " ".join(line.strip() for line in first.splitlines())
    missing.append(qualname)
    return "(undocumented)"


def signature(obj, name: str) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return f"{name}(...)"
    params = list(sig.parameters.values())
    if params and params[0].name in ("self", "cls"):
        sig = sig.replace(parameters=params[1:])
    text = str(sig.replace(return_annotation=inspect.Signature.empty))
    # Sentinel defaults (object() and the like) print with their address: name them stably.
    text = re.sub(r"<([\w.]+) object at 0x[0-9a-f]+>", r"<\1>", text)
    text = re.sub(r"<(?:[\w]+\.)+_?(\w+)>", r"<\1>", text)  # no private module paths
    return f"{name}{text}"


def public_names(mod) -> list[str]:
    if hasattr(mod, "__all__"):
        return list(mod.__all__)
    out = []
    for name, obj in vars(mod).items():
        if name.startswith("_") or isinstance(obj, types.ModuleType):
            continue
        if getattr(obj, "__module__", None) == mod.__name__ and (callable(obj) or isinstance(obj, type)):
            out.append(name)
        elif not callable(obj) and type(obj).__module__ == mod.__name__:
            out.append(name)  # module-level singletons such as `config`
    return out


def _members(cls) -> dict:
    """The class's own members, after those of its private mixins (shardlab base classes that no
    public module exports, e.g. the arrays' ComputedArray): their methods are the class's API."""
    public = {id(getattr(importlib.import_module(m), n, None)) for m in MODULES
              for n in public_names(importlib.import_module(m))}
    out: dict = {}
    for base in reversed(cls.__mro__[1:]):
        if base.__module__.startswith("shardlab.") and id(base) not in public:
            out.update(vars(base))
    out.update(vars(cls))
    return out


def member_lines(cls) -> list[str]:
    lines = []
    seen = set()
    if dataclasses.is_dataclass(cls):
        fields = [f.name for f in dataclasses.fields(cls)]
        seen.update(fields)
        if all(f"{cls.__name__}.{f}" in NOTES for f in fields):
            lines += [f"  - `.{f}` — {NOTES[cls.__name__ + '.' + f]}" for f in fields]
        else:
            lines.append("  - fields: " + ", ".join(f"`.{f}`" for f in fields))
    for attr in INSTANCE_ATTRIBUTES.get(cls.__name__, []):
        lines.append(f"  - `.{attr}` — {summary(None, f'{cls.__name__}.{attr}')}")
        seen.add(attr)
    for name, obj in _members(cls).items():
        if name.startswith("_") or name in seen or name in ("UNCONSTRAINED",):
            continue
        qual = f"{cls.__name__}.{name}"
        if isinstance(obj, property):
            lines.append(f"  - `.{name}` — {summary(obj, qual)}")
        elif isinstance(obj, (staticmethod, classmethod)):
            fn = obj.__func__
            lines.append(f"  - `{signature(fn, cls.__name__ + '.' + name)}` — {summary(fn, qual)}")
        elif inspect.isfunction(obj):
            lines.append(f"  - `.{signature(obj, name)}` — {summary(obj, qual)}")
        elif not callable(obj) and name not in ("platform", "device_kind"):
            continue
        elif name in ("platform", "device_kind"):
            lines.append(f"  - `.{name}` — {summary(None, qual)}")
    if "__enter__" in vars(cls):
        lines.append("  - context manager (`with ...:`)")
    return lines


def numpy_section(mod) -> list[str]:
    """shardlab.numpy re-exports many numpy objects; list those by kind, then its own functions."""
    ufuncs, creation, dtypes, consts, own = [], [], [], [], []
    for name, obj in vars(mod).items():
        if name.startswith("_") or isinstance(obj, types.ModuleType):
            continue
        if isinstance(obj, np.ufunc):
            ufuncs.append(name)
        elif isinstance(obj, np.dtype) or (isinstance(obj, type) and (issubclass(obj, np.generic) or obj is np.ndarray)):
            dtypes.append(name)
        elif isinstance(obj, (float, type(None))) or obj is np.newaxis:
            consts.append(name)
        elif callable(obj) and getattr(obj, "__module__", "").startswith("numpy"):
            creation.append(name)
        elif callable(obj) and getattr(obj, "__module__", None) == mod.__name__:
            own.append(name)
    lines = [
        "- Elementwise (numpy's own ufuncs; on a LocalArray they apply per device through "
        "`__array_ufunc__`): " + ", ".join(f"`{n}`" for n in sorted(ufuncs)),
        "- numpy's own functions, re-exported (creation gives an ordinary array, the same on "
        "every device): " + ", ".join(f"`{n}`" for n in sorted(creation)),
        "- dtypes: " + ", ".join(f"`{n}`" for n in sorted(dtypes)),
        "- constants: " + ", ".join(f"`{n}`" for n in sorted(consts)),
    ]
    for name in own:
        obj = getattr(mod, name)
        text = summary(obj, "numpy." + name) if inspect.getdoc(obj) else (
            f"As `numpy.{name}`; on a LocalArray, applied to each device's local value.")
        lines.append(f"- `{signature(obj, name)}` — {text}")
    return lines


def entry_lines(name: str, obj, qualname: str, rendered: dict) -> list[str]:
    """The lines of one public name: its signature and summary, a class's members."""
    if id(obj) in rendered and (callable(obj) or isinstance(obj, type)):
        return [f"- `{name}` — alias of `{rendered[id(obj)]}`"]
    rendered.setdefault(id(obj), name)
    if isinstance(obj, type) and issubclass(obj, BaseException):
        bases = ", ".join(b.__name__ for b in obj.__mro__[1:-2])
        return [f"- exception `{name}` ({bases}) — {summary(obj, qualname)}"]
    if isinstance(obj, type):
        return [f"- class `{signature(obj, name)}` — {summary(obj, qualname)}"] + member_lines(obj)
    if callable(obj):
        return [f"- `{signature(obj, name)}` — {summary(obj, qualname)}"]
    return [f"- `{name}` — {summary(type(obj), qualname)}"] + member_lines(type(obj))


def module_section(modname: str) -> list[str]:
    mod = importlib.import_module(modname)
    out = ["", f"## `{modname}`", "", _blurb(mod), ""]
    if modname == "shardlab.numpy":
        return out + numpy_section(mod)
    rendered: dict[int, str] = {}
    helpers = []
    for name in public_names(mod):
        obj = getattr(mod, name)
        if name in INTERNAL:
            helpers.append(name)
            continue
        out += entry_lines(name, obj, name if isinstance(obj, type) else modname + "." + name, rendered)
    if helpers:
        out.append("- Helpers other shardlab modules use (not part of the JAX-style API): "
                   + ", ".join(f"`{h}`" for h in helpers))
    return out


def _blurb(mod) -> str:
    """The module docstring's first paragraph, without its pointer into the private ``_src`` tree."""
    text = " ".join((inspect.getdoc(mod) or "").split("\n\n")[0].split())
    return re.sub(r"\s*\((?:see|as in)?[^()]*_src[^()]*\)", "", text)


def _kind(obj) -> str:
    if isinstance(obj, types.ModuleType):
        return "module"
    if isinstance(obj, type):
        return "exception" if issubclass(obj, BaseException) else "class"
    return "function" if callable(obj) else "object"


def _cell(text: str, limit: int = 160) -> str:
    text = text if len(text) <= limit else text[:limit - 1].rsplit(" ", 1)[0] + " …"
    return text.replace("|", "\\|")


def render() -> str:
    """The page: a summary table of every top-level name, the top-level names themselves (under
    their public path, ``shardlab.jit``, never the private module that defines them), then one
    section per public module."""
    import shardlab

    out = ["# API reference", "",
           "<!-- Generated by docs/gen_api.py from the package itself; do not edit by hand. "
           "Regenerate with `python docs/gen_api.py`; `--check` fails if this file is stale. -->",
           "",
           "Signatures and one-line summaries of every public name. Names, signatures and "
           "semantics follow JAX; the docstrings (`help(shardlab.lax.psum)`) have examples.",
           "", "## Summary", "", "| name | kind | what it is |", "|---|---|---|"]
    modules = list(MODULES)
    top: list[str] = []
    rendered: dict[int, str] = {}
    names = sorted(shardlab.__all__, key=str.lower)
    for name in names:
        obj = getattr(shardlab, name)
        kind = _kind(obj)
        if kind == "module":
            modname = obj.__name__
            if not modname.startswith("shardlab.") or modname.startswith("shardlab._"):
                modname = f"shardlab.{name}"
            if modname not in modules:
                modules.append(modname)
            link = f"[`shardlab.{name}`](#{_anchor(modname)})"
            out.append(f"| {link} | module | {_cell(_blurb(obj))} |")
            continue
        qual = name if isinstance(obj, type) else "shardlab." + name
        out.append(f"| [`shardlab.{name}`](#{_anchor('shardlab.' + name)}) | {kind} | {_cell(summary(obj, qual))} |")
        lines = entry_lines(f"shardlab.{name}", obj, qual, rendered)
        top += [f'<a id="{_anchor("shardlab." + name)}"></a>', ""] + lines + [""]
    out += ["", "## `shardlab` (top level)", ""] + top
    for modname in modules:
        out += module_section(modname)
    return "\n".join(out).replace("\n\n\n", "\n\n") + "\n"


def _anchor(modname: str) -> str:
    return modname.replace(".", "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if docs/api.md is out of date")
    args = parser.parse_args()
    text = render()
    if missing:
        print("gen_api: no docstring or note for: " + ", ".join(missing), file=sys.stderr)
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"gen_api: {OUT} is out of date; run `python docs/gen_api.py`", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
