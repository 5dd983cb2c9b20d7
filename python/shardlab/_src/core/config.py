"""Library-wide settings, in the style of ``jax.config``.

Example:
    >>> import shardlab as sl
    >>> sl.config.update("num_devices", 16)
    >>> len(sl.devices())
    16
    >>> sl.config.update("num_devices", 8)
"""

import os


class _Config:
    def __init__(self):
        env = os.environ.get("SHARDLAB_NUM_DEVICES", "8")
        try:
            self.num_devices = int(env)
        except ValueError:
            raise ValueError(f"[config] SHARDLAB_NUM_DEVICES={env!r} is not an integer") from None
        if self.num_devices < 1:
            raise ValueError(f"[config] SHARDLAB_NUM_DEVICES={env!r} must be at least 1")

    def update(self, name: str, value) -> None:
        """Sets option `name` ("num_devices": how many default virtual devices exist)."""
        if name not in ("num_devices", "jax_num_cpu_devices"):
            raise ValueError(f"[config.update] unknown option {name!r}; known: 'num_devices'")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"[config.update] num_devices must be a positive int, got {value!r}")
        self.num_devices = value


config = _Config()
