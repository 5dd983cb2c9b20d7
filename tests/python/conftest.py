"""Shared pytest set-up for tests/python.

JAX reads XLA_FLAGS once, when its CPU backend starts, so the 8 host devices that the JAX
comparisons need are requested here, before any test module imports jax. Eight devices do not
change results of tests that use one.
"""

import os

_FLAG = "--xla_force_host_platform_device_count"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}=8".strip()

# Hypothesis profiles: the test command runs a bounded number of examples ("default", each
# fuzz test a few seconds); `make fuzz` selects the long run with HYPOTHESIS_PROFILE=fuzz.
try:
    from hypothesis import HealthCheck, settings
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    pass
else:
    settings.register_profile("default", deadline=None)
    settings.register_profile("fuzz", max_examples=10_000, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
