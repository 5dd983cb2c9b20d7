"""Validation against measurements nobody here produced: every row is :func:`shardlab.train.estimate`.

Three published tables, transcribed with their configurations in :mod:`shardlab.train.data`:

* ``"megatron"``: Narayanan et al. 2021, Table 1 -- GPT 1.7B to 1T on up to 3,072 A100s with
  tensor, pipeline (interleaved) and data parallelism, full recompute, unfused attention
  (:mod:`~shardlab.train.data.megatron_table1`);
* ``"maxtext-v5p"``, ``"maxtext-v5e"`` and ``"maxtext-v4"``: MaxText's TPU tables, 16B to 1T on 1 to
  32 slices, FSDP (+ TP) inside a slice, data parallelism over the DCN
  (:mod:`~shardlab.train.data.maxtext_tpu`);
* ``"torchtitan-a100"``: LLaMA 13B / 70B with FSDP2 on 64 A100s
  (:mod:`~shardlab.train.data.torchtitan_a100`);
* ``"torch-h100"`` and ``"torch-h200"``: training steps of two LLaMA-style models that the
  shardlab team ran with PyTorch on one H100 and one H200, eager and compiled, with
  and without full recompute (:mod:`~shardlab.train.data.gpu_measured`).

Each row is turned into a model, a strategy, a mesh and the framework's options (the schedule,
the recompute policy, asynchronous TP for XLA's collective matmuls, DDP's overlap), estimated
with the chip's price list (:func:`shardlab.cost.price_list`), and compared to the measured step
time (``measured``: the published throughput converted with the publisher's own FLOP count).
:func:`validate` prints each row's estimate, measurement and error; :func:`fit` fits one constant
of the price lists -- the large-GEMM efficiency of a chip, the DCN's cost per ring step shared
by the TPUs, or what one slice reaches over the DCN -- on some rows and reports the error on the
others (held-out rows of any table, leave-one-out). The same price list serves every row of a chip. MaxText's rows put the gradient
all-reduce across slices on the critical path (``estimate``'s default), as they measure.

Example:
    >>> from shardlab.train import validate
    >>> r = validate.estimate_row(validate.table("maxtext-v5e")[0])
    >>> r.table, r.row["scale"], abs(r.error) < 0.1
    ('maxtext-v5e', 16, True)
"""

from __future__ import annotations

import dataclasses

from shardlab import cost
from shardlab import hardware as hw_mod
from shardlab import units
from shardlab.models import ModelConfig

from .data import maxtext_tpu as _maxtext
from .data import gpu_measured as _gpu
from .data import megatron_table1 as _table1
from .data import torchtitan_a100 as _titan
from .estimate import Estimate, _clock, estimate
from .hierarchical import hierarchical
from .strategy import Strategy

__all__ = ["A100", "TABLES", "RowEstimate", "table", "estimate_row", "validate", "fit", "FIT_CONSTANTS", "FIT_OBJECTIVES",
           "FIT_GOAL", "gpt_config",
           "gpu_config",
           "sdpa_efficiency",
           "paper_flops", "MegatronEstimate", "estimate_megatron", "validate_megatron", "fit_efficiency",
           "pipeline_seconds", "activation_bytes", "EFFICIENCY"]

#: NVIDIA A100 SXM 80 GB (the "a100" preset), the GPU of the Megatron and torchtitan runs
#: (figures and sources: docs/hardware.md).
A100 = hw_mod.get("a100")

#: The tables :func:`table` knows.
TABLES = ("megatron", "maxtext-v5p", "maxtext-v5e", "maxtext-v4", "torchtitan-a100", "torch-h100", "torch-h200")

#: The A100's large-GEMM efficiency in ``cost.price_list("a100")`` (Bekman's MAMF, 86.9 %); kept
#: as the name the Megatron validation used for its one constant.
EFFICIENCY = cost.price_list("a100").matmul("bfloat16")


