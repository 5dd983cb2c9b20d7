"""Jaxpr and ClosedJaxpr: the recorded program printed as a jaxpr (what ``make_jaxpr`` returns).

The program is the one ``jit(f).trace`` records (``program.py``): every primitive bind in
order, shape-only. It prints in JAX's jaxpr form, with JAX's primitive names where shardlab's
differ (``mul`` for multiply, ``dot_general`` for einsum, ``reduce_scatter`` for
psum_scatter). Values inside shard_map show their per-device shape and the mesh axes they
vary along (``f32[2,4]{V:x}``), as JAX prints a shard_map body; the program is flat: a
shard_map's body is not nested under a ``shard_map`` equation.

Example:
    >>> import numpy as np, shardlab as sl
    >>> print(sl.make_jaxpr(lambda x: x * 2.0)(np.ones((8, 4), np.float32)))
    { lambda ; a:f32[8,4]. let b:f32[8,4] = mul a 2.0:f32[] in (b,) }
"""

from __future__ import annotations

from . import program as prog
from . import program_cost as prog_cost
from .program_cost import JAX_NAMES
from .program_text import fmt_param


def _name(i: int) -> str:
    """JAX's variable names: a..z, then ba, bb, ..."""
    s = ""
    while True:
        s = chr(ord("a") + i % 26) + s
        i //= 26
        if i == 0:
            return s


_SEP = "\x00"  # between parameters: a space on one line, a new line past JAX's 80 columns


class _Raw(str):
    """A parameter printed as is (no quotes)."""

    def __repr__(self):
        return str(self)


def _params(eqn: prog.Eqn) -> str:
    p = dict(eqn.params)
    if eqn.prim == "einsum":
        terms, out = p["terms"], p["out"]
        dtype = eqn.outvars[0].resolve().aval.dtype.name if eqn.outvars else None
        if len(terms) == 2 and all(len(set(t)) == len(t) for t in terms):
            # JAX's dot_general form: contracting and batch dims of each operand
            lhs, rhs = terms
            contract = [c for c in lhs if c in rhs and c not in out]
            batch = [c for c in lhs if c in rhs and c in out]
            dims = (([lhs.index(c) for c in contract], [rhs.index(c) for c in contract]),
                    ([lhs.index(c) for c in batch], [rhs.index(c) for c in batch]))
            p = {"dimension_numbers": _Raw(repr(dims)), "preferred_element_type": _Raw(dtype)}
        else:
            p = {"subscripts": ",".join(terms) + "->" + out, "preferred_element_type": _Raw(dtype)}
    if eqn.prim == "transpose" and "perm" in p:
        p = {"permutation": tuple(p.pop("perm")), **p}
    if eqn.prim in prog_cost.REDUCTIONS and "axes" in p:  # JAX's reduce_* parameters
        keep = p.pop("keepdims", False)
        p = {"axes": tuple(p.pop("axes")), **({"out_sharding": None} if eqn.prim == "reduce_sum" else {}),
             **({"keepdims": True} if keep else {}),
             **{n: v for n, v in p.items() if v is not None}}
    if not p:
        return ""
    return "[" + _SEP.join(f"{n}={fmt_param(v)}" for n, v in p.items()) + "]"


