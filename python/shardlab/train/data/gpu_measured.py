"""Measurements on real NVIDIA GPUs, made for shardlab: the chip's GEMMs, copies, attention, two
small models' training steps, next to which :func:`shardlab.train.validate.validate` puts the
estimate of the same work (tables ``"torch-h100"`` and ``"torch-h200"``), and serving steps on
the H200 (``serve.StepModel``'s check, tests/python/test_gpu_measured.py).

Source: ``benchmarks/device/measure_gpu.py``, run by the shardlab team on 2026-11-27 on one
NVIDIA H100 80GB HBM3 and one NVIDIA H200 (141 GB), driver 580.159.04, PyTorch 2.11.0 with
CUDA 13.0 and cuDNN 9.19, each figure the median of timed repetitions after warm-ups (CUDA
events; a training step: the median of 8 steps after 3). Nothing here was fitted: the price lists
(:func:`shardlab.cost.price_list`) were set from other sources before these runs.

The training steps are LLaMA-style models written as torchtitan writes them: eager RMSNorm in
fp32, rotary through complex numbers, SwiGLU as ``silu`` then ``*``, fp32 logits for the
cross-entropy, ``scaled_dot_product_attention`` (PyTorch's default backend, cuDNN's fused
attention here), bf16 parameters with fp32 master weights and AdamW moments (``fused=True``),
gradient clipping, one GPU. ``kernels="fused"`` rows ``torch.compile`` each block (inductor
leaves the complex rotary product to eager kernels). The script keeps an fp32 copy of the
gradients for the master update (4 bytes per parameter that ``estimate``'s mixed precision does
not hold) and measures ``torch.cuda.max_memory_allocated``.

Example:
    >>> from shardlab.train.data.gpu_measured import TRAIN, DEVICES
    >>> DEVICES["h100"]["name"], TRAIN["h100"][0]["model"], TRAIN["h100"][0]["step_seconds"]
    ('NVIDIA H100 80GB HBM3', 'llama-1b', 0.2619)
"""

__all__ = ["SOURCE", "DEVICES", "MODELS", "TRAIN", "GEMM", "MEMORY", "ATTENTION", "SERVE"]

SOURCE = ("shardlab benchmarks/device/measure_gpu.py, 2026-11-27, one NVIDIA H100 80GB HBM3 and one NVIDIA H200, "
          "driver 580.159.04, PyTorch 2.11.0+cu130, cuDNN 9.19")

#: The two GPUs: name, memory in bytes, multiprocessors, nvidia-smi's max SM clock and power limit.
DEVICES = {
    "h100": {"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85017493504, "sms": 132,
             "max_sm_clock": "1980 MHz", "power_limit": "700.00 W"},
    "h200": {"name": "NVIDIA H200", "memory_bytes": 150109880320, "sms": 132,
             "max_sm_clock": "1980 MHz", "power_limit": "700.00 W"},
}

#: The models of the training rows (ModelConfig fields; MHA, RMSNorm, rotary, SwiGLU, untied).
MODELS = {
    "llama-1b": {'num_layers': 16, 'd_model': 2048, 'ffw_dim': 5632, 'num_heads': 16, 'vocab_size': 32000},
    "llama-7b-8l": {'num_layers': 8, 'd_model': 4096, 'ffw_dim': 14336, 'num_heads': 32, 'vocab_size': 32000},
}

#: chip -> training rows: model, sequences, tokens each, recompute, kernels, median step seconds,
#: peak bytes allocated.
_TRAIN_FIELDS = ("model", "batch", "seq", "remat", "kernels", "step_seconds", "peak_bytes")
# the runs, the same on both chips: (model, batch, seq, remat, kernels)
_TRAIN_RUNS = [("llama-1b", 8, 2048, "none", "eager"), ("llama-1b", 8, 2048, "full", "eager"),
               ("llama-7b-8l", 2, 4096, "none", "eager"), ("llama-7b-8l", 2, 4096, "full", "eager"),
               ("llama-1b", 8, 2048, "none", "fused"), ("llama-7b-8l", 2, 4096, "none", "fused"),
               ("llama-1b", 8, 2048, "full", "fused")]
