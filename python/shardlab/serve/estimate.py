"""``estimate``: prefill and decode step times of a model on a mesh, with what bounds them.

The book's part 7 equation (1), with communication added from ``shardlab.cost``:

    decode step = B x KV bytes / (chips x W_hbm)                       attention: always HBM-bound
                + max(2 x B x params / (chips x peak),                 MLP / projections: compute
                      param bytes / (chips x W_hbm),                   ... or weight loading
                      collectives of the layout (shardlab.cost))       ... or ICI

    prefill     = max(FLOPs / (chips x peak), (weights + KV written) / (chips x W_hbm), ICI)

:class:`StepModel` holds the per-token pieces so the serving simulator prices every step with
the same numbers; :func:`estimate` returns an :class:`Estimate` with the memory, the largest
batch that fits and both step times.

Example:
    >>> from shardlab.models import presets
    >>> from shardlab.serve import estimate
    >>> e = estimate(presets.get("llama2-13b"), "tpu-v5e", {"x": 8}, batch=1, context=8192)
    >>> round(e.decode.seconds * 1e3, 2), e.decode.bound, e.max_batch
    (4.99, 'HBM', 15)
"""

from __future__ import annotations

import dataclasses
import math

import shardlab.cost as cost
import shardlab.hardware as hardware_presets
from shardlab import units
from shardlab.viz import Displayed
from shardlab.viz.serving import estimate_view
from shardlab.models import ModelConfig, kv_cache_bytes, param_count
from shardlab.models.dtypes import dtype_bytes

from .sharded import comm_bytes

__all__ = ["estimate", "Estimate", "StepTime", "StepModel", "DTYPES"]

DTYPES = ("params", "kv", "activations", "compute")


def _dtypes(dtypes) -> dict:
    if dtypes is None:
        dtypes = "bfloat16"
    if isinstance(dtypes, str):
        return {k: dtypes for k in DTYPES}
    bad = set(dtypes) - set(DTYPES)
    if bad:
        raise ValueError(f"[estimate] unknown dtype role(s) {sorted(bad)}; use {', '.join(DTYPES)}")
    out = {k: "bfloat16" for k in DTYPES}
    out.update(dtypes)
    return out


def _mesh_shape(mesh) -> dict:
    if isinstance(mesh, int) and not isinstance(mesh, bool):
        if mesh < 1:
            raise ValueError(f"[estimate] mesh {mesh} must be >= 1 chips")
        return {"x": mesh}
    if hasattr(mesh, "shape") and hasattr(mesh, "axis_names"):
        return dict(mesh.shape)
    if isinstance(mesh, dict) and mesh and all(isinstance(v, int) and v >= 1 for v in mesh.values()):
        return dict(mesh)
    raise ValueError(f"[estimate] mesh {mesh!r} must be a chip count, a {{axis: size}} dict or a Mesh")


@dataclasses.dataclass(frozen=True)
class StepTime:
    """One step: ``seconds`` and its parts; ``bound`` is "HBM", "compute" or "communication";
    ``kernel_seconds`` the fixed cost of the step's kernels (``StepModel(kernels_per_layer=)``)."""

    seconds: float
    kv_seconds: float
    weight_seconds: float
    compute_seconds: float
    comm_seconds: float
    bound: str
    tokens: int
    kernel_seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else math.inf


@dataclasses.dataclass(frozen=True)
class _PriceMesh:
    """The mesh shape ``cost.price_event`` needs for a collective (default physical links)."""

    shape: dict
    physical_axes: object = None


