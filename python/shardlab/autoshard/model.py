"""autoshard on the model library's own training step: ``plan_model(cfg, mesh=..., batch=, seq=)``.

The step is the one ``shardlab.train`` trains and checks against: ``models.transformer.loss``
(the embedding, every block with rotary grouped-query attention and the (gated) MLP, the final
norm, the head, the cross-entropy), its gradient by ``shardlab.value_and_grad``, and the update
of a ``shardlab.train`` optimizer (``SGD``, or ``AdamW`` with its moments as inputs and
outputs). Given global arrays the model library takes its global-view path (einsum attention,
a one-hot embedding; ``shardlab.models.layers``), which is what `autoshard` traces; so the plan
it finds runs the model library's own step on the virtual devices, and its new parameters
equal ``train.reference_step``'s.

* `train_step(cfg, optimizer)`: the step as a global-view function
  ``(params, [states,] tokens, targets) -> (loss, new params[, new states])``;
* `example_args(cfg, batch, seq)`: its arguments (random, or ShapeDtypeStructs);
* `plan_model(cfg, mesh=, batch=, seq=, memory_limit_bytes=)`: the one line: traces, solves
  and returns the `ShardingPlan`;
* `strategies(cfg, mesh)`: ``shardlab.train``'s DP, FSDP, Megatron TP and FSDP + TP layouts of
  the same arguments (``compare``'s ``strategies``);
* `stage_program(cfg, microbatch, seq)`: the model cut into pipeline stages as
  ``train.pipeline`` cuts it (`stage_step`, `stage_args`), for ``plan_pipeline``;
* `compare_model(cfg, mesh=, batch=, seq=)`: the free plan against DP, FSDP, TP, FSDP + TP and
  two pipelines (the stage DP's and a hand-written 1F1B) on the same devices, each executed.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab.models import ModelConfig
    >>> from shardlab.autoshard import model
    >>> cfg = ModelConfig(num_layers=1, d_model=16, ffw_dim=32, num_heads=2, vocab_size=32)
    >>> mesh = sl.make_mesh((2,), ("x",), hardware="tpu-v5p")
    >>> plan = model.plan_model(cfg, mesh=mesh, batch=4, seq=8, memory_limit_bytes=50_000)
    >>> plan.solution.memory_bytes <= 50_000, plan.specs["[1]"] != sl.P()   # the token ids are split
    (True, True)
    >>> res = plan.check(*model.example_args(cfg, 4, 8))   # outputs and ledger checked
    >>> bool(res["max_rel_err"] < 1e-5)
    True
"""

from __future__ import annotations

import numpy as np

import shardlab as sl
import shardlab.numpy as jnp
from shardlab import tree_util
from shardlab.models import ModelConfig, param_axes, transformer
from shardlab.train import SGD, Trainer, get_optimizer
from shardlab.train import strategies as _strategies
from shardlab.train.pipeline.stages import split_params
from shardlab.train.strategy import param_shape

from .explain import Comparison, compare
from .pipeline import plan_pipeline
from .plan import ShardingPlan, autoshard

__all__ = ["DEFAULT_OPTIMIZER", "train_step", "example_args", "plan_model", "strategies", "stage_step", "stage_args",
           "stage_program", "data_parallel_stages", "compare_model", "step_carry"]

DEFAULT_OPTIMIZER = SGD(lr=0.1)


def _is_axes(x) -> bool:
    """A leaf of ``models.param_axes``: a tuple of logical axis names."""
    return isinstance(x, tuple) and all(isinstance(a, str) for a in x)


def _check_cfg(cfg, op: str) -> None:
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"[autoshard.{op}] expected a shardlab.models.ModelConfig, got {type(cfg).__name__}")
    if cfg.is_moe:
        raise ValueError(f"[autoshard.{op}] {cfg.name or 'this model'} has MoE layers, whose routing (top-k, "
                         f"gathers) autoshard cannot shard yet; plan a dense ModelConfig")


