"""Library-wide settings, in the style of ``jax.config``.

Example:
    >>> import shardlab as sl
    >>> sl.config.update("num_devices", 16)
    >>> len(sl.devices())
    16
    >>> sl.config.update("num_devices", 8)
"""

import os

from .dtypes import set_x64, x64_enabled


class _Config:
    def __init__(self):
        env = os.environ.get("SHARDLAB_NUM_DEVICES", "8")
        try:
            self.num_devices = int(env)
        except ValueError:
            raise ValueError(f"[config] SHARDLAB_NUM_DEVICES={env!r} is not an integer") from None
        if self.num_devices < 1:
            raise ValueError(f"[config] SHARDLAB_NUM_DEVICES={env!r} must be at least 1")

    @property
    def enable_x64(self) -> bool:
        """Whether 64-bit dtypes are on (JAX's ``jax_enable_x64``; off by default)."""
        return x64_enabled()

    jax_enable_x64 = enable_x64

    def update(self, name: str, value) -> None:
        """Sets option `name`, as ``jax.config.update``:

        - "num_devices" / "jax_num_cpu_devices": how many default virtual devices exist;
        - "enable_x64" / "jax_enable_x64": 64-bit dtypes;
        - JAX's flags that only pick a platform or a partitioner ("jax_platforms",
          "jax_platform_name", "jax_use_shardy_partitioner"): accepted and remembered, with
          no effect (shardlab has one backend and one partitioner, its planner).

        Any other name raises AttributeError("Unrecognized config option: ..."), as JAX.

        Example:
            >>> import numpy as np, shardlab as sl
            >>> sl.config.update("enable_x64", True)
            >>> sl.numpy.astype(np.zeros(2, np.float64), "float64").dtype, sl.config.enable_x64
            (dtype('float64'), True)
            >>> sl.config.update("enable_x64", False)
            >>> sl.config.update("jax_platforms", "cpu"); sl.config.jax_platforms
            'cpu'
        """
        if name in ("enable_x64", "jax_enable_x64"):
            if not isinstance(value, bool):
                raise ValueError(f"[config.update] {name} must be True or False, got {value!r}")
            set_x64(value)
            return
        if name in _NO_OP_FLAGS:
            setattr(self, name, value)
            return
        if name not in ("num_devices", "jax_num_cpu_devices"):
            raise AttributeError(f"Unrecognized config option: {name} [config.update] (shardlab knows "
                                 f"'num_devices', 'enable_x64', their jax_ names, and {sorted(_NO_OP_FLAGS)})")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"[config.update] {name} must be a positive int, got {value!r}")
        self.num_devices = value

    @property
    def jax_num_cpu_devices(self) -> int:
        """JAX's name for ``num_devices``."""
        return self.num_devices


# JAX flags that only select a platform or the partitioner: accepted, no effect here.
_NO_OP_FLAGS = {"jax_platforms": None, "jax_platform_name": None, "jax_use_shardy_partitioner": True}
for _flag, _default in _NO_OP_FLAGS.items():
    setattr(_Config, _flag, _default)


config = _Config()
