"""Sampling the next token from logits: greedy, temperature, top-k and top-p (nucleus), seeded.

Example:
    >>> import numpy as np
    >>> from shardlab.serve import Sampler
    >>> logits = np.array([[0.0, 3.0, 1.0, 2.0]])
    >>> Sampler().sample(logits).tolist()                   # greedy
    [1]
    >>> s = Sampler(temperature=1.0, top_k=2, seed=0)       # only tokens 1 and 3 can come out
    >>> sorted(set(int(s.sample(logits)[0]) for _ in range(50)))
    [1, 3]
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["Sampler", "filter_logits"]


def filter_logits(logits: np.ndarray, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0) -> np.ndarray:
    """log-probabilities [B, V] after temperature, top-k and top-p; removed tokens get -inf.

    top-p keeps the smallest set of most likely tokens whose probability reaches ``top_p``
    (the token that crosses the threshold stays).
    """
    z = np.asarray(logits, np.float64) / temperature
    V = z.shape[-1]
    if 0 < top_k < V:
        kth = np.partition(z, V - top_k, axis=-1)[:, V - top_k][:, None]
        z = np.where(z >= kth, z, -np.inf)
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    if top_p < 1.0:
        order = np.argsort(-logp, axis=-1, kind="stable")
        p_sorted = np.take_along_axis(np.exp(logp), order, axis=-1)
        before = np.cumsum(p_sorted, axis=-1) - p_sorted      # mass strictly before each token
        drop_sorted = before >= top_p
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        logp = np.where(drop, -np.inf, logp)
        logp = logp - np.log(np.exp(logp).sum(axis=-1, keepdims=True))
    return logp


@dataclasses.dataclass
class Sampler:
    """Picks one token per row of logits [B, V].

    Attributes:
        temperature: 0 means greedy (argmax, ties to the lowest id); otherwise logits / T.
        top_k: keep the k most likely tokens (0 = all).
        top_p: keep the nucleus of mass top_p (1.0 = all).
        seed: seed of the numpy Generator; the same seed gives the same tokens.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"[Sampler] temperature {self.temperature} must be >= 0 (0 = greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"[Sampler] top_p {self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"[Sampler] top_k {self.top_k} must be >= 0 (0 = no limit)")
        self.rng = np.random.default_rng(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def sample(self, logits) -> np.ndarray:
        """Token ids [B] (int64)."""
        z = np.asarray(logits, np.float64)
        if z.ndim == 1:
            z = z[None]
        if self.greedy:
            return np.argmax(z, axis=-1)
        logp = filter_logits(z, self.temperature, self.top_k, self.top_p)
        g = self.rng.gumbel(size=logp.shape)        # Gumbel-max: argmax(logp + g) ~ softmax
        return np.argmax(logp + g, axis=-1)
