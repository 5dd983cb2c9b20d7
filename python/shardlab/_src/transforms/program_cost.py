"""What a recorded program costs, counted as XLA counts it: ``cost_analysis`` (flops,
transcendentals, bytes accessed per operand) and ``memory_analysis`` (argument, output, alias
and peak temporary bytes per device), with the per-primitive tables both use.

Example:
    >>> import numpy as np, shardlab as sl
    >>> ca = sl.jit(lambda a, b: a @ b).lower(np.ones((8, 16), np.float32), np.ones((16, 4), np.float32)).cost_analysis()
    >>> ca["flops"], ca["bytes accessed"]
    (1024.0, 896.0)
"""

from __future__ import annotations

from ..cost import model
from .program import Aval, Eqn, Program, Var

# -- per-op names and counts (XLA's conventions) ----------------------------------------------------
# shardlab primitive -> XLA HLO opcode (for .as_text) and JAX lax primitive (for make_jaxpr).
HLO_NAMES = {
    "einsum": "dot", "matmul": "dot", "add": "add", "subtract": "subtract", "multiply": "multiply",
    "divide": "divide", "negative": "negate", "maximum": "maximum", "minimum": "minimum", "exp": "exponential",
    "log": "log", "tanh": "tanh", "sqrt": "sqrt", "power": "power", "absolute": "abs", "sin": "sine",
    "cos": "cosine", "tan": "tan", "expm1": "exponential-minus-one", "log1p": "log-plus-one", "sign": "sign",
    "floor": "floor", "ceil": "ceil", "equal": "compare", "not_equal": "compare", "greater": "compare",
    "greater_equal": "compare", "less": "compare", "less_equal": "compare", "select": "select",
    "convert_element_type": "convert", "reshape": "reshape", "transpose": "transpose", "broadcast": "broadcast",
    "broadcast_to": "broadcast", "reduce_sum": "reduce", "reduce_max": "reduce", "reduce_min": "reduce",
    "reduce_prod": "reduce", "reduce_any": "reduce", "reduce_all": "reduce", "concatenate": "concatenate",
    "dynamic_slice": "dynamic-slice", "dynamic_update_slice": "dynamic-update-slice", "gather": "gather",
    "scatter": "scatter", "scatter_add": "scatter", "cumsum": "reduce-window", "psum": "all-reduce",
    "all_gather": "all-gather", "psum_scatter": "reduce-scatter", "all_to_all": "all-to-all",
    "ppermute": "collective-permute", "axis_index": "partition-id", "erf": "erf", "logistic": "logistic",
    "remainder": "remainder", "arctan2": "atan2", "cbrt": "cbrt", "getitem": "slice",
}
JAX_NAMES = {
    "multiply": "mul", "subtract": "sub", "divide": "div", "negative": "neg", "maximum": "max",
    "minimum": "min", "power": "pow", "absolute": "abs", "greater": "gt", "greater_equal": "ge", "less": "lt",
    "less_equal": "le", "equal": "eq", "not_equal": "ne", "einsum": "dot_general", "select": "select_n",
    "psum_scatter": "reduce_scatter", "pcast": "pvary", "arctan2": "atan2", "remainder": "rem",
    "bitwise_and": "and", "bitwise_or": "or", "bitwise_xor": "xor", "logical_not": "not", "invert": "not",
    "broadcast_to": "broadcast_in_dim", "broadcast": "broadcast_in_dim", "getitem": "slice",
}
# XLA counts these elementwise ops as transcendentals, not flops (HloCostAnalysis).
TRANSCENDENTAL = frozenset({
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "tanh", "sin", "cos", "tan", "sqrt", "cbrt",
    "power", "float_power", "arctan2", "erf", "arcsin", "arccos", "arctan", "arcsinh", "arccosh", "arctanh",
    "sinh", "cosh", "logaddexp", "logaddexp2", "hypot", "reciprocal_sqrt", "silu", "swiglu", "silu_vjp",
    "swiglu_vjp", "exp_sum",
})
# No arithmetic: XLA counts their bytes only.
DATA_MOVEMENT = frozenset({
    "reshape", "transpose", "broadcast", "broadcast_to", "concatenate", "split", "getitem", "gather",
    "dynamic_slice", "dynamic_update_slice", "take_along_axis", "convert_element_type", "zeros_like", "pcast",
    "all_gather", "psum_scatter", "all_to_all", "ppermute", "axis_index", "numpy_fallback", "scatter",
    "positive",
})
REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_any", "reduce_all",
                        "argmax", "argmin", "reduce"})
COLLECTIVES = frozenset({"psum", "all_gather", "psum_scatter", "all_to_all", "ppermute"})


def eqn_counts(eqn: Eqn) -> tuple[float, float]:
    """(flops, transcendentals) one device spends on `eqn`, counted as XLA's HloCostAnalysis
    counts the unfused op: a dot 2·M·N·K, an elementwise op one per output element (a
    transcendental for exp, log, tanh, ...), a reduction one per input element it folds away,
    an all-reduce one per element, data movement nothing."""
    name = eqn.prim
    if eqn.event is not None and eqn.event.flops:
        return float(eqn.event.flops), 0.0
    if name in DATA_MOVEMENT or name.startswith("shard_map_") or not eqn.outvars:
        return 0.0, 0.0
    out = sum(v.aval.size for v in eqn.outvars)
    if name in REDUCTIONS:
        src = eqn.invars[0].aval.size if eqn.invars else 0
        return float(max(src - out, 0)), 0.0
    if name in TRANSCENDENTAL:
        return 0.0, float(out)
    return float(out), 0.0


