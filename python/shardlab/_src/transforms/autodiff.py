"""Reverse-mode autodiff: ``vjp``, ``grad``, ``value_and_grad``.

There is no tracer to compile, so reverse mode is a tape (as PyTorch and MLX do it): while
`f` runs, every primitive bind and every shard_map boundary is recorded with its inputs and
outputs; the backward walk calls each rule's ``vjp`` in reverse order. The backward pass runs
primitives too, so its collectives and GEMMs land in the ledger with ``phase='backward'``.

Example:
    >>> import numpy as np, shardlab as sl
    >>> import shardlab.numpy as jnp
    >>> sl.grad(lambda x: jnp.sum(x * x))(np.array([1.0, 2.0], np.float32)).tolist()
    [2.0, 4.0]
"""

from __future__ import annotations

import numpy as np

from ..arrays.host_array import as_host
from ..arrays.local_array import LocalArray
from ..arrays.sharded_array import ShardedArray, device_put
from ..arrays.storage import AbstractStorage, is_abstract
from ..core import tree
from ..core.context import CTX, phase
from ..core.dtypes import bfloat16
from ..core.mesh import UNIT_MESH
from ..primitives import collectives as col
from ..primitives import elementwise as ew
from ..primitives.primitive import Tape, bind


def _is_value(x) -> bool:
    return isinstance(x, (LocalArray, ShardedArray))


def _is_float(dtype) -> bool:
    return np.dtype(dtype).kind in "fc" or np.dtype(dtype) == bfloat16


# -- cotangent arithmetic --------------------------------------------------------------------
def _ones_like(x):
    if isinstance(x, ShardedArray):
        st = x._storage
        storage = AbstractStorage(st.shape, st.dtype) if is_abstract(st) else np.ones(st.shape, st.dtype)
        return ShardedArray(storage, x.sharding, x.shape)
    st = x.storage
    storage = AbstractStorage(st.shape, st.dtype) if is_abstract(st) else np.ones(st.shape, st.dtype)
    return LocalArray(storage, x.mesh)


def zeros_like_value(x):
    """A zero cotangent for value `x` (stride 0: no memory)."""
    if isinstance(x, ShardedArray):
        st = x._storage
        storage = AbstractStorage(st.shape, st.dtype) if is_abstract(st) else \
            np.broadcast_to(np.zeros((), st.dtype), st.shape)
        return ShardedArray(storage, x.sharding, x.shape)
    st = x.storage
    storage = AbstractStorage(st.shape, st.dtype) if is_abstract(st) else \
        np.broadcast_to(np.zeros((), st.dtype), st.shape)
    return LocalArray(storage, x.mesh)


def add_cotangents(primal, a, b):
    """a + b, two cotangents of `primal`. For per-device values, a cotangent that is exact
    along an axis where the other holds partial sums is first written as partials (it sits on
    one device), so the sum of partials stays the true cotangent."""
    if isinstance(primal, ShardedArray):
        if not isinstance(b, ShardedArray) or b.sharding != a.sharding:
            b = device_put(np.asarray(b), a.sharding)
        if not (a.unreduced or b.unreduced):
            return a + b  # the global add: recorded by jit(f).trace, shape-only runs keep both terms
        if a.is_abstract or b.is_abstract:
            return a
        return ShardedArray(np.asarray(a._storage + b._storage), a.sharding, a.shape)
    mesh = primal.mesh
    k = mesh.ndim
    prim_dims = primal.storage.shape[:k]
    axes_a = [mesh.axis_names[i] for i in range(k) if prim_dims[i] == 1 and a.storage.shape[i] != 1
              and b.storage.shape[i] == 1]
    axes_b = [mesh.axis_names[i] for i in range(k) if prim_dims[i] == 1 and b.storage.shape[i] != 1
              and a.storage.shape[i] == 1]
    if axes_a:
        b = col.to_partial(b, axes_a)
    if axes_b:
        a = col.to_partial(a, axes_b)
    return bind(ew.PRIMS["add"], [a, b], mesh)