def table(name: str = "megatron") -> list[dict]:
    """The rows of one table (copies), each with ``"table"`` set.

    Raises:
        ValueError: an unknown table name (the message lists :data:`TABLES`).
    """
    rows = {"megatron": _table1.ROWS, "maxtext-v5p": _maxtext.V5P, "maxtext-v5e": _maxtext.V5E, "maxtext-v4": _maxtext.V4,
            "torchtitan-a100": [r for r in _titan.ROWS if r["estimable"]],
            "torch-h100": _gpu.TRAIN["h100"], "torch-h200": _gpu.TRAIN["h200"]}.get(name)
    if rows is None:
        raise ValueError(f"[validate.table] {name!r} is not a table; use one of {', '.join(TABLES)}")
    return [dict(r, table=name) for r in rows]


@dataclasses.dataclass
class RowEstimate:
    """One published row next to its estimate."""

    table: str
    row: dict
    estimate: Estimate
    measured_seconds: float   # the published throughput as a step time (publisher's FLOP count)
    estimated_seconds: float

    @property
    def error(self) -> float:
        """(estimate - measured) / measured of the step time."""
        return self.estimated_seconds / self.measured_seconds - 1

    @property
    def label(self) -> str:
        r = self.row
        if self.table == "megatron":
            return f"{r['params_b']}B t{r['t']} p{r['p']} ({r['gpus']} GPUs)"
        if self.table.startswith("maxtext"):
            return f"{r['scale']}B {r['slices']}x{r['chips_per_slice']} chips"
        if self.table.startswith("torch-"):
            return f"{r['model']} b{r['batch']}x{r['seq']} remat {r['remat']}, {r['kernels']}"
        ac = r["ac"] if isinstance(r["ac"], str) else "op"
        return f"{r['model']} b{r['local_batch']} AC {ac}"


# -- Megatron-LM (Narayanan et al. 2021, Table 1) -------------------------------------------------

def gpt_config(row: dict, num_layers: int | None = None) -> ModelConfig:
    """The row's GPT: ``l`` layers of width ``h`` with ``a`` heads, F = 4h, V = 51,200, s = 2048,
    learned positions, LayerNorm, GeLU, biases, tied input/output embeddings."""
    h = row["hidden"]
    return ModelConfig(num_layers=num_layers or row["layers"], d_model=h, ffw_dim=4 * h, num_heads=row["heads"],
                       vocab_size=_table1.VOCAB, max_seq_len=_table1.SEQ_LEN, gated_mlp=False, activation="gelu",
                       norm="layernorm", qkv_bias=True, out_bias=True, mlp_bias=True, positions="learned",
                       tie_embeddings=True, name=f"gpt-{row['params_b']}B")


def paper_flops(row: dict) -> float:
    """FLOPs per iteration as the paper counts them: ``96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))``
    (forward, backward and the recomputed forward; full, unmasked attention; the logit layer)."""
    B, s, l, h, V = row["batch"], _table1.SEQ_LEN, row["layers"], row["hidden"], _table1.VOCAB
    return 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))


def activation_bytes(row: dict) -> float:
    """Bytes the activations of one layer take for one microbatch on one GPU (Korthikanti et al.
    2022, tensor parallelism without sequence parallelism): ``s·b·h·(10 + 24/t + 5·a·s/(h·t))``."""
    s, b, h, a, t = _table1.SEQ_LEN, row["microbatch"], row["hidden"], row["heads"], row["t"]
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


