"""Jaxpr and ClosedJaxpr: the recorded program printed as a jaxpr (what ``make_jaxpr`` returns).

The program is the one ``jit(f).trace`` records (``program.py``): every primitive bind in
order, shape-only. It prints in JAX's jaxpr form, with JAX's primitive names where shardlab's
differ (``mul`` for multiply, ``dot_general`` for einsum, ``reduce_scatter`` for
psum_scatter). Values inside shard_map show their per-device shape and the mesh axes they
vary along (``f32[2,4]{V:x}``); a shard_map the user wrote prints as JAX's nested
``shard_map`` equation with its body as the ``jaxpr`` parameter (the program itself stays flat:
the printer nests the Regions the recorder marked).

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


class _Fresh:
    """A variable the printer adds (JAX's implicit ``pvary`` of an invariant operand)."""

    def __init__(self, aval):
        self.aval = aval


class _Printer:
    """JAX's jaxpr text of a program: variables named a, b, ... in order of appearance; each
    shard_map the user wrote nested as one ``shard_map`` equation whose ``jaxpr`` parameter is
    its body (with the ``pvary`` JAX inserts where an invariant operand meets a varying one)."""

    def __init__(self, program: prog.Program):
        self.p = program
        self.names: dict = {}   # id(var) -> name
        self.count = 0          # names given so far
        self.regions = list(program.regions)

    # -- names and types ---------------------------------------------------------------------
    def _new(self, v) -> str:
        self.names[id(v)] = _name(self.count)
        self.count += 1
        return self.names[id(v)]

    def name(self, v) -> str:
        if isinstance(v, prog.Literal):
            return repr(v)
        while True:  # a region's variables are named apart from the values they alias
            if id(v) in self.names:
                return self.names[id(v)]
            nxt = getattr(v, "alias", None)
            if nxt is None:
                return self._new(v)
            v = nxt

    @staticmethod
    def _aval(v):
        if isinstance(v, _Fresh):
            return v.aval
        r = v.resolve()
        return v.aval if v.aval.global_shape is not None and v.aval.mesh is not None else r.aval

    def typed(self, v, local: bool = False) -> str:
        aval = v.aval if local or isinstance(v, _Fresh) else self._aval(v)
        n = self.name(v)
        return f"{n}:{aval.str_global() if aval.sharding is not None and not local else aval.str_short()}"

    # -- equations -----------------------------------------------------------------------------
    def _eqn_text(self, lhs: str, op: str, params: str, rhs: str) -> str:
        line = f"{lhs} = {op}{params.replace(_SEP, ' ')} {rhs}".rstrip()
        if (len(line) + 4 > 80 or "\n" in line) and params:  # JAX breaks the parameters onto lines
            items = params[1:-1].split(_SEP)
            body = []
            for it in items:
                first, *rest = it.split("\n")
                body.append(f"  {first}")
                body.extend(f"  {ln}" for ln in rest)
            line = "\n".join([f"{lhs} = {op}["] + body + [f"] {rhs}".rstrip()])
        return line

    def _region_of(self, e, regions) -> object:
        for r in regions:
            if any(x is e for x in r.body) or any(x is e for x in r.boundary):
                return r
        return None

    def _lines(self, eqns: list, regions: list, local: bool) -> list:
        """The text of `eqns` at one level: a region's equations become its shard_map equation
        (at its first one); regions inside a region's body print inside its jaxpr."""
        top = [r for r in regions if not r.params.get("flat") and not any(
            r is not o and not o.params.get("flat") and any(e is x for x in o.body for e in r.body + r.boundary)
            for o in regions)]
        # shardlab's own shard_maps (a global op's steps) print in line; a step's result that
        # leaves as the op's result prints as that global value
        leaving = {id(inner): outer for r in regions if r.params.get("flat") for inner, outer in r.outs
                   if isinstance(inner, prog.Var)}
        done, out = set(), []
        for e in eqns:
            r = self._region_of(e, top)
            if r is not None:
                if id(r) not in done:
                    done.add(id(r))
                    out.append(self._shard_map(r, regions, local))
                continue
            out.extend(self._plain(e, local, leaving))
        return out

    def _plain(self, e, local: bool, leaving=None) -> list:
        out = []
        invars = list(e.invars)
        if local and e.prim not in prog_cost.COLLECTIVES and e.outvars:
            want = set(e.outvars[0].aval.varying)
            for k, v in enumerate(invars):
                if isinstance(v, prog.Var) and set(v.aval.varying) < want:
                    axes = tuple(a for a in e.mesh.axis_names if a in want - set(v.aval.varying))
                    a = v.aval
                    fresh = _Fresh(prog.Aval(a.shape, a.dtype, a.mesh, tuple(sorted(want, key=e.mesh.axis_names.index))))
                    out.append(self._eqn_text(self.typed(fresh, True), "pvary",
                                              f"[axes={fmt_param(axes)}]", self.name(v)))
                    invars[k] = fresh
        outs = []
        for v in e.outvars:
            outer = (leaving or {}).get(id(v))
            if outer is not None and id(v) not in self.names and id(outer) not in self.names:
                self._new(outer)
                outs.append(self.typed(outer, local))
                self.names[id(v)] = self.names[id(outer)]
            else:
                outs.append(self.typed(v, local))
        lhs = " ".join(outs)
        op = JAX_NAMES.get(e.prim, e.prim)
        params = _params(e)
        if e.prim == "psum":
            op = {"max": "pmax", "min": "pmin", "mean": "pmean"}.get(e.params.get("reduction"), "psum")
            if local and op == "psum":  # a checked shard_map body: JAX's psum of varying values
                op, params = "psum_invariant", f"[axes={fmt_param(tuple(e.params.get('axes', ())))}]"
        rhs = " ".join(self.name(v) for v in invars)
        out.append(self._eqn_text(lhs, op, params, rhs))
        return out

    def _shard_map(self, r, regions: list, local: bool) -> str:
        for _, outer in r.outs:  # results, then the body's parameters, take new names (JAX's order)
            if id(outer) not in self.names:
                self._new(outer)
        lhs = " ".join(self.typed(outer, local) for _, outer in r.outs)
        params = dict(r.params)
        specs = tuple(s for s in params["in_specs"] if s is not None)
        inner_regions = [o for o in regions if o is not r and any(e is x for x in r.body for e in o.body + o.boundary)]
        for _, inner in r.args:
            self._new(inner)
        head = " ".join(self.typed(inner, True) for _, inner in r.args)
        body = self._lines(r.body, inner_regions, params["check_vma"])
        outs = [self.name(inner) for inner, _ in r.outs]
        jaxpr = _join(f"{{ lambda ; {head}. let", body, outs)
        items = {"check_vma": params["check_vma"], "in_specs": _Raw(_specs(specs)), "jaxpr": _Raw(jaxpr),
                 "mesh": _Raw(str(r.mesh) if params.get("mesh_given") else _mesh(r.mesh)),
                 "newly_manual_axes": _Raw("frozenset({" + ", ".join(repr(a) for a in r.mesh.axis_names
                                                                   if a in params["manual"]) + "})"),
                 "out_specs": _Raw(_specs(params["out_specs"]))}
        text = "[" + _SEP.join(f"{n}={fmt_param(v)}" for n, v in items.items()) + "]"
        rhs = " ".join(self.name(outer) for outer, _ in r.args)
        return self._eqn_text(lhs, "shard_map", text, rhs)

    def text(self) -> str:
        p = self.p
        # values a transform made outside a primitive (a seed cotangent) enter as constants do
        hosts = {id(v.resolve()): v.resolve() for e in p.eqns for v in e.invars
                 if isinstance(v, prog.Var) and v.resolve().kind == "host"}
        consts = " ".join(self.typed(v) for v in list(p.constvars) + list(hosts.values()))
        params = " ".join(self.typed(v) for v in p.invars)
        eqns = self._lines(p.eqns, self.regions, False)
        return _join(f"{{ lambda {consts}; {params}. let", eqns, [self.name(v) for v in p.outvars])


def _mesh(mesh) -> str:
    """The mesh parameter as JAX prints it: the abstract mesh with the devices' kind (shardlab's
    virtual devices are CPU devices to JAX's eye unless the mesh names a hardware preset)."""
    am = repr(mesh.abstract_mesh)
    kind = mesh.hardware.name if getattr(mesh, "hardware", None) is not None else "cpu"
    return f"{am[:-1]}, device_kind={kind}, num_cores=None, platform=cpu)" if "device_kind" not in am else am


def _specs(specs) -> str:
    """A tuple of PartitionSpecs as JAX prints one: ``(P('i',), P())``."""
    specs = list(specs)
    return "(" + ", ".join(repr(s) for s in specs) + ("," if len(specs) == 1 else "") + ")"


def _join(head: str, eqns: list, names_out: list) -> str:
    """A jaxpr from its header, equation texts and result names: on one line when it has at most
    one short equation, else an equation a line (JAX's layout)."""
    outs = f"({names_out[0]},)" if len(names_out) == 1 else "(" + ", ".join(names_out) + ")"
    one = f"{head} {' '.join(eqns)} in {outs} }}" if eqns else f"{head}  in {outs} }}"
    if len(eqns) <= 1 and len(one) <= 80 and "\n" not in one:
        return one
    body = [f"    {ln}" for e in eqns for ln in e.split("\n")]
    return "\n".join([head] + body + [f"  in {outs} }}"])


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
        return _Printer(self._program).text()

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