# -- the backward walk -----------------------------------------------------------------------
def _depending_on(tape: Tape, sources) -> set:
    """ids of the values on `tape` that depend on the values `sources` (a forward scan)."""
    active = {id(x) for x in sources}
    for _, _, ins, outs, _ in tape.entries:
        if any(id(x) in active for x in ins):
            active.update(id(o) for o in outs)
    return active


def backward(tape: Tape, seeds: dict, wrt=None) -> dict:
    """Walks `tape` in reverse from `seeds` (id(value) → (value, cotangent)); returns the
    cotangents of every value reached, as id → (value, cotangent).

    With `wrt` (values), only cotangents leading to those values are computed: steps that do
    not depend on them are skipped, and rules skip operands nobody asked for (a weight
    gradient's matmul when only the input gradient is wanted — zero-bubble pipelines split a
    backward pass this way)."""
    cts = dict(seeds)
    active = None if wrt is None else _depending_on(tape, wrt)
    # Rules skip operands whose cotangent nobody needs: those not depending on a watched value
    # (x in x @ w when only w is differentiated) or, with `wrt`, not leading to it.
    outer_wanted, CTX.wanted = CTX.wanted, (tape.live if active is None else active)
    try:
        with phase("backward"):
            _walk(tape, cts, active)
    finally:
        CTX.wanted = outer_wanted
    return cts


def _walk(tape: Tape, cts: dict, active) -> None:
    for (rule, params, ins, outs, mesh), scopes in zip(reversed(tape.entries), reversed(tape.labels)):
        if active is not None and not any(id(x) in active for x in ins):
            continue
        found = [cts.pop(id(o), None) for o in outs]
        if all(c is None for c in found):
            continue
        out_cts = [zeros_like_value(o) if c is None else c[1] for o, c in zip(outs, found)]
        if rule.vjp is None:
            if any(_is_value(x) and _is_float(x.dtype) for x in ins):
                raise NotImplementedError(f"[grad] {rule.name} is not differentiable; "
                                          f"keep it out of the function being differentiated")
            continue
        # The transpose of an op is labelled with the op's named scope (as in JAX).
        outer, CTX.scopes = CTX.scopes, list(scopes)
        try:
            in_cts = rule.vjp(out_cts, list(ins), list(outs), mesh, **params)
        finally:
            CTX.scopes = outer
        for x, c in zip(ins, in_cts):
            if c is None or not _is_value(x) or (active is not None and id(x) not in active):
                continue
            prev = cts.get(id(x))
            cts[id(x)] = (x, c if prev is None else add_cotangents(x, prev[1], c))


# -- vjp / grad ------------------------------------------------------------------------------
def _wrap_input(x, i: int, op: str):
    """A differentiable stand-in for argument leaf `x`: per-device and global values are
    tracked as they are; numpy arrays and scalars become one-device LocalArrays."""
    if _is_value(x):
        return x
    if isinstance(x, AbstractStorage):
        return LocalArray(x, UNIT_MESH)
    arr = np.asarray(x)
    if arr.dtype == object:
        raise TypeError(f"[{op}] argument leaf {i} ({type(x).__name__}) is not an array")
    if arr.dtype == np.float64:
        arr = arr.astype(np.float32)  # JAX's default (x64 off)
    return LocalArray(arr, UNIT_MESH)


def _unwrap(v):
    """The user's view of a value: one-device LocalArrays are HostArrays (JAX's Array on one
    device), unless an enclosing grad is tracing the value (grad of grad): then it stays a
    tracked LocalArray, or the outer derivative would see a constant and come out zero."""
    if isinstance(v, LocalArray) and v.mesh is UNIT_MESH:
        if any(id(v) in t.live for t in CTX.tapes):
            return v
        return as_host(v.storage) if isinstance(v.storage, np.ndarray) else v.storage
    return v


def _flatten_values(x):
    return tree.flatten(x, _is_value)


