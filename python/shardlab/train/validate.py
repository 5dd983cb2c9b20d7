"""Validation against measurements nobody here produced: Megatron-LM's GPT runs on A100s.

Narayanan et al. 2021 (SC21, Table 1; :mod:`shardlab.train.data.megatron_table1`) report the
teraFLOP/s per GPU that Megatron-LM reached for GPT models of 1.7B to 1T parameters on NVIDIA
Selene with tensor (t), pipeline (p) and data (d) parallelism. :func:`estimate_megatron` predicts
that number for a row, and :func:`validate_megatron` prints paper, ours and the error per row.

How a row is estimated (nothing is fitted per row):

1. **One layer executed.** :func:`shardlab.train.estimate` runs one training step of a one-layer
   GPT of the row's width (learned positions, LayerNorm, GeLU, biases, tied embeddings) in
   abstract mode on a ``(data, model)`` mesh of A100s (:data:`A100`): Megatron TP (f/g
   all-reduces) over ``model`` inside a node (NVLink), the data axes over InfiniBand (and
   NVLink for the data-parallel peers that share a node), one microbatch per replica, full
   activation recomputation, fp16/bf16. Its ledger gives, per layer and per microbatch, the
   matmul and attention seconds of the forward, the recompute and the backward, the TP
   all-reduce seconds of each (on the critical path: Megatron does not overlap them), the
   head's and the embedding's seconds, and the data-parallel gradient all-reduce per layer.
2. **Attention as Megatron ran it.** Megatron (2021) formed the full ``s x s`` scores and
   masked them, so its attention costs the non-causal FLOPs; the executed causal attention is
   scaled by ``flops_per_token(causal=False).attention / flops_per_token(causal=True).attention``.
3. **The pipeline clocked.** Each of the ``p·v`` virtual stages holds ``l/(p·v)`` layers (the
   embedding on the first, the output head on the last); the row's schedule (1F1B, or
   interleaved 1F1B with ``v`` chunks from ``--num-layers-per-virtual-pipeline-stage``) over
   ``m = B / (d·b)`` microbatches is clocked by :func:`shardlab.train.pipeline.clock`, with a
   point-to-point send of ``b·s·h`` fp16 values between stages (Megatron's scatter/gather: 1/t
   of it per GPU over InfiniBand, then an NVLink all-gather).
4. **Data parallelism.** The gradient all-reduce of one stage's parameters over ``d``:
   overlapped with the last microbatch's backward pass for PyTorch DDP (rows with p = 1), after
   the pipeline flush for Megatron's "local" DDP (p > 1), as the paper's script configures.
5. **Elementwise work at HBM bandwidth.** LayerNorm, GeLU, bias adds, dropout, the residual adds
   and the masked softmax are not matmuls; the ledger does not price them. Megatron's own count
   of the bytes they produce per layer (Korthikanti et al. 2022, "Reducing Activation
   Recomputation in Large Transformer Models", section 4.1, with tensor parallelism:
   ``s·b·h·(10 + 24/t + 5·a·s/(h·t))`` bytes, the ``5as²b`` term being the softmax and dropout of
   the fp16 attention scores) is moved :data:`ELEMENTWISE_PASSES` = 8 times at the A100's HBM
   bandwidth: written and read once in the forward pass (2), again in the recomputed forward (2),
   and in the backward pass the saved value and the incoming gradient read and the outgoing
   gradient written and read (4). This count is stated, not fitted.
6. **One efficiency assumption.** Matmul and attention seconds from the cost model are at the
   A100's 312 TFLOP/s peak; cuBLAS reaches less. One factor :data:`EFFICIENCY` divides every
   matmul and attention second of every row. It is the single value that minimises the mean
   error over the table (:func:`fit_efficiency`); its leave-one-out error is reported next to
   it, so it is not a per-row constant.

The per-GPU teraFLOP/s is then the paper's own count, ``96·B·s·l·h²·(1 + s/6h + V/16lh)``
FLOPs per iteration (:func:`paper_flops`; recompute included, equal to
``flops_per_token(cfg, s, causal=False, remat="full")``), divided by the iteration time and the
GPUs.

Example:
    >>> from shardlab.train import validate
    >>> row = validate.table()[0]
    >>> row["params_b"], validate.paper_flops(row) == 96 * 512 * 2048 * 24 * 2304**2 * (1 + 2048 / (6 * 2304) + 51200 / (16 * 24 * 2304))
    (1.7, True)
"""

