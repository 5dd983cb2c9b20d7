"""Training at scale: the real training step run in abstract mode, priced from its ledger.

:func:`estimate` builds the step of :class:`~shardlab.train.Trainer` on an abstract mesh of the
size asked for (no data is allocated), records every matmul, attention call and collective it
would run, and prices them with the chip's price list (:func:`shardlab.cost.price_event`: what
the chip reaches, not its peaks). The memory-bound work the ledger does not record -- norms,
residual adds, activations, rotary, the loss, the optimizer update and clipping -- is priced as
the bytes it moves at the reached HBM bandwidth (:mod:`shardlab.cost.formulas`). Communication
overlaps as the frameworks do it:

* FSDP / ZeRO weight gathers over the data axes are prefetched under the compute of their phase,
  gradient reductions (reduce-scatters, DP's bucketed all-reduces) overlap the backward pass;
  one layer's worth of each stays exposed (the first gather, the last reduction). The
  reductions that cross the data-centre network between TPU slices are on the critical path
  (what MaxText's multi-slice runs measured); ``dcn_overlap=True`` overlaps them too;
* tensor-parallel collectives are on the critical path unless ``async_tp=True``;
* context-parallel ring exchanges overlap the attention; a context axis of ``C > 2`` executes
  its ring over 2 devices holding the same blocks and counts the ring of ``C`` in closed form
  (``2C + 1`` blocks of scores, ``C - 1`` hops of each K/V block: the sums executing it gives),
  so pricing it does not grow with ``C``;
* pipeline stages (``pipeline=p``) are clocked with the schedule of :mod:`shardlab.train.pipeline`
  (1F1B, interleaved 1F1B, zero bubble, ...) with a send between stages; the idle time is the
  bubble.

The :class:`Estimate` says where the step goes (forward, backward, recompute, optimizer, exposed
communication per axis, bubble), MFU and HFU, memory per device and whether it fits, as a table
and bars (``print(e)``, or the HTML view in Jupyter).

All layers of a dense model do the same work, so a model of more than two layers is executed
with two and the second is counted ``num_layers - 1`` times (``Estimate.layers_executed``); the
ledger holds the executed layers.

Example:
    >>> from shardlab.models import ModelConfig
    >>> from shardlab import train
    >>> cfg = ModelConfig(num_layers=2, d_model=1024, ffw_dim=4096, num_heads=8, vocab_size=32000)
    >>> e = train.estimate(cfg, "fsdp", {"data": 64}, "tpu-v5p", batch=64, seq=2048)
    >>> e.bound, [k for k, v in e.phases.items() if v > 0]
    ('comm:data', ['forward', 'backward', 'optimizer', 'comm:data'])
"""

from __future__ import annotations

import dataclasses
import functools
import html

import numpy as np
from rich.bar import Bar
from rich.table import Table

import shardlab as sl
import shardlab.hardware as hw_mod
from shardlab import units
from shardlab.cost import formulas, price_event, price_list
from shardlab.models import flops_per_token, get_hardware, param_axes, remat_policy, training_memory

from . import pipeline as _pp
from . import strategy as _strategy
from .step import Trainer, TrainState, tree_map
from .strategy import param_sizes

__all__ = ["Estimate", "estimate", "sequence_chunks"]

_PHASES = ("forward", "recompute", "backward")
_SCHEDULES = ("1f1b", "interleaved-1f1b", "gpipe", "zb-h1")


