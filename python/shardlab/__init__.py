"""shardlab: a mesh of accelerators emulated on the CPU, with JAX's API.

Every virtual device holds its real shard, collectives really move and reduce the data,
and each one is written into a ledger with exact bytes (and, given hardware, time).
Gradients (``grad``, ``vjp``, ``checkpoint``) run through shard_map and record the backward
pass's collectives too; ``eval_shape`` runs the same program shape-only, at any scale.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((4, 2), ("x", "y"))
    >>> a = sl.device_put(np.arange(32.0).reshape(8, 4), sl.NamedSharding(mesh, P("x", "y")))
    >>> a.addressable_shards[3].data.shape
    (2, 2)
"""

import importlib.metadata as _metadata
import os as _os

if _os.environ.get("SHARDLAB_CORE_DIR"):
    # Developer hook: use a _core built in a private build directory (see README, Developing).
    __path__.append(_os.environ["SHARDLAB_CORE_DIR"])  # noqa: F821

from . import _core  # noqa: E402,F401  (loads the extension, or fails with the reason)
from ._src import backends as _backends  # noqa: E402,F401  (registers the primitives' implementations)
from ._src import planning as _planning  # noqa: E402,F401  (registers the global-view handlers)
from ._src.arrays.array import Array  # noqa: E402
from ._src.arrays.local_array import LocalArray  # noqa: E402
from ._src.arrays.sharded_array import Shard, ShardedArray, device_get, device_put  # noqa: E402
from ._src.arrays.typeof import typeof  # noqa: E402
from ._src.core.config import config  # noqa: E402
from ._src.core.context import named_scope  # noqa: E402
from ._src.core.context import phase as ledger_phase  # noqa: E402
from ._src.core.mesh import (  # noqa: E402
    Device, Mesh, default_backend, device_count, devices, get_mesh, local_device_count, local_devices, make_mesh,
    process_count, process_index, set_mesh,
)
from ._src.core.sharding import DuplicateSpecError, NamedSharding, P, PartitionSpec  # noqa: E402
from ._src.ledger.ledger import Ledger  # noqa: E402
from ._src.planning.global_ops import einsum, matmul, run_plan  # noqa: E402
from ._src.planning.plan import Plan  # noqa: E402
from ._src.planning.planner import plan_einsum, plan_reshard  # noqa: E402
from ._src.planning.sharding_api import reshard  # noqa: E402  (jax.reshard is jax.sharding.reshard)
from ._src.transforms.autodiff import grad, value_and_grad, vjp  # noqa: E402
from ._src.transforms.checkpoint import checkpoint  # noqa: E402
from ._src.transforms.checkpoint_policies import checkpoint_policies  # noqa: E402  (jax.checkpoint_policies)
from ._src.transforms.eval_shape import ShapeDtypeStruct, eval_shape  # noqa: E402
from ._src.transforms.jit import block_until_ready, jit  # noqa: E402
from ._src.transforms.make_jaxpr import make_jaxpr  # noqa: E402
from ._src.transforms.shard_map import shard_map, smap  # noqa: E402
from ._src.transforms.vmap import vmap  # noqa: E402
from . import (  # noqa: E402
    ad_checkpoint, cost, debug, dtypes, hardware, kernels, lax, nn, numpy, profiler, random, sharding, tree, tree_util,
    units,
)

remat = checkpoint

try:  # one source: pyproject.toml's version, as the installed package's metadata carries it
    __version__ = _metadata.version("shardlab")
except _metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "ad_checkpoint", "Array", "block_until_ready", "checkpoint", "checkpoint_policies", "config", "cost", "debug",
    "default_backend", "Device", "device_count", "device_get", "device_put", "devices", "dtypes",
    "DuplicateSpecError", "einsum", "eval_shape", "get_mesh", "grad", "hardware", "jit", "kernels", "lax", "Ledger", "ledger_phase",
    "local_device_count", "local_devices", "LocalArray", "make_jaxpr", "make_mesh", "matmul", "Mesh", "named_scope",
    "NamedSharding", "nn", "numpy", "P", "PartitionSpec", "Plan", "plan_einsum", "plan_reshard", "process_count",
    "process_index", "profiler", "random", "remat", "reshard", "run_plan", "set_mesh", "Shard", "shard_map",
    "ShapeDtypeStruct", "ShardedArray", "sharding", "smap", "tree", "tree_util", "typeof", "units",
    "value_and_grad", "vjp", "vmap",
]

# Pictures last: shardlab.viz draws with the public face above; its modules register the views
# of the library's objects beside the views' definitions (shardlab.views.register_view).
from . import views, viz  # noqa: E402
from . import distributed  # noqa: E402,F401  (last: under mpirun it spreads the meshes over the ranks)

__all__ += ["views", "viz"]