class Jaxpr:
    """The program's variables and equations (``jax.core.Jaxpr``)."""

    def __init__(self, program: prog.Program):
        self._program = program

    @property
    def invars(self) -> list:
        """The parameters' variables."""
        return list(self._program.invars)

    @property
    def outvars(self) -> list:
        """The results' variables."""
        return list(self._program.outvars)

    @property
    def constvars(self) -> list:
        """The variables of the arrays the program captured."""
        return list(self._program.constvars)

    @property
    def eqns(self) -> list:
        """The equations, one per primitive bind (``.prim`` is shardlab's primitive name)."""
        return list(self._program.eqns)

    def pretty_print(self) -> str:
        """The jaxpr text (``str(jaxpr)``)."""
        p = self._program
        names: dict = {}

        def name(v) -> str:
            if isinstance(v, prog.Literal):
                return repr(v)
            r = v.resolve()
            if id(r) not in names:
                names[id(r)] = _name(len(names))
            return names[id(r)]

        def typed(v) -> str:
            r = v.resolve()
            aval = v.aval if v.aval.global_shape is not None and v.aval.mesh is not None else r.aval
            return f"{name(v)}:{aval.str_global() if aval.sharding is not None else aval.str_short()}"

        # values a transform made outside a primitive (a seed cotangent) enter as constants do
        hosts = {id(v.resolve()): v.resolve() for e in p.eqns for v in e.invars
                 if isinstance(v, prog.Var) and v.resolve().kind == "host"}
        consts = " ".join(typed(v) for v in list(p.constvars) + list(hosts.values()))
        params = " ".join(typed(v) for v in p.invars)
        eqns = []
        for e in p.eqns:
            lhs = " ".join(typed(v) for v in e.outvars)
            op = JAX_NAMES.get(e.prim, e.prim)
            if e.prim == "psum":
                op = {"max": "pmax", "min": "pmin", "mean": "pmean"}.get(e.params.get("reduction"), "psum")
            rhs = " ".join(name(v) for v in e.invars)
            eqn_params = _params(e)
            line = f"{lhs} = {op}{eqn_params.replace(_SEP, ' ')} {rhs}".rstrip()
            if len(line) + 4 > 80 and eqn_params:  # JAX's printer breaks the parameters onto lines
                items = eqn_params[1:-1].split(_SEP)
                line = "\n".join([f"{lhs} = {op}["] + [f"  {i}" for i in items] + [f"] {rhs}".rstrip()])
            eqns.append(line)
        names_out = [name(v) for v in p.outvars]
        outs = f"({names_out[0]},)" if len(names_out) == 1 else "(" + ", ".join(names_out) + ")"
        head = f"{{ lambda {consts}; {params}. let"
        one = f"{head} {' '.join(eqns)} in {outs} }}" if eqns else f"{head}  in {outs} }}"
        if len(eqns) <= 1 and len(one) <= 80:
            return one
        body = [f"    {ln}" for e in eqns for ln in e.split("\n")]
        return "\n".join([head] + body + [f"  in {outs} }}"])

    __str__ = pretty_print

    def __repr__(self):
        return self.pretty_print()


class ClosedJaxpr:
    """A jaxpr with its constants (``jax.core.ClosedJaxpr``): ``.jaxpr``, ``.consts``,
    ``.in_avals``, ``.out_avals``, ``.eqns``; prints as JAX prints one."""

    def __init__(self, program: prog.Program):
        self._program = program
        self.jaxpr = Jaxpr(program)

    @property
    def consts(self) -> list:
        """The captured arrays, one per constvar."""
        return list(self._program.consts)

    @property
    def eqns(self) -> list:
        """The equations (``.jaxpr.eqns``)."""
        return self.jaxpr.eqns

    @property
    def in_avals(self) -> list:
        """ShapedArrays of the parameters."""
        return [prog.shaped(v.aval) for v in self._program.invars]

    @property
    def out_avals(self) -> list:
        """ShapedArrays of the results."""
        return [prog.shaped(v.aval) for v in self._program.outvars]

    @property
    def literals(self) -> list:
        """The scalar constants the equations use."""
        return [v for e in self._program.eqns for v in e.invars if isinstance(v, prog.Literal)]

    def pretty_print(self) -> str:
        """The jaxpr text (``str(closed_jaxpr)``)."""
        return self.jaxpr.pretty_print()

    __str__ = pretty_print

    def __repr__(self):
        return self.jaxpr.pretty_print()

    def _repr_pretty_(self, p, cycle):
        p.text(self.pretty_print())