class StepModel:
    """Step-time pieces of ``cfg`` on ``chips`` of ``hardware`` under a layout.

    Args:
        cfg: a ModelConfig, or None with ``params`` and ``kv_bytes_per_token`` given (then
            communication is not modelled: the layout needs the model's shape).
        hardware: preset name or Hardware.
        mesh: chips, ``{axis: size}`` or a Mesh; its hardware axes price the collectives.
        dtypes: one dtype or ``{"params", "kv", "activations", "compute"}``.
        strategy: decode layout for the communication term (``shardlab.serve.sharded``).
        params: parameter count overriding ``param_count(cfg)`` (the book keeps 13e9 while
            shrinking the KV heads).
        kv_bytes_per_token: override of ``kv_cache_bytes(cfg, 1).total`` in the KV dtype.
        comm: price the layout's collectives (False: the book's equation (1) as printed).
        prices: the price list every piece is priced with (``shardlab.cost.price_list``):
            ``"ideal"`` (default: the peaks, the book's equation) or None for what the chip
            reaches (its own list), the same per-chip figures ``train.estimate`` uses.
        kernels_per_layer: GPU kernels each layer of a step launches, each costing the price
            list's ``graph_kernel_overhead`` (a step replayed as a CUDA graph): 0 (default, the
            book's equation), about 10-15 for a serving engine's fused kernels, 38-43 for eager
            PyTorch code (measured: 307-347 kernels for 8 layers). On an H200 this term brings the
            measured decode steps of ``train.data.gpu_measured.SERVE`` within 7 %.

    Example:
        >>> from shardlab.models import ModelConfig
        >>> cfg = ModelConfig(num_layers=8, d_model=4096, ffw_dim=14336, num_heads=32, vocab_size=32000)
        >>> m = StepModel(cfg, "h200", 1, prices=None, kernels_per_layer=347 / 8)
        >>> step = m.decode(1, 2049)          # measured on an H200 (CUDA graph): 1.84 ms
        >>> round(step.seconds * 1e3, 2), round(step.kernel_seconds * 1e3, 2)
        (1.85, 0.76)
    """

    def __init__(self, cfg: ModelConfig | None, hardware, mesh, dtypes=None, *, strategy: str = "megatron",
                 params: float | None = None, kv_bytes_per_token: float | None = None, comm: bool = True,
                 prices="ideal", kernels_per_layer: float = 0.0):
        self.cfg = cfg
        self.hw = hardware_presets.get(hardware)
        if self.hw is None:
            raise ValueError("[estimate] hardware is required, e.g. 'tpu-v5e'")
        self.mesh_shape = _mesh_shape(mesh)
        self.chips = math.prod(self.mesh_shape.values())
        self.dtypes = _dtypes(dtypes)
        self.strategy = strategy
        self.comm = comm
        if cfg is None and (params is None or kv_bytes_per_token is None):
            raise ValueError("[estimate] without a ModelConfig pass params= and kv_bytes_per_token=")
        if cfg is not None and comm and strategy in ("megatron", "moe") and cfg.num_heads % self.chips:
            raise ValueError(f"[estimate] num_heads {cfg.num_heads} is not divisible by the {self.chips} "
                             f"chips of the model-parallel mesh {self.mesh_shape}; use a mesh whose size "
                             f"divides {cfg.num_heads}")
        pc = param_count(cfg) if cfg is not None else None
        self.params = float(params if params is not None else pc.total)
        self.active_params = float(params if params is not None else pc.active)
        self.param_bytes = self.params * dtype_bytes(self.dtypes["params"], "estimate")
        self.kv_bytes_per_token = float(kv_bytes_per_token if kv_bytes_per_token is not None
                                        else kv_cache_bytes(cfg, 1, self.dtypes["kv"]).total)
        self.prices = cost.price_list(self.hw) if prices is None else cost.price_list(prices)
        self.peak, _ = cost.peak_flops(self.hw, self.dtypes["compute"])
        # one chip's rates through the one pricing function: the seconds of 1 byte of memory-bound
        # work and of 1 FLOP of matmul, without the per-kernel fixed cost (a step runs many kernels)
        unit = self.prices.kernel_overhead
        per_byte = (cost.price_event({"op": "elementwise", "hbm_bytes": 1e12}, self.hw, self.prices) - unit) / 1e12
        per_flop = (cost.price_event({"op": "matmul", "flops": 1e15, "dtype": self.dtypes["compute"]}, self.hw,
                                     self.prices) - unit) / 1e15
        self.hbm_bw = self.chips / per_byte
        self.flops = self.chips / per_flop
        self._price_mesh = _PriceMesh(self.mesh_shape)
        self.hbm_bytes = self.chips * self.hw.hbm_capacity
        self._comm: dict = {}
        if isinstance(kernels_per_layer, bool) or not isinstance(kernels_per_layer, (int, float)) \
                or not kernels_per_layer >= 0:
            raise ValueError(f"[estimate] kernels_per_layer={kernels_per_layer!r} must be a number >= 0 "
                             f"(about 10-15 for a serving engine's fused kernels, 40 for eager PyTorch)")
        if kernels_per_layer and cfg is None:
            raise ValueError("[estimate] kernels_per_layer needs the model's layers: pass a ModelConfig")
        #: fixed seconds of one step's kernels (0 unless kernels_per_layer is given)
        self.kernel_seconds = (cfg.num_layers * kernels_per_layer * self.prices.graph_kernel_overhead
                               if kernels_per_layer else 0.0)

    # -- pieces ---------------------------------------------------------------------------------
    def comm_seconds(self, batch_tokens: int) -> float:
        """Collectives of one step moving ``batch_tokens`` activation rows (0 on one chip)."""
        if self.cfg is None or not self.comm or self.chips == 1 or batch_tokens == 0:
            return 0.0
        if batch_tokens not in self._comm:
            rows = comm_bytes(self.cfg, self.strategy, self.mesh_shape, batch_tokens,
                              dtype_bytes(self.dtypes["activations"], "estimate"))
            t = 0.0
            for (op, axes), r in rows.items():
                n, v = r["group_size"], r["bytes_each"]
                event = {"op": op, "axes": tuple(axes) if not isinstance(axes, str) else (axes,), "group_size": n,
                         "bytes_in": v, "bytes_out": n * v if op == "all_gather" else v}
                t += r["calls"] * cost.price_event(event, self.hw, self.prices, mesh=self._price_mesh)
            self._comm[batch_tokens] = t
        return self._comm[batch_tokens]

    def _pieces(self, decode_batch, kv_tokens, prefill_tokens, attention_pairs, verify_tokens):
        """(tokens, KV, weight, compute, collective seconds) of one step."""
        tokens = decode_batch * verify_tokens + prefill_tokens
        t_kv = (kv_tokens + prefill_tokens) * self.kv_bytes_per_token / self.hbm_bw
        flops = 2.0 * tokens * self.active_params
        if self.cfg is not None:
            flops += 4.0 * self.cfg.num_layers * attention_pairs * self.cfg.num_heads * self.cfg.head_dim
        t_x = self._comm[tokens] if tokens in self._comm else self.comm_seconds(tokens)
        return tokens, t_kv, self.param_bytes / self.hbm_bw, flops / self.flops, t_x

    def step(self, decode_batch: int = 0, kv_tokens: float = 0.0, prefill_tokens: int = 0,
             attention_pairs: float = 0.0, verify_tokens: int = 1) -> StepTime:
        """One engine step: ``decode_batch`` sequences (``verify_tokens`` tokens each, > 1 when a
        speculative draft is checked) reading ``kv_tokens`` cached tokens, plus
        ``prefill_tokens`` prompt tokens whose causal attention covers ``attention_pairs``
        (query, key) pairs. Time = KV traffic + max(weights, FLOPs, collectives)."""
        tokens, t_kv, t_w, t_c, t_x = self._pieces(decode_batch, kv_tokens, prefill_tokens, attention_pairs,
                                                   verify_tokens)
        worst = max(t_w, t_c, t_x)
        if t_kv >= worst or worst == t_w:
            bound = "HBM"
        else:
            bound = "compute" if worst == t_c else "communication"
        fixed = self.kernel_seconds if tokens else 0.0
        return StepTime(t_kv + worst + fixed, t_kv, t_w, t_c, t_x, bound, tokens, fixed)

    def step_seconds(self, decode_batch: int = 0, kv_tokens: float = 0.0, prefill_tokens: int = 0,
                     attention_pairs: float = 0.0, verify_tokens: int = 1) -> float:
        """``step(...).seconds`` without building the StepTime (the simulator's hot path)."""
        tokens, t_kv, t_w, t_c, t_x = self._pieces(decode_batch, kv_tokens, prefill_tokens, attention_pairs,
                                                   verify_tokens)
        return t_kv + max(t_w, t_c, t_x) + (self.kernel_seconds if tokens else 0.0)

    def decode(self, batch: int, kv_tokens: float) -> StepTime:
        """A decode step of ``batch`` sequences holding ``kv_tokens`` cached tokens in all
        (the book's equation (1) plus collectives)."""
        return self.step(batch, kv_tokens)

    def prefill(self, tokens: int, batch: int = 1, context: int = 0) -> StepTime:
        """Prefill of ``tokens`` new tokens per sequence after ``context`` cached ones."""
        pairs = batch * tokens * (context + (tokens + 1) / 2)
        return self.step(0, batch * context, batch * tokens, pairs)

    def prefill_seconds(self, tokens: int, batch: int = 1, context: int = 0) -> float:
        """``prefill(...).seconds`` without building the StepTime."""
        return self.step_seconds(0, batch * context, batch * tokens, batch * tokens * (context + (tokens + 1) / 2))

    def max_batch(self, context: int) -> int:
        free = self.hbm_bytes - self.param_bytes
        if free < 0 or context <= 0:
            return 0
        return int(free // (context * self.kv_bytes_per_token))


@dataclasses.dataclass(frozen=True, repr=False)
class Estimate(Displayed):
    """What :func:`estimate` returns (bytes, seconds, tokens per second).

    Displays itself (Jupyter, ``rich.print``, ``print``) with bars of memory against HBM and of
    the decode step's parts (``shardlab.viz.serving``)."""

    model: str
    hardware: str
    mesh_shape: dict
    chips: int
    batch: int
    context: int
    dtypes: dict
    params: float
    param_bytes: float
    kv_bytes_per_token: float
    kv_bytes: float
    memory_bytes: float
    hbm_bytes: float
    max_batch: int
    prefill: StepTime
    decode: StepTime

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.hbm_bytes

    @property
    def ttft(self) -> float:
        return self.prefill.seconds

    def check_fits(self) -> "Estimate":
        """Raises ValueError saying by how much the batch misses, and the largest that fits."""
        if not self.fits:
            raise ValueError(
                f"[estimate] batch {self.batch} at context {self.context} needs {units.fmt_bytes(self.memory_bytes)} "
                f"(params {units.fmt_bytes(self.param_bytes)} + KV {units.fmt_bytes(self.kv_bytes)}) but {self.chips} x "
                f"{self.hardware} hold {units.fmt_bytes(self.hbm_bytes)}: short by "
                f"{units.fmt_bytes(self.memory_bytes - self.hbm_bytes)}; "
                f"the largest batch that fits is {self.max_batch}")
        return self

    def view(self):
        """The display: a ``shardlab.viz.View`` (``.save("estimate.png")`` and friends)."""
        return estimate_view(self)

    def text(self) -> str:
        """The figures as text (what ``print`` shows)."""
        return self.view().text

    def __repr__(self) -> str:
        return (f"<serve.Estimate {self.model} on {self.chips} x {self.hardware}: batch {self.batch} x {self.context}, "
                f"decode {units.fmt_seconds(self.decode.seconds)}/step, "
                f"{units.fmt_count(self.decode.tokens_per_s, 'tokens/s')}{'' if self.fits else ', does not fit'}>")


def estimate(cfg: ModelConfig | None, hardware, mesh, batch: int, context: int, dtypes=None, *,
             strategy: str = "megatron", prompt_len: int | None = None, params: float | None = None,
             kv_bytes_per_token: float | None = None, comm: bool = True, strict: bool = False, prices="ideal",
             kernels_per_layer: float = 0.0) -> Estimate:
    """Prefill and decode of ``batch`` sequences at ``context`` cached tokens.

    Args:
        cfg: the model (or None with ``params`` and ``kv_bytes_per_token``).
        hardware: preset name ("tpu-v5e", "h100", ...).
        mesh: chips, ``{axis: size}`` or a Mesh.
        batch: sequences decoded together.
        context: tokens in each sequence's KV cache during decode.
        dtypes: "bfloat16", "int8", ... or ``{"params", "kv", "activations", "compute"}``.
        strategy: the decode layout whose collectives are priced.
        prompt_len: prefill length (default ``context``).
        params, kv_bytes_per_token: overrides (see :class:`StepModel`).
        comm: price the collectives (False reproduces the book's tables, which leave ICI out).
        strict: raise (with the shortfall) when the batch does not fit in HBM.
        prices, kernels_per_layer: what the chip reaches and the step's kernels (see
            :class:`StepModel`; the defaults give the book's equation).
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"[estimate] batch {batch!r} must be an int >= 1")
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ValueError(f"[estimate] context {context!r} must be an int >= 1")
    if cfg is not None and not isinstance(cfg, ModelConfig):
        raise TypeError(f"[estimate] expected a ModelConfig, got {type(cfg).__name__}")
    m = StepModel(cfg, hardware, mesh, dtypes, strategy=strategy, params=params,
                  kv_bytes_per_token=kv_bytes_per_token, comm=comm, prices=prices, kernels_per_layer=kernels_per_layer)
    kv = batch * context * m.kv_bytes_per_token
    est = Estimate(model=(cfg.name or "model") if cfg is not None else f"{units.fmt_params(m.params)} model",
                   hardware=m.hw.name, mesh_shape=m.mesh_shape, chips=m.chips, batch=batch, context=context,
                   dtypes=m.dtypes, params=m.params, param_bytes=m.param_bytes,
                   kv_bytes_per_token=m.kv_bytes_per_token, kv_bytes=kv, memory_bytes=m.param_bytes + kv,
                   hbm_bytes=m.hbm_bytes, max_batch=m.max_batch(context),
                   prefill=m.prefill(prompt_len or context, batch), decode=m.decode(batch, batch * context))
    return est.check_fits() if strict else est
