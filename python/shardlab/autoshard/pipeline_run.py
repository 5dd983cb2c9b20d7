"""Runs a `PipelinePlan` of the model library's stages in the layouts the stage DP chose.

Each stage of the plan runs on its own sub-mesh of the devices (the rectangle the stage DP placed
it on, with the axes ``("hosts", "devices")`` its intra-op plan was made for) and runs its
intra-op `ShardingPlan` op by op (``ShardingPlan.run_ops``), as ``ShardingPlan.run`` does: the
stage's weights and inputs in the plan's PartitionSpecs, every operand moved to the layout its
op's chosen candidate needs. A stage program of ``autoshard.model.stage_program`` takes the
cotangent of its output (or, on the last stage, the targets) as its last argument, so its ops
split in two: those the output needs (run by the schedule's *forward* action of a micro-batch) and
those that need the cotangent or belong to the backward pass (run by its *backward* action, once
the next stage's input gradient arrived; the forward's values are kept until then). The 1F1B
schedule's actions run in the order of each device's list. A *send* is one ``ppermute`` over the
whole mesh that moves each sender device's shard of the activation (or input gradient) to the
device at the same place of the receiving stage's sub-mesh (the stages' sub-meshes are equal),
then, if the receiving stage's plan takes the value in another layout, the ``reshard`` to it.

So per stage and micro-batch the ledger holds exactly the stage plan's predicted collectives, and
per send its ppermute and the receiver's resharding (`PipelineRun.check_ledger`); the loss and the
gradients (the micro-batches' sums over `m`) equal the unpipelined step's (``PipelinePlan.check``).

>>> from shardlab.models import ModelConfig
>>> from shardlab.autoshard import model, plan_pipeline
>>> cfg = ModelConfig(num_layers=2, d_model=16, ffw_dim=32, num_heads=4, num_kv_heads=2, vocab_size=32)
>>> pl = plan_pipeline(model.stage_program(cfg, 2, 4), 2, (2, 2), hardware="tpu-v5p", num_microbatches=2,
...                    num_stages=2, submesh_shapes=[(1, 2)], memory_limit_bytes=30_000)
>>> run = run_pipeline(pl, cfg, *model.example_args(cfg, 4, 4))
>>> run.check_ledger()   # per stage and micro-batch: the stage plan's collectives
>>> len(run.collectives(1, 0)) > 0, run.meshes[1].devices.shape   # its layout has collectives
(True, (1, 2))
"""

from __future__ import annotations

import dataclasses

import numpy as np

import shardlab as sl
from shardlab import tree_util
from shardlab.train import pipeline as pp
from shardlab.train.pipeline.stages import merge_grads, split_params

from .specs import pspec

__all__ = ["PipelineRun", "run_pipeline"]


@dataclasses.dataclass
class PipelineRun:
    """A run of a `PipelinePlan`: the step's ``loss`` and ``grads`` (params-shaped), the ledger
    events of every action (``events[(stage, microbatch, kind)]``, kind ``"forward"`` or
    ``"backward"``), each stage's `ShardingPlan` (``plans``) and sub-mesh (``meshes``)."""

    loss: float
    grads: dict
    events: dict
    plans: list
    meshes: list
    sends: dict = dataclasses.field(default_factory=dict)  # (stage, payload) -> predicted collectives

    def collectives(self, stage: int, microbatch: int) -> list:
        """``(op, axes, bytes sent)`` of the collectives one micro-batch ran on one stage."""
        return [(e["op"], tuple(e["axes"]), float(e["bytes_sent"]))
                for kind in ("forward", "backward") for e in self.events[(stage, microbatch, kind)] if e["axes"]]

    def check_ledger(self) -> None:
        """Every stage ran, per micro-batch, exactly its plan's predicted collectives (in order),
        and every send its predicted ppermute (and the receiver's resharding); raises
        AssertionError naming the stage and micro-batch otherwise."""
        for (s, k, kind), evs in self.events.items():
            if kind == "forward":
                want, seen = [c.key() for c in self.plans[s].collectives], self.collectives(s, k)
            elif kind.startswith("send "):
                want = self.sends[(s, kind[5:])]
                seen = [(e["op"], tuple(e["axes"]), float(e["bytes_sent"])) for e in evs if e["axes"]]
            else:
                continue
            if seen != want:
                raise AssertionError(f"stage {s}, micro-batch {k}{'' if kind == 'forward' else ', ' + kind}: "
                                     f"ledger {seen} != plan {want}")

    @property
    def bytes_sent(self) -> float:
        """Bytes sent per device by the stages' collectives over the step (the sends excluded)."""
        return float(sum(e["bytes_sent"] for (_, _, kind), evs in self.events.items() if not kind.startswith("send")
                         for e in evs if e["axes"]))


