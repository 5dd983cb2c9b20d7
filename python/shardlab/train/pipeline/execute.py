"""Runs a schedule on real data: one training step of a ``shardlab.models.transformer`` model.

Each device along the mesh's pipeline axis (``"stage"``) is one pipeline rank and runs its own
action list in order, as a rank of an MPMD pipeline (PyTorch's pipelining, Megatron) does:

- its compute runs in :func:`shardlab.shard_map` over *its* slice of the mesh (the ``stage``
  axis cut to that one device, every other axis kept), so a ``("stage", "data")`` mesh is
  pipeline x data parallelism: the microbatch is split over the other axes and every replica
  holds its own copy of the stage's weights (or, with ``fsdp=True``, its ZeRO-3 shard of them,
  gathered per piece as it runs); a ``model`` axis adds Megatron tensor parallelism inside the
  stage (:mod:`.tensor`): 3-D parallelism;
- a stage is a chain of pieces (:func:`shardlab.train.pipeline.stages.pieces`: embedding, per
  block norm / attention / norm / MLP, final norm, head and loss); a forward is one
  ``shardlab.vjp`` per piece, kept until that microbatch's backward;
- a whole backward walks the pieces backwards from the gradient received from the next stage
  (``1/(m * replicas)`` on the last, whose outputs are the replicas' losses), sends the input
  gradient on and adds each piece's weight gradient to the replica's sum;
- a zero-bubble *input gradient* step walks them with ``vjp_fn(ct, argnums=1)``: only the
  input cotangents, none of the weight-gradient matmuls; it keeps each piece's output cotangent.
  The *weight gradient* step calls ``vjp_fn(ct, argnums=0)`` on them: the weight-gradient
  matmuls (plus, inside each piece, the input gradient of the ops between its output and its
  first weight, which it recomputes), so the ledger puts each half's FLOPs in its own action;
- the data-parallel gradient sum runs once per step, after the last action: per device one
  ``psum`` over the data axes of one flat buffer holding all its weight gradients (its shards
  of them under a model axis; as PyTorch's DDP buckets do), not one per microbatch
  (:meth:`Execution.gradient_all_reduce_events`); with ``fsdp=True`` the backward of each
  piece reduce-scatters its gradients instead and there is no end-of-step sum;
- a send is ``shardlab.lax.ppermute`` over the pipeline axis with the one pair
  ``(sender, receiver)``, run in ``shard_map`` over the whole mesh; the receive takes the
  receiver's block.

The work is split as ``torch.distributed.pipelining`` splits it: a
:class:`~shardlab.train.pipeline.stage_runtime.StageRuntime` per virtual stage holds its pieces,
activations, deferred cotangents and gradient sums and has forward / backward / input-gradient /
weight-gradient methods; the schedule's runtime here moves values between stages and runs each
device's action list with one method per action kind.

Every action runs inside ``shardlab.named_scope("pipeline/<action>")``; the executor notes which
ledger events each action recorded (:meth:`Execution.action_events`), and the clock can be fed
the executed times (:meth:`Execution.durations`, :meth:`Execution.timeline`).

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab.models import ModelConfig, transformer
    >>> from shardlab.train import pipeline as pp
    >>> cfg = ModelConfig(num_layers=2, d_model=32, ffw_dim=64, num_heads=4, num_kv_heads=2, vocab_size=50)
    >>> params = transformer.init_params(cfg, seed=0)
    >>> tok = np.random.default_rng(0).integers(0, 50, (4, 8)); tgt = np.roll(tok, -1, axis=1)
    >>> mesh = sl.make_mesh((2,), ("stage",))
    >>> ex = pp.execute(pp.one_f_one_b(2, 2), params, tok, tgt, cfg, mesh)
    >>> loss, grads = pp.reference_step(params, tok, tgt, cfg)
    >>> bool(abs(ex.loss - loss) < 1e-5), len(ex.ledger.filter(op="ppermute"))
    (True, 4)
"""

from __future__ import annotations