def vjp(f, *primals, has_aux: bool = False):
    """``(f(*primals), vjp_fn)`` as ``jax.vjp``: ``vjp_fn(cotangent)`` returns one cotangent
    per primal (pytrees, as the primals).

    Example:
        >>> import numpy as np, shardlab as sl
        >>> out, f_vjp = sl.vjp(lambda x: x * 3.0, np.ones(2, np.float32))
        >>> f_vjp(np.ones(2, np.float32))[0].tolist()
        [3.0, 3.0]
    """
    if not callable(f):
        raise TypeError(f"[vjp] f must be callable, got {type(f).__name__}")
    leaves, treedef = _flatten_values(primals)
    inputs = [_wrap_input(x, i, "vjp") for i, x in enumerate(leaves)]
    tape = Tape()
    tape.watch(inputs)
    CTX.tapes.append(tape)
    try:
        result = f(*tree.unflatten(treedef, inputs))
    finally:
        CTX.tapes.remove(tape)
    if has_aux:
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise TypeError("[vjp] has_aux=True needs f to return a pair (output, aux)")
        result, aux = result
    out_leaves, out_def = _flatten_values(result)

    def vjp_fn(cotangent, *, argnums=None):
        """Cotangents of the primals. ``argnums`` (shardlab's extension) computes only those of
        the primals it names — the others come back as zeros — and skips the work that only
        the others need (e.g. weight gradients when the input gradient is asked for)."""
        ct_leaves, ct_def = _flatten_values(cotangent)
        if len(ct_leaves) != len(out_leaves):
            raise ValueError(f"[vjp] the cotangent has {len(ct_leaves)} leaves but the output has "
                             f"{len(out_leaves)}; pass one cotangent per output")
        seeds = {}
        for o, c in zip(out_leaves, ct_leaves):
            if _is_value(o):
                seeds[id(o)] = (o, _as_cotangent(o, c))
        wrt = None
        if argnums is not None:
            nums = _argnums(argnums, len(primals), "vjp")
            wrt = [x for a in nums for x in _flatten_values(tree.unflatten(treedef, inputs)[a])[0] if _is_value(x)]
        cts = backward(tape, seeds, wrt=wrt)
        grads = []
        for x, orig in zip(inputs, leaves):
            hit = cts.get(id(x))
            g = zeros_like_value(x) if hit is None else _finish(x, hit[1])
            grads.append(_unwrap(g))
        return tree.unflatten(treedef, grads)

    out = tree.unflatten(out_def, [_unwrap(o) for o in out_leaves])
    if not has_aux:
        return out, vjp_fn
    aux_leaves, aux_def = _flatten_values(aux)     # the user's view of aux too, as of the output
    return out, vjp_fn, tree.unflatten(aux_def, [_unwrap(a) for a in aux_leaves])


def _as_cotangent(o, c):
    if _is_value(c):
        return c
    if isinstance(o, ShardedArray):
        return device_put(np.asarray(c, o.dtype), o.sharding)
    arr = np.asarray(c, o.dtype)
    if o.mesh is UNIT_MESH:
        return LocalArray(arr.reshape(o.storage.shape), UNIT_MESH)
    return LocalArray(np.broadcast_to(arr, o.shape).reshape((1,) * o.mesh.ndim + o.shape), o.mesh)


def _finish(x, g):
    """The cotangent of an input as the user gets it: partial sums reduced (a recorded psum,
    as JAX's implicit pvary transposes), the input's dtype."""
    if isinstance(x, LocalArray) and x.mesh is not UNIT_MESH:
        partial = col.partial_axes(g, x, x.mesh.axis_names)
        if partial:
            with phase("backward"):
                g = bind(col.PSUM, [g], x.mesh, axes=partial, reduction="sum")
    if isinstance(g, LocalArray) and g.dtype != x.dtype:
        g = LocalArray(g.storage.astype(x.dtype) if not is_abstract(g.storage)
                       else AbstractStorage(g.storage.shape, x.dtype), g.mesh)
    if isinstance(g, LocalArray) and g.mesh is UNIT_MESH and tuple(g.storage.shape) != tuple(x.storage.shape):
        g = LocalArray(np.broadcast_to(g.storage, x.storage.shape) if not is_abstract(g.storage)
                       else AbstractStorage(x.storage.shape, g.dtype), UNIT_MESH)
    return g


