"""A recorded program as text, in the form of XLA's partitioned HLO (what ``Lowered.as_text()``
prints): per-device shapes with the mesh axes each value varies along, one line per primitive
and per collective, the global types of the arguments and results in the book's notation.

Example:
    >>> import numpy as np, shardlab as sl
    >>> print(sl.jit(lambda x: x + 1).lower(np.ones(3, np.float32)).as_text())
    HloModule jit__lambda_, entry_computation_layout={(f32[3])->f32[3]}
    <BLANKLINE>
    ENTRY %main (p0: f32[3]) -> f32[3] {
      %p0 = f32[3] parameter(0)
      ROOT %0 = f32[3] add(%p0, f32[] constant(1.0))
    }
"""

from __future__ import annotations

import math

import numpy as np

from ..core import units
from .program import Eqn, Literal, Program, Var
from .program_cost import COLLECTIVES, HLO_NAMES

# -- text ------------------------------------------------------------------------------------------
def fmt_param(v) -> str:
    if isinstance(v, np.dtype) or isinstance(v, type) and issubclass(v, np.generic):
        return np.dtype(v).name
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, (tuple, list)):
        inner = ", ".join(fmt_param(x) for x in v)
        return f"({inner}{',' if len(v) == 1 else ''})"
    return repr(v)


def _hlo_attrs(eqn: Eqn) -> list:
    p = eqn.params
    if eqn.prim == "einsum":
        attrs = [f'einsum="{",".join(p["terms"])}->{p["out"]}"']
    elif eqn.prim in COLLECTIVES:
        axes = tuple(p.get("axes", ()))
        n = math.prod(eqn.mesh.shape[a] for a in axes) if eqn.mesh is not None else 1
        groups = eqn.mesh.size // n if eqn.mesh is not None else 1
        attrs = ["axes={" + ",".join(axes) + "}", f"groups={groups}x{n}"]
        attrs += [f"{k}={fmt_param(v)}" for k, v in p.items() if k != "axes"]
    elif eqn.prim.startswith("shard_map_"):
        attrs = [f"sharding={p['spec']!r}"]
    else:
        attrs = [f"{k}={fmt_param(v)}" for k, v in p.items()]
    if HLO_NAMES.get(eqn.prim, eqn.prim) != eqn.prim or eqn.scope:
        attrs.append(f'op_name="{eqn.scope + "/" if eqn.scope else ""}{eqn.prim}"')  # as XLA's metadata
    return attrs


def _comment(eqn: Eqn) -> str:
    e = eqn.event
    if eqn.note:
        return eqn.note
    if eqn.prim == "shard_map_enter":
        return "host re-layout on entering shard_map (no ledger event)"
    if eqn.prim == "shard_map_exit":
        return "device 0's value along the axes the out_spec leaves out (check_vma=False)"
    if e is None:
        return ""
    parts = []
    if e.axes:
        parts.append(f"sends {units.fmt_bytes(e.bytes_sent)}/device")
    elif e.flops:
        parts.append(units.fmt_flops(e.flops))
    if e.seconds is not None and not (isinstance(e.seconds, float) and math.isnan(e.seconds)):
        parts.append(units.fmt_seconds(e.seconds))
    return ", ".join(parts)


def hlo_text(program: Program) -> str:
    """The program in the form of XLA's partitioned HLO: per-device shapes, one line per op
    and per collective, global types (the book's notation) on the parameters and results."""
    names: dict = {}
    count = [0]

    def name(v) -> str:
        if isinstance(v, Literal):
            value = v.value.item() if v.value.ndim == 0 else v.value.ravel().tolist()
            return f"{v.aval.str_short()} constant({value})"
        r = v.resolve()
        if id(r) not in names:
            names[id(r)] = f"%{count[0]}"
            count[0] += 1
        return names[id(r)]

    for i, v in enumerate(program.invars):
        names[id(v.resolve())] = f"%p{i}"
    for i, v in enumerate(program.constvars):
        names.setdefault(id(v.resolve()), f"%c{i}")
    outs = [v.resolve() for v in program.outvars]
    in_types = ", ".join(v.aval.str_global() for v in program.invars)
    out_list = [v.aval.str_global() for v in program.outvars]
    out_type = out_list[0] if len(out_list) == 1 else "(" + ", ".join(out_list) + ")"
    head = f"HloModule {program.name}"
    mesh = program.mesh
    if mesh is not None:
        head += ", mesh={" + ", ".join(f"{a}:{s}" for a, s in mesh.shape.items()) + "}"
        head += f", num_partitions={mesh.size}"
        if mesh.hardware is not None:
            head += f", hardware={mesh.hardware.name}"
    head += f", entry_computation_layout={{({in_types})->{out_type}}}"
    params = ", ".join(f"p{i}: {v.aval.str_global()}" for i, v in enumerate(program.invars))
    lines = [head, "", f"ENTRY %main ({params}) -> {out_type} {{"]
    for i, v in enumerate(program.invars):
        r = v.resolve()
        g = f"  // global {v.aval.str_global()}" if v.aval.global_shape is not None and v.aval.mesh is not None else ""
        lines.append(f"  %p{i} = {r.aval.str_short()} parameter({i}){g}")
    for i, v in enumerate(program.constvars):
        lines.append(f"  %c{i} = {v.aval.str_short()} constant({{...}})")
    hosts = [v for e in program.eqns for v in e.invars] + list(program.outvars)
    hosts = [v for v in hosts if isinstance(v, Var) and v.resolve().kind == "host"]
    for i, v in enumerate({id(h.resolve()): h.resolve() for h in hosts}.values()):
        names[id(v)] = f"%h{i}"
        lines.append(f"  %h{i} = {v.aval.str_short()} custom-call(), custom_call_target=\"host\"  "
                     f"// made outside a primitive (a transform's view or seed): no ledger event")
    root = outs[-1] if len(outs) == 1 else None
    for eqn in program.eqns:
        args = ", ".join(name(v) for v in eqn.invars)
        op = HLO_NAMES.get(eqn.prim, eqn.prim)
        attrs = _hlo_attrs(eqn)
        outvars = [v.resolve() for v in eqn.outvars]
        if len(outvars) == 1:
            lhs, ty = name(outvars[0]), outvars[0].aval.str_short()
        else:
            lhs = name(outvars[0]) if outvars else "%_"
            for o in outvars[1:]:
                name(o)
            ty = "(" + ", ".join(o.aval.str_short() for o in outvars) + ")"
        prefix = "ROOT " if root is not None and outvars and outvars[0] is root else ""
        line = f"  {prefix}{lhs} = {ty} {op}({args})" + "".join(", " + a for a in attrs)
        c = _comment(eqn)
        lines.append(line + (f"  // {c}" if c else ""))
    if root is None or not any(root is v.resolve() for e in program.eqns for v in e.outvars):
        tys = ", ".join(v.aval.str_short() for v in outs)
        lines.append(f"  ROOT %tuple = ({tys}) tuple({', '.join(name(v) for v in outs)})")
    globals_ = [v.aval for v in program.outvars if v.aval.global_shape is not None and v.aval.mesh is not None]
    if globals_:
        lines.append("  // results: " + ", ".join(a.str_global() for a in globals_))
    lines.append("}")
    return "\n".join(lines)
