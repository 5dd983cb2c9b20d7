"""Training at scale: the real training step run in abstract mode, priced from its ledger.

:func:`estimate` builds the step of :class:`~shardlab.train.Trainer` on an abstract mesh of the
size asked for (no data is allocated), records every matmul, attention call and collective it
would run, and reports compute time, communication time per mesh axis, the step time with
communication overlapped (the book's max(T_math, T_comms)), memory per device, MFU and the bound.
:func:`~shardlab.train.search.search` tries the strategies over mesh factorizations.

Example:
    >>> from shardlab.models import ModelConfig
    >>> from shardlab import train
    >>> cfg = ModelConfig(num_layers=2, d_model=1024, ffw_dim=4096, num_heads=8, vocab_size=32000)
    >>> e = train.estimate(cfg, "fsdp", {"data": 64}, "tpu-v5p", batch=64, seq=2048)
    >>> e.bound, e.comm_seconds["data"] > 0
    ('comm:data', True)
"""

from __future__ import annotations

import dataclasses

import numpy as np

import shardlab as sl
import shardlab.hardware as hw_mod
from shardlab.models import flops_per_token, param_axes, training_memory

from . import strategy as _strategy
from .step import Trainer, TrainState, tree_map
from .strategy import param_sizes

__all__ = ["Estimate", "estimate", "sequence_chunks"]


@dataclasses.dataclass
class Estimate:
    """What one training step costs: seconds, bytes per device, utilisation."""

    strategy: str
    mesh: dict
    compute_seconds: float
    comm_seconds: dict           # mesh axis (or "a+b") -> seconds of its collectives
    step_seconds: float
    exposed_comm_seconds: dict   # per axis: what compute does not hide
    memory: dict                 # bytes per device: params, grads, optimizer, activations
    mfu: float
    bound: str
    fits: bool
    ledger: object = dataclasses.field(repr=False, default=None)
    sequence_chunks: int = 1     # pieces each sequence was cut into to split tokens over the data axes
    matmul_seconds: float = 0.0  # forward + backward matmuls only (the book's T_math: no attention, no remat)

    @property
    def memory_per_device(self) -> float:
        return float(sum(self.memory.values()))


def _param_structs(cfg, trainer: Trainer, dtype, spec_fn):
    sizes = param_sizes(cfg)
    return tree_map(lambda axes: sl.ShapeDtypeStruct(tuple(sizes[a] for a in axes), dtype,
                                                     sharding=trainer.sharding(spec_fn(axes))), param_axes(cfg))


def _mesh(mesh, hardware, strategy=None):
    if isinstance(mesh, dict):
        # a strategy with a cross-slice axis (train.hierarchical) says which axis is the DCN;
        # otherwise a TPU mesh axis named "dcn" goes over the DCN, not onto a torus axis
        physical = strategy.physical_axes() if hasattr(strategy, "physical_axes") else None
        if physical is None and "dcn" in mesh and hw_mod.get(hardware).family == "tpu":
            physical = {"dcn": "dcn"}
        return sl.make_mesh(tuple(mesh.values()), tuple(mesh), hardware=hardware, physical_axes=physical,
                            abstract=True)
    return mesh