def _argnums(argnums, n: int, op: str) -> tuple:
    nums = (argnums,) if isinstance(argnums, (int, np.integer)) else tuple(argnums)
    for a in nums:
        if not isinstance(a, (int, np.integer)) or isinstance(a, bool):
            raise TypeError(f"[{op}] argnums must be ints, got {argnums!r}")
        if not -n <= a < n:
            raise ValueError(f"[{op}] argnums {argnums!r} is out of range for {n} positional arguments")
    return tuple(a % n for a in nums)


def _scalar_of(out, op: str) -> None:
    if isinstance(out, (float, int, np.floating)) and not isinstance(out, bool):
        return
    shape = getattr(out, "shape", None)
    dtype = getattr(out, "dtype", None)
    if shape is None or dtype is None:
        raise TypeError(f"[{op}] the function must return a scalar array, got {type(out).__name__}")
    if tuple(shape) != ():
        raise TypeError(f"[{op}] the function must return a scalar, got an output of shape {tuple(shape)}; "
                        f"use vjp for non-scalar outputs, or reduce (e.g. jnp.sum) first")
    if not _is_float(dtype):
        raise TypeError(f"[{op}] the function must return a float scalar, got {np.dtype(dtype)}")


def value_and_grad(fun, argnums=0, has_aux: bool = False):
    """``(f(*args), gradient)`` as ``jax.value_and_grad``: the gradient of a scalar-valued
    function with respect to the positional arguments named by `argnums`.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> import shardlab.numpy as jnp
        >>> v, g = sl.value_and_grad(lambda w: jnp.sum(jnp.tanh(w)))(np.zeros(3, np.float32))
        >>> float(v), g.tolist()
        (0.0, [1.0, 1.0, 1.0])
    """
    if not callable(fun):
        raise TypeError(f"[value_and_grad] fun must be callable, got {type(fun).__name__}")

    def wrapped(*args, **kwargs):
        nums = _argnums(argnums, len(args), "grad")
        for a in nums:
            for leaf in _flatten_values(args[a])[0]:
                dt = getattr(leaf, "dtype", None) or np.asarray(leaf).dtype
                if not _is_float(dt):
                    raise TypeError(f"[grad] argument {a} has dtype {np.dtype(dt)}; grad needs float inputs "
                                    f"(as JAX): cast with .astype(np.float32)")
        diff = tuple(args[a] for a in nums)

        def f(*d):
            full = list(args)
            for a, v in zip(nums, d):
                full[a] = v
            return fun(*full, **kwargs)

        res = vjp(f, *diff, has_aux=has_aux)
        out, f_vjp = res[0], res[1]
        _scalar_of(out, "grad")
        grads = f_vjp(np.ones((), np.dtype(getattr(out, "dtype", np.float32))) if not _is_value(out)
                      else _ones_like(out))
        g = grads[0] if isinstance(argnums, (int, np.integer)) else grads
        return ((out, res[2]), g) if has_aux else (out, g)

    return wrapped


def grad(fun, argnums=0, has_aux: bool = False):
    """The gradient of a scalar-valued function, as ``jax.grad``; works on plain functions,
    through ``shard_map`` and over global-view ops.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> sl.grad(lambda x, y: (x * y).sum(), argnums=1)(np.float32(3.0), np.float32(2.0))
        Array(3., dtype=float32)
    """
    vg = value_and_grad(fun, argnums=argnums, has_aux=has_aux)

    def wrapped(*args, **kwargs):
        out, g = vg(*args, **kwargs)
        return (g, out[1]) if has_aux else g

    return wrapped
