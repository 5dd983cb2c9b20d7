"""``checkpoint`` (remat): trade activation memory for FLOPs.

Under a gradient, ``checkpoint(f)`` runs `f` without keeping its intermediates on the tape;
the backward walk runs `f` again (its events are tagged ``phase='recompute'`` in the ledger)
and differentiates that re-run. Policies choose what is kept anyway:

- ``None`` / ``"nothing_saveable"``: keep nothing, recompute everything;
- ``"dots_saveable"``: keep the outputs of contractions (matmul / einsum), recompute the rest;
- any of ``shardlab.checkpoint_policies.*`` or a callable ``policy(prim, *avals, **params) ->
  bool`` as in JAX (``lambda op, *_, **__: str(op) != 'all_gather'``: keep everything but the
  all-gathers, FSDP's re-gather); see ``checkpoint_policies.py`` for what `prim` is.

Example:
    >>> import numpy as np, shardlab as sl
    >>> import shardlab.numpy as jnp
    >>> f = sl.checkpoint(lambda x: jnp.tanh(x) * 2.0)
    >>> sl.grad(lambda x: jnp.sum(f(x)))(np.zeros(2, np.float32)).tolist()
    [2.0, 2.0]
"""

from __future__ import annotations

import contextlib
import functools

from ..arrays.local_array import LocalArray
from ..arrays.sharded_array import ShardedArray
from ..core import tree
from ..core.context import CTX, phase, shard_map_frame
from ..primitives.primitive import Tape, push_entry
from . import checkpoint_policies as pol
from .autodiff import backward


def _is_value(x) -> bool:
    return isinstance(x, (LocalArray, ShardedArray))


def _nothing():
    return contextlib.nullcontext()


class _Remat:
    """Tape step standing for a whole checkpointed call."""

    name = "checkpoint"

    def __init__(self, fn, treedef, saved: list, saveable, differentiated: list):
        self.fn = fn
        self.treedef = treedef
        self.saved = saved
        self.saveable = saveable
        self.differentiated = differentiated  # per input: does it depend on a differentiated value

    def vjp(self, cts, ins, outs, mesh):
        tape = Tape()
        tape.watch([x for x, d in zip(ins, self.differentiated) if d])
        CTX.tapes.append(tape)
        replay = CTX.remat_replay
        CTX.remat_replay = (self.saveable, list(self.saved))
        try:
            # The re-run binds the axis names of the shard_map body the call was made in,
            # so a checkpointed block may hold collectives (FSDP's re-gather).
            with phase("recompute"), (shard_map_frame(mesh) if mesh is not None else _nothing()):
                result = self.fn(*tree.unflatten(self.treedef, list(ins)))
        finally:
            CTX.tapes.remove(tape)
            CTX.remat_replay = replay
        new_outs = tree.flatten(result, _is_value)[0]
        seeds = {id(o): (o, c) for o, c in zip(new_outs, cts) if _is_value(o) and c is not None}
        found = backward(tape, seeds)
        return [found[id(x)][1] if id(x) in found else None for x in ins]


def checkpoint(fun=None, *, policy=None, prevent_cse: bool = True, static_argnums=()):
    """Rematerialize `fun`'s intermediates in the backward pass (``jax.checkpoint``).

    Args:
        fun: the function (also usable as ``@checkpoint(policy=...)``).
        policy: None (keep nothing), a ``shardlab.checkpoint_policies`` policy or any callable
            ``policy(prim, *avals, **params) -> bool`` (True: keep that primitive's outputs),
            as JAX's; the names "nothing_saveable", "dots_saveable", ... are accepted too.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> import shardlab.numpy as jnp
        >>> f = sl.checkpoint(lambda x: jnp.sin(jnp.sin(x)), policy=lambda prim, *_, **__: str(prim) == "sin")
        >>> round(float(sl.grad(lambda x: f(x).sum())(np.float32(0.5))), 4)
        0.7786
    """
    if fun is None:
        return lambda f: checkpoint(f, policy=policy, prevent_cse=prevent_cse, static_argnums=static_argnums)
    if not callable(fun):
        raise TypeError(f"[checkpoint] fun must be callable, got {type(fun).__name__}")
    saveable = _saveable(_policy(policy))

    @functools.wraps(fun)
    def wrapped(*args):
        if not CTX.tapes:
            return fun(*args)
        leaves, treedef = tree.flatten(args, _is_value)
        tapes, CTX.tapes = CTX.tapes, []
        saving = CTX.remat_saving
        CTX.remat_saving = (saveable, []) if saveable else None
        try:
            result = fun(*args)
            saved = CTX.remat_saving[1] if saveable else []
        finally:
            CTX.tapes = tapes
            CTX.remat_saving = saving
        outs = tree.flatten(result, _is_value)[0]
        ins = list(leaves)
        differentiated = [any(id(x) in t.live for t in tapes) for x in ins]
        rule = _Remat(fun, treedef, saved, saveable, differentiated)
        push_entry(rule, {}, ins, [o for o in outs if _is_value(o)], CTX.meshes[-1] if CTX.meshes else None)
        return result

    return wrapped


def _policy(policy):
    """The policy callable (None: keep nothing; a name of jax.checkpoint_policies: that policy)."""
    if policy is None:
        return None
    if isinstance(policy, str):
        found = getattr(pol.checkpoint_policies, policy, None)
        if found is None or policy.startswith(("save_", "offload_")):
            names = ", ".join(repr(k) for k in vars(pol.checkpoint_policies) if not k.startswith(("save_", "offload_")))
            raise ValueError(f"[checkpoint] policy {policy!r} is not a policy name; use None, one of {names}, "
                             f"or a callable policy(prim, *avals, **params) -> bool (shardlab.checkpoint_policies)")
        return found
    if not callable(policy):
        raise TypeError(f"[checkpoint] policy must be None or a callable policy(prim, *avals, **params) -> bool, "
                        f"got {policy!r} of type {type(policy).__name__}")
    return policy


def _saveable(policy):
    """The test ``bind`` asks of each primitive in a checkpointed call (None: keep nothing)."""
    if policy is None or policy is pol.nothing_saveable:
        return None

    def keep(prim, args, params) -> bool:
        if prim.name in ("shard_map_split", "shard_map_merge"):  # nested shard_map's boundary, not JAX's
            return False
        view, avals, jparams = pol.jax_view(prim, args, params)
        return bool(policy(view, *avals, **jparams))

    return keep
