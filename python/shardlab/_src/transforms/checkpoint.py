"""``checkpoint`` (remat): trade activation memory for FLOPs.

Under a gradient, ``checkpoint(f)`` runs `f` without keeping its intermediates on the tape;
the backward walk runs `f` again (its events are tagged ``phase='recompute'`` in the ledger)
and differentiates that re-run. Policies choose what is kept anyway:

- ``None`` / ``"nothing_saveable"``: keep nothing, recompute everything;
- ``"dots_saveable"``: keep the outputs of contractions (matmul / einsum), recompute the rest.

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
from ..primitives import contractions as con
from ..primitives.primitive import Tape, push_entry
from .autodiff import backward

POLICIES = ("nothing_saveable", "dots_saveable")
_SAVEABLE = {"nothing_saveable": frozenset(), "dots_saveable": frozenset({con.EINSUM})}


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
        policy: None or "nothing_saveable" (keep nothing), "dots_saveable" (keep the outputs
            of matmul / einsum); JAX's ``jax.checkpoint_policies.*`` names are accepted.
    """
    if fun is None:
        return lambda f: checkpoint(f, policy=policy)
    if not callable(fun):
        raise TypeError(f"[checkpoint] fun must be callable, got {type(fun).__name__}")
    name = _policy_name(policy)
    saveable = _SAVEABLE[name]

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


def _policy_name(policy) -> str:
    if policy is None:
        return "nothing_saveable"
    name = policy if isinstance(policy, str) else getattr(policy, "__name__", repr(policy))
    if name not in POLICIES:
        raise ValueError(f"[checkpoint] policy {policy!r} is not supported; use None, "
                         f"'nothing_saveable' or 'dots_saveable'")
    return name
