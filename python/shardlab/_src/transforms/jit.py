"""``jit`` with JAX's signature, its ahead-of-time stages, and ``block_until_ready``.

shardlab executes eagerly: calling a jitted function runs it directly, with the arguments
placed per ``in_shardings`` and the results per ``out_shardings`` (a reshard of a global
array records its collectives in the ledger, as the compiled program would run them).
``jit(f).trace(*args)`` / ``.lower(*args)`` record the program instead of running it:
arguments may be arrays or ``ShapeDtypeStruct``s (on abstract meshes of any size), and the
program runs shape-only, as ``eval_shape`` runs it (see ``lowered.py`` and ``program.py``).

``donate_argnums`` / ``donate_argnames`` are recorded (``Compiled.memory_analysis`` counts
the aliased bytes) but nothing is freed; ``keep_unused``, ``device``, ``backend``, ``inline``,
``compiler_options`` and ``abstracted_axes`` are accepted and change nothing.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((4,), ("x",))
    >>> f = sl.jit(lambda a: a * 2, out_shardings=sl.NamedSharding(mesh, P("x")))
    >>> f(np.ones(8)).sharding.spec == P("x")
    True
    >>> f.lower(np.ones(8, np.float32)).compile().output_shardings.spec == P("x")
    True
"""

from __future__ import annotations

import functools
import inspect
import types

import numpy as np

from ..arrays.local_array import LocalArray
from ..arrays.sharded_array import ShardedArray, abstract_array, device_put
from ..arrays.storage import AbstractStorage
from ..core import tree as _tree
from ..core.context import CTX
from ..core.dtypes import canonicalize, canonicalize_dtype
from ..core.mesh import UNIT_MESH, get_mesh
from ..core.sharding import NamedSharding, PartitionSpec, as_sharding
from . import program as _program
from .eval_shape import ShapeDtypeStruct
from .lowered import ShapedArray, Traced


_planner_reshard = None   # reshard(x, sharding): register_reshard


def register_reshard(reshard) -> None:
    """``reshard(x, sharding)``: the global-view reshard (the planner's, which records its
    collectives) that ``jit(out_shardings=)`` moves results with; ``planning/global_ops.py``
    registers it beside its definition (planning sits above transforms)."""
    global _planner_reshard
    _planner_reshard = reshard


def _is_sharding(x) -> bool:
    return x is None or isinstance(x, (NamedSharding, PartitionSpec)) or type(x).__name__.endswith("Sharding")


def _is_value(x) -> bool:
    return isinstance(x, (ShardedArray, LocalArray, ShapeDtypeStruct, np.ndarray))


def _canonical_args(tree):
    """numpy arguments in JAX's dtypes, as jit's arguments are (x64 off: int64 -> int32,
    float64 -> float32), so the function computes in the types JAX's would."""
    leaves, treedef = _tree.flatten(tree, _is_value)
    if not any(type(x) is np.ndarray and x.dtype.kind in "iuf" and canonicalize_dtype(x.dtype) != x.dtype
               for x in leaves):
        return tree
    return _tree.unflatten(treedef, [canonicalize(x, "jit") if type(x) is np.ndarray else x for x in leaves])


def _argnums(v, what: str) -> tuple:
    if v is None:
        return ()
    if isinstance(v, (int, np.integer)):
        return (int(v),)
    try:
        return tuple(int(i) for i in v)
    except TypeError:
        raise TypeError(f"[jit] {what} must be an int or a sequence of ints, got {v!r}") from None


def _argnames(v) -> tuple:
    if v is None:
        return ()
    return (v,) if isinstance(v, str) else tuple(v)


def _resolve(sharding, what: str):
    """A NamedSharding from a NamedSharding or a PartitionSpec (which needs set_mesh)."""
    if sharding is None or not isinstance(sharding, (PartitionSpec, NamedSharding)):
        return sharding
    if isinstance(sharding, PartitionSpec) and get_mesh() is None:
        raise RuntimeError(f"jit requires a non-empty mesh in context if you are passing `PartitionSpec`s to "
                           f"{what}. You can define a context mesh via `jax.set_mesh(mesh)`. Alternatively, "
                           f"provide `Sharding`s to {what} and then the mesh context manager is not required.")
    return as_sharding(sharding, "jit")


