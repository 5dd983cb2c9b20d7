"""The book's part-5 question, asked of the search: LLaMA-2 13B's MLP blocks (D = 5120,
F = 13824, gated, 40 layers) trained with Adam on a TPU v5p 16x16x16 cube (4096 chips, 96 GB of
HBM each) with a batch of 3M tokens (96 sequences of 32k). The book answers FSDP + TP with
X_opt = sqrt(B N M_X / (F M_Y)) ≈ 1333, "roughly 1024-way DP and 4-way TP", at ~300 ms a step
(40% MFU).

`part5()` plans the step freely on the cube and with the book's hand-written layouts imposed
(pure DP, pure FSDP over all 4096 chips, FSDP over two axes (256) with TP over the third (16):
the closest FSDP + TP the cube's axes of 16 allow to X_opt), each priced by the same model, and
returns the `Comparison`. ``layers`` less than 40 plans that many blocks under the same share of
the HBM (``96 GB * layers / 40``), which keeps the per-layer trade-offs and runs in seconds.
"""

from __future__ import annotations

import numpy as np

import shardlab as sl
from shardlab.sharding import PartitionSpec as P
from shardlab.train import x_opt

from . import examples
from .explain import Comparison, compare

__all__ = ["LLAMA2_13B", "part5", "part5_x_opt"]

LLAMA2_13B = dict(layers=40, d_model=5120, ffw=13824, seq=32768, batch_seqs=96)
HBM_BYTES = 96e9  # a v5p chip


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
                   memory_limit_bytes=HBM_BYTES * layers / LLAMA2_13B["layers"], run=False, time_limit_s=time_limit_s)
