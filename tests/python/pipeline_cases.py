"""The model, batch and tree helpers the pipeline tests share."""

from __future__ import annotations

import numpy as np

from shardlab.models import ModelConfig, transformer

CFG = ModelConfig(num_layers=4, d_model=32, ffw_dim=64, num_heads=4, num_kv_heads=2, vocab_size=50)
TIED = ModelConfig(num_layers=2, d_model=32, ffw_dim=64, num_heads=4, num_kv_heads=2, vocab_size=50,
                   tie_embeddings=True, positions="learned", max_seq_len=16)
_RNG = np.random.default_rng(0)
TOK = _RNG.integers(0, 50, (8, 8))
TGT = _RNG.integers(0, 50, (8, 8))


def init_params(cfg=CFG):
    return transformer.init_params(cfg, seed=1)


def leaves(t) -> list:
    """Leaves of a params/grads tree in key-sorted order, as numpy arrays; a tuple of axis
    names (a ``param_axes`` leaf) stays one leaf."""
    if isinstance(t, dict):
        return [x for k in sorted(t) for x in leaves(t[k])]
    if isinstance(t, (list, tuple)) and not (t and isinstance(t[0], str)):
        return [x for v in t for x in leaves(v)]
    return [t if isinstance(t, tuple) else np.asarray(t)]
