"""``shardlab.Array``: the type for ``isinstance`` checks and annotations, as ``jax.Array``.

``jax.Array`` covers concrete arrays and the tracers a traced function sees. shardlab's
counterparts are a global ``ShardedArray``, a per-device ``LocalArray`` inside ``shard_map``
(what a traced JAX function would see), and the ``HostArray`` (JAX's Array on one device, a
numpy subclass) ``shardlab.numpy`` returns for host data, so ``isinstance(jnp.ones(3), Array)``
holds as in JAX. (A numpy array or scalar made by numpy itself is an instance too, as shardlab
takes them wherever JAX takes an Array.)

Example:
    >>> import numpy as np, shardlab as sl
    >>> import shardlab.numpy as jnp
    >>> mesh = sl.make_mesh((2,), ("x",))
    >>> a = sl.device_put(np.zeros(4), sl.NamedSharding(mesh, sl.P("x")))
    >>> isinstance(a, sl.Array), isinstance(jnp.ones(3), sl.Array), isinstance([1.0], sl.Array)
    (True, True, False)
"""

from __future__ import annotations

import abc

import numpy as np

from .host_array import HostArray
from .local_array import LocalArray
from .sharded_array import ShardedArray


class Array(abc.ABC):
    """Base class for isinstance checks and type annotations of shardlab arrays (``jax.Array``).
    Not instantiable: arrays come from ``shardlab.numpy``, ``device_put`` and the ops."""

    __slots__ = ()

    def __new__(cls, *args, **kwargs):
        raise TypeError("jax.Array (shardlab.Array) cannot be instantiated; use shardlab.numpy.asarray "
                        "or shardlab.device_put to make an array")


for _cls in (ShardedArray, LocalArray, HostArray, np.ndarray, np.number, np.bool_):
    Array.register(_cls)
del _cls
