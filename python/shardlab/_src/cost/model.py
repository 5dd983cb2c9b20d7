"""Collective and compute time estimates: the book's formulas, exact forms and link-level counts.

The cost layer in one namespace (``shardlab.cost`` re-exports it). Each job has its own module:

* :mod:`.layout` - dtypes, partition specs, the bytes of a sharded array;
* :mod:`.formulas` - the byte and FLOP formulas (one definition each);
* :mod:`.collectives` - one collective's time: the book's closed form and the link-level model;
* :mod:`.compute` - one chip's roofline at its peaks, :func:`compute_time`;
* :mod:`.events` - ledger events priced at the peaks (what the ledger stamps);
* :mod:`.prices` and :mod:`.pricing` - what each chip reaches (the price list) and the one
  function that prices any event with it (:func:`price_event`);
* :mod:`.roofline` - a program's events summed into T_math, T_hbm, T_comms.

Every function takes plain shapes, dtypes and specs, so what-if questions need no data.

Example:
    >>> from shardlab import cost
    >>> t = cost.all_gather_time((2048, 8192), "bfloat16", ("Y", None),
    ...                          mesh_shape={"X": 8, "Y": 4}, hardware="tpu-v5e")
    >>> round(t.book_seconds * 1e6), round(t.seconds * 1e6)   # a v5e axis of 4 has no wraparound
    (373, 559)
"""

from __future__ import annotations

from .collectives import (CollectiveCost, all_gather_time, all_reduce_time, all_to_all_time, collective_time,
                          neighbour_shift, ppermute_time, psum_time, reduce_scatter_time, schedule)
from .compute import (ComputeTime, MatmulCost, attention_flops, compute_time, critical_batch_size, einsum_flops,
                      hbm_load_time, ici_critical_intensity, matmul_flops, matmul_time, peak_flops)
from .events import event_cost, event_seconds
from .layout import ShardBytes, itemsize, shard_bytes
from .prices import IDEAL, MAMF, PRICE_LISTS, PriceList, price_list
from .pricing import memory_seconds, price_event
from .roofline import Roofline, roofline

__all__ = [
    "CollectiveCost",
    "ShardBytes",
    "MatmulCost",
    "ComputeTime",
    "Roofline",
    "schedule",
    "collective_time",
    "all_gather_time",
    "reduce_scatter_time",
    "all_reduce_time",
    "psum_time",
    "all_to_all_time",
    "ppermute_time",
    "neighbour_shift",
    "hbm_load_time",
    "shard_bytes",
    "itemsize",
    "peak_flops",
    "compute_time",
    "matmul_flops",
    "einsum_flops",
    "attention_flops",
    "matmul_time",
    "critical_batch_size",
    "ici_critical_intensity",
    "event_seconds",
    "roofline",
    "PriceList",
    "IDEAL",
    "PRICE_LISTS",
    "MAMF",
    "price_list",
    "price_event",
    "memory_seconds",
]
