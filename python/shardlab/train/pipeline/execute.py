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

from . import stages as _stages
from .durations import Durations
from .clock import Timeline, clock
from .tensor import FullyShardedData, TensorParallel, piece_axes
from .schedule import (ACTIVATION, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, GRADIENT, RECV, SEND, Action,
                       Schedule, stage_layers)
from ..step import tree_map
from .validate import ScheduleError, validate

__all__ = ["execute", "reference_step", "Execution"]

_OP = "pipeline.execute"


def reference_step(params: dict, tokens, targets, cfg: ModelConfig, *, causal: bool = True):
    """The non-pipelined step: ``(loss, grads)`` of the whole model as one stage (the embedding,
    every block, the head and the mean loss over the batch) by ``shardlab.value_and_grad``.

    Its loss is ``transformer.loss(params, tokens, targets, cfg)`` (the same blocks, in order).
    """
    n = cfg.num_layers
    sp0 = _stages.split_params(params, cfg, (range(n),))[0]
    tokens, targets = np.asarray(tokens), np.asarray(targets)

    def step(sp):
        return _stages.stage_forward(sp, tokens, targets, cfg, first=True, last=True, layer_ids=range(n),
                                     causal=causal)

    loss, g = sl.value_and_grad(step)(sp0)
    return float(np.asarray(loss)), _stages.merge_grads(params, [g], (range(n),))


class Execution:
    """What :func:`execute` ran.

    Attributes:
        schedule, mesh, axis: the schedule, the mesh and its pipeline axis.
        loss: the step's loss (mean over the batch); grads: params-shaped gradients (numpy).
        ledger: every event of the step (compute on each stage's slice, ppermute sends, the
            data-parallel gradient all-reduce), each labelled ``pipeline/<action>/<piece>``
            (the all-reduce ``pipeline/gradient all-reduce s<device>``).
        order: the actions in the order the executor ran them (devices interleaved).
        peak_live: per device, the most vjp functions (microbatch activations) held at once.
    """

    def __init__(self, schedule, mesh, axis, loss, grads, ledger, order, spans, peak_live, reduce_spans=None):
        self.schedule, self.mesh, self.axis = schedule, mesh, axis
        self._reduce_spans = dict(reduce_spans or {})
        self.loss, self.grads, self.ledger = loss, grads, ledger
        self.order = order
        self.peak_live = tuple(peak_live)
        self._spans = spans   # action -> (first, end) indices of its events in the ledger
        self._events = None

    def action_events(self, action: Action) -> list[dict]:
        """The ledger events recorded while ``action`` ran (empty for an action not in the schedule)."""
        if self._events is None:
            self._events = self.ledger.events
        i, j = self._spans.get(action, (0, 0))
        return self._events[i:j]

    def gradient_all_reduce_events(self, stage: int | None = None) -> list[dict]:
        """The ledger events of the end-of-step data-parallel gradient all-reduce (one psum of one
        flat buffer per device; ``stage`` picks one device's). Empty without data axes."""
        if self._events is None:
            self._events = self.ledger.events
        spans = [self._reduce_spans[stage]] if stage is not None else list(self._reduce_spans.values())
        return [e for i, j in spans for e in self._events[i:j]]

    def _per_virtual_stage(self, kinds, field: str) -> tuple:
        """Per virtual stage: the value of ``field`` summed over one microbatch's ``kinds`` actions
        (checked equal for every microbatch that has them: the stages run the same program on
        each); ``None`` for a virtual stage where no microbatch has them (a schedule may run the
        whole backward for some microbatches and the split one for others, as DualPipeV does)."""
        s = self.schedule
        present = self._present()
        out = []
        for vs in range(s.num_virtual_stages):
            st, c = s.placement(vs)
            vals = []
            for mb in range(s.m):
                if kinds[0] not in (SEND, RECV) and (kinds[0], st, mb, c) not in present:
                    continue
                tot = 0.0
                for kind in kinds:
                    for e in self.action_events(Action(kind, st, mb, c, _payload(kind))):
                        if kind in (SEND, RECV) and e["op"] != "ppermute":
                            continue
                        v = e[field]
                        if v is None:
                            raise ValueError(f"[{_OP}] ledger event {e['op']} has no {field}: build the mesh "
                                             f"with hardware=... (e.g. make_mesh(..., hardware='tpu-v5e')) so "
                                             f"every event is priced")
                        tot += v
                vals.append(tot)
            if vals and max(vals) - min(vals) > 1e-9 * max(1.0, abs(max(vals))):
                raise ValueError(f"[{_OP}] virtual stage {vs}: {kinds} {field} differ between microbatches {vals}")
            out.append(vals[0] if vals else None)
        return tuple(out)

    def _present(self) -> set:
        if not hasattr(self, "_present_set"):
            self._present_set = {(a.kind, a.stage, a.microbatch, a.chunk) for acts in self.schedule.actions
                                 for a in acts if a.payload is None}
        return self._present_set

    def _backward_parts(self, field: str):
        """Per virtual stage (forward, backward, input part, weight part) of ``field``: the whole
        backward where a microbatch ran it whole, else input + weight parts; the weight part from
        the weight steps (0 where none ran)."""
        f = self._per_virtual_stage((FORWARD,), field)
        whole = self._per_virtual_stage((BACKWARD,), field)
        inp = self._per_virtual_stage((BACKWARD_INPUT,), field)
        wgt = self._per_virtual_stage((BACKWARD_WEIGHT,), field)
        back, i_out, w_out = [], [], []
        for k in range(len(f)):
            w = wgt[k] if wgt[k] is not None else 0.0
            i = inp[k] if inp[k] is not None else (whole[k] - w if whole[k] is not None else 0.0)
            back.append(whole[k] if whole[k] is not None else i + w)
            i_out.append(i)
            w_out.append(w)
        return f, tuple(back), tuple(i_out), tuple(w_out)

    def stage_flops(self) -> dict[str, tuple[float, ...]]:
        """Per virtual stage, the compute FLOPs per device of one microbatch's forward, backward
        (whole, or input + weight parts), input-gradient and weight-gradient steps, from the ledger."""
        f, b, i, w = self._backward_parts("flops")
        return {"forward": f, "backward": b, "backward_input": i, "backward_weight": w}

    def durations(self) -> Durations:
        """The clock's durations from the executed ledger: every action's events' seconds (FLOPs
        and bytes priced on the mesh's hardware), summed per virtual stage. A virtual stage that
        ran both whole and split backwards is clocked with the whole one's time and the weight
        steps' time (its input steps as their difference)."""
        fwd, back, _, wgt = self._backward_parts("seconds")
        n = len(fwd)
        send = self._sends(ACTIVATION, n)
        grad = self._sends(GRADIENT, n)
        hw = self.mesh.hardware.name if self.mesh.hardware is not None else "?"
        return Durations(forward=fwd, backward=back, weight=[min(w, b) for w, b in zip(wgt, back)], send=send,
                         grad_send=grad, source=f"executed ledger on {hw}")

    def _sends(self, payload: str, n: int) -> tuple[float, ...]:
        s = self.schedule
        out = []
        for vs in range(n):
            st, c = s.placement(vs)
            secs = [sum(e["seconds"] or 0.0 for e in self.action_events(Action(SEND, st, mb, c, payload))
                        if e["op"] == "ppermute") for mb in range(s.m)]
            out.append(max(secs))
        return tuple(out)

    def timeline(self) -> Timeline:
        """:func:`clock` of the schedule with the executed :meth:`durations`: the program that ran."""
        return clock(self.schedule, self.durations())

    def __repr__(self) -> str:
        s = self.schedule
        return (f"Execution({s.name}, p={s.p}, m={s.m}, v={s.v}, loss={self.loss:.6g}, "
                f"{len(self.ledger)} ledger events)")


