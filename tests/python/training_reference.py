"""Comparing a sharded training run with the single-device reference: the one place the
training tests flatten parameter trees and measure how far two runs are apart."""

from __future__ import annotations

import numpy as np

from shardlab import train
from shardlab.models import transformer


def leaves_by_key(tree) -> list:
    """Leaves of a params/grads tree in key-sorted order (grad trees may order dict keys
    differently from the params they came from)."""
    if isinstance(tree, dict):
        return [x for k in sorted(tree) for x in leaves_by_key(tree[k])]
    if isinstance(tree, list):
        return [x for v in tree for x in leaves_by_key(v)]
    return [tree]


def rel_error(got, ref) -> float:
    """The largest per-leaf max |got - ref| / max |ref| over two trees of the same structure
    (arrays, ShardedArrays or numpy values)."""
    return max(float(np.max(np.abs(np.asarray(a) - b)) / np.max(np.abs(b)))
               for a, b in zip(leaves_by_key(got), leaves_by_key(ref)))


def steps_error(cfg, strategy, mesh, tokens, targets, *, steps: int = 5, microbatches: int = 2,
                lr: float = 0.5) -> float:
    """Trains `steps` SGD steps under `strategy` on `mesh` and the same steps on one device
    (``train.reference_step``); returns the relative error of the final params."""
    p0 = transformer.init_params(cfg, seed=0)
    opt = train.SGD(lr=lr)
    ref = p0
    for s in range(1, steps + 1):
        ref, _ = train.reference_step(cfg, ref, tokens, targets, opt, s, microbatches=microbatches)
    trainer = train.Trainer(cfg, strategy, mesh, optimizer=opt, microbatches=microbatches)
    state = trainer.init(p0)
    for _ in range(steps):
        state, _ = trainer.step(state, tokens, targets)
    return rel_error(state.params, ref)
