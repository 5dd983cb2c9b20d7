"""What every benchmark script shares: the CPU's name and a best-of-N timer."""

from __future__ import annotations

import platform
import time


def cpu_model() -> str:
    """The CPU as /proc/cpuinfo names it, with family and model (Zen 3 is family 25)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or "unknown CPU"
    return f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


def best(fn, repeat: int = 5, number: int = 1) -> float:
    """Seconds per call of `fn`: the best of `repeat` timings of `number` calls, after a warm-up."""
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t) / number)
    return min(times)
