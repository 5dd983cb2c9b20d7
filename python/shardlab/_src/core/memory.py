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
    `nbytes` exceeds the machine's physical memory; `hint` says what to do instead. The C++
    core's allocator (``shardlab::check_alloc`` in buffer_pool.hpp) raises the same text."""
    total = total_bytes()
    if nbytes > total:
        tail = f"; {hint}" if hint else ""
        raise MemoryError(f"[{op}] needs {_gib(nbytes)} GiB, more than the {_gib(total)} GiB this "
                          f"machine has{tail}")


# What numpy (or an allocator) says when it will not make an array: too many bytes to address
# (ValueError), or memory the system would not give (MemoryError).
_REFUSALS = ("array is too big", "iterator is too large", "Maximum allowed size exceeded",
             "Unable to allocate", "std::bad_alloc", "bad allocation")

# numpy cannot address more than 2**63 bytes: the least an array it calls "too big" needs.
NUMPY_LIMIT = 2**63


def is_refusal(exc: BaseException) -> bool:
    """Whether `exc` is numpy's (or an allocator's) refusal to make an array too large, rather
    than one of shardlab's own ``[op]`` errors or an unrelated ValueError.

    Example:
        >>> import numpy as np
        >>> try:
        ...     np.empty((2**40, 2**40))
        ... except ValueError as e:
        ...     is_refusal(e)
        True
    """
    if not isinstance(exc, (MemoryError, ValueError)):
        return False
    msg = str(exc)
    return not msg.startswith("[") and any(r in msg for r in _REFUSALS)


def refused(op: str, nbytes: float | None, hint: str, cause: BaseException):
    """Raises the MemoryError for an allocation of `nbytes` that numpy or the system refused
    (`cause`): ``check_alloc``'s when it exceeds this machine's memory, else ``[op] needs N GiB
    and the system refused it``. `nbytes` None: unknown, beyond what numpy can address."""
    tail = f"; {hint}" if hint else ""
    if nbytes is None:
        raise MemoryError(f"[{op}] needs more than {_gib(NUMPY_LIMIT)} GiB (more than numpy can address), "
                          f"more than the {_gib(total_bytes())} GiB this machine has{tail}") from cause
    try:
        check_alloc(op, nbytes, hint)
    except MemoryError as e:
        raise e from cause
    raise MemoryError(f"[{op}] needs {_gib(nbytes)} GiB and the system refused it (this machine has "
                      f"{_gib(total_bytes())} GiB, less of it free){tail}") from cause
