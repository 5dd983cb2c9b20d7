"""Prefill and decode with a KV cache on the model library's params, and the loop that
generates with them.

``forward_cached`` runs tokens [B, T] of sequences that already hold ``lengths`` cached tokens:
T = the prompt is a prefill, T = 1 a decode step. It reuses ``shardlab.models``' params pytree
and its norm / MLP / MoE layer functions; only attention differs (keys and values come from the
cache). ``generate`` samples ``max_new_tokens`` tokens; ``generate_uncached`` recomputes the
whole sequence every step with ``shardlab.models.transformer.forward`` -- the reference the
cached loop must equal token for token.

Example:
    >>> import numpy as np
    >>> from shardlab.models import ModelConfig, transformer
    >>> from shardlab.serve import generate, generate_uncached
    >>> cfg = ModelConfig(num_layers=2, d_model=32, ffw_dim=64, num_heads=4, num_kv_heads=2,
    ...                   vocab_size=50)
    >>> params = transformer.init_params(cfg, seed=0)
    >>> prompt = np.random.default_rng(0).integers(0, 50, (2, 5))
    >>> out = generate(params, cfg, prompt, max_new_tokens=6)
    >>> out.shape, bool((out == generate_uncached(params, cfg, prompt, 6)).all())
    ((2, 6), True)
"""

from __future__ import annotations

import numpy as np

import shardlab.numpy as jnp
from shardlab.models import ModelConfig, transformer
from shardlab.models.layers import mlp, norm
from shardlab.models.moe import moe_mlp

from .attention import cached_attention, rotary_at
from .kv_cache import ContiguousKVCache
from .sampling import Sampler

__all__ = ["forward_cached", "generate", "generate_uncached", "embed", "qkv", "head"]


def embed(params: dict, tokens, positions, cfg: ModelConfig):
    """Embedding rows of ``tokens`` [B, T] (+ learned positions at ``positions`` [B, T])."""
    x = params["embed"][np.asarray(tokens)]
    if cfg.positions == "learned":
        if np.max(positions) >= cfg.max_seq_len:
            raise ValueError(f"[generate] position {int(np.max(positions))} is past max_seq_len "
                             f"{cfg.max_seq_len} of the learned position table")
        x = x + params["pos_embed"][np.asarray(positions)]
    return x


def qkv(p: dict, h, positions, cfg: ModelConfig, n_heads: int, kv_heads: int):
    """Q [B, T, n, H], K and V [B, T, kv, H] of normed input h [B, T, D] (rotary applied)."""
    B, T = h.shape[0], h.shape[1]
    H = cfg.head_dim

    rows = jnp.reshape(h, (B * T, h.shape[2]))     # one [B T, D] x [D, n H] GEMM: a 3-D operand would
                                                    # have the weight broadcast (copied) per sequence

    def proj(w, b, n):
        y = jnp.matmul(rows, p[w])
        if b in p:
            y = y + p[b]
        return jnp.reshape(y, (B, T, n, H))

    q, k, v = proj("wq", "bq", n_heads), proj("wk", "bk", kv_heads), proj("wv", "bv", kv_heads)
    if cfg.positions == "rotary":
        q = rotary_at(q, positions, cfg.rotary_dim, cfg.rope_theta)
        k = rotary_at(k, positions, cfg.rotary_dim, cfg.rope_theta)
    return q, k, v


def head(params: dict, x, cfg: ModelConfig):
    x = norm(params["final_norm"], x, cfg)
    w = params["head"] if "head" in params else params["embed"].T
    B, T, D = x.shape
    return jnp.reshape(jnp.matmul(jnp.reshape(x, (B * T, D)), w), (B, T, w.shape[1]))


def _ffw(layer: dict, x, cfg: ModelConfig, i: int):
    if cfg.is_moe_layer(i):
        return moe_mlp(layer["moe"], x, cfg)
    return mlp(layer["mlp"], x, cfg)


