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
        """Sets option `name`: "num_devices" (how many default virtual devices exist) or
        "enable_x64" / "jax_enable_x64" (64-bit dtypes, as ``jax.config.update``).

        Example:
            >>> import numpy as np, shardlab as sl
            >>> sl.config.update("enable_x64", True)
            >>> sl.numpy.astype(np.zeros(2, np.float64), "float64").dtype, sl.config.enable_x64
            (dtype('float64'), True)
            >>> sl.config.update("enable_x64", False)
        """
        if name in ("enable_x64", "jax_enable_x64"):
            if not isinstance(value, bool):
                raise ValueError(f"[config.update] {name} must be True or False, got {value!r}")
            set_x64(value)
            return
        if name not in ("num_devices", "jax_num_cpu_devices"):
            raise ValueError(f"[config.update] unknown option {name!r}; known: 'num_devices', 'enable_x64'")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"[config.update] num_devices must be a positive int, got {value!r}")
        self.num_devices = value


config = _Config()
