"""Shared pytest set-up for tests/python.

JAX reads XLA_FLAGS once, when its CPU backend starts, so the 8 host devices that the JAX
comparisons need are requested here, before any test module imports jax. Eight devices do not
change results of tests that use one.
"""

import os

_FLAG = "--xla_force_host_platform_device_count"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}=8".strip()
