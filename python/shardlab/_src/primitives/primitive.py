"""Primitive and bind: the one path every operation on per-device values takes.

A Primitive carries its rules, as JAX's do:

- ``shape_rule(avals, mesh, **params) -> [(shape, dtype), ...]``: output storage shapes and
  dtypes (mesh dims + local dims, so varying axes come with the shape); it raises the op's
  errors, in local terms, before anything runs;
- ``impl[backend](storages, mesh, **params) -> [storage, ...]``: registered by the backends
  (``emulated`` runs the C++ core and numpy, ``mpi`` adds the ranks); the abstract backend
  needs no registration: a primitive's abstract implementation is its shape rule
  (:meth:`Primitive.abstract_impl`) unless ``impl["abstract"]`` says otherwise, so a primitive
  defined anywhere, at any time, runs shape-only;
- ``cost(in_avals, out_avals, mesh, **params) -> Event | None``: the ledger event, the one
  place bytes and FLOPs are counted, so a real run and an abstract run record equal events;
- ``vjp(cts, ins, outs, mesh, **params) -> [ct or None per input]``: the reverse-mode rule,
  written with primitives, so gradients run on every backend and are recorded too.

``bind`` checks, picks the backend, runs, records the event (stamped with the current phase
and named scope) and pushes a tape entry when a gradient is being taken. Nothing else
touches storage.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab._src.primitives import elementwise
    >>> from shardlab._src.primitives.primitive import bind
    >>> mesh = sl.make_mesh((2,), ("x",))
    >>> x = sl.LocalArray(np.arange(4.0).reshape(2, 2), mesh)
    >>> bind(elementwise.PRIMS["exp"], [x], mesh).shape
    (2,)
"""

from __future__ import annotations

from ..arrays.local_array import LocalArray, wrap
from ..arrays.storage import AbstractStorage, refused
from ..core.memory import is_refusal
from ..core.context import CTX
from ..ledger.ledger import record

_real_backend = "emulated"  # the backend for real data: use_backend("mpi") once backends/mpi is initialized


def use_backend(name: str) -> None:
    """Selects the backend that runs primitives on real data ("emulated", or "mpi" while the MPI
    backend is initialized; abstract values always run on "abstract")."""
    global _real_backend
    if name not in ("emulated", "mpi"):
        raise ValueError(f"[use_backend] unknown backend {name!r}: use 'emulated' or 'mpi'")
    _real_backend = name


REGISTRY: list = []  # every Primitive ever made: the mpi backend wraps each one's impl when it starts
_DERIVED: dict = {}  # backend -> (prim -> its impl, or None): for a primitive made after that backend started


def register_derived(backend: str, make) -> None:
    """``make(prim)`` gives `backend`'s implementation of a primitive that has none yet (one
    made, or given its emulated implementation, after the backend started), at its first use;
    None when it cannot."""
    _DERIVED[backend] = make


class Primitive:
    """An operation with its rules (see the module docstring)."""

    __slots__ = ("name", "shape_rule", "cost", "vjp", "impl", "multiple_results")

    def __init__(self, name: str, *, shape_rule, cost=None, vjp=None, multiple_results: bool = False):
        self.name = name
        self.shape_rule = shape_rule
        self.cost = cost
        self.vjp = vjp
        self.impl: dict = {}
        self.multiple_results = multiple_results
        REGISTRY.append(self)

    def __repr__(self):
        return f"Primitive({self.name!r})"

    def abstract_impl(self, storages, mesh, **params):
        """The abstract backend's implementation unless ``impl["abstract"]`` is registered: the
        shape rule's outputs as AbstractStorage (shapes, dtypes, varying axes; no data)."""
        return avals_shape_rule(self, storages, mesh, **params)


