"""MaxText's published TPU v5p, v5e and v4 training throughput, with the configurations that ran.

Source: AI-Hypercomputer/maxtext (github.com/AI-Hypercomputer/maxtext), commit 76bd53b0f
(2023-12-15), ``MaxText/configs/v5p/README.md`` ("High Performance Model Configs on TPU v5p":
TFLOP/sec/chip and MFU for 32B to 1024B models on 1 or 2 slices) and
``MaxText/configs/v5e/README.md`` ("High Performance Model Training Configs on TPU v5e": 16B to
128B on 1 to 32 slices of v5e-256) and ``MaxText/configs/v4/README.md`` ("High Performance Model
Configs on TPU v4": 22B on 1 to 8 slices of v4-128, 52B on 1 and 2 of v4-384); the same tables
are today in ``src/maxtext/configs/tpu/v5p``, ``.../v5e`` and ``.../v4``. The run of each row is the script beside the README at that commit
(``MaxText/configs/v5p/32b.sh`` ...): ``per_device_batch_size``, ``remat_policy``,
``global_parameter_scale``, ``ici_fsdp_parallelism`` (-1: the rest of the slice),
``ici_tensor_parallelism``, ``max_target_length=2048``, ``attention='flash'``, synthetic data;
several slices are data-parallel over the DCN (``dcn_data_parallelism`` = slices).

The v4 scripts (``MaxText/configs/v4/22b.sh``, ``52b.sh``) set the model's dimensions
themselves (``base_emb_dim``, ``base_num_heads``, ``base_mlp_dim``, ``base_num_decoder_layers``
at scale 1; :data:`V4_MODELS`), FSDP over the whole slice (``ici_fsdp_parallelism`` 64 and 192),
``remat_policy=full``, ``per_device_batch_size`` 16 and 10, one device per chip
(``TPU_MEGACORE=MEGACORE_DENSE``); their MFU is printed to three digits over v4's 275 TFLOP/s.

The model is MaxText's default decoder of that commit (``MaxText/configs/base.yml``):
``base_emb_dim`` 2560, ``base_num_heads`` 8, ``head_dim`` 256, ``base_mlp_dim`` 8192,
``base_num_decoder_layers`` 16, ReLU MLP (not gated), RMSNorm, rotary positions, no biases,
vocabulary 32,768, output logits through the embedding (tied), bf16 activations and fp32
weights (AdamW). ``global_parameter_scale`` = 2^k scales them as ``pyconfig.get_individual_scales``
does: with ``k = 3q + r``, heads and MLP width by ``2^(q + (r > 0))``, embedding by
``2^(q + (r > 1))``, layers by ``2^q``.

The TFLOP/s per chip are MaxText's own count (``MaxText/train.py: calculate_training_tflops``):
``6·N·S·b + 12·H·L·d·S²·b / 2`` per device per step, ``N`` all parameters, ``b`` the
per-device batch, causal attention halved; :func:`maxtext_flops` is that count. The tables print
TFLOP/s per chip rounded to integers and the MFU to four digits, the same figure over the chip's
bf16 peak (197 TFLOP/s for v5e, 459 for v5p: 120 / 0.6110 = 196.4, 328 / 0.7147 = 458.9), so the
measured step time of a row, :func:`measured_seconds`, is
``maxtext_flops(row) / (mfu_pct / 100 · peak)`` (up to 0.4 % closer than the rounded TFLOP/s).

``v5p-N`` names TensorCores: a v5p-128 slice is 64 chips (two cores per chip); ``v5e-256`` is 256
chips.

Example:
    >>> from shardlab.train.data.maxtext_tpu import V5P, model_dims
    >>> V5P[0]["scale"], V5P[0]["tflops_per_chip"], model_dims(32)
    (32, 328, {'d_model': 10240, 'num_heads': 32, 'ffw_dim': 32768, 'num_layers': 32})
"""

SOURCE = ("AI-Hypercomputer/maxtext commit 76bd53b0f (2023-12-15): MaxText/configs/v5p/README.md, "
          "v5e/README.md and v4/README.md tables, the run scripts beside them (MaxText/configs/v5p/*.sh, "
          "v5e/*.sh, v4/22b.sh, v4/52b.sh) and "
          "MaxText/configs/base.yml, MaxText/pyconfig.py get_individual_scales, MaxText/train.py "
          "calculate_training_tflops")
SEQ_LEN = 2048
VOCAB = 32768
HEAD_DIM = 256
BASE = {"d_model": 2560, "num_heads": 8, "ffw_dim": 8192, "num_layers": 16}
#: the bf16 peak the tables' MFU is taken over (Google Cloud's TPU v5e, v5p and v4 pages)
PEAK = {"tpu-v5e": 197e12, "tpu-v5p": 459e12, "tpu-v4p": 275e12}

# scale: (per_device_batch_size, remat_policy, ici_tensor_parallelism) from the scripts
_V5P_RUN = {32: (8, "minimal", 4), 64: (4, "minimal", 4), 128: (2, "minimal", 8), 256: (2, "minimal", 8),
            512: (2, "full", 16), 1024: (2, "full", 16)}
_V5E_RUN = {16: (6, "full", 1), 32: (4, "full", 1), 64: (2, "full", 1), 128: (1, "full", 16)}

