"""What the emulated backend's op families share: the registration decorator and the
source coordinates of a device's block in a storage whose mesh dims may be 1 (invariant)."""

from __future__ import annotations


def _impl(prim):
    def register(fn):
        prim.impl["emulated"] = fn
        return fn

    return register


def _src(coords, shape, k):
    return tuple(c if d != 1 else 0 for c, d in zip(coords, shape[:k]))

