"""``training_memory``: bytes per device of params, grads, optimizer states, activations and
temporary buffers under a parallelism strategy.

Strategies (the book's part 5 and the ZeRO paper; the spellings of ``train.strategies``):
``"dp"`` (everything replicated, batch split), ``"zero1"`` (optimizer states sharded over the
data axes), ``"zero2"`` (+ gradients), ``"zero3"`` / ``"fsdp"`` (+ parameters), ``"tp"``
(Megatron: weights and the head/MLP-width activations split over the model axis, the residual
stream replicated), ``"tp_sp"`` (+ sequence parallelism: the residual stream and the norms'
outputs split over the model axis too), ``"fsdp_tp"`` (FSDP + TP with sequence parallelism, as
``train.strategies.fsdp_tp``; ``"fsdp+tp"`` is accepted), or a ``train.Strategy``.

Bytes per parameter (``precision``): ``"mixed"`` -- bf16 params and grads, fp32 master copy
(ZeRO's 2 + 2 + 12 for Adam); ``"bf16_params"`` -- bf16 params and grads, fp32 Adam moments and
no master copy (the book's 2 + 8 = 10 bytes per parameter, + 2 for the gradient); ``"fp32"`` --
4 + 4 + 4 per optimizer state; ``"bf16"`` -- 2 + 2 + 2 per state. Optimizer states:
``"adam"``/``"adamw"`` 2, ``"momentum"`` 1, ``"sgd"`` 0.

Activations saved per token (elements, ``remat``: a policy of :mod:`shardlab.models.remat`):
``None`` -- the residual input and norm output of both blocks (4D), q, k, v and the attention
output (2NH + 2KH), the softmax statistics (N), and the MLP hidden values (4F gated: gate, up,
act(gate), product; 2F plain); MoE layers keep E router logits and probabilities and the same
per routed slot (``k * capacity_factor`` slots per token) plus the shared experts. A
checkpointed policy keeps each layer's input (D) and the values it names, with the sizes of the
table in :mod:`shardlab.models.remat` (``"full"``: the input only; ``"dots"``: D + (N+2K)H + D +
2F + D gated; ``"ffw_outputs"``: D + 2F + D, the book's 2·L·B·(D+2F) bytes plus the layer
inputs). Under sequence parallelism the layer input and the norms' outputs are split over the
model axis. Flash attention never stores the T x T scores.

Temporaries: fp32 logits and their gradient (2 x 4 x tokens x V / tp), one layer's gathered
parameters for zero3/fsdp, and one layer's activations while it is recomputed (any
checkpointed policy).

Example:
    >>> from shardlab.models import training_memory, presets
    >>> m = training_memory(presets.get("llama2-13b"), "fsdp", {"data": 256}, batch=256,
    ...                     context=4096, remat="full")
    >>> round(m.optimizer / 2**30, 2)  # 12 bytes x 13.0B params / 256 chips, in GiB
    0.57
"""

from __future__ import annotations

import math

from .config import ModelConfig
from .params import norm_params, param_count
from .remat import remat_policy
from .report import Report

__all__ = ["training_memory", "STRATEGIES", "PRECISIONS", "mesh_axis_sizes", "strategy_name"]

STRATEGIES = ("dp", "fsdp", "zero1", "zero2", "zero3", "tp", "tp_sp", "fsdp_tp")
_TP_NAMES = ("tp", "model", "mp", "tensor")
_STATES = {"adam": 2, "adamw": 2, "momentum": 1, "sgd": 0}
_PRECISION = {  # param bytes, grad bytes, optimizer state bytes, fp32 master copy bytes
    "mixed": (2, 2, 4, 4), "bf16_params": (2, 2, 4, 0), "fp32": (4, 4, 4, 0), "bf16": (2, 2, 2, 0)}
PRECISIONS = tuple(_PRECISION)
# (ZeRO stage, model-parallel, sequence-parallel) of each name
_LAYOUT = {"dp": (0, False, False), "zero1": (1, False, False), "zero2": (2, False, False),
           "zero3": (3, False, False), "fsdp": (3, False, False), "tp": (0, True, False),
           "tp_sp": (0, True, True), "fsdp_tp": (3, True, True)}