from __future__ import annotations

import dataclasses
import functools

from shardlab import hardware as hw_mod
from shardlab.models import ModelConfig, flops_per_token

from . import pipeline as pp
from .data import megatron_table1 as _table1
from .estimate import estimate
from .strategy import Strategy

__all__ = ["A100", "EFFICIENCY", "ELEMENTWISE_PASSES", "activation_bytes", "MegatronEstimate", "table", "gpt_config", "paper_flops", "estimate_megatron",
           "validate_megatron", "fit_efficiency", "pipeline_seconds"]

#: NVIDIA A100 SXM 80 GB (the "a100" preset), the GPU of the paper's Selene runs. Sources (docs/hardware.md):
#: 312 TFLOP/s dense fp16/bf16 tensor core, 624 int8, 19.5 fp32 (non-tensor), 80 GB HBM2e at
#: 2.039 TB/s (NVIDIA A100 datasheet, SXM 80GB column); NVLink 3: 12 links x 25 GB/s per direction
#: = 300 GB/s one-way, 600 GB/s bidirectional per GPU (A100 datasheet; NVIDIA Ampere architecture
#: whitepaper); 8 GPUs per DGX A100 node with 8 Mellanox HDR InfiniBand 200 Gb/s HCAs for
#: compute traffic = 25 GB/s per GPU (DGX A100 user guide; the paper, section 5: "eight NVIDIA
#: Mellanox 200Gbps HDR Infiniband HCAs for application communication"). Latencies are the same
#: order-of-magnitude assumptions as the H100 preset (1 µs NVLink, 2 µs InfiniBand).
A100 = hw_mod.get("a100")  # the preset (cpp/src/hardware.cpp) holds the figures above

#: The fraction of the cost model's peak-rate matmul and attention seconds the GPUs reach (one
#: number for every row; :func:`fit_efficiency` derives it, docs/train.md reports its
#: leave-one-out error).
EFFICIENCY = 0.63

#: How many times the elementwise ops move their activation bytes per layer and microbatch
#: (forward 2, recomputed forward 2, backward 4); see the module docstring.
ELEMENTWISE_PASSES = 8


def table() -> list[dict]:
    """The rows of Narayanan et al. 2021, Table 1 (a copy; see :mod:`shardlab.train.data.megatron_table1`)."""
    return [dict(r) for r in _table1.ROWS]


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


@dataclasses.dataclass
class MegatronEstimate:
    """One row predicted: the iteration's seconds and where they go, and TFLOP/s per GPU."""

    row: dict
    iteration_seconds: float
    tflops_per_gpu: float
    parts: dict              # seconds: pipeline (clocked), dp_exposed; per microbatch and layer: compute, tp
    bubble_fraction: float   # idle share of the clocked pipeline
    microbatches: int
    virtual_stages: int

    @property
    def error(self) -> float:
        """(ours − paper) / paper."""
        return self.tflops_per_gpu / self.row["tflops_per_gpu"] - 1


def _mesh(t: int, d: int, hardware) -> tuple[dict, tuple]:
    """The (data..., model) mesh: TP inside a node, the data-parallel peers that share the node on
    NVLink, the rest across nodes on InfiniBand."""
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


def _sum(events, pred) -> float:
    return sum(e["seconds"] or 0.0 for e in events if pred(e))


def _scope(e) -> str:
    return (e.get("label") or "").split("/")[0]


def _ledger_parts(row: dict, hardware) -> dict:
    """Seconds per microbatch from the executed one-layer step (see the module docstring)."""
    return dict(_ledger_parts_cached(tuple(sorted(row.items())), hardware))


