"""Optimizers as per-device elementwise updates: AdamW (Adam with decoupled weight decay) and
SGD, with bf16 params and an fp32 master copy and moments (``precision="mixed"``) or all fp32.

The update is ``shardlab.nn.adamw_update``: on plain numpy arrays (the single-device reference)
it is the expression term by term, on the local shards inside ``shard_map`` one fused C++ pass,
so training on the mesh is checked against an independent computation of the same step.

Example:
    >>> import numpy as np
    >>> from shardlab.train import AdamW
    >>> opt = AdamW(lr=0.1, weight_decay=0.0)
    >>> w, st = np.ones(2, np.float32), opt.init_state(np.ones(2, np.float32))
    >>> w2, st = opt.update(w, np.full(2, 0.5, np.float32), st, step=1)
    >>> [round(float(x), 4) for x in w2]   # the first Adam step moves by lr
    [0.9, 0.9]
"""

from __future__ import annotations

import dataclasses

import numpy as np

import shardlab.nn as snn

__all__ = ["AdamW", "SGD", "get_optimizer"]


@dataclasses.dataclass(frozen=True)
class AdamW:
    """Adam with decoupled weight decay (Loshchilov & Hutter). States: m and v (fp32)."""

    lr: float = 1e-3
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    name: str = "adamw"
    state_names: tuple = ("m", "v")

    def init_state(self, master):
        return {"m": master * np.float32(0), "v": master * np.float32(0)}

    def update(self, master, grad, state, step: int):
        """(new master, new state) from fp32 master weights and a gradient: one fused pass per
        parameter on the shards, the expression term by term on plain arrays."""
        p, m, v = snn.adamw_update(master, grad.astype(np.float32), state["m"], state["v"], lr=self.lr, b1=self.b1,
                                   b2=self.b2, eps=self.eps, weight_decay=self.weight_decay, step=step)
        return p, {"m": m, "v": v}


@dataclasses.dataclass(frozen=True)
class SGD:
    """Plain stochastic gradient descent (no state)."""

    lr: float = 1e-2
    name: str = "sgd"
    state_names: tuple = ()

    def init_state(self, master):
        return {}

    def update(self, master, grad, state, step: int):
        return master - grad.astype(np.float32) * np.float32(self.lr), {}


def get_optimizer(opt):
    """An optimizer instance from an instance or a name ("adam", "adamw", "sgd")."""
    if isinstance(opt, (AdamW, SGD)):
        return opt
    if opt in ("adam", "adamw"):
        return AdamW()
    if opt == "sgd":
        return SGD()
    raise ValueError(f"[train] optimizer {opt!r} is not 'adamw', 'adam', 'sgd' or an AdamW / SGD instance")