def bind(prim: Primitive, args, mesh, **params):
    """Runs `prim` on LocalArrays `args` (all of `mesh`); returns a LocalArray, or a list of
    them for primitives with several results."""
    storages = [a.storage if type(a) is LocalArray else a for a in args]
    backend = _real_backend
    if mesh.abstract:
        backend = "abstract"
    else:
        for s in storages:
            if type(s) is AbstractStorage:
                backend = "abstract"
                break
    impl = prim.impl.get(backend)
    if impl is None and backend in _DERIVED:  # a primitive made after the backend started (mpi)
        impl = _DERIVED[backend](prim)
    if impl is None:
        if backend != "abstract":
            raise NotImplementedError(f"[{prim.name}] has no {backend} implementation")
        impl = prim.abstract_impl
    ctx = CTX
    replay = ctx.remat_replay
    if replay is not None and replay[1] and replay[0](prim, args, params):
        # A checkpoint's re-run: this output was kept by its policy, so it is not recomputed.
        results = replay[1].pop(0)
        for tape in ctx.tapes:
            tape.push(prim, params, args, results, mesh)
        return results if prim.multiple_results else results[0]
    try:
        outs = impl(storages, mesh, **params)
    except (MemoryError, ValueError) as e:
        if is_refusal(e):  # numpy would not make an output this large: say which op and how large
            _refused(prim, storages, mesh, params, e)
        raise
    cost = prim.cost
    event = None
    if cost is not None:
        event = cost(storages, outs, mesh, **params)
        if event is not None:
            record(event, mesh)
    results = [wrap(o, mesh) for o in outs]
    if ctx.recorders:  # jit(f).trace / lower: the program being recorded (transforms/lowered.py)
        for r in ctx.recorders:
            r.bind(prim, params, args, results, mesh, event)
    saving = ctx.remat_saving
    if saving is not None and saving[0](prim, args, params):
        saving[1].append(results)
    tapes = ctx.tapes
    if tapes:
        for tape in tapes:
            tape.push(prim, params, args, results, mesh)
    return results if prim.multiple_results else results[0]


class Tape:
    """The reverse-mode record: one entry per bind while a gradient is being taken.

    An entry is (rule, params, inputs, outputs, mesh): `rule` is a Primitive (its ``vjp``
    runs) or any object with a ``vjp`` of the same signature (shard_map's boundary,
    checkpoint). Inputs and outputs are kept alive by the tape, so ``id()`` names them.

    Only steps that depend on the values being differentiated are recorded (``watch`` names
    them; each recorded step's outputs join them), as JAX traces only what depends on its
    inputs: a constant entering shard_map gets no transpose, so no gradient all-reduce.
    """

    __slots__ = ("entries", "labels", "live")

    def __init__(self):
        self.entries: list = []
        self.labels: list = []  # the named scopes active at each push, so the backward keeps them
        self.live: set = set()  # ids of the watched values and of every recorded output

    def watch(self, values) -> None:
        """Marks `values` as the ones being differentiated."""
        self.live.update(id(v) for v in values)

    def push(self, rule, params, inputs, outputs, mesh) -> None:
        live = self.live
        for x in inputs:
            if id(x) in live:
                break
        else:
            return  # nothing here depends on a watched value
        live.update(id(o) for o in outputs)
        self.entries.append((rule, params, tuple(inputs), tuple(outputs), mesh))
        self.labels.append(tuple(CTX.scopes))


def push_entry(rule, params, inputs, outputs, mesh) -> None:
    """Records a non-primitive step (a boundary, a remat block) on every active tape."""
    for tape in CTX.tapes:
        tape.push(rule, params, inputs, outputs, mesh)
    for r in CTX.recorders:  # jit(f).trace: a backward walk's boundary links its values
        r.step(rule, params, inputs, outputs, mesh)


def _refused(prim: Primitive, storages, mesh, params, cause):
    """The ``[op] needs N GiB`` MemoryError for outputs numpy refused to make (their bytes from
    the shape rule, so the check costs nothing until an allocation fails)."""
    shapes = prim.shape_rule(storages, mesh, **params)
    local = [tuple(s[mesh.ndim:]) for s, _ in shapes]
    refused(prim.name, shapes,
            f"its output of local shape {local[0] if len(local) == 1 else local} is held for every device of "
            f"the mesh; shard it over more axes, or use an abstract mesh (make_mesh(..., abstract=True)) or "
            f"eval_shape for shapes without data", cause)


def avals_shape_rule(prim: Primitive, storages, mesh, **params):
    """The shape rule's outputs as AbstractStorage (what the abstract backend returns)."""
    return [AbstractStorage(s, d) for s, d in prim.shape_rule(storages, mesh, **params)]