def _split(plan, late_input):
    """The plan's ops in two lists: those needed before the cotangent (argument `late_input`)
    arrives, and the rest (they read it, or belong to the backward pass)."""
    prog = plan.program
    late_values = set() if late_input is None else {prog.inputs[late_input]}
    early, late = [], []
    for op in plan.ops:
        if op.phase == "backward" or any(k == "value" and i in late_values for k, i in op.inputs):
            late_values.add(op.output)
            late.append(op)
        else:
            early.append(op)
    return early, late


def _sharding(plan, mesh, position: int):
    """The NamedSharding of the plan's argument leaf `position` on `mesh`."""
    name = plan.program.values[plan.program.inputs[position]].name
    return sl.NamedSharding(mesh, plan.specs.get(name, sl.P()))


def _send(value, full, src_mesh, dst_mesh, src_dims, dst_dims):
    """Moves `value` (on `src_mesh` in `src_dims`) to `dst_mesh` as a pipeline send does: one
    ``ppermute`` over the whole mesh, each sender device's shard to the device at the same place
    of the receiving sub-mesh; then, if the receiver takes the value in another layout, the
    ``reshard`` to it (on the receiver's devices)."""
    axes = tuple(full.axis_names)
    pos = {d.id: i for i, d in enumerate(np.ravel(full.devices))}
    src = [d.id for d in np.ravel(src_mesh.devices)]
    dst = [d.id for d in np.ravel(dst_mesh.devices)]
    shards = {sh.device.id: sh for sh in value.addressable_shards}
    first = np.asarray(shards[src[0]].data)
    buf = np.zeros((len(pos),) + first.shape, first.dtype)
    for i in src:
        buf[pos[i]] = np.asarray(shards[i].data)
    perm = [(pos[a], pos[b]) for a, b in zip(src, dst)]
    moved = np.asarray(sl.shard_map(lambda x: sl.lax.ppermute(x, axes, perm), mesh=full, in_specs=sl.P(axes),
                                    out_specs=sl.P(axes))(buf))
    out = np.empty(tuple(value.shape), first.dtype)
    for a, b in zip(src, dst):
        out[shards[a].index] = moved[pos[b]]
    x = sl.device_put(out, sl.NamedSharding(dst_mesh, pspec(src_dims)))
    return x if src_dims == dst_dims else sl.reshard(x, sl.NamedSharding(dst_mesh, pspec(dst_dims)))


def _send_prediction(src_plan, out_index: int, dst_plan, in_index: int) -> list:
    """The collectives `_send` records: the ppermute of one shard per device, then the receiver's
    resharding as its plan's pricer predicts it."""
    v = src_plan.program.values[out_index]
    src_dims, dst_dims = src_plan.dims(out_index), dst_plan.dims(in_index)
    shard = src_plan.program.mesh.shape
    split = 1
    for entry in src_dims:
        for axis in entry:
            split *= int(shard[axis])
    nbytes = float(np.prod(v.shape)) * np.dtype(v.dtype).itemsize / split
    _, colls = dst_plan.program.pricer.reshard_run(v.shape, v.dtype, src_dims, dst_dims)
    resharding = [(c, tuple(a), float(b)) for c, a, b in colls]
    return [("ppermute", tuple(dst_plan.program.mesh.axis_names), nbytes)] + resharding