class JitWrapped:
    """A jitted function (``jax.jit``'s result): call it, or ``.trace`` / ``.lower`` /
    ``.eval_shape`` it for given argument types."""

    def __init__(self, fun, *, in_shardings, out_shardings, static_argnums, static_argnames, donate_argnums,
                 donate_argnames):
        functools.update_wrapper(self, fun)
        self._fun = fun
        self._in_shardings = in_shardings
        self._out_shardings = out_shardings
        try:
            sig = inspect.signature(fun)
        except (TypeError, ValueError):
            sig = None
        static_argnums, static_argnames = _argnums(static_argnums, "static_argnums"), _argnames(static_argnames)
        donate_argnums, donate_argnames = _argnums(donate_argnums, "donate_argnums"), _argnames(donate_argnames)
        if sig is not None:
            params = list(sig.parameters.values())
            positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
            if not varargs:
                for i in static_argnums:
                    if not -len(positional) <= i < len(positional):
                        raise ValueError(f"Jitted function has static_argnums={static_argnums}, but only accepts "
                                         f"{len(positional)} positional arguments.")
            # JAX infers the names of static positions and the positions of static names.
            static_argnames += tuple(positional[i] for i in static_argnums
                                     if -len(positional) <= i < len(positional) and positional[i] not in static_argnames)
            static_argnums += tuple(positional.index(n) for n in static_argnames
                                    if n in positional and positional.index(n) not in static_argnums)
            donate_argnums += tuple(positional.index(n) for n in donate_argnames
                                    if n in positional and positional.index(n) not in donate_argnums)
        self._static_argnums = static_argnums
        self._static_argnames = static_argnames
        self._donate_argnums = donate_argnums
        self._donate_argnames = donate_argnames

    def __get__(self, obj, objtype=None):
        return self if obj is None else types.MethodType(self, obj)

    def __repr__(self):
        return f"<jitted {getattr(self._fun, '__qualname__', self._fun)!r}>"

    # -- arguments -------------------------------------------------------------------------------
    def _split(self, args, kwargs):
        """(dynamic args, dynamic kwargs, static positional by index, static kwargs)."""
        n = len(args)
        static_idx = {i % n for i in self._static_argnums if -n <= i < n}
        static_pos = {i: args[i] for i in static_idx}
        static_kw = {k: v for k, v in kwargs.items() if k in self._static_argnames}
        for v in list(static_pos.values()) + list(static_kw.values()):
            try:
                hash(v)
            except TypeError as e:
                raise ValueError(f"Non-hashable static arguments are not supported. An error occurred while trying "
                                 f"to hash an object of type {type(v)}, {v}. The error was:\nTypeError: {e}\n") from None
        dyn = tuple(a for i, a in enumerate(args) if i not in static_idx)
        dyn_kw = {k: v for k, v in kwargs.items() if k not in self._static_argnames}
        return dyn, dyn_kw, static_pos, static_kw

    def _donated(self, n_args: int, dyn, static_pos, dyn_kw) -> set:
        """Flat indices (over the leaves of (dyn, dyn_kw)) of the donated arguments."""
        donate = {i % n_args for i in self._donate_argnums if -n_args <= i < n_args}
        orig = [i for i in range(n_args) if i not in static_pos]
        out, pos = set(), 0
        for j, a in enumerate(dyn):
            n = len(_tree.flatten(a, _is_value)[0])
            if orig[j] in donate:
                out.update(range(pos, pos + n))
            pos += n
        for k in sorted(dyn_kw):
            n = len(_tree.flatten(dyn_kw[k], _is_value)[0])
            if k in self._donate_argnames:
                out.update(range(pos, pos + n))
            pos += n
        return out

    def _in_sharding_leaves(self, dyn) -> list:
        """One sharding (or None) per leaf of the dynamic positional arguments."""
        spec = self._in_shardings
        if spec is None:
            return [None] * len(_tree.flatten(dyn, _is_value)[0])
        if isinstance(spec, list):
            spec = tuple(spec)
        if isinstance(spec, tuple) and not isinstance(spec, PartitionSpec) and len(spec) != len(dyn):
            raise ValueError(f"[jit] {len(spec)} in_shardings for {len(dyn)} arguments: "
                             f"pjit in_shardings specification must be a tree prefix of the positional arguments "
                             f"tuple. In particular, pjit in_shardings must either be a Sharding, a PartitionSpec, "
                             f"or a tuple of length equal to the number of positional arguments. But pjit "
                             f"in_shardings is the wrong length: got a tuple or list of length {len(spec)} for an "
                             f"args tuple of length {len(dyn)}.")
        if not isinstance(spec, tuple) or isinstance(spec, PartitionSpec):
            spec = (spec,) * len(dyn)
        leaves = _tree.broadcast_prefix(spec, dyn, _is_sharding, "in_shardings")
        return [_resolve(s, "in_shardings") for s in leaves]

    @staticmethod
    def _check_committed(x, sharding) -> None:
        have = x.sharding if isinstance(x, (ShardedArray, ShapeDtypeStruct)) else None
        if have is not None and sharding is not None and not have.is_equivalent_to(sharding, len(x.shape)):
            raise ValueError(f"Sharding passed to jit does not match the sharding on the respective arg. Got jit "
                             f"sharding: {sharding!r},\narg sharding: {have!r} for arg type: "
                             f"{ShapedArray(x.shape, x.dtype, sharding=have)}")

    def _place_inputs(self, dyn, dyn_kw):
        leaves, treedef = _tree.flatten(dyn, _is_value)
        shardings = self._in_sharding_leaves(dyn)
        out = []
        for x, s in zip(leaves, shardings):
            if s is not None:
                self._check_committed(x, s)
                x = device_put(x, s)
            out.append(x)
        return _tree.unflatten(treedef, out), dyn_kw

    def _place_outputs(self, out):
        if self._out_shardings is None:
            return out
        leaves, treedef = _tree.flatten(out, _is_value)
        specs = _tree.broadcast_prefix(self._out_shardings, out, _is_sharding, "out_shardings")
        placed = []
        for v, s in zip(leaves, specs):
            s = _resolve(s, "out_shardings")
            if s is not None:
                v = _reshard(v, s)
            placed.append(v)
        return _tree.unflatten(treedef, placed)

    # -- call ------------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if self._in_shardings is None and self._out_shardings is None and not self._static_argnums \
                and not self._static_argnames:
            return self._fun(*_canonical_args(args), **_canonical_args(kwargs))  # nothing to place: the plain call
        dyn, dyn_kw, static_pos, static_kw = self._split(args, kwargs)
        dyn, dyn_kw = self._place_inputs(dyn, dyn_kw)
        return self._place_outputs(self._fun(*_merge(dyn, static_pos), **dyn_kw, **static_kw))

    # -- ahead of time ---------------------------------------------------------------------------
    def trace(self, *args, **kwargs) -> Traced:
        """Records the program for these argument types (arrays or ShapeDtypeStructs), shape-only."""
        dyn, dyn_kw, static_pos, static_kw = self._split(args, kwargs)
        pos_leaves, pos_def = _tree.flatten(dyn, _is_value)
        shardings = self._in_sharding_leaves(dyn)
        abstract = [_abstract(x, s, self._check_committed) for x, s in zip(pos_leaves, shardings)]
        kw_leaves, kw_def = _tree.flatten(dyn_kw, _is_value)
        abstract += [_abstract(x, None, self._check_committed) for x in kw_leaves]
        all_leaves, in_tree = _tree.flatten((dyn, dyn_kw), _is_value)
        rec = _program.Recorder()
        invars = [rec.param(v, i) for i, v in enumerate(abstract)]
        donated = self._donated(len(args), dyn, static_pos, dyn_kw)
        ledgers, CTX.ledgers = CTX.ledgers, []
        try:
            with rec:
                a = _tree.unflatten(pos_def, abstract[:len(pos_leaves)])
                kw = _tree.unflatten(kw_def, abstract[len(pos_leaves):])
                out = self._place_outputs(self._fun(*_merge(a, static_pos), **kw, **static_kw))
        finally:
            CTX.ledgers = ledgers
            _forget_events(rec)
        out_leaves, out_tree = _tree.flatten(out, _is_value)
        name = "jit_" + "".join(c if c.isalnum() else "_" for c in getattr(self._fun, "__name__", "fun"))
        program = rec.program(name, invars, out_leaves)
        return Traced(program, in_tree, out_tree, donated, self, (static_pos, static_kw),
                      getattr(self._fun, "__name__", "fun"))

    def lower(self, *args, **kwargs):
        """``self.trace(*args, **kwargs).lower()``: the Lowered stage."""
        return self.trace(*args, **kwargs).lower()

    def eval_shape(self, *args, **kwargs):
        """ShapeDtypeStructs of the results (with their shardings), as ``jax.eval_shape``."""
        return self.trace(*args, **kwargs).out_info

    def clear_cache(self) -> None:
        """Nothing is cached: shardlab compiles nothing."""