def _payload(kind: str):
    return None if kind not in (SEND, RECV) else ACTIVATION


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


def _stack(tree, dp: int):
    """Every leaf repeated along a new leading axis of size dp: each data-parallel replica's copy
    of the weights (so each computes its own weight gradient; they are summed once per step)."""
    if isinstance(tree, dict):
        return {k: _stack(v, dp) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_stack(v, dp) for v in tree)
    a = np.asarray(tree)
    return np.broadcast_to(a[None], (dp,) + a.shape)


def _unstack(tree):
    """Inside shard_map: the local copy ``[1, ...]`` of stacked weights as ``[...]``."""
    if isinstance(tree, dict):
        return {k: _unstack(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_unstack(v) for v in tree)
    return jnp.reshape(tree, tuple(tree.shape[1:]))


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
    p, m, n = schedule.p, schedule.m, schedule.num_virtual_stages
    shape = dict(mesh.shape)
    if model is not None and model not in shape:
        model = None
    tp = TensorParallel(cfg, model, shape[model]) if model is not None else None
    fs = FullyShardedData(cfg, data_axes, model, {a: shape[a] for a in data_axes + ((model,) if model else ())}) \
        if fsdp else None
    all_axes = param_axes(cfg) if (tp is not None or fs is not None) else None
    dp = int(np.prod([shape[a] for a in data_axes], dtype=np.int64)) if data_axes else 1
    mb_size = tokens.shape[0] // m
    subs = [_submesh(mesh, axis, s) for s in range(p)]
    spec_x = P(data_axes) if data_axes else P()
    full_spec = P(axis, data_axes) if data_axes else P(axis)
    pieces = [_stages.pieces(params, cfg, layers[vs], first=vs == 0, last=vs == n - 1, causal=causal, tp=tp)
              for vs in range(n)]
    stacked = [[q.params if fs is not None else _stack(q.params, dp) for q in pcs] for pcs in pieces]
    dp_entry = (data_axes[0] if len(data_axes) == 1 else data_axes) if data_axes else None

    def weight_spec(q):
        """Stacked weights [dp, ...]: the replicas over the data axes, each param's own split over
        the model axis (``strategies.tp``'s param spec of its logical axes)."""
        if fs is not None:
            return tree_map(fs.spec, piece_axes(all_axes, q.where, q.params))
        if tp is None:
            return spec_x
        return tree_map(lambda ax: P(dp_entry, *tp.spec(ax)), piece_axes(all_axes, q.where, q.params))

    wspecs = [[weight_spec(q) for q in pcs] for pcs in pieces]

    def piece_fn(vs: int, k: int):
        q = pieces[vs][k]
        last = vs == n - 1 and k == len(pieces[vs]) - 1

        axes = piece_axes(all_axes, q.where, q.params) if fs is not None else None

        def body(w, c, tgt):
            out = q.apply(fs.gather(w, axes) if fs is not None else _unstack(w), c, tgt)
            return jnp.reshape(out, (1,)) if last else out   # each replica's own loss

        return sl.shard_map(body, mesh=subs[schedule.placement(vs)[0]], in_specs=(wspecs[vs][k], spec_x, spec_x),
                            out_specs=spec_x)

    fns = [[piece_fn(vs, k) for k in range(len(pieces[vs]))] for vs in range(n)]
    seed = np.full((dp,), 1.0 / (m * dp), np.float32)   # d(mean loss over the batch) / d(each replica's loss)

    def transfer(value, src: int, dst: int):
        """ppermute of ``value`` from device src to dst along the pipeline axis (the one pair)."""
        local = np.asarray(value)
        buf = np.zeros((p,) + local.shape, local.dtype)
        buf[src] = local
        moved = sl.shard_map(lambda x: sl.lax.ppermute(x, axis, [(src, dst)]), mesh=mesh,
                             in_specs=full_spec, out_specs=full_spec)(buf)
        return np.asarray(moved)[dst]

    vjps: dict = {}       # (vs, mb) -> the pieces' vjp functions (the microbatch's activations on that stage)
    outputs: dict = {}    # (payload, vs, mb) -> value made by a compute, waiting for its send
    inbox: dict = {}      # (payload, vs of the consumer, mb) -> received value
    deferred: dict = {}   # (vs, mb) -> (vjp functions, their output cotangents), held between I and W
    grad_sum: list = [[None] * len(pcs) for pcs in pieces]   # per replica, summed over microbatches
    losses = [None] * m
    live, peak = [0] * p, [0] * p
    order: list[Action] = []

    def add_grad(vs, k, g):
        grad_sum[vs][k] = g if grad_sum[vs][k] is None else _stages.add_trees(grad_sum[vs][k], g)

    def backward(vs: int, mb: int, ct, split: bool):
        """Walks the pieces backwards from ``ct``. Whole: each piece's vjp gives its weight and input
        cotangents. Split: only the input cotangents (argnums=1), keeping each piece's output
        cotangent for the weight step. Returns the stage's input cotangent (None on the first)."""
        fs = vjps.pop((vs, mb))
        cts = [None] * len(fs)
        for k in range(len(fs) - 1, -1, -1):
            cts[k] = ct
            if not pieces[vs][k].has_input:
                if not split:
                    add_grad(vs, k, fs[k](ct, argnums=0)[0])
                ct = None
            elif split:
                ct = fs[k](ct, argnums=1)[1]
            else:
                g, ct = fs[k](ct)
                add_grad(vs, k, g)
        if split:
            deferred[(vs, mb)] = (fs, cts)
        return ct

    def run(a: Action) -> None:
        s, mb = a.stage, a.microbatch
        vs = schedule.virtual_stage(s, a.chunk)
        rows = slice(mb * mb_size, (mb + 1) * mb_size)
        tgt = targets[rows]
        kind = a.kind
        if kind == FORWARD:
            if vs == 0:
                c = tokens[rows]
            elif schedule.placement(vs - 1)[0] != s:
                c = inbox.pop((ACTIVATION, vs, mb))
            else:
                c = outputs.pop((ACTIVATION, vs - 1, mb))
            fs = []
            for k, q in enumerate(pieces[vs]):
                with sl.named_scope(q.name):
                    if q.has_input:
                        c, f = sl.vjp(lambda w, x, f=fns[vs][k]: f(w, x, tgt), stacked[vs][k], c)
                    else:
                        c, f = sl.vjp(lambda w, f=fns[vs][k], ids=c: f(w, ids, tgt), stacked[vs][k])
                fs.append(f)
            vjps[(vs, mb)] = fs
            live[s] += 1
            peak[s] = max(peak[s], live[s])
            if vs == n - 1:
                losses[mb] = float(np.mean(np.asarray(c)))
            else:
                outputs[(ACTIVATION, vs, mb)] = c
        elif kind in (BACKWARD, BACKWARD_INPUT):
            if vs == n - 1:
                ct = seed
            elif schedule.placement(vs + 1)[0] != s:
                ct = inbox.pop((GRADIENT, vs, mb))
            else:
                ct = outputs.pop((GRADIENT, vs + 1, mb))
            ct = backward(vs, mb, ct, split=kind == BACKWARD_INPUT)
            if vs > 0:
                outputs[(GRADIENT, vs, mb)] = ct
            if kind == BACKWARD:
                live[s] -= 1
        elif kind == BACKWARD_WEIGHT:
            fs, cts = deferred.pop((vs, mb))
            for k, (f, ct) in enumerate(zip(fs, cts)):
                with sl.named_scope(pieces[vs][k].name):
                    add_grad(vs, k, f(ct, argnums=0)[0])
            live[s] -= 1
        elif kind == SEND:
            dst_vs = vs + 1 if a.payload == ACTIVATION else vs - 1
            value = outputs.pop((a.payload, vs, mb))
            inbox[(a.payload, dst_vs, mb)] = transfer(value, s, schedule.placement(dst_vs)[0])
        # RECV: the data is in the inbox once the send ran; the loop below only runs a receive then

    def all_reduce(s: int) -> list:
        """Device s's gradients, summed over the data-parallel replicas: one psum of one flat
        buffer (all its chunks' weight gradients, the device's shards of them under a model
        axis), once per step."""
        mine = [(vs, k) for vs in range(n) if schedule.placement(vs)[0] == s for k in range(len(pieces[vs]))]
        leaves = [x for vs, k in mine for x in _leaves(grad_sum[vs][k])]
        specs = [x for vs, k in mine for x in _spec_leaves(wspecs[vs][k], grad_sum[vs][k])]

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
        summed = sl.shard_map(body, mesh=subs[s], in_specs=tuple(specs), out_specs=out_specs,
                              check_vma=tp is None)(*leaves)
        it = iter(np.asarray(x)[0] for x in summed)
        return [(pieces[vs][k], _fill(grad_sum[vs][k], it)) for vs, k in mine]

    ptr = [0] * p
    spans: dict = {}
    reduce_spans: dict = {}
    with sl.Ledger() as ledger:
        progress = True
        while progress:
            progress = False
            for s in range(p):
                acts = schedule.actions[s]
                while ptr[s] < len(acts):
                    a = acts[ptr[s]]
                    if a.kind == RECV and (a.payload, schedule.virtual_stage(s, a.chunk), a.microbatch) not in inbox:
                        break
                    first = len(ledger)
                    with sl.named_scope(f"pipeline/{a}"):
                        run(a)
                    spans[a] = (first, len(ledger))
                    order.append(a)
                    ptr[s] += 1
                    progress = True
        stuck = [s for s in range(p) if ptr[s] < len(schedule.actions[s])]
        if stuck:
            parts = "; ".join(f"stage {s} waits at '{schedule.actions[s][ptr[s]]}'" for s in stuck)
            raise ScheduleError(f"{schedule.name}: deadlock, no device can proceed: {parts}",
                                schedule.actions[stuck[0]][ptr[stuck[0]]], op=_OP)
        grads = None
        if all(g is not None for row in grad_sum for g in row):
            pairs = []
            if fs is not None:   # ZeRO-3: each piece's backward reduce-scattered its gradients already
                pairs = [(pieces[vs][k], grad_sum[vs][k]) for vs in range(n) for k in range(len(pieces[vs]))]
            for s in range(p if fs is None else 0):
                first = len(ledger)
                with sl.named_scope(f"pipeline/gradient all-reduce s{s}"):
                    pairs += all_reduce(s)
                reduce_spans[s] = (first, len(ledger))
            grads = _stages.assemble_grads(params, pairs)
    return Execution(schedule, mesh, axis, float(np.mean(losses)) if None not in losses else None, grads, ledger,
                     order, spans, peak, reduce_spans)