def _outputs(plan, env: dict):
    prog = plan.program
    return tree_util.tree_unflatten(prog.out_tree, [env[i] if k == "value" else i for k, i in prog.outputs])


def _add(a, b):
    return tree_util.tree_map(lambda x, y: np.asarray(x, np.float64) + np.asarray(y, np.float64), a, b)


def run_pipeline(plan, cfg, params: dict, tokens, targets) -> PipelineRun:
    """Runs `plan` (a `PipelinePlan` of ``autoshard.model.stage_program``) on the model `cfg`
    with `params` and a batch of `tokens` / `targets` ``[batch, seq]`` split into the schedule's
    micro-batches (see the module docstring). Returns the `PipelineRun`.

    Raises ValueError when the plan's stages are not the model's (`stage_program`'s arguments),
    have no placement on the mesh, or the batch does not split into the plan's micro-batches."""
    sched = plan.schedule
    stages = plan.stages.stages
    if sched.v != 1 or sched.p != len(stages):
        raise ValueError(f"[autoshard.run_pipeline] the schedule {sched.name} has {sched.p} x {sched.v} virtual "
                         f"stages; "
                         f"the plan has {len(stages)} stages (one per device list expected)")
    tokens, targets = np.asarray(tokens), np.asarray(targets)
    m = sched.m
    if tokens.ndim != 2 or tokens.shape != targets.shape or tokens.shape[0] % m:
        raise ValueError(f"[autoshard.run_pipeline] tokens {tokens.shape} and targets {targets.shape} must be one "
                         f"[batch, seq] shape with the batch a multiple of the {m} micro-batches")
    mb = tokens.shape[0] // m
    cuts = tuple(range(s.layer_start, s.layer_end) for s in stages)
    if cuts[0].start != 0 or cuts[-1].stop != cfg.num_layers:
        raise ValueError(f"[autoshard.run_pipeline] the plan's stages cover layers {cuts[0].start}..{cuts[-1].stop - 1}"
                         f"; the model has {cfg.num_layers}")
    sps = split_params(params, cfg, cuts)
    full = sl.make_mesh(tuple(plan.stages.mesh_shape), ("hosts", "devices"), hardware=plan.hardware)
    plans, meshes, splits, n_leaves = [], [], [], []
    for s, st in enumerate(stages):
        if st.hosts is None:
            raise ValueError(f"[autoshard.run_pipeline] stage {s} has no placement on the mesh (custom sub-mesh "
                             "shapes)")
        sp = plan.plan_of(st)
        n = len(tree_util.tree_leaves(sps[s]))
        prog = sp.program
        x_shape = prog.values[prog.inputs[n]].shape if len(prog.inputs) == n + 2 else None
        if x_shape is None or x_shape[:2] != (mb, tokens.shape[1]):
            raise ValueError(
                f"[autoshard.run_pipeline] stage {s}'s plan takes {len(prog.inputs)} argument leaves "
                f"(input {x_shape}); autoshard.model.stage_program's stage takes its {n} weights, an input "
                f"[{mb}, {tokens.shape[1]}, ...] and the cotangent or targets: plan the pipeline with "
                f"model.stage_program(cfg, {mb}, {tokens.shape[1]})")
        plans.append(sp)
        n_leaves.append(n)
        meshes.append(sl.Mesh(full.devices[st.hosts.start:st.hosts.stop, st.devices.start:st.devices.stop],
                              ("hosts", "devices"), hardware=full.hardware))
        splits.append(_split(sp, None if s == len(stages) - 1 else n + 1))
    shapes = [m_.devices.shape for m_ in meshes]
    if len(set(shapes)) > 1:
        raise ValueError(f"[autoshard.run_pipeline] a send moves each device's shard to the same place of the next "
                         f"stage's sub-mesh, so the stages need equal sub-meshes; this plan's are {shapes}")
    weights = [{sp.program.inputs[j]: sl.device_put(np.asarray(x), _sharding(sp, meshes[s], j))
                for j, x in enumerate(tree_util.tree_leaves(sps[s]))} for s, sp in enumerate(plans)]
    last = len(stages) - 1
    envs, inbox, events, sends, grads = {}, {}, {}, {}, [None] * len(stages)
    loss = 0.0

    def place(s, k, position, x):
        envs[(s, k)][plans[s].program.inputs[position]] = sl.device_put(x, _sharding(plans[s], meshes[s], position))

    def ready(a) -> bool:
        s, k = a.stage, a.microbatch
        if a.kind == pp.FORWARD:
            return s == 0 or ("activation", s, k) in inbox
        if a.kind == pp.BACKWARD:
            return s == last or ("gradient", s, k) in inbox
        if a.kind == pp.RECV:
            return (a.payload, s, k) in inbox
        return True

    def act(a) -> None:
        nonlocal loss
        s, k = a.stage, a.microbatch
        sp, n = plans[s], n_leaves[s]
        if a.kind == pp.FORWARD:
            envs[(s, k)] = dict(weights[s])
            place(s, k, n, tokens[k * mb:(k + 1) * mb] if s == 0 else inbox.pop(("activation", s, k)))
            if s == last:
                place(s, k, n + 1, targets[k * mb:(k + 1) * mb])
            with sl.Ledger() as led:
                sp.run_ops(envs[(s, k)], splits[s][0], meshes[s])
            events[(s, k, "forward")] = list(led.events)
        elif a.kind == pp.BACKWARD:
            if s != last:
                place(s, k, n + 1, inbox.pop(("gradient", s, k)))
            with sl.Ledger() as led:
                sp.run_ops(envs[(s, k)], splits[s][1], meshes[s])
            events[(s, k, "backward")] = list(led.events)
            value, g = _outputs(sp, envs.pop((s, k)))
            if s > 0:
                g, envs[("gx", s, k)] = g
            if s == last:
                loss += float(np.asarray(value))
            grads[s] = g if grads[s] is None else _add(grads[s], g)
        elif a.kind == pp.SEND:
            to = s + 1 if a.payload == pp.ACTIVATION else s - 1
            out_index = sp.program.outputs[0 if a.payload == pp.ACTIVATION else -1][1]
            in_index = plans[to].program.inputs[n_leaves[to] + (0 if a.payload == pp.ACTIVATION else 1)]
            value = envs[(s, k)][out_index] if a.payload == pp.ACTIVATION else envs.pop(("gx", s, k))
            with sl.Ledger() as led:
                inbox[(a.payload, to, k)] = _send(value, full, meshes[s], meshes[to], sp.dims(out_index),
                                                  plans[to].dims(in_index))
            events[(s, k, "send " + a.payload)] = list(led.events)
            sends[(s, a.payload)] = _send_prediction(sp, out_index, plans[to], in_index)
        elif a.kind != pp.RECV:
            raise ValueError(f"[autoshard.run_pipeline] {a.kind} actions are not run here (1F1B and GPipe schedules)")

    todo = [list(sched.actions[d]) for d in range(sched.p)]
    while any(todo):
        progressed = False
        for d in range(sched.p):
            while todo[d] and ready(todo[d][0]):
                act(todo[d].pop(0))
                progressed = True
        if not progressed:
            raise RuntimeError(f"[autoshard.run_pipeline] the schedule deadlocks at {[t[0] for t in todo if t]}")
    per_stage = [tree_util.tree_map(lambda x: (np.asarray(x, np.float64) / m).astype(np.float32), g) for g in grads]
    return PipelineRun(loss / m, merge_grads(params, per_stage, cuts), events, plans, meshes, sends)