def _merge(dyn, static_pos) -> tuple:
    full = list(dyn)
    for i in sorted(static_pos):
        full.insert(i, static_pos[i])
    return tuple(full)


def _reshard(v, sharding: NamedSharding):
    if isinstance(v, ShardedArray):
        if v.sharding == sharding and not v.unreduced:
            return v
        if v.sharding.mesh == sharding.mesh and _planner_reshard is not None:
            out = _planner_reshard(v, sharding)
            if out.sharding != sharding and not out.unreduced and out.sharding.is_equivalent_to(sharding, out.ndim):
                out = ShardedArray(out._storage, sharding, out.shape)  # the sharding asked for, as JAX gives it
            return out
        return device_put(v, sharding)
    if isinstance(v, LocalArray) and v.is_abstract:
        return abstract_array(v.shape, v.dtype, sharding)
    return device_put(v, sharding)


def _abstract(x, sharding, check):
    """The abstract value a traced argument becomes (its data is never read)."""
    if isinstance(x, ShapeDtypeStruct):
        have = x.sharding
        if have is not None and sharding is not None:
            check(x, sharding)
        s = sharding or have
        if s is not None:
            return abstract_array(x.shape, x.dtype, as_sharding(s, "jit"))
        return LocalArray(AbstractStorage(x.shape, x.dtype), UNIT_MESH)
    if isinstance(x, ShardedArray):
        if sharding is not None:
            check(x, sharding)
        return abstract_array(x.shape, x.dtype, sharding or x.sharding)
    if isinstance(x, LocalArray):
        return LocalArray(AbstractStorage(x.storage.shape, x.dtype), x.mesh)
    arr = np.asarray(x)
    dtype = canonicalize(arr[()] if arr.ndim == 0 else arr[:0], "jit").dtype
    if sharding is not None:
        return abstract_array(arr.shape, dtype, sharding)
    return LocalArray(AbstractStorage(arr.shape, dtype), UNIT_MESH)