# (scale, slices, TensorCores per slice, TFLOP/s per chip, MFU %) as printed
_V5P = [(32, 1, 128, 328, 71.47), (32, 2, 128, 319, 69.43), (64, 1, 128, 323, 70.31), (64, 2, 128, 309, 67.26),
        (128, 1, 256, 315, 68.68), (128, 2, 256, 305, 66.34), (128, 1, 512, 316, 68.83), (128, 2, 512, 274, 59.66),
        (256, 1, 1024, 308, 67.09), (256, 2, 1024, 289, 62.99), (512, 1, 1024, 294, 63.99),
        (512, 2, 1024, 282, 61.45), (1024, 1, 2048, 254, 55.35), (1024, 2, 2048, 237, 51.55),
        (1024, 1, 4096, 297, 64.80), (1024, 2, 4096, 279, 60.83)]
# v4: the scripts' own dimensions (global_parameter_scale 1), per_device_batch_size, FSDP = the slice
#: The v4 scripts' models (``MaxText/configs/v4/22b.sh``, ``52b.sh``), the rest as base.yml.
V4_MODELS = {22: {"d_model": 6144, "num_heads": 24, "ffw_dim": 24576, "num_layers": 48},
             52: {"d_model": 12288, "num_heads": 32, "ffw_dim": 49152, "num_layers": 32}}
_V4_RUN = {22: (16, "full", 1), 52: (10, "full", 1)}
# (model, slices, TensorCores per slice, TFLOP/s per chip, MFU %) as printed ("v4-128": 64 chips)
_V4 = [(22, 1, 128, 156, 56.7), (22, 2, 128, 152, 55.2), (22, 4, 128, 149, 54.3), (22, 8, 128, 146, 53.2),
       (52, 1, 384, 154, 56.0), (52, 2, 384, 162, 58.9)]
# slices of v5e-256 -> {scale: (TFLOP/s per chip, MFU %)}
_V5E = {1: {16: (120, 61.10), 32: (132, 66.86), 64: (118, 59.90), 128: (110, 56.06)},
        2: {16: (117, 59.37), 32: (128, 64.81), 64: (112, 56.66), 128: (110, 55.82)},
        4: {16: (117, 59.14), 32: (126, 64.10), 64: (110, 55.85), 128: (108, 54.93)},
        8: {16: (115, 58.27), 32: (125, 63.67), 64: (108, 54.96), 128: (104, 52.93)},
        16: {16: (111, 56.56), 32: (123, 62.26), 64: (105, 53.29), 128: (100, 50.86)},
        32: {16: (108, 54.65), 32: (119, 60.40), 64: (99, 50.18), 128: (91, 46.25)}}


def model_dims(scale: int) -> dict:
    """The default model's dimensions at ``global_parameter_scale`` (MaxText's get_individual_scales)."""
    k = scale.bit_length() - 1
    if 2**k != scale:
        raise ValueError(f"[maxtext] global_parameter_scale {scale} is not a power of 2")
    q, r = divmod(k, 3)
    heads = q + (r > 0)
    return {"d_model": BASE["d_model"] * 2 ** (q + (r > 1)), "num_heads": BASE["num_heads"] * 2**heads,
            "ffw_dim": BASE["ffw_dim"] * 2**heads, "num_layers": BASE["num_layers"] * 2**q}


def _row(hardware, scale, slices, chips_per_slice, tflops, mfu, run):
    pdbs, remat, tensor = run[scale]
    return {"hardware": hardware, "scale": scale, "slices": slices, "chips_per_slice": chips_per_slice,
            "chips": slices * chips_per_slice, "per_device_batch": pdbs, "remat_policy": remat,
            "ici_tensor": tensor, "ici_fsdp": chips_per_slice // tensor, "tflops_per_chip": tflops, "mfu_pct": mfu}


V5P = [_row("tpu-v5p", s, n, cores // 2, tf, mfu, _V5P_RUN) for s, n, cores, tf, mfu in _V5P]
V5E = [_row("tpu-v5e", s, n, 256, tf, mfu, _V5E_RUN) for n, by in _V5E.items() for s, (tf, mfu) in by.items()]
V4 = [dict(_row("tpu-v4p", s, n, cores // 2, tf, mfu, _V4_RUN), dims=V4_MODELS[s]) for s, n, cores, tf, mfu in _V4]


def row_dims(row: dict) -> dict:
    """A row's model dimensions: the script's own (``row["dims"]``, the v4 rows) or the default
    model's at its ``global_parameter_scale``.

    Example:
        >>> row_dims(V4[0])["num_layers"], row_dims(V5P[0])["num_layers"]
        (48, 32)
    """
    return dict(row["dims"]) if "dims" in row else model_dims(row["scale"])


def _params(d: dict) -> int:
    D, H, F, L = d["d_model"], d["num_heads"], d["ffw_dim"], d["num_layers"]
    return L * (4 * D * H * HEAD_DIM + 2 * D * F + 2 * D) + VOCAB * D + D


def params(scale: int) -> int:
    """All parameters of the default model (tied embedding counted once, norm scales included)."""
    return _params(model_dims(scale))


def maxtext_flops(row: dict) -> float:
    """FLOPs per device per step as MaxText counted them (``calculate_training_tflops``)."""
    d = row_dims(row)
    b, S = row["per_device_batch"], SEQ_LEN
    return 6 * _params(d) * S * b + 12 * d["num_heads"] * d["num_layers"] * HEAD_DIM * S**2 * b / 2


def measured_seconds(row: dict) -> float:
    """The row's step time: MaxText's FLOP count over its MFU times the chip's peak.

    Example:
        >>> round(measured_seconds(V5E[0]), 2)      # 16B on one v5e-256 at 61.10 % MFU
        10.3
    """
    return maxtext_flops(row) / (row["mfu_pct"] / 100 * PEAK[row["hardware"]])
