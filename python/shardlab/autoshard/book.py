"""The book's part-5 question, asked of the search: LLaMA-2 13B's MLP blocks (D = 5120,
F = 13824, gated, 40 layers) trained with Adam on a TPU v5p 16x16x16 cube (4096 chips, 96 GB of
HBM each) with a batch of 3M tokens (96 sequences of 32k). The book answers FSDP + TP with
X_opt = sqrt(B N M_X / (F M_Y)) ≈ 1333, "roughly 1024-way DP and 4-way TP", at ~300 ms a step
(40% MFU).

`part5()` plans the step freely on the cube and with the book's hand-written layouts imposed
(pure DP, pure FSDP over all 4096 chips, FSDP over two axes (256) with TP over the third (16):
the closest FSDP + TP the cube's axes of 16 allow to X_opt), each priced by the same model, and
returns the `Comparison`. All 40 blocks plan in seconds (the blocks are tied to one set of
decisions); ``layers`` less than 40 plans that many under the same share of the HBM
(``96 GB * layers / 40``).

What the search finds (40 layers, float32, the new weights and moments carried to the next
step in their arguments' layouts): the batch over all 4096 chips and each Adam moment split 4096
ways, the weights whole (ZeRO-1; the first layer's split to fit the 96 GB): a step
reduce-scatters the weight gradients, updates each shard and all-gathers the new weights, with
no tensor-parallel all-reduce of activations: about 405 ms a step against 485 ms for FSDP + TP
at X = 256, Y = 16, whose 16-way model axis all-reduces every layer's activations (309 ms of its
485). The book's X = 1024, Y = 4 needs a model axis of 4, which the cube's axes of 16 do not
have: `part5_at_x_opt()` views the same 4096 chips as a 1024 x 4 mesh and prices the book's
layout there (FSDP over 1024, TP over 4: about 374 ms) against the free plan on that mesh,
which lands on the book's X and Y (data parallel over 1024, the weights' F dimension split over
the 4-way model axis, Megatron's activation all-reduce over it) but keeps each weight whole
over the data axis, with the Adam moments split over it (ZeRO-1; the plan needs 15 GiB of the
96 per chip): the weights are all-gathered once a step, after the update, instead of before the
forward and again before the backward pass as FSDP does: about 323 ms a step, near the book's
~300 ms.

>>> round(part5_x_opt())
1365
"""

from __future__ import annotations

import numpy as np

import shardlab as sl
from shardlab.sharding import PartitionSpec as P
from shardlab.train import x_opt

from . import examples
from .explain import Comparison, compare

__all__ = ["LLAMA2_13B", "part5", "part5_at_x_opt", "part5_x_opt"]

LLAMA2_13B = dict(layers=40, d_model=5120, ffw=13824, seq=32768, batch_seqs=96)
HBM_BYTES = 96e9  # a v5p chip
CARRY = ((1, 0), (2, 1), (3, 2))  # the new weights and Adam moments are the next step's


def part5_x_opt() -> float:
    """The book's X_opt for this setting: sqrt(B * M_X * N / (F * M_Y)) with M_X = 2, M_Y = 1."""
    c = LLAMA2_13B
    return x_opt(c["batch_seqs"] * c["seq"], c["ffw"], 4096, m_x=2, m_y=1)


def _args(layers: int, dtype=np.float32):
    c = LLAMA2_13B
    D, F = c["d_model"], c["ffw"]

    def s(*shape):
        return sl.ShapeDtypeStruct(shape, dtype)

    def mats():
        return [(s(D, F), s(D, F), s(F, D)) for _ in range(layers)]

    return mats(), mats(), mats(), s(c["batch_seqs"] * c["seq"], D)


def _layout(layers, w_in, w_out, batch):
    mats = [(w_in, w_in, w_out) for _ in range(layers)]
    return mats, mats, mats, batch


def part5(layers: int = 40, *, time_limit_s: float | None = 120.0) -> Comparison:
    """The free plan and the book's strategies on the v5p 16x16x16 cube (see the module docstring)."""
    mesh = sl.make_mesh((16, 16, 16), ("x", "y", "z"), hardware="tpu-v5p", abstract=True)
    every = ("x", "y", "z")
    strategies = {
        "dp": _layout(layers, P(), P(), P(every)),
        "fsdp (X=4096)": _layout(layers, P(every), P(None, every), P(every)),
        "fsdp_tp (X=256, Y=16)": _layout(layers, P(("x", "y"), "z"), P("z", ("x", "y")), P(("x", "y"))),
    }
    return compare(examples.adam_mlp_step, *_args(layers), mesh=mesh, strategies=strategies,
                   memory_limit_bytes=HBM_BYTES * layers / LLAMA2_13B["layers"], run=False, time_limit_s=time_limit_s,
                   carry=CARRY)


def part5_at_x_opt(layers: int = 40, *, time_limit_s: float | None = 120.0) -> Comparison:
    """The book's own answer, FSDP over X = 1024 with TP over Y = 4 (the power of two nearest
    X_opt), against the free plan, both on the same 4096 chips viewed as a 1024 x 4 mesh
    ("data", "model"); see the module docstring."""
    mesh = sl.make_mesh((1024, 4), ("data", "model"), hardware="tpu-v5p", abstract=True)
    strategies = {"fsdp_tp (X=1024, Y=4)": _layout(layers, P("data", "model"), P("model", "data"), P("data"))}
    return compare(examples.adam_mlp_step, *_args(layers), mesh=mesh, strategies=strategies,
                   memory_limit_bytes=HBM_BYTES * layers / LLAMA2_13B["layers"], run=False, time_limit_s=time_limit_s,
                   carry=CARRY)
