"""``shardlab.serve``: inference (book part 7) run small and estimated large with one cost model.

* KV caches (:class:`ContiguousKVCache`, :class:`PagedKVCache`), :class:`Sampler`, and
  :func:`generate` / :func:`forward_cached` on ``shardlab.models`` params;
* sharded decoding on a mesh (:mod:`~shardlab.serve.sharded`);
* :func:`estimate`: prefill / decode step times with their bound, tokens/s, KV bytes, max batch;
* a discrete-event serving simulator (:mod:`~shardlab.serve.simulator`).
"""

from .estimate import DTYPES, Estimate, StepModel, StepTime, estimate
from .generate import forward_cached, generate, generate_uncached
from .kv_cache import CacheFullError, ContiguousKVCache, PagedKVCache
from .sampling import Sampler, filter_logits

__all__ = ["CacheFullError", "ContiguousKVCache", "DTYPES", "Estimate", "estimate", "StepModel", "StepTime", "filter_logits", "forward_cached", "generate",
           "generate_uncached", "PagedKVCache", "Sampler"]
