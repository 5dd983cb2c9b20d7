"""Comparing a sharded training run with the single-device reference: the one place the
training tests flatten parameter trees and measure how far two runs are apart."""

from __future__ import annotations

import numpy as np


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