def strategy_name(name: str) -> str:
    """The one spelling of a strategy name: ``"fsdp+tp"`` is ``"fsdp_tp"`` (``+`` joins the
    parts of a combined strategy in the book and ``_`` in ``train.strategies``).

    Example:
        >>> strategy_name("fsdp+tp"), strategy_name("tp_sp")
        ('fsdp_tp', 'tp_sp')
    """
    return name.replace("+", "_") if isinstance(name, str) else name


def mesh_axis_sizes(mesh, op: str) -> dict:
    """``{axis: size}`` from a dict or a shardlab ``Mesh``."""
    shape = getattr(mesh, "shape", mesh)
    if not isinstance(shape, dict) or not shape:
        raise TypeError(f"[{op}] mesh must be a dict of axis sizes (e.g. {{'data': 8}}) or a "
                        f"shardlab Mesh, got {mesh!r}")
    for k, v in shape.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"[{op}] mesh axis {k!r} has size {v!r}; sizes must be ints >= 1")
    return dict(shape)


def _split(strategy, sizes: dict, tp_axis, op: str) -> tuple[int, int]:
    """(data-parallel size, model-parallel size) of ``strategy`` (a name or a Strategy) on ``sizes``."""
    total = math.prod(sizes.values())
    if not isinstance(strategy, str):  # a train.Strategy: its own model axis
        if strategy.model is None:
            return total, 1
        if strategy.model not in sizes:
            raise ValueError(f"[{op}] the model axis {strategy.model!r} of strategy {strategy.name!r} is not a mesh "
                             f"axis ({list(sizes)})")
        return total // sizes[strategy.model], sizes[strategy.model]
    if strategy in ("tp", "tp_sp"):
        return 1, total
    if strategy != "fsdp_tp":
        return total, 1
    if tp_axis is None:
        named = [a for a in sizes if str(a).lower() in _TP_NAMES]
        if len(named) == 1:
            tp_axis = named[0]
        elif len(sizes) == 2:
            tp_axis = list(sizes)[-1]  # the book's {X: data, Y: model}
        else:
            raise ValueError(f"[{op}] strategy 'fsdp_tp' cannot tell the model axis among "
                             f"{list(sizes)}; pass tp_axis=<name> or name it one of {_TP_NAMES}")
    if tp_axis not in sizes:
        raise ValueError(f"[{op}] tp_axis {tp_axis!r} is not a mesh axis ({list(sizes)})")
    return total // sizes[tp_axis], sizes[tp_axis]


def _layout(strategy, op: str) -> tuple:
    """(canonical name, ZeRO stage, sequence parallel) of a strategy name or a train.Strategy."""
    if isinstance(strategy, str):
        name = strategy_name(strategy)
        if name not in _LAYOUT:
            raise ValueError(f"[{op}] strategy {strategy!r} is not one of {', '.join(STRATEGIES)} "
                             f"(or pass a train.Strategy)")
        zero, _, sp = _LAYOUT[name]
        return name, zero, sp
    if all(hasattr(strategy, a) for a in ("zero", "model", "sequence_parallel", "name")):
        return strategy, strategy.zero, bool(strategy.sequence_parallel)
    raise TypeError(f"[{op}] strategy must be a name ({', '.join(STRATEGIES)}) or a train.Strategy, "
                    f"got {type(strategy).__name__}")


def _named_sizes(cfg: ModelConfig, moe: bool, tp: int, sp: bool, act_b: int) -> dict:
    """Elements per token of each checkpoint name of one layer (``models.remat``); the
    attention core's output comes with its fp32 logsumexp (N per token)."""
    D, N, K, H = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    s = tp if sp else 1
    sizes = {"input": D / s, "attn_norm": D / s, "qkv": (N + 2 * K) * H / tp, "attn_out": (N * H + N * 4 / act_b) / tp,
             "attn_proj": D, "mlp_norm": D / s}
    if not moe:
        F = cfg.ffw_dim
        sizes.update(mlp_hidden=(cfg.mlp_matrices - 1) * F / tp, mlp_act=F / tp, mlp_down=D)
    else:  # every matmul of the MoE block counts as mlp_hidden: router logits, per slot W_in and W_out
        slots = cfg.top_k * cfg.capacity_factor + cfg.num_shared_experts
        sizes.update(mlp_hidden=cfg.num_experts + slots * ((cfg.mlp_matrices - 1) * cfg.moe_ffw_dim / tp + D),
                     mlp_act=0, mlp_down=0)
    return sizes