# (median step seconds, peak bytes allocated) of each run above
_TRAIN_MEASURED = {
    "h100": [(0.2619, 48503519744), (0.3293, 24861260288), (0.2580, 57202858496), (0.3122, 45956505088),
             (0.2099, 41254713856), (0.2282, 53176326656), (0.2658, 28754754048)],
    "h200": [(0.2353, 48503519744), (0.2939, 24861260288), (0.2322, 57202858496), (0.2860, 45956505088),
             (0.1896, 41254713856), (0.2123, 53176326656), (0.2471, 24862308864)],
}
TRAIN = {chip: [dict(zip(_TRAIN_FIELDS, run + m)) for run, m in zip(_TRAIN_RUNS, measured, strict=True)]
         for chip, measured in _TRAIN_MEASURED.items()}

# the GEMM shapes measured on each chip ``(dtype, M, K, N)``: squares, decode-like skinny ones, and
# the llama-1b / llama-7b-8l layers' own (fp8 only for the large squares)
_GEMM_SHAPES = [("bfloat16", n, n, n) for n in (256, 512, 1024, 2048, 4096, 8192, 16384)] + \
    [("bfloat16", m, 8192, 8192) for m in (1, 16, 64, 128, 256, 1024)] + \
    [("bfloat16", 16384, 2048, 2048), ("bfloat16", 16384, 2048, 5632), ("bfloat16", 16384, 5632, 2048),
     ("bfloat16", 16384, 2048, 32000), ("bfloat16", 8192, 4096, 4096), ("bfloat16", 8192, 4096, 14336),
     ("bfloat16", 8192, 14336, 4096), ("bfloat16", 8192, 4096, 32000)] + \
    [("float8", n, n, n) for n in (2048, 4096, 8192, 16384)]
# seconds of each shape above, in order
_GEMM_SECONDS = {
    "h100": [1.886e-05, 1.855e-05, 1.89e-05, 2.463e-05, 0.0001842, 0.001573, 0.01206,
             4.857e-05, 4.889e-05, 4.957e-05, 5.021e-05, 5.578e-05, 0.0002084,
             0.0002027, 0.0005654, 0.0005967, 0.003545, 0.0004283, 0.001364, 0.001346, 0.003035,
             2.886e-05, 0.0001104, 0.0008872, 0.007139],
    "h200": [1.165e-05, 1.115e-05, 1.134e-05, 2.385e-05, 0.0001939, 0.001605, 0.01245,
             3.5e-05, 3.353e-05, 3.509e-05, 3.886e-05, 5.617e-05, 0.0001977,
             0.0002016, 0.0005745, 0.0005722, 0.003324, 0.0003999, 0.00142, 0.00137, 0.003072,
             1.655e-05, 0.0001199, 0.0009116, 0.006825],
}
#: chip -> GEMMs ``(dtype, M, K, N, seconds)``: ``(M, K) @ (K, N)``, bf16 through ``torch.matmul``,
#: fp8 (e4m3, bf16 output) through ``torch._scaled_mm``.
GEMM = {chip: [(*shape, t) for shape, t in zip(_GEMM_SHAPES, times, strict=True)]
        for chip, times in _GEMM_SECONDS.items()}

# the memory-bound kernels measured on each chip ``(kernel, bytes moved)``, 1 MiB to 4 GiB a buffer
_MEMORY_KERNELS = [(kernel, n * mib) for n in (1, 4, 16, 64, 256, 1024, 4096)
                   for kernel, mib in (("copy", 2 * 2**20), ("add", 3 * 2**20))]
