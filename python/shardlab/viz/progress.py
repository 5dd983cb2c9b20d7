"""Progress bars for work that takes a while (searches, sweeps, solvers): shown only to a person.

``track(iterable, "what")`` yields the items of ``iterable`` and, when someone is watching, draws
a rich progress bar that appears once the work has run longer than ``delay`` seconds and
disappears when it ends. Nobody is watching - and nothing is drawn - when the output is not a
terminal (pytest, CI, a pipe, a log file), in a Jupyter kernel without ipywidgets, or when
``SHARDLAB_PROGRESS=0``; ``SHARDLAB_PROGRESS=1`` forces the bar on.

Example:
    >>> from shardlab.viz import progress
    >>> [x * x for x in progress.track(range(4), "squaring")]
    [0, 1, 4, 9]
    >>> progress.interactive()  # doctests run with output captured
    False
    >>> with progress.bar("solving", total=2) as b:
    ...     b.advance(); b.advance()
    >>> b.completed
    2
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Iterable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

__all__ = ["track", "bar", "interactive"]

_ON = {"1", "on", "true", "yes"}
_OFF = {"0", "off", "false", "no"}


def _jupyter() -> bool:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def interactive() -> bool:
    """Whether a person is watching this process's output (so a progress bar helps).

    True in a terminal (stdout is a tty) or a Jupyter kernel with ipywidgets; False in CI, under
    pytest, in pipes and logs. ``SHARDLAB_PROGRESS=1`` / ``=0`` overrides the guess.
    """
    env = os.environ.get("SHARDLAB_PROGRESS", "").strip().lower()
    if env in _ON:
        return True
    if env in _OFF or os.environ.get("CI"):
        return False
    if _jupyter():
        return importlib.util.find_spec("ipywidgets") is not None
    out = sys.stdout
    return bool(getattr(out, "isatty", None) and out.isatty())


def _progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), transient=True, console=Console(stderr=False))


class bar:
    """A progress bar for work that is not one loop: ``with bar("solving", total=n) as b:
    ... b.advance()``. Drawn only when :func:`interactive` (or ``enabled=True``), and only
    after ``delay`` seconds.

    Attributes:
        completed: steps advanced so far (counted whether or not the bar is drawn).
    """

    def __init__(self, description: str, total: float | None = None, *, delay: float = 0.5,
                 enabled: bool | None = None):
        if total is not None and total < 0:
            raise ValueError(f"[progress] total={total!r} must be >= 0 (or None when unknown)")
        self.description = str(description)
        self.total = total
        self.delay = float(delay)
        self.enabled = interactive() if enabled is None else bool(enabled)
        self.completed = 0
        self._start = 0.0
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self) -> "bar":
        self._start = time.monotonic()
        return self

    def advance(self, steps: float = 1) -> None:
        """Counts ``steps`` more done; starts drawing once the work has lasted ``delay`` s."""
        self.completed += steps
        if not self.enabled:
            return
        if self._progress is None and time.monotonic() - self._start >= self.delay:
            self._progress = _progress()
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=self.total, completed=self.completed)
        elif self._progress is not None:
            self._progress.update(self._task, completed=self.completed)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def track(iterable: Iterable, description: str = "working", *, total: float | None = None,
          delay: float = 0.5, enabled: bool | None = None) -> Iterator:
    """Yields the items of ``iterable``, with a progress bar when a person is watching.

    Args:
        iterable: the work items.
        description: what is being done ("searching 96 plans").
        total: the number of items (``len(iterable)`` when it has one).
        delay: seconds before the bar appears (short work shows nothing).
        enabled: force the bar on or off (default: :func:`interactive`).
    """
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    with bar(description, total, delay=delay, enabled=enabled) as b:
        for item in iterable:
            yield item
            b.advance()