@dataclasses.dataclass
class Estimate:
    """What one training step costs: seconds, bytes per device, utilisation.

    Attributes:
        strategy, mesh: the plan (``mesh`` is one pipeline stage's mesh).
        compute_seconds: per device, all compute and memory-bound work of the step (all
            microbatches, no bubble).
        comm_seconds: mesh axis (or "a+b") -> seconds of the ledger's collectives, overlapped or
            not (the K/V exchange of sequences cut over the data axes is in ``phases`` only).
        step_seconds: the step: compute + exposed communication + bubble + optimizer.
        exposed_comm_seconds: per axis, what compute does not hide.
        memory: bytes per device: params, grads, optimizer, activations.
        mfu: model FLOPs (``flops_per_token(training=True)``, causal attention, no recompute)
            per second per chip over the bf16 peak; hfu: FLOPs executed (recompute included).
        bound: "compute" or "comm:<axis>" (the larger of compute and one axis's collectives).
        fits: memory per device <= HBM.
        phases: seconds on the critical path: forward, recompute, backward, optimizer,
            ``comm:<axis>`` (exposed), bubble; they add up to ``step_seconds``.
        matmul_seconds: forward + backward matmuls at the peak (the book's T_math).
        hardware, chips, pipeline, prices: where it runs (chips: all stages) and the price list.
        layers_executed: layers run shape-only (the ledger holds them); notes: what was assumed.
        tokens_per_step: batch x seq (``tokens_per_second`` divides it by the step and chips).
    """

    strategy: str
    mesh: dict
    compute_seconds: float
    comm_seconds: dict
    step_seconds: float
    exposed_comm_seconds: dict
    memory: dict
    mfu: float
    bound: str
    fits: bool
    ledger: object = dataclasses.field(repr=False, default=None)
    sequence_chunks: int = 1
    matmul_seconds: float = 0.0
    phases: dict = dataclasses.field(default_factory=dict)
    hfu: float = 0.0
    hardware: str = ""
    chips: int = 1
    pipeline: int = 1
    prices: str = ""
    layers_executed: int = 0
    hbm_capacity: float = 0.0
    notes: list = dataclasses.field(default_factory=list)

    @property
    def memory_per_device(self) -> float:
        return float(sum(self.memory.values()))

    tokens_per_step: int = 0

    @property
    def tokens_per_second(self) -> float:
        """Tokens per second per chip (torchtitan's TPS/GPU)."""
        return self.tokens_per_step / (self.step_seconds * self.chips) if self.step_seconds else 0.0

    # -- display ---------------------------------------------------------------------------------
    def rows(self) -> list[tuple[str, float, float]]:
        """(phase, seconds, share of the step) on the critical path."""
        return [(k, v, v / self.step_seconds if self.step_seconds else 0.0) for k, v in self.phases.items() if v > 0]

    def text(self, width: int = 32) -> str:
        """A table and a bar of step time by phase, and memory against HBM."""
        head = (f"train.estimate: {self.strategy} on {self.chips} x {self.hardware} "
                f"(mesh {self.mesh}{f', {self.pipeline} pipeline stages' if self.pipeline > 1 else ''}; "
                f"prices: {self.prices})")
        lines = [head, f"  step {units.fmt_seconds(self.step_seconds)}   MFU {units.fmt_percent(self.mfu)}   "
                       f"HFU {units.fmt_percent(self.hfu)}   bound: {self.bound}"]
        w = max([len(k) for k, _, _ in self.rows()] + [10])
        for k, v, share in self.rows():
            bar = "█" * max(1, round(share * width)) if share > 0 else ""
            lines.append(f"  {k.ljust(w)} {units.fmt_seconds(v):>10} {units.fmt_percent(share):>7}  {bar}")
        total = self.memory_per_device
        lines.append(f"  memory per device {units.fmt_bytes(total)} of {units.fmt_bytes(self.hbm_capacity)} HBM: "
                     f"{'fits' if self.fits else 'does NOT fit'}")
        for k, v in self.memory.items():
            share = v / self.hbm_capacity if self.hbm_capacity else 0.0
            lines.append(f"  {k.ljust(w)} {units.fmt_bytes(v):>10} {units.fmt_percent(share):>7}  "
                         f"{'▒' * max(0, min(width, round(share * width)))}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def __rich__(self) -> Table:
        """A rich table: each phase and buffer with its share as a bar (``rich.print(e)``)."""
        t = Table(title=f"{self.strategy} on {self.chips} x {self.hardware}: step {units.fmt_seconds(self.step_seconds)}, "
                        f"MFU {units.fmt_percent(self.mfu)}, HFU {units.fmt_percent(self.hfu)}",
                  caption=f"memory {units.fmt_bytes(self.memory_per_device)} of {units.fmt_bytes(self.hbm_capacity)} "
                          f"HBM: {'fits' if self.fits else 'does not fit'}")
        for col in ("phase / buffer", "value", "share"):
            t.add_column(col, justify="left" if col.startswith("phase") else "right")
        t.add_column("", width=24)
        for k, v, share in self.rows():
            t.add_row(k, units.fmt_seconds(v), units.fmt_percent(share), Bar(1.0, 0.0, share, color="blue"))
        for k, v in self.memory.items():
            share = v / self.hbm_capacity if self.hbm_capacity else 0.0
            t.add_row(k, units.fmt_bytes(v), units.fmt_percent(share), Bar(1.0, 0.0, min(1.0, share), color="yellow"))
        return t

    def _repr_html_(self) -> str:
        def bar(share, colour):
            return (f"<div style='background:{colour};height:0.8em;width:{max(0.0, min(1.0, share)) * 100:.1f}%'>"
                    f"</div>")

        rows = "".join(f"<tr><td>{html.escape(k)}</td><td style='text-align:right'>{units.fmt_seconds(v)}</td>"
                       f"<td style='text-align:right'>{units.fmt_percent(s)}</td><td style='width:14em'>"
                       f"{bar(s, '#4c78a8')}</td></tr>" for k, v, s in self.rows())
        mem = "".join(f"<tr><td>{html.escape(k)}</td><td style='text-align:right'>{units.fmt_bytes(v)}</td>"
                      f"<td style='text-align:right'>{units.fmt_percent(v / self.hbm_capacity if self.hbm_capacity else 0)}"
                      f"</td><td>{bar(v / self.hbm_capacity if self.hbm_capacity else 0, '#f58518')}</td></tr>"
                      for k, v in self.memory.items())
        verdict = "fits" if self.fits else "does <b>not</b> fit"
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
        return (f"<div><b>train.estimate</b>: {html.escape(self.strategy)} on {self.chips} &times; "
                f"{html.escape(self.hardware)}, mesh {html.escape(str(self.mesh))}"
                f"{f', {self.pipeline} pipeline stages' if self.pipeline > 1 else ''} (prices: {html.escape(self.prices)})"
                f"<br>step <b>{units.fmt_seconds(self.step_seconds)}</b>, MFU {units.fmt_percent(self.mfu)}, "
                f"HFU {units.fmt_percent(self.hfu)}, bound: {html.escape(self.bound)}"
                f"<table><tr><th>phase</th><th>time</th><th>share</th><th></th></tr>{rows}</table>"
                f"memory per device {units.fmt_bytes(self.memory_per_device)} of "
                f"{units.fmt_bytes(self.hbm_capacity)} HBM: {verdict}"
                f"<table><tr><th>buffer</th><th>bytes</th><th>of HBM</th><th></th></tr>{mem}</table>"
                f"<ul>{notes}</ul></div>")


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


def _nbytes(tree) -> int:
    if tree is None:
        return 0
    return int(sum(x.nbytes_per_device for x in sl.tree_util.tree_leaves(tree)))


def _state_bytes(state, layer=None) -> dict:
    """params / grads / optimizer bytes per device of `state` (of one layer when `layer` is given)."""
    pick = (lambda t: t["layers"][layer] if t is not None else None) if layer is not None else (lambda t: t)
    opt = _nbytes(pick(state.master)) + sum(_nbytes(pick(t)) for t in state.opt_state.values())
    return {"params": _nbytes(pick(state.params)), "grads": _nbytes(pick(state.grads)), "optimizer": opt}


def _check(op, name, value, lo=1):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"[{op}] {name}={value!r} must be an int >= {lo}")