# seconds of each kernel above, in order
_MEMORY_SECONDS = {
    "h100": [1.066e-05, 9.638e-06, 1.066e-05, 1.007e-05, 1.044e-05, 1.889e-05, 4.817e-05, 6.912e-05,
             0.0001808, 0.000266, 0.0007154, 0.001054, 0.002844, 0.004214],
    "h200": [6.277e-06, 6.71e-06, 6.051e-06, 5.831e-06, 6.578e-06, 1.348e-05, 3.483e-05, 4.883e-05,
             0.0001292, 0.000185, 0.0005057, 0.0007311, 0.00201, 0.00292],
}
#: chip -> memory-bound kernels ``(kernel, bytes moved, seconds)``: a bf16 copy (read + write) and
#: an add (read two, write one).
MEMORY = {chip: [(*k, t) for k, t in zip(_MEMORY_KERNELS, seconds, strict=True)]
          for chip, seconds in _MEMORY_SECONDS.items()}

#: chip -> causal attention, bf16, head width 128: ``(backend, B, heads, S, forward seconds,
#: forward + backward seconds)``; "default" is what ``scaled_dot_product_attention`` picks
#: (cuDNN here), "flash" FlashAttention-2, "efficient" the memory-efficient kernel.
_ATTENTION_SHAPES = ((8, 16, 2048), (4, 32, 4096), (1, 32, 8192), (1, 16, 16384))   # (B, heads, S)
_ATTENTION_BACKENDS = ("default", "flash", "cudnn", "efficient")
# (forward, forward + backward) seconds of each shape above, each backend in that order
_ATTENTION_SECONDS = {
    "h100": [(0.0002678, 0.001402), (0.0005011, 0.002337), (0.0002773, 0.001419), (0.0009086, 0.004441),
             (0.001008, 0.00431), (0.001794, 0.007476), (0.001007, 0.004518), (0.003333, 0.01521),
             (0.001019, 0.004057), (0.001825, 0.006907), (0.001009, 0.004148), (0.003388, 0.01462),
             (0.001983, 0.007513), (0.003503, 0.01244), (0.002049, 0.007518), (0.007036, 0.02817)],
    "h200": [(0.0002731, 0.001248), (0.0004889, 0.002209), (0.0002701, 0.001297), (0.0009025, 0.004348),
             (0.001023, 0.004177), (0.00175, 0.007211), (0.001023, 0.004277), (0.003353, 0.01525),
             (0.0009903, 0.003846), (0.001778, 0.006793), (0.0009935, 0.003924), (0.003458, 0.01463),
             (0.001909, 0.00711), (0.003441, 0.01245), (0.001904, 0.007231), (0.006593, 0.02818)],
}
ATTENTION = {chip: [(backend, *shape, *t) for (shape, backend), t in
                    zip([(sh, b) for sh in _ATTENTION_SHAPES for b in _ATTENTION_BACKENDS], times, strict=True)]
             for chip, times in _ATTENTION_SECONDS.items()}

#: Serving on the H200 (``llama-7b-8l`` in bf16, one GPU): decode steps at a 2,048-token context
#: (``kernels``: GPU kernels one step launches, PyTorch's profiler; ``graph_seconds`` the step
#: replayed as a CUDA graph, ``eager_seconds`` launched from Python, host-bound and noisy;
#: ``compiled_seconds`` ``torch.compile``'s fused kernels (``compiled_kernels``), launched one by one
#: because the K/V writes mutate inputs and inductor then skips CUDA graphs) and prefills of 2,048-token
#: prompts (the last token's logits; seconds).
SERVE = [
    {"phase": "decode", "batch": 1, "context": 2048, "kernels": 347, "graph_seconds": 0.001836,
     "eager_seconds": 0.004529, "compiled_kernels": 195, "compiled_seconds": 0.005074},
    {"phase": "decode", "batch": 16, "context": 2048, "kernels": 339, "graph_seconds": 0.002947,
     "eager_seconds": 0.008867},
    {"phase": "decode", "batch": 64, "context": 2048, "kernels": 307, "graph_seconds": 0.005797,
     "eager_seconds": 0.006224, "compiled_kernels": 155, "compiled_seconds": 0.005699},
    {"phase": "prefill", "batch": 1, "tokens": 2048, "seconds": 0.01554},
    {"phase": "prefill", "batch": 8, "tokens": 2048, "seconds": 0.1237},
]
