"""Greedy speculative decoding with two models of the library, and its measured acceptance.

A draft model proposes ``k`` tokens one at a time; the target scores all of them in one
forward of k + 1 tokens; the longest prefix the target agrees with is kept, plus the target's
own next token. Under greedy decoding the output is exactly the target's (the book's appendix D),
so the test is token-for-token equality with :func:`shardlab.serve.generate`. Rejected tokens
are rolled back by shortening the caches.

``layer_skip_draft`` builds a draft from the target's first layers (an early-exit draft that
shares the target's weights, as the book's "draft head inside the main model").

Example:
    >>> import numpy as np
    >>> from shardlab.models import ModelConfig, transformer
    >>> from shardlab.serve import generate
    >>> from shardlab.serve.speculative import layer_skip_draft, speculative_generate
    >>> cfg = ModelConfig(num_layers=4, d_model=32, ffw_dim=64, num_heads=4, vocab_size=40)
    >>> params = transformer.init_params(cfg, seed=0)
    >>> dparams, dcfg = layer_skip_draft(params, cfg, 1)
    >>> prompt = np.array([[1, 2, 3]])
    >>> out, stats = speculative_generate(params, cfg, dparams, dcfg, prompt, 12, k=3)
    >>> bool((out == generate(params, cfg, prompt, 12)).all()), 0 <= stats["acceptance"] <= 1
    (True, True)
"""

from __future__ import annotations

import numpy as np

from shardlab.models import ModelConfig

from .generate import forward_cached
from .kv_cache import ContiguousKVCache

__all__ = ["speculative_generate", "layer_skip_draft"]


def layer_skip_draft(params: dict, cfg: ModelConfig, layers: int):
    """(params, cfg) of a draft made of the target's first ``layers`` layers (same embedding,
    final norm and head)."""
    if not 1 <= layers <= cfg.num_layers:
        raise ValueError(f"[layer_skip_draft] layers {layers} must be in [1, {cfg.num_layers}]")
    dcfg = cfg.replace(num_layers=layers, first_dense_layers=min(cfg.first_dense_layers, layers))
    return {**params, "layers": params["layers"][:layers]}, dcfg


def speculative_generate(params: dict, cfg: ModelConfig, draft_params: dict, draft_cfg: ModelConfig,
                         prompt, max_new_tokens: int, k: int = 4):
    """Greedy speculative decoding of one sequence ``prompt`` [1, T0].

    Returns ``(tokens [1, n], stats)`` with ``stats`` = proposed, accepted, acceptance (accepted /
    proposed), target_calls and tokens_per_call (the figure the simulator's
    ``tokens_per_verify`` predicts from the acceptance rate).
    """
    prompt = np.asarray(prompt)
    if prompt.ndim != 2 or prompt.shape[0] != 1:
        raise ValueError(f"[speculative_generate] prompt must be [1, T] (one sequence), got {prompt.shape}")
    if k < 1:
        raise ValueError(f"[speculative_generate] k {k} must be >= 1 draft tokens")
    T0 = prompt.shape[1]
    room = T0 + max_new_tokens + k + 1
    tc, dc = ContiguousKVCache(cfg, 1, room), ContiguousKVCache(draft_cfg, 1, room)
    last = int(np.argmax(np.asarray(forward_cached(params, prompt, cfg, tc))[0, -1]))
    forward_cached(draft_params, prompt, draft_cfg, dc)
    out, proposed, accepted, calls = [last], 0, 0, 0
    while len(out) < max_new_tokens:
        base = int(tc.lengths[0])
        drafts, x = [], last
        for _ in range(k):
            x = int(np.argmax(np.asarray(forward_cached(draft_params, np.array([[x]]), draft_cfg, dc))[0, -1]))
            drafts.append(x)
        logits = np.asarray(forward_cached(params, np.array([[last] + drafts]), cfg, tc))[0]
        calls += 1
        pred = np.argmax(logits, axis=-1)
        j = 0
        while j < k and drafts[j] == pred[j]:
            j += 1
        proposed += k
        accepted += j
        if j == k:                      # the draft never saw its own last token: write its KV
            forward_cached(draft_params, np.array([[drafts[-1]]]), draft_cfg, dc)
        tc.lengths[0] = dc.lengths[0] = base + j + 1
        last = int(pred[j])
        out.extend(drafts[:j] + [last])
    out = out[:max_new_tokens]
    return np.array([out]), {"proposed": proposed, "accepted": accepted,
                             "acceptance": accepted / proposed if proposed else 0.0, "target_calls": calls,
                             "tokens_per_call": (len(out) - 1) / calls if calls else 0.0}
