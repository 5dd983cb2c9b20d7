"""Flash attention on plain arrays, and its materialized-softmax reference
(see ``shardlab._src.kernels.attention``)."""

from .._src.kernels.attention import *  # noqa: F401,F403
from .._src.kernels.attention import (  # noqa: F401
    attention_reference, attention_reference_backward, flash_attention, flash_attention_backward, run_backward,
    run_forward,
)