def estimate(cfg, strategy, mesh, hardware, batch: int, seq: int, *, remat=None, microbatches: int = 1,
             precision: str = "mixed", optimizer: str = "adamw") -> Estimate:
    """Runs one training step of ``cfg`` shape-only and prices it on ``hardware``.

    Args:
        cfg: the model.
        strategy: a Strategy or built-in name.
        mesh: ``{axis: size}`` (an abstract mesh is made) or a Mesh with hardware.
        hardware: a preset name.
        batch: sequences per step; seq: tokens per sequence. When the data axes are more than
            the sequences, the tokens are split instead (each sequence cut into
            :func:`sequence_chunks` pieces, as context parallelism does); attention is then
            priced over whole sequences, the K/V exchange of ring attention is not counted.
        remat: None, "dots" or "full" (activation checkpointing of each layer).
        microbatches: gradient accumulation steps.
        precision: "mixed" (bf16 params, fp32 master and moments) or "fp32".
        optimizer: "adamw" or "sgd".

    Returns:
        An :class:`Estimate`; params, grads and optimizer bytes are the live buffers of the
        abstract step, activations come from ``models.training_memory``.
    """
    s = _strategy.get(strategy)
    m = _mesh(mesh, hardware, s)
    X, Y = s.sizes(m)
    chunks = sequence_chunks(batch, seq, X, Y if s.sequence_parallel else 1, microbatches)
    rows, cols = batch * chunks, seq // chunks
    s.validate(cfg, m, rows, cols)
    t = Trainer(cfg, s, m, optimizer=optimizer, precision=precision, remat=remat, microbatches=microbatches)
    pdt = t.dtype
    params = _param_structs(cfg, t, pdt, t.param_spec)
    master = _param_structs(cfg, t, np.float32, t.state_spec) if (t.mixed or s.zero in (1, 2)) else None
    base = master if master is not None else _param_structs(cfg, t, np.float32, t.param_spec)
    opt = {n: base for n in t.opt.state_names}
    tok = sl.ShapeDtypeStruct((rows // microbatches, cols), np.int32, sharding=t.sharding(s.batch_spec()))
    out = {}

    def run(params, master, opt, tok):
        state = TrainState(params, master, opt)
        new, _ = t.step(state, tok, tok)
        out["memory"] = t.memory(new)
        return 0

    with sl.Ledger() as ledger:
        sl.eval_shape(run, params, master, opt, tok)
    # sequences cut into `chunks` pieces (context parallelism): price attention over whole sequences
    attn_scale = 1.0
    if chunks > 1:
        full, cut = flops_per_token(cfg, seq, causal=True), flops_per_token(cfg, cols, causal=True)
        attn_scale = full.attention / cut.attention if cut.attention else 1.0
    matmul = sum(e["seconds"] or 0.0 for e in ledger.events if e["op"] == "matmul" and e["phase"] != "recompute")
    compute = sum((e["seconds"] or 0.0) * (attn_scale if e["op"].startswith("attention") else 1.0)
                  for e in ledger.events if not e["axes"])
    comm: dict = {}
    for e in ledger.events:
        if e["axes"]:
            key = "+".join(e["axes"])
            comm[key] = comm.get(key, 0.0) + (e["seconds"] or 0.0)
    step = max([compute] + list(comm.values()))
    exposed = {k: max(0.0, v - compute) for k, v in comm.items()}
    bound = "compute" if step == compute else "comm:" + max(comm, key=comm.get)
    # activations: tokens per device = batch x seq / (X·C), whatever the sequences were cut into
    C = s.context_size(m)
    sizes = {a: n for a, n in m.shape.items() if a != s.context} or {s.context: 1}
    tm = training_memory(cfg, _memory_name(s), sizes, batch=X, optimizer=optimizer, precision=precision,
                         remat=_TM_REMAT.get(remat, remat), context=batch * seq // (X * C), tp_axis=s.model)
    memory = dict(out["memory"], activations=float(tm.parts["activations"]))
    hw = hw_mod.get(hardware)
    peak = sl.cost.peak_flops(hw, "bfloat16")[0]
    model_flops = flops_per_token(cfg, seq, causal=True, training=True).matmul * batch * seq
    mfu = model_flops / (step * m.size * peak) if step > 0 else 0.0
    fits = sum(memory.values()) <= hw.hbm_capacity
    return Estimate(s.name, dict(m.shape), compute, comm, step, exposed, memory, mfu, bound, fits, ledger,
                    sequence_chunks=chunks, matmul_seconds=matmul)


_TM_REMAT = {"dots": "attention"}


def sequence_chunks(batch: int, seq: int, X: int, seq_split: int = 1, microbatches: int = 1) -> int:
    """How many pieces each sequence is cut into so the data axes (size ``X``) get whole pieces.

    The book counts the batch in tokens ("a token is a token" for the MLP): 96 sequences of 32k
    tokens on 4096 data-parallel chips are 768 tokens per chip, i.e. each sequence cut into 128
    pieces (context parallelism). 1 when the sequences divide evenly; the smallest cut that
    divides ``seq`` and leaves pieces divisible by ``seq_split`` (sequence parallelism) otherwise.

    Example:
        >>> sequence_chunks(96, 32768, 4096), sequence_chunks(96, 32768, 1024, 4)
        (128, 32)
    """
    for c in range(1, seq + 1):
        if seq % c == 0 and (batch * c) % (X * microbatches) == 0 and (seq // c) % seq_split == 0:
            return c
    raise ValueError(f"[estimate] {batch} x {seq} tokens cannot be split over the data axes of size {X}"
                     f"{f' in {microbatches} microbatches' if microbatches > 1 else ''}: "
                     f"use a batch whose token count is a multiple of {X * microbatches}")


def _memory_name(s) -> str:
    if s.model and s.zero == 3:
        return "fsdp+tp"
    if s.model:
        return "tp"
    return {0: "dp", 1: "zero1", 2: "zero2", 3: "fsdp"}[s.zero]