def _act_elements(cfg: ModelConfig, remat, tp: int, sp: bool = False, act_b: int = 2) -> tuple[float, float, float]:
    """Saved activation elements per token for all layers, one layer's full set (both with the
    model-axis split applied), and the part of the first that the policy's names keep."""
    D, N, K, H = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    policy = remat_policy(remat, "training_memory")
    s = tp if sp else 1
    attn_full = 2 * D / s + (2 * N * H + 2 * K * H + N) / tp

    def mlp_full(moe: bool) -> float:
        per_f = 4 if cfg.gated_mlp else 2
        if not moe:
            return 2 * D / s + per_f * cfg.ffw_dim / tp
        slots = cfg.top_k * cfg.capacity_factor
        return (2 * D / s + 2 * cfg.num_experts + slots * (2 * D + per_f * cfg.moe_ffw_dim / tp)
                + cfg.num_shared_experts * per_f * cfg.moe_ffw_dim / tp)

    full_layers = [attn_full + mlp_full(cfg.is_moe_layer(i)) for i in range(cfg.num_layers)]
    if not policy.checkpointed:
        return sum(full_layers), max(full_layers), 0.0
    named = 0.0
    for i in range(cfg.num_layers):
        sizes = _named_sizes(cfg, cfg.is_moe_layer(i), tp, sp, act_b)
        named += sum(sizes[n] for n in policy.saved)
    return named + cfg.num_layers * D / s, max(full_layers), named


