"""``shardlab.models``: transformer math (book part 4) that checks itself.

* :class:`ModelConfig` (+ ``ModelConfig.from_hf``) and :mod:`~shardlab.models.presets`;
* calculators returning reports with a breakdown, a text/HTML view and the formula:
  :func:`param_count`, :func:`flops_per_token`, :func:`kv_cache_bytes`,
  :func:`training_memory`, :func:`mfu`, :func:`step_time_lower_bound`,
  :func:`moe_compute_bound_batch`, :func:`attention_crossover`;
* :mod:`~shardlab.models.transformer`: the model those formulas describe, runnable on plain
  arrays and inside ``shard_map``, so the ledger checks the formulas;
* :mod:`~shardlab.models.expert_parallel`: the MoE layer with its experts split over a mesh
  axis (AllToAll dispatch and combine), used by training and decoding.

Example:
    >>> from shardlab.models import param_count, presets
    >>> param_count(presets.get("llama3-8b")).total
    8030261248
"""

from . import expert_parallel, presets, transformer
from .axes import LOGICAL_AXES, param_axes
from .config import ModelConfig
from .flops import FlopsPerToken, attention_crossover, flops_per_token
from .hf import SUPPORTED_MODEL_TYPES, config_from_hf
from .kv_cache import kv_cache_bytes
from .memory import PRECISIONS, STRATEGIES, strategy_name, training_memory
from .params import ParamCount, param_count
from .remat import CHECKPOINT_NAMES, RematPolicy, remat_policy
from .perf import get_hardware, mfu, moe_compute_bound_batch, peak_flops, step_time_lower_bound
from .report import Report

__all__ = [
    "attention_crossover", "CHECKPOINT_NAMES", "config_from_hf", "expert_parallel", "LOGICAL_AXES", "param_axes", "flops_per_token", "FlopsPerToken", "get_hardware", "kv_cache_bytes",
    "mfu", "ModelConfig", "moe_compute_bound_batch", "param_count", "ParamCount", "peak_flops",
    "PRECISIONS", "presets", "RematPolicy", "remat_policy", "Report", "step_time_lower_bound", "STRATEGIES", "strategy_name", "SUPPORTED_MODEL_TYPES",
    "training_memory", "transformer",
]
