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
from .prefix_cache import PrefixCache
from .sampling import Sampler, filter_logits
from .simulator import ServingConfig, SimResult, plot_throughput_latency, simulate, sweep
from .workload import Request, load_trace, poisson_requests, save_trace

__all__ = ["CacheFullError", "ContiguousKVCache", "DTYPES", "Estimate", "estimate", "StepModel", "StepTime", "filter_logits", "forward_cached", "generate",
           "generate_uncached", "load_trace", "PagedKVCache", "plot_throughput_latency", "poisson_requests",
           "PrefixCache", "Request", "Sampler", "save_trace", "ServingConfig", "SimResult", "simulate", "sweep"]