def _forget_events(rec) -> None:
    """Tracing runs nothing: take its events back out of the meshes' own ledgers."""
    ids = {id(e) for e in rec.events}
    if not ids:
        return
    for eqn in rec.eqns:
        mesh = eqn.mesh
        ledger = getattr(mesh, "_ledger", None) if mesh is not None else None
        if ledger is not None and ledger._events:
            ledger._events = [e for e in ledger._events if id(e) not in ids]


def jit(fun=None, /, *, in_shardings=None, out_shardings=None, static_argnums=None, static_argnames=None,
        donate_argnums=None, donate_argnames=None, keep_unused=False, device=None, backend=None, inline=False,
        compiler_options=None, abstracted_axes=None):
    """``jax.jit``: runs `fun` eagerly (shardlab has no compiler) with JAX's argument handling.

    Args:
        fun: the function. Without it, a decorator (``@jit(out_shardings=...)``).
        in_shardings: a sharding (NamedSharding, or PartitionSpec with ``set_mesh``) or a pytree
            prefix of the positional arguments (static ones left out); arrays are placed so, and
            a global array committed to another sharding raises ValueError, as in JAX.
        out_shardings: the same for the results; a global result is resharded (its collectives
            are recorded in the ledger).
        static_argnums, static_argnames: arguments passed through as Python values (hashable).
        donate_argnums, donate_argnames: recorded (``memory_analysis`` counts the aliased bytes).
        keep_unused, device, backend, inline, compiler_options, abstracted_axes: accepted, no effect.

    Returns:
        A callable with ``.trace``, ``.lower`` and ``.eval_shape`` (see ``jax.stages``).
    """
    kw = dict(in_shardings=in_shardings, out_shardings=out_shardings, static_argnums=static_argnums,
              static_argnames=static_argnames, donate_argnums=donate_argnums, donate_argnames=donate_argnames)
    if fun is None:
        return lambda f: jit(f, **kw)
    if not callable(fun):
        raise TypeError(f"[jit] expected a function: Expected a callable value, got {fun!r}")
    return JitWrapped(fun, **kw)


def block_until_ready(x):
    """Returns `x`: shardlab's values are ready as soon as they exist."""
    return x