def train_step(cfg: ModelConfig, optimizer=None, *, step: int = 1):
    """The model library's training step of `cfg` as a global-view function.

    Args:
        cfg: a dense ``ModelConfig``.
        optimizer: a ``shardlab.train`` ``SGD`` / ``AdamW`` (or "sgd" / "adamw"); default
            ``SGD(lr=0.1)``.
        step: the optimizer step number (Adam's bias corrections).

    Returns:
        ``f(params, tokens, targets) -> (loss, new_params)``, or with a stateful optimizer
        ``f(params, states, tokens, targets) -> (loss, new_params, new_states)`` where
        ``states`` is ``{state name: params-shaped tree}`` (Adam's ``m`` and ``v``).
    """
    _check_cfg(cfg, "train_step")
    opt = get_optimizer(optimizer if optimizer is not None else DEFAULT_OPTIMIZER)
    names = opt.state_names

    def update(params, states, tokens, targets):
        loss, grads = sl.value_and_grad(lambda p: transformer.loss(p, tokens, targets, cfg))(params)
        leaves, tree = tree_util.tree_flatten(params)
        g_leaves = tree_util.tree_leaves(grads)
        s_leaves = {n: tree_util.tree_leaves(states[n]) for n in names}
        new_p, new_s = [], {n: [] for n in names}
        for k, (p, g) in enumerate(zip(leaves, g_leaves)):
            p2, st = opt.update(p, g, {n: s_leaves[n][k] for n in names}, step)
            new_p.append(p2)
            for n in names:
                new_s[n].append(st[n])
        new_params = tree_util.tree_unflatten(tree, new_p)
        return loss, new_params, {n: tree_util.tree_unflatten(tree, new_s[n]) for n in names}

    if names:
        def model_train_step(params, states, tokens, targets):
            return update(params, states, tokens, targets)
    else:
        def model_train_step(params, tokens, targets):
            loss, new_params, _ = update(params, {}, tokens, targets)
            return loss, new_params
    return model_train_step


def example_args(cfg: ModelConfig, batch: int, seq: int, *, optimizer=None, seed: int = 0, abstract: bool = False):
    """`train_step`'s arguments: ``transformer.init_params(cfg, seed)``, zero optimizer states
    (for a stateful optimizer) and random token ids and targets ``[batch, seq]``; with
    `abstract`, ShapeDtypeStructs of the same shapes (planning at any size, no data)."""
    _check_cfg(cfg, "example_args")
    opt = get_optimizer(optimizer if optimizer is not None else DEFAULT_OPTIMIZER)
    for name, v in (("batch", batch), ("seq", seq)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"[autoshard.example_args] {name}={v!r} must be a positive int")
    if abstract:
        def struct(shape, dtype=np.float32):
            return sl.ShapeDtypeStruct(tuple(shape), dtype)

        params = tree_util.tree_map(lambda a: struct(param_shape(cfg, a)), param_axes(cfg), is_leaf=_is_axes)
        tok = struct((batch, seq), np.int32)
        args = [params] + ([{n: params for n in opt.state_names}] if opt.state_names else []) + [tok, tok]
        return tuple(args)
    params = transformer.init_params(cfg, seed=seed)
    rng = np.random.default_rng(seed + 1)
    tok = rng.integers(0, cfg.vocab_size, (batch, seq)).astype(np.int32)
    tgt = rng.integers(0, cfg.vocab_size, (batch, seq)).astype(np.int32)
    states = [{n: tree_util.tree_map(lambda a: np.zeros_like(a, np.float32), params) for n in opt.state_names}]
    return tuple([params] + (states if opt.state_names else []) + [tok, tgt])


def plan_model(cfg: ModelConfig, *, mesh, batch: int, seq: int, memory_limit_bytes: float | None = None,
               optimizer=None, in_specs=None, **kwargs) -> ShardingPlan:
    """`autoshard` of `cfg`'s training step (`train_step`) with a batch of ``batch`` sequences of
    ``seq`` tokens on `mesh` under `memory_limit_bytes` per device: the plan for every parameter
    (and optimizer state), the batch and every activation. The new parameters and states come
    back in their arguments' layouts, that resharding priced (`step_carry`; pass ``carry=None``
    to leave them where the search likes). Check it with
    ``plan.check(*example_args(cfg, batch, seq, optimizer=...))``; run it with ``plan.run``.
    Other keyword arguments (``in_specs``, ``time_limit_s``, ...) go to `autoshard`."""
    args = example_args(cfg, batch, seq, optimizer=optimizer, abstract=True)
    kwargs.setdefault("carry", step_carry(optimizer))
    return autoshard(train_step(cfg, optimizer), *args, mesh=mesh, memory_limit_bytes=memory_limit_bytes,
                     in_specs=in_specs, **kwargs)


