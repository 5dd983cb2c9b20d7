"""Training: parallelism strategies as data, the training step, estimates at scale, and
pipeline-parallel schedules (``shardlab.train.pipeline``).

* :mod:`~shardlab.train.strategy` (also ``train.strategies``): DP, ZeRO-1/2, FSDP (ZeRO-3),
  Megatron TP (f/g), TP + sequence parallelism, FSDP + TP, vocab-parallel embedding and loss,
  context parallelism (``cp``, ``fsdp_cp``, ``cp_tp``) with the ring attention of
  :mod:`~shardlab.train.context`, MoE expert parallelism (``ep``, ``fsdp_ep``: experts split over
  a data axis, AllToAll dispatch and combine from :mod:`shardlab.models.expert_parallel`);
* :class:`Trainer`: forward, ``shardlab.grad``, gradient accumulation, AdamW / SGD with bf16
  params and fp32 master weights, activation checkpointing;
* :func:`estimate` / :func:`search`: the same step in abstract mode at any scale.

Example:
    >>> from shardlab.train import pipeline as pp
    >>> round(pp.clock(pp.one_f_one_b(4, 8)).bubble_fraction, 4)
    0.2727
"""

from . import context, pipeline
from . import strategy
from . import strategy as strategies
from . import validate
from .estimate import Estimate, estimate, sequence_chunks
from .hierarchical import Hierarchical, hierarchical
from .rooflines import critical_intensity, crossover_batches, dp_min_batch_per_chip, fsdp_tp_min_batch_per_chip, max_tensor_parallelism, x_opt
from .search import SearchResult, search
from .optim import SGD, AdamW, get_optimizer
from .step import Trainer, TrainState, reference_step, tree_map
from .strategy import Strategy
from .validate import validate_megatron

__all__ = ["AdamW", "context", "Estimate", "estimate", "Hierarchical", "hierarchical", "search", "SearchResult", "x_opt", "critical_intensity", "crossover_batches", "dp_min_batch_per_chip", "fsdp_tp_min_batch_per_chip", "max_tensor_parallelism", "get_optimizer", "pipeline", "reference_step", "sequence_chunks", "SGD", "strategies", "strategy", "Strategy",
           "Trainer", "TrainState", "tree_map", "validate", "validate_megatron"]
