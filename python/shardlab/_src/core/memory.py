"""A guard before large host allocations: a clear error instead of ``std::bad_alloc``.

An emulated mesh keeps every device's data in this machine's memory, so an innocent-looking
call (a stride-0 array put on a mesh, a GEMM of two thin matrices, a collective whose output
is the gathered array) can ask for terabytes. Callers check the size first and raise
``MemoryError`` naming the op and the amount, with what to do instead.

Example:
    >>> from shardlab._src.core import memory
    >>> memory.check_alloc("gemm", 1024)          # a few bytes: nothing happens
    >>> try:
    ...     memory.check_alloc("gemm", 2**70)
    ... except MemoryError as e:
    ...     print(str(e).split(",")[0])
    [gemm] needs 1099511627776 GiB
"""

from __future__ import annotations

import functools
import math
import os

GIB = 2**30


@functools.cache
def total_bytes() -> int:
    """Physical memory of this machine in bytes (MemTotal of /proc/meminfo, else sysconf)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - no way to ask
        return 2**63


def _gib(nbytes: float) -> str:
    g = nbytes / GIB
    return f"{g:.3g}" if g < 1000 else str(math.ceil(g))


def check_alloc(op: str, nbytes: float, hint: str = "") -> None:
    """Raises MemoryError ``[op] needs N GiB, more than the M GiB this machine has`` when
    `nbytes` exceeds the machine's physical memory; `hint` says what to do instead."""
    total = total_bytes()
    if nbytes > total:
        tail = f"; {hint}" if hint else ""
        raise MemoryError(f"[{op}] needs {_gib(nbytes)} GiB, more than the {_gib(total)} GiB this "
                          f"machine has{tail}")
