"""torchtitan's first published throughput: LLaMA 13B and 70B with FSDP2 on 64 A100s.

Source: pytorch/torchtitan (github.com/pytorch/torchtitan), commit 528cab939 (2024-04-16, "add
performance -- infra metrics and loss curves"), ``docs/performance.md`` (later replaced by the
H100 tables of ``benchmarks/``): "WPS (word per second, or more accurately, token per second)
and MFU (model FLOPS utilization) results which torchtitan achieves with FSDP2 on 64 A100 (80GB)
GPUs". WPS is per GPU (``train.py``: this rank's tokens since the last log over the time), so a
row's step time is ``local batch x 4096 / WPS``.

Configuration of that commit: ``train_configs/llama_13b.toml`` and ``llama_70b.toml`` --
sequence length 4096, AdamW, gradient clipping (max_norm 1.0), FSDP over all 64 GPUs
(``data_parallel_degree = -1``, no tensor or pipeline parallelism in these rows), no
``torch.compile``, bf16 parameters for compute with fp32 gradient reduction (FSDP2's mixed
precision), the LLaMA-2 tokenizer (32,000 tokens); ``torchtitan/models/llama``: 13B = dim 5120,
40 layers, 40 heads, SwiGLU hidden 13,824 (``multiple_of`` 256); 70B = dim 8192, 80 layers, 64
heads, 8 KV heads, hidden 28,672 (``ffn_dim_multiplier`` 1.3, ``multiple_of`` 4096); RMSNorm,
rotary, untied output, no biases. Activation checkpointing: "no", "selective op" (torchtitan's
op-level policy saves the matmul and attention outputs but recomputes every other matmul: here
the checkpoint names ``{"qkv", "attn_out", "mlp_down"}`` are kept, so the output projection and
the MLP's input matmul -- about half the layer's matmul FLOPs -- are recomputed), "full"; the
"selective layer" rows (every other layer checkpointed) and the OOM rows are listed but not
estimated.

Example:
    >>> from shardlab.train.data.torchtitan_a100 import ROWS
    >>> [(r["model"], r["local_batch"], r["ac"], r["wps"]) for r in ROWS if r["estimable"]][0]
    ('13B', 2, 'none', 2162)
"""

SOURCE = ("pytorch/torchtitan commit 528cab939 (2024-04-16) docs/performance.md, train_configs/llama_13b.toml, "
          "llama_70b.toml, torchtitan/models/llama/__init__.py and model.py")
#: How the runs executed (``train_configs/llama_13b.toml`` and ``llama_70b.toml``: ``compile =
#: false``): eager PyTorch kernels, priced
#: by ``train.estimate(kernels="eager")`` -- SwiGLU as ``silu`` then ``*`` (``model.py``
#: ``FeedForward.forward``), rotary through ``xq.float()`` / ``view_as_complex`` / ``type_as``
#: (``apply_rotary_emb``), fp32 logits (``self.output(h).float()``) for the cross-entropy.
KERNELS = "eager"
#: FSDP2's mixed precision (``parallelisms/parallelize_llama.py``: ``MixedPrecisionPolicy(
#: param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``): bf16 gathers, fp32 gradient
#: reduce-scatters.
REDUCE_DTYPE = "float32"
#: The norm kernel of each model's config: 13B ``norm_type = "fused_rmsnorm"`` (a Triton kernel),
#: 70B ``norm_type = "rmsnorm"`` (``models/norms.py`` ``RMSNorm``: eager, in fp32).
FUSED_NORM = {"13B": True, "70B": False}
#: FSDP2 (``torch.distributed._composable.fsdp``, ``_fsdp_collectives.py``) copies each
#: all-gather's output into the unsharded parameters (``foreach_all_gather_copy_out``) and the
#: unsharded gradients into the reduce-scatter input in ``reduce_dtype``
#: (``foreach_reduce_scatter_copy_in``): ``train.estimate(fsdp_copies=True)``.
FSDP_COPIES = True
SEQ_LEN = 4096
VOCAB = 32000
GPUS = 64
MODELS = {"13B": {"d_model": 5120, "num_layers": 40, "num_heads": 40, "num_kv_heads": 40, "ffw_dim": 13824},
          "70B": {"d_model": 8192, "num_layers": 80, "num_heads": 64, "num_kv_heads": 8, "ffw_dim": 28672}}
_REMAT = {"no": "none", "selective op": frozenset({"qkv", "attn_out", "mlp_down"}), "full": "full"}

# model, local batch, activation checkpointing, WPS per GPU, MFU % (None: OOM)
_TABLE = [("13B", 2, "no", 2162, 61.1), ("13B", 2, "selective layer", 1914, 54.1),
          ("13B", 2, "selective op", 1904, 53.8), ("70B", 2, "selective layer", None, None),
          ("70B", 2, "selective op", None, None), ("70B", 1, "selective op", 355, 50.8),
          ("70B", 2, "full", 353, 50.5)]

ROWS = [{"model": m, "local_batch": b, "ac": _REMAT.get(ac, ac), "wps": wps, "mfu_pct": mfu,
         "estimable": wps is not None and ac in _REMAT} for m, b, ac, wps, mfu in _TABLE]