def forward_cached(params: dict, tokens, cfg: ModelConfig, cache, seqs=None):
    """Logits [B, T, V] for ``tokens`` [B, T] appended to ``seqs`` of ``cache``; writes their
    keys and values into the cache and advances it.

    Args:
        params: ``shardlab.models.transformer.init_params`` pytree.
        tokens: int ids [B, T].
        cfg: the model.
        cache: a ContiguousKVCache (``seqs`` = row indices, default ``range(B)``) or a
            PagedKVCache (``seqs`` = sequence ids, added beforehand with ``add_sequence``).
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"[forward_cached] tokens must be [batch, seq] ids, got shape {tokens.shape}")
    B, T = tokens.shape
    seqs = list(range(B)) if seqs is None else list(seqs)
    if len(seqs) != B:
        raise ValueError(f"[forward_cached] {len(seqs)} sequence ids for a batch of {B}")
    cache.reserve(seqs, T)
    _, _, start = cache.view(0, seqs)
    positions = start[:, None] + np.arange(T)[None, :]
    x = embed(params, tokens, positions, cfg)
    for i, layer in enumerate(params["layers"]):
        h = norm(layer["attn_norm"], x, cfg)
        q, k, v = qkv(layer["attn"], h, positions, cfg, cfg.num_heads, cfg.num_kv_heads)
        cache.write(i, seqs, k, v)
        kk, vv, _ = cache.view(i, seqs)
        o = cached_attention(q, kk, vv, positions, start + T)
        a = jnp.matmul(jnp.reshape(o, (B, T, cfg.num_heads * cfg.head_dim)), layer["attn"]["wo"])
        if "bo" in layer["attn"]:
            a = a + layer["attn"]["bo"]
        if cfg.parallel_residual:
            x = x + a + _ffw(layer, norm(layer["mlp_norm"], x, cfg), cfg, i)
        else:
            x = x + a
            x = x + _ffw(layer, norm(layer["mlp_norm"], x, cfg), cfg, i)
    cache.advance(seqs, T)
    return head(params, x, cfg)


def generate(params: dict, cfg: ModelConfig, prompt, max_new_tokens: int, sampler: Sampler | None = None,
             cache=None) -> np.ndarray:
    """Prefill ``prompt`` [B, T0] then decode ``max_new_tokens`` tokens; returns them [B, n].

    The cache defaults to a ContiguousKVCache of exactly ``T0 + max_new_tokens`` slots.
    """
    prompt = np.asarray(prompt)
    B, T0 = prompt.shape
    sampler = sampler or Sampler()
    if cache is None:
        cache = ContiguousKVCache(cfg, B, T0 + max_new_tokens)
    seqs = list(range(B))
    if hasattr(cache, "add_sequence"):
        for s in seqs:
            if s not in cache.tables:
                cache.add_sequence(s)
    cache.reserve(seqs, T0 + max_new_tokens - 1)
    logits = forward_cached(params, prompt, cfg, cache, seqs)[:, -1]
    out = []
    for step in range(max_new_tokens):
        tok = sampler.sample(np.asarray(logits, np.float32))
        out.append(tok)
        if step + 1 < max_new_tokens:
            logits = forward_cached(params, tok[:, None], cfg, cache, seqs)[:, -1]
    return np.stack(out, axis=1) if out else np.zeros((B, 0), np.int64)


def generate_uncached(params: dict, cfg: ModelConfig, prompt, max_new_tokens: int,
                      sampler: Sampler | None = None) -> np.ndarray:
    """The naive loop: ``transformer.forward`` over the whole sequence for every new token."""
    seq = np.asarray(prompt)
    sampler = sampler or Sampler()
    out = []
    for _ in range(max_new_tokens):
        logits = np.asarray(transformer.forward(params, seq, cfg)[:, -1], np.float32)
        tok = sampler.sample(logits)
        out.append(tok)
        seq = np.concatenate([seq, tok[:, None]], axis=1)
    return np.stack(out, axis=1) if out else np.zeros((seq.shape[0], 0), np.int64)
