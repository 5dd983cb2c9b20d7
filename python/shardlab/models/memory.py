"""``training_memory``: bytes per device of params, grads, optimizer states, activations and
temporary buffers under a parallelism strategy.

Strategies (the book's part 5 and the ZeRO paper): ``"dp"`` (everything replicated, batch
split), ``"zero1"`` (optimizer states sharded over the data axes), ``"zero2"`` (+ gradients),
``"zero3"`` / ``"fsdp"`` (+ parameters), ``"tp"`` (Megatron: weights and the head/MLP-width
activations split over the model axis, the residual stream replicated), ``"fsdp+tp"``.

Bytes per parameter (``precision``): ``"mixed"`` -- bf16 params and grads, fp32 master copy
(ZeRO's 2 + 2 + 12 for Adam); ``"fp32"`` -- 4 + 4 + 4 per optimizer state; ``"bf16"`` --
2 + 2 + 2 per state. Optimizer states: ``"adam"``/``"adamw"`` 2, ``"momentum"`` 1, ``"sgd"`` 0.

Activations saved per token and layer (elements, ``remat``): ``None`` -- the residual input and
norm output of both blocks (4D), q, k, v and the attention output (2NH + 2KH), the softmax
statistics (N), and the MLP hidden values (4F gated: gate, up, act(gate), product; 2F plain);
MoE layers keep E router logits and probabilities and the same per routed slot
(``k * capacity_factor`` slots per token) plus the shared experts; ``"attention"`` -- the
layer input and the seven matmul outputs (D + NH + 2KH + D + 2F + D gated); ``"full"`` --
the layer input (D). Flash attention never stores the T x T scores.

Temporaries: fp32 logits and their gradient (2 x 4 x tokens x V / tp), one layer's gathered
parameters for zero3/fsdp, and one layer's activations while it is recomputed (full remat).

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
from .report import Report

__all__ = ["training_memory", "STRATEGIES", "mesh_axis_sizes"]

STRATEGIES = ("dp", "fsdp", "zero1", "zero2", "zero3", "tp", "fsdp+tp")
_TP_NAMES = ("tp", "model", "mp", "tensor")
_STATES = {"adam": 2, "adamw": 2, "momentum": 1, "sgd": 0}
_PRECISION = {  # param bytes, grad bytes, optimizer state bytes, fp32 master copy bytes
    "mixed": (2, 2, 4, 4), "fp32": (4, 4, 4, 0), "bf16": (2, 2, 2, 0)}


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


def _split(strategy: str, sizes: dict, tp_axis, op: str) -> tuple[int, int]:
    total = math.prod(sizes.values())
    if strategy == "tp":
        return 1, total
    if strategy != "fsdp+tp":
        return total, 1
    if tp_axis is None:
        named = [a for a in sizes if str(a).lower() in _TP_NAMES]
        if len(named) == 1:
            tp_axis = named[0]
        elif len(sizes) == 2:
            tp_axis = list(sizes)[-1]  # the book's {X: data, Y: model}
        else:
            raise ValueError(f"[{op}] strategy 'fsdp+tp' cannot tell the model axis among "
                             f"{list(sizes)}; pass tp_axis=<name> or name it one of {_TP_NAMES}")
    if tp_axis not in sizes:
        raise ValueError(f"[{op}] tp_axis {tp_axis!r} is not a mesh axis ({list(sizes)})")
    return total // sizes[tp_axis], sizes[tp_axis]


def _act_elements(cfg: ModelConfig, remat, tp: int) -> tuple[float, float]:
    """Saved activation elements per token for all layers, and one layer's full set (both
    with the model-axis split applied)."""
    D, N, K, H = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    attn_full = 2 * D + (2 * N * H + 2 * K * H + N) / tp

    def mlp_full(moe: bool) -> float:
        per_f = 4 if cfg.gated_mlp else 2
        if not moe:
            return 2 * D + per_f * cfg.ffw_dim / tp
        slots = cfg.top_k * cfg.capacity_factor
        return (2 * D + 2 * cfg.num_experts + slots * (2 * D + per_f * cfg.moe_ffw_dim / tp)
                + cfg.num_shared_experts * per_f * cfg.moe_ffw_dim / tp)

    def mlp_dots(moe: bool) -> float:
        f = cfg.moe_ffw_dim if moe else cfg.ffw_dim
        n_in = cfg.mlp_matrices - 1
        slots = cfg.top_k * cfg.capacity_factor + cfg.num_shared_experts if moe else 1
        return D + slots * n_in * f / tp

    full_layers = [attn_full + mlp_full(cfg.is_moe_layer(i)) for i in range(cfg.num_layers)]
    if remat in (None, "none"):
        saved = sum(full_layers)
    elif remat == "attention":
        saved = sum(D + (N * H + 2 * K * H) / tp + D + mlp_dots(cfg.is_moe_layer(i))
                    for i in range(cfg.num_layers))
    elif remat == "full":
        saved = cfg.num_layers * D
    else:
        raise ValueError(f"[training_memory] remat {remat!r} is not one of None, 'attention', 'full'")
    return saved, max(full_layers)


def training_memory(cfg: ModelConfig, strategy: str, mesh, batch: int, optimizer: str = "adam",
                    precision: str = "mixed", remat=None, *, context: int | None = None,
                    tp_axis: str | None = None) -> Report:
    """Bytes per device for one training step (see the module docstring for the model).

    Args:
        cfg: the model.
        strategy: one of ``"dp", "fsdp", "zero1", "zero2", "zero3", "tp", "fsdp+tp"``.
        mesh: ``{axis: size}`` or a shardlab ``Mesh``; all axes are data axes except the model
            axis of ``"tp"`` (every axis) and ``"fsdp+tp"`` (``tp_axis``, an axis named
            tp/model/mp/tensor, or the last of two axes).
        batch: global batch in sequences (divisible by the data-parallel size).
        optimizer: ``"adam"``, ``"adamw"``, ``"momentum"`` or ``"sgd"``.
        precision: ``"mixed"``, ``"fp32"`` or ``"bf16"``.
        remat: None, ``"attention"`` or ``"full"``.
        context: tokens per sequence (defaults to ``cfg.max_seq_len``).
        tp_axis: the model axis for ``"fsdp+tp"``.

    Returns:
        A :class:`~shardlab.models.report.Report` in bytes with parts ``params``, ``grads``,
        ``optimizer``, ``activations``, ``temporaries``; ``extra`` gives the data and model
        parallel sizes and tokens per device.
    """
    op = "training_memory"
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"[{op}] expected a ModelConfig, got {type(cfg).__name__}")
    if strategy not in STRATEGIES:
        raise ValueError(f"[{op}] strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if optimizer not in _STATES:
        raise ValueError(f"[{op}] optimizer {optimizer!r} is not one of {', '.join(_STATES)}")
    if precision not in _PRECISION:
        raise ValueError(f"[{op}] precision {precision!r} is not one of {', '.join(_PRECISION)}")
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
    shard = {"dp": (1, 1, 1), "zero1": (1, 1, dp), "zero2": (1, dp, dp), "zero3": (dp, dp, dp),
             "fsdp": (dp, dp, dp), "tp": (1, 1, 1), "fsdp+tp": (dp, dp, dp)}[strategy]
    params = per_dev_tp * pb / shard[0]
    grads = per_dev_tp * gb / shard[1]
    optim = per_dev_tp * (_STATES[optimizer] * sb + master) / shard[2]
    act_b = 4 if precision == "fp32" else 2
    tokens = batch // dp * T
    saved, one_layer = _act_elements(cfg, remat, tp)
    activations = tokens * saved * act_b
    temps = 2 * 4 * tokens * cfg.vocab_size / tp
    if shard[0] > 1:
        temps += per_dev_tp / cfg.num_layers * pb  # one layer gathered
    if remat == "full":
        temps += tokens * one_layer * act_b
    parts = {"params": params, "grads": grads, "optimizer": optim, "activations": activations,
             "temporaries": temps}
    parts = {k: int(v) if float(v).is_integer() else v for k, v in parts.items()}
    return Report(f"{op}({cfg.name or 'model'}, {strategy}, mesh {sizes}, batch {batch}x{T}, "
                  f"{optimizer}, {precision}, remat={remat})", parts, unit="bytes",
                  formula=(f"params {pb}B, grads {gb}B, optimizer {_STATES[optimizer]}x{sb}B"
                           f"{' + 4B master' if master else ''} per param, divided by the axes "
                           f"that shard them; activations = tokens/device x saved elements x {act_b}B"),
                  extra={"data_parallel": dp, "model_parallel": tp, "tokens_per_device": tokens,
                         "param_count": n_params},
                  notes=("an estimate: params/grads/optimizer are exact shard sizes; activations "
                         "and temporaries follow the saved-tensor model in the module docstring",))