def training_memory(cfg: ModelConfig, strategy, mesh, batch: int, optimizer: str = "adam",
                    precision: str = "mixed", remat=None, *, context: int | None = None,
                    tp_axis: str | None = None) -> Report:
    """Bytes per device for one training step (see the module docstring for the model).

    Args:
        cfg: the model.
        strategy: one of ``"dp", "fsdp", "zero1", "zero2", "zero3", "tp", "tp_sp", "fsdp_tp"``
            (``"fsdp+tp"`` is accepted) or a ``train.Strategy`` (its ZeRO stage, model axis and
            sequence parallelism).
        mesh: ``{axis: size}`` or a shardlab ``Mesh``; all axes are data axes except the model
            axis of ``"tp"`` / ``"tp_sp"`` (every axis), ``"fsdp_tp"`` (``tp_axis``, an axis
            named tp/model/mp/tensor, or the last of two axes) and a Strategy's ``model``.
        batch: global batch in sequences (divisible by the data-parallel size).
        optimizer: ``"adam"``, ``"adamw"``, ``"momentum"`` or ``"sgd"``.
        precision: ``"mixed"``, ``"bf16_params"``, ``"fp32"`` or ``"bf16"``.
        remat: a recompute policy of :mod:`shardlab.models.remat` (None, "full", "selective",
            "dots", "ffw_outputs", a set of checkpoint names).
        context: tokens per sequence (defaults to ``cfg.max_seq_len``).
        tp_axis: the model axis for ``"fsdp_tp"``.

    Returns:
        A :class:`~shardlab.models.report.Report` in bytes with parts ``params``, ``grads``,
        ``optimizer``, ``activations``, ``temporaries``; ``extra`` gives the data and model
        parallel sizes, tokens per device and, for a checkpointed policy, the bytes of the values
        it names (``checkpointed_names``) and of the layer inputs (``layer_inputs``).

    Example:
        >>> from shardlab.models import presets, training_memory
        >>> cfg = presets.get("llama2-13b")   # the book's part 5, question 2: 16M tokens
        >>> m = training_memory(cfg, "dp", {"data": 1}, batch=4096, context=4096, remat="ffw_outputs")
        >>> m.extra["checkpointed_names"] == 2 * 40 * 4096 * 4096 * (5120 + 2 * 13824)   # 2·L·B·(D+2F)
        True
        >>> from shardlab.models import param_count
        >>> b = training_memory(cfg, "dp", {"data": 1}, 1, precision="bf16_params")
        >>> (b.params + b.optimizer) / param_count(cfg).total   # the book's 10 bytes per parameter
        10.0
    """
    op = "training_memory"
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"[{op}] expected a ModelConfig, got {type(cfg).__name__}")
    strategy, zero, sp = _layout(strategy, op)
    if optimizer not in _STATES:
        raise ValueError(f"[{op}] optimizer {optimizer!r} is not one of {', '.join(_STATES)}")
    if precision not in _PRECISION:
        raise ValueError(f"[{op}] precision {precision!r} is not one of {', '.join(_PRECISION)}")
    policy = remat_policy(remat, op)
    sizes = mesh_axis_sizes(mesh, op)
    dp, tp = _split(strategy, sizes, tp_axis, op)
    T = cfg.max_seq_len if context is None else context
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"[{op}] batch {batch!r} must be an int >= 1 (sequences per step)")
    if batch % dp:
        raise ValueError(f"[{op}] batch {batch} is not divisible by the data-parallel size {dp} "
                         f"of mesh {sizes}; use a multiple of {dp}")
    pb, gb, sb, master = _PRECISION[precision]
    n_params = param_count(cfg).total
    norms = (2 * cfg.num_layers + 1) * norm_params(cfg)
    # Under tp every matrix is split over the model axis; norm weights stay replicated.
    per_dev_tp = (n_params - norms) / tp + norms
    shard = {0: (1, 1, 1), 1: (1, 1, dp), 2: (1, dp, dp), 3: (dp, dp, dp)}[zero]
    params = per_dev_tp * pb / shard[0]
    grads = per_dev_tp * gb / shard[1]
    optim = per_dev_tp * (_STATES[optimizer] * sb + master) / shard[2]
    act_b = 4 if precision == "fp32" else 2
    tokens = batch // dp * T
    saved, one_layer, named = _act_elements(cfg, policy, tp, sp, act_b)
    activations = tokens * saved * act_b
    temps = 2 * 4 * tokens * cfg.vocab_size / tp
    if shard[0] > 1:
        temps += per_dev_tp / cfg.num_layers * pb  # one layer gathered
    if policy.checkpointed:
        temps += tokens * one_layer * act_b  # one layer's activations while it is recomputed
    parts = {"params": params, "grads": grads, "optimizer": optim, "activations": activations,
             "temporaries": temps}
    parts = {k: _int(v) for k, v in parts.items()}
    extra = {"data_parallel": dp, "model_parallel": tp, "tokens_per_device": tokens, "param_count": n_params,
             "sequence_parallel": sp}
    if policy.checkpointed:
        extra.update(checkpointed_names=_int(tokens * named * act_b),
                     layer_inputs=_int(tokens * cfg.num_layers * cfg.d_model / (tp if sp else 1) * act_b))
    label = strategy if isinstance(strategy, str) else strategy.name
    return Report(f"{op}({cfg.name or 'model'}, {label}, mesh {sizes}, batch {batch}x{T}, "
                  f"{optimizer}, {precision}, remat={policy})", parts, unit="bytes",
                  formula=(f"params {pb}B, grads {gb}B, optimizer {_STATES[optimizer]}x{sb}B"
                           f"{' + 4B master' if master else ''} per param, divided by the axes "
                           f"that shard them; activations = tokens/device x saved elements x {act_b}B"),
                  extra=extra, extra_units={k: "params" if k == "param_count" else "bytes" for k in extra
                                            if k in ("param_count", "checkpointed_names", "layer_inputs")},
                  notes=("an estimate: params/grads/optimizer are exact shard sizes; activations "
                         "and temporaries follow the saved-tensor model in the module docstring",))


def _int(v):
    return int(v) if float(v).is_integer() else v