@functools.lru_cache(maxsize=64)
def _ledger_parts_cached(items: tuple, hardware) -> dict:
    row = dict(items)
    t, p = row["t"], row["p"]
    d, b, s = row["gpus"] // (t * p), row["microbatch"], _table1.SEQ_LEN
    cfg1 = gpt_config(row, num_layers=1)
    mesh, data = _mesh(t, d, hardware)
    strat = Strategy("megatron", data=data, model="model" if t > 1 else None)
    e = estimate(cfg1, strat, mesh, hardware, batch=b * d, seq=s, remat="full")
    ev = e.ledger.events
    causal, full = flops_per_token(cfg1, s, causal=True), flops_per_token(cfg1, s, causal=False)
    attn_scale = full.attention / causal.attention
    data_set = set(data)

    def compute(scope, phases):
        return sum((x["seconds"] or 0.0) * (attn_scale if x["op"].startswith("attention") else 1.0)
                   for x in ev if not x["axes"] and _scope(x) == scope and x["phase"] in phases)

    def tp(scope, phases):
        return _sum(ev, lambda x: x["axes"] == ("model",) and _scope(x) == scope and x["phase"] in phases)

    def dp(scope):
        return _sum(ev, lambda x: x["axes"] and set(x["axes"]) <= data_set and _scope(x) == scope
                    and x["phase"] == "backward")

    fwd, back = ("forward",), ("recompute", "backward")
    return {"layer_fwd_compute": compute("layer0", fwd), "layer_bwd_compute": compute("layer0", back),
            "layer_fwd_tp": tp("layer0", fwd), "layer_bwd_tp": tp("layer0", back),
            "head_fwd_compute": compute("head", fwd), "head_bwd_compute": compute("head", back),
            "head_fwd_tp": tp("head", fwd), "head_bwd_tp": tp("head", back),
            "embed_fwd": compute("embed", fwd) + tp("embed", fwd), "embed_bwd": compute("embed", back) + tp("embed", back),
            "layer_dp": dp("layer0"), "embed_dp": dp("embed") + dp("head")}


def activation_bytes(row: dict) -> float:
    """Bytes the elementwise ops of one layer write for one microbatch on one GPU (Korthikanti et
    al. 2022, tensor parallelism without sequence parallelism): ``s·b·h·(10 + 24/t + 5·a·s/(h·t))``."""
    s, b, h, a, t = _table1.SEQ_LEN, row["microbatch"], row["hidden"], row["heads"], row["t"]
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


def _send_seconds(row: dict, hardware) -> float:
    """One activation (or gradient) between pipeline stages: b·s·h fp16 values, 1/t of them per GPU
    over InfiniBand and an NVLink all-gather of the rest (Megatron's scatter/gather)."""
    t, b, h, s = row["t"], row["microbatch"], row["hidden"], _table1.SEQ_LEN
    nbytes = 2 * b * s * h
    ib = nbytes / t / hardware.ib_bandwidth + hardware.ib_latency
    nv = (t - 1) / t * nbytes / hardware.nvlink_bandwidth + (t - 1) * hardware.hop_latency if t > 1 else 0.0
    return ib + nv


@functools.lru_cache(maxsize=64)
def _schedule(p: int, m: int, v: int):
    sched = pp.interleaved_1f1b(p, m, v) if v > 1 else pp.one_f_one_b(p, m)
    pp.validate(sched)
    return sched


def _clock(p, m, v, fwd, bwd, send) -> float:
    return pp.clock(_schedule(p, m, v), pp.Durations(forward=list(fwd), backward=list(bwd), send=send),
                    check=False).step_time


def pipeline_seconds(p: int, m: int, v: int, forward, backward, send: float = 0.0, *, exact: bool = False) -> float:
    """Step time of 1F1B (``v = 1``) or interleaved 1F1B over ``m`` microbatches with per-virtual-stage
    ``forward`` / ``backward`` seconds and a ``send`` between stages, from
    :func:`shardlab.train.pipeline.clock`.

    Past the warm-up every microbatch adds the same time, so unless ``exact`` the schedule is
    clocked for ``2p`` and ``3p`` microbatches and extended linearly to ``m`` (tests check it
    equals the full clock).

    Example:
        >>> pipeline_seconds(4, 64, 1, [1.0] * 4, [2.0] * 4) == pipeline_seconds(4, 64, 1, [1.0] * 4, [2.0] * 4, exact=True)
        True
    """
    fwd, bwd = tuple(forward), tuple(backward)
    if exact or m <= 3 * p:
        return _clock(p, m, v, fwd, bwd, send)
    t2, t3 = _clock(p, 2 * p, v, fwd, bwd, send), _clock(p, 3 * p, v, fwd, bwd, send)
    return t2 + (m - 2 * p) * (t3 - t2) / p