def _aval(v) -> Aval:
    return v.resolve().aval if isinstance(v, Var) else v.aval


def cost_analysis(program: Program) -> dict:
    """JAX's ``cost_analysis()`` dict for one device: "flops", "transcendentals", "bytes accessed"
    and the per-operand "bytes accessed{i}{}" / "bytes accessedout{}" (operand i's bytes summed
    over the ops, as XLA reports them); zero entries are left out, as XLA leaves them out. With
    hardware on the mesh, "optimal_seconds" is the program's roofline time (XLA's key)."""
    flops = trans = 0.0
    per_operand: dict = {}
    out_bytes = 0.0
    for eqn in program.eqns:
        if eqn.prim.startswith("shard_map_"):
            continue
        f, t = eqn_counts(eqn)
        flops += f
        trans += t
        for i, v in enumerate(eqn.invars):
            per_operand[i] = per_operand.get(i, 0.0) + _aval(v).nbytes
        out_bytes += sum(_aval(v).nbytes for v in eqn.outvars)
    result = {"flops": flops, "transcendentals": trans,
              "bytes accessed": float(sum(per_operand.values()) + out_bytes)}
    for i in sorted(per_operand):
        result[f"bytes accessed{i}{{}}"] = float(per_operand[i])
    result["bytes accessedout{}"] = float(out_bytes)
    seconds = optimal_seconds(program)
    if seconds is not None:
        result["optimal_seconds"] = seconds
    return {k: v for k, v in result.items() if v}


def optimal_seconds(program: Program):
    """The roofline time of the program on its mesh's hardware (None without hardware)."""
    mesh = program.mesh
    if mesh is None or mesh.hardware is None:
        return None
    events = [e.event.as_dict() for e in program.eqns if e.event is not None]
    if not events:
        return None
    return model.roofline(events, mesh).total_seconds


class CompiledMemoryStats:
    """Per-device memory of a program, with the attribute names of XLA's CompiledMemoryStats.

    ``argument_size_in_bytes`` and ``output_size_in_bytes`` are one device's share of the
    arguments and results; ``alias_size_in_bytes`` the donated arguments reused for results;
    ``temp_size_in_bytes`` the peak of the intermediate values live at once (no fusion: every
    op's result is materialized); ``peak_memory_in_bytes`` arguments + outputs + temporaries
    less the aliased bytes. There is no generated code and no host memory: those are 0.
    """

    _FIELDS = ("generated_code_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
               "alias_size_in_bytes", "temp_size_in_bytes", "host_generated_code_size_in_bytes",
               "host_argument_size_in_bytes", "host_output_size_in_bytes", "host_alias_size_in_bytes",
               "host_temp_size_in_bytes")

    def __init__(self, argument: int, output: int, alias: int, temp: int):
        self.generated_code_size_in_bytes = 0
        self.argument_size_in_bytes = int(argument)
        self.output_size_in_bytes = int(output)
        self.alias_size_in_bytes = int(alias)
        self.temp_size_in_bytes = int(temp)
        self.host_generated_code_size_in_bytes = 0
        self.host_argument_size_in_bytes = 0
        self.host_output_size_in_bytes = 0
        self.host_alias_size_in_bytes = 0
        self.host_temp_size_in_bytes = 0
        self.peak_memory_in_bytes = int(argument + output + temp - alias)
        self.serialized_buffer_assignment_proto = b""

    def __repr__(self):
        return "CompiledMemoryStats(" + ", ".join(f"{f}={getattr(self, f)}" for f in self._FIELDS) + ")"

    def __eq__(self, other):
        return isinstance(other, CompiledMemoryStats) and all(getattr(self, f) == getattr(other, f)
                                                              for f in self._FIELDS)


def memory_analysis(program: Program, donated=()) -> CompiledMemoryStats:
    """Per-device argument, output, alias and peak temporary bytes of `program`."""
    params = [v.resolve() for v in program.invars]
    outs = [v.resolve() for v in program.outvars if isinstance(v, Var)]
    argument = sum(v.aval.nbytes for v in params)
    output = sum(v.aval.nbytes for v in program.outvars)
    alias = 0
    free = [v.aval for i, v in enumerate(program.invars) if i in set(donated)]
    for o in program.outvars:
        a = o.aval
        for j, d in enumerate(free):
            if d.shape == a.shape and d.dtype == a.dtype and d.varying == a.varying:
                alias += a.nbytes
                free.pop(j)
                break
    # Liveness: an intermediate lives from its definition to its last use.
    fixed = {id(v) for v in params} | {id(v) for v in outs} | {id(v.resolve()) for v in program.constvars}
    last: dict = {}
    for i, eqn in enumerate(program.eqns):
        for v in eqn.invars:
            if isinstance(v, Var):
                last[id(v.resolve())] = i
    live: dict = {}
    temp = peak = 0
    for i, eqn in enumerate(program.eqns):
        for v in eqn.outvars:
            r = v.resolve()
            if id(r) not in fixed and id(r) not in live and r is v:
                live[id(r)] = r.aval.nbytes
                temp += r.aval.nbytes
        peak = max(peak, temp)
        for key in [k for k in live if last.get(k, -1) <= i]:
            temp -= live.pop(key)
    return CompiledMemoryStats(argument, output, alias, peak)
