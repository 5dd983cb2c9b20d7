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
* `stage_step(cfg)` and `stage_args(cfg, k, batch, seq)`: a pipeline stage of the model's
  blocks (``plan_pipeline``'s stage program).

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
from shardlab.train.strategy import param_shape

from .plan import ShardingPlan, autoshard

__all__ = ["DEFAULT_OPTIMIZER", "train_step", "example_args", "plan_model", "strategies", "stage_step", "stage_args"]

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
    (and optimizer state), the batch and every activation. Check it with
    ``plan.check(*example_args(cfg, batch, seq, optimizer=...))``; run it with ``plan.run``.
    Other keyword arguments (``in_specs``, ``time_limit_s``, ...) go to `autoshard`."""
    args = example_args(cfg, batch, seq, optimizer=optimizer, abstract=True)
    return autoshard(train_step(cfg, optimizer), *args, mesh=mesh, memory_limit_bytes=memory_limit_bytes,
                     in_specs=in_specs, **kwargs)


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


def stage_step(cfg: ModelConfig, *, causal: bool = True):
    """A pipeline stage of `cfg`'s blocks as a global-view training step: ``f(layers, x)`` runs
    ``transformer.block`` over the stage's layer params on the residual stream ``x [B, T, D]``
    and returns the mean square of its output and the layers' gradients (the stage's forward and
    backward; the stream's own gradient is what a stage sends back). Use it with
    ``plan_pipeline``: ``stage_program(k) = (stage_step(cfg), stage_args(k))``."""
    _check_cfg(cfg, "stage_step")

    def stage(layers, x):
        def f(layers, x):
            for i, layer in enumerate(layers):
                x = transformer.block(layer, x, cfg, i, causal=causal)
            return jnp.mean(x * x)

        return sl.value_and_grad(f, argnums=(0, 1))(layers, x)

    return stage



def stage_args(cfg: ModelConfig, num_layers: int, batch: int, seq: int):
    """ShapeDtypeStructs of `stage_step`'s arguments for a stage of `num_layers` blocks and a
    micro-batch of ``batch`` sequences of ``seq`` tokens."""
    one = tree_util.tree_map(lambda a: sl.ShapeDtypeStruct(param_shape(cfg, a), np.float32),
                             param_axes(cfg)["layers"][0], is_leaf=_is_axes)
    return [one for _ in range(num_layers)], sl.ShapeDtypeStruct((batch, seq, cfg.d_model), np.float32)