_ROW_KEYS = ("params_b", "heads", "hidden", "layers", "t", "p", "gpus", "batch", "tflops_per_gpu", "microbatch",
             "layers_per_virtual_stage", "ddp")


def estimate_megatron(row: dict, *, efficiency: float = EFFICIENCY, elementwise_passes: float = ELEMENTWISE_PASSES,
                      hardware=A100, _parts=None) -> MegatronEstimate:
    """Predicts a Table 1 row's teraFLOP/s per GPU (see the module docstring for the model).

    Args:
        row: a dict from :func:`table`.
        efficiency: the fraction of peak the matmul and attention seconds run at.
        elementwise_passes: times the elementwise ops move :func:`activation_bytes` (0 leaves
            them out).
        hardware: the GPU (default :data:`A100`).

    Example:
        >>> from shardlab.train import validate
        >>> e = validate.estimate_megatron(validate.table()[3])      # 18.4B, t = 8, p = 1
        >>> e.microbatches, e.virtual_stages, abs(e.error) < 0.1
        (4, 1, True)
    """
    if not 0 < efficiency <= 1:
        raise ValueError(f"[estimate_megatron] efficiency {efficiency!r} must be in (0, 1]")
    missing = [k for k in _ROW_KEYS if k not in row] if isinstance(row, dict) else None
    if missing is None or missing:
        what = f"lacks {missing}" if missing else f"is a {type(row).__name__}"
        raise TypeError(f"[estimate_megatron] a row is a dict like those of validate.table(); this one {what}")
    hw = hw_mod.get(hardware)
    t, p, l = row["t"], row["p"], row["layers"]
    d = row["gpus"] // (t * p)
    b = row["microbatch"]
    m = row["batch"] // (d * b)
    if m * d * b != row["batch"] or d * t * p != row["gpus"]:
        raise ValueError(f"[estimate_megatron] row {row['params_b']}B: batch {row['batch']} is not "
                         f"d·b·m = {d}·{b}·m or GPUs {row['gpus']} != t·p·d")
    lps = row["layers_per_virtual_stage"]
    v = (l // p) // lps if lps else 1
    parts = _parts if _parts is not None else _ledger_parts(row, hw)
    inv = 1.0 / efficiency
    per_chunk = l / (p * v)
    ew = elementwise_passes * activation_bytes(row) / hw.hbm_bandwidth
    fwd_layer = parts["layer_fwd_compute"] * inv + ew * 2 / 8 + parts["layer_fwd_tp"]
    bwd_layer = parts["layer_bwd_compute"] * inv + ew * 6 / 8 + parts["layer_bwd_tp"]
    n = p * v
    fwd = [per_chunk * fwd_layer] * n
    bwd = [per_chunk * bwd_layer] * n
    fwd[0] += parts["embed_fwd"] * inv
    bwd[0] += parts["embed_bwd"] * inv
    fwd[-1] += parts["head_fwd_compute"] * inv + parts["head_fwd_tp"]
    bwd[-1] += parts["head_bwd_compute"] * inv + parts["head_bwd_tp"]
    send = _send_seconds(row, hw) if p > 1 else 0.0
    step = pipeline_seconds(p, m, v, fwd, bwd, send)
    busy = max(sum(fwd[k] + bwd[k] for k in range(dev, n, p)) for dev in range(p)) * m
    # data parallelism: the last stage's gradients (its layers + the tied head / embedding)
    dp = parts["layer_dp"] * (l / p) + parts["embed_dp"]
    if row["ddp"] == "torch":  # overlapped with the last microbatch's backward pass
        dp_exposed = max(0.0, dp - sum(bwd))
    else:
        dp_exposed = dp
    seconds = step + dp_exposed
    tflops = paper_flops(row) / (seconds * row["gpus"]) / 1e12
    return MegatronEstimate(row, seconds, tflops,
                            {"pipeline": step, "dp_exposed": dp_exposed, "dp": dp, "send": send,
                             "layer_compute": (parts["layer_fwd_compute"] + parts["layer_bwd_compute"]) * inv,
                             "layer_elementwise": ew, "layer_tp": parts["layer_fwd_tp"] + parts["layer_bwd_tp"]},
                            max(0.0, 1 - busy / step), m, v)


def _all_parts(rows, hardware) -> list:
    return [_ledger_parts(r, hw_mod.get(hardware)) for r in rows]


def fit_efficiency(rows=None, *, elementwise_passes: float = ELEMENTWISE_PASSES, hardware=A100, grid=None) -> dict:
    """The one efficiency that minimises the mean absolute error over ``rows`` (default: the
    whole table), and the leave-one-out mean error (each row predicted with the efficiency fitted
    on the others).

    Returns:
        ``{"efficiency": float, "mean_abs_error": float, "loo_mean_abs_error": float}``.

    Example:
        >>> from shardlab.train import validate
        >>> fit = validate.fit_efficiency(validate.table()[:3], grid=[0.6, 0.63, 0.66])
        >>> fit["efficiency"] in (0.6, 0.63, 0.66), fit["mean_abs_error"] < 0.05
        (True, True)
    """
    rows = rows if rows is not None else table()
    parts = _all_parts(rows, hardware)
    grid = grid if grid is not None else [x / 100 for x in range(40, 101)]
    errs = {g: [abs(estimate_megatron(r, efficiency=g, elementwise_passes=elementwise_passes, hardware=hardware,
                                      _parts=pa).error)
                for r, pa in zip(rows, parts)] for g in grid}
    best = min(grid, key=lambda g: sum(errs[g]))
    loo = []
    for i in range(len(rows)):
        g_i = min(grid, key=lambda g: sum(e for j, e in enumerate(errs[g]) if j != i))
        loo.append(errs[g_i][i])
    return {"efficiency": best, "mean_abs_error": sum(errs[best]) / len(rows), "loo_mean_abs_error": sum(loo) / len(rows)}


def validate_megatron(*, efficiency: float = EFFICIENCY, elementwise_passes: float = ELEMENTWISE_PASSES,
                      hardware=A100, rows=None, show: bool = True) -> dict:
    """Predicts every Table 1 row and prints paper TFLOP/s, ours and the error.

    Returns:
        ``{"rows": [MegatronEstimate, ...], "mean_abs_error": float, "efficiency": float, "text": str}``.

    Example:
        >>> from shardlab import train
        >>> out = train.validate_megatron(show=False)
        >>> len(out["rows"]), round(out["mean_abs_error"], 3)
        (10, 0.024)
    """
    rows = rows if rows is not None else table()
    ests = [estimate_megatron(r, efficiency=efficiency, elementwise_passes=elementwise_passes, hardware=hardware)
            for r in rows]
    lines = [f"Megatron-LM on A100 (Narayanan et al. 2021, Table 1); matmuls at {efficiency:.0%} of peak, "
             f"elementwise bytes x {elementwise_passes:g} at HBM bandwidth",
             f"{'params':>8} {'t':>2} {'p':>3} {'d':>3} {'v':>2} {'m':>4} {'paper':>6} {'ours':>6} {'error':>7} "
             f"{'bubble':>7} {'TP/layer':>9}"]
    for e in ests:
        r = e.row
        tp_share = e.parts["layer_tp"] / (e.parts["layer_tp"] + e.parts["layer_compute"] + e.parts["layer_elementwise"])
        lines.append(f"{r['params_b']:>7}B {r['t']:>2} {r['p']:>3} {r['gpus'] // (r['t'] * r['p']):>3} "
                     f"{e.virtual_stages:>2} {e.microbatches:>4} {r['tflops_per_gpu']:>6} {e.tflops_per_gpu:>6.1f} "
                     f"{e.error:>+7.1%} {e.bubble_fraction:>7.1%} {tp_share:>9.1%}")
    mae = sum(abs(e.error) for e in ests) / len(ests)
    lines.append(f"mean absolute error {mae:.1%} over {len(ests)} rows")
    text = "\n".join(lines)
    if show:
        print(text)
    return {"rows": ests, "mean_abs_error": mae, "efficiency": efficiency, "text": text}