def step_carry(optimizer=None) -> tuple:
    """`autoshard`'s ``carry`` for `train_step`: the new parameters (result 1) go back to the
    parameters' layout (argument 0), and the new optimizer states (result 2) to the states'
    (argument 1), as the next step starts from them."""
    opt = get_optimizer(optimizer if optimizer is not None else DEFAULT_OPTIMIZER)
    return ((1, 0), (2, 1)) if opt.state_names else ((1, 0),)


def strategies(cfg: ModelConfig, mesh, *, data: str = "x", model: str = "y", optimizer=None) -> dict:
    """``shardlab.train``'s hand-written strategies for `train_step`'s arguments on a mesh with
    a `data` and a `model` axis, as ``{name: in_specs}``: ``dp`` and ``fsdp`` over both axes,
    ``tp`` (Megatron over `model`, data parallel over `data`) and ``fsdp_tp`` (the book's
    part-5 plan). Each parameter's spec is the one ``train.Trainer`` stores it with; optimizer
    states take their ``Trainer.state_spec``."""
    _check_cfg(cfg, "strategies")
    opt = get_optimizer(optimizer if optimizer is not None else DEFAULT_OPTIMIZER)
    both = (data, model)
    table = {"dp": _strategies.dp(both), "fsdp": _strategies.fsdp(both), "tp": _strategies.tp(model, data=data),
             "fsdp_tp": _strategies.fsdp_tp(data, model)}
    axes = param_axes(cfg)
    out = {}
    for name, s in table.items():
        t = Trainer(cfg, s, mesh, optimizer=opt)
        params = tree_util.tree_map(t.param_spec, axes, is_leaf=_is_axes)
        states = [{n: tree_util.tree_map(t.state_spec, axes, is_leaf=_is_axes) for n in opt.state_names}]
        batch = s.batch_spec()
        out[name] = tuple([params] + (states if opt.state_names else []) + [batch, batch])
    return out


def stage_step(cfg: ModelConfig, start: int, end: int, *, causal: bool = True):
    """The pipeline stage of `cfg`'s layers ``start..end-1`` as a global-view program on one
    micro-batch, forward and backward, as ``train.pipeline`` cuts the model
    (``pipeline.stages.split_params``): the first stage embeds the token ids, the last ends with
    the final norm, the head and the cross-entropy. A stage that is not last takes the
    cotangent of its output (the input gradient the next stage sends back) as its last argument
    and returns ``(output, grads)``: its weights' gradients, and its input's when that is not
    the token ids (``vjp`` of the stage with that cotangent). The last stage takes the targets
    and returns ``(loss, grads)``. So the program is what a pipeline runs per micro-batch, and
    its plan runs in a pipeline (``PipelinePlan.check``)."""
    _check_cfg(cfg, "stage_step")
    first, last = start == 0, end == cfg.num_layers
    argnums = 0 if first else (0, 1)

    def forward(p, inp):
        x = transformer.embed(p, inp, cfg) if first else inp
        for i, layer in enumerate(p["layers"]):
            x = transformer.block(layer, x, cfg, start + i, causal=causal)
        return x

    if last:
        def stage(p, inp, targets):
            def body(p, inp):
                return transformer.cross_entropy(transformer.output_logits(p, forward(p, inp), cfg), targets)

            return sl.value_and_grad(body, argnums=argnums)(p, inp)
    else:
        def stage(p, inp, cotangent):
            def body(p, inp):
                y = forward(p, inp)
                return jnp.sum(y * cotangent), y

            (_, y), grads = sl.value_and_grad(body, argnums=argnums, has_aux=True)(p, inp)
            return y, grads

    return stage


def stage_args(cfg: ModelConfig, start: int, end: int, batch: int, seq: int) -> tuple:
    """ShapeDtypeStructs of `stage_step`'s arguments for layers ``start..end-1`` and a
    micro-batch of ``batch`` sequences of ``seq`` tokens: the stage's weights, its input (token
    ids or the residual stream) and the targets (last stage) or the output's cotangent."""
    if not 0 <= start < end <= cfg.num_layers:
        raise ValueError(f"[autoshard.stage_args] layers {start}..{end - 1} are not a stage of {cfg.num_layers} layers")
    cuts = tuple(r for r in (range(0, start), range(start, end), range(end, cfg.num_layers)) if len(r))
    axes = split_params(param_axes(cfg), cfg, cuts)[cuts.index(range(start, end))]
    p = tree_util.tree_map(lambda a: sl.ShapeDtypeStruct(param_shape(cfg, a), np.float32), axes, is_leaf=_is_axes)
    ids = sl.ShapeDtypeStruct((batch, seq), np.int32)
    stream = sl.ShapeDtypeStruct((batch, seq, cfg.d_model), np.float32)
    x = ids if start == 0 else stream
    return (p, x, ids) if end == cfg.num_layers else (p, x, stream)