def estimate(cfg, strategy, mesh, hardware, batch: int, seq: int, *, remat=None, microbatches: int = 1,
             precision: str = "mixed", optimizer: str = "adamw", prices=None, pipeline: int = 1,
             virtual_stages: int = 1, schedule: str | None = None, async_tp: bool = False,
             dp_overlap: bool = True, attention: str = "flash", dropout: bool = False,
             pipeline_link: str | None = None, elementwise_scale: float = 1.0,
             execute_layers: int | None = None, kernels: str = "fused", fused_norm: bool | None = None,
             reduce_dtype: str | None = None, fsdp_copies: bool = False, dcn_overlap: bool = False) -> Estimate:
    """Runs one training step of ``cfg`` shape-only and prices it on ``hardware``.

    Args:
        cfg: the model.
        strategy: a Strategy or built-in name.
        mesh: ``{axis: size}`` (an abstract mesh is made) or a Mesh with hardware; with
            ``pipeline > 1`` the mesh of one stage.
        hardware: a preset name.
        batch: sequences per step; seq: tokens per sequence. When the data axes are more than
            the sequences, the tokens are split instead (each sequence cut into
            :func:`sequence_chunks` pieces); attention is then priced over whole sequences and
            each layer gathers the K/V of a piece's sequence over the data axes before its
            attention (the backward reduce-scatters their gradients), on the critical path --
            what a context-parallel ring (a ``context`` axis) hides under the attention.
        remat: a recompute policy (``shardlab.models.remat_policy``: None / "none", "full",
            "selective", "dots", "ffw_outputs" or a set of checkpoint names).
        microbatches: gradient accumulation steps (pipeline microbatches with ``pipeline > 1``).
        precision: "mixed" (bf16 params, fp32 master and moments) or "fp32".
        optimizer: "adamw" or "sgd".
        prices: the price list (:func:`shardlab.cost.price_list`; default the chip's own,
            ``"ideal"`` for the peaks).
        pipeline: pipeline stages; virtual_stages: model chunks per stage (interleaved 1F1B);
        schedule: "1f1b" (default), "interleaved-1f1b" (default when ``virtual_stages > 1``),
            "gpipe" or "zb-h1".
        async_tp: tensor-parallel collectives overlap the matmuls (async TP / collective
            matmul); default they are on the critical path.
        dp_overlap: the gradient reduction overlaps the backward (PyTorch DDP, FSDP, XLA);
            False reduces after it (Megatron's "local" DDP).
        attention: "flash" (scores stay on chip) or "unfused" (the scores are written to HBM and
            the masked softmax is computed over all ``seq x seq`` of them, as Megatron-LM in 2021).
        dropout: dropout masks on the residual adds (and the scores when unfused).
        pipeline_link: the link the stage-to-stage sends use ("nvlink", "ib", "dcn"...; default
            the slowest data link of the hardware: InfiniBand on GPUs, ICI on TPUs).
        execute_layers: layers to execute shape-only (default 2 of a dense model whose layers
            are alike, the last counted for the rest; ``cfg.num_layers`` executes them all).
        elementwise_scale: a what-if on the memory-bound bytes of the layers (norms, residual
            adds, activation, rotary, scores): 0 leaves them out, 2 doubles them (unfused kernels).
        kernels: "fused" (a compiler or hand-written kernels fuse each elementwise chain: XLA,
            Megatron-LM, ``torch.compile``) or "eager" (eager PyTorch: the gated unit's ``silu``
            and product, rotary in fp32 complex numbers and the fp32 logits of the loss each run
            as kernels of their own; ``cost.formulas.layer_elementwise_bytes(eager=True)``).
        fused_norm: the norms are one fused kernel even when ``kernels="eager"`` (torchtitan's
            ``norm_type="fused_rmsnorm"``); default: fused unless ``kernels="eager"``.
        reduce_dtype: the dtype the gradient reductions over the data axes run in when it is not
            the gradients' own (FSDP2's ``MixedPrecisionPolicy(reduce_dtype=torch.float32)``):
            their bytes are priced at its size; None keeps the ledger's.
        fsdp_copies: the framework copies each gathered weight buffer out to the parameters and
            each gradient into the reduce-scatter buffer, cast to ``reduce_dtype`` (PyTorch
            FSDP2's ``foreach_all_gather_copy_out`` and ``foreach_reduce_scatter_copy_in``):
            read and write those bytes as memory-bound work of the phase; XLA's gathers land in
            place (False).
        dcn_overlap: False (default) puts the gradient reductions over a mesh axis on the
            data-centre network between TPU slices on the critical path (``comm:<axes>`` in
            ``phases``), their ring at the DCN's bandwidth (the slice's share of it) plus the
            price list's ``step_overhead["dcn"]`` per ring step: what the multi-slice rows of
            MaxText's tables show (docs/train.md, "Validated against published runs"); True
            overlaps them with the backward as the other data-parallel reductions are (what
            XLA's ``xla_tpu_enable_data_parallel_all_reduce_opt`` aims at).

    Returns:
        An :class:`Estimate`.

    Raises:
        ValueError: a bad strategy, mesh, batch, pipeline split or schedule name.
    """
    op = "estimate"
    hardware = get_hardware(hardware, op)  # a chip without a preset: the error says how to build one
    for name, v in (("batch", batch), ("seq", seq), ("microbatches", microbatches), ("pipeline", pipeline),
                    ("virtual_stages", virtual_stages)):
        _check(op, name, v)
    if isinstance(elementwise_scale, bool) or not isinstance(elementwise_scale, (int, float)) or elementwise_scale < 0:
        raise ValueError(f"[{op}] elementwise_scale={elementwise_scale!r} must be a number >= 0")
    if not isinstance(dcn_overlap, bool):
        raise ValueError(f"[{op}] dcn_overlap={dcn_overlap!r}: use True (the DCN reductions overlap the backward) "
                         f"or False (on the critical path)")
    if attention not in ("flash", "unfused"):
        raise ValueError(f"[{op}] attention={attention!r}: use 'flash' or 'unfused'")
    if kernels not in ("fused", "eager"):
        raise ValueError(f"[{op}] kernels={kernels!r}: use 'fused' (XLA, Megatron-LM, torch.compile) or 'eager' "
                         f"(eager PyTorch)")
    reduce_size = None
    if reduce_dtype is not None:
        try:
            reduce_size = np.dtype(str(reduce_dtype)).itemsize
        except TypeError:
            raise ValueError(f"[{op}] reduce_dtype={reduce_dtype!r} is not a dtype: use e.g. 'float32' or "
                             f"'bfloat16'") from None
    sched = schedule or ("interleaved-1f1b" if virtual_stages > 1 else "1f1b")
    if sched not in _SCHEDULES:
        raise ValueError(f"[{op}] schedule={schedule!r} is not one of {', '.join(_SCHEDULES)}")
    if virtual_stages > 1 and sched != "interleaved-1f1b":
        raise ValueError(f"[{op}] virtual_stages={virtual_stages} needs schedule='interleaved-1f1b'")
    L = cfg.num_layers
    if L % (pipeline * virtual_stages):
        raise ValueError(f"[{op}] num_layers {L} is not divisible by pipeline x virtual_stages = "
                         f"{pipeline} x {virtual_stages}: use a split that divides the layers")
    s = _strategy.get(strategy)
    m = _mesh(mesh, hardware, s)
    hw = hw_mod.get(hardware)
    p_list = price_list(hw) if prices is None else price_list(prices)
    X, Y = s.sizes(m)
    piped = pipeline > 1
    run_mb = 1 if piped else microbatches          # a pipeline's step is clocked from one microbatch
    if piped and batch % microbatches:
        raise ValueError(f"[{op}] batch {batch} is not divisible by microbatches {microbatches}")
    run_batch = batch // microbatches if piped else batch
    chunks = sequence_chunks(run_batch, seq, X, Y if s.sequence_parallel else 1, run_mb)
    rows, cols = run_batch * chunks, seq // chunks
    s.validate(cfg, m, rows, cols)
    # a context axis of C > 2 executes as a ring of 2 over the same local blocks (the sequence
    # cut to 2 of its C pieces); its steps are counted in closed form below (_Ring)
    C = s.context_size(m)
    ring = _Ring(C, m, s.context, hw) if C > _Ring.RUN else None
    m_run = ring.run_mesh if ring else m
    cols_run = cols * _Ring.RUN // C if ring else cols
    uniform = len({cfg.is_moe_layer(i) for i in range(L)}) == 1 if hasattr(cfg, "is_moe_layer") else True
    n_run = min(L, _LAYERS_RUN) if uniform else L
    if execute_layers is not None:
        _check(op, "execute_layers", execute_layers)
        if execute_layers > L or (not uniform and execute_layers != L) or (pipeline > 1 and execute_layers != n_run):
            raise ValueError(f"[{op}] execute_layers={execute_layers}: use 1..{L} layers of a model whose layers "
                             f"are alike ({L} otherwise; the default without a pipeline)")
        n_run = execute_layers
    cfg_run = cfg.replace(num_layers=n_run) if n_run != L else cfg
    t = Trainer(cfg_run, s, m_run, optimizer=optimizer, precision=precision, remat=remat, microbatches=run_mb)
    params = _param_structs(cfg_run, t, t.dtype, t.param_spec)
    master = _param_structs(cfg_run, t, t.master_dtype, t.state_spec) if (t.mixed or s.zero in (1, 2)) else None
    base = master if master is not None else _param_structs(cfg_run, t, np.float32, t.param_spec)
    opt = {n: base for n in t.opt.state_names}
    tok = sl.ShapeDtypeStruct((rows // run_mb, cols_run), np.int32, sharding=t.sharding(s.batch_spec()))
    out = {}

    def run(params, master, opt, tok):
        state = TrainState(params, master, opt)
        new, _ = t.step(state, tok, tok)
        out["state"] = new
        return 0

    with sl.Ledger() as ledger:
        sl.eval_shape(run, params, master, opt, tok)
    events = ledger.events
    unit_label = f"layer{n_run - 1}"
    layers_dev = L // pipeline                      # layers whose work one device does
    extra = layers_dev - n_run if not piped else 0  # without a pipeline: copies of the last layer to add

    # sequences cut into `chunks` pieces (context parallelism): price attention over whole sequences
    attn_scale = 1.0
    if chunks > 1:
        full, cut = flops_per_token(cfg, seq, causal=True), flops_per_token(cfg, cols, causal=True)
        attn_scale = full.attention / cut.attention if cut.attention else 1.0
    if attention == "unfused":  # all s x s scores computed, masked afterwards
        causal = flops_per_token(cfg_run, seq, causal=True).attention
        attn_scale *= flops_per_token(cfg_run, seq, causal=False).attention / causal if causal else 1.0

    data_axes = set(s.data)
    links = hw_mod.resolve_physical_axes(hw, tuple(m.shape), tuple(m.shape.values()),
                                         getattr(m, "physical_axes", None)) if not dcn_overlap else {}
    dcn_axes = {a for a, link in links.items() if link == "dcn"}
    # priced seconds per (where, phase) of compute, per (where, phase, axes, kind) of collectives;
    # where: "layer" (the unit layer), "other_layer" (the other executed layers) or the scope
    comp: dict = {}
    comm_b: dict = {}
    fl: dict = {}
    matmul_peak = 0.0
    for e in events:
        label = e["label"] or ""
        top = label.split("/")[0]
        where = "layer" if top == unit_label else "other_layer" if top.startswith("layer") else top or "-"
        w = 1 + extra if where == "layer" else 1
        if top == "optimizer" or e["phase"] == "optimizer":
            phase = "optimizer"
        elif top == "grad_sync":
            phase = "backward"
        else:
            phase = e["phase"] if e["phase"] in _PHASES else "forward"
        if s.context and e["op"] == "einsum" and "/attn" in label:
            # a ring step's blocks are FlashAttention kernels (ring flash attention): their
            # efficiency, and the blocks of all C steps when the ring ran as 2
            e = dict(e, op="attention" if phase != "backward" else "attention_vjp", hbm_bytes=0.0)  # scores on chip
            w *= ring.blocks if ring else 1.0
        elif ring is not None and s.context in e["axes"]:
            e, times = ring.event(e)
            w *= times
        if not e["axes"]:
            scale = attn_scale if e["op"].startswith("attention") else 1.0
            comp[(where, phase)] = comp.get((where, phase), 0.0) + price_event(e, hw, p_list) * scale * w
            fl[where] = fl.get(where, 0.0) + e["flops"] * scale * w
            if e["op"] == "matmul" and e["phase"] != "recompute":
                matmul_peak += (e["seconds"] or 0.0) * w
            continue
        key = "+".join(e["axes"])
        axes = set(e["axes"])
        if phase == "optimizer" or axes & dcn_axes:
            kind = "exposed"        # (a reduction across slices on the critical path: dcn_overlap=False)
        elif axes <= data_axes:
            kind = "overlap" if e["op"] == "all_gather" else "dp"   # gathers prefetched; gradient reductions
        elif s.context and axes == {s.context}:
            kind = "overlap"
        elif s.model and s.model in axes:
            kind = "overlap" if async_tp else "exposed"
        else:
            kind = "exposed"
        scale = 1.0
        if reduce_size and kind == "dp" and e["op"] in ("psum", "psum_scatter"):
            scale = reduce_size / np.dtype(e["dtype"]).itemsize   # the gradient reduced in reduce_dtype
            e = dict(e, bytes_in=e["bytes_in"] * scale, bytes_out=e["bytes_out"] * scale)
        if fsdp_copies and axes <= data_axes and e["op"] in ("all_gather", "psum_scatter") and phase != "optimizer":
            # copy-out: read and write the gathered weights; copy-in: read the gradient, write it cast
            # (the backward's re-gather is recorded in the recompute phase: its copy is the backward's)
            moved = 2 * e["bytes_out"] if e["op"] == "all_gather" else e["bytes_in"] * (1 + 1 / scale)
            ph_c = "backward" if phase == "recompute" else phase
            comp[(where, ph_c)] = comp.get((where, ph_c), 0.0) + price_ew(moved, hw, p_list, 1) * w
        k4 = (where, phase, key, kind)
        comm_b[k4] = comm_b.get(k4, 0.0) + price_event(e, hw, p_list, mesh=m) * w
    comm: dict = {}
    for (_, _, key, _), v in comm_b.items():
        comm[key] = comm.get(key, 0.0) + v
    # sequences cut over the data axes: each piece's attention needs the K/V of its sequence's
    # other pieces, gathered before it (and their gradients reduce-scattered), on the critical path
    kv_exchange = 0.0
    if chunks > 1 and s.data:
        attn_again = any(e["phase"] == "recompute" and (e["label"] or "").startswith(unit_label + "/attn")
                         for e in events)
        kv_exchange = _kv_exchange_seconds(cfg, s, m, hw, p_list, rows // (X * run_mb), seq // C, chunks,
                                           Y if s.model else 1, np.dtype(t.dtype).itemsize, attn_again)
        kv_exchange *= layers_dev * run_mb   # exposed (phases), not a ledger collective (comm_seconds)

    # memory-bound work the ledger does not record
    tokens_dev = rows // run_mb * cols / (X * s.context_size(m)) if X else 0
    tp = Y if s.model else 1
    ew_fwd = formulas.layer_elementwise_bytes(
        cfg.d_model, cfg.ffw_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, tp=tp,
        sequence_parallel=s.sequence_parallel, gated=cfg.gated_mlp, rotary=cfg.positions == "rotary",
        biases=cfg.mlp_bias, dropout=dropout, attention=attention, seq=seq,
        eager=kernels == "eager", eager_norm=kernels == "eager" and not fused_norm) * tokens_dev * elementwise_scale
    policy = remat_policy(remat)
    rec_frac = sum(w for name, w in _EW_SHARE.items() if policy.checkpointed and policy.recomputes(name))
    ew = {"forward": price_ew(ew_fwd, hw, p_list, 8),
          "recompute": price_ew(ew_fwd * rec_frac, hw, p_list, 8) if rec_frac else 0.0,
          "backward": price_ew(ew_fwd * formulas.BACKWARD_ELEMENTWISE, hw, p_list, 12)}
    loss = price_ew(formulas.loss_bytes(cfg.vocab_size, tp=tp, eager=kernels == "eager") * tokens_dev, hw, p_list,
                    6 if kernels == "eager" else 3)

    # memory per device: the executed state, its last layer counted for the layers not executed
    new = out["state"]
    mem = _state_bytes(new)
    if n_run != L or piped:
        one = _state_bytes(new, n_run - 1) if n_run >= 1 else {k: 0 for k in mem}
        mem = {k: v + (layers_dev - n_run) * one[k] for k, v in mem.items()}
    opt_seconds = price_ew(formulas.optimizer_bytes(mem["params"], mem["grads"], mem["optimizer"]), hw, p_list, 4)
    C = s.context_size(m)
    sizes = {a: n for a, n in m.shape.items() if a != s.context} or {s.context: 1}
    tm = training_memory(cfg.replace(num_layers=layers_dev) if piped else cfg, s, sizes,
                         batch=X, optimizer=optimizer, precision=precision, remat=remat,
                         context=run_batch * seq // (X * C * run_mb))
    act = float(tm.parts["activations"])
    if piped:  # 1F1B keeps up to p microbatches in flight on the first stage
        act *= min(microbatches, pipeline)
    memory = dict(mem, activations=act)

    # per microbatch, per phase: compute and overlappable communication of layers and the rest
    dp_kind = "overlap" if dp_overlap else "exposed"

    def phase_parts(where_set, phase, with_dp=True):
        """(compute, overlappable comm per axis, exposed comm per axis) of `phase` in `where_set`."""
        c = sum(v for (w_, ph), v in comp.items() if w_ in where_set and ph == phase)
        ov, ex = {}, {}
        for (w_, ph, k, kind), v in comm_b.items():
            if w_ not in where_set or ph != phase or (kind == "dp" and not with_dp):
                continue
            kind = dp_kind if kind == "dp" else kind
            d = ov if kind == "overlap" else ex
            d[k] = d.get(k, 0.0) + v
        return c, ov, ex

    phases: dict = {"forward": 0.0, "recompute": 0.0, "backward": 0.0, "optimizer": 0.0}
    exposed: dict = {}
    notes = [f"{n_run} of {L} layers executed, the last counted {layers_dev - n_run} more times"
             if n_run < layers_dev else f"all {n_run} layers executed"]
    every = {w_ for w_, _ in comp} | {k[0] for k in comm_b}
    n_layers_here = layers_dev if not piped else 1

    def overlap(c, ov, n_layers):
        """Exposed seconds per axis of `ov` overlapped with compute `c`: what exceeds the
        compute, and at least one layer's worth (the first gather / the last reduction)."""
        tot = sum(ov.values())
        if tot <= 0:
            return {}
        hidden_room = max(0.0, c)
        over = max(0.0, tot - hidden_room) + tot / max(1, n_layers)
        over = min(tot, over)
        return {k: over * v / tot for k, v in ov.items()}

    if not piped:
        for ph in _PHASES:
            c, ov, ex = phase_parts(every, ph)
            # the memory-bound bytes are per microbatch: the executed step ran run_mb of them
            c += (ew[ph] * layers_dev + (loss * 0.5 if ph != "recompute" else 0.0)) * run_mb
            phases[ph] = c
            for k, v in list(overlap(c, ov, layers_dev).items()) + list(ex.items()):
                exposed[k] = exposed.get(k, 0.0) + v
        bubble = 0.0
    else:
        # one microbatch through one layer (the unit) and through the rest, clocked over the stages
        layer = {ph: phase_parts({"layer"}, ph, with_dp=False) for ph in _PHASES}
        rest = {ph: phase_parts(every - {"layer", "other_layer"}, ph, with_dp=False) for ph in _PHASES}

        def cost_of(parts, ph, with_ew):
            c, ov, ex = parts[ph]
            c += ew[ph] if with_ew else 0.0
            return c + sum(overlap(c, ov, 1).values()) + sum(ex.values())

        lf = cost_of(layer, "forward", True)
        lb = cost_of(layer, "recompute", True) + cost_of(layer, "backward", True)
        emb_f, emb_b = (cost_of(rest, "forward", False) + loss * 0.5,
                        cost_of(rest, "recompute", False) + cost_of(rest, "backward", False) + loss * 0.5)
        v = virtual_stages
        n = pipeline * v
        per_chunk = L // n
        fwd = [per_chunk * lf] * n
        bwd = [per_chunk * lb] * n
        fwd[-1] += emb_f     # the head and the loss on the last virtual stage (the embedding is cheap)
        bwd[-1] += emb_b
        send = _send_seconds(cfg, run_batch // X, seq, tp, s.sequence_parallel, hw, p_list, pipeline_link)
        step_pipe = _clock(sched, pipeline, microbatches, v, tuple(fwd), tuple(bwd), send)
        busy = max(sum(fwd[k] + bwd[k] for k in range(dev, n, pipeline)) for dev in range(pipeline)) * microbatches
        bubble = max(0.0, step_pipe - busy)
        # split the busy time into phases (the layers' compute), the rest is exposed TP / sends
        for ph in _PHASES:
            c_l = layer[ph][0] + ew[ph]
            phases[ph] = (c_l * per_chunk * v + (rest[ph][0] if ph != "recompute" else 0.0)) * microbatches
        comm_busy = busy - sum(phases[ph] for ph in _PHASES)
        if comm_busy > 0:
            exposed[s.model or "model"] = comm_busy
        # the data-parallel gradient reduction of the last stage after (or under) its backward
        dp = sum(v_ for (w_, ph, k, kind), v_ in comm_b.items() if kind == "dp" and w_ != "other_layer")
        dp_layer = sum(v_ for (w_, ph, k, kind), v_ in comm_b.items() if kind == "dp" and w_ == "layer")
        dp_total = dp_layer * (layers_dev - 1) + dp
        dp_exposed = max(0.0, dp_total - sum(bwd[-1::-pipeline])) if dp_overlap else dp_total
        dkey = "+".join(s.data) or "data"
        if dp_exposed > 0:
            exposed[dkey] = exposed.get(dkey, 0.0) + dp_exposed
        comm = {k: v_ * (microbatches if k not in (dkey,) else 1) for k, v_ in comm.items()}
        notes.append(f"{sched} over {pipeline} stages x {microbatches} microbatches"
                     f"{f' ({v} chunks per stage)' if v > 1 else ''}: bubble {units.fmt_seconds(bubble)}, "
                     f"send {units.fmt_seconds(send)} between stages")
    if kv_exchange:
        dkey = "+".join(s.data)
        exposed[dkey] = exposed.get(dkey, 0.0) + kv_exchange
        notes.append(f"each sequence cut into {chunks} pieces over the data axes: its K/V gathered for attention, "
                     f"{units.fmt_seconds(kv_exchange)} exposed")
    phases["optimizer"] = opt_seconds + sum(v for (w_, ph, k, kind), v in comm_b.items() if ph == "optimizer")
    for k, v in exposed.items():
        phases[f"comm:{k}"] = v
    phases["bubble"] = bubble
    step = sum(phases.values())
    compute = sum(phases[p] for p in _PHASES) + opt_seconds
    bound = "compute"
    if comm:
        worst = max(comm, key=comm.get)
        if comm[worst] > compute:
            bound = "comm:" + worst
    peak = sl.cost.peak_flops(hw, "bfloat16")[0]
    chips = m.size * pipeline
    model_flops = flops_per_token(cfg, seq, causal=True, training=True).total * batch * seq
    mfu = model_flops / (step * chips * peak) if step > 0 else 0.0
    if piped:   # one microbatch of one layer x the device's layers, the rest shared by the stages
        rest_fl = sum(v for k, v in fl.items() if k not in ("layer", "other_layer"))
        hfu_flops = (fl.get("layer", 0.0) * layers_dev + rest_fl / pipeline) * microbatches
    else:
        hfu_flops = sum(fl.values())
    hfu = hfu_flops / (step * peak) if step > 0 else 0.0
    fits = sum(memory.values()) <= hw.hbm_capacity
    est = Estimate(s.name, dict(m.shape), compute, comm, step, exposed, memory, mfu, bound, fits, ledger,
                   sequence_chunks=chunks, matmul_seconds=matmul_peak, phases=phases, hfu=hfu, hardware=hw.name,
                   chips=chips, pipeline=pipeline, prices=p_list.chip if p_list.chip != hw.name else f"{hw.name} list",
                   layers_executed=n_run, hbm_capacity=hw.hbm_capacity, notes=notes, tokens_per_step=batch * seq)
    return est


def _kv_exchange_seconds(cfg, s, mesh, hw, prices, pieces: int, seq_local: int, chunks: int, tp: int,
                        itemsize: int, again: bool) -> float:
    """One layer's K/V exchange between the ``chunks`` pieces of a sequence cut over the data
    axes: the forward (and the recompute, ``again``) all-gathers each piece's K and V into the
    whole sequence's (``seq_local`` tokens: the sequence over the context axis), the backward
    reduce-scatters their gradients."""
    full = pieces * seq_local * 2 * (cfg.num_kv_heads // tp) * cfg.head_dim * itemsize
    ev = {"op": "all_gather", "axes": tuple(s.data), "group_size": chunks, "bytes_in": full / chunks,
          "bytes_out": full, "dtype": "bfloat16"}
    gather = price_event(ev, hw, prices, mesh=mesh)
    scatter = price_event(dict(ev, op="psum_scatter", bytes_in=full, bytes_out=full / chunks), hw, prices, mesh=mesh)
    return gather * (2 if again else 1) + scatter


def price_ew(nbytes: float, hw, prices, kernels: int) -> float:
    """Memory-bound work priced through the one pricing function, as an elementwise event."""
    if nbytes <= 0:
        return 0.0
    return price_event({"op": "elementwise", "hbm_bytes": nbytes}, hw, prices) + (kernels - 1) * prices.kernel_overhead


def _send_seconds(cfg, mb_rows: int, seq: int, tp: int, sp: bool, hw, prices, link) -> float:
    """One activation (or its gradient) between pipeline stages: rows x seq x D bf16 values; under
    tensor parallelism each of the t ranks sends 1/t of it and the receivers all-gather (Megatron's
    scatter/gather)."""
    nbytes = 2.0 * mb_rows * seq * cfg.d_model
    if hw.family == "gpu":
        kind = link or "ib"
        bw = {"ib": hw.ib_bandwidth, "nvlink": hw.nvlink_bandwidth}.get(kind, hw.ib_bandwidth)
        lat = hw.ib_latency if kind == "ib" else hw.hop_latency
    else:
        kind = link or "ici"
        bw = hw.dcn_bandwidth if kind == "dcn" else hw.ici_link_bandwidth
        lat = hw.dcn_latency if kind == "dcn" else hw.hop_latency
    per = nbytes / tp
    t = per / (bw * prices.collective(kind)) + lat + prices.collective_overhead
    if tp > 1 and not sp and hw.family == "gpu":
        t += (tp - 1) / tp * nbytes / (hw.nvlink_bandwidth * prices.collective("nvlink")) + prices.collective_overhead
    return t


@functools.lru_cache(maxsize=128)
def _built(sched: str, p: int, m: int, v: int):
    build = _pp.SCHEDULES[sched]
    return build(p, m, v) if sched == "interleaved-1f1b" else build(p, m)


def _clock(sched: str, p: int, m: int, v: int, fwd, bwd, send, *, exact: bool = False) -> float:
    """The schedule's step time; past ~3p microbatches each adds the same time, so unless
    ``exact`` long runs are clocked at 2p and 3p microbatches and extended linearly."""
    def run(mm):
        return _pp.clock(_built(sched, p, mm, v), _pp.Durations(forward=list(fwd), backward=list(bwd), send=send),
                         check=False).step_time

    if exact or m <= 3 * p:
        return run(m)
    t2, t3 = run(2 * p), run(3 * p)
    return t2 + (m - 2 * p) * (t3 - t2) / p


# the layer's memory-bound work by the checkpoint name whose recompute re-runs it
class _Ring:
    """Context parallelism in closed form: the step runs with a context axis of :attr:`RUN`
    devices holding the same local blocks as the real ``C``; each event of the ring is then
    counted for ``C``. The zig-zag ring of ``C`` computes ``2C + 1`` blocks of ``c x c`` scores
    (``train.context``: 3 on its first step, 2 on each of the ``C - 1`` others) where the run
    computed ``2·RUN + 1``, and sends ``C - 1`` hops of each K/V block where it sent ``RUN - 1``;
    a reduction over the context axis (the replicated weights' gradients) has ``C`` members.
    The sums equal those of executing the ring of ``C`` (checked in tests/python/test_search.py)
    in a time that does not grow with ``C``."""

    RUN = 2

    def __init__(self, C: int, mesh, axis: str, hw):
        self.C, self.axis = C, axis
        self.blocks = (2 * C + 1) / (2 * self.RUN + 1)
        shape = {a: (self.RUN if a == axis else n) for a, n in dict(mesh.shape).items()}
        self.run_mesh = sl.make_mesh(tuple(shape.values()), tuple(shape), hardware=hw, abstract=True)

    def event(self, e: dict) -> tuple[dict, float]:
        """(the run's event over the context axis as the real ring's, how many of it the ring has)."""
        n = int(e.get("group_size") or self.RUN) * self.C // self.RUN
        if e["op"] == "ppermute":   # each hop a neighbour exchange, as the run's (routing C pairs is slow)
            return dict(e, group_size=n), (self.C - 1) / (self.RUN - 1)
        return dict(e, group_size=n), 1.0


_LAYERS_RUN = 2   # layers a dense model executes by default (the last counted for the rest)

_EW_SHARE = {"attn_norm": 0.25, "mlp_norm": 0.25, "mlp_act": 0.4, "attn_out": 0.1}


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


