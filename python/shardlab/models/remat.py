"""Recompute (activation checkpointing) policies: one vocabulary for ``train.Trainer``,
``train.estimate``, :func:`~shardlab.models.training_memory` and
:func:`~shardlab.models.flops_per_token`.

Each transformer layer of the Trainer names its intermediates (:data:`CHECKPOINT_NAMES`, per
token and device; ``Y`` the model axis, ``/Y*`` only under sequence parallelism):

============== ============================================== ======================
name           value                                          elements / token
============== ============================================== ======================
``attn_norm``  the norm before attention                      D /Y*
``qkv``        the Q, K, V projections (one matmul)           (N + 2K)·H / Y
``attn_out``   the attention core's output (+ fp32 logsumexp) N·H / Y (+ 4N/Y bytes)
``attn_proj``  the output projection (partial sums under TP)  D
``mlp_norm``   the norm before the MLP                        D /Y*
``mlp_hidden`` W_in (gated: gate and up, one matmul)          2F / Y (plain F / Y)
``mlp_act``    the activation (gated: act(gate) * up)         F / Y
``mlp_down``   W_out (partial sums under TP)                  D
============== ============================================== ======================

A policy keeps a set of those names for the backward pass; everything else in the layer is
recomputed from the layer's input, which a checkpoint always keeps (D /Y* per token). Kept
matmul outputs are not recomputed; a matmul (or the attention core) whose output is not kept is
recomputed once, in phase ``recompute`` of the ledger.

================ ============================================== ==============================
policy           keeps                                          recomputes
================ ============================================== ==============================
``none``         everything (no checkpoint)                     nothing
``full``         the layer input                                the whole layer forward
``selective``    every name but ``attn_out`` (Megatron-LM's     the attention core
                 selective recompute)
``dots``         the matmul outputs (JAX's ``dots_saveable``)   the attention core
``ffw_outputs``  ``mlp_hidden`` and ``mlp_down`` (the book's    Q/K/V, attention, W_O
                 part 5: 2·L·B·(D + 2F) bytes in bf16)
a set of names   those names                                    the rest
================ ============================================== ==============================

Aliases: ``None`` = ``"none"``, ``"nothing_saveable"`` = ``"full"``, ``"dots_saveable"`` and
``"attention"`` (its older name) = ``"dots"``.

Example:
    >>> from shardlab.models import remat_policy
    >>> remat_policy("ffw_outputs").saved == {"mlp_hidden", "mlp_down"}
    True
    >>> remat_policy({"qkv", "mlp_down"}).name
    "names('qkv', 'mlp_down')"
    >>> remat_policy("dots").recomputes("attn_out"), remat_policy(None).checkpointed
    (True, False)
"""

from __future__ import annotations

import dataclasses

__all__ = ["CHECKPOINT_NAMES", "MATMUL_NAMES", "POLICIES", "RematPolicy", "remat_policy"]

CHECKPOINT_NAMES = ("attn_norm", "qkv", "attn_out", "attn_proj", "mlp_norm", "mlp_hidden", "mlp_act", "mlp_down")
#: the names that are outputs of matmuls (kept: the matmul is not recomputed)
MATMUL_NAMES = ("qkv", "attn_proj", "mlp_hidden", "mlp_down")

POLICIES = {
    "none": None,
    "full": frozenset(),
    "selective": frozenset(CHECKPOINT_NAMES) - {"attn_out"},
    "dots": frozenset(MATMUL_NAMES),
    "ffw_outputs": frozenset({"mlp_hidden", "mlp_down"}),
}
_ALIASES = {None: "none", "nothing_saveable": "full", "dots_saveable": "dots", "attention": "dots"}


@dataclasses.dataclass(frozen=True)
class RematPolicy:
    """A recompute policy: ``saved`` is the set of checkpoint names kept for the backward pass,
    or None when the layer is not checkpointed at all (everything kept)."""

    name: str
    saved: frozenset | None

    @property
    def checkpointed(self) -> bool:
        """Whether each layer runs under a checkpoint (every policy but ``none``)."""
        return self.saved is not None

    def recomputes(self, name: str) -> bool:
        """Whether the value ``name`` is recomputed in the backward pass."""
        return self.saved is not None and name not in self.saved

    def __str__(self):
        return self.name


def _valid() -> str:
    return (f"one of {', '.join(repr(p) for p in POLICIES)} (aliases: None, 'nothing_saveable', 'dots_saveable', "
            f"'attention'), or a set of checkpoint names from {', '.join(CHECKPOINT_NAMES)}")


def remat_policy(policy, op: str = "remat") -> RematPolicy:
    """The :class:`RematPolicy` of a name, an alias, a set of checkpoint names or a RematPolicy.

    Raises:
        ValueError: an unknown policy or checkpoint name (the message lists the valid ones).
    """
    if isinstance(policy, RematPolicy):
        return policy
    if policy is None or isinstance(policy, str):
        name = _ALIASES.get(policy, policy)
        if name not in POLICIES:
            raise ValueError(f"[{op}] remat {policy!r} is not a recompute policy; use {_valid()}")
        return RematPolicy(name, POLICIES[name])
    if isinstance(policy, (set, frozenset, tuple, list)):
        names = tuple(policy)
        bad = [n for n in names if n not in CHECKPOINT_NAMES]
        if bad:
            raise ValueError(f"[{op}] remat names {bad} are not checkpoint names of the Trainer's layers; "
                             f"use names from {', '.join(CHECKPOINT_NAMES)}")
        ordered = tuple(n for n in CHECKPOINT_NAMES if n in names)
        return RematPolicy(f"names{ordered!r}" if len(ordered) != 1 else f"names({ordered[0]!r})", frozenset(names))
    raise TypeError(f"[{op}] remat must be a policy name, None, a set of checkpoint names or a RematPolicy, "
                    f"got {type(policy).__name__}: use {_valid()}")
