"""Narayanan et al. 2021, Table 1: weak-scaling throughput of GPT models on NVIDIA Selene.

Source: D. Narayanan, M. Shoeybi, J. Casper, P. LeGresley, M. Patwary, V. Korthikanti,
D. Vainbrand, P. Kashinkunti, J. Bernauer, B. Catanzaro, A. Phanishayee, M. Zaharia,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC21,
arXiv:2104.04473, Table 1 ("Weak-scaling throughput for GPT models ranging from 1 billion to
1 trillion parameters"). Columns as printed: parameters (billions), attention heads, hidden size,
layers, tensor-parallel size t, pipeline-parallel size p, number of GPUs, batch size, achieved
teraFLOP/s per GPU, percentage of theoretical peak FLOP/s, achieved aggregate petaFLOP/s.
The data-parallel size is d = GPUs / (t·p).

Run settings not printed in the table -- the microbatch size, the interleaved schedule's layers
per virtual stage and the data-parallel implementation (PyTorch DDP, which overlaps the gradient
all-reduce with the backward pass, or Megatron's "local" DDP, which all-reduces after it) -- come
from the paper's own reproduction script, NVIDIA/Megatron-LM
``examples/academic_paper_scripts/sc21/run_table_1.sh`` (MBS, ``--num-layers-per-virtual-pipeline-stage``,
``DDP``); that script also confirms t, p, layers, hidden size, heads, batch and GPUs (NNODES x 8).
All runs: sequence length 2048, vocabulary 51,200, fp16 with full activation recomputation
("--activations-checkpoint-method uniform"), 80 GB A100 SXM GPUs, 8 per node.

Example:
    >>> from shardlab.train.data.megatron_table1 import ROWS
    >>> ROWS[-1]["params_b"], ROWS[-1]["tflops_per_gpu"], ROWS[-1]["gpus"] // (ROWS[-1]["t"] * ROWS[-1]["p"])
    (1008.0, 163, 6)
"""

SOURCE = ("Narayanan et al., 'Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM', "
          "SC21, arXiv:2104.04473, Table 1; microbatch, interleaving and DDP from NVIDIA/Megatron-LM "
          "examples/academic_paper_scripts/sc21/run_table_1.sh")
SEQ_LEN = 2048
VOCAB = 51200

_COLUMNS = ("params_b", "heads", "hidden", "layers", "t", "p", "gpus", "batch", "tflops_per_gpu", "peak_pct",
            "aggregate_pflops", "microbatch", "layers_per_virtual_stage", "ddp")
_TABLE = [
    # %peak is of 312 TFLOP/s (A100 fp16/bf16 dense), the paper's denominator
    # params  heads hidden layers t  p   GPUs  batch TFLOP/s %peak PFLOP/s | MBS  layers/vstage DDP
    (1.7,     24,   2304,  24,    1, 1,  32,   512,  137,    44,   4.4,      16,  None, "torch"),
    (3.6,     32,   3072,  30,    2, 1,  64,   512,  138,    44,   8.8,      16,  None, "torch"),
    (7.5,     32,   4096,  36,    4, 1,  128,  512,  142,    46,   18.2,     16,  None, "torch"),
    (18.4,    48,   6144,  40,    8, 1,  256,  1024, 135,    43,   34.6,     8,   None, "torch"),
    (39.1,    64,   8192,  48,    8, 2,  512,  1536, 138,    44,   70.8,     4,   None, "local"),
    (76.1,    80,   10240, 60,    8, 4,  1024, 1792, 140,    45,   143.8,    2,   5,    "local"),
    (145.6,   96,   12288, 80,    8, 8,  1536, 2304, 148,    47,   227.1,    2,   5,    "local"),
    (310.1,   128,  16384, 96,    8, 16, 1920, 2160, 155,    50,   297.4,    1,   3,    "local"),
    (529.6,   128,  20480, 105,   8, 35, 2520, 2520, 163,    52,   410.2,    1,   1,    "local"),
    (1008.0,  160,  25600, 128,   8, 64, 3072, 3072, 163,    52,   502.0,    1,   None, "local"),
]
ROWS = [dict(zip(_COLUMNS, r)) for r in _TABLE]
