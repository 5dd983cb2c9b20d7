"""shardlab: a mesh of accelerators emulated on the CPU, with JAX's API.

Every virtual device holds its real shard, collectives really move and reduce the data,
and each one is written into a ledger with exact bytes (and, given hardware, time).

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((4, 2), ("x", "y"))
    >>> a = sl.device_put(np.arange(32.0).reshape(8, 4), sl.NamedSharding(mesh, P("x", "y")))
    >>> a.addressable_shards[3].data.shape
    (2, 2)
"""

import os as _os

if _os.environ.get("SHARDLAB_CORE_DIR"):
    # Developer hook: use a _core built in a private build directory (see CONTRIBUTING in docs/).
    __path__.append(_os.environ["SHARDLAB_CORE_DIR"])  # noqa: F821

from . import _core  # noqa: E402,F401  (loads the extension, or fails with the reason)
from .config import config  # noqa: E402
from .mesh import Device, Mesh, devices, get_mesh, make_mesh, set_mesh  # noqa: E402
from .sharding import DuplicateSpecError, NamedSharding, P, PartitionSpec  # noqa: E402
from .sharded_array import Shard, ShardedArray, device_put  # noqa: E402
from .local_array import LocalArray  # noqa: E402
from .ledger import Ledger  # noqa: E402
from .shard_map import shard_map  # noqa: E402
from .eager import block_until_ready, jit  # noqa: E402
from . import cost, debug, hardware, kernels, lax, nn, numpy  # noqa: E402
from .plan import Plan  # noqa: E402
from .planner import plan_einsum  # noqa: E402
from .global_ops import einsum, matmul, reshard  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "block_until_ready", "config", "cost", "debug", "Device", "device_put", "devices",
    "DuplicateSpecError", "einsum", "get_mesh", "hardware", "jit", "kernels", "lax", "Ledger",
    "LocalArray", "make_mesh", "matmul", "Mesh", "NamedSharding", "nn", "numpy", "P",
    "PartitionSpec", "Plan", "plan_einsum", "reshard", "set_mesh", "Shard", "shard_map",
    "ShardedArray",
]