def _mesh(t: int, d: int, hardware) -> tuple[dict, tuple]:
    """The (data..., model) mesh of one pipeline stage: TP inside a node, the data-parallel peers
    that share the node on NVLink, the rest across nodes on InfiniBand."""
    node = hardware.node_size
    inner = max(1, min(d, node // t))
    while d % inner:
        inner -= 1
    mesh, data = {}, []
    if d // inner > 1:
        mesh["data_ib"] = d // inner
        data.append("data_ib")
    if inner > 1:
        mesh["data_nv"] = inner
        data.append("data_nv")
    if not data:
        mesh["data"] = 1
        data.append("data")
    if t > 1:
        mesh["model"] = t
    return mesh, tuple(data)


_ROW_KEYS = ("params_b", "heads", "hidden", "layers", "t", "p", "gpus", "batch", "tflops_per_gpu", "microbatch",
             "layers_per_virtual_stage", "ddp")


def _check_megatron_row(op, row):
    missing = [k for k in _ROW_KEYS if k not in row] if isinstance(row, dict) else None
    if missing is None or missing:
        what = f"lacks {missing}" if missing else f"is a {type(row).__name__}"
        raise TypeError(f"[{op}] a row is a dict like those of validate.table(); this one {what}")


def _megatron(row: dict, prices, elementwise_scale: float = 1.0) -> tuple[Estimate, float]:
    t, p, l = row["t"], row["p"], row["layers"]
    d, b = row["gpus"] // (t * p), row["microbatch"]
    m = row["batch"] // (d * b)
    if m * d * b != row["batch"] or d * t * p != row["gpus"]:
        raise ValueError(f"[estimate_megatron] row {row['params_b']}B: batch {row['batch']} is not d·b·m = "
                         f"{d}·{b}·m or GPUs {row['gpus']} != t·p·d")
    lps = row["layers_per_virtual_stage"]
    v = (l // p) // lps if lps else 1
    mesh, data = _mesh(t, d, A100)
    strat = Strategy("megatron", data=data, model="model" if t > 1 else None)
    e = estimate(gpt_config(row), strat, mesh, A100, batch=row["batch"], seq=_table1.SEQ_LEN, remat="full",
                 microbatches=m, pipeline=p, virtual_stages=v, attention="unfused", dropout=True,
                 dp_overlap=row["ddp"] == "torch", prices=prices, elementwise_scale=elementwise_scale)
    return e, paper_flops(row) / (row["tflops_per_gpu"] * 1e12 * row["gpus"])


# -- MaxText (TPU v5p, v5e) ------------------------------------------------------------------------

def maxtext_config(row: dict) -> ModelConfig:
    """MaxText's default decoder at the row's ``global_parameter_scale``, or with the v4 scripts'
    own dimensions (see :mod:`shardlab.train.data.maxtext_tpu`): ReLU MLP, RMSNorm, rotary, tied
    logits."""
    dims = _maxtext.row_dims(row)
    return ModelConfig(**dims, head_dim=_maxtext.HEAD_DIM, vocab_size=_maxtext.VOCAB, max_seq_len=_maxtext.SEQ_LEN,
                       gated_mlp=False, activation="relu", tie_embeddings=True, name=f"maxtext-{row['scale']}b")


_MAXTEXT_REMAT = {"minimal": "dots", "full": "full"}


def _maxtext_row(row: dict, prices) -> tuple[Estimate, float]:
    fs, tp, n = row["ici_fsdp"], row["ici_tensor"], row["slices"]
    mesh = {"data": fs} if tp == 1 else {"data": fs, "model": tp}
    # MaxText's logical_axis_rules put 'activation_embed' on 'tensor': between blocks the residual
    # stream is split over TP (its embed dimension rather than Megatron's sequence: the same bytes
    # per device and the same all-gather / reduce-scatter around the block), in one slice or many
    if n > 1:   # data parallelism over the DCN between slices, FSDP (+ TP) inside
        mesh = {"dcn": n, **mesh}
        strat = hierarchical(data="data", zero=3, model="model" if tp > 1 else None, sequence_parallel=tp > 1)
    else:
        strat = "fsdp_tp" if tp > 1 else "fsdp"
    # XLA's async collective fusion (the scripts' LIBTPU_INIT_ARGS) overlaps the TP collectives; the
    # gradient all-reduce across slices is on the critical path (estimate's default): the multi-slice
    # rows grow with layers x DCN ring steps, which a reduction hidden under the backward cannot do
    # (docs/train.md: overlapped, the best fitted step cost leaves v5e's worst row at 18 %)
    e = estimate(maxtext_config(row), strat, mesh, row["hardware"], batch=row["per_device_batch"] * row["chips"],
                 seq=_maxtext.SEQ_LEN, remat=_MAXTEXT_REMAT[row["remat_policy"]], async_tp=True, prices=prices)
    return e, _maxtext.measured_seconds(row)


# -- torchtitan (A100) -----------------------------------------------------------------------------

def torchtitan_config(row: dict) -> ModelConfig:
    """The row's LLaMA (torchtitan's ``llama`` flavours of 2024-04): SwiGLU, RMSNorm, rotary, untied."""
    return ModelConfig(**_titan.MODELS[row["model"]], vocab_size=_titan.VOCAB, max_seq_len=_titan.SEQ_LEN,
                       name=f"llama-{row['model']}")


def _torchtitan_row(row: dict, prices) -> tuple[Estimate, float]:
    strat = Strategy("fsdp", data=("data_ib", "data_nv"), zero=3)
    # no torch.compile (eager kernels), FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)
    e = estimate(torchtitan_config(row), strat, {"data_ib": _titan.GPUS // 8, "data_nv": 8}, A100,
                 batch=_titan.GPUS * row["local_batch"], seq=_titan.SEQ_LEN, remat=row["ac"], prices=prices,
                 kernels=_titan.KERNELS, fused_norm=_titan.FUSED_NORM[row["model"]],
                 reduce_dtype=_titan.REDUCE_DTYPE, fsdp_copies=_titan.FSDP_COPIES)
    return e, row["local_batch"] * _titan.SEQ_LEN / row["wps"]


def gpu_config(row: dict) -> ModelConfig:
    """The model of a :mod:`~shardlab.train.data.gpu_measured` row (MHA, SwiGLU, RMSNorm, rotary, untied).

    Example:
        >>> cfg = gpu_config(table("torch-h100")[0])
        >>> cfg.name, cfg.num_layers, cfg.d_model, cfg.max_seq_len
        ('llama-1b', 16, 2048, 2048)
    """
    return ModelConfig(**_gpu.MODELS[row["model"]], max_seq_len=row["seq"], name=row["model"])


def sdpa_efficiency(chip: str, backend: str = "default") -> tuple[float, float]:
    """(forward, backward) fraction of ``chip``'s bf16 peak that PyTorch's
    ``scaled_dot_product_attention`` reached in :data:`~shardlab.train.data.gpu_measured.ATTENTION`
    (the mean over its causal shapes; FLOPs as ``cost.attention_flops``, the backward 2.5 times
    the forward). The price lists' own attention figures are FlashAttention-3's; a PyTorch run
    uses this kernel, so the ``"torch-*"`` tables price attention with it.

    Example:
        >>> fwd, bwd = sdpa_efficiency("h100")
        >>> 0.5 < fwd < 0.6 and 0.4 < bwd < 0.55
        True
    """
    rows = [r for r in _gpu.ATTENTION.get(chip, ()) if r[0] == backend]
    if not rows:
        raise ValueError(f"[validate.sdpa_efficiency] no {backend!r} attention measured on {chip!r}: "
                         f"chips {', '.join(sorted(_gpu.ATTENTION))}; backends default, flash, cudnn, efficient")
    peak = hw_mod.get(chip).peak("bfloat16")
    fwd = bwd = 0.0
    for _, b, h, s, t_fwd, t_both in rows:
        flops = cost.attention_flops(b, s, s, h, 128, causal=True)
        fwd += flops / t_fwd / peak / len(rows)
        bwd += 2.5 * flops / (t_both - t_fwd) / peak / len(rows)
    return fwd, bwd


def _gpu_row(row: dict, prices) -> tuple[Estimate, float]:
    # one GPU, PyTorch: eager kernels (RMSNorm in fp32, complex rotary) or each block torch.compile'd;
    # attention is PyTorch's SDPA (cuDNN), priced at what it reached on the same chip
    chip = row["table"].removeprefix("torch-")
    if prices is None:
        prices = cost.price_list(chip).replace(attention_efficiency=sdpa_efficiency(chip))
    e = estimate(gpu_config(row), "dp", {"data": 1}, chip, batch=row["batch"], seq=row["seq"],
                 remat=row["remat"], prices=prices, kernels=row["kernels"])
    return e, row["step_seconds"]


_BUILDERS = {"megatron": _megatron, "maxtext-v5p": _maxtext_row, "maxtext-v5e": _maxtext_row, "maxtext-v4": _maxtext_row,
             "torchtitan-a100": _torchtitan_row, "torch-h100": _gpu_row, "torch-h200": _gpu_row}


def estimate_row(row: dict, prices=None) -> RowEstimate:
    """Estimates one row of :func:`table` (``prices``: a price list to use instead of the chip's)."""
    name = row.get("table") if isinstance(row, dict) else None
    if name not in _BUILDERS:
        raise TypeError(f"[validate.estimate_row] a row is a dict from validate.table(name); this one is "
                        f"{type(row).__name__}{'' if not isinstance(row, dict) else ' without a known table'}")
    e, measured = _BUILDERS[name](row, prices)
    return RowEstimate(name, row, e, measured, e.step_seconds)


def _report(name: str, rows: list[RowEstimate], title: str) -> str:
    w = max(len(r.label) for r in rows)
    lines = [title, f"  {'row'.ljust(w)} {'measured':>10} {'estimate':>10} {'error':>8}"]
    for r in rows:
        lines.append(f"  {r.label.ljust(w)} {units.fmt_seconds(r.measured_seconds):>10} "
                     f"{units.fmt_seconds(r.estimated_seconds):>10} {r.error:>+8.2%}")
    errs = [abs(r.error) for r in rows]
    lines.append(f"  mean |error| {sum(errs) / len(errs):.2%}, worst {max(errs):.2%} over {len(rows)} rows")
    return "\n".join(lines)


def validate(name: str = "megatron", *, prices=None, rows=None, show: bool = True) -> dict:
    """Estimates every row of table ``name`` and prints measured, estimated and the error.

    Returns:
        ``{"rows": [RowEstimate, ...], "mean_abs_error": float, "max_abs_error": float, "text": str}``.
    """
    rows = rows if rows is not None else table(name)
    out = [estimate_row(r, prices) for r in rows]
    errs = [abs(r.error) for r in out]
    chip = out[0].estimate.hardware if out else ""
    text = _report(name, out, f"{name}: step time, estimate vs measured on {chip} "
                              f"(prices: {cost.price_list(prices if prices is not None else chip).chip})")
    if show:
        print(text)
    return {"rows": out, "mean_abs_error": sum(errs) / len(errs), "max_abs_error": max(errs), "text": text}


def _with_efficiency(chip: str, eff: float):
    base = cost.price_list(chip)
    return base.replace(matmul_efficiency={k: eff for k in base.matmul_efficiency})


#: The constants :func:`fit` fits: a chip's large-GEMM efficiency, and the DCN's cost per ring
#: step (``PriceList.step_overhead["dcn"]``, one figure for every TPU), each with its default grid.
FIT_CONSTANTS = {"efficiency": [x / 100 for x in range(60, 96)],
                 "dcn_step_overhead": [x / 1e6 for x in range(0, 151, 10)],
                 "dcn_slice_bandwidth": [x * 0.8e12 / 8 for x in range(2, 21)]}

#: How :func:`fit` picks the value on its train rows: ``"goal"``, the least mean absolute error
#: among the values whose worst train row is within :data:`FIT_GOAL` (the least worst row when
#: none is); ``"mean"``, the least mean absolute error; ``"worst"``, the least worst row (minimax).
FIT_OBJECTIVES = ("goal", "mean", "worst")

#: The worst row error the step-time model aims at on every table (issue goal: mean <= 5 %,
#: worst <= 10 %); the ``"goal"`` objective of :func:`fit` keeps its train rows within it.
FIT_GOAL = 0.10


def _with_constant(chip: str, constant: str, value: float):
    if constant == "efficiency":
        return _with_efficiency(chip, value)
    base = cost.price_list(chip)
    if constant == "dcn_slice_bandwidth":
        return base.replace(dcn_slice_bandwidth=value)
    return base.replace(step_overhead=dict(base.step_overhead, dcn=value))


def fit(name: str, train_rows, *, constant: str = "efficiency", grid=None, held_out=None,
        leave_one_out: bool = False, objective: str = "goal", show: bool = False) -> dict:
    """Fits one constant of the price lists on the rows ``train_rows`` and reports the error on
    held-out rows.

    Args:
        name: the table ``train_rows`` indexes (:data:`TABLES`).
        train_rows: indices into ``table(name)``, or rows (dicts from :func:`table`, of any table).
        constant: ``"efficiency"``, the chip's large-GEMM efficiency (the one constant of a price
            list that is not a transcribed figure), ``"dcn_step_overhead"``, the DCN's cost per
            ring step of a collective (``PriceList.step_overhead["dcn"]``, seconds), or
            ``"dcn_slice_bandwidth"``, what one slice reaches over the DCN (bytes/s,
            ``PriceList.dcn_slice_bandwidth``), on the chip of each row (:data:`FIT_CONSTANTS`).
        grid: the values tried (default :data:`FIT_CONSTANTS`').
        held_out: rows (dicts from :func:`table`, any table) to report with the fitted value;
            default the rows of ``table(name)`` not in ``train_rows``.
        leave_one_out: also fit on every train row but one and report that row's error.
        objective: how the value is picked on the train rows (:data:`FIT_OBJECTIVES`):
            ``"goal"`` (default), the least mean absolute error among the values that keep every
            train row within :data:`FIT_GOAL` (the least worst row if none does); ``"mean"``;
            ``"worst"`` (minimax).

    Returns:
        ``{"constant", "value", "train_mean_abs_error", "train_max_abs_error",
        "held_out_mean_abs_error", "held_out_max_abs_error", "held_out": [RowEstimate, ...]}``
        (``"efficiency"`` too when that is the constant); with ``leave_one_out``,
        ``"loo_errors"`` (each train row's signed error, fitted without it),
        ``"loo_mean_abs_error"`` and ``"loo_max_abs_error"``.

    Raises:
        ValueError: an unknown constant, objective or table, or no train rows.

    Example:
        >>> from shardlab.train import validate
        >>> multi = [i for i, r in enumerate(validate.table("maxtext-v5e")) if r["slices"] == 32]
        >>> f = validate.fit("maxtext-v5e", multi, constant="dcn_step_overhead", grid=[50e-6, 75e-6, 100e-6],
        ...                  held_out=[])
        >>> round(f["value"] * 1e6), f["train_max_abs_error"] < 0.1
        (75, True)
    """
    if constant not in FIT_CONSTANTS:
        raise ValueError(f"[validate.fit] constant={constant!r}: use one of {', '.join(FIT_CONSTANTS)}")
    if objective not in FIT_OBJECTIVES:
        raise ValueError(f"[validate.fit] objective={objective!r}: use one of {', '.join(FIT_OBJECTIVES)}")
    rows = table(name)
    train = [r if isinstance(r, dict) else rows[r] for r in train_rows]
    if not train:
        raise ValueError("[validate.fit] no train rows: pass indices into validate.table(name) or its rows")
    if held_out is None:
        idx = {r for r in train_rows if not isinstance(r, dict)}
        held_out = [r for i, r in enumerate(rows) if i not in idx]
    grid = list(grid) if grid is not None else FIT_CONSTANTS[constant]

    def chip(r):
        return r.get("hardware") or (r["table"].removeprefix("torch-") if r["table"].startswith("torch-") else "a100")

    errs = {g: [estimate_row(r, _with_constant(chip(r), constant, g)).error for r in train] for g in grid}

    def loss(g, skip=None):
        e = [abs(x) for j, x in enumerate(errs[g]) if j != skip]
        if objective == "worst":
            return (max(e), sum(e))
        if objective == "goal":   # within the goal first, then the least mean (or the least worst)
            within = max(e) <= FIT_GOAL
            return (not within, sum(e) if within else max(e), max(e))
        return (sum(e), max(e))

    best = min(grid, key=loss)
    out = [estimate_row(r, _with_constant(chip(r), constant, best)) for r in held_out]
    ho = [abs(r.error) for r in out]
    tr = [abs(e) for e in errs[best]]
    res = {"constant": constant, "value": best, "train_mean_abs_error": sum(tr) / len(tr),
           "train_max_abs_error": max(tr), "held_out_mean_abs_error": sum(ho) / len(ho) if ho else 0.0,
           "held_out_max_abs_error": max(ho) if ho else 0.0, "held_out": out}
    if constant == "efficiency":
        res["efficiency"] = best
    if leave_one_out:
        loo = []
        for i in range(len(train)):
            g_i = min(grid, key=lambda g: loss(g, i))
            loo.append(errs[g_i][i])
        res.update(loo_errors=loo, loo_mean_abs_error=sum(map(abs, loo)) / len(loo),
                   loo_max_abs_error=max(map(abs, loo)))
    if show and out:
        print(_report(name, out, f"{name}: held-out rows with {constant} {best:.3g} fitted on {len(train)} rows"))
    return res


# -- the Megatron names of the previous validation, now through estimate ----------------------------

@dataclasses.dataclass
class MegatronEstimate:
    """One Table 1 row predicted: the iteration's seconds, where they go, and TFLOP/s per GPU."""

    row: dict
    iteration_seconds: float
    tflops_per_gpu: float
    parts: dict              # the estimate's phases (seconds on the critical path)
    bubble_fraction: float   # idle share of the step
    microbatches: int
    virtual_stages: int
    estimate: Estimate = dataclasses.field(repr=False, default=None)

    @property
    def error(self) -> float:
        """(ours − paper) / paper of the teraFLOP/s per GPU."""
        return self.tflops_per_gpu / self.row["tflops_per_gpu"] - 1


def estimate_megatron(row: dict, *, efficiency: float | None = None, elementwise_passes: float = 8,
                      hardware=A100) -> MegatronEstimate:
    """Predicts a Table 1 row's teraFLOP/s per GPU with :func:`shardlab.train.estimate`.

    Args:
        row: a dict from ``table("megatron")``.
        efficiency: the A100's large-GEMM efficiency to use instead of its price list's.
        elementwise_passes: the memory-bound bytes of the layers as passes over Korthikanti et
            al.'s activation bytes; 8 (forward 2, recompute 2, backward 4) is the estimate's own
            count, 0 leaves them out (``estimate(elementwise_scale=passes / 8)``).
        hardware: the GPU (default :data:`A100`).

    Example:
        >>> from shardlab.train import validate
        >>> e = validate.estimate_megatron(validate.table()[3])      # 18.4B, t = 8, p = 1
        >>> e.microbatches, e.virtual_stages
        (4, 1)
    """
    op = "estimate_megatron"
    if efficiency is not None and not 0 < efficiency <= 1:
        raise ValueError(f"[{op}] efficiency {efficiency!r} must be in (0, 1]")
    _check_megatron_row(op, row)
    if hw_mod.get(hardware).name != A100.name:
        raise ValueError(f"[{op}] Table 1 ran on A100s; hardware={hardware!r} is not one")
    prices = _with_efficiency("a100", efficiency) if efficiency is not None else None
    e, _ = _megatron(row, prices, elementwise_passes / 8)
    d = row["gpus"] // (row["t"] * row["p"])
    m = row["batch"] // (d * row["microbatch"])
    lps = row["layers_per_virtual_stage"]
    v = (row["layers"] // row["p"]) // lps if lps else 1
    tflops = paper_flops(row) / (e.step_seconds * row["gpus"]) / 1e12
    return MegatronEstimate(row, e.step_seconds, tflops, dict(e.phases), e.phases.get("bubble", 0.0) / e.step_seconds,
                            m, v, e)


def validate_megatron(*, efficiency: float | None = None, elementwise_passes: float = 8, rows=None,
                      show: bool = True) -> dict:
    """Predicts every Table 1 row and prints paper TFLOP/s, ours and the error.

    Returns:
        ``{"rows": [MegatronEstimate, ...], "mean_abs_error": float, "efficiency": float, "text": str}``.
    """
    rows = rows if rows is not None else table("megatron")
    ests = [estimate_megatron(r, efficiency=efficiency, elementwise_passes=elementwise_passes) for r in rows]
    eff = efficiency if efficiency is not None else EFFICIENCY
    lines = [f"Megatron-LM on A100 (Narayanan et al. 2021, Table 1) through train.estimate; large GEMMs at "
             f"{eff:.1%} of peak",
             f"{'params':>8} {'t':>2} {'p':>3} {'d':>3} {'v':>2} {'m':>4} {'paper':>6} {'ours':>6} {'error':>7} {'bubble':>7}"]
    for e in ests:
        r = e.row
        lines.append(f"{r['params_b']:>7}B {r['t']:>2} {r['p']:>3} {r['gpus'] // (r['t'] * r['p']):>3} "
                     f"{e.virtual_stages:>2} {e.microbatches:>4} {r['tflops_per_gpu']:>6} {e.tflops_per_gpu:>6.1f} "
                     f"{e.error:>+7.1%} {e.bubble_fraction:>7.1%}")
    mae = sum(abs(e.error) for e in ests) / len(ests)
    lines.append(f"mean absolute error {mae:.1%} over {len(ests)} rows")
    text = "\n".join(lines)
    if show:
        print(text)
    return {"rows": ests, "mean_abs_error": mae, "efficiency": eff, "text": text}


def fit_efficiency(rows=None, *, grid=None) -> dict:
    """The A100 large-GEMM efficiency that minimises the mean absolute error over Table 1 ``rows``
    (default all), and the leave-one-out mean error.

    Returns:
        ``{"efficiency": float, "mean_abs_error": float, "loo_mean_abs_error": float}``.
    """
    rows = rows if rows is not None else table("megatron")
    grid = grid if grid is not None else [x / 100 for x in range(55, 91, 5)]
    errs = {g: [abs(estimate_megatron(r, efficiency=g).error) for r in rows] for g in grid}
    best = min(grid, key=lambda g: sum(errs[g]))
    loo = []
    for i in range(len(rows)):
        g_i = min(grid, key=lambda g: sum(e for j, e in enumerate(errs[g]) if j != i))
        loo.append(errs[g_i][i])
    return {"efficiency": best, "mean_abs_error": sum(errs[best]) / len(rows), "loo_mean_abs_error": sum(loo) / len(rows)}


def pipeline_seconds(p: int, m: int, v: int, forward, backward, send: float = 0.0, *, exact: bool = False) -> float:
    """Step time of 1F1B (``v = 1``) or interleaved 1F1B over ``m`` microbatches with per-virtual-stage
    ``forward`` / ``backward`` seconds and a ``send`` between stages (the clock ``estimate`` uses,
    :func:`shardlab.train.pipeline.clock`); unless ``exact``, clocked for ``2p`` and ``3p``
    microbatches and extended linearly (past the warm-up each microbatch adds the same time).

    Example:
        >>> pipeline_seconds(4, 64, 1, [1.0] * 4, [2.0] * 4) == pipeline_seconds(4, 64, 1, [1.0] * 4, [2.0] * 4, exact=True)
        True
    """
    return _clock("interleaved-1f1b" if v > 1 else "1f1b", p, m, v, tuple(forward), tuple(backward), send, exact=exact)
