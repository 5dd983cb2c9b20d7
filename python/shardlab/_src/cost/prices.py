"""What each chip reaches, as data: one :class:`PriceList` per hardware preset, each figure with
its source (docs/hardware.md, "What each chip reaches").

A :class:`~shardlab.hardware.Hardware` holds peaks; a price list holds the fraction of them real
kernels reach:

* **matmul**: a GEMM of ``F`` FLOPs moving ``B`` HBM bytes takes
  ``max(F / (e · peak), B / (h · W_hbm)) + t_kernel``: ``e`` the efficiency of a large GEMM,
  ``h`` the reached HBM fraction and ``t_kernel`` the fixed cost of one kernel. The shape enters
  through ``B`` (skinny GEMMs move more bytes per FLOP) and ``t_kernel`` (small GEMMs are
  dominated by it). With ``e`` = Bekman's burst MAMF (:data:`MAMF`) these three numbers
  reproduce XLA's 24 measured H100 GEMM shapes of ``matmul_interpolator_data.h`` (256 to 4096 on
  a side, 11 to 783 TFLOP/s) with a mean error of 4.8 % (worst 18 %). A training step sustains
  less than the burst: ``e`` in the lists is the one fitted constant per chip (GPUs: MAMF x
  0.806, the A100's ratio fitted on Megatron-LM's Table 1; TPUs: fitted on MaxText's
  single-slice rows), with the other tables held out;
* **attention**: FlashAttention's forward and backward reach their own fractions of the peak;
* **memory-bound work** (norms, activations, softmax, rotary, the loss, the optimizer update,
  casts): bytes over the reached HBM bandwidth, plus ``t_kernel`` per kernel on GPUs;
* **collectives**: the link-level model's bandwidth term over the fraction of the link
  bandwidth NCCL or the ICI reach on large messages (bus bandwidth / link bandwidth), its
  latency term, plus a fixed ``collective_overhead`` per call (NCCL's small-message time); the
  bus bandwidth a message of ``V`` bytes reaches, ``V / (overhead + max(latency, V / (e · W)))``,
  rises with ``V`` as NCCL-tests' tables do. A link may also cost ``step_overhead[link]`` per
  step of the ring (a ring all-reduce over ``n`` members takes ``2(n - 1)`` steps, a gather or
  scatter ``n - 1``, a permute 1): the per-message cost of the TPUs' data-centre network, where
  every send is a host-driven DMA over TCP (fitted on MaxText's v5e multi-slice rows,
  :data:`DCN_STEP_OVERHEAD`).

:data:`IDEAL` is the book's price list: every fraction 1, no fixed cost (the ledger's own
``seconds`` are priced with it).

Example:
    >>> from shardlab import cost
    >>> p = cost.price_list("h100")
    >>> p.matmul_efficiency["bfloat16"], p.kernel_overhead
    (0.647, 5.75e-06)
    >>> cost.price_list("tpu-v5p").dcn_slice_bandwidth * 8 / 1e12    # Tbps one v5p slice reaches over the DCN
    4.8
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..core import hardware as _hw

__all__ = ["PriceList", "IDEAL", "price_list", "PRICE_LISTS", "MAMF", "DCN_STEP_OVERHEAD", "DCN_SLICE_BANDWIDTH"]


_LINKS = ("ici", "dcn", "nvlink", "ib", "custom")   # the link kinds of shardlab.hardware.AxisLink


@dataclasses.dataclass(frozen=True)
class PriceList:
    """The fractions of its peaks one chip reaches, and the fixed costs, with their sources.

    Attributes:
        chip: the preset name the figures were measured on ("ideal" for :data:`IDEAL`).
        matmul_efficiency: dtype class ("bfloat16", "float8", "float32", "int8") -> fraction of
            the peak a large GEMM reaches; a dtype not listed uses the bf16 figure.
        kernel_overhead: seconds every GPU kernel costs besides its FLOPs and bytes (launch and
            tail); 0 on TPUs, where XLA fuses the step into few programs.
        hbm_efficiency: fraction of the HBM bandwidth copies and memory-bound kernels reach.
        attention_efficiency: (forward, backward) fraction of the peak FlashAttention reaches.
        collective_efficiency: link kind ("nvlink", "ib", "ici", "dcn") -> bus bandwidth of a
            large collective over the link's bandwidth.
        collective_overhead: seconds per collective call besides latency and bandwidth.
        step_overhead: link kind ("dcn", ...) -> seconds each step of a collective's ring on
            that link costs besides its bytes (:meth:`steps` counts them); added to the
            collective's time. Only the TPU lists have one (the DCN's, fitted).
        dcn_slice_bandwidth: bytes per second one TPU slice reaches over the DCN to the other
            slices, shared by its chips: a collective over a DCN axis runs at the lesser of the
            chip's DCN figure and this over the slice's chips (``0``: no limit besides the
            chips' own). v5e's is Google's "data center network bandwidth per Pod", v5p's fitted.
        graph_kernel_overhead: seconds each kernel of a step replayed as a CUDA graph costs besides
            its work (the launch is recorded once; the kernel's ramp, tail and the gap to the next
            remain): what a serving engine's decode step pays per kernel
            (``serve.StepModel(kernels_per_layer=)``); 0 on TPUs.
        sources: field -> where the figure comes from ("assumed: ..." when nothing was published).
    """

    chip: str
    matmul_efficiency: Mapping = dataclasses.field(default_factory=lambda: {"bfloat16": 1.0})
    kernel_overhead: float = 0.0
    hbm_efficiency: float = 1.0
    attention_efficiency: tuple = (1.0, 1.0)
    collective_efficiency: Mapping = dataclasses.field(default_factory=dict)
    collective_overhead: float = 0.0
    graph_kernel_overhead: float = 0.0
    step_overhead: Mapping = dataclasses.field(default_factory=dict)
    dcn_slice_bandwidth: float = 0.0
    sources: Mapping = dataclasses.field(default_factory=dict, compare=False)

    def __post_init__(self):
        op = "PriceList"
        fracs = dict(self.matmul_efficiency)
        fracs.update({f"attention[{i}]": v for i, v in enumerate(self.attention_efficiency)})
        fracs.update({f"collective_efficiency[{k}]": v for k, v in self.collective_efficiency.items()})
        fracs["hbm_efficiency"] = self.hbm_efficiency
        for k, v in fracs.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise ValueError(f"[{op}] {k} = {v!r}: a fraction of the peak must be in (0, 1]")
        for k, v in (("kernel_overhead", self.kernel_overhead), ("collective_overhead", self.collective_overhead),
                     ("graph_kernel_overhead", self.graph_kernel_overhead),
                     ("dcn_slice_bandwidth", self.dcn_slice_bandwidth)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"[{op}] {k} = {v!r} must be a number >= 0")
        for k, v in self.step_overhead.items():
            if k not in _LINKS:
                raise ValueError(f"[{op}] step_overhead has a link {k!r}: use one of {', '.join(_LINKS)}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"[{op}] step_overhead[{k!r}] = {v!r} must be a number of seconds >= 0")
        if len(self.attention_efficiency) != 2:
            raise ValueError(f"[{op}] attention_efficiency = {self.attention_efficiency!r}: give (forward, backward)")
        object.__setattr__(self, "_key", (self.chip, tuple(sorted(self.matmul_efficiency.items())),
                                          self.kernel_overhead, self.hbm_efficiency, tuple(self.attention_efficiency),
                                          tuple(sorted(self.collective_efficiency.items())),
                                          self.collective_overhead, self.graph_kernel_overhead,
                                          tuple(sorted(self.step_overhead.items())), self.dcn_slice_bandwidth))

    def __hash__(self):
        return hash(self._key)

    def matmul(self, dtype: str) -> float:
        """The large-GEMM efficiency for ``dtype`` (bf16-class, float8, float32, int8)."""
        d = str(dtype)
        key = "float8" if d.startswith("float8") else {"float16": "bfloat16", "uint8": "int8"}.get(d, d)
        return self.matmul_efficiency.get(key, self.matmul_efficiency.get("bfloat16", 1.0))

    def collective(self, link: str) -> float:
        """The fraction of ``link``'s bandwidth ("nvlink", "ib", "ici:x", "dcn") a large collective reaches."""
        return self.collective_efficiency.get(link.split(":")[0], 1.0)

    def steps(self, op: str, links) -> float:
        """Seconds the ring steps of collective ``op`` over ``links`` (``CollectiveCost.links``)
        cost by :attr:`step_overhead`: per link with an overhead, ``2(n - 1)`` steps for an
        all-reduce, ``n - 1`` for a gather, scatter or all-to-all, 1 for a permute.

        Example:
            >>> from shardlab import cost
            >>> p = cost.price_list("tpu-v5e")
            >>> c = cost.collective_time("psum", 1e6, axes="dcn", mesh_shape={"dcn": 4}, hardware="tpu-v5e",
            ...                          physical_axes={"dcn": "dcn"})
            >>> p.steps("psum", c.links) == 6 * p.step_overhead["dcn"]
            True
        """
        if not self.step_overhead:
            return 0.0
        total = 0.0
        for link in links:
            per = self.step_overhead.get(link.link.split(":")[0], 0.0)
            if per:
                n = link.size
                total += per * (2 * (n - 1) if op in ("psum", "pmean", "pmax", "pmin", "all_reduce")
                                else 1 if op == "ppermute" else n - 1)
        return total

    def replace(self, **changes) -> "PriceList":
        """A copy with some figures changed (a what-if: ``p.replace(hbm_efficiency=0.8)``)."""
        return dataclasses.replace(self, **changes)


#: The book's prices: every peak reached, no fixed cost.
IDEAL = PriceList("ideal", sources={"all": "the preset's peaks (How to Scale Your Model's rooflines)"})

# Sources, cited by key in each list's `sources` (docs/hardware.md lists them in full).
_MAMF = ("S. Bekman, Machine Learning Engineering, 'Maximum Achievable Matmul FLOPS comparison table' "
         "(github.com/stas00/ml-engineering compute/accelerator/README.md): bf16 A100 SXM 271.2/312, "
         "H100 SXM 794.5/989 ('H200 is the same'), B200 SXM 1745/2250; fp8 H100 1402.6/1979, "
         "H200 1453.4/1979, B200 3432.5/4500")
_XLA = ("OpenXLA xla/service/gpu/model/matmul_interpolator_data.h, measured GEMM FLOP/s per (b, m, n, k) "
        "for sm_90 (H100) and sm_100 (B200): 256^3-class GEMMs take 5-6 us whatever their FLOPs; fitted "
        "max(F/(e peak), B/(h W)) + t_kernel over 24 sm_90 bf16 shapes: e 0.81, h 0.9, t_kernel 5.75 us")
_FA2 = ("T. Dao, FlashAttention-2 (arXiv:2307.08691), section 4.1: A100 forward up to 73 % of peak, "
        "backward up to 63 %; at head dim 128 and 2k-8k tokens forward ~70 %, backward ~55-60 %")
_FA3 = ("J. Shah et al., FlashAttention-3 (arXiv:2407.08608): H100 bf16 forward up to 740 TFLOP/s (75 %), "
        "backward 1.5-1.75x FlashAttention-2, ~ 50 % of peak at head dim 128")
_NCCL = ("NCCL-tests all_reduce_perf reference bus bandwidths (docs.alayanew.com 'NCCL-tests in practice'): "
         "8xA100 SXM4 NVLink 230-250 GB/s of 300, 8xH100 SXM5 460-480 GB/s with NVLS (ring ~ 360 of 450)")
_NIC = "assumed: NCCL multi-node bus bandwidth ~ 85 % of the NIC line rate (HDR 200 Gb/s, NDR 400 Gb/s)"
_HBM = "assumed: copy / memory-bound kernels reach ~ 90 % of HBM (the H100 GEMM fit above gives h = 0.9)"
_NCCL_T = "assumed: NCCL small-message all-reduce time on one node ~ 10 us (nccl-tests 8 B rows)"
_GRAPH = ("measured (shardlab benchmarks/device/measure_gpu.py, 2026-11-27, NVIDIA H200, PyTorch 2.11): a decode "
          "step of 8 LLaMA-2-7B-shaped layers replayed as a CUDA graph, 347 kernels, batch 1 at a 2,048-token "
          "context: 1.84 ms against 1.08 ms of weight and KV traffic, 2.2 us a kernel (batches 16 and 64 held out: "
          "2.7 and 2.6 us); the H100 and the other GPUs assumed the same")
_TPU_ICI = "How to Scale Your Model, part 3: ICI collectives run near the link bandwidth (95 % assumed)"
_DCN_STEP = ("fitted on the 20 multi-slice rows of MaxText's v5e table (the DCN gradient all-reduce on the "
             "critical path, a cost per ring step and message besides the bytes); the 8 v5p multi-slice rows held out; "
             "the same figure for every TPU")
_DCN_POD = ("Google Cloud TPU v5e system architecture (cloud.google.com/tpu/docs/v5e): 'Data center network "
            "bandwidth per Pod 6.4 Tbps' (256 chips: their per-chip 3.125 GB/s, so it binds only smaller shares)")
_DCN_SLICE_V5P = ("fitted on the 8 multi-slice rows of MaxText's v5p table (train.validate.fit(..., "
                  "constant='dcn_slice_bandwidth'): 4.8 Tbps a slice; Google documents v5p's DCN per chip only "
                  "(50 Gbps), so a slice of 96+ chips does not reach its chips' sum; fitted on slices of 64 to 2,048 chips, "
                  "larger ones extrapolated; leave-one-out in docs/train.md")
_TPU_ATT = "assumed: splash attention forward 70 %, backward 55 % of peak, as FlashAttention-2/3 on GPUs"


#: Bekman's Maximum Achievable Matmul FLOPS over the peak (bf16, fp8) measured in short bursts on
#: the best shape (``_MAMF``); what one GEMM reaches, as XLA's measured H100 GEMMs confirm.
MAMF = {"a100": (271.2 / 312, None), "h100": (794.5 / 989, 1402.6 / 1979), "h200": (794.5 / 989, 1453.4 / 1979),
        "b200": (1745.0 / 2250, 3432.5 / 4500)}

#: The large-GEMM efficiency a training step sustains on the A100, fitted on Megatron-LM's Table 1
#: (``train.validate.fit("megatron", ...)``: 0.70, mean |error| 2.1 %; torchtitan's table, held
#: out, 3.4 %, worst 4.5 %), and its ratio to the burst MAMF: clocks under sustained power and heat, and the
#: GEMM shapes a model has rather than the best one. The other NVIDIA GPUs, with no published
#: training table transcribed here, are derated by the same ratio; the H100 and H200 training
#: steps shardlab measured (``train.validate.validate("torch-h100")``), held out, agree with it.
A100_SUSTAINED = 0.70
GPU_SUSTAINED_RATIO = A100_SUSTAINED / MAMF["a100"][0]

#: The DCN's cost per step of a collective's ring (seconds), besides its bytes: each send between
#: slices is a DMA the host starts over TCP (Google's multislice guide; the runs' ``rto_min 5ms``
#: and MTU 8896 advice). No source sizes it: fitted on the 20 multi-slice rows of MaxText's v5e
#: table (``train.validate.fit("maxtext-v5e", ..., constant="dcn_step_overhead")``: the
#: gradient all-reduce over the DCN on the critical path, 8 reductions a layer), the v5p
#: multi-slice rows held out; docs/train.md. One figure for every TPU (the same DCN stack).
DCN_STEP_OVERHEAD = 80e-6

#: TPU large-GEMM efficiency sustained in training, fitted per chip on the single-slice rows of
#: MaxText's tables (the multi-slice rows add the DCN, :data:`DCN_STEP_OVERHEAD`; docs/train.md;
#: ``train.validate.fit`` on a grid of 0.01, the least mean error with every train row within 10 %):
#: v5p 0.81, v5e 0.87, v4 0.78 (its two one-slice rows; before, assumed 0.84, the v4 table held out
#: gave 5.2 % / 7.5 %). v6e has no table here: the mean of v5p's and v5e's (an assumption).
TPU_FITTED = {"tpu-v5p": 0.81, "tpu-v5e": 0.87, "tpu-v4p": 0.78}

#: What one slice reaches over the DCN to the other slices (bytes/s, shared by its chips;
#: ``PriceList.dcn_slice_bandwidth``): v5e's is Google's documented 6.4 Tbps a pod, v5p's is
#: fitted on MaxText's v5p multi-slice rows (4.8 Tbps); v4p and v6e have no figure (their chips'
#: own DCN figure only).
DCN_SLICE_BANDWIDTH = {"tpu-v5e": 6.4e12 / 8, "tpu-v5p": 4.8e12 / 8}

_FIT_GPU = ("fitted: MAMF x 0.806, the ratio of the A100's large-GEMM efficiency fitted on Megatron-LM's Table 1 "
            "(0.70) to its MAMF (0.869); torchtitan's A100 table held out")


def _gpu(chip, fwd, bwd, nvlink, attn_src) -> PriceList:
    bf16, fp8 = MAMF[chip]
    r = GPU_SUSTAINED_RATIO
    mm = {"bfloat16": round(bf16 * r, 3), "float32": round(bf16 * r, 3)}
    if fp8 is not None:
        mm.update(float8=round(fp8 * r, 3), int8=round(fp8 * r, 3))
    else:
        mm["int8"] = round(bf16 * r, 3)
    return PriceList(
        chip, matmul_efficiency=mm, kernel_overhead=5.75e-6, hbm_efficiency=0.9, attention_efficiency=(fwd, bwd),
        collective_efficiency={"nvlink": nvlink, "ib": 0.85}, collective_overhead=10e-6, graph_kernel_overhead=2.2e-6,
        sources={"graph_kernel_overhead": _GRAPH, "matmul_efficiency": f"{_FIT_GPU}; {_MAMF}", "kernel_overhead": _XLA, "hbm_efficiency": _HBM,
                 "attention_efficiency": attn_src, "collective_efficiency[nvlink]": _NCCL,
                 "collective_efficiency[ib]": _NIC, "collective_overhead": _NCCL_T})


def _tpu(chip) -> PriceList:
    mm = TPU_FITTED.get(chip, round((TPU_FITTED["tpu-v5p"] + TPU_FITTED["tpu-v5e"]) / 2, 3))
    how = (f"fitted on the single-slice rows of MaxText's {chip} table" if chip in TPU_FITTED
           else "assumed: the mean of the fitted v5p and v5e figures (no table for this chip)")
    return PriceList(
        chip, matmul_efficiency={"bfloat16": mm, "int8": mm, "float32": mm}, kernel_overhead=0.0,
        hbm_efficiency=0.9, attention_efficiency=(0.7, 0.55), collective_efficiency={"ici": 0.95, "dcn": 0.9},
        collective_overhead=0.0, step_overhead={"dcn": DCN_STEP_OVERHEAD},
        dcn_slice_bandwidth=DCN_SLICE_BANDWIDTH.get(chip, 0.0),
        sources={"step_overhead[dcn]": _DCN_STEP, "matmul_efficiency": how, "hbm_efficiency": _HBM,
                 "attention_efficiency": _TPU_ATT, "collective_efficiency": _TPU_ICI,
                 "kernel_overhead": "XLA fuses the step: no per-kernel launch",
                 "dcn_slice_bandwidth": {"tpu-v5e": _DCN_POD, "tpu-v5p": _DCN_SLICE_V5P}.get(
                     chip, "none published: the chips' own DCN figure only")})


#: preset name -> its PriceList.
PRICE_LISTS = {
    "a100": _gpu("a100", 0.70, 0.55, 0.78, _FA2),
    "h100": _gpu("h100", 0.70, 0.50, 0.80, _FA3),
    "h200": _gpu("h200", 0.70, 0.50, 0.80, _FA3),
    "b200": _gpu("b200", 0.70, 0.50, 0.80, "assumed: as FlashAttention-3 on H100"),
    "tpu-v4p": _tpu("tpu-v4p"),
    "tpu-v5e": _tpu("tpu-v5e"),
    "tpu-v5p": _tpu("tpu-v5p"),
    "tpu-v6e": _tpu("tpu-v6e"),
}


def price_list(hardware) -> PriceList:
    """The price list of ``hardware`` (a preset name or Hardware); ``"ideal"`` gives :data:`IDEAL`.

    Raises:
        ValueError: a custom chip has no price list: build one (``PriceList("mychip", ...)``) or
            start from a preset's (``price_list("h100").replace(chip="mychip", ...)``).

    Example:
        >>> price_list("v5p").chip, price_list("ideal") is IDEAL
        ('tpu-v5p', True)
    """
    if isinstance(hardware, PriceList):
        return hardware
    if isinstance(hardware, str) and hardware.lower() == "ideal":
        return IDEAL
    hw = _hw.get(hardware)
    if hw is None:
        raise ValueError("[price_list] hardware=None: pass a preset name such as 'h100' or 'tpu-v5p'")
    p = PRICE_LISTS.get(hw.name)
    if p is None:
        raise ValueError(f"[price_list] {hw.name!r} has no price list (lists exist for {', '.join(PRICE_LISTS)}): "
                         f"build one, e.g. shardlab.cost.price_list('h100').replace(chip={hw.name!r}, "
                         f"matmul_efficiency={{'bfloat16': 0.8}}), or price at the peaks with prices='ideal'")
    return p