def stage_program(cfg: ModelConfig, microbatch: int, seq: int, *, causal: bool = True):
    """``plan_pipeline``'s stage program for `cfg`: ``(start, end) -> (stage_step, stage_args)``."""
    def program(start: int, end: int):
        return stage_step(cfg, start, end, causal=causal), stage_args(cfg, start, end, microbatch, seq)

    return program


def data_parallel_stages(cfg: ModelConfig, microbatch: int, seq: int):
    """``plan_pipeline``'s ``stage_specs`` for the hand-written pipeline ``train.pipeline``
    runs: inside every stage the weights whole and the micro-batch split over the sub-mesh."""
    def specs(start: int, end: int, sub):
        args = stage_args(cfg, start, end, microbatch, seq)
        axes = tuple(a for a, n in zip(("hosts", "devices"), sub) if n > 1)
        both = sl.P(axes if len(axes) > 1 else axes[0] if axes else None)
        return (tree_util.tree_map(lambda _: sl.P(), args[0]),) + tuple(both for _ in args[1:])

    return specs


def compare_model(cfg: ModelConfig, *, mesh, batch: int, seq: int, memory_limit_bytes: float | None = None,
                  num_microbatches: int = 2, pipelines: bool = True, run: bool = True, rtol: float = 1e-4,
                  **kwargs) -> Comparison:
    """`cfg`'s training step (SGD) planned freely and under ``shardlab.train``'s DP, FSDP, TP and
    FSDP + TP (`strategies`), and, with `pipelines`, pipelined on the same devices: the stage
    DP's plan (``plan_pipeline``: one stage per row of the 2-D `mesh`, each on that row's
    devices, layer cuts and intra-op plans searched) and a hand-written 1F1B (the layers split
    evenly, each stage data parallel: `data_parallel_stages`), both with `num_microbatches`
    micro-batches. On a concrete mesh with `run` every row is executed and checked: the
    intra-op plans against the unsharded program and their predicted ledger, the pipelines by
    ``train.pipeline.execute`` against the unpipelined step's loss and gradients. Returns the
    `Comparison` (table and picture)."""
    args = example_args(cfg, batch, seq, abstract=getattr(mesh, "abstract", False) or not run)
    names = tuple(mesh.axis_names)
    if len(names) != 2:
        raise ValueError(f"[autoshard.compare_model] the strategies need a 2-D mesh (data, model); got axes {names}")
    hand = strategies(cfg, mesh, data=names[0], model=names[1])
    pls = {}
    if pipelines:
        if batch % num_microbatches:
            raise ValueError(f"[autoshard.compare_model] batch {batch} does not split into {num_microbatches} "
                             f"micro-batches")
        rows, per_row = (int(n) for n in mesh.shape.values())
        mb = batch // num_microbatches
        program = stage_program(cfg, mb, seq)
        common = dict(hardware=mesh.hardware.name, num_microbatches=num_microbatches, num_stages=rows,
                      submesh_shapes=[(1, per_row)], memory_limit_bytes=memory_limit_bytes)
        pls[f"stage DP ({rows} stages)"] = plan_pipeline(program, cfg.num_layers, (rows, per_row), **common)
        pls[f"1F1B, DP stages ({rows})"] = plan_pipeline(program, cfg.num_layers, (rows, per_row), **common,
                                                         stage_specs=data_parallel_stages(cfg, mb, seq))
    pargs = None
    if run and not getattr(mesh, "abstract", False):
        params, tok, tgt = args
        pargs = (cfg, params, tok, tgt)
    kwargs.setdefault("carry", step_carry())
    return compare(train_step(cfg), *args, mesh=mesh, strategies=hand, memory_limit_bytes=memory_limit_bytes,
                   run=run, rtol=rtol, pipelines=pls, pipeline_args=pargs, **kwargs)