import numpy as np

import shardlab as sl
import shardlab.numpy as jnp
from shardlab import P
from shardlab.models import ModelConfig, param_axes

from ..step import reference_grads
from . import stages as _stages
from .execution import Execution
from .schedule import (ACTIVATION, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, GRADIENT, RECV, SEND, Action,
                       Schedule, stage_layers)
from .stage_runtime import StageRuntime
from .tensor import FullyShardedData, TensorParallel
from .validate import ScheduleError, validate

__all__ = ["execute", "reference_step", "Execution"]

_OP = "pipeline.execute"


def reference_step(params: dict, tokens, targets, cfg: ModelConfig, *, causal: bool = True):
    """The non-pipelined step every schedule is compared with: ``(loss, grads)`` of the whole model
    on one device, ``shardlab.train.step.reference_grads`` (``transformer.loss``'s value and gradient;
    the same blocks, in order, as the stages run them)."""
    return reference_grads(cfg, params, tokens, targets, causal=causal)


def _check_inputs(schedule: Schedule, tokens, targets, cfg: ModelConfig, mesh, axis: str, model: str | None):
    names = tuple(mesh.axis_names)
    if axis not in names:
        raise ValueError(f"[{_OP}] the mesh has no pipeline axis {axis!r} (axes {names}); build it with a "
                         f"{axis!r} axis of size p={schedule.p}, e.g. make_mesh(({schedule.p},), ({axis!r},)), "
                         f"or pass axis=<the pipeline axis>")
    if dict(mesh.shape)[axis] != schedule.p:
        raise ValueError(f"[{_OP}] the mesh's {axis!r} axis has {dict(mesh.shape)[axis]} devices but the schedule "
                         f"has p={schedule.p} stages; they must be equal")
    tokens, targets = np.asarray(tokens), np.asarray(targets)
    if tokens.ndim != 2 or targets.shape != tokens.shape:
        raise ValueError(f"[{_OP}] tokens and targets must be [batch, seq] of one shape, got {tokens.shape} "
                         f"and {targets.shape}")
    B, m = tokens.shape[0], schedule.m
    if B % m:
        raise ValueError(f"[{_OP}] batch {B} is not divisible by m={m} microbatches; use a batch that is a "
                         f"multiple of {m}")
    if model == axis:
        raise ValueError(f"[{_OP}] model={model!r} is the pipeline axis; name a different mesh axis for tensor "
                         f"parallelism (or model=None)")
    data_axes = tuple(a for a in names if a not in (axis, model))
    dp = int(np.prod([dict(mesh.shape)[a] for a in data_axes], dtype=np.int64)) if data_axes else 1
    if (B // m) % dp:
        raise ValueError(f"[{_OP}] microbatch {B // m} (batch {B} / m={m}) is not divisible by the {dp} devices "
                         f"of the data axes {data_axes}; use a batch that is a multiple of {m * dp}")
    layers = stage_layers(cfg.num_layers, schedule.num_virtual_stages)
    if schedule.layers is not None and tuple(schedule.layers) != layers:
        raise ValueError(f"[{_OP}] the schedule was built for layers {schedule.layers} but the model has "
                         f"{cfg.num_layers} layers (split {layers}); build it with num_layers={cfg.num_layers}")
    return tokens, targets, data_axes, layers


def _submesh(mesh, axis: str, s: int):
    """Device ``s``'s slice of the mesh: the pipeline axis cut to that device, every other axis kept."""
    i = tuple(mesh.axis_names).index(axis)
    return sl.Mesh(np.take(mesh.devices, [s], axis=i), tuple(mesh.axis_names), hardware=mesh.hardware,
                   physical_axes=getattr(mesh, "physical_axes", None))


def _spec_leaves(spec, tree) -> list:
    """One PartitionSpec per leaf of ``tree``: ``spec`` is a prefix (one spec for all) or a tree."""
    if isinstance(spec, P):
        return [spec] * len(_leaves(tree))
    if isinstance(tree, dict):
        return [x for k in tree for x in _spec_leaves(spec[k], tree[k])]
    return [x for sp, v in zip(spec, tree) for x in _spec_leaves(sp, v)]


def _leaves(tree) -> list:
    if isinstance(tree, dict):
        return [x for k in tree for x in _leaves(tree[k])]
    if isinstance(tree, (list, tuple)):
        return [x for v in tree for x in _leaves(v)]
    return [tree]


def _fill(tree, it):
    if isinstance(tree, dict):
        return {k: _fill(v, it) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_fill(v, it) for v in tree)
    return next(it)


def execute(schedule: Schedule, params: dict, tokens, targets, cfg: ModelConfig, mesh, *, axis: str = "stage",
            model: str | None = "model", fsdp: bool = False, causal: bool = True) -> Execution:
    """Runs one training step of ``transformer.loss`` with ``schedule`` on ``mesh``.

    Args:
        schedule: a valid schedule (any builder's, or your own) with ``p`` equal to the size of
            the mesh's pipeline axis; its ``p * v`` virtual stages split the model's layers
            (:func:`stage_layers`).
        params: ``transformer.init_params(cfg)``-shaped params (numpy arrays).
        tokens / targets: ids ``[batch, seq]``; the batch is cut into ``m`` microbatches, each
            split over the mesh's other axes (data parallelism).
        cfg: the model.
        mesh: a mesh with the pipeline axis (hardware optional; with it every event is priced).
        axis: the pipeline axis name.
        model: the tensor-parallel axis, when the mesh has it: inside every stage the heads, F
            and the vocabulary are split over it (Megatron f / g, :mod:`.tensor`); every other
            axis is a data axis. ``None``: no tensor parallelism.
        fsdp: ZeRO-3 over the data axes (:class:`.tensor.FullyShardedData`): weights stored split
            over them, all-gathered by each piece as it runs, gradients reduce-scattered in the
            backward; no end-of-step all-reduce. Default: each data replica holds whole weights
            and the replicas' gradients are all-reduced once per step.

    Returns:
        An :class:`Execution` (loss, grads, ledger, executed durations and timeline).

    Raises:
        ValueError: no pipeline axis in the mesh or the wrong size, a batch not divisible into
            m microbatches (or a microbatch over the data axes), more stages than layers, heads,
            kv heads, F or the vocabulary not divisible by the model axis.
        ScheduleError: an invalid or deadlocking schedule.
    """
    validate(schedule)
    tokens, targets, data_axes, layers = _check_inputs(schedule, tokens, targets, cfg, mesh, axis, model)
    run = _ScheduleRun(schedule, params, tokens, targets, cfg, mesh, axis, model, data_axes, layers, fsdp, causal)
    with sl.Ledger() as ledger:
        run.run_actions(ledger)
        grads = run.gradients(ledger) if all(st.complete for st in run.stages) else None
    losses = run.losses
    return Execution(schedule, mesh, axis, float(np.mean(losses)) if None not in losses else None, grads, ledger,
                     run.order, run.spans, run.peak, run.reduce_spans)


class _ScheduleRun:
    """The schedule's side of a step (``torch.distributed.pipelining``'s schedule runtime): the
    stages (:class:`~.stage_runtime.StageRuntime`), the values in flight between them, and a loop
    that runs each device's actions in order, a receive only once its send has run."""

    def __init__(self, schedule: Schedule, params, tokens, targets, cfg, mesh, axis, model, data_axes, layers,
                 fsdp: bool, causal: bool):
        self.schedule, self.mesh, self.axis, self.data_axes = schedule, mesh, axis, data_axes
        self.tokens, self.targets, self.params = tokens, targets, params
        p, m, n = schedule.p, schedule.m, schedule.num_virtual_stages
        shape = dict(mesh.shape)
        if model is not None and model not in shape:
            model = None
        tp = TensorParallel(cfg, model, shape[model]) if model is not None else None
        fs = FullyShardedData(cfg, data_axes, model, {a: shape[a] for a in data_axes + ((model,) if model else ())}) \
            if fsdp else None
        self.tp, self.fsdp = tp, fs
        axes = param_axes(cfg) if (tp is not None or fs is not None) else None
        dp = int(np.prod([shape[a] for a in data_axes], dtype=np.int64)) if data_axes else 1
        self.mb_size = tokens.shape[0] // m
        self.submeshes = [_submesh(mesh, axis, s) for s in range(p)]
        self.stages = [StageRuntime(vs, _stages.pieces(params, cfg, layers[vs], first=vs == 0, last=vs == n - 1,
                                                       causal=causal, tp=tp),
                                    self.submeshes[schedule.placement(vs)[0]], data_axes=data_axes, replicas=dp,
                                    last=vs == n - 1, tp=tp, fsdp=fs, axes=axes)
                       for vs in range(n)]
        self.seed = np.full((dp,), 1.0 / (m * dp), np.float32)   # d(mean loss) / d(each replica's loss)
        self.outputs: dict = {}   # (payload, producing vs, mb) -> a value made on this device, not yet consumed
        self.inbox: dict = {}     # (payload, consuming vs, mb) -> a value received from another device
        self.losses: list = [None] * m
        self.live, self.peak = [0] * p, [0] * p   # per device: microbatches whose activations it holds
        self.order: list[Action] = []
        self.spans: dict = {}          # action -> (first, end) of its events in the ledger
        self.reduce_spans: dict = {}   # device -> (first, end) of its gradient all-reduce's events
        self._run = {FORWARD: self._forward, BACKWARD: self._backward, BACKWARD_INPUT: self._backward,
                     BACKWARD_WEIGHT: self._weight, SEND: self._send, RECV: lambda a, vs: None}

    def run_actions(self, ledger) -> None:
        """Every device's actions in order, devices interleaved, a receive waiting for its send.

        Raises:
            ScheduleError: no device can proceed (a deadlock).
        """
        s_, ptr = self.schedule, [0] * self.schedule.p
        progress = True
        while progress:
            progress = False
            for s in range(s_.p):
                acts = s_.actions[s]
                while ptr[s] < len(acts):
                    a = acts[ptr[s]]
                    vs = s_.virtual_stage(s, a.chunk)
                    if a.kind == RECV and (a.payload, vs, a.microbatch) not in self.inbox:
                        break
                    first = len(ledger)
                    with sl.named_scope(f"pipeline/{a}"):
                        self._run[a.kind](a, vs)
                    self.spans[a] = (first, len(ledger))
                    self.order.append(a)
                    ptr[s] += 1
                    progress = True
        stuck = [s for s in range(s_.p) if ptr[s] < len(s_.actions[s])]
        if stuck:
            parts = "; ".join(f"stage {s} waits at '{s_.actions[s][ptr[s]]}'" for s in stuck)
            raise ScheduleError(f"{s_.name}: deadlock, no device can proceed: {parts}",
                                s_.actions[stuck[0]][ptr[stuck[0]]], op=_OP)

    def _take(self, payload: str, vs: int, mb: int, producer: int, device: int):
        """The ``payload`` of microbatch ``mb`` that virtual stage ``producer`` made for ``vs``:
        from the inbox when the producer sits on another device, else straight from its output."""
        if self.schedule.placement(producer)[0] != device:
            return self.inbox.pop((payload, vs, mb))
        return self.outputs.pop((payload, producer, mb))

    def _forward(self, a: Action, vs: int) -> None:
        s, mb = a.stage, a.microbatch
        rows = slice(mb * self.mb_size, (mb + 1) * self.mb_size)
        x = self.tokens[rows] if vs == 0 else self._take(ACTIVATION, vs, mb, vs - 1, s)
        out = self.stages[vs].forward(mb, x, self.targets[rows])
        self.live[s] += 1
        self.peak[s] = max(self.peak[s], self.live[s])
        if vs == len(self.stages) - 1:
            self.losses[mb] = float(np.mean(np.asarray(out)))
        else:
            self.outputs[(ACTIVATION, vs, mb)] = out

    def _backward(self, a: Action, vs: int) -> None:
        s, mb = a.stage, a.microbatch
        ct = self.seed if vs == len(self.stages) - 1 else self._take(GRADIENT, vs, mb, vs + 1, s)
        st = self.stages[vs]
        ct = st.backward(mb, ct) if a.kind == BACKWARD else st.backward_input(mb, ct)
        if vs > 0:
            self.outputs[(GRADIENT, vs, mb)] = ct
        if a.kind == BACKWARD:
            self.live[s] -= 1

    def _weight(self, a: Action, vs: int) -> None:
        self.stages[vs].backward_weight(a.microbatch)
        self.live[a.stage] -= 1

    def _send(self, a: Action, vs: int) -> None:
        """ppermute of the value from this device to the consumer's along the pipeline axis (the one pair)."""
        dst_vs = vs + 1 if a.payload == ACTIVATION else vs - 1
        value = np.asarray(self.outputs.pop((a.payload, vs, a.microbatch)))
        src, dst, p = a.stage, self.schedule.placement(dst_vs)[0], self.schedule.p
        buf = np.zeros((p,) + value.shape, value.dtype)
        buf[src] = value
        spec = P(self.axis, self.data_axes) if self.data_axes else P(self.axis)
        moved = sl.shard_map(lambda x: sl.lax.ppermute(x, self.axis, [(src, dst)]), mesh=self.mesh,
                             in_specs=spec, out_specs=spec)(buf)
        self.inbox[(a.payload, dst_vs, a.microbatch)] = np.asarray(moved)[dst]

    def gradients(self, ledger) -> dict:
        """The params-shaped gradient of the step: with ZeRO-3 each piece's backward reduce-scattered
        its gradients already; otherwise each device's data-parallel all-reduce runs here, once."""
        if self.fsdp is not None:
            pairs = [(q, g) for st in self.stages for q, g in zip(st.pieces, st.grads)]
        else:
            pairs = []
            for s in range(self.schedule.p):
                first = len(ledger)
                with sl.named_scope(f"pipeline/gradient all-reduce s{s}"):
                    pairs += self._all_reduce(s)
                self.reduce_spans[s] = (first, len(ledger))
        return _stages.assemble_grads(self.params, pairs)

    def _all_reduce(self, s: int) -> list:
        """Device s's gradients, summed over the data-parallel replicas: one psum of one flat
        buffer (all its chunks' weight gradients, the device's shards of them under a model
        axis), once per step."""
        data_axes = self.data_axes
        mine = [(st, k) for st in self.stages if self.schedule.placement(st.index)[0] == s
                for k in range(len(st.pieces))]
        leaves = [x for st, k in mine for x in _leaves(st.grads[k])]
        specs = [x for st, k in mine for x in _spec_leaves(st.weight_specs[k], st.grads[k])]

        def body(*local):
            flat = jnp.concatenate([jnp.reshape(x.astype(np.float32), (1, -1)) for x in local], axis=1)
            if data_axes:
                flat = sl.lax.psum(flat, data_axes)
            out, at = [], 0
            for x in local:
                size = int(np.prod(x.shape, dtype=np.int64))
                out.append(jnp.reshape(flat[:, at:at + size], tuple(x.shape)).astype(x.dtype))
                at += size
            return tuple(out)

        out_specs = tuple(P(None, *tuple(sp)[1:]) for sp in specs)
        # a replicated weight's slice of the flat buffer is equal on every device of the model
        # axis (each computed it from the same inputs), though the buffer as a whole varies
        summed = sl.shard_map(body, mesh=self.submeshes[s], in_specs=tuple(specs), out_specs=out_specs,
                              check_vma=self.tp is None)(*leaves)
        it = iter(np.asarray(x)[0] for x in summed)
        return [(st.pieces[k], _fill(st.grads[k], it)) for st, k in mine]
